#!/bin/bash
# Eighteenth session: bench_engine.py bracketed: d0dd612 (the session's start; worktree /tmp/s18-before made by
# `git worktree add /tmp/s18-before d0dd612`) / main, same venv (PYTHONPATH points the run at the worktree's interq).
set -e
cd "$(dirname "$0")/../.."
out=results/bench-2026-12-03-s18
PYTHONPATH=/tmp/s18-before/src .venv/bin/python /tmp/s18-before/benchmarks/bench_engine.py > $out/engine_before.log 2>&1
.venv/bin/python benchmarks/bench_engine.py > $out/engine_main_c.log 2>&1
