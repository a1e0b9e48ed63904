import torch, sys
import torch.nn.functional as F
from torch.utils.cpp_extension import load
m = load("fprobe", ["/tmp/fprobe/probe.cpp"], extra_cflags=["-O2", "-march=native", "-ffp-contract=off", "-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512"], build_directory="/tmp/fprobe")
m.set_exp(1); m.set_var(int(sys.argv[1])); m.set_pvmode(0)
E = torch.empty(0, dtype=torch.bfloat16)
lo, hi, n = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
g = torch.Generator().manual_seed(5)
bad = tot = 0
for it in range(n):
    L = int(torch.randint(lo, hi, (1,), generator=g))
    if len(sys.argv) > 5: L = L // 16 * 16 + int(sys.argv[5])
    q = (torch.randn(16, 3, 3, 64, generator=g) * 2).bfloat16()
    k = (torch.randn(16, 3, L, 64, generator=g) * 2).bfloat16()
    v = torch.randn(16, 3, L, 64, generator=g).bfloat16()
    ref = F.scaled_dot_product_attention(q, k, v, scale=0.125)
    o = m.flash_probe(q, k, v, E, 0.125, 0, 0, 512, 0)
    b = int((o.view(torch.int16) != ref.view(torch.int16)).sum()); bad += b; tot += o.numel()
    if b: print("L", L, b)
print("bad", bad, "of", tot)
