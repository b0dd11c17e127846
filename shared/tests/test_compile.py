"""deliverykit.compile: the torch.compile backend per device type, the eager switch, the lazy per-device decorator."""

from __future__ import annotations

import pytest
import torch

from deliverykit import compile as compile_policy


@pytest.fixture(autouse=True)
def _linux_and_no_switch(monkeypatch):
    monkeypatch.setattr(compile_policy.sys, "platform", "linux")
    monkeypatch.delenv(compile_policy.EAGER_ENV_VAR, raising=False)


def test_backend_per_device_type(monkeypatch):
    sentinel = object()
    monkeypatch.setattr(compile_policy, "torchair_backend", lambda: None)
    assert compile_policy.compile_backend("cpu") == compile_policy.EAGER
    assert compile_policy.compile_backend("cuda") == "inductor"
    assert compile_policy.compile_backend("npu") == compile_policy.EAGER  # no torchair: eager, never inductor
    monkeypatch.setattr(compile_policy, "torchair_backend", lambda: sentinel)
    assert compile_policy.compile_backend("npu") is sentinel


def test_eager_switch_and_other_platforms(monkeypatch):
    monkeypatch.setattr(compile_policy, "torchair_backend", lambda: object())
    monkeypatch.setenv(compile_policy.EAGER_ENV_VAR, "1")
    assert {compile_policy.compile_backend(t) for t in ("cpu", "cuda", "npu")} == {compile_policy.EAGER}
    monkeypatch.delenv(compile_policy.EAGER_ENV_VAR)
    monkeypatch.setattr(compile_policy.sys, "platform", "win32")  # upstream disabled compilation off Linux too
    assert compile_policy.compile_backend("cuda") == compile_policy.EAGER


def test_torchair_backend_is_none_without_torchair():
    assert compile_policy.torchair_backend() is None  # torchair ships with torch_npu, absent in CPU CI


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
