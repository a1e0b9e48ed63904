#!/bin/bash
# Twenty-fourth session, after rlstep_jemalloc.sh: the RL step on this checkout (the AVX2 tiles, jemalloc) with the
# defaults (learner attention `auto` = sdpa here, rollout sdpa_packed), then with the opt-in kernels for both
# (train.learner_attention=kernel rollout.attention=packed_kernel), one thread each, one after the other.
cd "$(dirname "$0")/../.."
out=results/bench-2026-12-04-s24
scripts/rlstep.sh $out final_jemalloc
scripts/rlstep.sh $out final_kernels train.learner_attention=kernel rollout.attention=packed_kernel
