"""Profile one SmolLM2 RL step's rollout (cProfile) and learner micro-batches (torch profiler)."""
import cProfile, pickle, pstats, sys, time, io
import torch
from interq.train.config import build_config
from interq.train.pipeline import _quiet_transformers
from interq.train.policy import load_policy
from interq.train.build import env_factory, split_tasks, build_executor, chat_format, env_runner
from interq.train import rl
from interq.rollout import RolloutEngine

part = sys.argv[1]
ov = ["model.source=smollm2", "env.action_format=text", "warm_start.enabled=false", "algo.layout=concatenated",
      "train.steps=1", "train.eval_every_steps=0", "train.threads=1", "train.progress=false"] + sys.argv[2:]
cfg = build_config("q-interq", ov)
_quiet_transformers(); torch.set_num_threads(1)
model, tok = load_policy("smollm2", cfg.model.dtype)
make_env = env_factory(cfg.env)
train_tasks, eval_tasks = split_tasks(make_env, cfg.env, {})
fmt = chat_format(tok)
executor = build_executor(model, cfg.rollout)
if part == "rollout":
    engine = RolloutEngine(executor.module, cache_factory=executor.cache_factory, pad_token_id=fmt.pad_token_id,
                           max_context_tokens=cfg.rollout.max_context_tokens, info=executor.info)
    envs = env_runner(cfg.env, make_env)
    tasks, seeds, groups = rl.step_tasks(train_tasks, cfg, 1)
    pr = cProfile.Profile(); c0 = time.process_time(); t0 = time.perf_counter()
    pr.enable()
    eps = rl.rollout(engine, fmt, make_env, tasks, seeds, groups, rl.sampling_params(cfg, fmt), cfg, envs)
    pr.disable()
    print("rollout cpu", time.process_time() - c0, "wall", time.perf_counter() - t0)
    pickle.dump(eps, open("/tmp/prof/episodes.pkl", "wb"))
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(60); print(s.getvalue())
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(40); print(s.getvalue())
else:
    eps = pickle.load(open("/tmp/prof/episodes.pkl", "rb"))
    learner = rl.Learner(model, cfg, executor.qcfg)
    batch = rl.build_batch(eps, cfg.algo, fmt.pad_token_id)
    lengths = batch.attention_mask.sum(-1).tolist()
    print("rows", len(lengths), "lengths", lengths, "tokens", sum(lengths))
    mbs = rl.micro_batches(batch, list(range(len(lengths))), cfg.train.tokens_per_microbatch)
    print("microbatches", [(len(m), max(lengths[r] for r in m)) for m in mbs])
    mb = rl._rows(batch, mbs[0])
    model.train()
    from torch.profiler import profile, ProfilerActivity
    c0 = time.process_time()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with learner.context():
            cur = learner.logprobs(mb, batch, entered=True)
            loss = -(cur * mb["advantages"]).sum() / 100
            loss.backward()
    print("mb cpu", time.process_time() - c0)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
