#!/usr/bin/env bash
# Create the project venv and install the pinned requirements of every delivery, the test tools and deliverykit.
#
# On a machine whose Python already provides torch (the Ascend container images ship torch + torch_npu + CANN),
# the venv sees the system site-packages and the torch pin is left out, so a CPU torch is never installed over
# the platform's. torch-npu itself is never installed here (it breaks `import torch` without CANN).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
REQUIREMENTS=(trellis2-npu/requirements.txt)

if "$PYTHON" -c 'import importlib.util, sys; sys.exit(0 if importlib.util.find_spec("torch") else 1)'; then
    echo "setup: $PYTHON already provides torch; reusing it (venv with system site-packages)"
    "$PYTHON" -m venv --system-site-packages "$VENV"
    filtered=$(mktemp)
    trap 'rm -f "$filtered"' EXIT
    grep -hvE '^(torch|torch-npu)==' "${REQUIREMENTS[@]}" > "$filtered"
    args=(-r "$filtered")
else
    "$PYTHON" -m venv "$VENV"
    args=()
    for req in "${REQUIREMENTS[@]}"; do args+=(-r "$req"); done
fi

"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${args[@]}" -r ci/requirements-dev.txt
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e shared
"$VENV/bin/python" -c 'import torch, deliverykit; print(f"setup: torch {torch.__version__}, deliverykit {deliverykit.__version__}")'
