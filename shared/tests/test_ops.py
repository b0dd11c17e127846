"""The kernel dispatch point: NPU implementations vs their CPU references, selection and the off switch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from deliverykit import ops


def test_every_npu_kernel_matches_its_reference_on_cpu():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(64, 257, generator=generator) * 4
    for name, kernel in ops.kernels().items():
        torch.testing.assert_close(kernel.npu(x.clone()), kernel.reference(x.clone()), atol=2e-6, rtol=0, msg=name)


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
