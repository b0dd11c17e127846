"""ltx-pipelines' ``KeyframeInterpolationPipeline`` conditioning: images at chosen frames, the video made between them.

Every keyframe, the one at frame 0 included, is encoded at the stage's size and appended to the video tokens as a
guiding latent (ltx-core's ``VideoConditionByKeyframeIndex``): its tokens sit at the keyframe's pixel frame in the
positional encoding, keep their clean latent where ``strength`` is 1 and are denoised from ``1 - strength`` of the
noise level otherwise; they are dropped from the result. diffusers' ``LTX2ConditionPipeline`` runs the same loop
(per-token timesteps, the clean latent blended in x0 space, the appended tokens cut off at the end) but places a
frame-0 image by replacing the first latent frame, takes other frames as latent indices, and converts the model's
velocity to x0 with one σ for all tokens; :class:`KeyframePipeline` changes how its latents are prepared (started as
``GaussianNoiser`` does) and takes each token's own σ, as ltx-core's ``X0Model``.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import PIL.Image
import torch
from diffusers import LTX2ConditionPipeline
from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition, retrieve_latents
from diffusers.utils.torch_utils import randn_tensor

from deliverykit.errors import DeliveryError, ExitCode

from .video_io import read_image

KEYFRAME_FLAG = "--keyframe"
KEYFRAME_METAVAR = "IMAGE:FRAME[:STRENGTH]"


@dataclasses.dataclass(frozen=True)
class Keyframe:
    """An image the video passes through at pixel frame ``frame`` (0-based), held with ``strength`` (1: exactly).
    ``crf``: its H.264 re-compression (None: the model's default, as ltx-pipelines' ``resolve_crf``; 0: none)."""

    image: PIL.Image.Image
    frame: int
    strength: float = 1.0
    crf: int | None = None


def parse_keyframe(text: str) -> tuple[str, int, float]:
    """``IMAGE:FRAME[:STRENGTH]`` as ``(image path, frame, strength)``; a path may itself hold ``:``."""
    for parts in (text.rsplit(":", 2), text.rsplit(":", 1)):
        try:
            frame, strength = int(parts[1]), float(parts[2]) if len(parts) == 3 else 1.0
        except (IndexError, ValueError):
            continue
        if parts[0]:
            return parts[0], frame, strength
    raise DeliveryError(
        f"{KEYFRAME_FLAG} {text!r}: expected {KEYFRAME_METAVAR} (e.g. first.png:0, last.png:120:0.9)", ExitCode.USAGE
    )


def check_keyframes(keyframes: list[tuple[str, int, float]], num_frames: int) -> None:
    """Each frame inside the video, each strength in [0, 1], one keyframe a frame (exit 2)."""
    frames = [frame for _, frame, _ in keyframes]
    for path, frame, strength in keyframes:
        if not 0 <= frame < num_frames:
            raise DeliveryError(
                f"{KEYFRAME_FLAG} {path}:{frame}: frame outside the video's 0..{num_frames - 1}", ExitCode.USAGE
            )
        if not 0.0 <= strength <= 1.0:
            raise DeliveryError(f"{KEYFRAME_FLAG} {path}: strength {strength} outside [0, 1]", ExitCode.USAGE)
    repeated = sorted({frame for frame in frames if frames.count(frame) > 1})
    if repeated:
        raise DeliveryError(
            f"{KEYFRAME_FLAG}: two keyframes at frame {repeated[0]}; give each its own frame", ExitCode.USAGE
        )


def read_keyframes(specs: list[str]) -> tuple[Keyframe, ...]:
    """The ``IMAGE:FRAME[:STRENGTH]`` specs' keyframes, images read now (exit 3 naming the file that fails)."""
    keyframes = []
    for text in specs:
        path, frame, strength = parse_keyframe(text)
        keyframes.append(Keyframe(read_image(Path(path), flag=KEYFRAME_FLAG), frame, strength))
    return tuple(keyframes)


class KeyframePipeline(LTX2ConditionPipeline):
    """``LTX2ConditionPipeline`` whose ``conditions`` are :class:`Keyframe` objects, all appended as guiding latents.

    Built on a loaded pipeline's components (:func:`keyframe_pipeline`), so it shares their weights, LoRA adapters
    and memory-plan hooks.
    """

    def prepare_latents(
        self,
        conditions: list[Keyframe] | None = None,
        batch_size: int = 1,
        num_channels_latents: int = 128,
        height: int = 512,
        width: int = 768,
        num_frames: int = 121,
        frame_rate: float = 24.0,
        noise_scale: float = 1.0,
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
        generator: torch.Generator | None = None,
        latents: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The packed noisy latents (video tokens, then each keyframe's), the conditioning mask (``strength`` on a
        keyframe's tokens and the held video tokens, 0 elsewhere), the clean latents and the keyframes' positions, as
        diffusers' caller expects them; ``latents`` (un-normalised ``[B, C, F, H, W]``: stage 2's upsampled ones, a
        retake's source) replace the zeros.

        Noise as ltx-core's ``GaussianNoiser``: one draw over all tokens, ``lerp(latent, noise, noise_scale)`` with
        keyframe tokens' latent 0, then ``lerp(clean, that, 1 - strength)``.
        """
        shape = (
            batch_size,
            num_channels_latents,
            (num_frames - 1) // self.vae_temporal_compression_ratio + 1,
            height // self.vae_spatial_compression_ratio,
            width // self.vae_spatial_compression_ratio,
        )
        if latents is None:
            base = torch.zeros(shape, device=device, dtype=dtype)
        else:
            base = self._normalize_latents(
                latents, self.vae.latents_mean, self.vae.latents_std, self.vae.config.scaling_factor
            ).to(device=device, dtype=dtype)
        base = self._pack_latents(base, self.transformer_spatial_patch_size, self.transformer_temporal_patch_size)
        held = self._held_video_tokens(shape, frame_rate, device).to(base.dtype)
        tokens, strengths, coords = [], [], []
        for keyframe in conditions or ():
            encoded = self._encode_keyframe(keyframe, height, width, device, dtype)
            packed = self._pack_latents(
                encoded, self.transformer_spatial_patch_size, self.transformer_temporal_patch_size
            )
            tokens.append(packed.expand(batch_size, -1, -1))
            strengths.append(torch.full((batch_size, packed.shape[1], 1), float(keyframe.strength), device=device))
            coords.append(
                self._prepare_keyframe_coords(
                    *encoded.shape[2:],
                    pixel_frame_idx=keyframe.frame,
                    num_pixel_frames=1,
                    fps=frame_rate,
                    device=device,
                ).expand(batch_size, -1, -1, -1)
            )
        clean = torch.cat([base * held, *tokens], dim=1)
        mask = torch.cat([held.expand(batch_size, -1, -1), *strengths], dim=1).to(base.dtype)
        latent = torch.cat([base, *(torch.zeros_like(token) for token in tokens)], dim=1)
        noise = randn_tensor(latent.shape, generator=generator, device=latent.device, dtype=latent.dtype)
        noised = torch.lerp(torch.lerp(latent, noise, noise_scale), clean, mask)  # = lerp(clean, ., 1 - mask)
        self._conditioning_mask = mask
        return noised, mask, clean, torch.cat(coords, dim=2) if coords else None

    def _held_video_tokens(self, shape: tuple[int, ...], frame_rate: float, device: Any) -> torch.Tensor:
        """``[1, tokens, 1]``: 1 on the video tokens kept at their given latent (as a full-strength condition), 0 on
        those generated: here all of them (the retake pipeline keeps some)."""
        return torch.zeros((1, shape[2] * shape[3] * shape[4], 1), device=device)

    def convert_velocity_to_x0(
        self, sample: torch.Tensor, denoised_output: torch.Tensor, step_idx: int, scheduler: Any = None
    ) -> torch.Tensor:
        """x0 at each video token's own σ (σ × its denoise mask ``1 - strength``), as ltx-core's ``X0Model``;
        diffusers takes σ for every token, which moves the x0 of a keyframe with strength below 1."""
        if scheduler is not None and scheduler is not self.scheduler:  # the audio stream: every token at σ
            return super().convert_velocity_to_x0(sample, denoised_output, step_idx, scheduler)
        sigma = self.scheduler.sigmas[step_idx] * (1 - self._conditioning_mask)
        return sample - denoised_output * sigma.to(sample.device, sample.dtype)

    def _encode_keyframe(
        self, keyframe: Keyframe, height: int, width: int, device: Any, dtype: torch.dtype | None
    ) -> torch.Tensor:
        """The keyframe's normalised latent ``[1, C, 1, h, w]``: diffusers' condition preprocessing (re-compression,
        resize to cover, centre crop), the VAE's mode."""
        condition = LTX2VideoCondition(frames=keyframe.image, strength=keyframe.strength, crf=keyframe.crf)
        pixels = self.preprocess_conditions([condition], height, width, num_frames=1, device=device)[0][0]
        encoded = retrieve_latents(self.vae.encode(pixels), sample_mode="argmax")
        return self._normalize_latents(encoded, self.vae.latents_mean, self.vae.latents_std).to(device, dtype)


def keyframe_pipeline(pipe: Any) -> KeyframePipeline:
    """A :class:`KeyframePipeline` on ``pipe``'s modules (no copy), its scheduler included."""
    accepted = inspect.signature(KeyframePipeline.__init__).parameters
    keyframes = KeyframePipeline(**{name: part for name, part in pipe.components.items() if name in accepted})
    keyframes.set_progress_bar_config(**getattr(pipe, "_progress_bar_config", {}))
    return keyframes
