"""KV caches that append in place: a layer's keys and values are prefix views of a buffer with spare columns.

transformers' ``DynamicLayer`` appends a token by ``torch.cat`` of the whole cache with it, so a decode step
copies every cached K and V of every layer once more: O(cached tokens) per step on top of attention's own read.
In a rollout's long multi-turn contexts that copy costs about 40% of the attention that reads the cache (SmolLM2,
16 rows, 1 thread, K and V: 41 ms per decode step at 1,024 cached tokens, 79 ms at 2,048).
Here the new columns are written into spare capacity and the cache is the view ``buffer[:, :, :length]``; the
buffer grows by a quarter (at least :data:`MIN_SPARE` columns) when full, so a sequence of T appends copies O(T)
columns in all. It is the executor's cache primitive: the rollout's default cache and the 8-bit cache
(:mod:`interq.quant.kv_cache`) both append through it.

The values are the same tensors' values: attention reads the same numbers through a view with a longer row
stride, and torch's CPU flash kernel gives the same bits on it (tested, ``tests/test_rollout_kv_buffer.py``).
Anything that replaces the cache tensors (row selection, column compaction, ``crop``'s slice) leaves either a
prefix view of the same buffer, which keeps appending in place, or a new tensor, which the next append moves into
a new buffer. (A view handed out before a ``crop`` sees the columns written after it: nothing in interq keeps one.)
Tensors that need gradients are appended by ``torch.cat`` as before (an in-place write into a buffer would break
autograd).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

MIN_SPARE = 64  # columns added at least when a buffer grows


def _capacity(needed: int) -> int:
    return needed + max(MIN_SPARE, needed // 4)


def append_columns(cur: torch.Tensor | None, new: torch.Tensor, buffers: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """``torch.cat([cur, new], dim=-2)`` as a prefix view of ``buffers[name]`` (written in place when ``cur`` is
    a prefix view of that buffer with room for ``new``; else a new buffer with spare columns). cur [..., T, D] or
    None / empty, new [..., n, D] -> [..., T + n, D], the same values as the concatenation."""
    empty = cur is None or cur.numel() == 0
    if new.requires_grad or (cur is not None and cur.requires_grad):
        return new.clone() if cur is None else torch.cat([cur, new], dim=-2)
    length = 0 if empty else cur.shape[-2]
    end = length + new.shape[-2]
    buf = buffers.get(name)
    in_place = (not empty and buf is not None and cur.data_ptr() == buf.data_ptr() and cur.stride() == buf.stride()
                and cur.shape[:-2] == buf.shape[:-2] and cur.shape[-1] == buf.shape[-1] and end <= buf.shape[-2]
                and new.dtype == buf.dtype and new.device == buf.device
                and (torch.is_inference_mode_enabled() or not buf.is_inference()))
    if not in_place:
        shape = (*new.shape[:-2], _capacity(end), new.shape[-1])
        buf = torch.empty(shape, dtype=new.dtype, device=new.device)
        if length:
            buf.narrow(-2, 0, length).copy_(cur)
        buffers[name] = buf
    # narrow, not buf[..., a:b, :]: the same views, without Python indexing's extra cost (3.7 vs 4.2 us a view,
    # results/benchmarks/xeon-amx/2026-12-03-lean-layers/op_cost_micro.log)
    buf.narrow(-2, length, end - length).copy_(new)
    return buf.narrow(-2, 0, end)


class GrowingLayer(DynamicLayer):
    """``DynamicLayer`` whose ``update`` appends in place (:func:`append_columns`): the same keys and values."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.buffers: dict[str, torch.Tensor] = {}  # a dict, not tensor attributes: row/column edits leave it alone

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys = append_columns(self.keys, key_states, self.buffers, "keys")  # [B, H, T, D]
        self.values = append_columns(self.values, value_states, self.buffers, "values")
        return self.keys, self.values

    def reset(self) -> None:
        self.buffers = {}
        super().reset()


def growing_dynamic_cache(model_config: Any = None) -> Cache:
    """A ``DynamicCache`` (for ``model_config``, or lazily built without one) whose full-attention layers are
    :class:`GrowingLayer`; other layer types (sliding windows) stay transformers' own."""
    if model_config is None:
        cache = DynamicCache()
        cache.layer_class_to_replicate = GrowingLayer
        return cache
    cache = DynamicCache(config=model_config)
    cache.layers = [GrowingLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
