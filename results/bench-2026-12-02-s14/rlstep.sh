#!/bin/bash
# Fourteenth session (Zen 5 EPYC): one SmolLM2 RL step (the thirteenth session's command, 1 torch thread,
# /usr/bin/time -v) with main's new defaults (NUMERICS_VERSION 4: train.learner_autocast=auto -> bf16_backward,
# train.learner_attention=auto -> kernel), then the commit before issue 12 (55992e6, a worktree on main's venv), then
# main with version 3's learner (learner_autocast=off, learner_attention=sdpa), back to back, nothing else running.
cd "$(dirname "$0")/../.."
D=results/bench-2026-12-02-s14
STEP="model.source=smollm2 env.action_format=text warm_start.enabled=false algo.layout=concatenated train.steps=1 train.eval_every_steps=0 train.threads=1 train.progress=false"
echo "block start $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
for arm in v4 before v3; do
  rm -rf runs/rlstep/s14-$arm
  PP=""; X=""
  if [ $arm = before ]; then
    [ -d /tmp/before-tree ] || git worktree add --detach /tmp/before-tree 55992e6 > /dev/null 2>&1
    PP=/tmp/before-tree/src
  elif [ $arm = v3 ]; then
    X="train.learner_autocast=off train.learner_attention=sdpa"
  fi
  echo "rlstep $arm start $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
  PYTHONPATH=$PP OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/python -m interq.cli train --preset q-interq --out runs/rlstep/s14-$arm $STEP $X > $D/rlstep_$arm.log 2>&1
  echo "rlstep $arm rc=$? $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
  cp runs/rlstep/s14-$arm/metrics.jsonl $D/rlstep_$arm.metrics.jsonl 2>/dev/null
  cp runs/rlstep/s14-$arm/config.yaml $D/rlstep_$arm.config.yaml 2>/dev/null
done
echo "block end $(date)" >> $D/block.log
