"""FusedRMSNorm (interq.kernels.rms_norm): the executors' RMSNorms in one kernel call give the eager modules' bits
(torch's own summation order for every row length, inputs of wide magnitudes, any leading shape), keep parameter
names and weight writes, leave autograd and other dtypes to the eager forward, and leave executors' outputs
unchanged. Skipped where interq's CPU kernels do not load."""

import copy

import pytest
import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

from interq import kernels
from interq.quant import BF16_EXECUTOR, QuantConfig, make_executor
from interq.kernels.rms_norm import FusedRMSNorm, fuse_rms_norms, sum_lanes
from interq.quant.testing import perturb_and_sync, tiny_causal_lm

LANES = sum_lanes()
needs_kernel = pytest.mark.skipif(LANES is None, reason=f"interq's CPU kernels: {kernels.status()['reason']}")


def _wide(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * torch.exp(2 * torch.randn(*shape, generator=g))


@needs_kernel
@pytest.mark.parametrize("n", [1, 3, 4, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 128, 576, 1000, 1024, 2560, 4100, 8192])
def test_row_sums_follow_torchs_order_for_every_length(n):
    x = _wide((23, n), n)
    assert torch.equal(kernels.get().torch_row_sums(x, LANES), x.sum(-1))


@needs_kernel
def test_the_other_vector_width_gives_other_sums():
    # the check that picks the width could not pass a wrong one: 8 and 16 lanes add these rows apart
    x = _wide((64, 576), 1)
    other = 16 if LANES == 8 else 8
    assert not torch.equal(kernels.get().torch_row_sums(x, other), x.sum(-1))


@needs_kernel
@pytest.mark.parametrize("cls,eps", [(LlamaRMSNorm, 1e-5), (LlamaRMSNorm, 1e-6), (Qwen3RMSNorm, 1e-6)])
@pytest.mark.parametrize("n", [8, 24, 64, 128, 200, 576, 960, 2048])
@pytest.mark.parametrize("shape", [(16, 1), (3, 41), (700,)])
def test_fused_norm_equals_the_eager_module_bit_for_bit(cls, eps, n, shape):
    norm = cls(n, eps).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(_wide((n,), n + 1).clamp(-30, 30))
    fused = FusedRMSNorm.from_norm(norm)
    assert fused is not None
    x = _wide((*shape, n), n + len(shape)).to(torch.bfloat16)
    x[..., 0, :1] = 0  # a zero and extremes in some rows
    with torch.no_grad():
        assert torch.equal(fused(x), norm(x))
        assert torch.equal(fused(torch.zeros(2, n, dtype=torch.bfloat16)), norm(torch.zeros(2, n, dtype=torch.bfloat16)))


@needs_kernel
def test_fused_norm_leaves_other_inputs_to_the_eager_forward_and_follows_weight_writes():
    norm = LlamaRMSNorm(64).to(torch.bfloat16)
    fused = FusedRMSNorm.from_norm(norm)
    x = _wide((5, 64), 3).to(torch.bfloat16)
    strided = _wide((5, 128), 4).to(torch.bfloat16)[:, ::2]
    with torch.no_grad():
        assert torch.equal(fused(strided), norm(strided))
        assert torch.equal(fused(x.float()), norm(x.float()))  # fp32 input: the eager forward
        norm.weight.mul_(-3)
        assert torch.equal(fused(x), norm(x))
    xg = x.clone().requires_grad_(True)
    fused(xg).float().sum().backward()
    assert xg.grad is not None
    assert fused(x[:0]).shape == (0, 64)


def test_norms_of_another_formula_or_dtype_are_not_replaced():
    class GemmaLikeRMSNorm(nn.Module):  # not in NORM_CLASSES
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(64, dtype=torch.bfloat16))
            self.variance_epsilon = 1e-6

    assert FusedRMSNorm.from_norm(GemmaLikeRMSNorm()) is None
    assert FusedRMSNorm.from_norm(LlamaRMSNorm(64)) is None  # fp32 weight


@needs_kernel
def test_a_listed_class_whose_output_differs_is_left_alone():
    class LlamaRMSNorm(nn.Module):  # the listed name, Gemma's formula: the probe at replacement sees it
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(64, dtype=torch.bfloat16))
            self.variance_epsilon = 1e-6

        def forward(self, x):
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
            return (h * (1.0 + self.weight.float())).to(x.dtype)

    model = nn.Sequential(LlamaRMSNorm())
    assert FusedRMSNorm.from_norm(model[0]) is None and fuse_rms_norms(model) == 0


@needs_kernel
@pytest.mark.parametrize("kind", ["llama", "qwen3_moe"])
@pytest.mark.parametrize("quantized", [False, True])
def test_executors_with_fused_norms_equal_eager_ones_and_follow_a_sync(kind, quantized):
    learner = tiny_causal_lm(kind, dtype=torch.bfloat16)
    qcfg = QuantConfig() if quantized else BF16_EXECUTOR
    ea, eb = make_executor(learner, qcfg), make_executor(learner, qcfg, fuse_norms=False)
    fused = [n for n, m in ea.named_modules() if isinstance(m, FusedRMSNorm)]
    assert "model.norm" in fused and any(".input_layernorm" in n for n in fused)
    assert not any(isinstance(m, FusedRMSNorm) for m in eb.modules())
    assert list(ea.state_dict()) == list(eb.state_dict())
    ids = torch.randint(0, 128, (3, 9))
    with torch.no_grad():
        assert torch.equal(ea(input_ids=ids).logits, eb(input_ids=ids).logits)
        perturb_and_sync(learner, ea, eb)
        la = ea(input_ids=ids).logits
        assert torch.equal(la, eb(input_ids=ids).logits)
        assert torch.equal(copy.deepcopy(ea)(input_ids=ids).logits, la)


@needs_kernel
def test_calls_with_nan_outputs_are_the_eager_modules_bits_too():
    # torch's vectorized ops write other NaN bit patterns than the kernel: such calls are recomputed eagerly
    norm = LlamaRMSNorm(64).to(torch.bfloat16)
    fused = FusedRMSNorm.from_norm(norm)
    x = _wide((6, 64), 5).to(torch.bfloat16)
    x[1, 3] = float("nan")
    x[2, 7] = float("inf")
    x[3, 0] = float("-inf")
    with torch.no_grad():
        got, ref = fused(x), norm(x)
    assert torch.equal(got.view(torch.int16), ref.view(torch.int16))


def test_rows_too_long_for_one_threads_sum_are_not_fused():
    from interq.kernels.rms_norm import MAX_WIDTH

    assert FusedRMSNorm.from_norm(LlamaRMSNorm(MAX_WIDTH).to(torch.bfloat16)) is None
