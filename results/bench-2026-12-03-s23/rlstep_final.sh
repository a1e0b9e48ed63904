#!/bin/bash
# Twenty-third session: the RL step on final main (learner attention auto = sdpa on this AVX2 class).
cd "$(dirname "$0")/../.."
scripts/rlstep.sh results/bench-2026-12-03-s23 final --ref "$1" >> results/bench-2026-12-03-s23/rlstep.summary
