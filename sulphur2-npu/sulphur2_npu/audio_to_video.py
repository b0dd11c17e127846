"""ltx-pipelines' ``A2VidPipelineTwoStage``: a video made to a given sound track, the sound held fixed in both stages.

ltx-pipelines @ 400fd310 (``a2vid_two_stage.py``) encodes the file's audio (``decode_audio_from_file``, then
ltx-core's ``encode_audio``: the log-mel of :mod:`.audio_io`, the audio VAE encoder's mean) and gives it to both
stages as ``ModalitySpec(frozen=True, noise_scale=0, initial_latent=...)``: the audio tokens keep their clean latent,
their timesteps and the audio σ that the transformer's prompt AdaLN and cross-modal gates see are 0, and the video's
sound track is the file's own, not decoded. :class:`FrozenSound` makes diffusers' LTX-2 pipelines hold that audio
(:class:`AudioToVideoPipeline`; with a first frame, :class:`AudioImageToVideoPipeline`): noise drawn for it as
``GaussianNoiser`` draws it at ``noise_scale=0`` (so the generator runs on as ltx-pipelines'), its x0 the clean latent
and its update zero (ltx-core's denoise mask 0), the transformer called with audio timestep and σ 0.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from diffusers import LTX2ImageToVideoPipeline, LTX2Pipeline

from .audio_io import AudioClip, log_mel
from .reference_fixes import ReferenceImageToVideoPipeline


class FrozenSound:
    """What makes a diffusers LTX-2 pipeline hold its ``audio_latents`` (required) as given; mixed in before it."""

    def prepare_audio_latents(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The given latents normalised and packed, with noise drawn and scaled by 0 (``GaussianNoiser``)."""
        if kwargs.get("latents") is None:
            raise ValueError("the a2v pipeline needs audio_latents: the encoded sound track (encode_audio)")
        return super().prepare_audio_latents(*args, **{**kwargs, "noise_scale": 0.0})

    def convert_velocity_to_x0(
        self, sample: torch.Tensor, denoised_output: torch.Tensor, step_idx: int, scheduler: Any = None
    ) -> torch.Tensor:
        """The audio stream's x0 is its clean latent (ltx-core blends by the denoise mask, 0 here)."""
        if scheduler is not None and scheduler is not self.scheduler:
            return sample
        return super().convert_velocity_to_x0(sample, denoised_output, step_idx, scheduler)

    def convert_x0_to_velocity(
        self, sample: torch.Tensor, denoised_output: torch.Tensor, step_idx: int, scheduler: Any = None
    ) -> torch.Tensor:
        """The audio stream does not move (exactly: guidance's arithmetic on equal x0 may round)."""
        if scheduler is not None and scheduler is not self.scheduler:
            return torch.zeros_like(sample)
        return super().convert_x0_to_velocity(sample, denoised_output, step_idx, scheduler)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # first of the pre-hooks: the cross-timestep fix (reference_fixes) must see the audio's own timesteps
        handle = self.transformer.register_forward_pre_hook(_frozen_audio_timesteps, prepend=True, with_kwargs=True)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            handle.remove()


class AudioToVideoPipeline(FrozenSound, LTX2Pipeline):
    """Text and sound → video: ``LTX2Pipeline`` holding its sound track."""


class AudioImageToVideoPipeline(FrozenSound, ReferenceImageToVideoPipeline):
    """Text, first frame and sound → video: the loader's image-to-video pipeline holding its sound track."""


def _frozen_audio_timesteps(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple:
    """Audio timestep and σ 0 in every transformer call (``Modality.sigma`` of a frozen state in ltx-pipelines), one
    per batch row (the video's timestep is one per token with a first frame)."""
    zeros = kwargs["sigma"].new_zeros(kwargs["sigma"].shape[0])
    return args, {**kwargs, "audio_timestep": zeros, "audio_sigma": zeros}


def audio_to_video_pipeline(pipe: Any) -> FrozenSound:
    """:class:`AudioToVideoPipeline`, or for an image-to-video ``pipe`` :class:`AudioImageToVideoPipeline`, on
    ``pipe``'s modules (no copy), its scheduler included."""
    cls = AudioImageToVideoPipeline if isinstance(pipe, LTX2ImageToVideoPipeline) else AudioToVideoPipeline
    accepted = inspect.signature(cls.__init__).parameters
    audio = cls(**{name: part for name, part in pipe.components.items() if name in accepted})
    audio.set_progress_bar_config(**getattr(pipe, "_progress_bar_config", {}))
    return audio


def encode_audio(pipe: Any, clip: AudioClip, seconds: float) -> torch.Tensor:
    """``[1, C, L, M]`` un-normalised latent of ``clip`` for a video of ``seconds`` (ltx-core ``encode_audio``: the
    log-mel in float32 on the encoder's device, the encoder in its dtype, the mean half of its output), cut to the
    frames of that duration as ltx-pipelines cuts it (``AudioLatentShape.from_duration``)."""
    vae = pipe.audio_vae
    config = vae.config
    waveform = clip.waveform.unsqueeze(0).to(vae.device, torch.float32)
    mel = log_mel(
        waveform,
        clip.sample_rate,
        target_rate=config.sample_rate,
        n_fft=config.n_fft,
        hop=config.mel_hop_length,
        mels=config.mel_bins,
    )
    with torch.no_grad():
        latent = vae.encode(mel.to(vae.dtype)).latent_dist.mode()
    frames = round(seconds * config.sample_rate / config.mel_hop_length / vae.temporal_compression_ratio)
    return latent[:, :, :frames].float()
