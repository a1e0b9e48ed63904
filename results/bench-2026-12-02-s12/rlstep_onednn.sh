#!/bin/bash
# The RL step of block.sh on main with train.learner_gemm=onednn, fp32 learner and with bf16_backward (1 torch thread).
cd "$(dirname "$0")/../.."
D=results/bench-2026-12-02-s12
STEP="model.source=smollm2 env.action_format=text warm_start.enabled=false algo.layout=concatenated train.steps=1 train.eval_every_steps=0 train.threads=1 train.progress=false train.learner_gemm=onednn"
for arm in onednn onednn-bf16bwd; do
  extra=""
  [ $arm = onednn-bf16bwd ] && extra="train.learner_autocast=bf16_backward"
  rm -rf runs/rlstep/s12-main-$arm
  echo "rlstep main-$arm start $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
  OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/python -m interq.cli train --preset q-interq --out runs/rlstep/s12-main-$arm $STEP $extra > $D/rlstep_main_$arm.log 2>&1
  echo "rlstep main-$arm rc=$? $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
  cp runs/rlstep/s12-main-$arm/metrics.jsonl $D/rlstep_main_$arm.metrics.jsonl 2>/dev/null
done
