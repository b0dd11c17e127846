"""Fixtures for the ursa-npu tests: the CLI in process, and (with ``$URSA_SRC``) a patched checkout.

Tests that need diffnext take ``patched_upstream``: a scratch copy of ``$URSA_SRC`` reset to the pinned commit
with this delivery's patches applied through deliverykit; without ``$URSA_SRC`` they skip.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from deliverykit.assets import patches
from deliverykit.device import guard_cpu_kernels
from deliverykit.testing import CliRunner, ignore_tests_below_python, pristine_copy, upstream_checkout

DELIVERY_DIR = Path(__file__).resolve().parents[1]
guard_cpu_kernels()  # in-process CPU runs under a forced ATEN_CPU_CAPABILITY (see its docstring)
collect_ignore_glob = ignore_tests_below_python((3, 11), "ursa-npu needs Python >= 3.11 (diffusers 0.42.1)")
# ursa_npu is imported in the fixtures, not here: below Python 3.11 it is not installed, and this file still loads.


@pytest.fixture(scope="session")
def run_cli() -> CliRunner:
    """``ursa-npu/inference.py`` loaded once: ``run_cli(*argv)`` runs it in process, ``(exit code, stdout, stderr)``."""
    return CliRunner(DELIVERY_DIR / "inference.py")


@pytest.fixture(scope="session")
def pristine_upstream(tmp_path_factory) -> Path:
    """A scratch copy of ``$URSA_SRC`` with ``diffnext/`` reset to the pinned commit (patches not applied)."""
    source = upstream_checkout("URSA_SRC", "diffnext/__init__.py")
    target = tmp_path_factory.mktemp("upstream") / "URSA"
    return pristine_copy(source, target, patches.load_upstream(DELIVERY_DIR).commit, ["diffnext"])


@pytest.fixture(scope="session")
def patched_upstream(pristine_upstream: Path, tmp_path_factory) -> Path:
    """The pinned commit with every patch applied, all or none, as ``deliverykit patches apply`` does."""
    target = tmp_path_factory.mktemp("patched") / "URSA"
    shutil.copytree(pristine_upstream, target, symlinks=True)
    results = patches.apply_patches(patches.open_tree(target), patches.find_patches(DELIVERY_DIR))
    assert all(result.state == patches.OK for result in results), [(r.name, r.reason) for r in results]
    return target


@pytest.fixture(scope="session")
def diffnext_classes(patched_upstream: Path, tmp_path_factory):
    """The patched URSA classes, imported once per session, offline, with a scratch Hugging Face home."""
    from ursa_npu.upstream import import_diffnext

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("HF_HOME", str(tmp_path_factory.mktemp("hf-home")))
        yield import_diffnext(patched_upstream)


@pytest.fixture(scope="session")
def tiny_weights(diffnext_classes, tmp_path_factory) -> Path:
    """A tiny URSA folder (seed 0) written by the patched save_pretrained. Do not modify."""
    from ursa_npu.tiny import write_tiny_weights

    return write_tiny_weights(tmp_path_factory.mktemp("tiny"), diffnext_classes, variant="tiny", seed=0)
