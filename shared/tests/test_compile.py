"""deliverykit.compile: the torch.compile backend per device type, the eager switch, the lazy per-device decorator."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from deliverykit import compile as compile_policy


@pytest.fixture(autouse=True)
def _linux_and_no_switch(monkeypatch):
    monkeypatch.setattr(compile_policy.sys, "platform", "linux")
    monkeypatch.delenv(compile_policy.EAGER_ENV_VAR, raising=False)


def test_backend_per_device_type(monkeypatch):
    monkeypatch.setattr(compile_policy, "npu_backend", lambda: None)
    assert compile_policy.compile_backend("cpu") == compile_policy.EAGER
    assert compile_policy.compile_backend("cuda") == "inductor"
    assert compile_policy.compile_backend("npu") == compile_policy.EAGER  # no npu backend: eager, never inductor
    monkeypatch.setattr(compile_policy, "npu_backend", lambda: "npu")
    assert compile_policy.compile_backend("npu") == "npu" == compile_policy.backend_name("npu:0")
    assert compile_policy.backend_name(torch.device("cpu")) == compile_policy.EAGER


def test_eager_switch_and_other_platforms(monkeypatch):
    monkeypatch.setattr(compile_policy, "npu_backend", lambda: "npu")
    monkeypatch.setenv(compile_policy.EAGER_ENV_VAR, "1")
    assert {compile_policy.compile_backend(t) for t in ("cpu", "cuda", "npu")} == {compile_policy.EAGER}
    monkeypatch.delenv(compile_policy.EAGER_ENV_VAR)
    monkeypatch.setattr(compile_policy.sys, "platform", "win32")  # upstream disabled compilation off Linux too
    assert compile_policy.compile_backend("cuda") == compile_policy.EAGER


# Two fake torch_npu distributions, arranged as the real wheels are (deliverykit.tools.npu_wheels read them): no
# top-level torchair, a lazy sys.modules["torchair"] proxy installed by `import torch_npu` whose __spec__ imports the
# real (here: missing, as without CANN) torchair, and the "npu" dynamo backend registered at import (2.6.0) or
# declared as a torch_dynamo_backends entry point and registered later (2.9.0 and after).
_FAKE_INIT = """
import sys, types
__version__ = "{version}"
class _LazyTorchair(types.ModuleType):
    def __getattr__(self, name):
        if name in ("__spec__", "__path__"):
            raise ImportError("libge_runner.so: cannot open shared object file (CANN not installed)")
        raise AttributeError(name)
sys.modules["torchair"] = _LazyTorchair("torchair")
def _npu_backend(graph_module, example_inputs):
    return graph_module.forward
def _npu_backend_entrypoint(graph_module, example_inputs):
    return graph_module.forward
if {registers_at_import}:
    from torch._dynamo import register_backend
    register_backend(_npu_backend, "npu")
"""
_CHOICE = """
import importlib.util, sys
try:
    before = importlib.util.find_spec("torchair")  # what the old decision asked, before torch_npu is imported
except (ImportError, ValueError):
    before = "error"
from deliverykit import compile as policy
print(before, policy.compile_backend("npu"))
"""


@pytest.mark.parametrize(("version", "registers_at_import"), [("2.6.0.post5", True), ("2.13.0", False)])
def test_the_npu_backend_is_found_as_each_torch_npu_release_ships_it(tmp_path, version, registers_at_import):
    package = tmp_path / "torch_npu"
    package.mkdir()
    (package / "__init__.py").write_text(_FAKE_INIT.format(version=version, registers_at_import=registers_at_import))
    info = tmp_path / f"torch_npu-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch_npu\nVersion: {version}\n")
    if not registers_at_import:
        (info / "entry_points.txt").write_text("[torch_dynamo_backends]\nnpu = torch_npu:_npu_backend_entrypoint\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    env.pop(compile_policy.EAGER_ENV_VAR, None)
    done = subprocess.run([sys.executable, "-c", _CHOICE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    before, chosen = done.stdout.split()
    assert before == "None"  # no top-level torchair: find_spec before `import torch_npu` said eager
    assert chosen == "npu"


def _rope_like(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return w[..., 0].mul(x[..., 0]).add_(w[..., 1] * x[..., 1]).flatten(-2)


def test_decorator_runs_eager_on_cpu_and_compiles_with_the_chosen_backend(monkeypatch):
    x, w = torch.randn(2, 3, 8, 2), torch.randn(2, 3, 8, 2)
    decorated = compile_policy.compile_per_device(fullgraph=True)(_rope_like)
    expected = _rope_like(x, w)
    torch.testing.assert_close(decorated(x, w), expected, rtol=0, atol=0)
    assert decorated.variants[("cpu", False)] is _rope_like  # eager: the function itself, no dynamo

    traced = []

    def recording_backend(graph_module, example_inputs):
        traced.append(len(example_inputs))
        return graph_module.forward

    monkeypatch.setattr(compile_policy, "compile_backend", lambda device_type: recording_backend)
    recompiled = compile_policy.compile_per_device(fullgraph=True)(_rope_like)
    torch.testing.assert_close(recompiled(x, w), expected, rtol=0, atol=0)
    assert traced, "the chosen backend was never called by torch.compile"


def _has_cpp_compiler() -> bool:
    import shutil

    return any(shutil.which(cc) for cc in ("g++", "c++", "clang++"))


@pytest.mark.skipif(not _has_cpp_compiler(), reason="inductor on the CPU needs a C++ compiler (apt-get install g++)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_eager_float32_rounds_like_inductor_where_plain_eager_does_not(dtype):
    """The reference is inductor itself, compiling the kernel as upstream's ``@torch.compile`` does on Linux."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 64, 8, 32, 2, generator=generator).to(dtype)
    w = torch.randn(64, 1, 32, 2, generator=generator).to(dtype)
    torch._dynamo.reset()
    inductor = torch.compile(_rope_like, backend="inductor", fullgraph=True)(x, w)
    ours = compile_policy.compile_per_device(eager_float32=True, fullgraph=True)(_rope_like)(x, w)
    plain = _rope_like(x, w)
    assert ours.dtype == dtype
    # float32 may still differ in its last bit (FMA or not), which can move a value sitting on a half-precision tie
    flipped = (ours != inductor).float().mean().item()
    assert flipped < 1e-3, flipped
    ulp = torch.finfo(dtype).eps * inductor.abs().float().clamp_min(1.0)
    assert ((ours.float() - inductor.float()).abs() <= ulp).all()
    assert (plain != inductor).float().mean().item() > 0.05  # three roundings: the difference this fixes


def test_eager_float32_leaves_float32_untouched():
    x, w = torch.randn(2, 3, 8, 2), torch.randn(2, 3, 8, 2)
    decorated = compile_policy.compile_per_device(eager_float32=True)(_rope_like)
    assert torch.equal(decorated(x, w), _rope_like(x, w))
