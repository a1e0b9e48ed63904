"""train.learner_autocast: the plain learner's forward under bf16 autocast, opt-in.

``off`` is the fp32 forward, bit for bit; the default ``auto`` resolves to ``bf16_backward`` on a CPU with native
bf16 and to ``off`` elsewhere (NUMERICS_VERSION 4), tested below with the machine's answer patched both ways. ``bf16`` keeps fp32 master weights, fp32 log-probs and fp32
gradients; its gradient on a tiny policy stays within 2% (relative L2) of the fp32 gradient, cosine > 0.999
(measured: 0.5% on the household tiny policy, 6% on SmolLM2-135M, an AMD EPYC with AVX-512, 2026-12-01).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from interq.quant.testing import tiny_causal_lm
from interq.rollout import sequence_logprobs
from interq.train.config import ConfigError, build_config
from interq.train.rl import learner_logprobs

GRAD_REL_L2_TOL = 0.02
COSINE_MIN = 0.999


def _micro_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 128, (4, 40), generator=g)  # [B, L]
    mask = torch.ones_like(ids)
    mask[2, 33:] = 0  # a right-padded row
    action = torch.zeros_like(ids, dtype=torch.bool)
    action[:, 10:16] = True
    action[:, 28:33] = True
    return {"input_ids": ids, "attention_mask": mask, "action_mask": action}, SimpleNamespace(temperature=1.0, top_p=1.0)


def _grad(model, mb, batch, autocast):
    model.zero_grad(set_to_none=True)
    lp = learner_logprobs(model, mb, batch, False, None, autocast)  # [B, L]
    adv = torch.linspace(-1, 1, lp.shape[0])[:, None]  # [B, 1]: a loss whose gradient depends on every row
    (-(lp * adv)[mb["action_mask"]].sum()).backward()
    g = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double()  # [P]
    return lp.detach(), g


def test_default_off_is_the_fp32_forward_bit_for_bit():
    model = tiny_causal_lm("qwen3").train()
    mb, batch = _micro_batch()
    got = learner_logprobs(model, mb, batch, False, None)
    ref = sequence_logprobs(model, mb["input_ids"], mb["attention_mask"], temperature=1.0, top_p=1.0,
                            score_mask=mb["action_mask"])
    assert got.dtype == torch.float32 and torch.equal(got, ref)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_bf16_autocast_gradient_is_close_to_fp32(kind):
    model = tiny_causal_lm(kind).train()
    mb, batch = _micro_batch(1)
    lp32, g32 = _grad(model, mb, batch, "off")
    lp16, g16 = _grad(model, mb, batch, "bf16")
    assert lp16.dtype == torch.float32 and all(p.dtype == torch.float32 for p in model.parameters())
    rel = float((g16 - g32).norm() / g32.norm())
    cos = float(torch.nn.functional.cosine_similarity(g16, g32, dim=0))
    assert 0 < rel < GRAD_REL_L2_TOL, f"bf16 autocast gradient relative L2 error {rel:.4f} (tolerance {GRAD_REL_L2_TOL})"
    assert cos > COSINE_MIN, f"gradient cosine {cos:.6f}"
    d = (lp16 - lp32)[mb["action_mask"] & mb["attention_mask"].bool()].abs()
    assert 0 < float(d.max()) < 0.05, f"log-prob |delta| max {float(d.max()):.4f}"


@pytest.mark.parametrize("native", [True, False])
def test_auto_resolves_by_the_machine_when_the_config_is_built(monkeypatch, native):
    import interq.machine as machine
    from interq.train import provenance
    from interq.train.config import RunConfig, resolve_learner_autocast, to_dict

    monkeypatch.setattr(machine, "bf16_native", lambda device=None: native)
    want = "bf16_backward" if native else "off"
    assert RunConfig().train.learner_autocast == "auto"
    assert build_config("q-tis", []).train.learner_autocast == want  # the stored config says what ran
    assert build_config("q-interq", ["train.device=auto"]).train.learner_autocast == (
        "off" if torch.cuda.is_available() else want)
    assert to_dict(build_config("bf16", []))["train"]["learner_autocast"] == want
    for explicit in ("off", "bf16_backward"):  # an explicit value is kept whatever the machine
        assert build_config("q-interq", [f"train.learner_autocast={explicit}"]).train.learner_autocast == explicit
    assert resolve_learner_autocast("auto", "cuda") == "off"  # unmeasured on GPUs (and none here: no error either)
    assert resolve_learner_autocast("bf16", "cpu") == "bf16"
    # a run of version 3 ran at its default, off: a report reads it across the moved default only where it moved
    assert provenance._defaults_of(3)["train.learner_autocast"] == "off"
    assert provenance._defaults_of(provenance.NUMERICS_VERSION)["train.learner_autocast"] == want
    assert provenance._moved("train.learner_autocast", "off", "bf16_backward", 3) is native


def test_auto_in_the_learner_context_follows_the_model_device(monkeypatch):
    import interq.machine as machine
    import interq.train.bf16_backward as bwd

    mb, batch = _micro_batch()
    model = tiny_causal_lm("llama")
    entered = []
    real = bwd.bf16_backward
    monkeypatch.setattr(bwd, "bf16_backward", lambda: (entered.append(1), real())[1])
    for native, times in ((False, 0), (True, 1)):
        monkeypatch.setattr(machine, "bf16_native", lambda device=None, n=native: n)
        lp = learner_logprobs(model, mb, batch, False, None, "auto")
        assert len(entered) == times and torch.equal(lp, learner_logprobs(model, mb, batch, False, None, "off"))


def test_learner_autocast_is_validated_naming_the_field():
    assert build_config("q-tis", ["train.learner_autocast=bf16"]).train.learner_autocast == "bf16"
    with pytest.raises(ConfigError, match=r"train\.learner_autocast='fp16' is not accepted; choose one of \['auto', 'off', 'bf16', 'bf16_backward'\]"):
        build_config("q-tis", ["train.learner_autocast=fp16"])
    with pytest.raises(ConfigError, match=r"train\.learner_autocast='bf16' is not accepted with algo\.align=true"):
        build_config("q-align", ["train.learner_autocast=bf16"])
    mb, batch = _micro_batch()
    with pytest.raises(ValueError, match="train.learner_autocast='fp16'"):
        learner_logprobs(tiny_causal_lm("llama"), mb, batch, False, None, "fp16")


def test_yaml_words_off_on_yes_no_stay_strings_where_a_string_is_wanted(tmp_path):
    from interq.train.config import load_config, save_config

    # YAML 1.1 reads off/on/yes/no as booleans: the config's loader keeps them words; bool fields still take them
    cfg = build_config("q-interq", ["train.learner_autocast=off", "train.progress=off", "train.tensorboard=yes"])
    assert (cfg.train.learner_autocast, cfg.train.progress, cfg.train.tensorboard) == ("off", False, True)
    path = tmp_path / "run.yaml"
    save_config(cfg, path)
    assert load_config(path) == cfg
    path.write_text(path.read_text().replace("learner_autocast: 'off'", "learner_autocast: off"))
    assert "learner_autocast: off" in path.read_text() and load_config(path).train.learner_autocast == "off"
    with pytest.raises(ConfigError, match=r"train\.progress: expected true or false, got 'maybe'"):
        build_config("q-interq", ["train.progress=maybe"])
