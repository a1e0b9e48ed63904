#!/bin/bash
# Twenty-fourth session: the RL step on final main's defaults (learner attention `auto` = kernel again on this class,
# rollout sdpa_packed), jemalloc, one thread; run twice (final_default, then with the tag final_default2).
cd "$(dirname "$0")/../.."
scripts/rlstep.sh results/bench-2026-12-04-s24 ${1:-final_default}
