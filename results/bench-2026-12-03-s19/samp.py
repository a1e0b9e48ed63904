import time, torch
from interq.rollout.sampling import sample_tokens, SamplingParams, transformed_logprobs, exponential_race
torch.set_num_threads(1)
logits = torch.randn(16, 49152) * 3
gens = [torch.Generator().manual_seed(i) for i in range(16)]
p = SamplingParams()
def t(f, n=20):
    f(); t0 = time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter() - t0) / n * 1e3
print("sample_tokens ms", t(lambda: sample_tokens(logits, p, gens)))
print("log_softmax ms", t(lambda: transformed_logprobs(logits)))
lp = transformed_logprobs(logits)
print("exp ms", t(lambda: lp.exp()))
print("race ms", t(lambda: exponential_race(gens, 49152)))
r = exponential_race(gens, 49152); pr = lp.exp()
print("div+argmax ms", t(lambda: pr.div(r).argmax(-1)))
from interq.quant import kernels
m = kernels.load()
u = torch.empty(16, 49152, dtype=torch.float64)
print("uniform_f64_rows ms", t(lambda: m.uniform_f64_rows(u, gens)))
print("clamp+log+neg+float ms", t(lambda: u.clamp_min(1e-300).log_().neg_().float()))
print("argmax ms", t(lambda: pr.argmax(-1)))
print("div ms", t(lambda: pr.div(r)))
