"""Typed, frozen run configuration: one dataclass per component, YAML presets, ``key.sub=value`` overrides.

Every default is defined once, here. Batch sizes carry their unit in the name (``tasks_per_step``,
``episodes_per_task``, ``tokens_per_microbatch``). :func:`validate` checks the whole config before any work
starts and raises :class:`ConfigError` naming the field, the value and what is allowed.

The five arms of ``interq-spec.md`` §4 are presets (``src/interq/presets/<arm>.yaml``) over these defaults:

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
import typing
from dataclasses import dataclass, field, fields, is_dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

CORRECTIONS = ("none", "tis", "icepop", "seq_is", "geo_mask", "prefix_is", "interq", "interq_uniform")
ADVANTAGES = ("grpo", "gigpo")
LAYOUTS = ("concatenated", "per_turn")
LOSS_AGGS = ("token_mean", "seq_mean_token_mean")
EXECUTORS = ("bf16", "fp32", "w8a8")
LEARNER_AUTOCASTS = ("auto", "off", "bf16", "bf16_backward")  # train.learner_autocast (auto: resolve_learner_autocast)
LEARNER_GEMMS = ("torch", "onednn")  # train.learner_gemm
LEARNER_ATTENTIONS = ("auto", "sdpa", "kernel")  # train.learner_attention (auto: resolve_learner_attention)
ATTENTIONS = ("sdpa", "sdpa_packed", "packed_kernel")  # = interq.rollout.attention.ATTENTION_CHOICES (tested), kept here torch-free
ARCHS = ("qwen3", "qwen3_moe")
DTYPES = ("float32", "bfloat16")
ARMS = ("bf16", "q-naive", "q-tis", "q-align", "q-interq")
ACTION_FORMATS = ("text", "index", "auto")
PROMPTS = ("compact", "verl_agent", "auto")
ARM_BASE = "household"  # the preset the arm presets build on; ``env.name=<env>`` puts them on ``<env>.yaml`` instead


class ConfigError(ValueError):
    """An invalid configuration value; the message names the field and what is accepted."""


class NonFiniteTrainingError(RuntimeError):
    """``optim.max_nonfinite_steps`` RL steps in a row had a non-finite loss or gradient (each update was skipped,
    so the weights are those of the last good step)."""


@dataclass(frozen=True)
class ModelConfig:
    """The policy. ``source="tiny"`` builds a small Qwen3 / Qwen3-MoE from the fields below and a tokenizer
    trained on environment text; any other value is a checkpoint directory (safetensors + tokenizer.json),
    or ``smollm2`` for the offline SmolLM2-135M-Instruct."""

    source: str = "tiny"
    arch: str = "qwen3"                 # qwen3 | qwen3_moe (tiny only)
    vocab_size: int = 768               # target size of the trained tokenizer (tiny only)
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 192
    num_experts: int = 4                # qwen3_moe only
    num_experts_per_tok: int = 2        # qwen3_moe only
    moe_intermediate_size: int = 96     # qwen3_moe only
    max_position_embeddings: int = 4096
    dtype: str = "float32"              # learner master weights and forward compute dtype


@dataclass(frozen=True)
class EnvConfig:
    name: str = "household"
    train_split: str = "train"
    eval_split: str = "valid_unseen"
    num_train_tasks: int = 64           # task instances RL samples from (0: all of the split)
    num_eval_tasks: int = 32            # held-out tasks evaluated every eval_every_steps
    task_types: str = ""                # comma-separated task types to keep (empty: all), e.g. pick_and_place
    max_turns: int = 12                 # environment step limit per episode (truncation)
    show_admissible: bool = True        # list the admissible actions in every observation
    action_format: str = "text"         # text: the agent writes the action; index: its number in the listed actions; auto: text for a pretrained model.source, index for tiny (resolved when the config is built)
    prompt: str = "compact"             # compact: interq.agent.loop.make_render (a tiny policy); verl_agent: interq.envs.prompting.build_prompt (a chat model; text actions in <action> tags); auto: verl_agent for a pretrained model.source, compact for tiny
    invalid_action_penalty: float = 0.1  # spec §6
    env_kwargs: dict = field(default_factory=dict)  # extra keyword arguments for make_env
    num_workers: int = 0                # 0: environments in the trainer's process, stepped one by one; N > 0: an EnvPool of N worker processes stepping a step's episodes in parallel (in waves of N; a crashed or hung worker costs only its episode)
    overlap: bool = False               # num_workers >= 2: play each wave in two halves, one generating while the other's environments step in the workers (slow engines: the env time hides behind generation; generation runs at half the batch); the same episodes as without it
    step_timeout_s: float = 300.0       # num_workers > 0: a worker that does not answer a step (or reset) within this many seconds is killed and its episode recorded as failed


@dataclass(frozen=True)
class WarmStartConfig:
    """Supervised fine-tuning on expert demonstrations. ``noise`` (share of random admissible actions in
    the demos), ``num_demos`` and ``steps`` set how good the starting policy is (RL needs room).
    ``observation_weight``: weight of the language-modelling loss on observation tokens next to the action
    loss (0: classic action-only SFT, for a pretrained checkpoint; a tiny policy trained from scratch
    needs it, see :mod:`interq.train.sft`)."""

    enabled: bool = True
    num_demos: int = 256
    noise: float = 0.2
    steps: int = 300
    lr: float = 3e-3
    observation_weight: float = 0.0
    episodes_per_microbatch: int = 16
    seed: int = 0


@dataclass(frozen=True)
class RolloutConfig:
    executor: str = "bf16"              # bf16 | fp32 | w8a8 (the behaviour policy's numerics)
    executor_dtype: str = "bfloat16"    # w8a8 only: compute dtype between the int8 GEMMs (engines use bf16)
    weight_format: str = "int8"         # w8a8 only: passed to interq.quant.QuantConfig
    kv_format: str = "int8_per_token_head"  # w8a8 only
    # Integer widths in [4, 8] (w8a8 only; all 8 = W8A8-KV8). Lower-precision rollouts that exist in practice:
    # 4-bit weights as in W4A8 / W4A16 serving (w_bits=4), a 4-bit KV cache (kv_bits=4); and the stress setting
    # of the comparison study (W4A4-KV4). Symmetric, qmax = 2**(bits-1) - 1, same int8 kernels and exact int32
    # accumulation, codes not packed (interq.quant.QuantConfig).
    w_bits: int = 8                     # weights; needs weight_format=int8 below 8
    a_bits: int = 8                     # activations of the int8 GEMMs; needs weight_format=int8 below 8
    kv_bits: int = 8                    # K/V cache; needs kv_format=int8_per_token_head below 8
    temperature: float = 1.0
    top_p: float = 1.0
    # sdpa_packed (default since NUMERICS_VERSION 2): a single query token always attends with its KV head's query
    # heads packed (interq.rollout.attention): the same kernel path whatever the batch's padding; for GQA models
    # where no row is padded, decode attention 3.3-6.1x faster in bf16 on CPU (docs/benchmarks.md, "decode
    # attention"). sdpa: transformers' attention as it comes (the numerics of the study's runs, version 1).
    # packed_kernel (opt-in): sdpa_packed with one-token decode attention by interq's CPU kernel, 2.5-3.2x faster
    # than torch's flash kernel there, fp32 inside, not the same bits (interq.rollout.attention).
    attention: str = "sdpa_packed"
    max_action_tokens: int = 12
    max_context_tokens: int = 2048      # reaching it truncates the episode
    history_turns: int = 0              # per_turn layout: earlier (observation, action) pairs re-rendered in each prompt (0: none, the task and the current observation only, as verl-agent's history_length=0)


@dataclass(frozen=True)
class AlgoConfig:
    correction: str = "tis"
    align: bool = False                 # learner forward quantized like the executor (STE)
    layout: str = "concatenated"        # concatenated (one row per episode) | per_turn (one row per turn)
    advantage: str = "grpo"
    grpo_std: bool = True
    gigpo_gamma: float = 0.95
    gigpo_omega: float = 1.0
    budget: float = 0.5                 # InterQ displacement budget B (nats)
    tis_cap: float = 2.0
    icepop_low: float = 0.5
    icepop_high: float = 2.0
    geo_low: float = 0.9
    geo_high: float = 1.1
    prefix_cap: float = 2.0
    normalize: bool = False
    token_correction: bool = True       # false: the methods' token factor is 1 (e.g. interq = exp(Lambda) alone; spec §3)
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    loss_agg: str = "token_mean"        # token_mean | seq_mean_token_mean (a sequence = one trajectory, in both layouts)
    ppo_epochs: int = 1
    minibatches_per_step: int = 1


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-3
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0
    max_nonfinite_steps: int = 3        # a non-finite loss or gradient skips the optimizer step; this many in a row stop the run


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 20
    tasks_per_step: int = 4
    episodes_per_task: int = 4          # GRPO group size G
    tokens_per_microbatch: int = 4096   # gradient accumulation unit (rows packed up to this many tokens)
    eval_every_steps: int = 5
    eval_episodes_per_task: int = 1
    eval_temperature: float = 1.0
    checkpoint_every_steps: int = 5
    seed: int = 0
    threads: int = 0                    # torch.set_num_threads (0: leave alone)
    device: str = "cpu"                 # learner + executor: cpu | cuda | auto (cuda when a GPU is visible); warm start stays on cpu
    gradient_checkpointing: bool = False  # recompute each decoder layer's activations in the backward instead of keeping them (transformers' non-reentrant checkpointing): much less learner memory for about one more forward per micro-batch; the same gradients
    learner_autocast: str = "auto"      # auto | off | bf16 | bf16_backward. auto (default since NUMERICS_VERSION 4): bf16_backward on a CPU learner where bf16 is native (AVX512_BF16 / AMX), else off; resolved when the config is built (resolve_learner_autocast). bf16: plain learner's forward under torch.autocast(bf16), fp32 master weights (not with algo.align); bf16_backward: fp32 forward (the same log-probs), the linear layers' backward GEMMs in bf16 (any learner; interq.train.bf16_backward)
    learner_gemm: str = "torch"         # torch | onednn: the library of the learner's fp32 CPU GEMMs (linear layers, forward and backward). onednn: 2.1-2.5x torch's MKL on AMD CPUs (AVX-512), the same fp32 arithmetic summed in another order (log-probs and gradients differ by rounding; interq.train.onednn_gemm)
    learner_attention: str = "auto"     # auto | sdpa | kernel: the learner's causal self-attention (forward and backward). sdpa: transformers' (torch's CPU flash kernel); kernel: interq's CPU kernel, fp32, 2.2-2.6x torch's (forward and backward) at 300-1,760 tokens on AMD EPYCs with AVX-512, 1.14-1.28x at 300-2,500 on an AVX2-only EPYC (0.71-0.79x on an Intel Xeon), the same function to rounding (interq.train.learner_attention); auto (default since NUMERICS_VERSION 4): kernel for a CPU learner where interq's CPU kernels load on a CPU with AVX-512 or AVX2 + FMA, else sdpa, and sdpa on Intel CPUs (since the seventeenth session: the kernel was slower there; CPUs without AVX-512 took sdpa in the twenty-third session only); resolved when the config is built
    progress: bool = True
    tensorboard: bool = False


@dataclass(frozen=True)
class RunConfig:
    name: str = "run"
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


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
    (AVX512_BF16 / AMX: the backward's GEMMs 1.5-2x fp32 there, docs/benchmarks.md), ``off`` elsewhere: CPUs that
    emulate bf16, and CUDA (unmeasured there; ``train.learner_autocast=bf16_backward`` asks for it). Other values
    pass through. ``device``: ``train.device`` (``auto`` is resolved here too)."""
    if value != "auto":
        return value
    from interq.machine import bf16_native

    return "bf16_backward" if _learner_on_cpu(device) and bf16_native("cpu") else "off"


def resolve_learner_attention(value: str, device: str = "cpu") -> str:
    """``train.learner_attention=auto`` -> ``kernel`` for a CPU learner where interq's CPU kernels load (built
    once per machine, :mod:`interq.quant.kernels`; ``INTERQ_CPU_KERNELS=0`` turns them off) on a CPU with AVX-512, or
    with AVX2 and FMA, that is not an Intel one, ``sdpa`` elsewhere (CUDA, no C++ compiler, Intel CPUs, CPUs with
    neither). The kernel's forward and backward were 2.2-2.6x torch's CPU flash kernel on AMD EPYCs with AVX-512
    (Zen 5) at 300-1,760 tokens, but 0.71-0.79x on an Intel Xeon with AMX at 1,040-1,760 (docs/benchmarks.md,
    seventeenth session): torch's flash kernel multiplies its blocks with MKL's fp32 GEMMs, fast on Intel and slow on
    AMD (likely; not profiled). On an AVX2-only AMD EPYC (Zen 3) it is 1.14-1.28x torch's at 300-2,500 tokens with
    the twenty-fourth session's AVX2 tiles (0.75-0.79x before them, when ``auto`` chose ``sdpa`` there; 1/20 before
    the twenty-third session's fix of its AVX2 build). Other values pass through."""
    if value != "auto":
        return value
    if not _learner_on_cpu(device):
        return "sdpa"
    from interq.machine import cpu_has, cpu_vendor

    if cpu_vendor() == "GenuineIntel" or not (cpu_has("avx512f") or (cpu_has("avx2") and cpu_has("fma"))):
        return "sdpa"
    from interq.quant import kernels

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
    data: dict = load_preset(preset, rebase={ARM_BASE: target} if target else None) if preset else {}
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


def _one_of(path: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(f"{path}={value!r} is not accepted; choose one of {list(allowed)}")


def _positive(path: str, value: float, allow_zero: bool = False, allow_inf: bool = False) -> None:
    """``value`` > 0 (or >= 0), not NaN, and finite unless ``allow_inf`` (a cap or budget where inf means "none")."""
    ok = value >= 0 if allow_zero else value > 0
    if not ok or (isinstance(value, float) and math.isnan(value)):
        raise ConfigError(f"{path}={value!r} is not accepted; it must be {'>= 0' if allow_zero else '> 0'}")
    if not allow_inf and isinstance(value, float) and math.isinf(value):
        raise ConfigError(f"{path}={value!r} is not accepted; it must be a finite number")


def _in_range(path: str, value: float, lo: float, hi: float) -> None:
    if not (lo <= value <= hi):
        raise ConfigError(f"{path}={value!r} is not accepted; it must be in [{lo}, {hi}]")


def validate(cfg: RunConfig) -> None:
    """Raise ConfigError on the first invalid field (before any work starts)."""
    m = cfg.model
    if m.source == "tiny":
        _one_of("model.arch", m.arch, ARCHS)
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim",
                     "intermediate_size", "max_position_embeddings"):
            _positive(f"model.{name}", getattr(m, name))
        if m.vocab_size < 300:
            raise ConfigError(f"model.vocab_size={m.vocab_size} is not accepted; it must be >= 300 "
                              "(the byte-level alphabet takes 256 entries before any merge)")
        if m.num_heads % m.num_kv_heads:
            raise ConfigError(f"model.num_kv_heads={m.num_kv_heads} must divide model.num_heads={m.num_heads}")
        if m.arch == "qwen3_moe":
            _positive("model.num_experts", m.num_experts)
            _positive("model.moe_intermediate_size", m.moe_intermediate_size)
            if not 1 <= m.num_experts_per_tok <= m.num_experts:
                raise ConfigError(f"model.num_experts_per_tok={m.num_experts_per_tok} must be in [1, model.num_experts={m.num_experts}]")
    elif m.source != "smollm2" and not Path(m.source).is_dir():
        raise ConfigError(f"model.source={m.source!r} is not accepted; use 'tiny', 'smollm2' or an existing checkpoint directory")
    _one_of("model.dtype", m.dtype, DTYPES)

    e = cfg.env
    if not e.name:
        raise ConfigError("env.name must not be empty (e.g. household)")
    _positive("env.num_train_tasks", e.num_train_tasks, allow_zero=True)
    _positive("env.num_eval_tasks", e.num_eval_tasks, allow_zero=True)
    _positive("env.max_turns", e.max_turns)
    _one_of("env.action_format", e.action_format, ACTION_FORMATS)
    if e.action_format == "index" and not e.show_admissible:
        raise ConfigError("env.action_format='index' needs env.show_admissible=true (the agent picks from the listed actions)")
    _one_of("env.prompt", e.prompt, PROMPTS)
    if e.prompt == "verl_agent" and e.action_format == "index":
        raise ConfigError("env.prompt='verl_agent' needs env.action_format='text' (its answer is the action text in "
                          "<action> tags); use env.prompt='compact' for index answers")
    _positive("env.invalid_action_penalty", e.invalid_action_penalty, allow_zero=True)
    if isinstance(e.num_workers, bool) or not isinstance(e.num_workers, int) or e.num_workers < 0:
        raise ConfigError(f"env.num_workers={e.num_workers!r} is not accepted; it must be an integer >= 0 "
                          "(0: in-process, N: an EnvPool of N worker processes)")
    _positive("env.step_timeout_s", e.step_timeout_s)
    if not isinstance(e.overlap, bool):
        raise ConfigError(f"env.overlap={e.overlap!r} is not accepted; it must be true or false")
    if e.overlap and e.num_workers < 2:
        raise ConfigError(f"env.overlap=true needs env.num_workers >= 2 (got {e.num_workers}): the environments of one "
                          "half of the episodes step in worker processes while the other half generates")

    w = cfg.warm_start
    _positive("warm_start.num_demos", w.num_demos, allow_zero=not w.enabled)
    _in_range("warm_start.noise", w.noise, 0.0, 1.0)
    _positive("warm_start.steps", w.steps, allow_zero=True)
    _positive("warm_start.lr", w.lr)
    _positive("warm_start.observation_weight", w.observation_weight, allow_zero=True)
    _positive("warm_start.episodes_per_microbatch", w.episodes_per_microbatch)

    r = cfg.rollout
    _one_of("rollout.executor", r.executor, EXECUTORS)
    _one_of("rollout.attention", r.attention, ATTENTIONS)
    _one_of("rollout.executor_dtype", r.executor_dtype, DTYPES)
    _one_of("rollout.weight_format", r.weight_format, ("int8", "fp8_e4m3"))
    _one_of("rollout.kv_format", r.kv_format, ("none", "int8_per_token_head", "fp8_per_token_head", "fp8_tensor"))
    for name, needs, fmt in (("w_bits", "weight_format", "int8"), ("a_bits", "weight_format", "int8"),
                             ("kv_bits", "kv_format", "int8_per_token_head")):
        bits = getattr(r, name)
        if isinstance(bits, bool) or not isinstance(bits, int) or not 4 <= bits <= 8:
            raise ConfigError(f"rollout.{name}={bits!r} is not accepted; it must be an integer in [4, 8]")
        if bits != 8 and r.executor != "w8a8":
            raise ConfigError(f"rollout.{name}={bits} needs rollout.executor='w8a8' (got {r.executor!r}); "
                              f"with another executor it must be 8")
        if bits != 8 and getattr(r, needs) != fmt:
            raise ConfigError(f"rollout.{name}={bits} needs rollout.{needs}={fmt!r} (got {getattr(r, needs)!r}); "
                              f"an fp8 or unquantized format has no integer width, it must be 8")
    _positive("rollout.temperature", r.temperature)
    if not 0 < r.top_p <= 1:
        raise ConfigError(f"rollout.top_p={r.top_p!r} is not accepted; it must be in (0, 1]")
    _positive("rollout.max_action_tokens", r.max_action_tokens)
    _positive("rollout.max_context_tokens", r.max_context_tokens)
    _positive("rollout.history_turns", r.history_turns, allow_zero=True)
    if r.max_context_tokens <= r.max_action_tokens:
        raise ConfigError(f"rollout.max_context_tokens={r.max_context_tokens} must exceed rollout.max_action_tokens={r.max_action_tokens}")

    a = cfg.algo
    _one_of("algo.correction", a.correction, CORRECTIONS)
    _one_of("algo.layout", a.layout, LAYOUTS)
    _one_of("algo.advantage", a.advantage, ADVANTAGES)
    _one_of("algo.loss_agg", a.loss_agg, LOSS_AGGS)
    _positive("algo.budget", a.budget, allow_zero=True, allow_inf=True)  # inf: no bound (raw prefix)
    _positive("algo.tis_cap", a.tis_cap, allow_inf=True)
    _positive("algo.prefix_cap", a.prefix_cap, allow_inf=True)
    _in_range("algo.gigpo_gamma", a.gigpo_gamma, 0.0, 1.0)
    _positive("algo.gigpo_omega", a.gigpo_omega, allow_zero=True)
    for lo, hi in (("icepop_low", "icepop_high"), ("geo_low", "geo_high")):
        if not 0 < getattr(a, lo) <= getattr(a, hi):
            raise ConfigError(f"algo.{lo}={getattr(a, lo)} and algo.{hi}={getattr(a, hi)}: need 0 < low <= high")
    _in_range("algo.clip_eps_low", a.clip_eps_low, 0.0, 1.0)
    _positive("algo.clip_eps_high", a.clip_eps_high, allow_zero=True, allow_inf=True)
    _positive("algo.ppo_epochs", a.ppo_epochs)
    _positive("algo.minibatches_per_step", a.minibatches_per_step)
    if a.align and r.executor != "w8a8":
        raise ConfigError(f"algo.align=true needs rollout.executor='w8a8' (got {r.executor!r}): alignment quantizes the learner like the executor")

    o = cfg.optim
    _positive("optim.lr", o.lr)
    _positive("optim.weight_decay", o.weight_decay, allow_zero=True)
    _in_range("optim.beta1", o.beta1, 0.0, 0.999999)
    _in_range("optim.beta2", o.beta2, 0.0, 0.999999)
    _positive("optim.grad_clip", o.grad_clip, allow_zero=True)  # 0: no clipping
    _positive("optim.max_nonfinite_steps", o.max_nonfinite_steps)

    t = cfg.train
    _positive("train.steps", t.steps, allow_zero=True)
    _positive("train.tasks_per_step", t.tasks_per_step)
    _positive("train.episodes_per_task", t.episodes_per_task)
    if a.advantage in ("grpo", "gigpo") and t.episodes_per_task < 2:
        raise ConfigError(f"train.episodes_per_task={t.episodes_per_task} is not accepted with algo.advantage={a.advantage!r}: a group needs >= 2 episodes")
    _positive("train.tokens_per_microbatch", t.tokens_per_microbatch)
    _positive("train.eval_every_steps", t.eval_every_steps, allow_zero=True)
    _positive("train.eval_episodes_per_task", t.eval_episodes_per_task)
    _positive("train.eval_temperature", t.eval_temperature, allow_zero=True)  # 0: greedy
    _positive("train.checkpoint_every_steps", t.checkpoint_every_steps, allow_zero=True)
    _positive("train.threads", t.threads, allow_zero=True)
    _one_of("train.device", t.device, ("cpu", "cuda", "auto"))
    if t.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"train.device='cuda' is not accepted here: torch {torch.__version__} sees no CUDA GPU; "
                              "choose one of ['cpu', 'auto']")
    if not isinstance(t.gradient_checkpointing, bool):
        raise ConfigError(f"train.gradient_checkpointing={t.gradient_checkpointing!r} is not accepted; it must be true or false")
    _one_of("train.learner_autocast", t.learner_autocast, LEARNER_AUTOCASTS)
    if t.learner_autocast == "bf16" and a.align:
        raise ConfigError("train.learner_autocast='bf16' is not accepted with algo.align=true: bf16 upstream of the "
                          "aligned learner's activation quantization re-rounds its codes (SmolLM2: gradient cosine 0.78 "
                          "to fp32, docs/benchmarks.md); choose train.learner_autocast='off' or 'bf16_backward'")
    _one_of("train.learner_gemm", t.learner_gemm, LEARNER_GEMMS)
    if t.learner_gemm == "onednn" and t.learner_autocast == "bf16":
        raise ConfigError("train.learner_gemm='onednn' is not accepted with train.learner_autocast='bf16' (autocast "
                          "runs the forward's GEMMs in bf16, torch's oneDNN ones already); choose train.learner_gemm="
                          "'torch', or train.learner_autocast='off' or 'bf16_backward'")
    _one_of("train.learner_attention", t.learner_attention, LEARNER_ATTENTIONS)
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


def describe(cls: type = RunConfig, prefix: str = "") -> list[tuple[str, str, Any]]:
    """(dotted name, type, default) of every field: the text of ``interq train --help-config``."""
    out = []
    default = cls()
    hints = typing.get_type_hints(cls)
    for f in fields(cls):
        name = f"{prefix}{f.name}"
        val = getattr(default, f.name)
        if is_dataclass(val):
            out.extend(describe(type(val), name + "."))
        else:
            tp = hints[f.name]
            out.append((name, getattr(tp, "__name__", str(tp)), val))
    return out


__all__ = [
    "ARMS", "AlgoConfig", "ConfigError", "NonFiniteTrainingError", "EnvConfig", "ModelConfig", "OptimConfig", "RolloutConfig",
    "RunConfig", "TrainConfig", "WarmStartConfig", "build_config", "describe", "env_preset_for", "from_dict",
    "load_config", "load_preset", "parse_overrides", "preset_names", "replace", "resolve_auto", "resolve_learner_attention", "resolve_learner_autocast", "save_config", "to_dict", "validate",
    "with_overrides",
]
