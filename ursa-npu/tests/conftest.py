"""Fixtures for the ursa-npu tests: import paths, the CLI in process, and (with ``$URSA_SRC``) a patched checkout.

Tests that need diffnext take ``patched_upstream``: a scratch copy of ``$URSA_SRC`` reset to the pinned commit
with this delivery's patches applied through deliverykit; without ``$URSA_SRC`` they skip.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from deliverykit.assets import patches
from deliverykit.device import guard_cpu_kernels
from deliverykit.errors import run_main
from deliverykit.testing import ignore_tests_below_python, load_script, pristine_copy, upstream_checkout

DELIVERY_DIR = Path(__file__).resolve().parents[1]
guard_cpu_kernels()  # in-process CPU runs under a forced ATEN_CPU_CAPABILITY (see its docstring)
collect_ignore_glob = ignore_tests_below_python((3, 11), "ursa-npu needs Python >= 3.11 (diffusers 0.42.1)")
if str(DELIVERY_DIR) not in sys.path:  # ursa_npu, as `python inference.py` and the patched diffnext see it
    sys.path.insert(0, str(DELIVERY_DIR))


@pytest.fixture(scope="session")
def inference_module():
    """``ursa-npu/inference.py`` imported as a module, to call ``main(argv)`` in process."""
    return load_script(DELIVERY_DIR / "inference.py", "ursa_inference")


@pytest.fixture
def run_cli(inference_module, capsys):
    """Run the CLI in process like ``python inference.py ARGS``; return (exit code, stdout, stderr)."""

    def run(*argv: object) -> tuple[int, str, str]:
        code = run_main(lambda: inference_module.main([str(a) for a in argv]))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


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
