"""An 8-bit KV cache on transformers' cache API (docs/executor.md, "Formats").

Each token's K (after RoPE, and after ``k_norm`` where the model has one) and V are quantized exactly
once, when ``update`` writes them (prefill and every decode step); attention reads them dequantized to the
compute dtype. What the cache holds is its ``storage`` (the values read are the same bit for bit in all three):

* ``"dequantized"`` (the default): each token is quantized and dequantized once, when written, and only the
  dequantized values are kept, in the compute dtype (what attention reads). The fewest ops per decode step
  (a fake quantization of K and V, then the append a bf16 cache does), the memory of a bf16 cache.
* ``"codes"``: the int8 / fp8 codes and scales, the whole cache dequantized on every read (the memory of a
  quantized-KV engine; every read costs O(cached tokens)).
* ``"codes+dequantized"`` (``keep_dequantized=True``): both; the codes for inspection, the copy for reads.

``nbytes`` counts the codes and scales in every storage (what a quantized-KV engine holds: the cache's memory
figures compare to vLLM's), ``resident_nbytes`` what this object holds.
Prefill attention therefore also reads the quantized K/V of the new tokens (one behaviour, chosen and
documented: it is what a dequantizing FlashInfer/Triton backend does once the tokens are in the paged cache,
and what the aligned learner forward mirrors). K and V of a token are quantized by one call over both (the
same codes and scales as two calls).

With ``QuantConfig.kv_bits`` < 8 the int8 per-token-head codes are narrower (scale amax/(2**(kv_bits-1) - 1))
but still stored one per int8 byte, not packed: ``kv_bytes_per_token`` reports the int8 storage.

The cache supports the row operations of ``DynamicCache`` (``batch_select_indices``, ``reorder_cache``,
``batch_repeat_interleave``, ``crop``, ``reset``), so a rollout engine can drop finished sessions.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from interq.quant import primitives as P
from interq.quant.config import QuantConfig
from interq.quant.kv_buffer import append_columns, growing_dynamic_cache


class QuantKVLayer(DynamicLayer):
    """One layer: codes in ``self.keys`` / ``self.values`` ([B, H, T, D], int8 or e4m3), fp32 scales in
    ``self.key_scales`` / ``self.value_scales`` ([B, H, T, 1], or [] for ``fp8_tensor``).

    ``storage`` (module docstring): ``"codes"`` as above; ``"codes+dequantized"`` also keeps the dequantized K/V
    in the compute dtype (``self.keys_dequantized`` / ``self.values_dequantized``, [B, H, T, D]), each token
    dequantized once, when written, and appended, and a read returns them; ``"dequantized"`` keeps only those,
    as ``self.keys`` / ``self.values`` (no codes, no scales). The same values bit for bit (dequantization is
    element-wise). ``keep_dequantized=True`` is ``storage="codes+dequantized"``."""

    def __init__(self, qcfg: QuantConfig, keep_dequantized: bool = False, storage: str | None = None, **kwargs):
        super().__init__(**kwargs)
        if not qcfg.quantizes_kv:
            raise ValueError("QuantKVLayer needs QuantConfig.kv_format != 'none'")
        storage = _storage(keep_dequantized, storage)
        self.qcfg = qcfg
        self.storage = storage
        self.per_token = qcfg.kv_format != "fp8_tensor"
        self.codes = storage != "dequantized"  # self.keys / self.values hold codes (else dequantized values)
        self.keep_dequantized = storage == "codes+dequantized"
        self.key_scales: torch.Tensor | None = None
        self.value_scales: torch.Tensor | None = None
        self.keys_dequantized: torch.Tensor | None = None
        self.values_dequantized: torch.Tensor | None = None
        self.compute_dtype: torch.dtype | None = None
        self.buffers: dict[str, torch.Tensor] = {}  # spare capacity behind the tensors above (kv_buffer)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.compute_dtype = key_states.dtype
        b, h, _, d = key_states.shape
        hv, dv = value_states.shape[1], value_states.shape[-1]
        if not self.codes:
            self.keys = torch.empty(b, h, 0, d, dtype=key_states.dtype, device=self.device)
            self.values = torch.empty(b, hv, 0, dv, dtype=value_states.dtype, device=self.device)
            self.is_initialized = True
            return
        code = torch.int8 if self.qcfg.kv_format == "int8_per_token_head" else torch.float8_e4m3fn
        self.keys = torch.empty(b, h, 0, d, dtype=code, device=self.device)
        self.values = torch.empty(b, hv, 0, dv, dtype=code, device=self.device)
        if self.per_token:
            self.key_scales = torch.empty(b, h, 0, 1, dtype=torch.float32, device=self.device)
            self.value_scales = torch.empty(b, hv, 0, 1, dtype=torch.float32, device=self.device)
        if self.keep_dequantized:
            self.keys_dequantized = torch.empty(b, h, 0, d, dtype=key_states.dtype, device=self.device)
            self.values_dequantized = torch.empty(b, hv, 0, dv, dtype=value_states.dtype, device=self.device)
        self.is_initialized = True

    @staticmethod
    def _quantize_pair(key_states: torch.Tensor, value_states: torch.Tensor, qcfg: QuantConfig):
        """(kq, ks, vq, vs): K and V quantized by ``quant_kv``; when they have the same shape and dtype, as one
        tensor [B, 2H, T, D] (per-token-head and per-layer scales act row by row or element by element, so the
        codes and scales are those of two separate calls, with half the ops)."""
        if key_states.shape != value_states.shape or key_states.dtype != value_states.dtype:
            return (*P.quant_kv(key_states, qcfg), *P.quant_kv(value_states, qcfg))
        h = key_states.shape[1]
        q, s = P.quant_kv(torch.cat([key_states, value_states], dim=1), qcfg)  # [B, 2H, T, D], [B, 2H, T, 1] | []
        if s.dim() == 0:
            return q[:, :h], s, q[:, h:], s
        return q[:, :h], s[:, :h], q[:, h:], s[:, h:]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write key/value states [B, H, T_new, D] (quantized once, here); return the dequantized cache."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        put = self._append
        if not self.codes:  # only the dequantized values are kept
            # dequant(quant(.)) in the compute dtype [B, H, T, D]
            self.keys = put("keys", P.fake_quant_kv(key_states, self.qcfg))
            self.values = put("values", P.fake_quant_kv(value_states, self.qcfg))
            return self.keys, self.values
        kq, ks, vq, vs = self._quantize_pair(key_states, value_states, self.qcfg)  # [B, H, T_new, D], [.., 1] | []
        self.keys = put("keys", kq)  # [B, H, T, D]
        self.values = put("values", vq)
        if self.per_token:
            self.key_scales = put("key_scales", ks)  # [B, H, T, 1]
            self.value_scales = put("value_scales", vs)
        else:
            self.key_scales, self.value_scales = ks, vs
        kdt, vdt = key_states.dtype, value_states.dtype
        if self.keep_dequantized:  # only the new tokens are dequantized
            self.keys_dequantized = put("keys_dequantized", P.dequant_kv(kq, ks, kdt))
            self.values_dequantized = put("values_dequantized", P.dequant_kv(vq, vs, vdt))
            return self.keys_dequantized, self.values_dequantized
        return P.dequant_kv(self.keys, self.key_scales, kdt), P.dequant_kv(self.values, self.value_scales, vdt)

    def _append(self, name: str, new: torch.Tensor) -> torch.Tensor:
        """The attribute ``name`` with ``new`` appended along dim -2, in place in spare capacity (``kv_buffer``)."""
        return append_columns(getattr(self, name), new, self.buffers, name)

    def reset(self) -> None:
        self.buffers = {}
        self.key_scales = self.value_scales = None
        self.keys_dequantized = self.values_dequantized = None
        super().reset()

    def _rows(self, fn) -> None:
        if self.get_seq_length() > 0:
            self.keys, self.values = fn(self.keys), fn(self.values)
            if self.per_token and self.codes:
                self.key_scales, self.value_scales = fn(self.key_scales), fn(self.value_scales)
            if self.keep_dequantized:
                self.keys_dequantized, self.values_dequantized = fn(self.keys_dequantized), fn(self.values_dequantized)

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(f"crop({tokens_to_remove}): pass a negative number of tokens to remove, as DynamicCache")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        n = abs(tokens_to_remove)
        self.keys, self.values = self.keys[..., :-n, :], self.values[..., :-n, :]
        if self.per_token and self.codes:
            self.key_scales, self.value_scales = self.key_scales[..., :-n, :], self.value_scales[..., :-n, :]
        if self.keep_dequantized:
            self.keys_dequantized = self.keys_dequantized[..., :-n, :]
            self.values_dequantized = self.values_dequantized[..., :-n, :]

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._rows(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._rows(lambda t: t[indices, ...])

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._rows(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def offload(self):
        raise NotImplementedError("QuantKVLayer does not support offloading")

    def nbytes(self) -> int:
        """Bytes of the quantized cache: one byte per code plus the fp32 scales (what a quantized-KV engine holds),
        whatever the ``storage``."""
        if not self.is_initialized:
            return 0
        n = self.keys.numel() + self.values.numel()  # int8 / e4m3 codes: one byte each
        if self.per_token:  # one fp32 scale per token and head
            n += 4 * (self.keys.numel() // max(self.keys.shape[-1], 1) + self.values.numel() // max(self.values.shape[-1], 1))
        else:
            n += 8  # two fp32 scalars per layer
        return n

    def resident_nbytes(self) -> int:
        """Bytes this layer holds: the codes and scales (:meth:`nbytes`) and/or the dequantized values."""
        if not self.is_initialized:
            return 0
        if not self.codes:
            return sum(t.numel() * t.element_size() for t in (self.keys, self.values))
        n = self.nbytes()
        if self.keep_dequantized:
            for t in (self.keys_dequantized, self.values_dequantized):
                n += t.numel() * t.element_size()
        return n


STORAGES = ("dequantized", "codes", "codes+dequantized")


def _storage(keep_dequantized: bool, storage: str | None) -> str:
    if storage is None:
        return "codes+dequantized" if keep_dequantized else "dequantized"
    if storage not in STORAGES:
        raise ValueError(f"KV cache storage must be one of {list(STORAGES)}, got {storage!r}")
    if keep_dequantized and storage != "codes+dequantized":
        raise ValueError(f"keep_dequantized=True is storage='codes+dequantized', not {storage!r}")
    return storage


class QuantKVCache(Cache):
    """A transformers ``Cache`` of ``QuantKVLayer`` (one per decoder layer); ``keep_dequantized`` and ``storage``
    as there."""

    def __init__(self, qcfg: QuantConfig, num_layers: int, keep_dequantized: bool = False, storage: str | None = None):
        storage = _storage(keep_dequantized, storage)
        super().__init__(layers=[QuantKVLayer(qcfg, storage=storage) for _ in range(num_layers)])
        self.qcfg = qcfg
        self.storage = storage
        self.keep_dequantized = storage == "codes+dequantized"

    def bytes_per_token(self) -> float:
        return kv_bytes_per_token(self)


def _layer_nbytes(layer) -> int:
    if hasattr(layer, "nbytes") and callable(layer.nbytes):
        return layer.nbytes()
    if not getattr(layer, "is_initialized", False) or layer.keys is None:
        return 0
    return layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()


def kv_bytes_per_token(cache: Cache) -> float:
    """KV bytes stored per token of one sequence, summed over layers (codes + scales); works for a
    ``QuantKVCache`` and a plain ``DynamicCache`` (bf16: 2 bytes x 2 x H x D per layer)."""
    total, tokens = 0, 0
    for layer in cache.layers:
        total += _layer_nbytes(layer)
        if getattr(layer, "is_initialized", False) and layer.keys is not None and layer.keys.numel() and not tokens:
            tokens = layer.keys.shape[0] * layer.keys.shape[-2]  # batch x seq
    if tokens == 0:
        raise ValueError("kv_bytes_per_token: the cache holds no tokens yet")
    return total / tokens


def make_kv_cache(qcfg: QuantConfig, model_config, keep_dequantized: bool = False, storage: str | None = None) -> Cache:
    """A fresh cache for one batch of sequences: ``QuantKVCache`` for an 8-bit ``kv_format``, a ``DynamicCache``
    of in-place appending layers for ``kv_format='none'`` (:func:`interq.quant.kv_buffer.growing_dynamic_cache`).
    Pass it as ``past_key_values`` / ``cache``.
    ``storage`` (default ``"dequantized"``; ``keep_dequantized=True`` is ``"codes+dequantized"``): what the cache
    holds, speed against memory, the same values read (module docstring)."""
    if not isinstance(qcfg, QuantConfig):
        raise TypeError(f"make_kv_cache: qcfg must be a QuantConfig, got {type(qcfg).__name__}")
    if not qcfg.quantizes_kv:
        return growing_dynamic_cache(model_config)
    text = model_config.get_text_config(decoder=True) if hasattr(model_config, "get_text_config") else model_config
    layer_types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    bad = sorted({t for t in layer_types if t != "full_attention"})
    if bad:
        raise NotImplementedError(f"make_kv_cache: layer types {bad} are not supported by the 8-bit KV cache "
                                  "(accepted: 'full_attention')")
    return QuantKVCache(qcfg, len(layer_types), keep_dequantized, storage)
