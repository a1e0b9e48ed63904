#!/bin/bash
# One SmolLM2 RL step per arm (docs/benchmarks.md "A SmolLM2 RL step"), one after the other, 1 torch thread.
# Usage: bash results/bench-2026-12-02-s11/rlstep.sh <tag> [arm ...]   (arms: fp32, bf16bwd)
cd "$(dirname "$0")/../.."
D=results/bench-2026-12-02-s11
TAG=$1; shift
STEP="model.source=smollm2 env.action_format=text warm_start.enabled=false algo.layout=concatenated train.steps=1 train.eval_every_steps=0 train.threads=1 train.progress=false"
for arm in "$@"; do
  extra=""
  [ "$arm" = bf16bwd ] && extra="train.learner_autocast=bf16_backward"
  rm -rf runs/rlstep/s11-$TAG-$arm
  echo "rlstep $TAG $arm start $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
  OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/python -m interq.cli train --preset q-interq --out runs/rlstep/s11-$TAG-$arm $STEP $extra > $D/rlstep_${TAG}_$arm.log 2>&1
  echo "rlstep $TAG $arm rc=$? $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
  cp runs/rlstep/s11-$TAG-$arm/metrics.jsonl $D/rlstep_${TAG}_$arm.metrics.jsonl 2>/dev/null
done
