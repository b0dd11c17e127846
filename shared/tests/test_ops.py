"""The kernel dispatch point: NPU implementations vs their CPU references, selection and the off switch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from deliverykit import ops
from deliverykit.testing import require_npu


def _erf_gelu_sample(generator: torch.Generator) -> tuple[tuple, dict]:
    return (torch.randn(64, 257, generator=generator) * 4,), {}


def _fusion_attention_sample(generator: torch.Generator) -> tuple[tuple, dict]:
    q, k, v = (torch.randn(10, 2, 64, generator=generator) for _ in range(3))
    varlen = {"scale": 0.125, "actual_seq_qlen": [3, 10], "actual_seq_kvlen": [6, 10]}
    return (q, k, v, 2, "TND"), varlen


# Inputs for the NPU-vs-reference check of each kernel, with its tolerance; a new kernel adds its sample here.
SAMPLES = {
    "erf_gelu": (_erf_gelu_sample, 2e-6),
    "fusion_attention": (_fusion_attention_sample, 1e-4),
}


def _sample(name: str) -> tuple[tuple, dict, float]:
    assert name in SAMPLES, f"kernel {name!r} has no sample input in SAMPLES"
    make, atol = SAMPLES[name]
    args, kwargs = make(torch.Generator().manual_seed(0))
    return args, kwargs, atol


def _on(device: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    def move(x):
        return x.to(device) if isinstance(x, torch.Tensor) else x

    return tuple(move(a) for a in args), {key: move(value) for key, value in kwargs.items()}


@pytest.mark.parametrize("name", sorted(ops.kernels()))
def test_every_npu_kernel_matches_its_reference_on_cpu(name):
    kernel = ops.kernels()[name]
    args, kwargs, atol = _sample(name)
    if not kernel.npu_runs_on_cpu:
        pytest.skip(f"{name}: the NPU implementation calls a torch_npu op that needs an NPU (see the NPU test)")
    torch.testing.assert_close(kernel.npu(*args, **kwargs), kernel.reference(*args, **kwargs), atol=atol, rtol=0)


@require_npu
@pytest.mark.parametrize("name", sorted(ops.kernels()))
def test_every_npu_kernel_matches_its_reference_on_npu(name):
    kernel = ops.kernels()[name]
    args, kwargs, atol = _sample(name)
    npu_args, npu_kwargs = _on("npu:0", args, kwargs)
    out = kernel.npu(*npu_args, **npu_kwargs)
    torch.testing.assert_close(out.cpu(), kernel.reference(*args, **kwargs), atol=atol, rtol=0)


def test_erf_gelu_reference_is_the_erf_formula_not_tanh():
    x = torch.linspace(-5, 5, 2001, dtype=torch.float64)
    exact = 0.5 * x * (1 + torch.erf(x / 2**0.5))
    torch.testing.assert_close(ops.call("erf_gelu", x), exact, atol=1e-12, rtol=0)
    assert (F.gelu(x, approximate="tanh") - exact).abs().max() > 1e-4


def test_selection_by_device_and_off_switch(monkeypatch):
    kernel = ops.kernels()["erf_gelu"]
    assert ops.select("erf_gelu", "cpu") is kernel.reference
    assert ops.select("erf_gelu", torch.device("cuda", 0)) is kernel.reference
    assert ops.select("erf_gelu", "npu:1") is kernel.npu
    monkeypatch.setenv(ops.DISABLE_ENV_VAR, "other, erf_gelu")
    assert ops.select("erf_gelu", "npu:0") is kernel.reference
    monkeypatch.setenv(ops.DISABLE_ENV_VAR, "all")
    assert ops.select("erf_gelu", "npu") is kernel.reference
    with pytest.raises(ValueError, match="unknown kernel 'nope'"):
        ops.select("nope", "cpu")


def test_uses_npu_kernel_follows_select():
    assert ops.uses_npu_kernel("fusion_attention", "npu:0")
    assert not ops.uses_npu_kernel("fusion_attention", "cpu")
    assert ops.select("fusion_attention", "npu:0") is ops.kernels()["fusion_attention"].npu
    with pytest.raises(ValueError, match="unknown kernel"):
        ops.uses_npu_kernel("nope", "npu")
