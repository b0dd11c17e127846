"""Lightricks' own code (ltx-core / ltx-pipelines at 400fd310) run on the delivery's inputs: the independent reference.

Test- and measurement-only (``tests/test_reference_ltx.py``, ``scripts/reference_ltx.py``); nothing here is imported
by inference. The peer is a checkout of Lightricks/LTX-2 at 400fd31054597515f47125691032c04b1c3ee24e named by
``LTX2_SRC``; its ``packages/*/src`` are imported with ``deliverykit.assets.patches.import_from_checkout``. (PyPI's
``ltx-core`` 1.0.0 predates that commit: other guiders, loader and transformer code.) Both sides load the same
single file, ltx-core with its own ``SingleGPUModelBuilder`` and ComfyUI key maps, and get the same inputs: the
delivery pipeline's first transformer call (initial noise, the first frame's clean latent, positions, connector
outputs).
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import os
import sys
import types
from pathlib import Path
from typing import Any

import torch

from deliverykit.assets.patches import import_from_checkout
from sulphur2_npu.generate import GenerationRequest, guidance_kwargs, pipeline_kwargs
from sulphur2_npu.precision import capture_transformer_call
from sulphur2_npu.schedules import DISTILLED, use_schedule

ENV = "LTX2_SRC"
PINNED_COMMIT = "400fd31054597515f47125691032c04b1c3ee24e"
TIMESTEP_SCALE = 1000  # diffusers passes timesteps and σ x 1000, ltx-core σ itself
SEED = 42
# Media libraries ltx-core / ltx-pipelines import at module level but use only for files and waveforms, which nothing
# here touches: torchaudio (ltx-core audio_vae/ops.py, the mel front end that encodes waveforms) and OpenImageIO
# (ltx-pipelines utils/media_io, EXR/HDR frames). PyPI has no torchaudio for torch 2.13 (the newest, 2.11, pins
# torch 2.11), so an empty module stands in for each one that is absent; any use of it fails loudly.
_UNUSED_IMPORTS = ("torchaudio", "OpenImageIO")


def peer_source() -> Path | None:
    """The checkout named by ``LTX2_SRC``, or None when unset."""
    value = os.environ.get(ENV)
    return Path(value) if value else None


def import_peer(source: Path) -> types.ModuleType:
    """``ltx_core`` imported from the checkout at ``source`` (``ltx_pipelines`` importable from it too).

    Raises ImportError when the checkout does not provide it.
    """
    for name in _UNUSED_IMPORTS:
        if importlib.util.find_spec(name) is None:
            module = types.ModuleType(name)
            module.__spec__ = importlib.machinery.ModuleSpec(name, None)
            sys.modules[name] = module
    packages = [Path(source) / "packages" / package / "src" for package in ("ltx-core", "ltx-pipelines")]
    return import_from_checkout("ltx_core", *packages)


def relative_error(got: torch.Tensor, reference: torch.Tensor) -> float:
    """max |got - reference| / max |reference|."""
    return float((got.float() - reference.float()).abs().max() / reference.float().abs().max())


def build(configurator: Any, path: Path, sd_ops: Any, module_ops: tuple = ()) -> torch.nn.Module:
    """An ltx-core module built and loaded (strictly) by ltx-core's own builder, fp32 on the CPU."""
    from ltx_core.loader.single_gpu_model_builder import SingleGPUModelBuilder

    builder = SingleGPUModelBuilder(configurator, str(path), sd_ops, module_ops=module_ops)
    return builder.build(device=torch.device("cpu"), dtype=torch.float32).eval()


def transformer(path: Path) -> torch.nn.Module:
    from ltx_core.model.transformer import LTXV_MODEL_COMFY_RENAMING_MAP, LTXModelConfigurator

    return build(LTXModelConfigurator, path, LTXV_MODEL_COMFY_RENAMING_MAP)


def video_decoder(path: Path) -> torch.nn.Module:
    from ltx_core.model.video_vae.model_configurator import VAE_DECODER_COMFY_KEYS_FILTER, VideoDecoderConfigurator

    return build(VideoDecoderConfigurator, path, VAE_DECODER_COMFY_KEYS_FILTER)


def embeddings_processor(path: Path, gemma_folder: Path) -> torch.nn.Module:
    """ltx-core's feature extractor + video and audio connectors (what diffusers calls ``connectors``); ltx-core
    reads the text encoder's config from its folder."""
    from ltx_core.text_encoders.gemma import EMBEDDINGS_PROCESSOR_KEY_OPS, EmbeddingsProcessorConfigurator

    configurator = EmbeddingsProcessorConfigurator.with_gemma_model_path(str(gemma_folder))
    return build(configurator, path, EMBEDDINGS_PROCESSOR_KEY_OPS)


def video_encoder(path: Path) -> torch.nn.Module:
    from ltx_core.model.video_vae.model_configurator import VAE_ENCODER_COMFY_KEYS_FILTER, VideoEncoderConfigurator

    return build(VideoEncoderConfigurator, path, VAE_ENCODER_COMFY_KEYS_FILTER)


def audio_decoder(path: Path) -> torch.nn.Module:
    from ltx_core.model.audio_vae.model_configurator import (
        AUDIO_VAE_DECODER_COMFY_KEYS_FILTER,
        AudioDecoderConfigurator,
    )

    return build(AudioDecoderConfigurator, path, AUDIO_VAE_DECODER_COMFY_KEYS_FILTER)


def vocoder(path: Path, mel_channels: int) -> torch.nn.Module:
    """ltx-core's BWE vocoder; its input convolutions are built for 128 channels (2 x 64 mel bins, ``vocoder.py``
    conv_pre), so for a smaller model only that width changes (still ltx-core's Conv1d(k=7, padding=3))."""
    from ltx_core.loader.module_ops import ModuleOps
    from ltx_core.model.audio_vae.model_configurator import VOCODER_COMFY_KEYS_FILTER, VocoderConfigurator

    def narrow(module: torch.nn.Module) -> torch.nn.Module:
        for generator in (module.vocoder, module.bwe_generator):
            conv = generator.conv_pre
            generator.conv_pre = torch.nn.Conv1d(
                mel_channels, conv.out_channels, 7, padding=3, device=conv.weight.device
            )
        return module

    width = ModuleOps("mel width", lambda module: hasattr(module, "bwe_generator"), narrow)
    return build(VocoderConfigurator, path, VOCODER_COMFY_KEYS_FILTER, (width,))


def write_ltx_core_transformer(source: Path, path: Path, seed: int = 0) -> Path:
    """``source`` (a single file with an ltx-core metadata config) with its transformer replaced by the ``LTXModel``
    ltx-core builds from that config and initialises itself, saved under ltx-core's own names
    (``model.diffusion_model.`` + its state-dict keys, the inverse of its ComfyUI renaming map). ltx-core leaves its
    AdaLN ``*scale_shift_table*`` parameters uninitialised (``torch.empty``, meant to be loaded): they get
    N(0, 1/dim) as diffusers initialises them; then every parameter gets N(0, 0.02) noise (seeded), so zero-initialised
    gates carry information too."""
    import json

    from ltx_core.model.transformer import LTXModelConfigurator
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(source), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - not a Mapping
        metadata = handle.metadata()
    torch.manual_seed(seed)
    model = LTXModelConfigurator.from_metadata({"config": json.loads(metadata["config"])})
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "scale_shift_table" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) / parameter.shape[-1] ** 0.5)
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.02)
    written = {f"model.diffusion_model.{key}": value.contiguous() for key, value in model.state_dict().items()}
    unknown = sorted(set(written) - set(tensors))
    if unknown:
        raise KeyError(f"ltx-core names transformer tensors the single-file layout does not have: {unknown[:5]}")
    save_file({**tensors, **written}, str(path), metadata=metadata)
    return path


def call_kwargs(pipe: Any, request: GenerationRequest, image: Any = None) -> dict[str, Any]:
    """What ``generate()`` passes to the pipeline (``image_crf=0``: no H.264 round trip of the test image)."""
    use_schedule(pipe, request.schedule)
    kwargs = pipeline_kwargs(pipe, request)
    return kwargs | ({"image": image, "image_crf": 0} if image is not None else {})


def first_call(pipe: Any, request: GenerationRequest, image: Any = None) -> dict[str, Any]:
    """The keyword arguments of the pipeline's first transformer call."""
    kwargs = call_kwargs(pipe, request, image)
    return capture_transformer_call(pipe, {**kwargs, "generator": torch.Generator().manual_seed(SEED)})


def _per_token(timestep: torch.Tensor, batch: int, tokens: int) -> torch.Tensor:
    """diffusers' (B,) or (B, T) timestep as ltx-core's per-token σ, (B, T)."""
    return (timestep.reshape(batch, -1) / TIMESTEP_SCALE).expand(batch, tokens)


def modalities(kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """ltx-core ``Modality`` inputs equal to one diffusers transformer call's."""
    from ltx_core.model.transformer import Modality

    video, audio = kwargs["hidden_states"], kwargs["audio_hidden_states"]
    batch = video.shape[0]
    sigma = kwargs["sigma"].reshape(batch, -1)[:, 0] / TIMESTEP_SCALE
    audio_timestep = kwargs.get("audio_timestep")
    audio_timestep = kwargs["sigma"] if audio_timestep is None else audio_timestep
    return (
        Modality(
            latent=video,
            sigma=sigma,
            timesteps=_per_token(kwargs["timestep"], batch, video.shape[1]),
            positions=kwargs["video_coords"],
            context=kwargs["encoder_hidden_states"],
            context_mask=kwargs["encoder_attention_mask"],
        ),
        Modality(
            latent=audio,
            sigma=sigma,
            timesteps=_per_token(audio_timestep, batch, audio.shape[1]),
            positions=kwargs["audio_coords"],
            context=kwargs["audio_encoder_hidden_states"],
            context_mask=kwargs["audio_encoder_attention_mask"],
        ),
    )


def _guiders(request: GenerationRequest, num_layers: int, negative: tuple[torch.Tensor, torch.Tensor]) -> tuple:
    """ltx-pipelines' ``LTX_2_3_PARAMS`` guiders (CFG, STG, modality, rescale 0.7) with the delivery's STG block for
    this depth and its video CFG scale."""
    from ltx_core.components.guiders import MultiModalGuider
    from ltx_pipelines.utils.constants import LTX_2_3_PARAMS

    blocks = guidance_kwargs(request.guidance, num_layers)["spatio_temporal_guidance_blocks"]
    video = dataclasses.replace(LTX_2_3_PARAMS.video_guider_params, stg_blocks=blocks, cfg_scale=request.guidance)
    audio = dataclasses.replace(LTX_2_3_PARAMS.audio_guider_params, stg_blocks=blocks)
    return MultiModalGuider(params=video, negative_context=negative[0]), MultiModalGuider(
        params=audio, negative_context=negative[1]
    )


def pipelines_loop(
    model: torch.nn.Module, kwargs: dict[str, Any], sigmas: list[float], request: GenerationRequest
) -> tuple[torch.Tensor, torch.Tensor]:
    """ltx-pipelines' Euler loop (``euler_denoising_loop`` + ``GuidedDenoiser``, or ``SimpleDenoiser`` for the
    distilled schedule) from the delivery's first-call inputs ``kwargs``; the final video and audio latents."""
    from ltx_core.components.diffusion_steps import EulerDiffusionStep
    from ltx_core.model.transformer import X0Model
    from ltx_core.types import LatentState
    from ltx_pipelines.utils.denoisers import GuidedDenoiser, SimpleDenoiser
    from ltx_pipelines.utils.samplers import euler_denoising_loop

    guided = request.schedule != DISTILLED
    row = slice(1, 2) if guided else slice(0, 1)  # CFG batches (negative, positive)
    video, audio = modalities(kwargs)

    def state(modality: Any, mask: torch.Tensor) -> LatentState:
        latent = modality.latent[row].float()
        return LatentState(latent=latent, denoise_mask=mask, positions=modality.positions[row], clean_latent=latent)

    video_mask = (video.timesteps[row] > 0).to(torch.float32)[..., None]  # 0 on the conditioned first frame
    audio_mask = torch.ones((*audio.latent[row].shape[:2], 1))
    positive = (video.context[row], audio.context[row])
    if guided:
        video_guider, audio_guider = _guiders(request, model.num_blocks, (video.context[:1], audio.context[:1]))
        denoiser = GuidedDenoiser(*positive, video_guider=video_guider, audio_guider=audio_guider)
    else:
        denoiser = SimpleDenoiser(*positive)
    with torch.no_grad():
        video_state, audio_state = euler_denoising_loop(
            torch.tensor(sigmas, dtype=torch.float32),
            state(video, video_mask),
            state(audio, audio_mask),
            EulerDiffusionStep(),
            X0Model(model),
            denoiser,
        )
    return video_state.latent, audio_state.latent


def delivery_final_latents(
    pipe: Any, request: GenerationRequest, image: Any = None
) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
    """The pipeline's final video and audio latents (packed and normalised like the transformer's inputs) and σ."""
    kwargs = call_kwargs(pipe, request, image)
    with torch.no_grad():
        video, audio = pipe(
            **{**kwargs, "output_type": "latent"}, generator=torch.Generator().manual_seed(SEED), return_dict=False
        )
    vae, audio_vae = pipe.vae, pipe.audio_vae
    packed_video = pipe._pack_latents(
        pipe._normalize_latents(video, vae.latents_mean, vae.latents_std, vae.config.scaling_factor),
        pipe.transformer_spatial_patch_size,
        pipe.transformer_temporal_patch_size,
    )
    packed_audio = pipe._normalize_audio_latents(
        pipe._pack_audio_latents(audio), audio_vae.latents_mean, audio_vae.latents_std
    )
    return packed_video, packed_audio, pipe.scheduler.sigmas.tolist()
