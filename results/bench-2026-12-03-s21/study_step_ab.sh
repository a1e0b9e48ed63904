#!/bin/bash
# Twenty-first session: one study-setting RL run of 2 steps (q-interq, the tiny Qwen3 policy of 4 layers without a
# warm start, the comparison study's settings but the evaluations), the lean forward on (1) or off (0: INTERQ_FAST_LAYERS=0).
# Usage: study_step_ab.sh TAG 0|1; ran as off1 on2 off2 on3 off3 on4 after on1 (study_step_ab.log).
cd /work/main
tag=$1; fl=$2
rm -rf /tmp/s21/study/run-$tag
INTERQ_FAST_LAYERS=$fl OMP_NUM_THREADS=1 timeout 900 .venv/bin/python -m interq.cli train --preset q-interq --out /tmp/s21/study/run-$tag \
  'env.task_types=pick_and_place' 'env.num_train_tasks=0' 'rollout.max_action_tokens=4' 'train.tasks_per_step=8' \
  'train.eval_episodes_per_task=1' 'train.threads=1' 'model.num_layers=4' \
  'env.env_kwargs={size: small, split_sizes: {valid_seen: 1200, valid_unseen: 600}}' 'env.eval_split=valid_seen' \
  'env.num_eval_tasks=200' 'train.episodes_per_task=8' 'algo.advantage=gigpo' 'optim.lr=3e-4' \
  'env.action_format=text' 'rollout.max_action_tokens=10' train.steps=2 train.eval_every_steps=0 \
  train.checkpoint_every_steps=0 warm_start.enabled=false train.progress=false > /tmp/s21/study/run-$tag.log 2>&1
echo "rc=$?"
python3 -c "
import json
for l in open('/tmp/s21/study/run-$tag/metrics.jsonl'):
    m=json.loads(l); print('$tag', m.get('step'), 'rollout', round(m['time/rollout'],2), 'learner', round(m['time/learner'],2), 'tokens', m.get('batch/tokens'), 'act', m.get('batch/action_tokens'))
"
