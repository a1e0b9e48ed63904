#!/bin/bash
# Seventeenth session: engine_sampling_ab.py with one path per process (2 threads, 3 rounds each), alternated
# threads / kernel / threads / kernel. Usage: engine_sampling_ab.sh (from the repository root)
out=results/bench-2026-12-03-s17/engine_sampling_ab_procs.log
: > $out
for path in threads kernel threads kernel; do
  .venv/bin/python results/bench-2026-12-03-s17/engine_sampling_ab.py 2 3 $path 2>&1 | grep -v Loading >> $out
done
