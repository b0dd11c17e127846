"""ltx-pipelines' ``A2VidPipelineTwoStage``: a video made to a given sound track, the sound held fixed in both stages.

ltx-pipelines @ 400fd310 (``a2vid_two_stage.py``) encodes the file's audio (``decode_audio_from_file``, then
ltx-core's ``encode_audio``: the log-mel of :mod:`.audio_io`, the audio VAE encoder's mean) and gives it to both
stages as ``ModalitySpec(frozen=True, noise_scale=0, initial_latent=...)``: the audio tokens keep their clean latent,
their timesteps and the audio σ that the transformer's prompt AdaLN and cross-modal gates see are 0, and the video's
sound track is the file's own, not decoded. :class:`HeldSound` makes diffusers' LTX-2 pipelines hold that audio
(:class:`AudioToVideoPipeline`; with a first frame, :class:`AudioImageToVideoPipeline`): noise drawn for it as
``GaussianNoiser`` draws it at ``noise_scale=0`` (so the generator runs on as ltx-pipelines'), its x0 the clean latent
and its update zero (ltx-core's denoise mask 0), the transformer called with audio timestep and σ 0.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from diffusers import LTX2ImageToVideoPipeline

from deliverykit.errors import InputError

from .audio_io import AudioClip, log_mel
from .reference_fixes import ReferenceImageToVideoPipeline, ReferenceTextToVideoPipeline


class HeldSound:
    """What makes a diffusers LTX-2 pipeline hold the sound of its ``audio_latents`` (required); mixed in before it.

    ``region`` None: all of it, as ltx-pipelines' frozen modality (a2v; the audio σ the transformer sees is 0 too).
    ``(start, end)`` in seconds (retake): the tokens outside ltx-core's ``TemporalRegionMask(start, end)``; those
    inside are generated anew at the scheduler's σ. Held tokens: noise drawn at scale 0 (``GaussianNoiser`` at denoise
    mask 0, so the generator runs on as ltx-pipelines'), timestep 0, x0 their latent, update 0.
    """

    region: tuple[float, float] | None = None
    _sound_mask: torch.Tensor | None = None  # [1, tokens, 1]: 1 where the sound is generated, 0 where held

    def prepare_audio_latents(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The given latents normalised and packed, noised only where the sound is generated."""
        latents = kwargs.get("latents")
        if latents is None:
            raise ValueError("this pipeline holds given sound: pass audio_latents (encode_audio)")
        coords = self.transformer.audio_rope.prepare_audio_coords(1, latents.shape[2], latents.device)
        mask = in_region(coords[:, 0], self.region)[..., None]  # where the latents are (an offloaded encoder's)
        self._sound_mask = mask.to(kwargs.get("device") or latents.device)  # where the loop runs
        return super().prepare_audio_latents(*args, **{**kwargs, "noise_scale": kwargs["noise_scale"] * mask})

    def convert_velocity_to_x0(
        self, sample: torch.Tensor, denoised_output: torch.Tensor, step_idx: int, scheduler: Any = None
    ) -> torch.Tensor:
        """The audio stream's x0 at each token's own σ (σ × its denoise mask, ltx-core's ``X0Model``): a held
        token's x0 is its latent."""
        if scheduler is not None and scheduler is not self.scheduler:
            denoised_output = denoised_output * self._sound_mask.to(denoised_output)
        return super().convert_velocity_to_x0(sample, denoised_output, step_idx, scheduler)

    def convert_x0_to_velocity(
        self, sample: torch.Tensor, denoised_output: torch.Tensor, step_idx: int, scheduler: Any = None
    ) -> torch.Tensor:
        """Held audio tokens do not move (ltx-core's x0 blend with the clean latent at denoise mask 0; a held
        token's sample is its clean latent, so its velocity is exactly 0)."""
        if scheduler is not None and scheduler is not self.scheduler:
            denoised_output = torch.where(self._sound_mask.to(sample.device).bool(), denoised_output, sample)
        return super().convert_x0_to_velocity(sample, denoised_output, step_idx, scheduler)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # first of the pre-hooks: the cross-timestep fix (reference_fixes) must see the audio's own timesteps
        handle = self.transformer.register_forward_pre_hook(self._audio_timesteps, prepend=True, with_kwargs=True)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            handle.remove()

    def _audio_timesteps(self, module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple:
        """Each audio token's timestep σ × its denoise mask, ``[B, tokens]``; with all the sound held, the audio σ
        of the prompt AdaLN and cross-modal gates 0 too (``Modality.sigma`` of a frozen state in ltx-pipelines)."""
        timestep = kwargs.get("audio_timestep")
        timestep = kwargs["sigma"] if timestep is None else timestep  # one per row (the T2V pipeline passes none)
        timesteps = {"audio_timestep": timestep[:, None] * self._sound_mask[..., 0].to(timestep)}
        if self.region is None:
            timesteps["audio_sigma"] = kwargs["sigma"].new_zeros(kwargs["sigma"].shape[0])
        return args, {**kwargs, **timesteps}


def in_region(bounds: torch.Tensor, region: tuple[float, float] | None) -> torch.Tensor:
    """ltx-core's ``TemporalRegionMask``: 1.0 where a token's ``[start, end)`` seconds (``bounds[..., 0:2]``) meet
    ``[region start, region end)``, else 0; no region: all 0."""
    if region is None:
        return torch.zeros(bounds.shape[:-1], device=bounds.device)
    start, end = region
    return ((bounds[..., 1] > start) & (bounds[..., 0] < end)).float()


class AudioToVideoPipeline(HeldSound, ReferenceTextToVideoPipeline):
    """Text and sound → video: the loader's text-to-video pipeline holding its sound track."""


class AudioImageToVideoPipeline(HeldSound, ReferenceImageToVideoPipeline):
    """Text, first frame and sound → video: the loader's image-to-video pipeline holding its sound track."""


def audio_to_video_pipeline(pipe: Any) -> HeldSound:
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
    shortest = (config.n_fft // 2 + 1) / config.sample_rate  # the STFT reflects half a window at each end
    if clip.seconds < shortest:
        raise InputError(
            f"the sound of {clip.source} lasts {clip.seconds:.3f} s, too short for the audio encoder's STFT (at "
            f"least {shortest:.3f} s): give a longer one, or for a retake strip the track (ffmpeg -i IN -an -c:v copy "
            "OUT) to have the sound made whole"
        )
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
    return latent[:, :, : audio_latent_frames(vae, seconds)].float()


def audio_latent_frames(vae: Any, seconds: float) -> int:
    """The audio latent frames of a video of ``seconds`` (ltx-core's ``AudioLatentShape.from_duration``)."""
    return round(seconds * vae.config.sample_rate / vae.config.mel_hop_length / vae.temporal_compression_ratio)
