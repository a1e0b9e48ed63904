#!/bin/bash
# Sixteenth session: the VM's speed drifted 1.6-2.5x within the hour (and two steps side by side do not fit in
# 24 GB), so the RL step before issue 12 is bracketed by main's: v4, before, v4, back to back, after the runs
# started before this script. Usage: setsid nohup results/bench-2026-12-03-s16/bracket.sh &
cd "$(dirname "$0")/../.."
D=results/bench-2026-12-03-s16
while pgrep -f 'bench_engine.py|interq.cli train' > /dev/null; do sleep 5; done
echo "bracket start $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
RLSTEP_DIR=$D bash results/bench-2026-12-02-s15/rlstep.sh v4 v4_c
RLSTEP_DIR=$D bash results/bench-2026-12-02-s15/rlstep.sh before before_c
RLSTEP_DIR=$D bash results/bench-2026-12-02-s15/rlstep.sh v4 v4_d
echo "bracket end $(date)" >> $D/block.log
