# Twenty-fourth session: run from anywhere after `git show de3cd94:src/interq/quant/csrc/int8_kernels.cpp > /tmp/s24/gen/old_kernels.cpp`
# and copying this tree's int8_kernels.cpp to /tmp/s24/gen/new_kernels.cpp; then
# attention_same_bits.py /tmp/s24/gen/b_old/interq_gen_old.so /tmp/s24/gen/b_new/interq_gen_new.so
# the session start's and this tree's kernels for a generic x86-64-v2 target (no AVX2: the generic 64-byte vectors,
# as on a CPU with neither AVX-512 nor AVX2); prints the .so paths
import os
from torch.utils.cpp_extension import load_inline
for name in ("old", "new"):
    d = f"/tmp/s24/gen/b_{name}"; os.makedirs(d, exist_ok=True)
    m = load_inline(f"interq_gen_{name}", cpp_sources=[open(f"/tmp/s24/gen/{name}_kernels.cpp").read()],
                    functions=["causal_attention_fwd", "causal_attention_bwd", "masked_attention", "decode_attention"],
                    extra_cflags=["-O3", "-march=x86-64-v2", "-ffp-contract=off", "-fno-math-errno", "-fopenmp"],
                    extra_ldflags=["-fopenmp"], build_directory=d)
    print(name, m.__file__)
