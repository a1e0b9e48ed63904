#!/bin/bash
# Quiet block, eleventh session (after the RL steps): executor, engine, vLLM, the prefill A/B. One after the other.
cd "$(dirname "$0")/../.."
D=results/bench-2026-12-02-s11
echo "block start $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
.venv/bin/python benchmarks/bench_quant.py > $D/quant.log 2>&1; echo "quant rc=$? $(date)" >> $D/block.log
.venv/bin/python benchmarks/bench_engine.py --threads 2 --int8-multiturn > $D/engine.log 2>&1; echo "engine rc=$? $(date)" >> $D/block.log
.venv-vllm/bin/python benchmarks/bench_vllm.py > $D/vllm.log 2>&1; echo "vllm rc=$? $(date)" >> $D/block.log
OMP_NUM_THREADS=1 .venv/bin/python $D/rollout_prefill_ab.py old gqa old gqa > $D/rollout_prefill_ab.log 2>&1; echo "prefill_ab rc=$? $(date)" >> $D/block.log
