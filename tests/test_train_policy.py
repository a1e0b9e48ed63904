"""Tiny policy: tokenizer trained on environment text, Qwen3 / Qwen3-MoE from a config, standard formats."""

import pytest
import torch

from interq.rollout.chat import MINIMAL_SPECIAL_TOKENS, MinimalChatFormat
from interq.train.config import ConfigError, ModelConfig
from interq.train.policy import build_tiny_policy, load_policy, save_policy, train_tokenizer

TEXTS = ["You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a countertop 2, a fridge 1.",
         "go to countertop 1", "take apple 1 from countertop 1", "put apple 1 in/on fridge 1",
         "On the countertop 1, you see a apple 1, and a mug 2."] * 20


def test_tokenizer_round_trips_and_carries_chat_tokens():
    tok = train_tokenizer(TEXTS, 400)
    for text in ["go to countertop 1", "a never seen word: zyxw 42 !", "put apple 1 in/on fridge 1"]:
        assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    for special in MINIMAL_SPECIAL_TOKENS:
        ids = tok(special, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, special
    assert tok.pad_token == "<|pad|>" and tok.eos_token == "<|end|>"
    MinimalChatFormat(tok)  # the engine's minimal chat format accepts it
    # the environment's words are single tokens (the point of training it on env text)
    assert len(tok(" countertop", add_special_tokens=False)["input_ids"]) == 1


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_tiny_policy_saves_and_reloads_in_standard_formats(tmp_path, arch):
    model, tok = build_tiny_policy(ModelConfig(arch=arch, vocab_size=400, hidden_size=32, intermediate_size=64,
                                               num_heads=2, num_kv_heads=1, moe_intermediate_size=32), TEXTS)
    assert type(model).__name__ == ("Qwen3ForCausalLM" if arch == "qwen3" else "Qwen3MoeForCausalLM")
    assert model.config.vocab_size == len(tok) <= 400
    save_policy(model, tok, tmp_path)
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= {p.name for p in tmp_path.iterdir()}
    m2, t2 = load_policy(tmp_path)
    ids = torch.tensor([tok("go to fridge 1", add_special_tokens=False)["input_ids"]])
    torch.testing.assert_close(model(ids).logits, m2(ids).logits, rtol=0, atol=0)
    assert t2("go to fridge 1")["input_ids"] == tok("go to fridge 1")["input_ids"]


def test_same_seed_same_weights():
    cfg = ModelConfig(vocab_size=400, hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=1)
    a, _ = build_tiny_policy(cfg, TEXTS, seed=3)
    b, _ = build_tiny_policy(cfg, TEXTS, seed=3)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)


def test_load_policy_rejects_a_directory_without_a_checkpoint(tmp_path):
    with pytest.raises(ConfigError, match="model.source"):
        load_policy(tmp_path)


def test_sft_action_nll_equals_full_logits_reference():
    from interq.train.sft import action_nll, pad_rows

    model, tok = build_tiny_policy(ModelConfig(vocab_size=400, hidden_size=32, intermediate_size=64, num_heads=2,
                                               num_kv_heads=1), TEXTS)
    rows = [([5, 6, 7, 8, 9, 10], [False, False, True, True, False, True]), ([11, 12, 13], [False, True, True])]
    ids, att, act = pad_rows(rows, tok.pad_token_id)
    nll, n = action_nll(model, ids, att, act)
    logp = torch.log_softmax(model(input_ids=ids, attention_mask=att).logits.float(), -1)  # [B, L, V]
    ref = -sum(logp[b, l - 1, ids[b, l]] for b in range(2) for l in range(1, ids.shape[1]) if act[b, l])
    assert n == 5
    torch.testing.assert_close(nll, ref, rtol=1e-5, atol=1e-5)


def test_sft_token_nll_splits_actions_and_observations_like_a_full_logits_loop():
    from interq.train.sft import pad_rows, token_nll

    model, tok = build_tiny_policy(ModelConfig(vocab_size=400, hidden_size=32, intermediate_size=64, num_heads=2,
                                               num_kv_heads=1), TEXTS)
    rows = [([5, 6, 7, 8, 9, 10], [False, False, True, True, False, True]), ([11, 12, 13], [False, True, True])]
    ids, att, act = pad_rows(rows, tok.pad_token_id)
    a, na, o, no = token_nll(model, ids, att, act)
    logp = torch.log_softmax(model(input_ids=ids, attention_mask=att).logits.float(), -1)  # [B, L, V]
    ref_a = ref_o = 0.0
    for b, (row, mask) in enumerate(rows):
        for l in range(1, len(row)):  # padding is never a target
            if mask[l]:
                ref_a = ref_a - logp[b, l - 1, row[l]]
            else:
                ref_o = ref_o - logp[b, l - 1, row[l]]
    assert (na, no) == (5, 2)  # row 0: positions 4 (obs); row 1: none; the first token is never a target
    torch.testing.assert_close(a, ref_a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(o, ref_o, rtol=1e-5, atol=1e-5)
    a0, na0, o0, no0 = token_nll(model, ids, att, act, observations=False)
    torch.testing.assert_close(a0, a, rtol=1e-5, atol=1e-5)
    assert na0 == na and float(o0) == 0.0


def test_sft_observation_weight_trains_the_observation_tokens():
    from interq.train.config import WarmStartConfig
    from interq.train.sft import pad_rows, run_sft, token_nll

    cfg = ModelConfig(vocab_size=400, hidden_size=32, intermediate_size=64, num_heads=2, num_kv_heads=1)
    results = {}
    for weight in (0.0, 1.0):
        model, tok = build_tiny_policy(cfg, TEXTS, seed=0)
        obs = tok("On the countertop 1, you see a apple 1.", add_special_tokens=False)["input_ids"]
        act = tok("take apple 1 from countertop 1", add_special_tokens=False)["input_ids"]
        rows = [(obs + act, [False] * len(obs) + [True] * len(act))] * 4
        summary = run_sft(model, rows, WarmStartConfig(steps=30, lr=1e-2, observation_weight=weight), tok.pad_token_id)
        ids, att, mask = pad_rows(rows[:1], tok.pad_token_id)
        with torch.no_grad():
            _, _, o, n = token_nll(model, ids, att, mask)
        results[weight] = float(o) / n
        assert ("sft/final_observation_loss" in summary) == (weight > 0)
    assert results[1.0] < 0.5 * results[0.0]  # only the weighted run learned the observation text


def test_chat_tokens_import_error_is_raised_not_hidden(monkeypatch):
    """The engine's chat tokens come from interq.rollout.chat: an import error there surfaces with its message
    (it used to fall back, silently, to another token set the engine does not render)."""
    import sys

    from interq.train.policy import chat_special_tokens

    assert set(MINIMAL_SPECIAL_TOKENS) <= set(chat_special_tokens())
    monkeypatch.setitem(sys.modules, "interq.rollout.chat", None)
    with pytest.raises(ImportError, match="interq.rollout.chat"):
        chat_special_tokens()
    with pytest.raises(ImportError, match="interq.rollout.chat"):
        train_tokenizer(TEXTS, 400)
