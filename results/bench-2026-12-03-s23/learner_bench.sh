#!/bin/bash
# Twenty-third session: bench_learner on the AVX2 class (one thread, beside a one-thread RL step on the other core),
# the learner's attention by the kernel (auto here) and by torch's sdpa.
cd "$(dirname "$0")/../.."
out=results/bench-2026-12-03-s23
.venv/bin/python benchmarks/bench_learner.py --threads 1 --skip-tiny --learner-attention kernel > $out/learner_kernel.log 2>&1
.venv/bin/python benchmarks/bench_learner.py --threads 1 --skip-tiny --learner-attention sdpa > $out/learner_sdpa.log 2>&1
