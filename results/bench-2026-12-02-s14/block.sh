#!/bin/bash
# Quiet block, fourteenth session (Zen 5 EPYC): the learner's attention kernel against torch's flash kernel (alone,
# then in SmolLM2 learner passes), then the RL steps of rlstep.sh. Nothing else running.
cd "$(dirname "$0")/../.."
D=results/bench-2026-12-02-s14
echo "block start $(date) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/block.log
OMP_NUM_THREADS=1 .venv/bin/python $D/learner_attn.py 300 700 1760 > $D/learner_attn.log 2>&1; echo "learner_attn rc=$? $(date)" >> $D/block.log
for att in sdpa kernel; do
  .venv/bin/python benchmarks/bench_learner.py --threads 1 --rows 2 --turns 16 --obs-tokens 100 --act-tokens 10 --rounds 2 \
    --skip-tiny --skip-forward-only --arms aligned_fp32,aligned_bf16bwd --learner-attention $att > $D/learner_$att.log 2>&1
  echo "bench_learner $att rc=$? $(date)" >> $D/block.log
done
bash $D/rlstep.sh
