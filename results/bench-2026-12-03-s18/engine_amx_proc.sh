#!/bin/bash
# Eighteenth session: engine_amx_proc.py, one arm per process, alternated off/on three times.
cd "$(dirname "$0")/../.."
for i in 1 2 3; do
  for arm in off on; do
    .venv/bin/python results/bench-2026-12-03-s18/engine_amx_proc.py $arm 3 2>&1 | grep "^amx"
  done
done
