import pickle, time, sys, resource, torch
from interq.train.config import build_config
from interq.train.pipeline import _quiet_transformers
from interq.train.policy import load_policy
from interq.train.build import build_executor, chat_format
from interq.train import rl
ov = ["model.source=smollm2", "env.action_format=text", "warm_start.enabled=false", "algo.layout=concatenated", "train.threads=1"] + sys.argv[1:]
cfg = build_config("q-interq", ov)
_quiet_transformers(); torch.set_num_threads(1)
model, tok = load_policy("smollm2", cfg.model.dtype)
fmt = chat_format(tok)
executor = build_executor(model, cfg.rollout)
learner = rl.Learner(model, cfg, executor.qcfg)
eps = pickle.load(open("/tmp/prof/episodes.pkl", "rb"))
batch = rl.build_batch(eps, cfg.algo, fmt.pad_token_id)
mbs = rl.micro_batches(batch, list(range(batch.input_ids.shape[0])), cfg.train.tokens_per_microbatch)
model.train()
for r, m in enumerate([mbs[-1], mbs[0], mbs[-1]]):
    mb = rl._rows(batch, m)
    model.zero_grad(set_to_none=True)
    u0 = resource.getrusage(resource.RUSAGE_SELF)
    with learner.context():
        cur = learner.logprobs(mb, batch, entered=True)
        loss = -(cur * mb["advantages"]).sum() / 100
        loss.backward()
    u1 = resource.getrusage(resource.RUSAGE_SELF)
    print(f"round {r} width {mb['width']} user {u1.ru_utime-u0.ru_utime:.1f} sys {u1.ru_stime-u0.ru_stime:.1f} "
          f"cpu {u1.ru_utime-u0.ru_utime+u1.ru_stime-u0.ru_stime:.1f} minflt {u1.ru_minflt-u0.ru_minflt} maxrss {u1.ru_maxrss/1e6:.1f}GB", flush=True)
