"""Where the aligned learner's forward+backward goes (SmolLM2, 1 row of 10 turns x (160 obs + 16 act) tokens, 1 thread):
torch.profiler's self CPU time by op, per learner_autocast. Fourteenth session."""
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
for autocast in sys.argv[1:] or ["off", "bf16_backward"]:
    model.zero_grad(set_to_none=True)
    learner_pass(model, ids[:, :352], mask[:, :352], act[:, :352], True, q, autocast)
    model.zero_grad(set_to_none=True)
    t0 = time.process_time()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        learner_pass(model, ids, mask, act, True, q, autocast)
    print(f"== {autocast}: {ids.numel()} tokens, {time.process_time() - t0:.2f} CPU s (profiled)")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=28, max_name_column_width=50))
