"""The rollout engine: batched multi-turn generation with a persistent KV cache and exact behavior log-probs.

Usage (token ids in, token ids out; the chat format turns text into the chunks)::

    from interq.rollout import RolloutEngine, SamplingParams, MinimalChatFormat
    fmt = MinimalChatFormat(tokenizer)                        # or HFChatFormat(tokenizer) for SmolLM2
    engine = RolloutEngine(model, pad_token_id=fmt.pad_token_id, max_context_tokens=1024)
    # W8A8-KV8: RolloutEngine(make_executor(model, qcfg), cache_factory=lambda c: make_kv_cache(qcfg, c))
    sampling = SamplingParams(temperature=1.0, max_action_tokens=32, stop_token_ids=fmt.stop_token_ids)
    batch = engine.new_batch(seeds=[0, 1], sampling=sampling)
    chats = [fmt.start() for _ in range(2)]
    obs = {i: chats[i].observation(first_obs_text[i]) for i in range(2)}
    while obs:
        out = batch.step(obs)                                # {episode: TurnResult}
        obs = {}
        for i, r in out.items():
            text = chats[i].action(r.action_ids)             # decoded action text, stop token removed
            if r.truncated: continue                         # context limit: episode already left the batch
            result = envs[i].step(text)
            if result.terminated or result.truncated: batch.finish(i)
            else: obs[i] = chats[i].observation(result.observation.text)
    trajectories = [batch.trajectory(i) for i in range(2)]
    inputs = collate_trajectories(trajectories, pad_token_id=fmt.pad_token_id)
    proximal = sequence_logprobs(learner, inputs["input_ids"], inputs["attention_mask"], temperature=1.0)

See :mod:`interq.rollout.trajectory` for the record's fields and alignment.
"""

from interq.rollout.chat import MINIMAL_SPECIAL_TOKENS, HFChatFormat, MinimalChatFormat
from interq.rollout.engine import EpisodeBatch, RolloutEngine, TurnResult, dynamic_cache_factory, forward_step
from interq.rollout.sampling import SamplingParams, sample_tokens, transformed_logprobs
from interq.rollout.trajectory import STOP_REASONS, Trajectory, TurnSpan, collate_trajectories, sequence_logprobs

__all__ = [
    "HFChatFormat",
    "MINIMAL_SPECIAL_TOKENS",
    "MinimalChatFormat",
    "EpisodeBatch",
    "RolloutEngine",
    "SamplingParams",
    "STOP_REASONS",
    "Trajectory",
    "TurnResult",
    "TurnSpan",
    "collate_trajectories",
    "dynamic_cache_factory",
    "forward_step",
    "sample_tokens",
    "sequence_logprobs",
    "transformed_logprobs",
]
