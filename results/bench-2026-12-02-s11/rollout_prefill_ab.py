"""Rollout A/B in one process: the masked prefill through transformers' repeat_kv (old) against torch's enable_gqa (gqa),
the same SmolLM2 RL step-1 rollout (16 episodes, q-interq executor, 1 thread); CPU seconds and whether the tokens match."""
import time, sys, resource, torch
from interq.train.config import build_config
from interq.train.pipeline import _quiet_transformers
from interq.train.policy import load_policy
from interq.train.build import env_factory, split_tasks, build_executor, chat_format, env_runner
from interq.train import rl
from interq.rollout import RolloutEngine
import interq.rollout.attention as A
ov = ["model.source=smollm2", "env.action_format=text", "warm_start.enabled=false", "algo.layout=concatenated", "train.threads=1"]
cfg = build_config("q-interq", ov)
_quiet_transformers(); torch.set_num_threads(1)
model, tok = load_policy("smollm2", cfg.model.dtype)
make_env = env_factory(cfg.env)
train_tasks, _ = split_tasks(make_env, cfg.env, {})
fmt = chat_format(tok)
executor = build_executor(model, cfg.rollout)
new = A.sdpa_packed_attention
def old(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kw):
    if query.shape[2] > 1:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kw)
    return new(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kw)
from transformers import AttentionInterface
tasks, seeds, groups = rl.step_tasks(train_tasks, cfg, 1)
outs = {}
for name in sys.argv[1:]:
    AttentionInterface.register(A.NAME, new if name == "gqa" else old)
    engine = RolloutEngine(executor.module, cache_factory=executor.cache_factory, pad_token_id=fmt.pad_token_id,
                           max_context_tokens=cfg.rollout.max_context_tokens, info=executor.info)
    u0 = resource.getrusage(resource.RUSAGE_SELF)
    eps = rl.rollout(engine, fmt, make_env, tasks, seeds, groups, rl.sampling_params(cfg, fmt), cfg, env_runner(cfg.env, make_env))
    u1 = resource.getrusage(resource.RUSAGE_SELF)
    outs[name] = [ep.rows[0].token_ids for ep in eps]
    print(f"{name}: user {u1.ru_utime-u0.ru_utime:.1f} sys {u1.ru_stime-u0.ru_stime:.1f} minflt {u1.ru_minflt-u0.ru_minflt}", flush=True)
if len(outs) > 1:
    a, b = list(outs.values())[:2]
    print("same tokens:", all(torch.equal(x, y) for x, y in zip(a, b)))
