#!/bin/bash
# Twenty-third session (AVX2 class, Zen 3): the issue-12 RL step before issue 12 (55992e6, worktree) and on main
# (59fa1ba, this session's start), then before again (the VM drifts within the hour), one at a time (~12 GB RSS each).
cd "$(dirname "$0")/../.."
out=results/bench-2026-12-03-s23
scripts/rlstep.sh $out before --ref 55992e6 > $out/rlstep.summary
scripts/rlstep.sh $out main --ref 59fa1ba >> $out/rlstep.summary
scripts/rlstep.sh $out before2 --ref 55992e6 >> $out/rlstep.summary
