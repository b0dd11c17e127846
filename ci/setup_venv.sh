#!/usr/bin/env bash
# Create the project venv and install the pinned requirements of every delivery, the test tools and deliverykit.
#
# On a machine whose Python already provides torch (the Ascend container images ship torch + torch_npu + CANN),
# the venv sees the system site-packages, pip gets the constraint torch==<that version> (it can never replace it)
# and no lock line for a package that torch itself requires (sympy, networkx, ...: ci/system_torch.py), so the
# platform's versions stay. torch-npu itself is never installed here (it breaks `import torch` without CANN).
# Exit codes: 0 done, 2 $PYTHON is itself a venv, 1 anything else (pip's own error, a moved torch).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
REQUIREMENTS=(trellis2-npu/requirements.txt)

# A venv made with --system-site-packages from inside a venv sees the base interpreter's packages, not that venv's.
if ! "$PYTHON" -c 'import sys; sys.exit(sys.prefix != sys.base_prefix)'; then
    base=$("$PYTHON" -c 'import sys; print(sys._base_executable)')
    echo "error: PYTHON=$PYTHON is itself a virtual environment; use the interpreter it was made from: PYTHON=$base" >&2
    exit 2
fi

# sulphur2-npu and ursa-npu run on diffusers 0.42.1, which needs Python >= 3.11; on 3.10 they are left out (their
# demos and tests then skip with that reason) instead of failing the whole set-up.
if "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
    REQUIREMENTS+=(sulphur2-npu/requirements.txt ursa-npu/requirements.txt)
else
    echo "setup: Python < 3.11: sulphur2-npu and ursa-npu left out (diffusers 0.42.1 needs Python >= 3.11)"
fi

# The web demos' pins (gradio; fastapi and pandas need Python >= 3.11), so that `make test` runs the app tests.
LOCKS=("${REQUIREMENTS[@]}")
if "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
    for req in "${REQUIREMENTS[@]}"; do
        app="$(dirname "$req")/requirements-app.txt"
        if [ -f "$app" ]; then LOCKS+=("$app"); fi
    done
fi

if "$PYTHON" -c 'import importlib.util, sys; sys.exit(0 if importlib.util.find_spec("torch") else 1)'; then
    system_torch=$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("torch"))')
    echo "setup: $PYTHON already provides torch $system_torch; reusing it (venv with system site-packages)"
    "$PYTHON" -m venv --system-site-packages "$VENV"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$PYTHON" ci/system_torch.py "$work/requirements.txt" "$work/constraints.txt" "${LOCKS[@]}" \
        ci/requirements-dev.txt
    args=(-r "$work/requirements.txt" -c "$work/constraints.txt")
else
    system_torch=
    "$PYTHON" -m venv "$VENV"
    args=()
    for req in "${LOCKS[@]}" ci/requirements-dev.txt; do args+=(-r "$req"); done
fi

"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${args[@]}"
# deliverykit and each delivery's package, editable: inference.py, scripts, benchmarks and tests import them as
# installed packages (no sys.path bootstraps).
editable=(-e shared)
for req in "${REQUIREMENTS[@]}"; do editable+=(-e "$(dirname "$req")"); done
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation "${editable[@]}"
venv_torch=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')
if [ -n "$system_torch" ] && [ "$venv_torch" != "$system_torch" ]; then
    echo "error: the venv's torch is $venv_torch, not the platform's $system_torch; remove $VENV and report this" >&2
    exit 1
fi
"$VENV/bin/python" -c 'import torch, deliverykit; print(f"setup: torch {torch.__version__}, deliverykit {deliverykit.__version__}")'
