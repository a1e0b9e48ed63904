#!/bin/bash
# Nineteenth session: the issue-12 RL step at the session's start (947b7e1) and on main, back to back; then the
# metrics compared (every non-timing metric should be the same: the session's changes keep the bits).
cd "$(dirname "$0")/../.."
out=results/bench-2026-12-03-s19
scripts/rlstep.sh $out before --ref 947b7e1 > $out/rlstep.summary
scripts/rlstep.sh $out main >> $out/rlstep.summary
