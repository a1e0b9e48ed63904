#!/bin/bash
# Quiet block, thirteenth session (Zen 5 EPYC), after the vnni int8 backend: executor speed twice more, engine,
# vLLM side by side, then one SmolLM2 RL step on main and one on the commit before issue 12 (55992e6, a worktree on
# main's venv), back to back, nothing else running.
cd "$(dirname "$0")/../.."
D=results/bench-2026-12-02-s13
echo "block start $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
for i in 2 3; do
  .venv/bin/python benchmarks/bench_quant.py --speed-only > $D/quant$i.log 2>&1; echo "quant$i rc=$? $(date)" >> $D/block.log
done
.venv/bin/python benchmarks/bench_engine.py --threads 2 --int8-multiturn > $D/engine.log 2>&1; echo "engine rc=$? $(date)" >> $D/block.log
.venv-vllm/bin/python benchmarks/bench_vllm.py > $D/vllm.log 2>&1; echo "vllm rc=$? $(date)" >> $D/block.log
STEP="model.source=smollm2 env.action_format=text warm_start.enabled=false algo.layout=concatenated train.steps=1 train.eval_every_steps=0 train.threads=1 train.progress=false"
for arm in main before; do
  rm -rf runs/rlstep/s13-$arm
  if [ $arm = before ]; then
    [ -d /tmp/before-tree ] || git worktree add --detach /tmp/before-tree 55992e6 > /dev/null 2>&1
    PP=/tmp/before-tree/src
  else
    PP=""
  fi
  echo "rlstep $arm start $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
  PYTHONPATH=$PP OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/python -m interq.cli train --preset q-interq --out runs/rlstep/s13-$arm $STEP > $D/rlstep_$arm.log 2>&1
  echo "rlstep $arm rc=$? $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
  cp runs/rlstep/s13-$arm/metrics.jsonl $D/rlstep_$arm.metrics.jsonl 2>/dev/null
done
echo "block end $(date)" >> $D/block.log
