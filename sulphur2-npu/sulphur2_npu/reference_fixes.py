"""Three diffusers 0.42.1 LTX-2.3 code paths made to compute what ltx-core (Lightricks/LTX-2 400fd310) computes.

The first two only matter for image-to-video, where the conditioned first-frame tokens have timestep 0; text-to-video
runs the same numbers with or without them (every token has the scheduler σ). The third is where the seed's noise
lands. Remove them when diffusers ships a fix (issue text: ``docs/diffusers-issue-ltx2-i2v.md``).

1. Audio↔video cross-attention modulation (:func:`install_cross_timestep_fix`). ltx-core takes the AdaLN
   scale/shift of each stream's cross-attention from that stream's own per-token timesteps and only the gate from
   the other stream's σ (``ltx_core/model/transformer/transformer_args.py``, ``_prepare_cross_attention_timestep``).
   diffusers' ``LTX2VideoTransformer3DModel.forward`` feeds one value to both: the other stream's σ with
   ``use_cross_timestep=True`` (the pipelines' default), its own timesteps with ``False``; neither is ltx-core.
   The fix is two forward pre-hooks: the scale/shift embedders get the stream's own timesteps while
   ``use_cross_timestep=True`` keeps the gate on the other σ. The forward code itself runs unchanged.
2. x0 of the conditioned tokens (:class:`ReferenceImageToVideoPipeline`). ltx-core's ``X0Model`` converts velocity
   to x0 with each token's own timestep (``to_denoised(latent, v, timesteps)``, ``model.py``), so a conditioned
   token's x0 is its clean latent and the guider's rescale statistics (``guiders.py``, ``MultiModalGuider``) see
   it. ``LTX2ImageToVideoPipeline.convert_velocity_to_x0`` uses the scheduler σ for every token. The subclass
   records the conditioning mask ``prepare_latents`` returns and converts the video stream with ``σ * (1 - mask)``.
3. The initial noise (:class:`ReferenceTextToVideoPipeline`, :class:`ReferenceImageToVideoPipeline`). ltx-core's
   ``GaussianNoiser`` draws it in token order (``[B, tokens, C]``, ``noisers.py``); diffusers draws ``[B, C, F, H,
   W]`` and packs it after, which puts the seed's numbers on other tokens: the same seed made another (equally
   distributed) video than ltx-pipelines'. Both subclasses draw in token order, fresh noise and stage 2's alike.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from diffusers import LTX2ImageToVideoPipeline, LTX2Pipeline, LTX2VideoTransformer3DModel
from diffusers.pipelines.ltx2.pipeline_ltx2_image2video import retrieve_latents
from diffusers.utils.torch_utils import randn_tensor

# (embedder of the cross-attention scale/shift, forward argument holding that stream's own timesteps)
_SCALE_SHIFT_SOURCES = (
    ("av_cross_attn_video_scale_shift", "timestep"),
    ("av_cross_attn_audio_scale_shift", "audio_timestep"),
)
_INSTALLED = "_sulphur_cross_timestep_fix"
_PREPARE_LATENTS = inspect.signature(LTX2ImageToVideoPipeline.prepare_latents)
_PREPARE_TEXT_LATENTS = inspect.signature(LTX2Pipeline.prepare_latents)
_PREPARE_AUDIO_LATENTS = inspect.signature(LTX2Pipeline.prepare_audio_latents)  # the image-to-video one's too
_CROSS_TIMESTEP_POSITION = (
    list(inspect.signature(LTX2VideoTransformer3DModel.forward).parameters).index("use_cross_timestep") - 1
)  # without self


def _record_own_timesteps(
    transformer: LTX2VideoTransformer3DModel, signature: inspect.Signature, args: tuple, kwargs: dict[str, Any]
) -> tuple[tuple, dict[str, Any]]:
    passed = signature.bind(*args, **kwargs).arguments
    timestep, audio_timestep = passed["timestep"], passed.get("audio_timestep")
    own = {"timestep": timestep, "audio_timestep": timestep if audio_timestep is None else audio_timestep}
    setattr(transformer, _INSTALLED, own)
    if len(args) > _CROSS_TIMESTEP_POSITION:
        raise TypeError("pass use_cross_timestep and the arguments after it to the LTX-2 transformer by keyword")
    return args, {**kwargs, "use_cross_timestep": True}  # the gates take the other stream's σ, as in ltx-core


def _forget_own_timesteps(transformer: LTX2VideoTransformer3DModel, *_: Any) -> None:
    setattr(transformer, _INSTALLED, {})


def _own_timestep_input(
    transformer: LTX2VideoTransformer3DModel, source: str, module: torch.nn.Module, args: tuple
) -> tuple | None:
    own = getattr(transformer, _INSTALLED).get(source)
    if own is None:  # called outside the transformer's forward
        return None
    return (own.flatten(), *args[1:])


def install_cross_timestep_fix(transformer: LTX2VideoTransformer3DModel) -> bool:
    """Make ``transformer`` modulate audio↔video cross-attention as ltx-core does; False if already installed.

    Hooks only: parameters, state dict and config are untouched, and every call behaves as with
    ``use_cross_timestep=True`` for the gates (the argument is overridden).
    """
    if hasattr(transformer, _INSTALLED):
        return False
    setattr(transformer, _INSTALLED, {})
    signature = inspect.signature(transformer.forward)
    transformer.register_forward_pre_hook(
        lambda module, args, kwargs: _record_own_timesteps(module, signature, args, kwargs), with_kwargs=True
    )
    transformer.register_forward_hook(_forget_own_timesteps, always_call=True)
    for embedder, source in _SCALE_SHIFT_SOURCES:
        getattr(transformer, embedder).register_forward_pre_hook(
            functools.partial(_own_timestep_input, transformer, source)
        )
    return True


def _arguments(signature: inspect.Signature, pipe: Any, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``prepare_latents``' arguments by name, defaults filled in (its caller passes some by position)."""
    given = signature.bind(pipe, *args, **kwargs)
    given.apply_defaults()
    return {name: value for name, value in given.arguments.items() if name != "self"}


def _token_noise(shape: tuple[int, ...], generator: Any, device: Any, dtype: Any) -> torch.Tensor:
    """Noise for packed latents ``[B, tokens, C]``, drawn in that order as ltx-core's ``GaussianNoiser`` draws it."""
    if isinstance(generator, list):
        raise ValueError("pass one generator: ltx-core draws a run's noise from one stream")
    return randn_tensor(shape, generator=generator, device=device, dtype=dtype)


class TokenOrderSound:
    """Mixed in before a diffusers LTX-2 pipeline: its fresh audio noise drawn as the packed ``[B, L, C * M]`` (3.
    above; diffusers' text- and image-to-video pipelines draw ``[B, C, L, M]`` and pack it, its condition pipeline
    already draws packed). Given audio latents are packed before their noise there already."""

    def prepare_audio_latents(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        arguments = _arguments(_PREPARE_AUDIO_LATENTS, self, args, kwargs)
        if arguments["latents"] is not None:
            return super().prepare_audio_latents(*args, **kwargs)
        bins = arguments["num_mel_bins"] // self.audio_vae_mel_compression_ratio
        shape = (arguments["batch_size"], arguments["audio_latent_length"], arguments["num_channels_latents"] * bins)
        return _token_noise(shape, arguments["generator"], arguments["device"], arguments["dtype"])


class ReferenceTextToVideoPipeline(TokenOrderSound, LTX2Pipeline):
    """``LTX2Pipeline`` whose initial noise is drawn in token order (3. above).

    Adapted from: diffusers 0.42.1 ``pipelines/ltx2/pipeline_ltx2.py``. Changes: ``prepare_latents`` without given
    latents draws ``[B, tokens, C]`` (patch size 1, LTX-2.3's; given latents are packed before their noise there
    already), and the audio's as :class:`TokenOrderSound`.
    """

    def prepare_latents(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        arguments = _arguments(_PREPARE_TEXT_LATENTS, self, args, kwargs)
        if arguments["latents"] is not None:
            return super().prepare_latents(*args, **kwargs)
        tokens = (
            ((arguments["num_frames"] - 1) // self.vae_temporal_compression_ratio + 1)
            * (arguments["height"] // self.vae_spatial_compression_ratio)
            * (arguments["width"] // self.vae_spatial_compression_ratio)
        )
        shape = (arguments["batch_size"], tokens, arguments["num_channels_latents"])
        return _token_noise(shape, arguments["generator"], arguments["device"], arguments["dtype"])


class ReferenceImageToVideoPipeline(TokenOrderSound, LTX2ImageToVideoPipeline):
    """``LTX2ImageToVideoPipeline`` whose video x0 uses each token's own timestep (conditioned tokens: x0 = x).

    Adapted from: diffusers 0.42.1 ``pipelines/ltx2/pipeline_ltx2_image2video.py``. Changes: ``prepare_latents``
    keeps the conditioning mask it returns and draws its noise in token order, fresh (:meth:`_noised_first_latents`)
    or for given stage 2 latents (:meth:`_noised_stage_2_latents`), the audio's as :class:`TokenOrderSound`;
    ``convert_velocity_to_x0`` scales σ by ``1 - mask`` for the video stream (the scheduler ``self.scheduler``; audio
    has its own copy and no conditioned tokens).
    ``convert_x0_to_velocity`` is unchanged: on conditioned tokens it gives 0, and the pipeline never steps them.
    """

    _conditioning_mask: torch.Tensor | None = None

    def prepare_latents(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        arguments = _arguments(_PREPARE_LATENTS, self, args, kwargs)
        latents = arguments.pop("latents")
        if latents is None:
            latents, conditioning_mask = self._noised_first_latents(**arguments)
        elif latents.ndim == 5:
            latents, conditioning_mask = self._noised_stage_2_latents(latents, **arguments)
        else:
            latents, conditioning_mask = super().prepare_latents(*args, **kwargs)
        self._conditioning_mask = conditioning_mask
        return latents, conditioning_mask

    def _noised_first_latents(
        self,
        image: torch.Tensor,
        *,
        batch_size: int,
        num_frames: int,
        generator: Any,
        device: Any,
        dtype: Any,
        **_: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stage 1's latents (the image's latent on the first frame's tokens, noise elsewhere) and conditioning mask,
        as diffusers makes them but with the noise drawn over the packed tokens (``GaussianNoiser``'s order)."""
        encoded = [
            retrieve_latents(self.vae.encode(img.unsqueeze(0).unsqueeze(2)), generator, "argmax") for img in image
        ]
        vae = self.vae
        clean = self._normalize_latents(torch.cat(encoded).to(dtype), vae.latents_mean, vae.latents_std)
        clean = clean.repeat(1, 1, (num_frames - 1) // self.vae_temporal_compression_ratio + 1, 1, 1)
        mask = clean.new_zeros((clean.shape[0], 1, *clean.shape[2:]))
        mask[:, :, 0] = 1.0
        patch = (self.transformer_spatial_patch_size, self.transformer_temporal_patch_size)
        clean, mask = self._pack_latents(clean, *patch), self._pack_latents(mask, *patch).squeeze(-1)
        noise = _token_noise((batch_size, *clean.shape[1:]), generator, device, dtype)
        latents = clean * mask.unsqueeze(-1) + noise * (1 - mask.unsqueeze(-1))
        return latents.to(device=device, dtype=dtype), mask.to(device)

    def _noised_stage_2_latents(
        self, latents: torch.Tensor, *, noise_scale: float, generator: Any, device: Any, dtype: Any, **_: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stage 2's given latents (first frame conditioned) packed, then noised: the noise drawn in token order as
        ltx-core's ``GaussianNoiser`` draws it (diffusers draws it as ``[B, C, F, H, W]`` and packs it after, which
        puts the same numbers on other tokens; its text-to-video pipeline packs first)."""
        mask = latents.new_zeros((latents.shape[0], 1, *latents.shape[2:]))
        mask[:, :, 0] = 1.0
        patch = (self.transformer_spatial_patch_size, self.transformer_temporal_patch_size)
        vae = self.vae
        normalised = self._normalize_latents(latents, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
        packed, mask = self._pack_latents(normalised, *patch), self._pack_latents(mask, *patch).squeeze(-1)
        noised = self._create_noised_state(packed, noise_scale * (1 - mask).unsqueeze(-1), generator)
        return noised.to(device=device, dtype=dtype), mask

    def convert_velocity_to_x0(
        self, sample: torch.Tensor, denoised_output: torch.Tensor, step_idx: int, scheduler: Any | None = None
    ) -> torch.Tensor:
        mask = self._conditioning_mask
        if (scheduler is not None and scheduler is not self.scheduler) or mask is None:
            return super().convert_velocity_to_x0(sample, denoised_output, step_idx, scheduler)
        if mask.shape != sample.shape[:2]:
            raise ValueError(
                f"conditioning mask {tuple(mask.shape)} does not fit the video latents {tuple(sample.shape)}"
            )
        sigma = self.scheduler.sigmas[step_idx].to(sample.device) * (1 - mask.to(sample.device))
        return sample - denoised_output * sigma[..., None].to(denoised_output.dtype)
