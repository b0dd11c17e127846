"""The kernel dispatch point: NPU implementations vs their CPU references, selection and the off switch."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

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


def _swiglu_sample(generator: torch.Generator) -> tuple[tuple, dict]:
    return (torch.randn(64, 512, generator=generator) * 4, torch.randn(64, 512, generator=generator) * 4), {}


def _rms_norm_sample(generator: torch.Generator) -> tuple[tuple, dict]:
    x = torch.randn(2, 16, 4, 128, generator=generator) * 4  # 4-D like diffnext's q_norm/k_norm on [B, L, H, D]
    return (x, 1 + 0.5 * torch.randn(128, generator=generator)), {"eps": 1e-6}


def _subm_conv3d_sample(generator: torch.Generator) -> tuple[tuple, dict]:
    grid = (6, 5, 7)
    cells = torch.stack(torch.meshgrid(*(torch.arange(n) for n in (2, *grid)), indexing="ij"), -1).reshape(-1, 4)
    coords = cells[torch.randperm(cells.shape[0], generator=generator)[:90]].int()  # ~20 % of the cells, unsorted
    feats = torch.randn(coords.shape[0], 8, generator=generator)
    weight = torch.randn(16, 3, 3, 3, 8, generator=generator) / 8
    return (feats, coords, grid, weight, torch.randn(16, generator=generator)), {}


# Inputs for the NPU-vs-reference check of each kernel, with its tolerance; a new kernel adds its sample here.
# swiglu: outputs reach ~100, float32 rounds at ~1e-5 there; rms_norm: outputs ~10, float32 ulp ~1e-6.
SAMPLES = {
    "erf_gelu": (_erf_gelu_sample, 2e-6),
    "fusion_attention": (_fusion_attention_sample, 1e-4),
    "swiglu": (_swiglu_sample, 1e-4),
    "rms_norm": (_rms_norm_sample, 1e-5),
    "subm_conv3d": (_subm_conv3d_sample, 1e-5),  # sums of <= 27·8 products ~1: float32 rounding ~1e-6
}

# One rounding of the output dtype apart: 1 ulp relative is at most 2^-23 / 2^-10 / 2^-7 (fp32 / fp16 / bf16);
# atol covers outputs near 0 where the relative bound is meaningless. Two roundings (rms_norm): twice that.
ULP = {torch.float32: 2.0**-23, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}
DTYPES = list(ULP)


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
        pytest.skip(f"{name}: the NPU implementation calls an op that only an NPU runs (see the NPU test)")
    torch.testing.assert_close(kernel.npu(*args, **kwargs), kernel.reference(*args, **kwargs), atol=atol, rtol=0)


@require_npu
@pytest.mark.parametrize("name", sorted(ops.kernels()))
def test_every_npu_kernel_matches_its_reference_on_npu(name):
    kernel = ops.kernels()[name]
    if not kernel.installed():
        pytest.skip(f"{name}: needs {kernel.requires}, not installed (the README says how)")
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


def test_a_kernel_from_an_optional_package_is_chosen_only_where_it_is_installed(tmp_path, monkeypatch):
    kernel = ops.kernels()["subm_conv3d"]
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not (Path(p) / kernel.requires).exists()])
    assert not kernel.installed() and not ops.uses_npu_kernel("subm_conv3d", "npu:0")
    assert ops.select("subm_conv3d", "npu:0") is kernel.reference
    (tmp_path / kernel.requires).mkdir()
    (tmp_path / kernel.requires / "__init__.py").write_text("")  # found, never imported: selection only looks
    monkeypatch.syspath_prepend(str(tmp_path))
    assert kernel.installed() and ops.select("subm_conv3d", "npu:0") is kernel.npu
    assert ops.select("subm_conv3d", "cpu") is kernel.reference
    monkeypatch.setenv(ops.DISABLE_ENV_VAR, "subm_conv3d")
    assert ops.select("subm_conv3d", "npu:0") is kernel.reference


def test_subm_conv3d_reference_is_the_sum_over_active_neighbours():
    """Each output row summed by hand: centred 3³ shifts, K0 ↔ x, neighbours of the same batch item only."""
    feats, coords, grid, weight, bias = _sample("subm_conv3d")[0]
    out = ops.call("subm_conv3d", feats, coords, grid, weight, bias)
    row_of = {tuple(c): i for i, c in enumerate(coords.tolist())}
    for i, (b, x, y, z) in enumerate(coords.tolist()):
        expected = bias.double().clone()
        for i0, i1, i2 in itertools.product(range(3), repeat=3):
            j = row_of.get((b, x + i0 - 1, y + i1 - 1, z + i2 - 1))
            if j is not None:
                expected += weight[:, i0, i1, i2, :].double() @ feats[j].double()
        torch.testing.assert_close(out[i].double(), expected, atol=1e-5, rtol=0)


def _swiglu_inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    (gate, up), _ = _swiglu_sample(torch.Generator().manual_seed(1))
    return gate.to(dtype), up.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_through_the_documented_npu_op_matches_the_reference(dtype):
    gate, up = _swiglu_inputs(dtype)
    out = ops.swiglu_via(ops.npu_swiglu_reference, gate, up)
    reference = ops.call("swiglu", gate, up)
    assert out.dtype == reference.dtype == dtype
    # fp32: x·y/(1+e^-x) vs x·sigmoid(x)·y round differently in float32 (a few ulp); half precision: one final rounding
    rtol = 4 * ULP[dtype] if dtype == torch.float32 else ULP[dtype]
    torch.testing.assert_close(out, reference, rtol=rtol, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_concat_order_is_pinned(dtype):
    """npu_swiglu gates the FIRST half: cat([up, gate]) computes silu(up)·gate, wrong by tens on these inputs."""
    gate, up = _swiglu_inputs(dtype)
    reference = ops.call("swiglu", gate, up).float()
    swapped = ops.swiglu_via(ops.npu_swiglu_reference, up, gate).float()
    assert (swapped - reference).abs().max() > 20


def test_swiglu_reference_is_silu_gate_times_up_in_float64():
    gate, up = (t.double() for t in _swiglu_inputs(torch.float32))
    expected = F.silu(gate) * up
    torch.testing.assert_close(ops.call("swiglu", gate.float(), up.float()).double(), expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="odd"):
        ops.npu_swiglu_reference(torch.zeros(2, 5))


def _rms_inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    (x, weight), _ = _rms_norm_sample(torch.Generator().manual_seed(2))
    return x.to(dtype), weight.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_through_the_documented_npu_op_matches_the_reference(dtype):
    x, weight = _rms_inputs(dtype)
    out = ops.rms_norm_via(lambda *a, **k: ops.npu_rms_norm_reference(*a, **k), x, weight, 1e-6)
    reference = ops.call("rms_norm", x, weight, 1e-6)
    assert out.dtype == reference.dtype == dtype
    torch.testing.assert_close(out, reference, rtol=2 * ULP[dtype], atol=1e-5)


def test_rms_norm_reference_in_float64_and_the_op_contract():
    x, weight = (t.double() for t in _rms_inputs(torch.float32))
    expected = x / torch.sqrt(x.square().mean(-1, keepdim=True) + 1e-6) * weight
    # the rsqrt runs in float32 whatever the input dtype (x.float() upstream), hence float32-level agreement
    torch.testing.assert_close(ops.call("rms_norm", x, weight, 1e-6), expected, rtol=1e-6, atol=1e-6)
    y, rstd = ops.npu_rms_norm_reference(x.half(), weight.half())
    assert y.dtype == torch.float16 and rstd.dtype == torch.float32 and rstd.shape == (*x.shape[:-1], 1)
    with pytest.raises(TypeError, match="gamma in x's dtype"):
        ops.npu_rms_norm_reference(x.half(), weight.float())  # why rms_norm_via casts gamma first
    seen = {}

    def spy(x, gamma, epsilon):
        seen.update(gamma_dtype=gamma.dtype, epsilon=epsilon)
        return ops.npu_rms_norm_reference(x, gamma, epsilon)

    ops.rms_norm_via(spy, x.half(), weight.float(), 1e-5)
    assert seen == {"gamma_dtype": torch.float16, "epsilon": 1e-5}
