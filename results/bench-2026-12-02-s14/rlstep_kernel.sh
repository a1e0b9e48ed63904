#!/bin/bash
# The RL step of rlstep.sh with version 4's defaults and rollout.attention=packed_kernel (decode and, since this
# session, masked prefill attention by interq's kernels; opt-in), 1 torch thread, /usr/bin/time -v.
cd "$(dirname "$0")/../.."
D=results/bench-2026-12-02-s14
STEP="model.source=smollm2 env.action_format=text warm_start.enabled=false algo.layout=concatenated train.steps=1 train.eval_every_steps=0 train.threads=1 train.progress=false"
rm -rf runs/rlstep/s14-kernel
echo "rlstep v4+packed_kernel start $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/python -m interq.cli train --preset q-interq --out runs/rlstep/s14-kernel $STEP rollout.attention=packed_kernel > $D/rlstep_v4_packed_kernel.log 2>&1
echo "rlstep v4+packed_kernel rc=$? $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
cp runs/rlstep/s14-kernel/metrics.jsonl $D/rlstep_v4_packed_kernel.metrics.jsonl 2>/dev/null
