#!/bin/bash
# Seventeenth session: the RL step with the learner's attention as `auto` resolves it on this CPU (kernel) and with
# torch's flash kernel (train.learner_attention=sdpa), bracketed default / sdpa / default. Usage: from the repository root
out=results/bench-2026-12-03-s17
scripts/rlstep.sh $out default_a > $out/rlstep_attn.summary 2>&1
scripts/rlstep.sh $out sdpa train.learner_attention=sdpa >> $out/rlstep_attn.summary 2>&1
scripts/rlstep.sh $out default_b >> $out/rlstep_attn.summary 2>&1
