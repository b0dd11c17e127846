"""Accuracy comparison: tensor metrics, image metrics, pass/fixable/fail verdicts and layer-by-layer capture.

Every metric is computed in float64 on the CPU, so the comparison itself adds no error of the precision under test.
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

ArrayLike = torch.Tensor | np.ndarray

_SSIM_WINDOW = 11
_SSIM_SIGMA = 1.5
_SSIM_K1 = 0.01
_SSIM_K2 = 0.03


def _as_float64(x: ArrayLike) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().to(device="cpu", dtype=torch.float64)
    return torch.as_tensor(np.asarray(x), dtype=torch.float64)


def _as_float64_pair(reference: ArrayLike, candidate: ArrayLike) -> tuple[torch.Tensor, torch.Tensor]:
    ref, cand = _as_float64(reference), _as_float64(candidate)
    if ref.shape != cand.shape:
        raise ValueError(f"shape mismatch: reference {tuple(ref.shape)} vs candidate {tuple(cand.shape)}")
    if ref.numel() == 0:
        raise ValueError("cannot compare empty tensors")
    return ref, cand


def _cosine(ref: torch.Tensor, cand: torch.Tensor) -> float:
    ref_norm, cand_norm = ref.norm().item(), cand.norm().item()
    if ref_norm == 0.0 and cand_norm == 0.0:
        return 1.0
    if ref_norm == 0.0 or cand_norm == 0.0:
        return 0.0
    cosine = torch.dot(ref.flatten(), cand.flatten()).item() / (ref_norm * cand_norm)
    # rounding can step just past +-1; NaN (from NaN/Inf inputs) is kept, not clamped
    return max(-1.0, min(1.0, cosine)) if math.isfinite(cosine) else cosine


def _rel_l2(ref_norm: float, diff_norm: float) -> float:
    if ref_norm == 0.0:
        return 0.0 if diff_norm == 0.0 else math.inf
    return diff_norm / ref_norm


def tensor_metrics(reference: ArrayLike, candidate: ArrayLike) -> dict[str, float]:
    """Element-wise error of ``candidate`` against ``reference`` (tensors or arrays of the same shape).

    Keys: ``max_abs``, ``mean_abs``, ``mse``, ``cosine`` (of the flattened tensors), ``rel_l2`` (``||c - r|| / ||r||``)
    and ``nonfinite`` (int: NaN/Inf count in the candidate). NaN propagates into the float metrics on purpose.
    Zero-norm cases: cosine is 1.0 for two zero tensors and 0.0 when only one is zero (no direction to compare);
    rel_l2 is 0.0 when both are zero and inf when only the reference is.
    """
    ref, cand = _as_float64_pair(reference, candidate)
    diff = cand - ref
    abs_diff = diff.abs()
    return {
        "max_abs": abs_diff.max().item(),
        "mean_abs": abs_diff.mean().item(),
        "mse": diff.square().mean().item(),
        "cosine": _cosine(ref, cand),
        "rel_l2": _rel_l2(ref.norm().item(), diff.norm().item()),
        "nonfinite": int((~torch.isfinite(cand)).sum().item()),
    }


def _check_data_range(data_range: float) -> None:
    if not data_range > 0:
        raise ValueError(f"data_range must be > 0 (max - min of the image values), got {data_range!r}")


def psnr(reference: ArrayLike, candidate: ArrayLike, data_range: float = 1.0) -> float:
    """Peak signal-to-noise ratio in dB; inf when the images are identical."""
    _check_data_range(data_range)
    ref, cand = _as_float64_pair(reference, candidate)
    mse = (cand - ref).square().mean().item()
    if mse == 0.0:
        return math.inf
    return 10.0 * math.log10(data_range**2 / mse)


def snr_db(reference: ArrayLike, candidate: ArrayLike) -> float:
    """Signal-to-noise ratio in dB, ``10·log10(Σ reference² / Σ (candidate − reference)²)``; inf when identical.

    For signals without a fixed range (audio waveforms, latents), where PSNR's peak would be arbitrary.
    A silent reference with a non-silent candidate gives -inf; NaN propagates.
    """
    ref, cand = _as_float64_pair(reference, candidate)
    signal, noise = ref.square().sum().item(), (cand - ref).square().sum().item()
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def _gaussian_window() -> torch.Tensor:
    offsets = torch.arange(_SSIM_WINDOW, dtype=torch.float64) - (_SSIM_WINDOW - 1) / 2
    g = torch.exp(-(offsets**2) / (2 * _SSIM_SIGMA**2))
    g = g / g.sum()
    return torch.outer(g, g).view(1, 1, _SSIM_WINDOW, _SSIM_WINDOW)


def _as_image_planes(x: torch.Tensor) -> torch.Tensor:
    """[H,W], [C,H,W] or [N,C,H,W] -> [P,1,H,W] with one plane per image channel."""
    if x.ndim not in (2, 3, 4):
        raise ValueError(f"SSIM expects images shaped [H,W], [C,H,W] or [N,C,H,W], got {tuple(x.shape)}")
    height, width = x.shape[-2:]
    if height < _SSIM_WINDOW or width < _SSIM_WINDOW:
        raise ValueError(f"SSIM needs images of at least {_SSIM_WINDOW}x{_SSIM_WINDOW}, got {height}x{width}")
    return x.reshape(-1, 1, height, width)


def ssim(reference: ArrayLike, candidate: ArrayLike, data_range: float = 1.0) -> float:
    """Structural similarity (Wang et al. 2004), averaged over channels and images.

    Images are [H,W], [C,H,W] or [N,C,H,W] (channels first). Uses an 11x11 Gaussian window with sigma 1.5,
    K1=0.01, K2=0.03, population (co)variances and only the positions where the window fits ('valid'), which
    matches scikit-image's ``structural_similarity(gaussian_weights=True, use_sample_covariance=False)``.
    """
    _check_data_range(data_range)
    ref, cand = _as_float64_pair(reference, candidate)
    x, y = _as_image_planes(ref), _as_image_planes(cand)
    window = _gaussian_window()

    def local_mean(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(t, window)

    mu_x, mu_y = local_mean(x), local_mean(y)
    var_x = local_mean(x * x) - mu_x**2
    var_y = local_mean(y * y) - mu_y**2
    cov_xy = local_mean(x * y) - mu_x * mu_y
    c1 = (_SSIM_K1 * data_range) ** 2
    c2 = (_SSIM_K2 * data_range) ** 2
    ssim_map = ((2 * mu_x * mu_y + c1) * (2 * cov_xy + c2)) / ((mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2))
    return ssim_map.mean(dim=(1, 2, 3)).mean().item()


@dataclass(frozen=True)
class Thresholds:
    """Acceptance limits on ``max_abs`` and ``mean_abs`` for :func:`verdict`.

    ``fixable_factor`` separates a precision problem from a wrong result: an error within that factor of the
    limits, with no NaN/Inf, is what a precision patch (fp32 upcast of a sensitive op) fixes. The public port
    reported max_abs 0.0177 / mean_abs 0.0013 against these limits and called it fixable, which these rules
    reproduce.

    ``min_cosine`` (optional) also requires the cosine of :func:`tensor_metrics`; its error is ``1 - cosine``, so
    "within the factor" means ``1 - cosine <= fixable_factor * (1 - min_cosine)``.
    """

    max_abs: float = 0.01
    mean_abs: float = 0.001
    fixable_factor: float = 10.0
    min_cosine: float | None = None


DEFAULT_THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class ImageThresholds:
    """Acceptance limits for :func:`image_verdict`: PSNR (dB) and SSIM of images on the same data range.

    ``fixable`` means the error quantities are within ``fixable_factor`` of the limits: the MSE (PSNR at most
    ``10·log10(fixable_factor)`` dB below ``min_psnr_db``) and ``1 - SSIM``.
    """

    min_psnr_db: float = 30.0
    min_ssim: float = 0.95
    fixable_factor: float = 10.0


DEFAULT_IMAGE_THRESHOLDS = ImageThresholds()


def verdict(metrics: Mapping[str, float], thresholds: Thresholds = DEFAULT_THRESHOLDS) -> str:
    """``"pass"``, ``"fixable"`` or ``"fail"`` for metrics from :func:`tensor_metrics`.

    NaN metrics never pass (every comparison with NaN is false); a missing ``nonfinite`` key counts as 0.
    """
    max_abs, mean_abs = metrics["max_abs"], metrics["mean_abs"]
    if metrics.get("nonfinite", 0) > 0:
        return "fail"
    factor = thresholds.fixable_factor
    grades = [
        _grade_error(max_abs, thresholds.max_abs, factor),
        _grade_error(mean_abs, thresholds.mean_abs, factor),
    ]
    if thresholds.min_cosine is not None:
        grades.append(_grade_error(1.0 - metrics["cosine"], 1.0 - thresholds.min_cosine, factor))
    return combine_verdicts(grades)


def image_verdict(metrics: Mapping[str, float], thresholds: ImageThresholds = DEFAULT_IMAGE_THRESHOLDS) -> str:
    """``"pass"``, ``"fixable"`` or ``"fail"`` for ``{"psnr_db", "ssim"}`` of one image or video; NaN fails."""
    factor = thresholds.fixable_factor
    psnr_db = metrics["psnr_db"]
    psnr_grade = (
        "pass"
        if psnr_db >= thresholds.min_psnr_db
        else "fixable"
        if psnr_db >= thresholds.min_psnr_db - 10.0 * math.log10(factor)
        else "fail"
    )
    return combine_verdicts([psnr_grade, _grade_error(1.0 - metrics["ssim"], 1.0 - thresholds.min_ssim, factor)])


def _grade_error(error: float, limit: float, factor: float) -> str:
    # written so that NaN (every comparison false) fails
    return "pass" if error <= limit else "fixable" if error <= factor * limit else "fail"


def combine_verdicts(verdicts: Iterable[str]) -> str:
    """The worst of several verdicts: any ``"fail"`` fails, else any ``"fixable"`` is fixable, else ``"pass"``."""
    verdicts = list(verdicts)
    unknown = set(verdicts) - {"pass", "fixable", "fail"}
    if unknown:
        raise ValueError(f"unknown verdicts {sorted(unknown)}; expected pass, fixable or fail")
    return "fail" if "fail" in verdicts else "fixable" if "fixable" in verdicts else "pass"


def _every_tensor(name: str, output: Any) -> dict[str, torch.Tensor]:
    """Each tensor of a tuple/list (``name[i]``) or dict (``name[key]``) output; a bare tensor keeps ``name``."""
    if isinstance(output, torch.Tensor):
        return {name: output}
    if isinstance(output, Mapping):
        items = output.items()
    elif isinstance(output, (tuple, list)):
        items = enumerate(output)
    else:
        return {}
    return {f"{name}[{key}]": value for key, value in items if isinstance(value, torch.Tensor)}


def _first_tensor(output: Any) -> torch.Tensor | None:
    """The tensor a layer's output stands for: itself, element 0 of a tuple/list, or a dict's first tensor."""
    if isinstance(output, (tuple, list)) and output:
        output = output[0]
    elif isinstance(output, Mapping):  # also transformers' ModelOutput, an OrderedDict
        output = next((v for v in output.values() if isinstance(v, torch.Tensor)), None)
    return output if isinstance(output, torch.Tensor) else None


def _select_modules(model: torch.nn.Module, names: Iterable[str] | None) -> dict[str, torch.nn.Module]:
    named = dict(model.named_modules())
    if names is None:
        return {name: module for name, module in named.items() if next(module.children(), None) is None}
    patterns = [names] if isinstance(names, str) else list(names)
    unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(name, p) for name in named)]
    if unmatched:
        available = ", ".join(repr(name) for name in list(named)[1:11])
        raise ValueError(f"no submodule matches {unmatched}; available names include {available}")
    return {name: module for name, module in named.items() if any(fnmatch.fnmatchcase(name, p) for p in patterns)}


@contextlib.contextmanager
def capture_module_outputs(
    model: torch.nn.Module, names: Iterable[str] | None = None, *, every_output: bool = False
) -> Iterator[dict[str, torch.Tensor]]:
    """Record submodule outputs during forwards run inside the block: ``{name: tensor}`` in execution order.

    ``names`` are module names or fnmatch patterns (``"layers.*.mlp"``; ``*`` also matches dots); None selects
    every leaf module. Outputs are detached CPU copies (tuple/list: element 0; dict/ModelOutput: first tensor
    value); modules whose output holds no such tensor are not recorded, and a module run several times keeps
    its last output. Hooks are removed on exit, also when the block raises.

    ``every_output=True`` keeps every tensor of a tuple/list or dict output instead of the first, as
    ``name[i]`` / ``name[key]`` (a block returning video and audio hidden states gives ``block[0]``, ``block[1]``).
    """
    modules = _select_modules(model, names)
    outputs: dict[str, torch.Tensor] = {}

    def make_hook(name: str) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if every_output:
                found = _every_tensor(name, output)
            else:
                tensor = _first_tensor(output)
                found = {} if tensor is None else {name: tensor}
            for key, tensor in found.items():
                outputs[key] = tensor.detach().to("cpu", copy=True)

        return hook

    handles = []
    try:
        for name, module in modules.items():
            handles.append(module.register_forward_hook(make_hook(name)))
        yield outputs
    finally:
        for handle in handles:
            handle.remove()


def _common_names(reference: Mapping[str, Any], candidate: Mapping[str, Any]) -> list[str]:
    missing = [name for name in reference if name not in candidate]
    if missing:
        raise ValueError(f"candidate has no output for {len(missing)} reference layer(s), e.g. {missing[:5]}")
    return list(reference)


def first_divergence(
    reference: Mapping[str, torch.Tensor], candidate: Mapping[str, torch.Tensor], max_abs: float
) -> dict[str, Any] | None:
    """The first layer, in the reference's (execution) order, whose max_abs error exceeds ``max_abs``.

    Errors grow as they propagate, so the first layer over the limit is where to look. NaN counts as over.
    Returns ``{"name", "max_abs", "mean_abs", "index"}`` or None when every layer is within the limit.
    """
    for index, name in enumerate(_common_names(reference, candidate)):
        metrics = tensor_metrics(reference[name], candidate[name])
        if not metrics["max_abs"] <= max_abs:
            return {"name": name, "max_abs": metrics["max_abs"], "mean_abs": metrics["mean_abs"], "index": index}
    return None


def layerwise_report(
    reference: Mapping[str, torch.Tensor], candidate: Mapping[str, torch.Tensor]
) -> list[dict[str, Any]]:
    """:func:`tensor_metrics` per layer, in the reference's order, as JSON-ready rows ``{"name", **metrics}``."""
    return [
        {"name": name, **tensor_metrics(reference[name], candidate[name])}
        for name in _common_names(reference, candidate)
    ]
