#!/bin/bash
# Twenty-first session, one process per run, sequential on the 2-core VM, both sides from worktrees on main's venv
# (transformers 5.25.0 + kernels 0.19.1) with PYTHONPATH at their src:
#   before = 41231ed (the session's start with the CI fix: the lean forward as the twentieth session left it),
#   after  = bfeeaf1 (the bf16 / fp32 arms on make_executor(BF16_EXECUTOR), the layers' one-call halves).
#  1. the RL step of the bf16 arm (PRESET=bf16 scripts/rlstep.sh), before then after;
#  2. bench_quant.py --speed-only, before / after / before / after;
#  3. bench_engine.py, before / after / before / after;
#  4. fused_ab.py (off / lean / fused in one process) at after, W8A8-KV8 and bf16;
#  5. the q-interq RL step, before then after.
cd "$(dirname "$0")/../.."
out=results/bench-2026-12-03-s21
B=/tmp/rlstep-41231ed; A=/tmp/rlstep-bfeeaf1
[ -d $B ] || git worktree add --detach $B 41231ed > /dev/null
[ -d $A ] || git worktree add --detach $A bfeeaf1 > /dev/null
PRESET=bf16 scripts/rlstep.sh $out bf16_before --ref 41231ed > $out/rlstep.summary
PRESET=bf16 scripts/rlstep.sh $out bf16_after --ref bfeeaf1 >> $out/rlstep.summary
for i in 1 2; do
  PYTHONPATH=$B/src .venv/bin/python $B/benchmarks/bench_quant.py --speed-only > $out/quant_before_$i.log 2>&1
  PYTHONPATH=$A/src .venv/bin/python $A/benchmarks/bench_quant.py --speed-only > $out/quant_after_$i.log 2>&1
done
for i in 1 2; do
  PYTHONPATH=$B/src .venv/bin/python $B/benchmarks/bench_engine.py > $out/engine_before_$i.log 2>&1
  PYTHONPATH=$A/src .venv/bin/python $A/benchmarks/bench_engine.py > $out/engine_after_$i.log 2>&1
done
for ex in int8 bf16; do
  PYTHONPATH=$A/src .venv/bin/python $out/fused_ab.py $ex 2 64 smol 3 2>&1 | grep -v "Loading weights" > $out/fused_ab_block_$ex.log
done
scripts/rlstep.sh $out qinterq_before --ref 41231ed >> $out/rlstep.summary
scripts/rlstep.sh $out qinterq_after --ref bfeeaf1 >> $out/rlstep.summary
echo done > $out/bracket.done
