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


# --------------------------------------------------------------------------------- packed_kernel (opt-in)

def _decode_kernel():
    from interq.quant import kernels

    mod = kernels.load()
    if mod is None:
        pytest.skip(f"CPU kernels not built: {kernels.status()['reason']}")
    return mod


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("g,d", [(1, 64), (3, 64), (8, 128), (3, 16)])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive", "shared"])
def test_decode_kernel_is_as_close_to_float64_as_torchs_flash_kernel(dtype, g, d, mask_kind):
    """The kernel against a float64 reference on awkward inputs (cached lengths not multiples of 16, K/V as prefix
    views of a larger buffer, scores spread wide): its error is at most torch's flash kernel's (plus a little)."""
    mod = _decode_kernel()
    gen = torch.Generator().manual_seed(g * 1000 + d)
    b, hkv, k_len = 5, 2, 333
    q = (torch.randn(b, hkv, g, d, generator=gen) * 2).to(dtype)
    buf_k = torch.randn(b, hkv, 400, d, generator=gen).to(dtype)
    buf_v = torch.randn(b, hkv, 400, d, generator=gen).to(dtype)
    k, v = buf_k[:, :, :k_len], buf_v[:, :, :k_len]  # strided: rows of a growing cache
    keep = torch.rand(b, 1, 1, k_len, generator=gen) > 0.3
    keep[..., -1] = True  # every row attends to something (its own token)
    mask = {"none": None, "bool": keep, "additive": torch.zeros(b, 1, 1, k_len).masked_fill(~keep, float("-inf")).to(dtype),
            "shared": keep[:1]}[mask_kind]
    scale = d ** -0.5
    out = mod.decode_attention(q, k, v, mask, scale)
    assert out.shape == (b, hkv, g, d) and out.dtype == dtype
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                         attn_mask=None if mask is None else (mask if mask.dtype == torch.bool else mask.double()),
                                         scale=scale)
    flash = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    err, err_flash = (out.double() - ref).abs().max().item(), (flash.double() - ref).abs().max().item()
    assert err <= 1.5 * err_flash + (1e-6 if dtype == torch.float32 else 1e-3), (err, err_flash)


def test_decode_kernel_refuses_bad_inputs_with_the_argument_named():
    mod = _decode_kernel()
    q, kv = torch.randn(2, 3, 3, 64), torch.randn(2, 3, 10, 64)
    with pytest.raises(RuntimeError, match="D must be a multiple of 16"):
        mod.decode_attention(q[..., :40], kv[..., :40], kv[..., :40], None, 0.1)
    with pytest.raises(RuntimeError, match="share one dtype"):
        mod.decode_attention(q.bfloat16(), kv, kv, None, 0.1)
    with pytest.raises(RuntimeError, match=r"mask must be \[B\|1, 1, 1, K\]"):
        mod.decode_attention(q, kv, kv, torch.ones(2, 3, 1, 10, dtype=torch.bool), 0.1)


def test_packed_kernel_attention_is_the_packed_one_to_rounding_and_falls_back_where_it_must():
    from interq.quant import kernels
    from interq.rollout.attention import packed_kernel_attention

    _decode_kernel()
    torch.manual_seed(3)
    q = torch.randn(4, 9, 1, 64, dtype=torch.bfloat16)
    k, v = torch.randn(4, 3, 500, 64, dtype=torch.bfloat16), torch.randn(4, 3, 500, 64, dtype=torch.bfloat16)
    mask = torch.ones(4, 1, 1, 500, dtype=torch.bool)
    mask[0, ..., :7] = False
    ours, _ = packed_kernel_attention(_Attn(), q, k, v, mask, scaling=0.125)
    packed, _ = sdpa_packed_attention(_Attn(), q, k, v, mask, scaling=0.125)
    assert ours.shape == packed.shape == (4, 1, 9, 64) and ours.is_contiguous()
    torch.testing.assert_close(ours, packed, rtol=2e-2, atol=2e-2)
    assert not torch.equal(ours, packed)  # another computation (fp32 inside): not the same bits
    per_head = mask.expand(4, 9, 1, 500)  # per-head masks: sdpa_packed's own call
    assert torch.equal(packed_kernel_attention(_Attn(), q, k, v, per_head, scaling=0.125)[0],
                       sdpa_packed_attention(_Attn(), q, k, v, per_head, scaling=0.125)[0])
    kernels.set_enabled(False)  # kernels turned off: sdpa_packed's
    try:
        assert torch.equal(packed_kernel_attention(_Attn(), q, k, v, mask, scaling=0.125)[0], packed)
    finally:
        kernels.set_enabled(True)
    prefill = torch.randn(4, 9, 5, 64, dtype=torch.bfloat16)  # more than one token, a mask: the prefill kernel
    pmask = torch.ones(4, 1, 5, 500, dtype=torch.bool)
    pmask[1, ..., :20] = False
    ours = packed_kernel_attention(_Attn(), prefill, k, v, pmask, scaling=0.125)[0]
    packed = sdpa_packed_attention(_Attn(), prefill, k, v, pmask, scaling=0.125)[0]
    assert ours.shape == packed.shape == (4, 5, 9, 64) and ours.is_contiguous()
    torch.testing.assert_close(ours, packed, rtol=2e-2, atol=2e-2)
    assert not torch.equal(ours, packed)
    for other in (None, pmask.expand(4, 9, 5, 500)):  # no mask (a causal prefill), per-head masks: sdpa_packed's
        assert torch.equal(packed_kernel_attention(_Attn(), prefill[..., :5, :], k[:, :, :5], v[:, :, :5], other
                                                   if other is None else other[..., :5], scaling=0.125)[0],
                           sdpa_packed_attention(_Attn(), prefill[..., :5, :], k[:, :, :5], v[:, :, :5], other
                                                 if other is None else other[..., :5], scaling=0.125)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_model_with_packed_kernel_prefills_the_same_and_decodes_to_rounding(dtype):
    """A GQA model's prefill and teacher-forced decode logits agree with sdpa_packed's to rounding, also in a padded
    batch whose rows have different lengths (rows left-padded by the engine's masks)."""
    from transformers import DynamicCache

    _decode_kernel()
    base = _gqa_llama(dtype)
    a = set_rollout_attention(copy.deepcopy(base), "sdpa_packed")
    b = set_rollout_attention(copy.deepcopy(base), "packed_kernel")
    assert b.config._attn_implementation == "interq_packed_kernel"
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(4, 96, (3, 300), generator=g)
    mask = torch.ones(3, 300, dtype=torch.long)
    mask[1, :40] = 0  # a left-padded row
    steps = torch.randint(4, 96, (3, 6), generator=g)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 5e-2, "atol": 5e-2}
    with torch.no_grad():
        outs = []
        for m in (a, b):
            cache = DynamicCache(config=m.config)
            first = m(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True).logits
            dec, am = [], mask
            for t in range(steps.shape[1]):
                am = torch.cat([am, torch.ones(3, 1, dtype=torch.long)], 1)
                dec.append(m(input_ids=steps[:, t:t + 1], attention_mask=am, cache=cache, use_cache=True).logits)
            outs.append((first, torch.cat(dec, 1)))
    real = mask.bool()[:, :, None].expand(-1, -1, outs[0][0].shape[-1])  # [B, L, V]: padding positions' logits aside
    torch.testing.assert_close(outs[1][0][real], outs[0][0][real], **tol)
    torch.testing.assert_close(outs[1][1], outs[0][1], **tol)
    assert not torch.equal(outs[1][0], outs[0][0]) and not torch.equal(outs[1][1], outs[0][1])  # the kernels ran


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("g,d", [(3, 64), (1, 16), (2, 128)])
@pytest.mark.parametrize("mask_kind", ["bool", "additive", "shared"])
def test_prefill_kernel_is_as_close_to_float64_as_torchs_flash_kernel(dtype, g, d, mask_kind):
    """The masked prefill kernel (several new tokens over a cache) against float64 on a rollout's masks: rows
    left-padded by different amounts, causal over the new tokens, K/V prefix views of a larger buffer, query lengths
    across block edges; a query row with nothing to attend (a padding token) gives 0, as torch's kernel."""
    mod = _decode_kernel()
    gen = torch.Generator().manual_seed(g * 100 + d)
    b, hkv, past, n = 3, 2, 70, 67
    k_len = past + n
    q = (torch.randn(b, hkv * g, n, d, generator=gen) * 2).to(dtype)
    buf_k = torch.randn(b, hkv, 200, d, generator=gen).to(dtype)
    buf_v = torch.randn(b, hkv, 200, d, generator=gen).to(dtype)
    k, v = buf_k[:, :, :k_len], buf_v[:, :, :k_len]
    col, row = torch.arange(k_len), torch.arange(n)[:, None] + past
    pad = torch.tensor([0, 30, 90])[:, None, None, None]  # row 2's first new tokens are padding too
    keep = (col[None, None, None, :] <= row[None, None]) & (col[None, None, None, :] >= pad)  # [B, 1, n, K]
    mask = {"bool": keep, "additive": torch.zeros(b, 1, n, k_len).masked_fill(~keep, float("-inf")).to(dtype),
            "shared": keep[1:2]}[mask_kind]
    scale = d ** -0.5
    out = mod.masked_attention(q, k, v, mask, scale)  # [B, n, H, D]
    assert out.shape == (b, n, hkv * g, d) and out.dtype == dtype
    m64 = mask if mask.dtype == torch.bool else mask.double()
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=m64, scale=scale,
                                         enable_gqa=True).transpose(1, 2)
    empty = ~(mask if mask.dtype == torch.bool else mask > float("-inf")).any(-1)  # [B|1, 1, n]: nothing to attend
    ref = ref.masked_fill(empty.expand(b, 1, n).transpose(1, 2)[..., None], 0.0)  # as torch's CPU flash kernel
    flash = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True).transpose(1, 2)
    err, err_flash = (out.double() - ref).abs().max().item(), (flash.double() - ref).abs().max().item()
    assert err <= 1.5 * err_flash + (1e-6 if dtype == torch.float32 else 1e-3), (err, err_flash)
    if mask_kind == "bool":
        assert bool(empty.any()) and float(out[2, :5].abs().max()) == 0.0  # padding query rows: 0


def test_prefill_kernel_refuses_bad_inputs_with_the_argument_named():
    mod = _decode_kernel()
    q, kv = torch.randn(2, 3, 4, 64), torch.randn(2, 3, 10, 64)
    mask = torch.ones(2, 1, 4, 10, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="D a multiple of 16"):
        mod.masked_attention(q[..., :40], kv[..., :40], kv[..., :40], mask, 0.1)
    with pytest.raises(RuntimeError, match="share one dtype"):
        mod.masked_attention(q.bfloat16(), kv, kv, mask, 0.1)
    with pytest.raises(RuntimeError, match=r"mask must be \[B\|1, 1, Lq, Lk\]"):
        mod.masked_attention(q, kv, kv, torch.ones(2, 3, 4, 10, dtype=torch.bool), 0.1)

def test_build_executor_takes_packed_kernel():
    from interq.train.build import build_executor
    from interq.train.config import RolloutConfig

    learner = _gqa_llama(torch.float32)
    ex = build_executor(learner, RolloutConfig(executor="w8a8", attention="packed_kernel"))
    assert ex.module.config._attn_implementation == "interq_packed_kernel"
    assert learner.config._attn_implementation == "sdpa"
