"""Equivalence tests for the rollout engine: batched == one-by-one, behavior == learner,
KV reuse == re-prefill, stop / per-turn / context limits, cache freeing, validation."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from ulps import assert_within_ulps

from interq.rollout import (
    RolloutEngine,
    SamplingParams,
    collate_trajectories,
    sample_tokens,
    sequence_logprobs,
    transformed_logprobs,
)

VOCAB = 96
STOP = 3


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return LlamaForCausalLM(cfg).eval()


def tiny_qwen3() -> Qwen3ForCausalLM:
    torch.manual_seed(1)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512)
    return Qwen3ForCausalLM(cfg).eval()


MODELS = {"llama": tiny_llama, "qwen3": tiny_qwen3}


def make_observations(n_episodes: int, n_turns: int, seed: int = 7) -> list[list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    return [
        [torch.randint(4, VOCAB, (int(torch.randint(1, 12, (1,), generator=g)),), generator=g).tolist() for _ in range(n_turns)]
        for _ in range(n_episodes)
    ]


def run_episodes(engine, observations, seeds, sampling, **batch_kw):
    """Drive a batch: every live episode gets its next observation each turn; all finish at the end."""
    batch = engine.new_batch(seeds, sampling, **batch_kw)
    n_turns = len(observations[0])
    for t in range(n_turns):
        obs = {i: observations[i][t] for i in batch.live}
        if not obs:
            break
        batch.step(obs)
    return [batch.finish(i) for i in range(len(seeds))]


@pytest.mark.parametrize("arch", sorted(MODELS))
def test_batched_equals_one_by_one(arch):
    model = MODELS[arch]()
    engine = RolloutEngine(model)
    sampling = SamplingParams(temperature=1.0, max_action_tokens=8, stop_token_ids=(STOP,))
    observations = make_observations(5, 4)
    seeds = [100 + i for i in range(5)]
    batched = run_episodes(engine, observations, seeds, sampling, max_context_tokens=62)
    assert any(t.truncated for t in batched) and not all(t.truncated for t in batched)
    for i in range(5):
        alone = run_episodes(engine, observations[i : i + 1], seeds[i : i + 1], sampling, max_context_tokens=62)[0]
        assert torch.equal(alone.token_ids, batched[i].token_ids), f"episode {i}: tokens differ batched vs alone"
        assert torch.equal(alone.action_mask, batched[i].action_mask)
        assert alone.turns == batched[i].turns and alone.truncated == batched[i].truncated
        gap = (alone.behavior_logprobs - batched[i].behavior_logprobs).abs().max().item()
        assert gap < 1e-5, f"episode {i}: behavior log-probs differ by {gap}"


@pytest.mark.parametrize("arch", sorted(MODELS))
@pytest.mark.parametrize("sampling", [
    SamplingParams(temperature=1.0, max_action_tokens=6, stop_token_ids=(STOP,)),
    SamplingParams(temperature=0.7, max_action_tokens=6, stop_token_ids=(STOP,)),
    SamplingParams(temperature=1.3, top_k=20, top_p=0.9, max_action_tokens=6),
], ids=["t1", "t0.7", "t1.3-k20-p0.9"])
def test_behavior_logprobs_equal_learner_forward(arch, sampling):
    """THE equivalence: the executor's log-probs == the learner's forward over the finished trajectories."""
    model = MODELS[arch]()
    engine = RolloutEngine(model)
    trajs = run_episodes(engine, make_observations(4, 5, seed=3), [1, 2, 3, 4], sampling)
    batch = collate_trajectories(trajs)
    with torch.no_grad():
        learner = sequence_logprobs(model, batch["input_ids"], batch["attention_mask"],
                                    temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p)
    mask = batch["action_mask"]
    assert int(mask.sum()) > 40
    assert torch.isfinite(batch["behavior_logprobs"][mask]).all()
    gap = (learner - batch["behavior_logprobs"])[mask].abs().max().item()
    assert gap < 1e-4, f"behavior vs learner max |gap| {gap}"
    # a learner with the wrong temperature must *not* match (the test can fail)
    if sampling.temperature != 1.0 and sampling.top_k == 0:
        with torch.no_grad():
            wrong = sequence_logprobs(model, batch["input_ids"], batch["attention_mask"], temperature=1.0)
        assert (wrong - batch["behavior_logprobs"])[mask].abs().max().item() > 1e-2
    assert (batch["behavior_logprobs"][~mask] == 0).all() and (learner[batch["attention_mask"] == 0] == 0).all()


def test_kv_reuse_equals_reprefill():
    """Naive reference: re-run the whole history without a cache before every sampled token."""
    model = tiny_llama()
    sampling = SamplingParams(temperature=0.8, max_action_tokens=5, stop_token_ids=(STOP,))
    observations = make_observations(1, 4, seed=11)[0]
    traj = run_episodes(RolloutEngine(model), [observations], [5], sampling)[0]

    gen = torch.Generator().manual_seed(5)
    ids: list[int] = []
    lps: list[float] = []
    with torch.no_grad():
        for obs in observations:
            ids += obs
            for k in range(sampling.max_action_tokens):
                logits = model(input_ids=torch.tensor([ids])).logits[:, -1].float()  # [1, V]
                tok, lp = sample_tokens(logits, sampling, [gen])
                ids.append(int(tok))
                lps.append(float(lp))
                if int(tok) == STOP:
                    break
    assert traj.token_ids.tolist() == ids
    gap = (traj.behavior_logprobs[traj.action_mask] - torch.tensor(lps)).abs().max().item()
    assert gap < 1e-5, gap


def test_stop_and_per_turn_limit():
    model = tiny_llama()
    # temperature tiny + a huge bias on the stop token after the first action token: force "stop" deterministically
    engine = RolloutEngine(model)
    sampling = SamplingParams(temperature=1.0, max_action_tokens=4, stop_token_ids=(STOP,))
    with torch.no_grad():
        model.lm_head.weight[STOP].zero_()
        model.lm_head.weight[STOP, 0] = 0.0
    batch = engine.new_batch([0], sampling)
    out = batch.step({0: [5, 6, 7]})[0]
    assert len(out.action_ids) <= 4 and len(out.behavior_logprobs) == len(out.action_ids)
    if out.stop_reason == "stop":
        assert out.action_ids[-1] == STOP and STOP not in out.action_ids[:-1]
    else:
        assert out.stop_reason == "length" and len(out.action_ids) == 4 and STOP not in out.action_ids
    # a stop token that is always sampled: every action is exactly one token
    sampling_all_stop = SamplingParams(temperature=1.0, max_action_tokens=4, stop_token_ids=tuple(range(VOCAB)))
    batch = engine.new_batch([0, 1], sampling_all_stop)
    res = batch.step({0: [5], 1: [6, 7]})
    assert all(r.stop_reason == "stop" and len(r.action_ids) == 1 for r in res.values())
    # no stop tokens: every action hits the per-turn limit
    batch = engine.new_batch([0, 1], SamplingParams(max_action_tokens=3))
    res = batch.step({0: [5], 1: [6, 7]})
    assert all(r.stop_reason == "length" and len(r.action_ids) == 3 for r in res.values())
    traj = batch.finish(0)
    assert traj.turns[0].obs_start == 0 and traj.turns[0].act_start == 1 and traj.turns[0].act_end == 4
    assert traj.action_mask.tolist() == [False, True, True, True]


def test_context_limit_truncates_without_exception():
    model = tiny_llama()
    engine = RolloutEngine(model, max_context_tokens=12)
    batch = engine.new_batch([0, 1], SamplingParams(max_action_tokens=4))
    res = batch.step({0: [5, 6, 7, 8, 9, 10, 11, 12, 13, 14], 1: [5]})  # episode 0: 10 obs + 2 actions fit
    assert res[0].truncated and res[0].stop_reason == "context" and len(res[0].action_ids) == 2
    assert not res[1].truncated and batch.live == [1]
    res = batch.step({1: [6, 7, 8, 9]})  # 1 + 4 + 4 = 9, +3 more actions fit
    assert res[1].truncated and len(res[1].action_ids) == 3
    t0, t1 = batch.finish(0), batch.finish(1)
    assert len(t0) == 12 and len(t1) == 12 and t0.truncated and t1.truncated
    with pytest.raises(ValueError, match="left the batch"):
        batch.step({1: [5]})
    # an observation that leaves no room for one action token truncates before any forward
    batch = engine.new_batch([0], SamplingParams(max_action_tokens=4))
    res = batch.step({0: list(range(4, 16))})
    assert res[0].truncated and res[0].action_ids == [] and batch.finish(0).turns[0].stop_reason == "context"


def test_reproducible_and_seed_dependent():
    model = tiny_qwen3()
    engine = RolloutEngine(model)
    sampling = SamplingParams(temperature=1.0, max_action_tokens=6)
    obs = make_observations(3, 3)
    a = run_episodes(engine, obs, [1, 2, 3], sampling)
    b = run_episodes(engine, obs, [1, 2, 3], sampling)
    c = run_episodes(engine, obs, [4, 5, 6], sampling)
    assert all(torch.equal(x.token_ids, y.token_ids) and torch.equal(x.behavior_logprobs, y.behavior_logprobs) for x, y in zip(a, b))
    assert any(not torch.equal(x.token_ids, y.token_ids) for x, y in zip(a, c))


def test_finished_episodes_free_cache_and_waiting_episodes_are_unaffected():
    model = tiny_llama()
    engine = RolloutEngine(model)
    sampling = SamplingParams(temperature=1.0, max_action_tokens=5, stop_token_ids=(STOP,))
    obs = make_observations(3, 4, seed=5)
    batch = engine.new_batch([1, 2, 3], sampling)
    batch.step({i: obs[i][0] for i in range(3)})
    batch.step({0: obs[0][1], 2: obs[2][1]})        # episode 1 waits a turn
    batch.finish(0)
    assert batch.live == [1, 2] and batch._cache.layers[0].keys.shape[0] == 2
    cols_before = batch.cache_columns()
    batch.finish(2)
    assert batch._cache.layers[0].keys.shape[0] == 1
    assert batch.cache_columns() == batch._cache.get_seq_length() < cols_before  # columns compacted
    assert batch.cache_columns() == batch.episodes[1].position  # only episode 1's own tokens remain
    batch.step({1: obs[1][1]})
    t1 = batch.finish(1)
    alone = engine.new_batch([2], sampling)
    alone.step({0: obs[1][0]})
    alone.step({0: obs[1][1]})
    ref = alone.finish(0)
    assert torch.equal(t1.token_ids, ref.token_ids)
    assert (t1.behavior_logprobs - ref.behavior_logprobs).abs().max() < 1e-5


def test_finishing_several_episodes_at_once_equals_finishing_them_one_by_one():
    model = tiny_qwen3()
    engine = RolloutEngine(model)
    sampling = SamplingParams(temperature=1.0, max_action_tokens=4, stop_token_ids=(STOP,))
    obs = make_observations(5, 3, seed=11)
    out = {}
    for together in (False, True):
        batch = engine.new_batch([1, 2, 3, 4, 5], sampling)
        batch.step({i: obs[i][0] for i in range(5)})
        batch.step({i: obs[i][1] for i in (0, 1, 3, 4)})  # episode 2 waits: its columns differ
        if together:
            done = batch.finish_many([0, 3, 1])
        else:
            done = [batch.finish(i) for i in (0, 3, 1)]
        layer = batch._cache.layers[0]
        state = (batch.live, batch.cache_columns(), layer.keys.clone(), layer.values.clone(), batch._mask.clone())
        batch.step({i: obs[i][2] for i in (2, 4)})
        rest = batch.finish_many([2, 4])
        assert batch.live == [] and batch.finish_many([]) == []
        out[together] = (done, state, rest)
    (d0, s0, r0), (d1, s1, r1) = out[False], out[True]
    assert s0[:2] == s1[:2] and all(torch.equal(a, b) for a, b in zip(s0[2:], s1[2:]))
    for a, b in zip(d0 + r0, d1 + r1):
        assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.behavior_logprobs, b.behavior_logprobs)
        assert a.turns == b.turns


def test_bf16_model_runs_and_logprobs_are_fp32():
    model = tiny_llama().to(torch.bfloat16)
    trajs = run_episodes(RolloutEngine(model), make_observations(2, 2), [0, 1], SamplingParams(max_action_tokens=4))
    assert all(t.behavior_logprobs.dtype == torch.float32 and t.num_action_tokens == 8 for t in trajs)


def test_custom_cache_factory_is_used():
    made = []

    def factory(config):
        made.append(config)
        return DynamicCache(config=config)

    model = tiny_llama()
    run_episodes(RolloutEngine(model, cache_factory=factory), make_observations(2, 2), [0, 1], SamplingParams(max_action_tokens=2))
    assert made and made[0] is model.config


def test_greedy_matches_argmax_and_has_zero_logprob():
    model = tiny_llama()
    traj = run_episodes(RolloutEngine(model), [[[5, 6, 7]]], [0], SamplingParams(temperature=0.0, max_action_tokens=3))[0]
    ids = [5, 6, 7]
    with torch.no_grad():
        for _ in range(3):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    assert traj.token_ids.tolist() == ids and (traj.behavior_logprobs == 0).all()


def test_bad_input_errors_name_the_field():
    for kw, field in [({"temperature": -1.0}, "temperature"), ({"top_k": -2}, "top_k"), ({"top_p": 0.0}, "top_p"),
                      ({"max_action_tokens": 0}, "max_action_tokens"), ({"stop_token_ids": (-1,)}, "stop_token_ids")]:
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kw)
    engine = RolloutEngine(tiny_llama())
    batch = engine.new_batch([0], SamplingParams())
    with pytest.raises(ValueError, match="first observation"):
        batch.step({0: []})
    with pytest.raises(IndexError, match="episode"):
        batch.step({3: [5]})
    with pytest.raises(TypeError, match="SamplingParams"):
        engine.new_batch([0], {"temperature": 1.0})


def naive_transform(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """Reference for one row: plain Python over the sorted vocabulary."""
    x = (logits.double() / temperature).tolist()
    order = sorted(range(len(x)), key=lambda i: -x[i])
    keep = set(order[:top_k] if top_k else order)
    z = sum(torch.tensor(x).exp()[list(keep)].tolist())
    mass, kept = 0.0, set()
    for i in order:
        if i not in keep:
            continue
        if mass >= top_p:
            break
        kept.add(i)
        mass += float(torch.tensor(x[i]).exp()) / z
    out = torch.full((len(x),), float("-inf"), dtype=torch.float64)
    norm = torch.logsumexp(torch.tensor([x[i] for i in kept], dtype=torch.float64), 0)
    for i in kept:
        out[i] = x[i] - norm
    return out


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.5, 5, 1.0), (1.5, 0, 0.8), (0.9, 10, 0.6)])
def test_transform_matches_naive_reference(temperature, top_k, top_p):
    logits = torch.randn(3, 40) * 2
    got = transformed_logprobs(logits, temperature, top_k, top_p)
    for r in range(3):
        ref = naive_transform(logits[r], temperature, top_k, top_p)
        assert torch.equal(torch.isinf(got[r]), torch.isinf(ref)), "kept sets differ"
        fin = torch.isfinite(ref)
        assert (got[r][fin].double() - ref[fin]).abs().max() < 1e-5


def test_sampler_draws_from_the_transformed_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    params = SamplingParams(temperature=0.8, top_k=4)
    probs = transformed_logprobs(logits, 0.8, 4, 1.0).exp()[0]
    n = 20000
    gens = [torch.Generator().manual_seed(i) for i in range(n)]
    tok, lp = sample_tokens(logits.expand(n, -1), params, gens)
    assert torch.allclose(lp, probs.log()[tok])
    counts = torch.bincount(tok, minlength=6).float()
    freq = counts / n
    assert counts[4:].sum() == 0, "a token outside the top-k was sampled"
    assert (freq - probs).abs().max() < 0.015, (freq, probs)


def test_collate_layout_and_turn_records():
    model = tiny_llama()
    obs = [[[5, 6], [7]], [[8, 9, 10], [11, 12]]]
    trajs = run_episodes(RolloutEngine(model), obs, [0, 1], SamplingParams(max_action_tokens=2))
    batch = collate_trajectories(trajs, pad_token_id=1)
    assert [len(t) for t in trajs] == [7, 9]
    assert batch["input_ids"].shape == (2, 9) and batch["input_ids"][0, 7:].tolist() == [1, 1]
    assert batch["attention_mask"].sum(1).tolist() == [7, 9]
    assert batch["turn_index"][0].tolist() == [0, 0, 0, 0, 1, 1, 1, -1, -1]
    assert batch["action_mask"][1].tolist() == [False] * 3 + [True] * 2 + [False] * 2 + [True] * 2
    t = trajs[1]
    assert [(s.obs_start, s.act_start, s.act_end, s.stop_reason) for s in t.turns] == [(0, 3, 5, "length"), (5, 7, 9, "length")]
    assert t.action_ids(1) == t.token_ids[7:9].tolist() and t.sampling.max_action_tokens == 2


def test_scored_logprobs_equal_the_full_computation():
    """sequence_logprobs(score_mask=...) projects to the vocabulary only where a row scores a token; the scored
    values and their gradients equal the full computation's, every other position is 0."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from interq.rollout import sequence_logprobs

    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=8))
    ids = torch.randint(0, 97, (3, 12))  # [B, L]
    attn = torch.ones_like(ids)
    attn[1, 9:] = 0  # right padding
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[0, 10:] = True
    mask[1, 3:5] = True
    mask[1, 10] = True  # on padding: not scored
    mask[2, 0] = True   # no prefix: not scored
    full = sequence_logprobs(model, ids, attn, temperature=0.7, top_p=0.9)  # [B, L]
    part = sequence_logprobs(model, ids, attn, temperature=0.7, top_p=0.9, score_mask=mask)  # [B, L]
    scored = mask & attn.bool()
    scored[:, 0] = False
    torch.testing.assert_close(part[scored], full[scored], rtol=0, atol=1e-6)
    assert (part[~scored] == 0).all()
    g_full = torch.autograd.grad(full[scored].sum(), model.model.embed_tokens.weight)[0]
    g_part = torch.autograd.grad(part[scored].sum(), model.model.embed_tokens.weight)[0]
    torch.testing.assert_close(g_part, g_full, rtol=1e-5, atol=1e-6)



@pytest.mark.parametrize("inference", [False, True])
def test_exponential_race_equals_the_serial_loop(inference):
    """The rows of the race, drawn in parallel Python threads, are the numbers a serial loop over the generators
    draws, and leave each generator where the loop leaves it: generators already advanced, an odd vocabulary, and one
    generator named twice (drawn in row order)."""
    from interq.rollout.sampling import exponential_race

    def gens():
        out = [torch.Generator().manual_seed(s) for s in range(7)]
        for i, g in enumerate(out):
            torch.rand(i * 5, generator=g)  # advanced by earlier draws (a double draw takes two 32-bit outputs)
        return out + [out[2]]

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        mine, ref_gens = gens(), gens()
        with torch.inference_mode(inference):
            got = exponential_race(mine, 301)  # [8, 301]
        ref = torch.stack([torch.empty(301, dtype=torch.float64).uniform_(generator=g) for g in ref_gens])
        assert torch.equal(got, (-ref.clamp_min(torch.finfo(torch.float64).tiny).log()).float())
        assert not torch.equal(got[0], got[1]) and not torch.equal(got[2], got[7])
        for a, b in zip(mine, ref_gens):
            assert torch.equal(torch.rand(9, generator=a), torch.rand(9, generator=b))
    finally:
        torch.set_num_threads(threads)


def test_exponential_race_is_exp1():
    """E = -log U is Exp(1): mean 1, variance 1, P(E > t) = exp(-t) in the tail, no zero, no NaN (a zero would give a
    token an infinite race value)."""
    from interq.rollout.sampling import exponential_race

    e = exponential_race([torch.Generator().manual_seed(s) for s in range(8)], 50_000).double().flatten()  # [400k]
    assert not e.isnan().any() and (e > 0).all()
    assert abs(e.mean().item() - 1) < 0.01 and abs(e.var().item() - 1) < 0.02
    for t in (0.01, 1.0, 5.0, 9.0):
        expected = math.exp(-t)
        assert abs((e > t).double().mean().item() - expected) < 4 * math.sqrt(expected / e.numel()) + 1e-6, t


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hidden,vocab", [(48, 96), (256, 4096)])
def test_forward_step_projects_a_contiguous_last_column(dtype, hidden, vocab):
    """A prefill of n > 1 columns hands the lm_head a contiguous [R, 1, H] (a strided slice with a frozen weight made
    torch broadcast the weight to a batched matmul, one copy of it per row), with the logits of the sliced path to
    rounding: the two are different GEMM routes (a linear against a batched matmul), whose fp32 sums agree to the bit
    on some CPU classes (AMX, AVX2) but not all (AVX-512 without native bf16: 2 of 20,480 bf16 logits one step
    apart), so bf16 logits agree within one bf16 ulp of their magnitude (plus the fp32 sum's error near zero)."""
    from interq._hf import cache_kwarg
    from interq.rollout.engine import forward_step

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    model = LlamaForCausalLM(cfg).to(dtype).eval().requires_grad_(False)
    seen = []
    model.lm_head.register_forward_pre_hook(lambda m, args: seen.append(args[0].is_contiguous()))
    ids = torch.randint(4, vocab, (5, 9))
    mask, pos, name = torch.ones_like(ids), torch.arange(9).expand(5, 9), cache_kwarg(model)
    with torch.inference_mode():
        new = forward_step(model, DynamicCache(config=cfg), ids, mask, pos)  # [5, V]
        old = model(input_ids=ids, attention_mask=mask, position_ids=pos, **{name: DynamicCache(config=cfg)},
                    use_cache=True, logits_to_keep=1).logits[:, -1, :].float()
    assert seen[0] is True and seen[1] is False  # ours contiguous; the old slice was not
    if dtype == torch.bfloat16:
        assert_within_ulps(new, old, torch.bfloat16, ulps=1,
                           floor=torch.finfo(torch.float32).eps * hidden * old.abs().max().item())
    else:
        torch.testing.assert_close(new, old, rtol=0, atol=1e-5)
