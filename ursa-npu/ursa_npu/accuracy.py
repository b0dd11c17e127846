"""Accuracy of a discrete-token model: compare what stays comparable, not final pixels.

URSA samples image tokens: once one token differs, fp16-on-device and fp32-on-CPU follow different trajectories
and their final images are unrelated. So, per prompt, with identical inputs:

1. **First-step logits.** Upstream's own code builds the first transformer input (a pre-hook stops the pipeline
   there); both sides run that one forward. Top-1 agreement on decisive tokens, KL(reference ‖ candidate) of the
   guided distribution the sampler draws from, and the cosine of hidden states at selected layers (forward hooks).
2. **VAE decode parity.** Both decoders get the same token ids: PSNR and max |Δ| of the images.
3. **Final images** (same seed on each side): token agreement and PSNR, reported with the divergence stated;
   they carry no verdict.

Thresholds (``THRESHOLDS``), and why:

- hidden-state cosine ≥ 0.999: cosine = 1 − ½·rel_L2², so 0.999 allows a 4.5 % relative error; fp16 rounding
  (2⁻¹¹ per operation) accumulates to well under 1 % over 28 layers, so more is a bug, not rounding.
- guided KL ≤ 1e-3 nats (mean over tokens): by Pinsker, total variation ≤ √(KL/2) ≈ 2.2 %, i.e. each token's
  sampling distribution moves by at most 2.2 % of its mass.
- top-1 agreement ≥ 0.99 on decisive tokens (reference top-1/top-2 margin ≥ 0.1 logit, ten times fp16's rounding
  of a logit near 10): near-ties flip under any rounding and say nothing about the port.
- VAE PSNR ≥ 40 dB on [0, 1] (RMS error ≤ 1 % of the range, invisible) and max |Δ| ≤ 8/255.

``fixable``: within ten times the limits (a precision patch fixes it); beyond: ``fail``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from deliverykit.compare import capture_module_outputs, psnr, tensor_metrics
from deliverykit.device import make_generator

PROMPTS = (
    "a red cat on the mountain",
    "a blue dog in the house",
    "a small tree under the sky with sun",
    "a big lake and green mountain",
    "a photo of the red house",
)
DECISIVE_MARGIN = 0.1
THRESHOLDS = {"hidden_cosine": 0.999, "guided_kl": 1e-3, "top1_decisive": 0.99, "vae_psnr_db": 40.0, "vae_max_abs": 8}
FIXABLE_FACTOR = 10.0


class _FirstForward(Exception):
    def __init__(self, args: tuple, kwargs: dict):
        super().__init__("first transformer forward captured")
        self.args, self.kwargs = args, kwargs


def first_step_inputs(pipe: Any, prompt: str, *, height: int, width: int, seed: int, **call: Any) -> dict[str, Any]:
    """The transformer's first-step input, built by upstream's ``__call__`` on a CPU pipeline and intercepted."""

    def stop(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        raise _FirstForward(args, kwargs)

    handle = pipe.transformer.register_forward_pre_hook(stop, with_kwargs=True)
    try:
        pipe(prompt=prompt, height=height, width=width, generator=make_generator(seed), output_type="latent", **call)
    except _FirstForward as captured:
        grid = (height // pipe.vae_spatial_stride) * (width // pipe.vae_spatial_stride)
        return {
            "input_ids": captured.args[0].cpu(),
            "kwargs": {k: v.cpu() for k, v in captured.kwargs.items()},
            "n": grid,
        }
    finally:
        handle.remove()
    raise RuntimeError("the pipeline finished without calling the transformer")


def hidden_layer_names(transformer: torch.nn.Module) -> list[str]:
    """First, middle and last decoder layer plus the final norm: where an error enters and how it grows."""
    count = len(transformer.model.layers)
    return [f"model.layers.{i}" for i in sorted({0, count // 2, count - 1})] + ["model.norm"]


@torch.no_grad()
def first_step_forward(pipe: Any, inputs: dict[str, Any], device: torch.device) -> tuple[torch.Tensor, dict]:
    """Image-token logits (float32, CPU, ``[B, n, V]``) and hidden states of one forward on ``device``."""
    transformer = pipe.transformer.to(device)
    with capture_module_outputs(transformer, hidden_layer_names(transformer)) as hidden:
        kwargs = {key: value.to(device) for key, value in inputs["kwargs"].items()}
        logits = transformer(inputs["input_ids"].to(device), **kwargs)[0]
    n = inputs["n"]
    return logits[:, -(n + 1) : -1].float().cpu(), dict(hidden)


def guided(logits: torch.Tensor, guidance: float) -> torch.Tensor:
    """Upstream's CFG on a ``[cond; uncond]`` batch: uncond + s·(cond − uncond) (the first step is below the cut)."""
    if logits.shape[0] == 1:
        return logits
    cond, uncond = logits.double().chunk(2)
    return uncond + guidance * (cond - uncond)


def logits_metrics(reference: torch.Tensor, candidate: torch.Tensor, guidance: float) -> dict[str, Any]:
    """Top-1 agreement (all and decisive tokens), KL of the guided distributions, and tensor metrics of the logits."""
    ref, cand = guided(reference, guidance), guided(candidate, guidance)
    top2 = ref.topk(2, dim=-1).values
    decisive = (top2[..., 0] - top2[..., 1]) >= DECISIVE_MARGIN
    agree = ref.argmax(-1) == cand.argmax(-1)
    log_p, log_q = ref.log_softmax(-1), cand.log_softmax(-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    return {
        "top1_agreement": float(agree.double().mean()),
        "top1_decisive": float(agree[decisive].double().mean()) if decisive.any() else None,
        "decisive_tokens": int(decisive.sum()),
        "guided_kl_mean": float(kl.mean()),
        "guided_kl_max": float(kl.max()),
        "logits": tensor_metrics(reference, candidate),
    }


def hidden_cosines(reference: dict[str, torch.Tensor], candidate: dict[str, torch.Tensor]) -> dict[str, float]:
    return {name: tensor_metrics(reference[name], candidate[name])["cosine"] for name in reference}


def decode_image(pipe: Any, token_ids: torch.Tensor, device: torch.device) -> np.ndarray:
    """uint8 ``[H, W, 3]`` decoded by ``pipe``'s VAE on ``device`` from ``[T, h, w]`` ids."""
    pipe.vae.to(device)
    with torch.no_grad():
        pixels = pipe.image_processor.decode_latents(pipe.vae, token_ids[None].to(device), vae_batch_size=1)
    return pipe.image_processor.postprocess(pixels, output_type="np")[0]


def image_metrics(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """PSNR on [0, 1] and max |Δ| in 8-bit levels."""
    diff = np.abs(reference.astype(np.int16) - candidate.astype(np.int16))
    return {"psnr_db": psnr(reference / 255.0, candidate / 255.0, data_range=1.0), "max_abs": int(diff.max())}


def _grade(value: float | None, limit: float, higher_is_better: bool) -> str:
    if value is None:
        return "pass"  # nothing to judge (no decisive token): the other metrics decide
    if isinstance(value, float) and math.isnan(value):
        return "fail"
    if higher_is_better:
        return (
            "pass" if value >= limit else "fixable" if value >= limit - (1 - limit) * (FIXABLE_FACTOR - 1) else "fail"
        )
    return "pass" if value <= limit else "fixable" if value <= limit * FIXABLE_FACTOR else "fail"


def verdict(sample: dict[str, Any]) -> str:
    """Worst grade over the first-step and VAE checks of one prompt (final images are not graded)."""
    psnr_db = sample["vae"]["psnr_db"]
    grades = [
        _grade(min(sample["hidden_cosine"].values()), THRESHOLDS["hidden_cosine"], True),
        _grade(sample["logits"]["guided_kl_mean"], THRESHOLDS["guided_kl"], False),
        _grade(sample["logits"]["top1_decisive"], THRESHOLDS["top1_decisive"], True),
        "pass" if psnr_db >= THRESHOLDS["vae_psnr_db"] else "fixable" if psnr_db >= 30 else "fail",
        _grade(float(sample["vae"]["max_abs"]), THRESHOLDS["vae_max_abs"], False),
    ]
    return "fail" if "fail" in grades else "fixable" if "fixable" in grades else "pass"
