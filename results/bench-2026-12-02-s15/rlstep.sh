#!/bin/bash
# Fifteenth session (Intel Xeon with AMX, family 6 model 167): one SmolLM2 RL step (the thirteenth session's command,
# 1 torch thread, /usr/bin/time -v) for each arm named on the command line: before (55992e6, the commit before issue 12,
# a worktree on main's venv), v4 (main's defaults), v3 (main with version 3's learner). Usage: rlstep.sh ARM [TAG]
cd "$(dirname "$0")/../.."
D=${RLSTEP_DIR:-results/bench-2026-12-02-s15}  # the sixteenth session sets results/bench-2026-12-03-s16
STEP="model.source=smollm2 env.action_format=text warm_start.enabled=false algo.layout=concatenated train.steps=1 train.eval_every_steps=0 train.threads=1 train.progress=false"
arm=$1; tag=${2:-$1}; shift 2 2>/dev/null; X="$*"
rm -rf runs/rlstep/$(basename $D)-$tag
PP=""
if [ $arm = before ]; then
  [ -d /tmp/before-tree ] || git worktree add --detach /tmp/before-tree 55992e6 > /dev/null 2>&1
  PP=/tmp/before-tree/src
elif [ $arm = v3 ]; then
  X="$X train.learner_autocast=off train.learner_attention=sdpa"
fi
echo "rlstep $tag ($arm $X) start $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
PYTHONPATH=$PP OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/python -m interq.cli train --preset q-interq --out runs/rlstep/$(basename $D)-$tag $STEP $X > $D/rlstep_$tag.log 2>&1
echo "rlstep $tag rc=$? $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
cp runs/rlstep/$(basename $D)-$tag/metrics.jsonl $D/rlstep_$tag.metrics.jsonl 2>/dev/null
cp runs/rlstep/$(basename $D)-$tag/config.yaml $D/rlstep_$tag.config.yaml 2>/dev/null
