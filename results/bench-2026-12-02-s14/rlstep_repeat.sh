#!/bin/bash
# The v4 arm of rlstep.sh once more, right after the block (the VM's speed drifts within the hour).
cd "$(dirname "$0")/../.."
D=results/bench-2026-12-02-s14
STEP="model.source=smollm2 env.action_format=text warm_start.enabled=false algo.layout=concatenated train.steps=1 train.eval_every_steps=0 train.threads=1 train.progress=false"
rm -rf runs/rlstep/s14-v4r
echo "rlstep v4 repeat start $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/python -m interq.cli train --preset q-interq --out runs/rlstep/s14-v4r $STEP > $D/rlstep_v4_repeat.log 2>&1
echo "rlstep v4 repeat rc=$? $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
cp runs/rlstep/s14-v4r/metrics.jsonl $D/rlstep_v4_repeat.metrics.jsonl 2>/dev/null
