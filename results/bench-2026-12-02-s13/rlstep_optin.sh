#!/bin/bash
# The RL step of block.sh on main with the opt-in settings: rollout.attention=packed_kernel alone, then with
# train.learner_autocast=bf16_backward and train.learner_gemm=onednn (1 torch thread, /usr/bin/time -v), back to back.
cd "$(dirname "$0")/../.."
D=results/bench-2026-12-02-s13
STEP="model.source=smollm2 env.action_format=text warm_start.enabled=false algo.layout=concatenated train.steps=1 train.eval_every_steps=0 train.threads=1 train.progress=false"
for arm in kernel all; do
  if [ $arm = kernel ]; then X="rollout.attention=packed_kernel"; else X="rollout.attention=packed_kernel train.learner_autocast=bf16_backward train.learner_gemm=onednn"; fi
  rm -rf runs/rlstep/s13-$arm
  echo "rlstep $arm start $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
  OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/python -m interq.cli train --preset q-interq --out runs/rlstep/s13-$arm $STEP $X > $D/rlstep_$arm.log 2>&1
  echo "rlstep $arm rc=$? $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
  cp runs/rlstep/s13-$arm/metrics.jsonl $D/rlstep_$arm.metrics.jsonl 2>/dev/null
done
