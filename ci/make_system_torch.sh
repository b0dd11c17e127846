#!/usr/bin/env bash
# Build a "system torch" interpreter for ci/compat_check.py: a plain CPython prefix with only torch installed, as on
# an Ascend image (there torch + torch_npu sit in the system interpreter's own site-packages).
#
# Usage: ci/make_system_torch.sh DEST TORCH_VERSION [SOURCE_PREFIX]
#
# Why a copied prefix: `python -m venv` gives a venv, which ci/setup_venv.sh refuses (a venv made from inside a venv
# sees the base interpreter's packages); installing into Debian's /usr/bin/python3.11 would change a shared machine.
# So the standard library, lib-dynload and the interpreter binary of SOURCE_PREFIX (default: the base prefix of
# python3; it must be a CPython built with --enable-shared, like pyenv's) are copied to DEST with an empty
# site-packages, pip is bootstrapped with ensurepip, and torch==TORCH_VERSION is installed from the package index with
# its own requirements. sys.prefix == sys.base_prefix == DEST. The binary keeps its RUNPATH to SOURCE_PREFIX/lib
# for libpython (the same file that is copied); nothing else is read from SOURCE_PREFIX.
set -euo pipefail

dest=${1:?usage: ci/make_system_torch.sh DEST TORCH_VERSION [SOURCE_PREFIX]}
version=${2:?usage: ci/make_system_torch.sh DEST TORCH_VERSION [SOURCE_PREFIX]}
source=${3:-$(python3 -c 'import sys; print(sys.base_prefix)')}
pyver=$("$source/bin/python3" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
if [ -e "$dest" ]; then
    echo "error: $dest already exists; remove it or choose another DEST" >&2
    exit 2
fi

mkdir -p "$dest/bin" "$dest/lib/python$pyver/site-packages"
cp -a "$source/include" "$dest/"
cp -a "$source/lib/libpython$pyver.so"* "$source/lib/libpython3.so" "$dest/lib/"
(cd "$source/lib/python$pyver" && tar cf - --exclude=./site-packages --exclude=__pycache__ .) |
    (cd "$dest/lib/python$pyver" && tar xf -)
cp -a "$source/bin/python$pyver" "$dest/bin/"
ln -s "python$pyver" "$dest/bin/python3"
"$dest/bin/python3" -m ensurepip --default-pip > /dev/null
"$dest/bin/python3" -m pip install --no-cache-dir --quiet --disable-pip-version-check "torch==$version"
"$dest/bin/python3" -c 'import sys, torch; assert sys.prefix == sys.base_prefix; print(sys.prefix, "torch", torch.__version__)'
