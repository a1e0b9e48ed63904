#!/bin/bash
# Second quiet block, twelfth session: bench_quant twice more and bench_vllm once more (the spread of the two ratios
# whose targets sit near this machine's figures), one after the other, nothing else running.
cd "$(dirname "$0")/../.."
D=results/bench-2026-12-02-s12
echo "block2 start $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
for i in 2 3; do
  .venv/bin/python benchmarks/bench_quant.py --speed-only > $D/quant$i.log 2>&1; echo "quant$i rc=$? $(date)" >> $D/block.log
done
.venv-vllm/bin/python benchmarks/bench_vllm.py > $D/vllm2.log 2>&1; echo "vllm2 rc=$? $(date)" >> $D/block.log
echo "block2 end $(date)" >> $D/block.log
