#!/bin/bash
# Twentieth session, after the one-call KV append (e64f9f4): bench_quant.py --speed-only at acdad93 (the commit
# before it; worktree `git worktree add --detach /tmp/s20-mid acdad93`, main's venv with PYTHONPATH at its src) and
# on main, alternating twice, one process per run.
cd "$(dirname "$0")/../.."
out=results/bench-2026-12-03-s20
for i in 1 2; do
  PYTHONPATH=/tmp/s20-mid/src .venv/bin/python /tmp/s20-mid/benchmarks/bench_quant.py --speed-only > $out/quant_mid_$i.log 2>&1
  .venv/bin/python benchmarks/bench_quant.py --speed-only > $out/quant_kv_$i.log 2>&1
done
echo done > $out/bracket2.done
