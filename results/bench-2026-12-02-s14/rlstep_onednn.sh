#!/bin/bash
# The RL step of rlstep.sh with version 4's defaults and train.learner_gemm=onednn (the fp32 forward GEMMs through
# oneDNN; opt-in), 1 torch thread, /usr/bin/time -v.
cd "$(dirname "$0")/../.."
D=results/bench-2026-12-02-s14
STEP="model.source=smollm2 env.action_format=text warm_start.enabled=false algo.layout=concatenated train.steps=1 train.eval_every_steps=0 train.threads=1 train.progress=false"
rm -rf runs/rlstep/s14-onednn
echo "rlstep v4+onednn start $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/python -m interq.cli train --preset q-interq --out runs/rlstep/s14-onednn $STEP train.learner_gemm=onednn > $D/rlstep_v4_onednn.log 2>&1
echo "rlstep v4+onednn rc=$? $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
cp runs/rlstep/s14-onednn/metrics.jsonl $D/rlstep_v4_onednn.metrics.jsonl 2>/dev/null
