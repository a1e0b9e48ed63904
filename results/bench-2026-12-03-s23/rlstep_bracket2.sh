#!/bin/bash
# Twenty-third session, after the first block (rlstep_bracket.sh ran only its "before", 55992e6): the RL step on
# c4f6eca (the AVX2 vf16 fix), then before issue 12 again (the VM drifts within the hour); one at a time.
cd "$(dirname "$0")/../.."
out=results/bench-2026-12-03-s23
scripts/rlstep.sh $out after_vf16 --ref c4f6eca >> $out/rlstep.summary
scripts/rlstep.sh $out before2 --ref 55992e6 >> $out/rlstep.summary
