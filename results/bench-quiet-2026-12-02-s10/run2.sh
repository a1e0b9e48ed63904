#!/bin/bash
# Quiet block 2, tenth session: the RL step with malloc tuning, then the executor/engine/vLLM benchmarks.
cd /work/main
D=runs/bench-s10
echo "block2 start $(date) load $(cat /proc/loadavg)" >> $D/block.log
STEP="model.source=smollm2 env.action_format=text warm_start.enabled=false algo.layout=concatenated train.steps=1 train.eval_every_steps=0 train.threads=1 train.progress=false"
for arm in tuned_fp32 tuned_bf16bwd; do
  rm -rf runs/rlstep/s10-$arm
  extra=""; [ $arm = tuned_bf16bwd ] && extra="train.learner_autocast=bf16_backward"
  OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/python -m interq.cli train --preset q-interq --out runs/rlstep/s10-$arm $STEP $extra > $D/rlstep_$arm.log 2>&1
  echo "rlstep $arm rc=$? $(date)" >> $D/block.log
  cp runs/rlstep/s10-$arm/metrics.jsonl $D/rlstep_$arm.metrics.jsonl 2>/dev/null
done
.venv/bin/python benchmarks/bench_quant.py > $D/quant2.log 2>&1; echo "quant2 rc=$? $(date)" >> $D/block.log
.venv/bin/python benchmarks/bench_engine.py --threads 2 --int8-multiturn > $D/engine2.log 2>&1; echo "engine2 rc=$? $(date)" >> $D/block.log
.venv-vllm/bin/python benchmarks/bench_vllm.py > $D/vllm2.log 2>&1; echo "vllm2 rc=$? $(date)" >> $D/block.log
rm -rf runs/rlstep/s10-before
OMP_NUM_THREADS=1 PYTHONPATH=/work/before-tree/src /usr/bin/time -v .venv/bin/python -m interq.cli train --preset q-interq --out runs/rlstep/s10-before $STEP > $D/rlstep_before.log 2>&1
echo "rlstep before rc=$? $(date)" >> $D/block.log
cp runs/rlstep/s10-before/metrics.jsonl $D/rlstep_before.metrics.jsonl 2>/dev/null
echo "block2 end $(date) load $(cat /proc/loadavg)" >> $D/block.log
