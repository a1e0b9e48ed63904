"""Typed, frozen run configuration: one dataclass per component, YAML presets, ``key.sub=value`` overrides.

Every field is defined once, here, with its default, a one-line doc and its allowed values (the field's
``metadata``: ``doc``, ``choices`` or ``bounds``, else ``allowed`` in words). That one definition feeds the
validation messages (:func:`validate`), ``interq <command> --help-config`` (:func:`config_help`) and the field
reference in docs/configuration.md (:func:`reference_markdown`; regenerate it with
``python -m interq.train.config --write-reference docs/configuration.md``). Batch sizes carry their unit in the
name (``tasks_per_step``, ``episodes_per_task``, ``tokens_per_microbatch``). :func:`validate` checks the whole
config before any work starts and raises :class:`ConfigError` naming the field, the value and what is allowed.

The five arms are presets (``src/interq/presets/<arm>.yaml``) over these defaults:

| arm | ``rollout.executor`` | ``algo.align`` | ``algo.correction`` |
|---|---|---|---|
| bf16 | bf16 | false | tis |
| q-naive | w8a8 | false | none |
| q-tis | w8a8 | false | tis |
| q-align | w8a8 | true | tis |
| q-interq | w8a8 | true | interq |
"""

from __future__ import annotations

import dataclasses
import math
import re
import textwrap
import typing
from dataclasses import dataclass, field, fields, is_dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from interq.errors import ConfigError  # re-exported (defined at the package's bottom: every layer may raise it)

CORRECTIONS = ("none", "tis", "icepop", "seq_is", "geo_mask", "prefix_is", "interq", "interq_uniform")
ADVANTAGES = ("grpo", "gigpo")
LAYOUTS = ("concatenated", "per_turn")
LOSS_AGGS = ("token_mean", "seq_mean_token_mean")
EXECUTORS = ("bf16", "fp32", "w8a8")
WEIGHT_FORMATS = ("int8", "fp8_e4m3")
KV_FORMATS = ("none", "int8_per_token_head", "fp8_per_token_head", "fp8_tensor")
LEARNER_AUTOCASTS = ("auto", "off", "bf16", "bf16_backward")
LEARNER_GEMMS = ("torch", "onednn")
LEARNER_ATTENTIONS = ("auto", "sdpa", "kernel")
ATTENTIONS = ("sdpa", "sdpa_packed")  # = interq.rollout.attention.ATTENTION_CHOICES (tested), kept here torch-free
DEVICES = ("cpu", "cuda", "auto")
ARCHS = ("qwen3", "qwen3_moe")
DTYPES = ("float32", "bfloat16")
ARMS = ("bf16", "q-naive", "q-tis", "q-align", "q-interq")
ACTION_FORMATS = ("text", "index", "auto")
PROMPTS = ("compact", "verl_agent", "auto")
ARM_BASE = "household"  # the preset the arm presets build on; ``env.name=<env>`` puts them on ``<env>.yaml`` instead
DEFAULT_PRESET = "q-interq"  # the preset every command starts from unless --preset names another


class NonFiniteTrainingError(RuntimeError):
    """Training stopped on non-finite values: an RL step's loss (at once), ``optim.max_nonfinite_steps`` RL steps in
    a row with a non-finite gradient (each update skipped), or a diverged warm start (nothing saved)."""


# ----------------------------------------------------------------------------------------------------
# field metadata: the doc and the allowed values of every field, in one place


@dataclass(frozen=True)
class Bounds:
    """The numbers a field accepts: ``low`` .. ``high`` (each end included unless ``*_open``); NaN never, an
    infinite value only where ``inf_ok`` (a cap or budget where inf means "none")."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    inf_ok: bool = False

    def text(self) -> str:
        """``> 0``, ``>= 0``, ``in [0, 1]``, ``in (0, 1]``, ``> 0 (inf allowed)``."""
        if math.isinf(self.high):
            out = f"{'>' if self.low_open else '>='} {_num(self.low)}"
        else:
            out = f"in {'(' if self.low_open else '['}{_num(self.low)}, {_num(self.high)}{')' if self.high_open else ']'}"
        return out + (" (inf allowed)" if self.inf_ok else "")

    def check(self, path: str, value: Any) -> None:
        """Raise :class:`ConfigError` naming ``path`` unless ``value`` lies in the bounds."""
        lo_ok = value > self.low if self.low_open else value >= self.low
        hi_ok = value < self.high if self.high_open else value <= self.high
        if isinstance(value, float) and math.isnan(value) or not (lo_ok and hi_ok):
            raise ConfigError(f"{path}={value!r} is not accepted; it must be {self.text().removesuffix(' (inf allowed)')}")
        if not self.inf_ok and isinstance(value, float) and math.isinf(value):
            raise ConfigError(f"{path}={value!r} is not accepted; it must be a finite number")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


POSITIVE = Bounds(0, low_open=True)
NON_NEGATIVE = Bounds(0)
POSITIVE_OR_INF = Bounds(0, low_open=True, inf_ok=True)
NON_NEGATIVE_OR_INF = Bounds(0, inf_ok=True)
UNIT = Bounds(0, 1)
BITS = Bounds(2, 8)
SEED = Bounds(-(2**20), 2**20)  # the episode and per-turn seeds derived from it stay within torch's 64-bit seeds
ADAM_BETA = Bounds(0, 0.999999)


def _f(default: Any, doc: str, *, choices: tuple | None = None, bounds: Bounds | None = None,
       allowed: str | None = None) -> Any:
    """A config field: its default, a one-line ``doc`` (what it does, units) and its allowed values: ``choices`` (a
    fixed set), ``bounds`` (numbers) or ``allowed`` (in words, where validation is conditional or external)."""
    meta: dict[str, Any] = {"doc": doc}
    if choices is not None:
        meta["choices"] = tuple(choices)
    if bounds is not None:
        meta["bounds"] = bounds
    if allowed is not None:
        meta["allowed"] = allowed
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=meta)
    return field(default=default, metadata=meta)


def _section(cls: type, doc: str) -> Any:
    return field(default_factory=cls, metadata={"doc": doc})


@dataclass(frozen=True)
class ModelConfig:
    """The policy. ``source="tiny"`` builds a small Qwen3 / Qwen3-MoE from the fields below and a tokenizer
    trained on environment text; any other value is a checkpoint directory (safetensors + tokenizer.json),
    or ``smollm2`` for the offline SmolLM2-135M-Instruct."""

    source: str = _f("tiny", "Where the policy comes from: tiny builds a small model from the model.* fields and a "
                     "tokenizer trained on environment text; smollm2 loads the bundled SmolLM2-135M-Instruct; any other "
                     "value is a checkpoint directory (config.json, safetensors, tokenizer.json).",
                     allowed="tiny, smollm2 or a checkpoint directory")
    arch: str = _f("qwen3", "Architecture of the tiny policy: dense Qwen3 or mixture-of-experts Qwen3-MoE (tiny only).",
                   choices=ARCHS)
    vocab_size: int = _f(768, "Size of the tokenizer trained on environment text, in tokens: the 256 byte-level "
                         "symbols plus merges (tiny only).", bounds=Bounds(300))
    hidden_size: int = _f(64, "Width of the residual stream (tiny only).", bounds=POSITIVE)
    num_layers: int = _f(2, "Number of decoder layers (tiny only).", bounds=POSITIVE)
    num_heads: int = _f(4, "Query heads per attention layer (tiny only).", bounds=POSITIVE)
    num_kv_heads: int = _f(2, "Key/value heads per attention layer, grouped-query attention; must divide "
                           "model.num_heads (tiny only).", bounds=POSITIVE)
    head_dim: int = _f(16, "Width of each attention head (tiny only).", bounds=POSITIVE)
    intermediate_size: int = _f(192, "Hidden width of the dense MLP (tiny only).", bounds=POSITIVE)
    num_experts: int = _f(4, "Experts per mixture-of-experts layer (tiny qwen3_moe only).", bounds=POSITIVE)
    num_experts_per_tok: int = _f(2, "Experts each token is routed to (tiny qwen3_moe only).",
                                  allowed="in [1, model.num_experts]")
    moe_intermediate_size: int = _f(96, "Hidden width of each expert's MLP (tiny qwen3_moe only).", bounds=POSITIVE)
    max_position_embeddings: int = _f(4096, "Longest sequence the rotary positions are set up for, in tokens "
                                      "(tiny only).", bounds=POSITIVE)
    dtype: str = _f("float32", "Dtype of the learner's master weights and of its forward compute.", choices=DTYPES)


@dataclass(frozen=True)
class EnvConfig:
    """The environment, its task splits, and how the agent sees and answers it."""

    name: str = _f("household", "Environment to play, by its registered name (interq.envs.list_envs(): household, "
                   "synthshop, alfworld, scienceworld, webshop); an arm preset with env.name=<env> builds on that "
                   "environment's preset.", allowed="a registered environment name")
    train_split: str = _f("train", "Task split that RL and the warm start draw their tasks from.",
                          allowed="a split of the environment")
    eval_split: str = _f("valid_unseen", "Held-out task split of the evaluations (training and interq eval).",
                         allowed="a split of the environment")
    num_train_tasks: int = _f(64, "Task instances RL samples from: the first N of the train split (0: all of it).",
                              bounds=NON_NEGATIVE)
    num_eval_tasks: int = _f(32, "Held-out task instances each evaluation plays: the first N of the eval split "
                             "(0: none).", bounds=NON_NEGATIVE)
    task_types: str = _f("", "Comma-separated task types kept in both splits, e.g. pick_and_place (empty: all).",
                         allowed="task types of the environment, comma-separated")
    max_turns: int = _f(12, "Step limit per episode, in environment steps; reaching it truncates the episode.",
                        bounds=POSITIVE)
    show_admissible: bool = _f(True, "List the admissible actions in every observation.")
    action_format: str = _f("text", "How the agent answers: text writes the action, index writes its number in the "
                            "listed actions; auto is resolved when the config is built: text for a pretrained "
                            "model.source, index for tiny.", choices=ACTION_FORMATS)
    prompt: str = _f("compact", "Prompt format: compact (a short render for the tiny policy) or verl_agent (a chat "
                     "prompt with the action in <action> tags, for a chat model); auto is resolved when the config is "
                     "built: verl_agent for a pretrained model.source, compact for tiny.", choices=PROMPTS)
    invalid_action_penalty: float = _f(0.1, "Reward subtracted for an action the environment does not accept.",
                                       bounds=NON_NEGATIVE)
    env_kwargs: dict = _f({}, "Extra keyword arguments for the environment's constructor, e.g. {size: small}.",
                          allowed="a mapping the environment accepts")
    num_workers: int = _f(0, "Worker processes that step the environments: 0 steps them in the trainer's process one "
                          "by one; N > 0 steps a step's episodes in a pool of N processes, in waves of N (a crashed or "
                          "hung worker costs only its episode).", bounds=NON_NEGATIVE)
    overlap: bool = _f(False, "With env.num_workers >= 2, play each wave in two halves, one generating while the "
                       "other's environments step in the workers; the same episodes as without it.")
    step_timeout_s: float = _f(300.0, "Seconds a worker may take to answer a step or reset before it is killed and "
                               "its episode recorded as failed (env.num_workers > 0).", bounds=POSITIVE)


@dataclass(frozen=True)
class WarmStartConfig:
    """Supervised fine-tuning on expert demonstrations before RL. ``noise``, ``num_demos`` and ``steps`` set how
    good the starting policy is (RL needs room to improve); a tiny policy trained from scratch needs the
    observation loss (``observation_weight``, :mod:`interq.train.sft`)."""

    enabled: bool = _f(True, "Fine-tune on expert demonstrations before RL (false: RL starts from the policy as built "
                       "or loaded).")
    num_demos: int = _f(256, "Expert demonstration episodes to fine-tune on.",
                        allowed="> 0 (>= 0 with warm_start.enabled=false)")
    noise: float = _f(0.2, "Share of the demonstrations' actions replaced by random admissible ones.", bounds=UNIT)
    steps: int = _f(300, "Optimizer steps of the fine-tuning (0: none).", bounds=NON_NEGATIVE)
    lr: float = _f(3e-3, "Learning rate of the fine-tuning (AdamW).", bounds=POSITIVE)
    observation_weight: float = _f(0.0, "Weight of the language-modelling loss on observation tokens next to the "
                                   "action loss (0: action-only fine-tuning, as for a pretrained checkpoint).",
                                   bounds=NON_NEGATIVE)
    episodes_per_microbatch: int = _f(16, "Demonstration episodes per gradient-accumulation micro-batch.",
                                      bounds=POSITIVE)
    seed: int = _f(0, "Seed of the demonstrations' noise and of the fine-tuning's batch order.", bounds=SEED)
    tokens_per_microbatch: int = _f(0, "Padded tokens (rows x longest row) per forward of the fine-tuning; the "
                                    "episodes of a step are accumulated over as many forwards as this needs, each "
                                    "decoder layer recomputed in the backward for a pretrained model (0: auto, "
                                    "no limit for model.source=tiny, 4096 for a pretrained checkpoint).",
                                    bounds=NON_NEGATIVE)


@dataclass(frozen=True)
class RolloutConfig:
    """The executor (the behaviour policy that plays the episodes) and its sampling."""

    executor: str = _f("bf16", "Numerics of the executor that plays the episodes: bf16, fp32, or w8a8 (integer "
                       "weights and activations in the GEMMs, a quantized KV cache).", choices=EXECUTORS)
    executor_dtype: str = _f("bfloat16", "Compute dtype between the integer GEMMs (w8a8 only).", choices=DTYPES)
    weight_format: str = _f("int8", "Weight format of the executor's linear layers (w8a8 only).",
                            choices=WEIGHT_FORMATS)
    kv_format: str = _f("int8_per_token_head", "KV-cache format of the executor (w8a8 only; none: unquantized).",
                        choices=KV_FORMATS)
    w_bits: int = _f(8, "Integer width of the executor's weights, e.g. 4 as in W4A8 serving (w8a8 with "
                     "weight_format=int8; symmetric, int8 kernels, exact int32 sums).", bounds=BITS)
    a_bits: int = _f(8, "Integer width of the activations entering the executor's GEMMs (w8a8 with "
                     "weight_format=int8).", bounds=BITS)
    kv_bits: int = _f(8, "Integer width of the executor's KV cache (w8a8 with kv_format=int8_per_token_head).",
                      bounds=BITS)
    temperature: float = _f(1.0, "Sampling temperature of the training episodes.", bounds=POSITIVE)
    top_p: float = _f(1.0, "Nucleus-sampling probability mass of the training episodes (1: off).",
                      bounds=Bounds(0, 1, low_open=True))
    attention: str = _f("sdpa_packed", "Executor's attention: sdpa_packed (a single query token attends with its KV "
                        "head's query heads packed: the same kernel path whatever the batch's padding, faster decode "
                        "for grouped-query models), sdpa (transformers' attention as it comes).", choices=ATTENTIONS)
    max_action_tokens: int = _f(12, "Most tokens the agent generates per turn.", bounds=POSITIVE)
    max_context_tokens: int = _f(2048, "Longest context in tokens; reaching it truncates the episode.",
                                 allowed="> rollout.max_action_tokens")
    history_turns: int = _f(0, "Earlier (observation, action) pairs re-rendered in each turn's prompt in the per_turn "
                            "layout (0: the task and the current observation only).", bounds=NON_NEGATIVE)


@dataclass(frozen=True)
class AlgoConfig:
    """The RL objective: correction of the executor/learner mismatch, advantages, clipped loss."""

    correction: str = _f("tis", "Correction of the executor/learner mismatch (each method's formula: docs/algorithm.md): "
                         "none; tis (token ratio capped at algo.tis_cap); icepop, geo_mask (token, trajectory masks); "
                         "seq_is (capped trajectory ratio); prefix_is (capped ratio of the earlier turns); interq (prefix "
                         "log-weight bounded by algo.budget, shared by effective support); interq_uniform (equal shares).",
                         choices=CORRECTIONS)
    align: bool = _f(False, "Quantize the learner's forward like the executor (straight-through gradients); needs "
                     "rollout.executor=w8a8.")
    layout: str = _f("concatenated", "Training rows: concatenated (one row per episode) or per_turn (one row per "
                     "turn).", choices=LAYOUTS)
    advantage: str = _f("grpo", "Advantage estimator: grpo (an episode's return against its group's) or gigpo "
                        "(GRPO plus a step-level term over repeated states).", choices=ADVANTAGES)
    grpo_std: bool = _f(True, "Divide advantages by their group's standard deviation.")
    gigpo_gamma: float = _f(0.95, "Discount of GiGPO's step-level returns.", bounds=UNIT)
    gigpo_omega: float = _f(1.0, "Weight of GiGPO's step-level advantage next to the episode-level one.",
                            bounds=NON_NEGATIVE)
    budget: float = _f(0.5, "InterQ's budget B in nats: the bound on a turn's prefix log-weight |Lambda| (0: no "
                       "prefix weight; inf: unbounded).", bounds=NON_NEGATIVE_OR_INF)
    tis_cap: float = _f(2.0, "Cap on the token ratio exp(delta) (tis and the token factor of the other methods) "
                        "and on seq_is's trajectory ratio.", bounds=POSITIVE_OR_INF)
    icepop_low: float = _f(0.5, "Smallest token ratio icepop keeps.", allowed="in (0, algo.icepop_high]")
    icepop_high: float = _f(2.0, "Largest token ratio icepop keeps.", allowed=">= algo.icepop_low")
    geo_low: float = _f(0.9, "Smallest geometric-mean trajectory ratio geo_mask keeps.",
                        allowed="in (0, algo.geo_high]")
    geo_high: float = _f(1.1, "Largest geometric-mean trajectory ratio geo_mask keeps.", allowed=">= algo.geo_low")
    prefix_cap: float = _f(2.0, "Cap of prefix_is on its prefix weight (the earlier turns' ratio).",
                           bounds=POSITIVE_OR_INF)
    normalize: bool = _f(False, "Divide the correction weights by their mean over the batch's kept action tokens.")
    token_correction: bool = _f(True, "Multiply the prefix methods' weight (interq, interq_uniform, prefix_is) and "
                                "geo_mask's by the capped token ratio (false: token factor 1, e.g. interq = "
                                "exp(Lambda) alone).")
    clip_eps_low: float = _f(0.2, "PPO clip below 1: a ratio under 1 - eps is clipped.", bounds=UNIT)
    clip_eps_high: float = _f(0.28, "PPO clip above 1: a ratio over 1 + eps is clipped (inf: no upper clip).",
                              bounds=NON_NEGATIVE_OR_INF)
    loss_agg: str = _f("token_mean", "Loss averaging: token_mean (over the batch's action tokens) or "
                       "seq_mean_token_mean (within each trajectory, then over trajectories; a trajectory is one "
                       "episode in both layouts).", choices=LOSS_AGGS)
    ppo_epochs: int = _f(1, "Passes over each step's episodes.", bounds=POSITIVE)
    minibatches_per_step: int = _f(1, "Optimizer steps per pass, the episodes split into this many mini-batches.",
                                   allowed="in [1, train.tasks_per_step x train.episodes_per_task]")


@dataclass(frozen=True)
class OptimConfig:
    """The RL optimizer (AdamW)."""

    lr: float = _f(1e-3, "Learning rate of RL.", bounds=POSITIVE)
    weight_decay: float = _f(0.0, "Decoupled weight decay.", bounds=NON_NEGATIVE)
    beta1: float = _f(0.9, "Decay of the first-moment (gradient mean) estimate.", bounds=ADAM_BETA)
    beta2: float = _f(0.99, "Decay of the second-moment (squared gradient) estimate.", bounds=ADAM_BETA)
    grad_clip: float = _f(1.0, "Gradient-norm clip (0: none).", bounds=NON_NEGATIVE)
    max_nonfinite_steps: int = _f(3, "RL steps in a row with a non-finite gradient under a finite loss (their updates "
                                  "skipped) that stop the run; a non-finite loss stops it at once.", bounds=POSITIVE)


@dataclass(frozen=True)
class TrainConfig:
    """The RL loop: steps, batch, evaluation, checkpoints, and the learner's kernels."""

    steps: int = _f(20, "RL steps to run (0: none).", bounds=NON_NEGATIVE)
    tasks_per_step: int = _f(4, "Task instances sampled per RL step.", bounds=POSITIVE)
    episodes_per_task: int = _f(4, "Episodes played per task instance: the advantage's group size G (>= 2 for grpo "
                                "and gigpo).", bounds=POSITIVE)
    tokens_per_microbatch: int = _f(4096, "Gradient-accumulation unit: whole episodes packed until the learner's "
                                    "forward over their distinct rows, in length buckets, computes this many padded "
                                    "tokens (an episode over it: alone).", bounds=POSITIVE)
    eval_every_steps: int = _f(5, "Evaluate held-out success before RL, every N steps and at the last step (0: "
                               "never).", bounds=NON_NEGATIVE)
    eval_episodes_per_task: int = _f(1, "Episodes played per held-out task at each evaluation.", bounds=POSITIVE)
    eval_temperature: float = _f(1.0, "Sampling temperature of the evaluations (0: greedy).", bounds=NON_NEGATIVE)
    checkpoint_every_steps: int = _f(5, "Save a resumable checkpoint every N steps and at the last step (0: never).",
                                     bounds=NON_NEGATIVE)
    seed: int = _f(0, "Seed of RL's task sampling and episode seeds, and of the tiny policy's initialisation.",
                   bounds=SEED)
    threads: int = _f(0, "Threads torch computes with (torch.set_num_threads; 0: leave torch's choice).", bounds=NON_NEGATIVE)
    device: str = _f("cpu", "Where learner and executor run: cpu, cuda, or auto (cuda when a GPU is visible); the "
                     "warm start stays on the CPU.", choices=DEVICES)
    gradient_checkpointing: bool = _f(False, "Recompute each decoder layer's activations in the backward instead of "
                                      "keeping them: much less learner memory for about one more forward per "
                                      "micro-batch; the same gradients.")
    learner_autocast: str = _f("auto", "Use of bf16 in the learner: off (fp32); bf16 (the plain learner's forward under "
                               "torch.autocast, fp32 master weights; not with algo.align); bf16_backward (fp32 "
                               "forward, the same log-probs, backward GEMMs of the linear layers in bf16); auto is "
                               "resolved when the config is built: bf16_backward on a CPU learner with native bf16 "
                               "(AVX512_BF16 or AMX), else off.", choices=LEARNER_AUTOCASTS)
    learner_gemm: str = _f("torch", "Library of the learner's fp32 CPU GEMMs (linear layers, forward and backward): "
                           "torch, or onednn (faster on AMD CPUs with AVX-512; the same arithmetic summed in another "
                           "order).", choices=LEARNER_GEMMS)
    learner_attention: str = _f("auto", "The learner's causal self-attention, forward and backward: sdpa "
                                "(transformers'), kernel (interq's fp32 CPU kernel, the same function to rounding), "
                                "or auto, resolved when the config is built: kernel for a CPU learner on a non-Intel "
                                "CPU with AVX-512 where interq's kernels load, else sdpa.",
                                choices=LEARNER_ATTENTIONS)
    progress: bool = _f(True, "Show a progress bar over the RL steps.")
    tensorboard: bool = _f(False, "Also write the step records as TensorBoard events.")


@dataclass(frozen=True)
class RunConfig:
    """One run: its name and the components."""

    name: str = _f("run", "Name of the run; the default run directory is runs/<name>.", allowed="any string")
    model: ModelConfig = _section(ModelConfig, "The policy: a tiny model built from these fields, or a checkpoint.")
    env: EnvConfig = _section(EnvConfig, "The environment, its task splits, and how the agent sees and answers it.")
    warm_start: WarmStartConfig = _section(WarmStartConfig, "Supervised fine-tuning on expert demonstrations before "
                                           "RL.")
    rollout: RolloutConfig = _section(RolloutConfig, "The executor that plays the episodes, and its sampling.")
    algo: AlgoConfig = _section(AlgoConfig, "The RL objective: mismatch correction, advantages, clipped loss.")
    optim: OptimConfig = _section(OptimConfig, "The RL optimizer (AdamW).")
    train: TrainConfig = _section(TrainConfig, "The RL loop: steps, batch, evaluation, checkpoints, learner kernels.")


# ----------------------------------------------------------------------------------------------------
# dict <-> dataclass


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


class _ConfigLoader(yaml.SafeLoader):
    """YAML with only ``true`` / ``false`` as booleans (YAML 1.2): YAML 1.1 also reads ``off``, ``on``, ``yes`` and
    ``no`` as booleans, so ``train.learner_autocast=off`` would arrive as ``False``. A bool field still takes those
    words (:func:`_coerce`)."""


_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                    list("tTfF"))
_BOOL_WORDS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 (a SafeLoader)


def _coerce(path: str, value: Any, tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _BOOL_WORDS:
            return _BOOL_WORDS[value.lower()]
        raise ConfigError(f"{path}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            if isinstance(value, str):  # YAML 1.1 reads 1e-3 and inf as strings
                try:
                    return float(value.lower().replace(".inf", "inf"))
                except ValueError:
                    pass
            raise ConfigError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {value!r}")
        return value
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {value!r}")
        return dict(value)
    if is_dataclass(tp):
        return from_dict(tp, value, prefix=path)
    return value


def from_dict(cls: type, data: dict | None, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a (possibly partial) nested dict; unknown keys are rejected."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        where = prefix or "config"
        raise ConfigError(f"{where}: unknown field(s) {unknown}; accepted: {names}")
    kwargs = {k: _coerce(f"{prefix}.{k}" if prefix else k, v, hints[k]) for k, v in data.items()}
    return cls(**kwargs)


def _deep_merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "env_kwargs":
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def parse_overrides(overrides: list[str]) -> dict:
    """``["algo.correction=interq", "train.steps=3"]`` -> nested dict; values parsed as YAML scalars."""
    out: dict = {}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key.sub=value, e.g. train.steps=10")
        key, raw = item.split("=", 1)
        key = key.strip().lstrip("-")
        if not key:
            raise ConfigError(f"override {item!r}: empty key")
        try:
            value = _yaml_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {p} is both a value and a section")
        node[parts[-1]] = value
    return out


def preset_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("interq.presets").iterdir() if p.name.endswith(".yaml"))


def load_preset(name: str, _chain: tuple[str, ...] = (), rebase: dict[str, str] | None = None) -> dict:
    """The preset's nested dict (resolving ``base:`` chains). ``name`` is a preset name or a YAML path.
    ``rebase`` maps a base preset to the one to use in its place (``{"household": "alfworld"}``)."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"preset: expected a preset name or a .yaml path, got {name!r}; accepted: {preset_names()}")
    if name in _chain:
        raise ConfigError(f"preset {_chain[0]!r}: its base chain {' -> '.join((*_chain, name))} is a cycle")
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        text = path.read_text()
    else:
        res = resources.files("interq.presets") / f"{name}.yaml"
        if not res.is_file():
            raise ConfigError(f"preset: unknown preset {name!r}; accepted: {preset_names()} or a path to a .yaml file")
        text = res.read_text()
    try:
        data = _yaml_load(text) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"preset {name!r}: not valid YAML ({' '.join(str(e).split())})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"preset {name!r}: expected a mapping at the top level")
    base = data.pop("base", None)
    if base:
        base = (rebase or {}).get(base, base)
        data = _deep_merge(load_preset(base, (*_chain, name), rebase), data)
    return data


def _preset_chain(name: str) -> list[str]:
    """The names of ``name``'s preset and its ``base:`` chain (empty where one is not a readable preset)."""
    out: list[str] = []
    while name and name not in out:
        res = resources.files("interq.presets") / f"{name}.yaml"
        path = Path(name)
        text = path.read_text() if path.suffix in (".yaml", ".yml") and path.is_file() else res.read_text() if res.is_file() else None
        if text is None:
            break
        out.append(name)
        try:
            data = _yaml_load(text) or {}
        except yaml.YAMLError:
            break
        name = data.get("base") if isinstance(data, dict) else None
    return out


def env_preset_for(preset: str | None, env_name: Any) -> str | None:
    """The environment preset an arm preset is put on when the command line names another environment.

    The arm presets (``bf16``, ``q-*``) build on ``household``; with ``env.name=alfworld`` (``scienceworld``,
    ``synthshop``) they build on that environment's preset instead (its splits, turn limit, warm start and
    engine settings), so ``--preset q-interq env.name=alfworld`` is the q-interq arm on ALFWorld. None when
    nothing is to be swapped (no such preset, or the preset does not build on ``household``)."""
    if not isinstance(env_name, str) or not env_name or env_name == ARM_BASE:
        return None
    if not (resources.files("interq.presets") / f"{env_name}.yaml").is_file():
        return None
    chain = _preset_chain(preset or "")
    if ARM_BASE not in chain[1:] or env_name in chain:
        return None
    return env_name


def _learner_on_cpu(device: str) -> bool:
    """Whether ``train.device`` puts the learner on the CPU (False for a value naming no device: validate() says so)."""
    from interq.machine import resolve_device

    try:
        return resolve_device(device, "train.device").type == "cpu"
    except ValueError:
        return False


def resolve_learner_autocast(value: str, device: str = "cpu") -> str:
    """``train.learner_autocast=auto`` -> ``bf16_backward`` for a learner on a CPU that computes bf16 in hardware
    (AVX512_BF16 / AMX: the backward's GEMMs 1.5-2x fp32 there, docs/performance.md), ``off`` elsewhere: CPUs without
    native bf16 (there ``bf16_backward`` computes its GEMMs as fp32 GEMMs of bf16 operands: about fp32's speed, no
    gain), and CUDA (unmeasured there; ``train.learner_autocast=bf16_backward`` asks for it). Other values
    pass through. ``device``: ``train.device`` (``auto`` is resolved here too)."""
    if value != "auto":
        return value
    from interq.machine import bf16_native

    return "bf16_backward" if _learner_on_cpu(device) and bf16_native("cpu") else "off"


def resolve_learner_attention(value: str, device: str = "cpu") -> str:
    """``train.learner_attention=auto`` -> ``kernel`` for a CPU learner where interq's CPU kernels load (built
    once per machine, :mod:`interq.kernels`; ``INTERQ_CPU_KERNELS=0`` turns them off) on a CPU with AVX-512 that is
    not an Intel one, ``sdpa`` elsewhere (CUDA, no C++ compiler, Intel CPUs, CPUs without AVX-512). Measured
    (docs/performance.md): the kernel's forward and backward are 2.2-2.6x torch's CPU flash kernel on AMD EPYCs with
    AVX-512 (Zen 5) at 300-1,760 tokens, but 0.71-0.79x on an Intel Xeon with AMX at 1,040-1,760 tokens (torch's
    flash kernel multiplies its blocks with MKL's fp32 GEMMs, fast on Intel and slow on AMD; likely, not profiled);
    on an AVX2-only AMD EPYC (Zen 3), 1.14-1.28x alone but the SmolLM2 RL step 1.06x and the study's tiny learner
    0.77-0.84x (slower): there ``kernel`` is an opt-in. Other values pass through."""
    if value != "auto":
        return value
    if not _learner_on_cpu(device):
        return "sdpa"
    from interq.machine import cpu_has, cpu_vendor

    if cpu_vendor() == "GenuineIntel" or not cpu_has("avx512f"):
        return "sdpa"
    from interq import kernels

    return "kernel" if kernels.load() is not None else "sdpa"


def resolve_auto(cfg: "RunConfig") -> "RunConfig":
    """``auto`` values -> concrete ones, so that a run's stored config says what ran:

    * ``env.action_format`` / ``env.prompt``, by the policy: a pretrained chat model (``model.source`` not
      ``tiny``) writes the action text in ``<action>`` tags under verl-agent's prompt; the tiny policy answers with
      an action's number under the compact prompt (it cannot yet copy action text);
    * ``train.learner_autocast`` and ``train.learner_attention``, by the machine (:func:`resolve_learner_autocast`,
      :func:`resolve_learner_attention`): a run resumed on a machine that resolves them otherwise is refused, naming
      the field (its numbers would change)."""
    pretrained = cfg.model.source != "tiny"
    e, t = cfg.env, cfg.train
    fmt = ("text" if pretrained else "index") if e.action_format == "auto" else e.action_format
    prompt = ("verl_agent" if pretrained else "compact") if e.prompt == "auto" else e.prompt
    if (fmt, prompt) != (e.action_format, e.prompt):
        cfg = replace(cfg, env=replace(e, action_format=fmt, prompt=prompt))
    if "auto" in (t.learner_autocast, t.learner_attention):
        cfg = replace(cfg, train=replace(t, learner_autocast=resolve_learner_autocast(t.learner_autocast, t.device),
                                         learner_attention=resolve_learner_attention(t.learner_attention, t.device)))
    return cfg


def build_config(preset: str | None = None, overrides: list[str] | None = None, extra: dict | None = None) -> RunConfig:
    """Preset (optional) <- ``extra`` dict <- command-line overrides; validated.

    An arm preset with ``env.name=<env>`` among the overrides (or in ``extra``) builds on ``<env>``'s preset in
    place of ``household`` (:func:`env_preset_for`); its run is then named ``<arm>-<env>`` unless ``name`` is
    given. ``auto`` values are resolved (:func:`resolve_auto`)."""
    over = _deep_merge(extra or {}, parse_overrides(overrides) if overrides else {})
    env_over = over.get("env") if isinstance(over.get("env"), dict) else {}
    target = env_preset_for(preset, env_over.get("name"))
    # an empty name is refused by load_preset (it is not "no preset": that is None)
    data: dict = load_preset(preset, rebase={ARM_BASE: target} if target else None) if preset is not None else {}
    if target and "name" not in over and isinstance(data.get("name"), str):
        data["name"] = f"{data['name']}-{target}"
    if extra:
        data = _deep_merge(data, extra)
    if overrides:
        data = _deep_merge(data, parse_overrides(overrides))
    cfg = resolve_auto(from_dict(RunConfig, data))
    validate(cfg)
    return cfg


def save_config(cfg: RunConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def load_config(path: str | Path) -> RunConfig:
    cfg = resolve_auto(from_dict(RunConfig, _yaml_load(Path(path).read_text())))
    validate(cfg)
    return cfg


def with_overrides(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    cfg = resolve_auto(from_dict(RunConfig, _deep_merge(to_dict(cfg), parse_overrides(overrides))))
    validate(cfg)
    return cfg




# ----------------------------------------------------------------------------------------------------
# validation


def _leaf_fields(cls: type = RunConfig, prefix: str = "") -> list[tuple[str, dataclasses.Field, Any]]:
    """(dotted name, field, type) of every leaf field, in definition order."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        if is_dataclass(hints[f.name]):
            out.extend(_leaf_fields(hints[f.name], f"{prefix}{f.name}."))
        else:
            out.append((f"{prefix}{f.name}", f, hints[f.name]))
    return out


_FIELD_META: dict[str, typing.Mapping[str, Any]] = {}


def field_metadata(path: str) -> typing.Mapping[str, Any]:
    """The metadata (``doc``, ``choices``, ``bounds``, ``allowed``) of the field ``path`` (``algo.budget``)."""
    if not _FIELD_META:
        _FIELD_META.update({name: f.metadata for name, f, _ in _leaf_fields()})
    return _FIELD_META[path]


def choices(path: str) -> tuple:
    """The values the field ``path`` accepts (``choices("algo.correction")``); KeyError where it has no fixed set."""
    return field_metadata(path)["choices"]


def _one_of(path: str, value: Any) -> None:
    allowed = choices(path)
    if value not in allowed:
        raise ConfigError(f"{path}={value!r} is not accepted; choose one of {list(allowed)}")


def _bounded(path: str, value: Any) -> None:
    field_metadata(path)["bounds"].check(path, value)


def _positive(path: str, value: float, allow_zero: bool = False) -> None:
    """``value`` > 0 (or >= 0), not NaN, finite (a rule that depends on another field)."""
    (NON_NEGATIVE if allow_zero else POSITIVE).check(path, value)


def validate(cfg: RunConfig) -> None:
    """Raise ConfigError on the first invalid field (before any work starts). The allowed values are each field's
    metadata (``choices``, ``bounds``); the rules that join several fields are written out here."""
    m = cfg.model
    if m.source == "tiny":
        _one_of("model.arch", m.arch)
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "max_position_embeddings"):
            _bounded(f"model.{name}", getattr(m, name))
        if m.num_heads % m.num_kv_heads:
            raise ConfigError(f"model.num_kv_heads={m.num_kv_heads} must divide model.num_heads={m.num_heads}")
        if m.arch == "qwen3_moe":
            _bounded("model.num_experts", m.num_experts)
            _bounded("model.moe_intermediate_size", m.moe_intermediate_size)
            if not 1 <= m.num_experts_per_tok <= m.num_experts:
                raise ConfigError(f"model.num_experts_per_tok={m.num_experts_per_tok} must be in [1, model.num_experts={m.num_experts}]")
    elif m.source != "smollm2" and not Path(m.source).is_dir():
        raise ConfigError(f"model.source={m.source!r} is not accepted; use 'tiny', 'smollm2' or an existing checkpoint directory")
    _one_of("model.dtype", m.dtype)

    e = cfg.env
    if not e.name:
        raise ConfigError("env.name must not be empty (e.g. household)")
    _bounded("env.num_train_tasks", e.num_train_tasks)
    _bounded("env.num_eval_tasks", e.num_eval_tasks)
    _bounded("env.max_turns", e.max_turns)
    _one_of("env.action_format", e.action_format)
    if e.action_format == "index" and not e.show_admissible:
        raise ConfigError("env.action_format='index' needs env.show_admissible=true (the agent picks from the listed actions)")
    _one_of("env.prompt", e.prompt)
    if e.prompt == "verl_agent" and e.action_format == "index":
        raise ConfigError("env.prompt='verl_agent' needs env.action_format='text' (its answer is the action text in "
                          "<action> tags); use env.prompt='compact' for index answers")
    _bounded("env.invalid_action_penalty", e.invalid_action_penalty)
    if isinstance(e.num_workers, bool) or not isinstance(e.num_workers, int) or e.num_workers < 0:
        raise ConfigError(f"env.num_workers={e.num_workers!r} is not accepted; it must be an integer >= 0 "
                          "(0: in-process, N: an EnvPool of N worker processes)")
    _bounded("env.step_timeout_s", e.step_timeout_s)
    if not isinstance(e.overlap, bool):
        raise ConfigError(f"env.overlap={e.overlap!r} is not accepted; it must be true or false")
    if e.overlap and e.num_workers < 2:
        raise ConfigError(f"env.overlap=true needs env.num_workers >= 2 (got {e.num_workers}): the environments of one "
                          "half of the episodes step in worker processes while the other half generates")

    w = cfg.warm_start
    _positive("warm_start.num_demos", w.num_demos, allow_zero=not w.enabled)
    _bounded("warm_start.noise", w.noise)
    _bounded("warm_start.steps", w.steps)
    _bounded("warm_start.lr", w.lr)
    _bounded("warm_start.observation_weight", w.observation_weight)
    _bounded("warm_start.episodes_per_microbatch", w.episodes_per_microbatch)
    _bounded("warm_start.tokens_per_microbatch", w.tokens_per_microbatch)
    _bounded("warm_start.seed", w.seed)

    r = cfg.rollout
    _one_of("rollout.executor", r.executor)
    _one_of("rollout.attention", r.attention)
    _one_of("rollout.executor_dtype", r.executor_dtype)
    _one_of("rollout.weight_format", r.weight_format)
    _one_of("rollout.kv_format", r.kv_format)
    for name, needs, fmt in (("w_bits", "weight_format", "int8"), ("a_bits", "weight_format", "int8"),
                             ("kv_bits", "kv_format", "int8_per_token_head")):
        bits = getattr(r, name)
        bounds = field_metadata(f"rollout.{name}")["bounds"]
        if isinstance(bits, bool) or not isinstance(bits, int) or not bounds.low <= bits <= bounds.high:
            raise ConfigError(f"rollout.{name}={bits!r} is not accepted; it must be an integer {bounds.text()}")
        if bits != 8 and r.executor != "w8a8":
            raise ConfigError(f"rollout.{name}={bits} needs rollout.executor='w8a8' (got {r.executor!r}); "
                              f"with another executor it must be 8")
        if bits != 8 and getattr(r, needs) != fmt:
            raise ConfigError(f"rollout.{name}={bits} needs rollout.{needs}={fmt!r} (got {getattr(r, needs)!r}); "
                              f"an fp8 or unquantized format has no integer width, it must be 8")
    _bounded("rollout.temperature", r.temperature)
    _bounded("rollout.top_p", r.top_p)
    _bounded("rollout.max_action_tokens", r.max_action_tokens)
    _positive("rollout.max_context_tokens", r.max_context_tokens)
    _bounded("rollout.history_turns", r.history_turns)
    if r.max_context_tokens <= r.max_action_tokens:
        raise ConfigError(f"rollout.max_context_tokens={r.max_context_tokens} must exceed rollout.max_action_tokens={r.max_action_tokens}")

    a = cfg.algo
    _one_of("algo.correction", a.correction)
    _one_of("algo.layout", a.layout)
    _one_of("algo.advantage", a.advantage)
    _one_of("algo.loss_agg", a.loss_agg)
    _bounded("algo.budget", a.budget)
    _bounded("algo.tis_cap", a.tis_cap)
    _bounded("algo.prefix_cap", a.prefix_cap)
    _bounded("algo.gigpo_gamma", a.gigpo_gamma)
    _bounded("algo.gigpo_omega", a.gigpo_omega)
    for lo, hi in (("icepop_low", "icepop_high"), ("geo_low", "geo_high")):
        if not 0 < getattr(a, lo) <= getattr(a, hi):
            raise ConfigError(f"algo.{lo}={getattr(a, lo)} and algo.{hi}={getattr(a, hi)}: need 0 < low <= high")
    _bounded("algo.clip_eps_low", a.clip_eps_low)
    _bounded("algo.clip_eps_high", a.clip_eps_high)
    _bounded("algo.ppo_epochs", a.ppo_epochs)
    _positive("algo.minibatches_per_step", a.minibatches_per_step)
    if a.align and r.executor != "w8a8":
        raise ConfigError(f"algo.align=true needs rollout.executor='w8a8' (got {r.executor!r}): alignment quantizes the learner like the executor")

    o = cfg.optim
    for name in ("lr", "weight_decay", "beta1", "beta2", "grad_clip", "max_nonfinite_steps"):
        _bounded(f"optim.{name}", getattr(o, name))

    t = cfg.train
    _bounded("train.steps", t.steps)
    _bounded("train.seed", t.seed)
    _bounded("train.tasks_per_step", t.tasks_per_step)
    _bounded("train.episodes_per_task", t.episodes_per_task)
    if a.advantage in ("grpo", "gigpo") and t.episodes_per_task < 2:
        raise ConfigError(f"train.episodes_per_task={t.episodes_per_task} is not accepted with algo.advantage={a.advantage!r}: a group needs >= 2 episodes")
    for name in ("tokens_per_microbatch", "eval_every_steps", "eval_episodes_per_task", "eval_temperature",
                 "checkpoint_every_steps", "threads"):
        _bounded(f"train.{name}", getattr(t, name))
    _one_of("train.device", t.device)
    if t.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"train.device='cuda' is not accepted here: torch {torch.__version__} sees no CUDA GPU; "
                              "choose one of ['cpu', 'auto']")
    if not isinstance(t.gradient_checkpointing, bool):
        raise ConfigError(f"train.gradient_checkpointing={t.gradient_checkpointing!r} is not accepted; it must be true or false")
    _one_of("train.learner_autocast", t.learner_autocast)
    if t.learner_autocast == "bf16" and a.align:
        raise ConfigError("train.learner_autocast='bf16' is not accepted with algo.align=true: bf16 upstream of the "
                          "aligned learner's activation quantization re-rounds its codes (SmolLM2: gradient cosine 0.78 "
                          "to fp32, docs/performance.md); choose train.learner_autocast='off' or 'bf16_backward'")
    _one_of("train.learner_gemm", t.learner_gemm)
    if t.learner_gemm == "onednn" and t.learner_autocast == "bf16":
        raise ConfigError("train.learner_gemm='onednn' is not accepted with train.learner_autocast='bf16' (autocast "
                          "runs the forward's GEMMs in bf16, torch's oneDNN ones already); choose train.learner_gemm="
                          "'torch', or train.learner_autocast='off' or 'bf16_backward'")
    _one_of("train.learner_attention", t.learner_attention)
    if t.learner_attention == "kernel" and t.device == "cuda":
        raise ConfigError("train.learner_attention='kernel' is for the CPU; with train.device='cuda' choose "
                          "train.learner_attention='sdpa' or 'auto'")
    if t.learner_gemm == "onednn" and t.device == "cuda":
        raise ConfigError("train.learner_gemm='onednn' is for the CPU; with train.device='cuda' choose "
                          "train.learner_gemm='torch'")
    episodes = t.tasks_per_step * t.episodes_per_task
    if a.minibatches_per_step > episodes:
        raise ConfigError(f"algo.minibatches_per_step={a.minibatches_per_step} exceeds the episodes per step "
                          f"(train.tasks_per_step x train.episodes_per_task = {episodes})")


# ----------------------------------------------------------------------------------------------------
# reference: --help-config and docs/configuration.md


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def describe(cls: type = RunConfig, prefix: str = "") -> list[tuple[str, str, Any]]:
    """(dotted name, type, default) of every field."""
    return [(r["name"], r["type"], r["default"]) for r in field_reference(cls, prefix)]


def _allowed(meta: typing.Mapping[str, Any], tp: Any) -> str:
    if "choices" in meta:
        return ", ".join(str(c) for c in meta["choices"])
    if "bounds" in meta:
        return meta["bounds"].text()
    if "allowed" in meta:
        return meta["allowed"]
    return "true, false" if tp is bool else ""


def field_reference(cls: type = RunConfig, prefix: str = "") -> list[dict]:
    """One record per field: ``name`` (dotted), ``section``, ``type``, ``default``, ``allowed`` (in words) and
    ``doc``, from the fields' metadata; the source of ``--help-config`` and of :func:`reference_markdown`."""
    default = cls()
    out = []
    for name, f, tp in _leaf_fields(cls, prefix):
        value = default
        for part in name[len(prefix):].split("."):
            value = getattr(value, part)
        out.append({"name": name, "section": name.split(".")[0] if "." in name else "run", "type": _type_name(tp),
                    "default": value, "allowed": _allowed(f.metadata, tp), "doc": f.metadata.get("doc", "")})
    return out


def sections() -> list[str]:
    """The sections ``--help-config`` accepts: ``run`` (the top-level fields) and each component, in order."""
    return list(dict.fromkeys(r["section"] for r in field_reference()))


def _records(section: str | None) -> list[dict]:
    recs = field_reference()
    if not section:
        return recs
    names = sections()
    if section in names:
        return [r for r in recs if r["section"] == section]
    picked = [r for r in recs if r["name"] == section]
    if picked:
        return picked
    raise ConfigError(f"--help-config {section!r}: unknown section; accepted: {', '.join(names)} (or a field name "
                      "such as algo.budget)")


def _section_docs() -> dict[str, str]:
    """Each section's one-line doc (``run``: the run itself)."""
    return {"run": "Top-level fields of the run.", **{f.name: f.metadata["doc"] for f in fields(RunConfig) if f.name != "name"}}


def config_help(section: str | None = None, preset: str | None = None) -> str:
    """The text of ``interq <command> --help-config [SECTION]``: every field (or ``section``'s, or one field by its
    dotted name) with its type, default, allowed values and doc. :class:`ConfigError` for an unknown section."""
    recs = _records(section)
    head = ("Config fields: override any with key.sub=value after the command's options, e.g. algo.budget=0.25. "
            "Defaults are the built-in ones" + (f"; where the {preset} preset sets another value it is shown as "
                                                 "'preset'." if preset else "."))
    values = _preset_values(preset) if preset else {}
    lines = [textwrap.fill(head, width=100)]
    docs = _section_docs()
    current = None
    for r in recs:
        if r["section"] != current:
            current = r["section"]
            lines += ["", f"[{current}] {docs.get(current, '')}"]
        extra = f"; preset {values[r['name']]!r}" if r["name"] in values and values[r["name"]] != r["default"] else ""
        allowed = f"; allowed: {r['allowed']}" if r["allowed"] else ""
        lines.append(f"  {r['name']} ({r['type']}, default {r['default']!r}{extra}{allowed})")
        lines.append(textwrap.fill(r["doc"], width=100, initial_indent=" " * 6, subsequent_indent=" " * 6))
    return "\n".join(lines)


def _preset_values(preset: str) -> dict[str, Any]:
    """The dotted fields a preset sets (before ``auto`` values are resolved); empty where it does not load."""
    try:
        data = load_preset(preset)
    except ConfigError:
        return {}
    out: dict[str, Any] = {}

    def walk(d: dict, prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, dict) and k != "env_kwargs":
                walk(v, f"{prefix}{k}.")
            else:
                out[f"{prefix}{k}"] = v
    walk(data, "")
    return out


def _md(text: str) -> str:
    return str(text).replace("|", "\\|").replace("<", "&lt;").replace("\n", " ")


def _md_value(value: Any) -> str:
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    return f"`{value!r}`"


def reference_markdown() -> str:
    """The field reference of docs/configuration.md (between ``<!-- fields:start -->`` and ``<!-- fields:end -->``):
    one table per section, every field with its type, default, allowed values and doc."""
    docs = _section_docs()
    preset = _preset_values(DEFAULT_PRESET)
    out = ["Generated from the field metadata in `src/interq/train/config.py` by "
           f"`{REGENERATE_COMMAND}`; do not edit by hand. *default* is the built-in value; the column "
           f"*{DEFAULT_PRESET}* shows the default preset's value where it sets another (`interq <command> --preset NAME "
           "--help-config` shows any preset's)."]
    by_section: dict[str, list[dict]] = {}
    for r in field_reference():
        by_section.setdefault(r["section"], []).append(r)
    for section, recs in by_section.items():
        out += ["", f"### `{section}`", "", docs.get(section, ""), "",
                f"| field | type | default | {DEFAULT_PRESET} | allowed | description |", "|---|---|---|---|---|---|"]
        out += [f"| `{r['name']}` | {r['type']} | {_md_value(r['default'])} | "
                f"{_md_value(preset[r['name']]) if r['name'] in preset and preset[r['name']] != r['default'] else ''} | "
                f"{_md(r['allowed'])} | {_md(r['doc'])} |" for r in recs]
    return "\n".join(out) + "\n"


REGENERATE_COMMAND = "python -m interq.train.config --write-reference docs/configuration.md"
REFERENCE_START, REFERENCE_END = "<!-- fields:start -->", "<!-- fields:end -->"


def with_reference(text: str | None) -> str:
    """``text`` (a docs/configuration.md, or None for none yet) with its field reference replaced by
    :func:`reference_markdown`; only what lies between the markers changes. A page without the markers gets them
    at its end; no page becomes a ``# Configuration`` page holding the reference."""
    block = f"{REFERENCE_START}\n{reference_markdown()}{REFERENCE_END}"
    if text is None:
        return f"# Configuration\n\n## Field reference\n\n{block}\n"
    start, end = text.find(REFERENCE_START), text.find(REFERENCE_END)
    if start < 0 or end < start:
        return text.rstrip("\n") + f"\n\n## Field reference\n\n{block}\n"
    return text[:start] + block + text[end + len(REFERENCE_END):]


def write_reference(path: str | Path) -> bool:
    """Rewrite the field reference of the page at ``path`` (created if missing); True when the file changed."""
    path = Path(path)
    old = path.read_text() if path.is_file() else None
    new = with_reference(old)
    if new != old:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(new)
    return new != old


__all__ = [
    "ARMS", "AlgoConfig", "Bounds", "ConfigError", "DEFAULT_PRESET", "NonFiniteTrainingError", "EnvConfig",
    "ModelConfig", "OptimConfig", "RolloutConfig", "RunConfig", "TrainConfig", "WarmStartConfig", "build_config",
    "choices", "config_help", "describe", "env_preset_for", "field_metadata", "field_reference", "from_dict",
    "load_config", "load_preset", "parse_overrides", "preset_names", "reference_markdown", "replace", "resolve_auto",
    "resolve_learner_attention", "resolve_learner_autocast", "save_config", "sections", "to_dict", "validate",
    "with_overrides", "with_reference", "write_reference",
]


def main(argv: list[str] | None = None) -> int:
    """``python -m interq.train.config --write-reference PATH`` rewrites PATH's field reference; ``--check PATH``
    exits 1 when it is not current."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m interq.train.config",
                                description="print the config field reference (markdown), or keep a page's current")
    p.add_argument("--write-reference", metavar="PATH", help="rewrite the field reference between the markers of PATH")
    p.add_argument("--check", metavar="PATH", help="exit 1 when PATH's field reference is not current")
    args = p.parse_args(argv)
    if args.write_reference:
        changed = write_reference(args.write_reference)
        print(f"{args.write_reference}: field reference {'rewritten' if changed else 'already current'}")
    elif args.check:
        path = Path(args.check)
        text = path.read_text() if path.is_file() else None
        if text is None or with_reference(text) != text:
            print(f"{path}: the field reference is not current; run {REGENERATE_COMMAND}", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(reference_markdown())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
