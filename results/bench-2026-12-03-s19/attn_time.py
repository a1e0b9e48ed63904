import sys, time
import torch
import torch.nn.functional as F
from interq.models.pretrained import load_smollm2
from interq.quant import BF16_EXECUTOR, make_executor
from interq.rollout import RolloutEngine, SamplingParams
from interq.rollout import attention as A
torch.set_num_threads(2)
new = int(sys.argv[1])
learner, _ = load_smollm2(torch.bfloat16)
prompt = torch.randint(10, 49000, (16, 32), generator=torch.Generator().manual_seed(0))
eng = RolloutEngine(A.set_rollout_attention(make_executor(learner, BF16_EXECUTOR), 'sdpa_packed'), max_context_tokens=100_000)
acc = {"t": 0.0, "n": 0}
orig_fd, orig_sdpa = A._flash_decode, F.scaled_dot_product_attention
def fd(*a, **k):
    t = time.perf_counter(); r = orig_fd(*a, **k); acc["t"] += time.perf_counter() - t; acc["n"] += 1; return r
def sd(*a, **k):
    t = time.perf_counter(); r = orig_sdpa(*a, **k); acc["t"] += time.perf_counter() - t; acc["n"] += 1; return r
A._flash_decode = fd; F.scaled_dot_product_attention = sd
def decode():
    batch = eng.new_batch(list(range(16)), SamplingParams(temperature=1.0, max_action_tokens=new))
    batch.step({i: prompt[i].tolist() for i in range(16)}); batch.close()
decode()
for rep in range(3):
    for on in (False, True):
        A.use_flash_decode(on); acc.update(t=0.0, n=0)
        t = time.perf_counter(); decode(); wall = time.perf_counter() - t
        print(f"flash {on}: wall {wall:.2f} s, attention calls {acc['n']} total {acc['t']*1e3:.0f} ms", flush=True)
