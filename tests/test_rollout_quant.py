"""The W8A8-KV8 executor (interq.quant) plugged into the rollout engine runs the same episodes."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from interq.quant import QuantConfig, QuantKVCache, make_executor, make_kv_cache
from interq.rollout import RolloutEngine, SamplingParams, collate_trajectories, sequence_logprobs

VOCAB = 96


def tiny_qwen3() -> Qwen3ForCausalLM:
    torch.manual_seed(1)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
    return Qwen3ForCausalLM(cfg).eval()


def observations(n, turns, seed=7):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randint(4, VOCAB, (int(torch.randint(1, 10, (1,), generator=g)),), generator=g).tolist()
             for _ in range(turns)] for _ in range(n)]


def run(engine, obs, seeds, sampling):
    batch = engine.new_batch(seeds, sampling)
    for t in range(len(obs[0])):
        batch.step({i: obs[i][t] for i in batch.live})
    return batch, [batch.finish(i) for i in range(len(seeds))]


def quant_engine(model, qcfg):
    return RolloutEngine(make_executor(model, qcfg), cache_factory=lambda config: make_kv_cache(qcfg, config),
                         info={"executor": "w8a8-kv8"})


@pytest.mark.parametrize("qcfg", [QuantConfig(), QuantConfig(w_format="fp8_e4m3", kv_format="fp8_per_token_head")],
                         ids=["int8", "fp8"])
def test_w8a8_executor_runs_the_same_episodes(qcfg):
    model = tiny_qwen3()
    sampling = SamplingParams(temperature=1.0, max_action_tokens=6, stop_token_ids=(3,))
    obs = observations(4, 4)
    engine = quant_engine(model, qcfg)
    batch, trajs = run(engine, obs, [10, 11, 12, 13], sampling)
    ref_batch, ref = run(RolloutEngine(model), obs, [10, 11, 12, 13], sampling)
    for q, r in zip(trajs, ref):
        # same episodes: every turn's observation chunk is recorded where the turn says, in both runs
        for traj in (q, r):
            assert len(traj.turns) == 4 and not traj.truncated
            assert [traj.token_ids[s.obs_start : s.act_start].tolist() for s in traj.turns] == obs[traj.episode]
        assert torch.isfinite(q.behavior_logprobs).all() and q.info["executor"] == "w8a8-kv8"
        assert q.info["quant_config"]["w_format"] == qcfg.w_format
        assert q.num_action_tokens == sum(s.act_end - s.act_start for s in q.turns)
    # the executor's log-probs are those of a different (quantized) policy: close to the fp32 learner, not equal
    inputs = collate_trajectories(trajs)
    with torch.no_grad():
        learner = sequence_logprobs(model, inputs["input_ids"], inputs["attention_mask"])
    gap = (learner - inputs["behavior_logprobs"])[inputs["action_mask"]].abs()
    assert 0 < gap.mean().item() < 0.1, f"W8A8 vs fp32 learner mean |gap| {gap.mean().item()}"


def test_w8a8_batched_equals_one_by_one():
    """Per-token activation scales and exact int32 GEMMs keep a sequence's numerics batch-invariant."""
    model = tiny_qwen3()
    qcfg = QuantConfig()
    engine = quant_engine(model, qcfg)
    sampling = SamplingParams(temperature=1.0, max_action_tokens=5)
    obs = observations(3, 3, seed=9)
    _, batched = run(engine, obs, [1, 2, 3], sampling)
    for i in range(3):
        _, alone = run(engine, obs[i : i + 1], [i + 1], sampling)
        assert torch.equal(alone[0].token_ids, batched[i].token_ids), f"episode {i}"
        gap = (alone[0].behavior_logprobs - batched[i].behavior_logprobs).abs().max().item()
        assert gap < 1e-3, f"episode {i}: {gap}"


@pytest.mark.parametrize("storage", ["codes", "dequantized"])
def test_quantized_cache_rows_and_columns_are_freed(storage):
    model = tiny_qwen3()
    qcfg = QuantConfig()
    engine = RolloutEngine(make_executor(model, qcfg), cache_factory=lambda c: make_kv_cache(qcfg, c, storage=storage))
    obs = observations(3, 2)
    batch = engine.new_batch([0, 1, 2], SamplingParams(max_action_tokens=3))
    batch.step({i: obs[i][0] for i in range(3)})
    batch.step({i: obs[i][1] for i in range(3)})
    cache = batch._cache
    assert isinstance(cache, QuantKVCache)
    batch.finish(0)
    batch.finish(2)
    layer = cache.layers[0]
    assert layer.keys.dtype == (torch.int8 if storage == "codes" else torch.float32) and layer.keys.shape[0] == 1
    assert layer.keys.shape[-2] == batch.cache_columns() == batch.episodes[1].position
    if storage == "codes":
        assert layer.key_scales.shape[-2] == layer.keys.shape[-2]
