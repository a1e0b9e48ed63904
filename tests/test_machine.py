"""interq.machine: the record every benchmark carries."""

from interq.machine import CPU_FEATURES, cpu_capability, describe, machine_info


def test_machine_info_has_every_field_benchmarks_record():
    info = machine_info()
    for key in ("cpu", "cpu_id", "cpu_caches", "cpu_class", "cpu_features", "native_bf16", "torch_cpu_capability", "cpu_count", "threads",
                "torch", "load_avg_start", "int8_backend_auto"):
        assert key in info, key
    assert info["cpu_class"] in ("amx", "avx512_vnni", "avx512", "avx2", "other")
    assert set(info["cpu_features"]) <= set(CPU_FEATURES)
    assert info["int8_backend_auto"] in ("int_mm", "fp32_exact", "vnni", "amx", "avx2")
    assert info["cpu"] in describe(info)
    assert isinstance(info["cpu_id"], str) and isinstance(info["cpu_caches"], str)
    if info["cpu_id"]:  # Linux: "family F model M stepping S", printed in the header
        assert info["cpu_id"].startswith("family ") and info["cpu_id"] in describe(info)


def test_cpu_class_follows_the_features():
    cap = cpu_capability()
    feats = set(cap["cpu_features"])
    if cap["cpu_class"] == "avx512_vnni":
        assert "avx512_vnni" in feats
    if cap["native_bf16"]:
        assert feats & {"avx512_bf16", "amx_bf16"}


def test_resolve_device_accepts_auto_cpu_cuda_and_names_the_field():
    import pytest
    import torch

    from interq.machine import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match=r"train\.device='gpu' is not accepted; accepted: auto, cpu, cuda"):
        resolve_device("gpu", "train.device")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"--device='cuda': no CUDA GPU is visible"):
            resolve_device("cuda", "--device")


def test_every_owned_benchmark_records_the_machine_at_start_and_end():
    """bench_quant/engine/corrections/learner print interq.machine's record and end with load_avg_end in RESULT."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "benchmarks"
    for name in ("bench_quant.py", "bench_engine.py", "bench_corrections.py", "bench_learner.py"):
        path = root / name
        if not path.exists():
            continue
        src = path.read_text()
        assert "machine_info(" in src and "describe(" in src and "load_avg_end" in src, name
        assert "platform.processor" not in src and "/proc/loadavg" not in src, f"{name} still has ad-hoc machine fields"
