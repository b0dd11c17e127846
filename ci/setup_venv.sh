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
# sulphur2-npu and ursa-npu run on diffusers 0.42.1, which needs Python >= 3.11; on 3.10 they are left out (their
# demos and tests then skip with that reason) instead of failing the whole set-up.
if "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
    REQUIREMENTS+=(sulphur2-npu/requirements.txt ursa-npu/requirements.txt)
else
    echo "setup: Python < 3.11: sulphur2-npu and ursa-npu left out (diffusers 0.42.1 needs Python >= 3.11)"
fi

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
