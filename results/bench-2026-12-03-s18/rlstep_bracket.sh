#!/bin/bash
# Eighteenth session: the issue-12 RL step at the session's start (d0dd612) and on main, back to back.
cd "$(dirname "$0")/../.."
scripts/rlstep.sh results/bench-2026-12-03-s18 before --ref d0dd612 > results/bench-2026-12-03-s18/rlstep.summary
scripts/rlstep.sh results/bench-2026-12-03-s18 main >> results/bench-2026-12-03-s18/rlstep.summary
