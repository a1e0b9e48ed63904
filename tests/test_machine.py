"""interq.machine: the record every benchmark carries."""

from interq.machine import CPU_FEATURES, cpu_capability, describe, machine_info


def test_machine_info_has_every_field_benchmarks_record():
    info = machine_info()
    for key in ("cpu", "cpu_class", "cpu_features", "native_bf16", "torch_cpu_capability", "cpu_count", "threads",
                "torch", "load_avg_start", "int8_backend_auto"):
        assert key in info, key
    assert info["cpu_class"] in ("amx", "avx512_vnni", "avx512", "avx2", "other")
    assert set(info["cpu_features"]) <= set(CPU_FEATURES)
    assert info["int8_backend_auto"] in ("int_mm", "fp32_exact")
    assert info["cpu"] in describe(info)


def test_cpu_class_follows_the_features():
    cap = cpu_capability()
    feats = set(cap["cpu_features"])
    if cap["cpu_class"] == "avx512_vnni":
        assert "avx512_vnni" in feats
    if cap["native_bf16"]:
        assert feats & {"avx512_bf16", "amx_bf16"}
