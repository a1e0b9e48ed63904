#!/bin/bash
# Repeats of the two fastest RL-step settings (after the final make test, nothing else running): bf16_backward, then
# learner_gemm=onednn + bf16_backward. Logs rlstep_repeat_<arm>.*
cd "$(dirname "$0")/../.."
D=results/bench-2026-12-02-s12
STEP="model.source=smollm2 env.action_format=text warm_start.enabled=false algo.layout=concatenated train.steps=1 train.eval_every_steps=0 train.threads=1 train.progress=false train.learner_autocast=bf16_backward"
for arm in bf16bwd onednn-bf16bwd; do
  extra=""
  [ $arm = onednn-bf16bwd ] && extra="train.learner_gemm=onednn"
  rm -rf runs/rlstep/s12-repeat-$arm
  echo "rlstep repeat-$arm start $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
  OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/python -m interq.cli train --preset q-interq --out runs/rlstep/s12-repeat-$arm $STEP $extra > $D/rlstep_repeat_$arm.log 2>&1
  echo "rlstep repeat-$arm rc=$? $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
  cp runs/rlstep/s12-repeat-$arm/metrics.jsonl $D/rlstep_repeat_$arm.metrics.jsonl 2>/dev/null
done
