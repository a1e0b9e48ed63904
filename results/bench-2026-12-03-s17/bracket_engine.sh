#!/bin/bash
# Seventeenth session: bench_engine.py on main (this session's HEAD) and on 6567b35 (the sixteenth session's last
# commit, a worktree at /tmp/s17-before: `git worktree add /tmp/s17-before 6567b35`), bracketed main / before / main,
# 2 threads, defaults. Usage: bracket_engine.sh (from the repository root)
set -u
out=results/bench-2026-12-03-s17
.venv/bin/python benchmarks/bench_engine.py > $out/engine_main_a.log 2>&1
PYTHONPATH=/tmp/s17-before/src .venv/bin/python /tmp/s17-before/benchmarks/bench_engine.py > $out/engine_before.log 2>&1
.venv/bin/python benchmarks/bench_engine.py > $out/engine_main_b.log 2>&1
