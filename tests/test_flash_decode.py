"""interq's one-call flash decode (``flash_decode_amx`` in the CPU kernels, used by rollout.attention=sdpa_packed):
torch's CPU flash attention of bf16 decode problems, bit for bit, where oneDNN multiplies by AMX-BF16 tiles."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from interq import kernels
from interq.rollout import attention as A
from interq.rollout.fast_layers import set_rollout_attention


def _kernels():
    mod = kernels.load()
    if mod is None or not mod.has_bf16_gemm_amx():
        pytest.skip("needs interq's CPU kernels on a CPU with AMX-BF16")
    return mod


def _problem(b, g, length, d, seed, spare=0):
    """q [B, 3, G, D]; K / V [B, 3, L, D] views of a longer cache (rows strided as in the rollout's cache)."""
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(b, 3, g, d, generator=gen) * 2).bfloat16()
    k = (torch.randn(b, 3, length + spare, d, generator=gen) * 2).bfloat16()[:, :, :length]
    v = torch.randn(b, 3, length + spare, d, generator=gen).bfloat16()[:, :, :length]
    return q, k, v


def _masks(b, length, seed):
    """None, a padding mask (bool), the same as bf16 with -inf and with bf16's lowest value, and one for the batch."""
    gen = torch.Generator().manual_seed(seed)
    keep = torch.ones(b, 1, 1, length, dtype=torch.bool)
    for i in range(b):
        keep[i, ..., : int(torch.randint(0, length, (1,), generator=gen))] = False
    neg = torch.zeros(b, 1, 1, length, dtype=torch.bfloat16)
    return [None, keep, neg.masked_fill(~keep, float("-inf")),
            neg.masked_fill(~keep, torch.finfo(torch.bfloat16).min), keep[:1]]


def _same_bits(a, b):
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


LENGTHS = [1, 2, 15, 16, 17, 31, 32, 33, 47, 100, 511, 512, 513, 1100]


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("g,d", [(3, 64), (2, 32), (7, 128), (16, 64)])
def test_equals_torch_flash_bit_for_bit(length, g, d):
    mod = _kernels()
    q, k, v = _problem(3, g, length, d, seed=length * 100 + g, spare=5)
    for mask in _masks(3, length, seed=length):
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out, exact = mod.flash_decode_amx(q, k, v, mask, 1.0 / math.sqrt(d))
        assert exact and _same_bits(out, ref), (length, g, d, None if mask is None else (mask.dtype, mask.shape))


@pytest.mark.parametrize("threads", [1, 2])
def test_many_problems_and_blocks_at_each_thread_count(threads):
    """Several blocks of 512 keys with rows whose first blocks are entirely padding (their state is kept), over
    the threads (each problem is computed whole by one thread)."""
    mod = _kernels()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        q, k, v = _problem(8, 3, 1700, 64, seed=threads)
        keep = torch.ones(8, 1, 1, 1700, dtype=torch.bool)
        for i, cut in enumerate([0, 5, 511, 512, 600, 1024, 1500, 1699]):
            keep[i, ..., :cut] = False
        for mask in (None, keep):
            ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.125)
            out, exact = mod.flash_decode_amx(q, k, v, mask, 0.125)
            assert exact and _same_bits(out, ref)
    finally:
        torch.set_num_threads(before)


def test_torch_settings_that_change_its_path_turn_the_kernel_off():
    """With torch's flash attention turned off (its math attention) or oneDNN off (other GEMMs), or inputs that need
    gradients, sdpa_packed takes torch's call."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    _kernels()
    q, k, v = _problem(2, 3, 40, 64, seed=5)
    assert A._flash_decode(q, k, v, None, None) is not None
    with sdpa_kernel(SDPBackend.MATH):
        assert A._flash_decode(q, k, v, None, None) is None
    torch.backends.mkldnn.enabled = False  # (its flags() context also sets a TF32 flag, with a warning)
    try:
        assert A._flash_decode(q, k, v, None, None) is None
    finally:
        torch.backends.mkldnn.enabled = True
    assert A._flash_decode(q, k.requires_grad_(), v, None, None) is None


def test_a_float_mask_that_could_round_otherwise_is_declined():
    """With a scale that is not a power of two, torch may fuse scale and mask into one multiply-add: a mask value
    that is neither 0, -inf nor huge is declined (exact = False) and sdpa_packed then takes torch's result."""
    mod = _kernels()
    q, k, v = _problem(2, 4, 40, 128, seed=3)
    bias = torch.randn(2, 1, 1, 40).bfloat16()
    _, exact = mod.flash_decode_amx(q, k, v, bias, 1.0 / math.sqrt(128))
    assert not exact
    _, exact = mod.flash_decode_amx(q, k, v, bias, 0.125)  # a power of two: the product is exact either way
    assert exact
    packed = A._flash_decode(q, k, v, bias, None)
    assert packed is None


def test_bad_shapes_are_refused_by_name():
    mod = _kernels()
    q, k, v = _problem(1, 3, 10, 64, seed=0)
    with pytest.raises(RuntimeError, match="G from 2 to 16"):
        mod.flash_decode_amx(q[:, :, :1], k, v, None, 0.125)  # one row: oneDNN sums it otherwise
    with pytest.raises(RuntimeError, match="multiple of 32"):
        mod.flash_decode_amx(q[..., :48], k[..., :48], v[..., :48], None, 0.125)
    with pytest.raises(RuntimeError, match="must be bfloat16"):
        mod.flash_decode_amx(q.float(), k.float(), v.float(), None, 0.125)
    with pytest.raises(RuntimeError, match="mask must be"):
        mod.flash_decode_amx(q, k, v, torch.ones(1, 3, 1, 10, dtype=torch.bool), 0.125)


def test_the_probe_decides_once_per_shape_and_thread_count():
    _kernels()
    if not (torch.backends.mkldnn.enabled and torch.backends.cuda.flash_sdp_enabled()):
        pytest.skip("torch's flash attention or oneDNN is turned off here")
    assert not A.flash_decode_matches(1, 64) and not A.flash_decode_matches(3, 48)
    assert A.flash_decode_matches(3, 64)
    assert A._FLASH[(3, 64, torch.get_num_threads())] is True


def test_sdpa_packed_decode_is_the_same_with_and_without_it():
    """The engine's episodes (tokens and behavior log-probs) with the one-call decode and with torch's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from interq.rollout import RolloutEngine, SamplingParams

    _kernels()
    if not A._FLASH["enabled"]:
        pytest.skip("the one-call decode is turned off here (INTERQ_FLASH_DECODE=0)")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=192, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
                      attn_implementation="sdpa")
    model = set_rollout_attention(LlamaForCausalLM(cfg).bfloat16().eval().requires_grad_(False), "sdpa_packed")
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(4, 96, (n,), generator=gen).tolist() for n in (530, 300, 12)]  # padded, > 1 block

    def play():
        batch = RolloutEngine(model).new_batch([1, 2, 3], SamplingParams(temperature=1.0, max_action_tokens=8))
        batch.step({i: p for i, p in enumerate(prompts)})
        batch.step({i: [7, 8, 9] for i in range(3)})
        return batch.close()

    calls = {"n": 0}
    real = A._flash_decode

    def counted(*args):
        out = real(*args)
        calls["n"] += out is not None
        return out

    A._flash_decode = counted
    try:
        with_it = play()
        assert calls["n"] > 0  # the kernel ran
        A.use_flash_decode(False)
        without = play()
    finally:
        A._flash_decode = real
        A.use_flash_decode(True)
    for a, b in zip(with_it, without):
        assert torch.equal(a.token_ids, b.token_ids) and torch.equal(a.behavior_logprobs, b.behavior_logprobs)


def test_a_probe_that_disagrees_leaves_the_shape_to_torch(monkeypatch):
    """Another torch (or oneDNN) with other sums: the probe's comparison fails, the shape is remembered as not
    matching and every call of it takes torch's result."""
    _kernels()
    key = (5, 96, torch.get_num_threads())
    A._FLASH.pop(key, None)
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(A.F, "scaled_dot_product_attention", lambda *a, **k: real(*a, **k) * 1.5)
    try:
        assert not A.flash_decode_matches(5, 96) and A._FLASH[key] is False
        q, k, v = _problem(2, 5, 30, 96, seed=9)
        assert A._flash_decode(q, k, v, None, None) is None
    finally:
        A._FLASH.pop(key, None)
