#!/bin/bash
# Twenty-fourth session: the RL step on the AVX2 class with jemalloc installed (apt-get install libjemalloc2; the
# allocator `auto` then picks it), on the session's start (de3cd94, a worktree), then before issue 12 (55992e6, which
# has no allocator choice: glibc), one after the other, one thread each.
cd "$(dirname "$0")/../.."
out=results/bench-2026-12-04-s24
scripts/rlstep.sh $out start_jemalloc --ref de3cd94
scripts/rlstep.sh $out before --ref 55992e6
