"""What is installed, checked without importing (importing torch_npu without CANN has side effects)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from functools import cache
from types import ModuleType


def is_package_installed(name: str) -> bool:
    """True when a module named ``name`` can be found; nothing is imported."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def is_torch_npu_installed() -> bool:
    """True when the ``torch_npu`` package is installed. It says nothing about CANN or a device."""
    return is_package_installed("torch_npu")


@cache
def package_version(distribution: str) -> str | None:
    """Installed version of a distribution (``importlib.metadata``), or None."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def load_script(path: str | os.PathLike, name: str) -> ModuleType:
    """Import a script (``inference.py``, ``serve.py``, ``scripts/accuracy.py``) as a module: it is a file, not an
    installed module."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
