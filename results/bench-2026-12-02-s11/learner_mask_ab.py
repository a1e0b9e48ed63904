import pickle, time, sys, torch
from interq.train.config import build_config
from interq.train.pipeline import _quiet_transformers
from interq.train.policy import load_policy
from interq.train.build import build_executor, chat_format
from interq.train import rl
from interq.rollout import trajectory as T
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
mb = rl._rows(batch, mbs[-1])
print("mb", mb["input_ids"].shape, mb["attention_mask"].sum(-1).tolist())
model.train()
orig = T.model_attention_mask
res = {"masked": [], "causal": []}
for r in range(2):
    for name in ("masked", "causal"):
        T.model_attention_mask = (lambda m: m) if name == "masked" else orig
        model.zero_grad(set_to_none=True)
        c = time.process_time()
        with learner.context():
            cur = learner.logprobs(mb, batch, entered=True)
            loss = -(cur * mb["advantages"]).sum() / 100
            loss.backward()
        res[name].append(time.process_time() - c)
        print(name, r, "%.1f" % res[name][-1], flush=True)
print({k: min(v) for k, v in res.items()}, "ratio", min(res["masked"]) / min(res["causal"]))
