"""GPU readiness: the executor, engine and learner on CUDA.

Two parts:

* device logic that is testable without a GPU (always run): ``_int_mm``'s CUDA shape rules as a pure padding
  function, and the padded product equal to the unpadded one exactly, with the CUDA padding forced on the CPU;
* ``@pytest.mark.cuda`` tests that need a CUDA GPU and skip on CPU-only machines with a reason that is not an
  environment-engine skip (``INTERQ_REQUIRE_ENGINES`` leaves them skipped; see tests/conftest.py). Run them with
  ``scripts/gpu_check.sh`` (or ``pytest -m cuda tests/test_cuda.py`` on a machine with a GPU).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from interq.quant import QuantConfig, QuantLinear, aligned, make_executor, make_kv_cache
from interq.quant.linear import (INT_MM_CUDA_MIN_M, int8_linear, int_mm_fp32_exact, int_mm_padded, int_mm_padding,
                                 resolve_int8_backend)
from interq.quant.testing import tiny_causal_lm

HAS_CUDA = torch.cuda.is_available()
NO_GPU_REASON = "no CUDA GPU visible to torch (GPU test; run scripts/gpu_check.sh on a machine with one)"
cuda = pytest.mark.cuda
needs_gpu = pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU_REASON)


# ------------------------------------------------------------------------------------ CPU: the device logic


@pytest.mark.parametrize("m,k,n,min_m,expected", [
    (1, 8, 8, 17, (16, 0, 0)),      # decode at batch 1 on CUDA: 16 zero rows
    (16, 576, 1536, 17, (1, 0, 0)),  # M == 16 is not enough on CUDA
    (17, 576, 192, 17, (0, 0, 0)),
    (5, 20, 12, 17, (12, 4, 4)),
    (5, 20, 12, 1, (0, 4, 4)),       # CPU: any M
    (40, 7, 3, 1, (0, 1, 5)),
])
def test_int_mm_padding_follows_the_cuda_shape_rules(m, k, n, min_m, expected):
    pm, pk, pn = int_mm_padding(m, k, n, min_m)
    assert (pm, pk, pn) == expected
    assert m + pm >= min_m and (k + pk) % 8 == 0 and (n + pn) % 8 == 0


def test_int_mm_padding_rejects_bad_shapes_naming_the_argument():
    with pytest.raises(ValueError, match="int_mm_padding: k must be an int >= 1, got 0"):
        int_mm_padding(4, 0, 8)
    with pytest.raises(ValueError, match="min_m"):
        int_mm_padding(4, 8, 8, min_m=0)


@pytest.mark.parametrize("m,k,n", [(1, 8, 8), (3, 20, 12), (16, 64, 40), (17, 576, 24), (2, 7, 3)])
def test_cuda_padding_forced_on_cpu_gives_the_exact_unpadded_product(m, k, n):
    g = torch.Generator().manual_seed(m * 1000 + k + n)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (k, n), dtype=torch.int8, generator=g)
    ref = a.long() @ b.long()  # [M, N] exact
    cuda_rules = int_mm_padded(a, b, min_m=INT_MM_CUDA_MIN_M)  # the padding CUDA needs, run on the CPU
    assert cuda_rules.dtype == torch.int32 and cuda_rules.shape == (m, n)
    assert torch.equal(cuda_rules.long(), ref)
    assert torch.equal(int_mm_padded(a, b).long(), ref)


@pytest.mark.parametrize("k", [20, 64])
def test_int8_linear_with_k_not_a_multiple_of_8_is_bit_identical_across_backends(k):
    """The int_mm backend pads the activation codes to the weight's padded K (it used to raise for K % 8 != 0)."""
    torch.manual_seed(3)
    lin = nn.Linear(k, 12)
    x = torch.randn(5, k)
    ys = [QuantLinear(lin, QuantConfig(), int8_backend=b)(x) for b in ("int_mm", "fp32_exact")]
    assert torch.equal(ys[0], ys[1])


def test_auto_backend_is_int_mm_on_cuda():
    assert resolve_int8_backend("auto", torch.device("cuda")) == "int_mm"


def test_gpu_skips_are_not_environment_engine_skips():
    """INTERQ_REQUIRE_ENGINES turns engine skips into failures; the GPU tests' skip reason must not look like one."""
    from conftest import _ENGINE_SKIP  # tests/conftest.py

    assert not _ENGINE_SKIP.search(NO_GPU_REASON)


# ------------------------------------------------------------------------------------ CUDA


def _gpu_and_cpu_linear(k: int, n: int, bias: bool):
    torch.manual_seed(1)
    lin = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        lin.weight.normal_(0, 0.05)
    return lin


@cuda
@needs_gpu
@pytest.mark.parametrize("m,k,n", [(1, 64, 40), (16, 576, 192), (17, 576, 1536), (33, 20, 12)])
def test_int_mm_on_cuda_is_exact_for_every_m(m, k, n):
    g = torch.Generator().manual_seed(7)
    a = torch.randint(-128, 128, (m, k), dtype=torch.int8, generator=g)
    b = torch.randint(-128, 128, (k, n), dtype=torch.int8, generator=g)
    ref = (a.long() @ b.long()).cuda()
    out = int_mm_padded(a.cuda(), b.cuda())
    assert out.is_cuda and out.shape == (m, n)
    assert torch.equal(out.long(), ref)
    assert torch.equal(int_mm_fp32_exact(a.cuda(), b.float().cuda()).long(), ref)


@cuda
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 16, 17, 40])
def test_quant_linear_on_cuda_matches_cpu(dtype, m):
    """Exact int32 accumulators and the same epilogue: the CUDA executor's linear equals the CPU one."""
    lin = _gpu_and_cpu_linear(64, 40, bias=True)
    x = torch.randn(m, 64).to(dtype)
    cpu = QuantLinear(lin, QuantConfig(), int8_backend="int_mm")(x)
    q_gpu = QuantLinear(lin.cuda(), QuantConfig())
    assert q_gpu.int8_backend == "int_mm" and q_gpu.weight_q.is_cuda
    gpu = q_gpu(x.cuda())
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-6, atol=1e-7)
    acc_gpu = int8_linear(x.cuda().float(), q_gpu.weight_q, torch.ones(40, device="cuda"), 40, None, "half_even",
                          torch.float32)
    acc_cpu = int8_linear(x.float(), q_gpu.weight_q.cpu(), torch.ones(40), 40, None, "half_even", torch.float32)
    torch.testing.assert_close(acc_gpu.cpu(), acc_cpu, rtol=0, atol=0)


@cuda
@needs_gpu
def test_fp8_executor_linear_on_cuda_is_finite_and_matches_cpu():
    lin = _gpu_and_cpu_linear(64, 40, bias=False)
    qcfg = QuantConfig(w_format="fp8_e4m3", w_granularity="channel")
    x = torch.randn(9, 64) * 1e3  # large values: clamped before the e4m3 cast (CUDA would give NaN otherwise)
    cpu = QuantLinear(lin, qcfg)(x)
    gpu = QuantLinear(lin.cuda(), qcfg)(x.cuda())
    assert torch.isfinite(gpu).all()
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-6, atol=1e-6)


@cuda
@needs_gpu
@pytest.mark.parametrize("storage", ["codes", "dequantized"])
@pytest.mark.parametrize("kind", ["llama", "qwen3", "qwen3_moe"])
def test_executor_forward_and_kv_cache_on_cuda(kind, storage):
    model = tiny_causal_lm(kind, dtype=torch.bfloat16).cuda()
    qcfg = QuantConfig()
    exe = make_executor(model, qcfg)
    ids = torch.randint(0, 128, (3, 12), device="cuda")
    cache = make_kv_cache(qcfg, exe.config, storage=storage)
    with torch.no_grad():
        out = exe(input_ids=ids, cache=cache, use_cache=True)
        step = exe(input_ids=ids[:, -1:], cache=out.cache, use_cache=True)
    assert step.logits.is_cuda and torch.isfinite(step.logits.float()).all()
    layer = cache.layers[0]
    code = torch.int8 if storage == "codes" else torch.bfloat16  # "dequantized": what attention reads
    assert layer.keys.is_cuda and layer.keys.dtype == code and layer.keys.shape[-2] == 13
    # the CPU executor on the same weights: same tokens' log-probs within bf16 noise
    exe_cpu = make_executor(model.cpu(), qcfg)
    with torch.no_grad():
        ref = exe_cpu(input_ids=ids.cpu()).logits.float().log_softmax(-1)
    got = out.logits.float().log_softmax(-1).cpu()
    assert (got - ref).abs().mean() < 0.05


@cuda
@needs_gpu
def test_rollout_engine_on_cuda_quantized_and_bf16():
    from interq.rollout import RolloutEngine, SamplingParams

    model = tiny_causal_lm("qwen3", dtype=torch.bfloat16).cuda()
    qcfg = QuantConfig()
    engines = {"w8a8": RolloutEngine(make_executor(model, qcfg), cache_factory=lambda c: make_kv_cache(qcfg, c)),
               "bf16": RolloutEngine(model)}
    for name, engine in engines.items():
        batch = engine.new_batch([1, 2, 3], SamplingParams(max_action_tokens=4))
        for turn in range(2):
            res = batch.step({i: [5 + i, 6, 7 + turn] for i in batch.live})
            assert all(len(r.action_ids) == 4 for r in res.values()), name
        trajs = batch.close()
        for t in trajs:
            lp = t.behavior_logprobs[t.action_mask]
            assert lp.numel() == 8 and torch.isfinite(lp).all() and (lp <= 0).all(), name


@cuda
@needs_gpu
@pytest.mark.parametrize("autocast", [False, True])
def test_aligned_learner_backward_on_cuda(autocast):
    from interq.rollout import sequence_logprobs

    model = tiny_causal_lm("qwen3").cuda().train()
    ids = torch.randint(0, 128, (2, 24), device="cuda")
    ctx = torch.autocast("cuda", dtype=torch.bfloat16) if autocast else torch.autocast("cuda", enabled=False)
    with ctx, aligned(model, QuantConfig()):
        lp = sequence_logprobs(model, ids)
    lp.sum().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and g.is_cuda and torch.isfinite(g).all() for g in grads)


# ------------------------------------------------------------------------------------ the trainer's device


def test_train_device_is_validated_naming_the_field():
    from interq.train.config import ConfigError, build_config

    with pytest.raises(ConfigError, match=r"train\.device='gpu' is not accepted; choose one of \['cpu', 'cuda', 'auto'\]"):
        build_config("q-tis", ["train.device=gpu"])
    assert build_config("q-tis", ["train.device=auto"]).train.device == "auto"
    if not HAS_CUDA:
        with pytest.raises(ConfigError, match=r"train\.device='cuda' is not accepted here: .* sees no CUDA GPU"):
            build_config("q-tis", ["train.device=cuda"])


@cuda
@needs_gpu
@pytest.mark.parametrize("preset", ["q-tis", "q-interq"])
def test_rl_steps_run_on_cuda(tmp_path, preset):
    """Two RL steps of the tiny policy with the learner and the W8A8-KV8 executor on the GPU (warm start on the CPU)."""
    import json

    from interq.cli import main

    out = tmp_path / preset
    rc = main(["train", "--preset", preset, "--out", str(out), "train.device=cuda", "train.steps=2",
               "warm_start.steps=5", "warm_start.num_demos=32", "train.eval_every_steps=0", "train.progress=false",
               "train.checkpoint_every_steps=2"])
    assert rc in (0, None)
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in recs if r.get("step", 0) > 0]
    assert len(steps) == 2 and all(r["optim/steps"] >= 1 for r in steps)
