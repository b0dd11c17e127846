from __future__ import annotations

import copy
import json
import math
from collections import OrderedDict

import numpy as np
import pytest
import torch
from torch import nn

from deliverykit.compare import (
    Thresholds,
    capture_module_outputs,
    combine_verdicts,
    first_divergence,
    image_verdict,
    layerwise_report,
    psnr,
    snr_db,
    ssim,
    tensor_metrics,
    verdict,
)

# ---------------------------------------------------------------- tensor_metrics


def test_tensor_metrics_by_hand():
    metrics = tensor_metrics(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([1.0, 2.0, 4.0]))

    assert metrics["max_abs"] == 1.0
    assert metrics["mean_abs"] == pytest.approx(1 / 3, rel=1e-15)
    assert metrics["mse"] == pytest.approx(1 / 3, rel=1e-15)
    assert metrics["rel_l2"] == pytest.approx(1 / math.sqrt(14), rel=1e-15)
    # (1*1 + 2*2 + 3*4) / (|a| |b|) = 17 / (sqrt(14) sqrt(21))
    assert metrics["cosine"] == pytest.approx(17 / math.sqrt(14 * 21), rel=1e-15)
    assert metrics["nonfinite"] == 0
    assert isinstance(metrics["nonfinite"], int)


def test_tensor_metrics_in_float64_and_accepts_numpy():
    # 1 + 2**-20 is exact in float64 but rounds to 1 in bfloat16/float16; the difference must survive
    reference = np.array([[1.0, 1.0]], dtype=np.float64)
    candidate = torch.tensor([[1.0 + 2**-20, 1.0]], dtype=torch.float64)
    metrics = tensor_metrics(reference, candidate)
    assert metrics["max_abs"] == 2**-20
    assert metrics["mean_abs"] == 2**-21

    low = torch.tensor([0.1, 0.2], dtype=torch.bfloat16)
    assert tensor_metrics(low, low.float())["max_abs"] == 0.0


def test_tensor_metrics_zero_norm_cases():
    zero = torch.zeros(3)
    ones = torch.ones(3)
    both_zero = tensor_metrics(zero, zero)
    assert (both_zero["cosine"], both_zero["rel_l2"]) == (1.0, 0.0)
    zero_reference = tensor_metrics(zero, ones)
    assert (zero_reference["cosine"], zero_reference["rel_l2"]) == (0.0, math.inf)
    assert tensor_metrics(ones, zero)["cosine"] == 0.0
    assert tensor_metrics(ones, -ones)["cosine"] == -1.0


def test_tensor_metrics_counts_nonfinite():
    metrics = tensor_metrics(torch.zeros(4), torch.tensor([0.0, math.nan, math.inf, -math.inf]))
    assert metrics["nonfinite"] == 3
    assert math.isnan(metrics["max_abs"])
    assert verdict(metrics) == "fail"


def test_tensor_metrics_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(3, 2\)"):
        tensor_metrics(torch.zeros(2, 3), torch.zeros(3, 2))


# ---------------------------------------------------------------- verdict


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        ({"max_abs": 3.48e-5, "mean_abs": 9.09e-7, "nonfinite": 0}, "pass"),
        ({"max_abs": 0.01, "mean_abs": 0.001, "nonfinite": 0}, "pass"),  # limits are inclusive
        ({"max_abs": 0.0177, "mean_abs": 0.0013, "nonfinite": 0}, "fixable"),  # the public port's result
        ({"max_abs": 0.005, "mean_abs": 0.002, "nonfinite": 0}, "fixable"),
        ({"max_abs": 1.0, "mean_abs": 0.0013, "nonfinite": 0}, "fail"),
        ({"max_abs": 0.005, "mean_abs": 0.02, "nonfinite": 0}, "fail"),
        ({"max_abs": 1e-6, "mean_abs": 1e-7, "nonfinite": 1}, "fail"),
        ({"max_abs": math.nan, "mean_abs": math.nan}, "fail"),
    ],
)
def test_verdict(metrics, expected):
    assert verdict(metrics) == expected


def test_verdict_custom_thresholds():
    metrics = {"max_abs": 0.0177, "mean_abs": 0.0013, "nonfinite": 0}
    assert verdict(metrics, Thresholds(max_abs=0.02, mean_abs=0.002)) == "pass"
    assert verdict(metrics, Thresholds(fixable_factor=1.5)) == "fail"


# ---------------------------------------------------------------- psnr / ssim


def test_psnr_of_known_mse():
    image = torch.rand(3, 8, 8)
    assert psnr(image, image + 0.1) == pytest.approx(20.0)  # mse 0.01 -> 10 log10(1 / 0.01)
    assert psnr(image * 255, image * 255 + 25.5, data_range=255.0) == pytest.approx(20.0)
    assert psnr(image, image) == math.inf
    with pytest.raises(ValueError, match="data_range"):
        psnr(image, image, data_range=0.0)


def _ssim_by_hand(x: np.ndarray, y: np.ndarray, data_range: float = 1.0) -> float:
    """SSIM of one [H, W] plane with explicit Gaussian-weighted windows at every valid position."""
    offsets = np.arange(11) - 5
    g = np.exp(-(offsets**2) / (2 * 1.5**2))
    w = np.outer(g, g) / np.outer(g, g).sum()
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    values = []
    for i in range(x.shape[0] - 10):
        for j in range(x.shape[1] - 10):
            px, py = x[i : i + 11, j : j + 11], y[i : i + 11, j : j + 11]
            mx, my = (w * px).sum(), (w * py).sum()
            vx, vy = (w * (px - mx) ** 2).sum(), (w * (py - my) ** 2).sum()
            cxy = (w * (px - mx) * (py - my)).sum()
            values.append((2 * mx * my + c1) * (2 * cxy + c2) / ((mx**2 + my**2 + c1) * (vx + vy + c2)))
    return float(np.mean(values))


def test_ssim_matches_hand_computation():
    rng = np.random.default_rng(0)
    x = rng.random((2, 13, 14))
    y = np.clip(x + rng.normal(0, 0.1, x.shape), 0, 1)
    expected = np.mean([_ssim_by_hand(x[c], y[c]) for c in range(2)])
    assert ssim(x, y) == pytest.approx(expected, rel=1e-12)
    assert ssim(torch.from_numpy(x[0]), torch.from_numpy(y[0])) == pytest.approx(_ssim_by_hand(x[0], y[0]), rel=1e-12)


def test_ssim_batch_averages_planes():
    rng = np.random.default_rng(1)
    x = rng.random((2, 3, 12, 12))
    y = np.clip(x + rng.normal(0, 0.2, x.shape), 0, 1)
    expected = np.mean([_ssim_by_hand(x[n, c], y[n, c]) for n in range(2) for c in range(3)])
    assert ssim(x, y) == pytest.approx(expected, rel=1e-12)


def test_ssim_identical_and_constant_images():
    image = torch.rand(3, 16, 16)
    assert ssim(image, image) == pytest.approx(1.0, abs=1e-12)
    # constant images: zero variances, so SSIM = (2ab + C1) / (a^2 + b^2 + C1)
    a, b, c1 = 0.5, 0.6, 0.01**2
    expected = (2 * a * b + c1) / (a**2 + b**2 + c1)
    constant_a, constant_b = torch.full((16, 16), a, dtype=torch.float64), torch.full((16, 16), b, dtype=torch.float64)
    assert ssim(constant_a, constant_b) == pytest.approx(expected, rel=1e-12)


def test_ssim_decreases_with_noise():
    generator = torch.Generator().manual_seed(0)
    image = torch.rand(3, 32, 32, generator=generator)
    noise = torch.randn(image.shape, generator=generator)
    scores = [ssim(image, image + sigma * noise) for sigma in (0.01, 0.05, 0.1, 0.3)]
    assert scores == sorted(scores, reverse=True)
    assert scores[0] < 1.0


@pytest.mark.parametrize(("shape", "message"), [((10, 16), "at least 11x11"), ((1, 1, 1, 16, 16), r"\[H,W\]")])
def test_ssim_rejects_bad_shapes(shape, message):
    with pytest.raises(ValueError, match=message):
        ssim(torch.zeros(shape), torch.zeros(shape))


# ---------------------------------------------------------------- capture and layerwise comparison


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    layers = OrderedDict()
    for i in range(1, 5):
        layers[f"fc{i}"] = nn.Linear(8, 8)
        if i < 4:
            layers[f"act{i}"] = nn.ReLU()
    return nn.Sequential(layers)


def _no_hooks(model: nn.Module) -> bool:
    return all(not module._forward_hooks for module in model.modules())


def test_capture_leaf_outputs_match_manual_forward():
    model = _mlp()
    x = torch.randn(2, 8)
    with torch.no_grad(), capture_module_outputs(model) as outputs:
        model(x)

    assert list(outputs) == ["fc1", "act1", "fc2", "act2", "fc3", "act3", "fc4"]
    expected = x
    with torch.no_grad():
        for name, layer in model.named_children():
            expected = layer(expected)
            torch.testing.assert_close(outputs[name], expected, rtol=0, atol=0)
    assert _no_hooks(model)


def test_capture_patterns_detach_and_copy():
    model = _mlp()
    x = torch.randn(2, 8)
    with capture_module_outputs(model, ["fc*", "act3"]) as outputs:
        y = model(x)
    assert list(outputs) == ["fc1", "fc2", "fc3", "act3", "fc4"]
    assert not outputs["fc4"].requires_grad
    torch.testing.assert_close(outputs["fc4"], y.detach())
    y.data.add_(1.0)  # the captured tensor is a copy, not a view of the live output
    assert not torch.equal(outputs["fc4"], y.detach())


class _TupleOut(nn.Module):
    def forward(self, x):
        return x + 1, x * 100


class _DictOut(nn.Module):
    def forward(self, x):
        return {"mask": None, "hidden": x * 2, "other": x * 3}


def test_capture_takes_first_tensor_of_tuples_and_dicts():
    from transformers.utils import ModelOutput

    class _ModelOut(nn.Module):
        def forward(self, x):
            return ModelOutput(last_hidden_state=x - 1)

    wrapper = nn.ModuleDict({"tuple": _TupleOut(), "dict": _DictOut(), "model_output": _ModelOut()})
    x = torch.ones(3)
    with capture_module_outputs(wrapper) as outputs:
        for module in wrapper.values():
            module(x)
    torch.testing.assert_close(outputs["tuple"], x + 1)
    torch.testing.assert_close(outputs["dict"], x * 2)
    torch.testing.assert_close(outputs["model_output"], x - 1)


def test_capture_unknown_name_lists_available():
    model = _mlp()
    with pytest.raises(ValueError, match=r"'nope'.*'fc1'"), capture_module_outputs(model, ["fc1", "nope"]):
        pass
    assert _no_hooks(model)


def test_capture_removes_hooks_on_exception():
    model = _mlp()
    with pytest.raises(RuntimeError, match="boom"), capture_module_outputs(model):
        assert not _no_hooks(model)
        raise RuntimeError("boom")
    assert _no_hooks(model)


def test_first_divergence_finds_perturbed_layer():
    reference_model = _mlp()
    candidate_model = copy.deepcopy(reference_model)
    with torch.no_grad():
        candidate_model.fc2.weight.add_(0.05)
    x = torch.randn(4, 8)
    with torch.no_grad(), capture_module_outputs(reference_model) as reference:
        reference_model(x)
    with torch.no_grad(), capture_module_outputs(candidate_model) as candidate:
        candidate_model(x)

    found = first_divergence(reference, candidate, max_abs=1e-3)
    assert found is not None
    assert (found["name"], found["index"]) == ("fc2", 2)
    assert found["max_abs"] == pytest.approx((reference["fc2"] - candidate["fc2"]).abs().max().item())
    assert first_divergence(reference, reference, max_abs=0.0) is None

    report = layerwise_report(reference, candidate)
    assert [row["name"] for row in report] == list(reference)
    assert [row["max_abs"] for row in report[:2]] == [0.0, 0.0]
    assert report[2]["max_abs"] == found["max_abs"]
    json.dumps(report)  # rows are JSON-ready


def test_first_divergence_treats_nan_as_diverged():
    reference = {"a": torch.zeros(2), "b": torch.zeros(2)}
    candidate = {"a": torch.zeros(2), "b": torch.tensor([0.0, math.nan])}
    assert first_divergence(reference, candidate, max_abs=1.0)["name"] == "b"


def test_layerwise_requires_reference_layers_in_candidate():
    with pytest.raises(ValueError, match="'b'"):
        layerwise_report({"a": torch.zeros(1), "b": torch.zeros(1)}, {"a": torch.zeros(1)})


# ---------------------------------------------------------------- cosine limit, image verdict, snr, every output


def test_verdict_cosine_limit_grades_one_minus_cosine():
    limits = Thresholds(max_abs=1.0, mean_abs=1.0, min_cosine=0.9999)
    close = {"max_abs": 0.0, "mean_abs": 0.0, "cosine": 0.99995, "nonfinite": 0}
    assert verdict(close, limits) == "pass"
    assert verdict({**close, "cosine": 0.9995}, limits) == "fixable"  # 1 - cos = 5e-4 <= 10 x 1e-4
    assert verdict({**close, "cosine": 0.99}, limits) == "fail"
    assert verdict({**close, "cosine": math.nan}, limits) == "fail"
    # without the limit, cosine is not looked at (and may be absent)
    assert verdict({"max_abs": 0.0, "mean_abs": 0.0}, Thresholds(max_abs=1.0, mean_abs=1.0)) == "pass"


@pytest.mark.parametrize(
    ("psnr_db", "ssim_value", "expected"),
    [
        (35.0, 0.99, "pass"),
        (30.0, 0.95, "pass"),  # limits are inclusive
        (21.0, 0.99, "fixable"),  # MSE 10^0.9 ≈ 7.9x the limit's
        (19.0, 0.99, "fail"),  # MSE 12.6x
        (40.0, 0.6, "fixable"),  # 1 - SSIM = 0.4 <= 10 x 0.05
        (40.0, 0.4, "fail"),
        (math.inf, 1.0, "pass"),  # identical images
        (math.nan, 1.0, "fail"),
    ],
)
def test_image_verdict(psnr_db, ssim_value, expected):
    assert image_verdict({"psnr_db": psnr_db, "ssim": ssim_value}) == expected


def test_combine_verdicts_takes_the_worst_and_rejects_unknown():
    assert combine_verdicts([]) == "pass"
    assert combine_verdicts(["pass", "fixable", "pass"]) == "fixable"
    assert combine_verdicts(["fixable", "fail"]) == "fail"
    with pytest.raises(ValueError, match="ok"):
        combine_verdicts(["pass", "ok"])


def test_snr_of_known_noise_power():
    reference = torch.tensor([3.0, -4.0])  # energy 25
    assert snr_db(reference, reference + torch.tensor([0.5, 0.0])) == pytest.approx(10 * math.log10(25 / 0.25))
    assert snr_db(reference, reference) == math.inf
    assert snr_db(torch.zeros(2), torch.ones(2)) == -math.inf
    # scale-free, unlike PSNR: the same relative noise gives the same SNR at any amplitude
    noise = torch.randn(100, generator=torch.Generator().manual_seed(0))
    signal = torch.randn(100, generator=torch.Generator().manual_seed(1))
    assert snr_db(signal, signal + 0.01 * noise) == pytest.approx(snr_db(1000 * signal, 1000 * (signal + 0.01 * noise)))


def test_capture_every_output_names_tuple_and_dict_items():
    wrapper = nn.ModuleDict({"tuple": _TupleOut(), "dict": _DictOut(), "plain": nn.Identity()})
    x = torch.ones(3)
    with capture_module_outputs(wrapper, ["tuple", "dict", "plain"], every_output=True) as outputs:
        for module in wrapper.values():
            module(x)
    expected = {
        "tuple[0]": x + 1,
        "tuple[1]": x * 100,
        "dict[hidden]": x * 2,
        "dict[other]": x * 3,
        "plain": x,
    }
    assert set(outputs) == set(expected)  # the None mask of the dict output is skipped
    for name, tensor in expected.items():
        torch.testing.assert_close(outputs[name], tensor)
