#!/bin/bash
# Quiet block 3, tenth session: engine and vLLM after the _version fix (2989e7f).
cd /work/main
D=runs/bench-s10
echo "block3 start $(date) load $(cat /proc/loadavg)" >> $D/block.log
.venv/bin/python benchmarks/bench_engine.py --threads 2 --int8-multiturn > $D/engine3.log 2>&1; echo "engine3 rc=$? $(date)" >> $D/block.log
.venv-vllm/bin/python benchmarks/bench_vllm.py > $D/vllm3.log 2>&1; echo "vllm3 rc=$? $(date)" >> $D/block.log
echo "block3 end $(date) load $(cat /proc/loadavg)" >> $D/block.log
