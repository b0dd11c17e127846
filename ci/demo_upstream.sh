#!/usr/bin/env bash
# Print the patched upstream checkout a delivery's `make demo` step runs on, or exit 1 (nothing printed) if none.
#
# Usage: ci/demo_upstream.sh DELIVERY [CHECKOUT]
# CHECKOUT (the delivery's *_SRC variable) wins when given. Otherwise .upstream/DELIVERY is used, cloned once at the
# pinned commit with the delivery's patches applied (`deliverykit upstream clone`, needs network), and cloned again
# when the delivery's patches changed since. A failed clone leaves nothing behind, so the next `make demo` tries again.
set -uo pipefail
cd "$(dirname "$0")/.."

delivery=$1
checkout=${2:-}
if [ -n "$checkout" ]; then
    echo "$checkout"
    exit 0
fi
target=.upstream/$delivery
py=${PY:-.venv/bin/python}
# A clone made for an older patch set (a patch added or changed since) is our own cache: clone it again.
if [ -d "$target" ] && ! "$py" -m deliverykit patches status --delivery "$delivery" --upstream "$target" 2>/dev/null \
        | tail -n 1 | grep -Eq '^([0-9]+) of \1 patch'; then
    echo "$target: made for another patch set; cloning it again" >&2
    rm -rf "$target"
fi
if [ ! -d "$target" ]; then
    mkdir -p .upstream
    if ! "$py" -m deliverykit upstream clone --delivery "$delivery" --into "$target" >&2; then
        rm -rf "$target"
        exit 1
    fi
fi
echo "$PWD/$target"
