#!/bin/bash
# Quiet block, sixteenth session (Intel Xeon with AMX, family 6 model 167), after the amx int8 backend: waits for
# the runs started before it, then one SmolLM2 RL step on main (v4: NUMERICS_VERSION 4's defaults, int8 auto = amx),
# bench_quant (full, then speed only), bench_engine, vLLM side by side, and the RL step on the commit before issue 12
# (55992e6) again, nothing else running. Usage: setsid nohup results/bench-2026-12-03-s16/block.sh &
cd "$(dirname "$0")/../.."
D=results/bench-2026-12-03-s16
while pgrep -f 'rollout_amx_ab.py|interq.cli train' > /dev/null; do sleep 10; done
echo "block start $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
RLSTEP_DIR=$D bash results/bench-2026-12-02-s15/rlstep.sh v4 v4
.venv/bin/python benchmarks/bench_quant.py > $D/quant1.log 2>&1; echo "quant1 rc=$? $(date)" >> $D/block.log
.venv/bin/python benchmarks/bench_quant.py --speed-only > $D/quant2.log 2>&1; echo "quant2 rc=$? $(date)" >> $D/block.log
.venv/bin/python benchmarks/bench_engine.py --threads 2 --int8-multiturn > $D/engine.log 2>&1; echo "engine rc=$? $(date)" >> $D/block.log
while pgrep -f setup_vllm.sh > /dev/null; do sleep 10; done
.venv-vllm/bin/python benchmarks/bench_vllm.py > $D/vllm.log 2>&1; echo "vllm rc=$? $(date)" >> $D/block.log
RLSTEP_DIR=$D bash results/bench-2026-12-02-s15/rlstep.sh before before
echo "block end $(date)" >> $D/block.log
