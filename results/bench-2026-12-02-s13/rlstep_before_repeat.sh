#!/bin/bash
# The "before issue 12" RL step once more (55992e6 from the /tmp/before-tree worktree on main's venv), right after the
# opt-in steps, so that their ratio has a "before" from the same half hour.
cd "$(dirname "$0")/../.."
D=results/bench-2026-12-02-s13
STEP="model.source=smollm2 env.action_format=text warm_start.enabled=false algo.layout=concatenated train.steps=1 train.eval_every_steps=0 train.threads=1 train.progress=false"
[ -d /tmp/before-tree ] || git worktree add --detach /tmp/before-tree 55992e6 > /dev/null 2>&1
rm -rf runs/rlstep/s13-before-repeat
echo "rlstep before-repeat start $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
PYTHONPATH=/tmp/before-tree/src OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/python -m interq.cli train --preset q-interq --out runs/rlstep/s13-before-repeat $STEP > $D/rlstep_before_repeat.log 2>&1
echo "rlstep before-repeat rc=$? $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
cp runs/rlstep/s13-before-repeat/metrics.jsonl $D/rlstep_before_repeat.metrics.jsonl 2>/dev/null
