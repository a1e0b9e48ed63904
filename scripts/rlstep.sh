#!/bin/bash
# One SmolLM2 RL step, the RL-step target's measurement (8 episodes x 10 turns, concatenated layout, preset q-interq, one
# torch thread, under /usr/bin/time -v), on this checkout or on another commit through a worktree on the same venv;
# for before/after figures run them bracketed (main, other, main): this kind of VM's speed drifts within the hour.
#
#   scripts/rlstep.sh OUT_DIR TAG [--ref COMMIT] [key=value overrides...]
#
# Writes OUT_DIR/rlstep_TAG.log (the run's output and /usr/bin/time's), .metrics.jsonl and .config.yaml, appends
# start and end lines to OUT_DIR/block.log, and prints one summary line: process CPU s (user + system), the step's
# rollout and learner seconds, the mismatch and the peak RSS. --ref runs COMMIT's interq from a worktree at
# /tmp/rlstep-COMMIT (made when missing; 55992e6 is the baseline of the RL-step target in docs/performance.md). PRESET=bf16 (or another preset) runs
# that arm instead of q-interq.
set -u
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { echo "usage: scripts/rlstep.sh OUT_DIR TAG [--ref COMMIT] [key=value ...]" >&2; exit 2; }
out=$1; tag=$2; shift 2
ref=""
if [ "${1:-}" = "--ref" ]; then
  [ $# -ge 2 ] || { echo "scripts/rlstep.sh: --ref needs a commit" >&2; exit 2; }
  ref=$2; shift 2
fi
[ -x .venv/bin/python ] || { echo "scripts/rlstep.sh: no .venv here (make setup)" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "scripts/rlstep.sh: /usr/bin/time is missing (apt-get install time)" >&2; exit 2; }
mkdir -p "$out"
pp=""
if [ -n "$ref" ]; then
  tree=/tmp/rlstep-$ref
  [ -d "$tree" ] || git worktree add --detach "$tree" "$ref" > /dev/null || exit 2
  pp=$tree/src
fi
step="model.source=smollm2 env.action_format=text warm_start.enabled=false algo.layout=concatenated train.steps=1"
step="$step train.eval_every_steps=0 train.threads=1 train.progress=false"
run=runs/rlstep/$(basename "$out")-$tag
rm -rf "$run"
echo "rlstep $tag (${ref:-this checkout} preset ${PRESET:-q-interq} $*) start $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/block.log"
PYTHONPATH=$pp OMP_NUM_THREADS=1 /usr/bin/time -v .venv/bin/python -m interq.cli train --preset "${PRESET:-q-interq}" --out "$run" \
  $step "$@" > "$out/rlstep_$tag.log" 2>&1
rc=$?
echo "rlstep $tag rc=$rc $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/block.log"
cp "$run/metrics.jsonl" "$out/rlstep_$tag.metrics.jsonl" 2>/dev/null
cp "$run/config.yaml" "$out/rlstep_$tag.config.yaml" 2>/dev/null
.venv/bin/python - "$out/rlstep_$tag.log" "$out/rlstep_$tag.metrics.jsonl" "$tag" "$rc" <<'PY'
import json, re, sys
log, metrics, tag, rc = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
text = open(log, errors="replace").read()
grab = lambda pat: float(re.search(pat, text).group(1)) if re.search(pat, text) else float("nan")
cpu = grab(r"User time \(seconds\): ([\d.]+)") + grab(r"System time \(seconds\): ([\d.]+)")
rss = grab(r"Maximum resident set size \(kbytes\): (\d+)") / 1e6
try:
    m = json.loads(open(metrics).readline())
except (OSError, ValueError):
    m = {}
print(f"rlstep {tag}: rc {rc}, process CPU {cpu:.1f} s, rollout {m.get('time/rollout', float('nan')):.1f} s, "
      f"learner {m.get('time/learner', float('nan')):.1f} s, mismatch {m.get('mismatch/abs_delta_mean', float('nan')):.4f}, "
      f"peak RSS {rss:.1f} GB")
PY
exit $rc
