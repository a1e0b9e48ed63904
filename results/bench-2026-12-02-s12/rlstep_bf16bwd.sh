#!/bin/bash
# The RL step of block.sh on main with train.learner_autocast=bf16_backward (1 torch thread, /usr/bin/time -v).
cd "$(dirname "$0")/../.."
D=results/bench-2026-12-02-s12
STEP="model.source=smollm2 env.action_format=text warm_start.enabled=false algo.layout=concatenated train.steps=1 train.eval_every_steps=0 train.threads=1 train.progress=false"
rm -rf runs/rlstep/s12-main-bf16bwd
echo "rlstep main-bf16bwd start $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/python -m interq.cli train --preset q-interq --out runs/rlstep/s12-main-bf16bwd $STEP train.learner_autocast=bf16_backward > $D/rlstep_main_bf16bwd.log 2>&1
echo "rlstep main-bf16bwd rc=$? $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
cp runs/rlstep/s12-main-bf16bwd/metrics.jsonl $D/rlstep_main_bf16bwd.metrics.jsonl 2>/dev/null
