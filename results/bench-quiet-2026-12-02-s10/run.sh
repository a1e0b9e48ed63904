#!/bin/bash
# Quiet-machine benchmark block, tenth session (NUMERICS_VERSION 2). Sequential; nothing else running.
cd /work/main
D=runs/bench-s10
echo "start $(date) load $(cat /proc/loadavg)" > $D/block.log
.venv/bin/python benchmarks/bench_quant.py > $D/quant.log 2>&1; echo "quant rc=$? $(date)" >> $D/block.log
.venv/bin/python benchmarks/bench_engine.py --threads 2 --int8-multiturn > $D/engine.log 2>&1; echo "engine rc=$? $(date)" >> $D/block.log
STEP="model.source=smollm2 env.action_format=text warm_start.enabled=false algo.layout=concatenated train.steps=1 train.eval_every_steps=0 train.threads=1 train.progress=false"
for arm in fp32 bf16bwd bf16bwd_thp; do
  rm -rf runs/rlstep/s10-$arm
  extra=""; envs=""
  case $arm in bf16bwd) extra="train.learner_autocast=bf16_backward";; bf16bwd_thp) extra="train.learner_autocast=bf16_backward"; envs="THP_MEM_ALLOC_ENABLE=1";; esac
  env $envs OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/python -m interq.cli train --preset q-interq --out runs/rlstep/s10-$arm $STEP $extra > $D/rlstep_$arm.log 2>&1
  echo "rlstep $arm rc=$? $(date)" >> $D/block.log
  cp runs/rlstep/s10-$arm/metrics.jsonl $D/rlstep_$arm.metrics.jsonl 2>/dev/null
done
.venv-vllm/bin/python benchmarks/bench_vllm.py > $D/vllm.log 2>&1; echo "vllm rc=$? $(date)" >> $D/block.log
echo "end $(date) load $(cat /proc/loadavg)" >> $D/block.log
