"""rollout.attention=sdpa_packed (interq.rollout.attention): a single query token always attends with its KV head's
query heads packed, so an episode's decode takes the same kernel path whether or not its batch is padded."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from interq.rollout import RolloutEngine, SamplingParams
from interq.rollout.attention import ATTENTION_CHOICES, NAME, sdpa_packed_attention
from interq.rollout.fast_layers import set_rollout_attention


class _Attn(torch.nn.Module):
    num_key_value_groups = 3
    training = False
    is_causal = True


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("k_len", [40, 700])
def test_packed_decode_equals_transformers_packed_path_and_gqa_to_rounding(dtype, k_len):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(k_len)
    q = torch.randn(4, 9, 1, 64, dtype=dtype)  # [B, H, 1, D]
    k, v = torch.randn(4, 3, k_len, 64, dtype=dtype), torch.randn(4, 3, k_len, 64, dtype=dtype)  # [B, H_kv, K, D]
    mask = torch.ones(4, 1, 1, k_len, dtype=torch.bool)
    mask[0, ..., :5] = False  # a padded row: transformers keeps the mask and packs
    ours, _ = sdpa_packed_attention(_Attn(), q, k, v, mask, scaling=0.125)  # [B, 1, H, D]
    theirs, _ = sdpa_attention_forward(_Attn(), q, k, v, mask, scaling=0.125)
    assert torch.equal(ours, theirs)  # the ragged-batch path, bit for bit
    unpadded, _ = sdpa_packed_attention(_Attn(), q, k, v, None, scaling=0.125)
    gqa = F.scaled_dot_product_attention(q, k, v, scale=0.125, enable_gqa=True).transpose(1, 2)  # transformers, no mask
    torch.testing.assert_close(unpadded, gqa, **({"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {}))
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), scale=0.125, enable_gqa=True).transpose(1, 2)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    assert (unpadded.double() - ref).abs().max() < tol


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("n,k_len", [(7, 40), (221, 1300)])
def test_masked_prefill_reads_kv_heads_in_place_bit_for_bit(dtype, n, k_len):
    """A masked prefill (the rollout's: new tokens left-padded, cached columns of other turns' padding) runs torch's
    enable_gqa instead of transformers' repeat_kv: the same bits, several key blocks of the flash kernel long."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(n)
    b, cols = 5, k_len + n
    q = torch.randn(b, 9, n, 64, dtype=dtype)  # [B, H, n, D]
    k, v = torch.randn(b, 3, cols, 64, dtype=dtype), torch.randn(b, 3, cols, 64, dtype=dtype)  # [B, H_kv, K + n, D]
    real = torch.rand(b, cols) < 0.75  # [B, K + n] columns some turn padded
    real[:, -1] = True
    causal = torch.ones(n, cols, dtype=torch.bool).tril(diagonal=k_len)  # [n, K + n] bottom-right
    mask = real[:, None, None, :] & causal[None, None]  # [B, 1, n, K + n]
    ours, _ = sdpa_packed_attention(_Attn(), q, k, v, mask, scaling=0.125)  # [B, n, H, D]
    theirs, _ = sdpa_attention_forward(_Attn(), q, k, v, mask, scaling=0.125)
    assert ours.shape == theirs.shape == (b, n, 9, 64) and ours.is_contiguous()
    assert torch.equal(ours, theirs)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask, scale=0.125,
                                         enable_gqa=True).transpose(1, 2)  # [B, n, H, D]
    assert (ours.double() - ref).abs().max() < (2e-2 if dtype == torch.bfloat16 else 1e-5)


def test_prefill_and_plain_heads_are_transformers_own():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    q, k, v = torch.randn(2, 9, 5, 16), torch.randn(2, 3, 5, 16), torch.randn(2, 3, 5, 16)
    assert torch.equal(sdpa_packed_attention(_Attn(), q, k, v, None)[0], sdpa_attention_forward(_Attn(), q, k, v, None)[0])


def _gqa_llama(dtype):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=96, intermediate_size=128, num_hidden_layers=2, num_attention_heads=6,
                      num_key_value_heads=2, max_position_embeddings=2048, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).to(dtype).eval().requires_grad_(False)


def _play(model, prompts, seeds, new_tokens=6):
    batch = RolloutEngine(model).new_batch(seeds, SamplingParams(temperature=1.0, max_action_tokens=new_tokens))
    batch.step({i: p for i, p in enumerate(prompts)})
    batch.step({i: [7, 8, 9] for i in range(len(prompts))})
    return batch.close()


def test_engine_episode_is_the_same_alone_and_in_a_padded_batch_at_long_context():
    """transformers' unpadded and padded decode paths can differ by rounding (one bf16 ulp here and there, seen for
    SmolLM2's shapes at 400-2,000 cached tokens); with sdpa_packed an episode played alone (no padding) takes the
    padded batch's path and equals the same episode in it."""
    model = set_rollout_attention(_gqa_llama(torch.bfloat16), "sdpa_packed")
    assert model.config._attn_implementation == NAME
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(4, 96, (n,), generator=g).tolist() for n in (700, 640)]
    together = _play(model, prompts, [11, 12])
    alone = _play(model, prompts[:1], [11])
    assert torch.equal(together[0].token_ids, alone[0].token_ids)
    assert torch.equal(together[0].behavior_logprobs, alone[0].behavior_logprobs)


def test_engine_with_packed_attention_matches_the_default_on_short_contexts():
    base = _gqa_llama(torch.bfloat16)
    packed = set_rollout_attention(copy.deepcopy(base), "sdpa_packed")
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(4, 96, (12,), generator=g).tolist() for _ in range(3)]  # aligned: no padding
    for a, b in zip(_play(base, prompts, [1, 2, 3]), _play(packed, prompts, [1, 2, 3])):
        assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.behavior_logprobs, b.behavior_logprobs)


def test_choices_and_errors():
    from interq.train.config import ATTENTIONS

    assert ATTENTIONS == ATTENTION_CHOICES
    model = _gqa_llama(torch.float32)
    assert set_rollout_attention(model, "sdpa") is model and model.config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match="rollout.attention must be one of"):
        set_rollout_attention(model, "flash")
    model.set_attn_implementation("eager")
    with pytest.raises(ValueError, match="needs a model with transformers' sdpa attention"):
        set_rollout_attention(model, "sdpa_packed")


@pytest.mark.parametrize("executor", ["bf16", "w8a8"])
def test_build_executor_gives_the_rollout_copy_the_attention_and_leaves_the_learner(executor):
    from interq.train.build import build_executor
    from interq.train.config import RolloutConfig

    learner = _gqa_llama(torch.float32)
    ex = build_executor(learner, RolloutConfig(executor=executor))  # the default since NUMERICS_VERSION 2
    assert ex.module.config._attn_implementation == NAME
    assert learner.config._attn_implementation == "sdpa"
    plain = build_executor(learner, RolloutConfig(executor=executor, attention="sdpa"))
    assert plain.module.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("executor", ["bf16", "fp32"])
def test_the_unquantized_arms_executor_plays_a_plain_copys_episodes_before_and_after_a_sync(executor):
    """build_executor's bf16 / fp32 arm is make_executor(BF16_EXECUTOR) (packed products, fused norms: speed only):
    its episodes are a plain copy's of the learner, bit for bit, at the start and after the learner's weights change
    and are synced (the packed weights made again)."""
    from interq.train.build import build_executor
    from interq.train.config import RolloutConfig

    learner = _gqa_llama(torch.float32)
    ex = build_executor(learner, RolloutConfig(executor=executor))
    dtype = torch.bfloat16 if executor == "bf16" else torch.float32
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(4, 96, (n,), generator=gen).tolist() for n in (30, 11, 4)]

    def same_as_a_plain_copy():
        plain = set_rollout_attention(copy.deepcopy(learner).to(dtype).eval().requires_grad_(False), "sdpa_packed")
        for a, b in zip(_play(ex.module, prompts, [5, 6, 7]), _play(plain, prompts, [5, 6, 7])):
            assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.behavior_logprobs, b.behavior_logprobs)

    same_as_a_plain_copy()
    with torch.no_grad():
        for p in learner.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    ex.sync(learner)
    same_as_a_plain_copy()
