cd /work/main
J=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
echo "== glibc $(date)"; OMP_NUM_THREADS=1 .venv/bin/python results/bench-2026-12-02-s11/learner_allocator.py 2>&1 | grep round
echo "== jemalloc default $(date)"; LD_PRELOAD=$J OMP_NUM_THREADS=1 .venv/bin/python results/bench-2026-12-02-s11/learner_allocator.py 2>&1 | grep round
echo "== jemalloc nodecay $(date)"; LD_PRELOAD=$J MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1 OMP_NUM_THREADS=1 .venv/bin/python results/bench-2026-12-02-s11/learner_allocator.py 2>&1 | grep round
echo "== done $(date)"
