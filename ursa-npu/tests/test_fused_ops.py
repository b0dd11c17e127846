"""The SwiGLU / RMSNorm hooks the patched flash_attention.py calls: on the CPU they must be upstream's maths."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from deliverykit import ops
from ursa_npu import fused_ops

# 1 ulp relative of each dtype (see shared/tests/test_ops.py); the hooks round once (swiglu) or twice (rms_norm).
ULP = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("dtype", list(ULP))
def test_swiglu_hook_is_silu_gate_times_up_rounded_once(dtype):
    gate, up = (_randn(3, 7, 96, seed=s) * 4 for s in (0, 1))
    out = fused_ops.swiglu(gate.to(dtype), up.to(dtype))
    exact = F.silu(gate.to(dtype).double()) * up.to(dtype).double()
    assert out.dtype == dtype
    # float32 maths then one rounding: within 1 ulp of the exact value (fp32: a few ulp from the float32 maths)
    rtol = 8 * ULP[dtype] if dtype == torch.float32 else ULP[dtype]
    torch.testing.assert_close(out.double(), exact, rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("dtype", list(ULP))
def test_rms_norm_hook_matches_the_float64_formula(dtype):
    x, weight = _randn(2, 5, 4, 128, seed=2) * 4, 1 + 0.5 * _randn(128, seed=3)
    out = fused_ops.rms_norm(x.to(dtype), weight.to(dtype), 1e-6)
    xd = x.to(dtype).double()
    exact = xd / torch.sqrt(xd.square().mean(-1, keepdim=True) + 1e-6) * weight.to(dtype).double()
    assert out.dtype == dtype
    rtol = 8 * ULP[dtype] if dtype == torch.float32 else 3 * ULP[dtype]  # rsqrt rounded, product rounded
    torch.testing.assert_close(out.double(), exact, rtol=rtol, atol=1e-5)


def test_hooks_dispatch_through_deliverykit_and_obey_the_off_switch(monkeypatch):
    calls = []
    for name in ("swiglu", "rms_norm"):
        kernel = ops.Kernel(name, lambda *a, n=name: calls.append(f"{n}:npu"), lambda *a, n=name: calls.append(n), "")
        monkeypatch.setitem(ops._KERNELS, name, kernel)
    cpu, npu = torch.zeros(2, 4), SimpleNamespace(device="npu:0")  # only .device decides the implementation
    for x in (cpu, npu):
        fused_ops.swiglu(x, x)
        fused_ops.rms_norm(x, x, 1e-6)
    monkeypatch.setenv(ops.DISABLE_ENV_VAR, "swiglu")
    fused_ops.swiglu(npu, npu)
    fused_ops.rms_norm(npu, npu, 1e-6)
    assert calls == ["swiglu", "rms_norm", "swiglu:npu", "rms_norm:npu", "swiglu", "rms_norm:npu"]
