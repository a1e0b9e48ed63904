"""prof_learner.py's pass with version 4's learner (bf16_backward, the attention kernel): where the aligned SmolLM2
learner's time goes now (1 row x 1,760 tokens, 1 thread). Fourteenth session."""
import sys, time
import torch
from torch.profiler import profile, ProfilerActivity
sys.path.insert(0, "benchmarks")
from bench_learner import make_rows, learner_pass
from interq.models.pretrained import load_smollm2
from interq.quant import QuantConfig

torch.set_num_threads(1)
model = load_smollm2(torch.float32)[0].float().train()
ids, mask, act = make_rows(model.config.vocab_size, 1, 10, 160, 16)
q = QuantConfig()
model.zero_grad(set_to_none=True)
learner_pass(model, ids[:, :352], mask[:, :352], act[:, :352], True, q, "bf16_backward", attention="kernel")
model.zero_grad(set_to_none=True)
t0 = time.process_time()
with profile(activities=[ProfilerActivity.CPU]) as prof:
    learner_pass(model, ids, mask, act, True, q, "bf16_backward", attention="kernel")
print(f"== bf16_backward + kernel attention: {ids.numel()} tokens, {time.process_time() - t0:.2f} CPU s (profiled)")
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=50))
