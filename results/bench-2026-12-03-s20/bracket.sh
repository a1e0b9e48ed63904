#!/bin/bash
# Twentieth session, one process per run, sequential on the 2-core VM:
#  1. bench_engine.py bracketed twice: ef69383 (the session's start; worktree made by
#     `git worktree add --detach /tmp/s20-before ef69383`, run from main's venv with PYTHONPATH at its src) / main;
#  2. bench_quant.py --speed-only, ef69383 / main / ef69383 / main;
#  3. fast_layers_ab.py: the lean layer forward off / on in one process (SmolLM2, 16 rows, 64 + 64 new tokens in two
#     turns, 2 threads, three alternations; the episodes' tokens and log-probs hashed), W8A8-KV8 and bf16 executors;
#  4. the RL step (scripts/rlstep.sh): ef69383, then main.
cd "$(dirname "$0")/../.."
out=results/bench-2026-12-03-s20
for i in 1 2; do
  PYTHONPATH=/tmp/s20-before/src .venv/bin/python /tmp/s20-before/benchmarks/bench_engine.py > $out/engine_before_$i.log 2>&1
  .venv/bin/python benchmarks/bench_engine.py > $out/engine_main_$i.log 2>&1
done
for i in 1 2; do
  PYTHONPATH=/tmp/s20-before/src .venv/bin/python /tmp/s20-before/benchmarks/bench_quant.py --speed-only > $out/quant_before_$i.log 2>&1
  .venv/bin/python benchmarks/bench_quant.py --speed-only > $out/quant_main_$i.log 2>&1
done
for ex in int8 bf16; do
  .venv/bin/python $out/fast_layers_ab.py $ex 2 64 smol 2>&1 | grep "fast=" > $out/fast_layers_ab_$ex.log
done
scripts/rlstep.sh $out before --ref ef69383 > $out/rlstep.summary
scripts/rlstep.sh $out main >> $out/rlstep.summary
echo done > $out/bracket.done
