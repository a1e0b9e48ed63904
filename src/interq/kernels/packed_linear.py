"""The executors' bf16 linear layers with their weights packed once for oneDNN (CPU): the same bits, less work.

On a CPU where torch's bf16 GEMMs are oneDNN's (native bf16: AVX512_BF16 or AMX), every ``F.linear`` call
reorders the whole weight into oneDNN's blocked layout before multiplying; at decode sizes that is a large share of
the call. On an Intel Xeon with AMX (``results/benchmarks/xeon-amx/2026-12-03-amx-int8-gemm/``, one thread) SmolLM2-135M's ``lm_head`` took
13.2 ms per call at 1 row and 9.5 ms with its weight packed once (1.35-1.71x at 1-256 rows), and
``benchmarks/bench_quant.py`` measured the bf16 executor 1.10x faster at batch 16 and 1.26x at batch 1 with its
linears packed (side by side); a decoder layer's small linears alone gained 0.94-1.35x. The bf16 executor's every
linear and the int8 executor's ``lm_head`` paid the reorder at each decode step: the bf16 arm ran slower than the CPU
allows, which flattered the int8 executor's speed-up over it.

:class:`PackedBf16Linear` replaces such an ``nn.Linear`` in an executor (:func:`interq.quant.make_executor`,
``pack_bf16``). It keeps the module's ``weight`` and ``bias`` parameters (the same tensors: tied embeddings stay
tied, weight sync copies into them). Up to ``PACKED_MAX_M`` rows it multiplies by one of two products where that
product gives ``F.linear``'s bits (below), and by ``F.linear`` otherwise; above (prefill: at 656 rows oneDNN's
packed product was 1.08x faster per decoder layer, at 2,048 0.90x, ``results/benchmarks/xeon-amx/2026-12-03-packed-bf16-multiturn/
packed_prefill_speed.log``) and for anything else (not bf16, not CPU, not contiguous, autograd) it calls ``F.linear``.

- **interq's AMX-BF16 kernel** (``bf16_linear_amx`` in :mod:`interq.kernels`; CPUs with AMX-BF16, where the
  kernels build): the weight in AMX tile layout (:func:`pack_bf16_amx`), fp32 tile accumulators over k in chunks
  of 32, in K blocks of a chosen size, rounded once to bf16. oneDNN's AMX kernels sum in this order, splitting K
  into blocks by the shape and the row count (288 of SmolLM2's 576, 384 of its 1,536, from 64 rows up at two
  threads), so a K blocking that reproduces ``F.linear``'s bits exists for most cases. At decode sizes it is 2.3-5x
  oneDNN's packed product per call, whose fixed cost dominates small GEMMs (SmolLM2-135M's linears at 16 rows,
  2 threads: 17.7 -> 8.0 ms per step, ``results/benchmarks/xeon-amx/2026-12-03-amx-bf16-fused-norms/``). :func:`use_amx_product` turns it off.
- **interq's AVX2 product** (``bf16_linear_avx2`` in :mod:`interq.kernels`; CPUs without native bf16, where
  the kernels build with AVX2 and FMA): there torch multiplies bf16 by its own reference kernel, one dot product per
  output with fp32 arithmetic in a fixed order (8 accumulators of 8 lanes over blocks of 64 k, a fixed tree, the tail
  after it). The kernel computes the same sums for 16 columns at once from the weight packed in the order it reads
  k (:func:`pack_bf16_avx2`), at any row count: SmolLM2-135M's ``lm_head`` at 16 rows, 2 threads, on an AMD EPYC
  (Zen 3, AVX2) took 11 ms against 55 ms for ``F.linear``, its layers' linears 3.8-5.6x less
  (``results/benchmarks/zen3-avx2/2026-12-03-avx2-int8-bf16/``). Where it is offered oneDNN's product is not (oneDNN does not run torch's bf16
  GEMMs there).
- **oneDNN's packed product**: the weight packed with ``torch.ops.mkldnn._reorder_linear_weight`` for 16 rows,
  multiplied by ``torch.ops.mkldnn._linear_pointwise``. Without the pack, every ``F.linear`` call reorders the whole
  weight into oneDNN's blocked layout: on an Intel Xeon with AMX (``results/benchmarks/xeon-amx/2026-12-03-amx-int8-gemm/``, one thread)
  SmolLM2-135M's ``lm_head`` took 13.2 ms per call at 1 row and 9.5 ms packed.

Both copies are made on first use and again after any write to the weight (tracked by the tensor's version counter).

**Same bits.** Whether a product equals ``F.linear``'s depends on the shape, the row count and the thread count:
oneDNN picks its kernel and its split of the work from them, and ``F.linear``'s plain-weight path does not always
pick as the packed one does. On the Xeon with AMX (``results/benchmarks/xeon-amx/2026-12-03-packed-bf16-multiturn/packed_rows_grid.log``, every row
count 1-1,100 of seven shapes, with and without bias) one thread matched everywhere, while two threads differed from
289-513 rows on in most shapes, and at 96 rows for 576 x 192. So no product is ever assumed equal: the first call of
a (in, out, bias, rows, threads) case in the process compares the products with ``F.linear``'s on a probe built so
that any other summation order shows in the bf16 outputs (random products around two cancelling terms of +-2^22:
on random inputs alone two orders differed in only one output in thousands, and a check passed where the products
differed): the AMX kernel with each K blocking in turn (the one that last matched for the shape first), then
oneDNN's packed product; every later call of that case, in any module of that shape, takes the first that matched,
``F.linear`` where none did (:func:`product_choice`; a few ms per case for SmolLM2's layers, up to 0.2 s for its
``lm_head``). A oneDNN pack for 1 row instead of 16 makes oneDNN pick other kernels still (other sums from 33 rows
on), hence the pack for 16. :func:`packing_available` says where packing is not offered at all,
:func:`amx_available` where the AMX kernel is not.
"""

from __future__ import annotations

import torch
from torch import nn

PACKED_MAX_M = 256  # rows up to which the packed weight is used (decode); F.linear above
PACK_HINT_M = 16  # the row count oneDNN packs for (a pack for 1 row gives other sums from 33 rows on)


def packing_available(device: torch.device | str | None = None) -> tuple[bool, str]:
    """Whether bf16 weights can be packed here, and why not: a CPU device, and either torch built with oneDNN on a
    CPU with native bf16 (where torch's own bf16 GEMMs go to oneDNN, so that the packed ones can match them), or a
    CPU without native bf16 where interq's AVX2 product is available (:func:`avx2_available`)."""
    if device is not None and torch.device(device).type != "cpu":
        return False, f"not a CPU device ({device})"
    if _native_bf16():
        return True, "available"
    if avx2_available()[0]:
        return True, "available (interq's AVX2 product)"
    if not torch.backends.mkldnn.is_available():
        return False, "torch was built without oneDNN (mkldnn)"
    return False, ("this CPU has no native bf16 (torch's bf16 GEMMs do not run on oneDNN here) and interq's AVX2 "
                   f"product is not available ({avx2_available()[1]})")


def _native_bf16() -> bool:
    """torch's bf16 GEMMs run on oneDNN here (torch built with it, a CPU with native bf16)."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def avx2_available() -> tuple[bool, str]:
    """Whether interq's AVX2 bf16 product can run here, and why not: interq's CPU kernels built with AVX2 and FMA,
    on a CPU whose bf16 GEMMs are torch's reference kernel (no native bf16: elsewhere oneDNN's sums are others)."""
    from interq import kernels

    if _native_bf16():
        return False, "this CPU has native bf16: torch's bf16 GEMMs are oneDNN's"
    return kernels.offers("has_bf16_linear_avx2", "the kernels were built without AVX2 and FMA")


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_HINT_M)


def _packed_product(x2: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x2, packed, bias, "none", [], "")  # [M, N]


_CHOICES: dict[tuple, tuple[str, int]] = {}  # _choice_key -> (product, kb)
_LAST_KB: dict[tuple[int, int], int] = {}  # (in, out) -> the K blocking that last gave F.linear's bits
_AMX = {"enabled": True}
_AVX2: dict = {"enabled": True}
AVX2_PROBE_N = 256  # columns of the AVX2 product's probe: torch's reference kernel and it compute each output alone
_BIG = 2.0 ** 11  # the probe's cancelling entries: products of +-2^22, whose fp32 ulp (0.5) shows in bf16 sums


def _probe(rows: int, k: int, n: int, bias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Inputs on which two summation orders give other bf16 outputs: every output adds +2^22 (at k = 0) and -2^22
    (at k = K - 1) to random products, so whatever is summed while one of them is in the accumulator is rounded to
    0.5, and which products that is depends on the order (a bias adds at the end). A random weight of a few distinct
    rows tiled over ``n`` (the kernel does not depend on the values). -> x [rows, K], w [N, K], b [N] or None."""
    g = torch.Generator().manual_seed(1000 * k + rows)
    x = torch.randn(rows, k, generator=g)
    w = torch.randn(min(n, 64), k, generator=g).repeat(-(-n // 64), 1)[:n]
    if k >= 2:
        x[:, 0] = x[:, -1] = _BIG
        w[:, 0], w[:, -1] = _BIG, -_BIG
    b = torch.randn(n, generator=g).to(torch.bfloat16) if bias else None
    return x.to(torch.bfloat16), w.to(torch.bfloat16), b


def amx_available() -> tuple[bool, str]:
    """Whether the AMX-BF16 product can run here (interq's CPU kernels built for a CPU with AMX-BF16, on a Linux
    kernel that lets the process use the tiles), and why not."""
    from interq import kernels

    return kernels.offers("has_bf16_gemm_amx", "no AMX-BF16 here (the kernels were built without it, or the Linux "
                                               "kernel refused the tiles)")


def use_amx_product(enabled: bool) -> None:
    """Turn the AMX-BF16 product on or off for this process (on by default where :func:`amx_available`): off, the
    cases take oneDNN's packed product or ``F.linear`` as before it existed (for side-by-side timing)."""
    _AMX["enabled"] = bool(enabled)


def use_avx2_product(enabled: bool) -> None:
    """Turn interq's AVX2 bf16 product on or off for this process (on by default where :func:`avx2_available`):
    off, every case calls ``F.linear`` as before it existed (for side-by-side timing)."""
    _AVX2["enabled"] = bool(enabled)


def _avx2_on() -> bool:
    """Whether the AVX2 product is on and can run (asked once while the kernels are on; turning them off is seen)."""
    return _product_on(_AVX2, avx2_available)


def _product_on(state: dict, available) -> bool:
    """``state``'s switch and whether its product can run here: ``available()`` is asked once, while interq's kernels
    are on (an answer got while they were turned off would keep the product off after they are turned on again)."""
    from interq import kernels

    if not state["enabled"] or kernels.get() is None:
        return False
    if state.get("here") is None:
        state["here"] = available()[0]
    return state["here"]


def pack_bf16_avx2(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] bf16 -> the AVX2 product's layout [ceil(N / 16), K, 16]: per block of 16 columns, each k's 16 weights
    side by side, k in the order the kernel adds them (``bf16_avx2_k_order``; columns past N are zeros)."""
    from interq import kernels

    n, k = weight.shape
    order = kernels.get().bf16_avx2_k_order(k)
    w = nn.functional.pad(weight.detach()[:, order], (0, 0, 0, -n % 16))  # [Np, K]
    return w.view(-1, 16, k).transpose(1, 2).contiguous()


def _avx2_product(x2: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None) -> torch.Tensor:
    from interq import kernels

    return kernels.get().bf16_linear_avx2(x2, packed, n, bias)  # [M, N]


def _amx_on() -> bool:
    """Whether the AMX product is on and can run (the kernels' build is asked once; turning the kernels off is seen)."""
    return _product_on(_AMX, amx_available)


def pack_bf16_amx(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] bf16 -> the AMX-BF16 product's layout [ceil(N / 16), K / 2, 16, 2] (K a multiple of 32): per block of
    16 columns, the pairs of k of each column side by side (columns past N are zeros)."""
    n, k = weight.shape
    w = nn.functional.pad(weight.detach(), (0, 0, 0, -n % 16))  # [Np, K]
    return w.view(-1, 16, k // 2, 2).permute(0, 2, 1, 3).contiguous()


def _amx_product(x2: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None, kb: int) -> torch.Tensor:
    from interq import kernels

    return kernels.get().bf16_linear_amx(x2, packed, n, bias, kb)  # [M, N]


def _kb_candidates(k: int, n: int) -> list[int]:
    """The K blockings (chunks of 32 k per block; 0 = none) to try, the one that last matched for the shape first."""
    chunks = k // 32  # kb = 1 sums each chunk apart and adds it: the same values as kb = 0 (measured), not tried
    order = [_LAST_KB.get((k, n), 0), 0, *range(2, chunks)]
    return list(dict.fromkeys(order))


def _choice_key(k: int, n: int, bias: bool, rows: int) -> tuple:
    """:func:`product_choice`'s case: (in, out, bias, rows, threads, amx on, avx2 on); with the AVX2 product on, rows
    are 1 or 2 (one row or more) and threads 0 (any)."""
    amx, avx2 = _amx_on(), _avx2_on()
    if avx2:
        return k, n, bias, min(rows, 2), 0, amx, avx2
    return k, n, bias, rows, torch.get_num_threads(), amx, avx2


def product_choice(k: int, n: int, bias: bool, rows: int) -> tuple[str, int]:
    """Which product gives ``F.linear``'s bits for ``rows`` rows of an [n, k] bf16 weight (with a bias or not) at
    the current thread count: ``("amx", kb)`` (interq's AMX-BF16 kernel with K blocks of ``kb`` chunks of 32),
    ``("onednn", 0)`` (oneDNN's packed product) or ``("linear", 0)`` (neither: ``F.linear`` itself). Decided once
    per process on a probe built to expose any other summation order (:func:`_probe`), then remembered for every
    module of that shape. Which kernel oneDNN runs, and how it splits the sums, depends on the shapes and the
    threads, not on the values. On CPUs without native bf16: ``("avx2", 0)`` (interq's AVX2 product) or
    ``("linear", 0)``, probed on ``AVX2_PROBE_N`` columns and at most 2 rows, once for one row and once for more,
    at any thread count: there torch computes each output alone as one dot product in a fixed order, one row by its
    matrix-vector path, more by its matrix path, the threads splitting the outputs (so prefills of every length
    share one probe)."""
    key = _choice_key(k, n, bias, rows)
    rows, amx, avx2 = key[3], key[5], key[6]
    choice = _CHOICES.get(key)
    if choice is None:
        choice = ("linear", 0)
        if avx2:
            x, w, b = _probe(rows, k, min(n, AVX2_PROBE_N), bias)
            with torch.no_grad():
                if torch.equal(_avx2_product(x, pack_bf16_avx2(w), w.shape[0], b), nn.functional.linear(x, w, b)):
                    choice = ("avx2", 0)
            _CHOICES[key] = choice
            return choice
        if not _native_bf16():  # neither product can give torch's bits here
            _CHOICES[key] = choice
            return choice
        x, w, b = _probe(rows, k, n, bias)
        with torch.no_grad():
            ref = nn.functional.linear(x, w, b)
            if amx and k % 32 == 0:
                packed = pack_bf16_amx(w)
                for kb in _kb_candidates(k, n):
                    if torch.equal(_amx_product(x, packed, n, b, kb), ref):
                        choice, _LAST_KB[(k, n)] = ("amx", kb), kb
                        break
            if choice[0] == "linear" and torch.equal(_packed_product(x, _pack(w), b), ref):
                choice = ("onednn", 0)
        _CHOICES[key] = choice
    return choice


class PackedBf16Linear(nn.Module):
    """An ``nn.Linear`` with bf16 weights whose products up to ``PACKED_MAX_M`` rows use interq's AMX-BF16 kernel or
    a oneDNN-packed copy of the weight, at any row count interq's AVX2 product (CPUs without native bf16), where
    that product equals ``F.linear``'s (see the module docstring). Build
    with :meth:`from_linear`. The packed copies follow in-place writes through the weight (its version counter: a
    weight sync's ``copy_``); a write through ``weight.data`` is not seen."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # the same Parameter objects: ties and weight sync see one tensor
        self.bias = linear.bias
        self._packed: torch.Tensor | None = None  # an opaque oneDNN tensor: neither a buffer nor copied
        self._packed_version = (None, -1, 0)  # (the weight packed, its version, its data pointer): packed again after
        # an in-place write, for a new Parameter, or new data (module.to)
        self._amx: torch.Tensor | None = None  # the AMX-BF16 layout (pack_bf16_amx), made when first used
        self._amx_version = (None, -1, 0)
        self._avx2: torch.Tensor | None = None  # the AVX2 product's layout (pack_bf16_avx2), made when first used
        self._avx2_version = (None, -1, 0)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PackedBf16Linear | None:
        """The packed module, or None where packing is not offered (:func:`packing_available`), the weight is not
        bf16 or is an inference tensor (an executor built under ``torch.inference_mode``: it has no version counter
        to tell a weight sync)."""
        w = linear.weight
        if w.dtype != torch.bfloat16 or w.dim() != 2 or not packing_available(w.device)[0]:
            return None
        if w.is_inference():  # made under torch.inference_mode: no version counter, so a write could not be seen
            return None
        if linear.bias is not None and linear.bias.dtype != torch.bfloat16:
            return None
        return cls(linear)

    def __getstate__(self):  # deepcopy / pickle: the packed copy is derived (and opaque); packed again when used
        state = self.__dict__.copy()
        state["_packed"], state["_packed_version"] = None, (None, -1, 0)
        state["_amx"], state["_amx_version"] = None, (None, -1, 0)
        state["_avx2"], state["_avx2_version"] = None, (None, -1, 0)
        return state

    def _current(self, name: str, pack) -> torch.Tensor:
        """The derived copy kept under ``name``, made again by ``pack(weight)`` after an in-place write to the weight
        (a weight sync), for a new weight Parameter, or new data under it."""
        w = self.weight
        src, version, ptr = getattr(self, name + "_version")
        if getattr(self, name) is None or src is not w or version != w._version or ptr != w.data_ptr():
            setattr(self, name, pack(w))
            setattr(self, name + "_version", (w, w._version, w.data_ptr()))
        return getattr(self, name)

    def packed_weight(self) -> torch.Tensor:
        """The packed copy for oneDNN, kept current (:meth:`_current`)."""
        return self._current("_packed", _pack)

    def amx_weight(self) -> torch.Tensor:
        """The AMX-BF16 layout of the weight, kept current (:meth:`_current`)."""
        return self._current("_amx", pack_bf16_amx)

    def avx2_weight(self) -> torch.Tensor:
        """The AVX2 product's layout of the weight, kept current (:meth:`_current`)."""
        return self._current("_avx2", pack_bf16_avx2)

    def product(self, x: torch.Tensor) -> tuple[str, int, int]:
        """(product, kb, rows) for input x: ``"amx"`` / ``"onednn"`` / ``"avx2"`` with :func:`product_choice`'s K
        blocking, or ``"linear"`` where ``F.linear`` itself must run (not bf16, not CPU, too many rows for the
        oneDNN-side products, strided, autograd)."""
        m = x.numel() // self.in_features if self.in_features else 0
        # strided inputs too: F.linear takes another path for them (a batched matmul), with other sums
        if (x.dtype != torch.bfloat16 or x.device.type != "cpu" or m <= 0 or not x.is_contiguous()
                or (m > PACKED_MAX_M and not _avx2_on())
                or (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad
                                                 or (self.bias is not None and self.bias.requires_grad)))):
            return "linear", 0, m
        return (*product_choice(self.in_features, self.out_features, self.bias is not None, m), m)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        product, kb, m = self.product(x)
        if product == "linear":
            return nn.functional.linear(x, self.weight, self.bias)
        x2 = x.view(m, self.in_features)
        if product == "amx":
            y = _amx_product(x2, self.amx_weight(), self.out_features, self.bias, kb)  # [M, N]
        elif product == "avx2":
            y = _avx2_product(x2, self.avx2_weight(), self.out_features, self.bias)  # [M, N]
        else:
            y = _packed_product(x2, self.packed_weight(), self.bias)  # [M, N]
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"packed products where they give F.linear's bits")


def pack_bf16_linears(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` (exactly that class) of ``model`` with bf16 weights by a :class:`PackedBf16Linear`
    where :meth:`PackedBf16Linear.from_linear` allows; returns how many were replaced."""
    from interq import kernels

    return kernels.replace_modules(model, lambda m: PackedBf16Linear.from_linear(m) if type(m) is nn.Linear else None)
