#!/usr/bin/env bash
# The kernels' code for lower CPU classes, run on this CPU: for each class below it that this CPU can execute, the
# kernels are built for that class (INTERQ_KERNELS_MARCH) and the kernel and backend tests run against the build, with
# torch's own vector code capped to match (ATEN_CPU_CAPABILITY). oneDNN is left at this CPU's level: capped below VNNI
# its int8 GEMM saturates, which a real CPU of the lower class never asks of it (torch runs its own loop there), and
# the tests that compare the int8 backends with torch._int_mm would be refused. For x86-64-v3 a second pass caps
# oneDNN too (ONEDNN_MAX_CPU_ISA=AVX2): torch's bf16 GEMMs then take its own reference kernel, as on an AVX2 CPU,
# and interq's AVX2 bf16 product is compared with it (tests/test_quant_packed_linear.py, which uses no int8 GEMM).
#
#   scripts/test_isa.sh [TARGET ...]      (default: x86-64-v2 x86-64-v3 x86-64-v4 cascadelake; `make test-isa`)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
TESTS=(tests/test_quant_kernels.py tests/test_quant_rms_norm.py tests/test_train_learner_attention.py
       tests/test_quant_vnni.py tests/test_quant_amx.py tests/test_quant_packed_linear.py
       tests/test_backend_selection.py tests/test_int_mm_exact.py tests/test_flash_decode.py)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(x86-64-v2 x86-64-v3 x86-64-v4 cascadelake)
fail=0
for t in "${targets[@]}"; do
  case $t in
    x86-64-v2) aten=default ;;
    x86-64-v3) aten=avx2 ;;
    *) aten=avx512 ;;
  esac
  export INTERQ_KERNELS_MARCH=$t ATEN_CPU_CAPABILITY=$aten INTERQ_REQUIRE_ENGINES=1 OMP_NUM_THREADS=2
  refused=$($PY -c 'from interq import kernels; print(kernels._march_refused() or "")') || exit 1
  if [ -n "$refused" ]; then
    echo "== $t: skipped ($refused)"
    continue
  fi
  echo "== $t (ATEN_CPU_CAPABILITY=$aten)"
  $PY -m interq.kernels || { fail=1; continue; }
  $PY scripts/run_pytest.py -q -m "not verl" "${TESTS[@]}" || fail=1
  if [ "$t" = x86-64-v3 ]; then
    echo "== $t with oneDNN capped too (ONEDNN_MAX_CPU_ISA=AVX2): the AVX2 bf16 product against torch's own kernel"
    ONEDNN_MAX_CPU_ISA=AVX2 $PY scripts/run_pytest.py -q -m "not verl" tests/test_quant_packed_linear.py || fail=1
  fi
done
exit $fail
