"""CPU reference vs a target device for the LTX-2.3 pipeline: hidden states, frames and audio, with verdicts.

Two stages, so that a per-layer error is not confused with a drifting sampling trajectory:

1. **First transformer forward, identical inputs.** The reference pipeline's own ``__call__`` builds the first
   transformer input (text encoding, connectors, latents from a CPU generator) and stops there; both sides run that
   one forward with forward hooks on the first three and the last transformer blocks (video and audio hidden states)
   and on the transformer output: max |Δ|, MSE, cosine.
2. **Whole pipeline, identical noise.** Both sides run the same call with a CPU generator of the same seed, so the
   initial latents are bit-identical: output frames (PSNR, SSIM on [0, 1]) and audio (max |Δ|, SNR, cosine).
   LPIPS is omitted: its network weights cannot be had offline here.

Thresholds (the issue's seeds): hidden states cosine ≥ 0.9999 and max |Δ| ≤ 1e-3; frames PSNR ≥ 30 dB and SSIM ≥
0.95; audio cosine ≥ 0.9999 (≈ 37 dB SNR). Verdicts ``pass`` / ``fixable`` (errors within 10x) / ``fail`` come from
:mod:`deliverykit.compare`. Activations (``*hidden_states``) are replayed in the target's dtype, everything else
(timesteps, coordinates, masks) as the pipeline passes it, so a bf16 target sees what a bf16 run sees.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from deliverykit import compare
from deliverykit.device import device_string, make_generator
from deliverykit.errors import InputError
from deliverykit.files import atomic_path
from sulphur2_npu.generate import GenerationRequest
from sulphur2_npu.precision import capture_transformer_call
from sulphur2_npu.tiny import TINY_CALL

HIDDEN_THRESHOLDS = compare.Thresholds(max_abs=1e-3, mean_abs=1e-3, min_cosine=0.9999)
FRAME_THRESHOLDS = compare.ImageThresholds(min_psnr_db=30.0, min_ssim=0.95)
AUDIO_THRESHOLDS = compare.Thresholds(max_abs=math.inf, mean_abs=math.inf, min_cosine=0.9999)
LPIPS_NOTE = "LPIPS omitted: its pretrained network weights are not available offline; PSNR and SSIM only"
STREAMS = ("video", "audio")  # what an LTX2VideoTransformerBlock returns, in order
HEATMAP_MAX_FRAMES = 16
HEATMAP_TILE_WIDTH = 192


def tiny_request(prompt: str | None = None, negative_prompt: str | None = None) -> GenerationRequest:
    """``TINY_CALL`` (96x64, 9 frames, 2 steps) as a request: ``generate`` with it reproduces ``pipe(**TINY_CALL)``."""
    return GenerationRequest(
        prompt=TINY_CALL["prompt"] if prompt is None else prompt,
        negative_prompt=TINY_CALL["negative_prompt"] if negative_prompt is None else negative_prompt,
        width=TINY_CALL["width"],
        height=TINY_CALL["height"],
        num_frames=TINY_CALL["num_frames"],
        steps=TINY_CALL["num_inference_steps"],
        guidance=TINY_CALL["guidance_scale"],
        max_sequence_length=TINY_CALL["max_sequence_length"],
    )


def hooked_block_names(num_layers: int) -> list[str]:
    """The first three and the last transformer block: where an error enters, and what it grows to."""
    return [f"transformer_blocks.{i}" for i in sorted({*range(min(3, num_layers)), num_layers - 1})]


@dataclass
class SideRun:
    """One side of the comparison: the first-forward inputs and hidden states, the frames and the audio.

    ``frames`` is float32 ``[F, H, W, 3]`` on [0, 1]; ``audio`` float32 ``[channels, samples]``.
    """

    device: str
    dtype: str
    inputs: dict[str, torch.Tensor]
    inputs_meta: dict[str, Any]
    hidden: dict[str, torch.Tensor]
    frames: np.ndarray
    audio: np.ndarray
    info: dict[str, Any] = field(default_factory=dict)

    def save(self, path: Path) -> Path:
        """One safetensors file (atomic), so a device-only machine can hand its run to a CPU machine."""
        tensors = {f"input.{k}": v.clone() for k, v in self.inputs.items()}  # the pipeline shares some masks
        tensors |= {f"hidden.{k}": v.clone() for k, v in self.hidden.items()}
        tensors |= {name: torch.from_numpy(np.ascontiguousarray(getattr(self, name))) for name in ("frames", "audio")}
        meta = {
            "device": self.device,
            "dtype": self.dtype,
            "inputs_meta": self.inputs_meta,
            "info": self.info,
            "hidden_order": list(self.hidden),  # execution order; safetensors sorts its keys
        }
        with atomic_path(path) as temporary:
            save_file(tensors, str(temporary), metadata={"sulphur2_accuracy": json.dumps(meta)})
        return path

    @classmethod
    def load(cls, path: Path) -> SideRun:
        try:
            with safe_open(str(path), framework="pt") as handle:
                meta = json.loads((handle.metadata() or {})["sulphur2_accuracy"])
                tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 (not a dict)
        except (SafetensorError, OSError, KeyError, ValueError) as err:
            raise InputError(
                f"{path} is not a saved accuracy run ({err}); write one with scripts/accuracy.py --save DIR"
            ) from err
        return cls(
            device=meta["device"],
            dtype=meta["dtype"],
            inputs={k.removeprefix("input."): v for k, v in tensors.items() if k.startswith("input.")},
            inputs_meta=meta["inputs_meta"],
            hidden={name: tensors[f"hidden.{name}"] for name in meta["hidden_order"]},
            frames=tensors["frames"].numpy(),
            audio=tensors["audio"].numpy(),
            info=meta["info"],
        )


def first_forward_inputs(pipe: Any, call: dict[str, Any], seed: int) -> tuple[dict[str, torch.Tensor], dict]:
    """The first transformer call's arguments as the pipeline builds them: (CPU tensors, JSON-ready others)."""
    captured = capture_transformer_call(pipe, {**call, "generator": make_generator(seed)})
    tensors = {k: v.detach().cpu() for k, v in captured.items() if isinstance(v, torch.Tensor)}
    others = {k: v for k, v in captured.items() if not isinstance(v, torch.Tensor)}
    return tensors, others


def _replayed(key: str, tensor: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return tensor.to(device=device, dtype=dtype) if key.endswith("hidden_states") else tensor.to(device)


@torch.no_grad()
def first_forward_hidden(
    transformer: torch.nn.Module, inputs: dict[str, torch.Tensor], inputs_meta: dict[str, Any]
) -> dict[str, torch.Tensor]:
    """Hidden states of the hooked blocks and the transformer output for one forward, float32 on the CPU."""
    parameter = next(transformer.parameters())
    names = hooked_block_names(len(transformer.transformer_blocks))
    kwargs = {k: _replayed(k, v, parameter.device, parameter.dtype) for k, v in inputs.items()} | inputs_meta
    with compare.capture_module_outputs(transformer, names, every_output=True) as captured:
        outputs = transformer(**{**kwargs, "return_dict": False})
    hidden = {}
    for name in names:
        for index, stream in enumerate(STREAMS):
            hidden[f"{name}.{stream}"] = captured[f"{name}[{index}]"].float()
    for stream, tensor in zip(STREAMS, outputs, strict=True):
        hidden[f"output.{stream}"] = tensor.detach().float().cpu()
    return hidden


def run_side(
    pipe: Any, call: dict[str, Any], seed: int, inputs: tuple[dict[str, torch.Tensor], dict] | None = None
) -> SideRun:
    """Both stages on ``pipe`` (already on its device); ``inputs`` replays another side's first-forward inputs."""
    tensors, meta = inputs if inputs is not None else first_forward_inputs(pipe, call, seed)
    hidden = first_forward_hidden(pipe.transformer, tensors, meta)
    with torch.no_grad():
        result = pipe(**{**call, "output_type": "np"}, generator=make_generator(seed))
    frames = np.asarray(result.frames[0], dtype=np.float32)
    audio = torch.as_tensor(result.audio[0]).float().cpu().numpy()
    device = next(pipe.transformer.parameters()).device
    return SideRun(
        device=device_string(device),
        dtype=str(pipe.transformer.dtype).removeprefix("torch."),
        inputs=tensors,
        inputs_meta=meta,
        hidden=hidden,
        frames=frames,
        audio=audio,
        info={"sample_rate": getattr(pipe.vocoder.config, "output_sampling_rate", None)},
    )


def frame_metrics(reference: np.ndarray, candidate: np.ndarray) -> dict[str, Any]:
    """PSNR and SSIM of the whole clip and of every frame (``[F, H, W, 3]`` on [0, 1]), with the verdict."""
    ref = torch.from_numpy(reference).permute(0, 3, 1, 2)
    cand = torch.from_numpy(candidate).permute(0, 3, 1, 2)
    per_frame = [{"psnr_db": compare.psnr(r, c), "ssim": compare.ssim(r, c)} for r, c in zip(ref, cand, strict=True)]
    overall = {"psnr_db": compare.psnr(ref, cand), "ssim": compare.ssim(ref, cand)}
    diff = np.abs(candidate.astype(np.float64) - reference)
    return {
        **overall,
        "max_abs": float(diff.max()),
        "worst_frame_psnr_db": min(f["psnr_db"] for f in per_frame),
        "per_frame": per_frame,
        "verdict": compare.image_verdict(overall, FRAME_THRESHOLDS),
    }


def audio_metrics(reference: np.ndarray, candidate: np.ndarray) -> dict[str, Any]:
    metrics = compare.tensor_metrics(reference, candidate)
    return {
        **metrics,
        "snr_db": compare.snr_db(reference, candidate),
        "verdict": compare.verdict(metrics, AUDIO_THRESHOLDS),
    }


def compare_runs(reference: SideRun, candidate: SideRun) -> dict[str, Any]:
    """Every metric and verdict of ``candidate`` against ``reference`` (JSON-ready)."""
    if reference.frames.shape != candidate.frames.shape:
        raise InputError(
            f"the runs made different outputs (frames {reference.frames.shape} vs {candidate.frames.shape}): "
            f"compare runs of the same preset, prompt and seed"
        )
    hidden = [
        {**row, "verdict": compare.verdict(row, HIDDEN_THRESHOLDS)}
        for row in compare.layerwise_report(reference.hidden, candidate.hidden)
    ]
    frames = frame_metrics(reference.frames, candidate.frames)
    audio = audio_metrics(reference.audio, candidate.audio)
    overall = compare.combine_verdicts([*(row["verdict"] for row in hidden), frames["verdict"], audio["verdict"]])
    return {"hidden": hidden, "frames": frames, "audio": audio, "verdict": overall, "lpips": LPIPS_NOTE}


_HEAT = np.array([[0, 0, 0], [80, 18, 123], [182, 54, 121], [251, 136, 97], [252, 253, 191]], dtype=np.float64)


def _colorize(values: np.ndarray) -> np.ndarray:
    """[0, 1] → uint8 RGB along a black-purple-orange-yellow ramp (magma-like; no matplotlib needed)."""
    position = np.clip(values, 0.0, 1.0) * (len(_HEAT) - 1)
    low = np.floor(position).astype(int).clip(0, len(_HEAT) - 2)
    weight = (position - low)[..., None]
    return ((1 - weight) * _HEAT[low] + weight * _HEAT[low + 1]).round().astype(np.uint8)


def write_diff_heatmap(reference: np.ndarray, candidate: np.ndarray, path: Path) -> dict[str, Any]:
    """One PNG of per-frame |Δ| heatmaps (channel mean), tiles left to right, all on one scale.

    Up to :data:`HEATMAP_MAX_FRAMES` evenly spaced frames, each scaled to :data:`HEATMAP_TILE_WIDTH` px wide.
    The scale's top is the largest |Δ| (black = 0); an all-black image means identical frames.
    """
    diff = np.abs(candidate.astype(np.float64) - reference).mean(axis=-1)  # [F, H, W]
    indices = sorted({round(i) for i in np.linspace(0, len(diff) - 1, min(len(diff), HEATMAP_MAX_FRAMES))})
    top = float(diff.max())
    height, width = diff.shape[1:]
    tile_size = (HEATMAP_TILE_WIDTH, max(1, round(height * HEATMAP_TILE_WIDTH / width)))
    tiles = [
        Image.fromarray(_colorize(diff[i] / top if top > 0 else diff[i])).resize(tile_size, Image.NEAREST)
        for i in indices
    ]
    sheet = Image.new("RGB", (tile_size[0] * len(tiles) + 2 * (len(tiles) - 1), tile_size[1]), (255, 255, 255))
    for position, tile in enumerate(tiles):
        sheet.paste(tile, (position * (tile_size[0] + 2), 0))
    with atomic_path(path) as temporary:
        sheet.save(temporary, format="PNG")
    return {"path": str(path), "frames": indices, "scale_max_abs": top, "colors": "black = 0 … yellow = scale_max_abs"}
