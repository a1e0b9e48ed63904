"""The executors' RMSNorms in one compiled pass per row, with the bits of transformers' eager modules.

transformers' Llama / Qwen / Mistral ``RMSNorm`` runs eight eager ops per call (``to(float32)``, ``pow``, ``mean``,
``add``, ``rsqrt``, ``mul``, ``to(bf16)``, then the weight's ``mul``): a SmolLM2-135M decode step calls 61 of them,
about 8% of a multi-turn rollout on a 2-core Xeon (``results/benchmarks/xeon-amx/2026-12-03-amx-bf16-fused-norms/``). :class:`FusedRMSNorm` replaces
such a module in an executor (:func:`interq.quant.make_executor`, ``fuse_norms``) and computes the same values bit
for bit with ``rms_norm_bf16`` of :mod:`interq.kernels`: every step is one IEEE operation per element, and the
row's sum of squares is added in torch's own order (its CPU sum kernel: vectors of 8 floats in four running
accumulators, the cascade it uses for long rows, the scalar tail, then the lanes; ``torch_row_sums`` reproduces it
for every row length, tested).

Nothing is assumed: the width of torch's vectors is found once per process by comparing ``torch_row_sums`` with
``Tensor.sum`` on rows built so that any other order shows (:func:`sum_lanes`), and each module is replaced only if the
kernel gives that module's own output on a probe (a module of another formula, such as Gemma's ``1 + weight``, is
left alone even if its class name matched). The eager forward runs for anything else: not bf16, not CPU, not
contiguous, autograd, the kernels not loaded, rows of ``MAX_WIDTH`` or more (torch splits one long row's sum over
its threads), and any call whose output holds a NaN (torch's vectorized ops write other NaN bit patterns than the
kernel: such a call is computed again eagerly, so even its NaNs are the module's).
"""

from __future__ import annotations

import torch
from torch import nn

# transformers' RMSNorm classes whose forward is h = x.float(); h * rsqrt(mean(h^2) + eps); weight * h.to(dtype)
NORM_CLASSES = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Qwen3MoeRMSNorm", "MistralRMSNorm", "Qwen2MoeRMSNorm")
_LANES: dict[str, int | None] = {}
MAX_WIDTH = 32768  # torch's reduction grain: a single row this long may be summed over several threads


def _kernels():
    from interq import kernels

    return kernels.get()


def sum_lanes() -> int | None:
    """The width of torch's float vectors in its CPU sum here (8 or 16), found once per process on rows whose sum
    depends on the order (wide magnitudes; lengths from 1 to 5,000, so that the scalar path, the tails and the cascade
    all show); None where the kernels are not loaded or neither width reproduces ``Tensor.sum``."""
    from interq import kernels

    mod = kernels.load()  # built once per machine (scripts/setup.sh does it ahead)
    if mod is None:
        return None
    if "value" not in _LANES:
        g = torch.Generator().manual_seed(0)
        rows = []
        for n in (3, 8, 13, 40, 67, 576, 1000, 4100):
            rows.append(torch.randn(8, n, generator=g) * torch.exp(3 * torch.randn(8, n, generator=g)))
        _LANES["value"] = next((lanes for lanes in (8, 16)
                                if all(torch.equal(mod.torch_row_sums(x, lanes), x.sum(-1)) for x in rows)), None)
    return _LANES["value"]


def kernel_takes(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``rms_norm_bf16`` takes this call: contiguous, non-empty bf16 CPU rows, a bf16 CPU weight, no
    autograd (else the eager module's forward)."""
    return (x.dtype == torch.bfloat16 and x.device.type == "cpu" and x.is_contiguous() and x.numel() > 0
            and weight.dtype == torch.bfloat16 and weight.device.type == "cpu"
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)))


class FusedRMSNorm(nn.Module):
    """An RMSNorm of the :data:`NORM_CLASSES` computed by one kernel call for bf16 CPU inputs (the same bits as the
    module it replaces; see the module docstring). Build with :meth:`from_norm`."""

    def __init__(self, norm: nn.Module, lanes: int):
        super().__init__()
        self.weight = norm.weight  # the same Parameter: weight sync writes into it
        self.variance_epsilon = norm.variance_epsilon
        self.lanes = lanes
        self._eager = type(norm).forward  # the replaced class's forward, for every input the kernel does not take

    @classmethod
    def from_norm(cls, norm: nn.Module) -> FusedRMSNorm | None:
        """The fused module, or None: not one of :data:`NORM_CLASSES`, not a bf16 CPU weight, the kernels not here,
        or the kernel's output differs from the module's own on a probe."""
        w = getattr(norm, "weight", None)
        if (type(norm).__name__ not in NORM_CLASSES or not isinstance(w, torch.Tensor) or w.dim() != 1
                or w.shape[0] >= MAX_WIDTH
                or w.dtype != torch.bfloat16 or w.device.type != "cpu" or not hasattr(norm, "variance_epsilon")):
            return None
        lanes = sum_lanes()
        if lanes is None:
            return None
        fused = cls(norm, lanes)
        g = torch.Generator().manual_seed(w.shape[0])
        x = (torch.randn(33, w.shape[0], generator=g) * torch.exp(torch.randn(33, w.shape[0], generator=g)))
        x = x.to(torch.bfloat16)
        with torch.no_grad():
            same = torch.equal(fused._kernel(x), norm(x))
        return fused if same else None

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        out, nan = _kernels().rms_norm_bf16(x, self.weight, float(self.variance_epsilon), self.lanes)
        return self._eager(self, x) if nan else out

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states
        if _kernels() is None or not kernel_takes(x, self.weight):
            return self._eager(self, x)
        return self._kernel(x)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}, one kernel call (torch's sum order, {self.lanes} lanes)"


def fuse_rms_norms(model: nn.Module) -> int:
    """Replace every RMSNorm of :data:`NORM_CLASSES` in ``model`` by a :class:`FusedRMSNorm` where
    :meth:`FusedRMSNorm.from_norm` allows; returns how many were replaced."""
    from interq import kernels

    return kernels.replace_modules(model, lambda m: FusedRMSNorm.from_norm(m) if type(m).__name__ in NORM_CLASSES
                                   else None)
