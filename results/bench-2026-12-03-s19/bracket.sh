#!/bin/bash
# Nineteenth session, one process per run, sequential on the 2-core VM:
#  1. bench_engine.py bracketed twice: 947b7e1 (the session's start; worktree made by
#     `git worktree add /tmp/s19-before 947b7e1`, run from main's venv with PYTHONPATH at its src) / main;
#  2. bench_quant.py --speed-only, 947b7e1 / main;
#  3. bench_attention.py (the one-call flash decode per layer call, bf16 at SmolLM2's shapes, 2 threads);
#  4. engine_flash_proc.sh's alternation (flash decode off / on, bf16 and W8A8-KV8 executors), twice.
cd "$(dirname "$0")/../.."
out=results/bench-2026-12-03-s19
for i in 1 2; do
  PYTHONPATH=/tmp/s19-before/src .venv/bin/python /tmp/s19-before/benchmarks/bench_engine.py > $out/engine_before_$i.log 2>&1
  .venv/bin/python benchmarks/bench_engine.py > $out/engine_main_$i.log 2>&1
done
PYTHONPATH=/tmp/s19-before/src .venv/bin/python /tmp/s19-before/benchmarks/bench_quant.py --speed-only > $out/quant_before.log 2>&1
.venv/bin/python benchmarks/bench_quant.py --speed-only > $out/quant_main.log 2>&1
.venv/bin/python benchmarks/bench_attention.py --threads 2 --lengths 48,300,1000,2000 > $out/attention.log 2>&1
rm -f /tmp/engine_flash_bf16.digest /tmp/engine_flash_w8a8.digest
for i in 1 2; do
  for ex in bf16 w8a8; do
    for arm in 0 1; do
      INTERQ_FLASH_DECODE=$arm .venv/bin/python $out/engine_flash_proc.py $ex 3 2>&1 | grep "flash" >> $out/engine_flash_proc.log
    done
  done
done
echo done > $out/bracket.done
