"""The loaded delivery against Lightricks' own code: ltx-core / ltx-pipelines at 400fd310 as a test-only peer.

Both sides load the same tiny LTX-2.3 single file (ltx-core key layout and metadata config, ``smoke_files``):
ltx-core with its own ``SingleGPUModelBuilder`` and ComfyUI renaming map, the delivery with ``load_pipeline``. They
get the same inputs (the delivery pipeline's first transformer call: initial noise, the first frame's clean latent,
positions, connector outputs) and run fp32 on the CPU. Tolerance: 1e-4 of the reference output's peak for a
forward, 1e-3 for the final latents of a loop (fp32 summation order differs between the two implementations:
measured ~1e-7 per forward; the loops amplify it through CFG 3-7).

The peer is the pinned checkout, not PyPI: ``ltx-core`` 1.0.0 on PyPI predates 400fd310 (different guiders,
loader and transformer code). Run with ``LTX2_SRC=/path/to/LTX-2`` (a checkout of Lightricks/LTX-2 at
400fd31054597515f47125691032c04b1c3ee24e); without it the module is skipped.
"""

from __future__ import annotations

import dataclasses
import importlib.machinery
import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import save_file

from sulphur2_npu.accuracy import tiny_request
from sulphur2_npu.generate import pipeline_kwargs
from sulphur2_npu.loader import load_pipeline
from sulphur2_npu.precision import capture_transformer_call
from sulphur2_npu.schedules import DISTILLED, DISTILLED_STEPS, use_schedule
from sulphur2_npu.tiny import TINY_HEIGHT, TINY_WIDTH

LTX2_SRC = os.environ.get("LTX2_SRC")
if not LTX2_SRC:
    pytest.skip(
        "ltx-core peer not configured: set LTX2_SRC to a Lightricks/LTX-2 checkout at 400fd310",
        allow_module_level=True,
    )
for package in ("ltx-core", "ltx-pipelines"):
    source = str(Path(LTX2_SRC) / "packages" / package / "src")
    if source not in sys.path:
        sys.path.insert(0, source)
# Two media libraries ltx-core / ltx-pipelines import at module level but only use for files and waveforms, which
# nothing here touches: torchaudio (ltx-core audio_vae/ops.py, the mel front end that encodes waveforms) and
# OpenImageIO (ltx-pipelines utils/media_io, EXR/HDR frames). PyPI has no torchaudio for torch 2.13 (the newest,
# 2.11, pins torch 2.11), so an empty module stands in for each one that is absent; any use fails loudly.
for _name in ("torchaudio", "OpenImageIO"):
    if importlib.util.find_spec(_name) is None:
        sys.modules[_name] = types.ModuleType(_name)
        sys.modules[_name].__spec__ = importlib.machinery.ModuleSpec(_name, None)
ltx_core = pytest.importorskip("ltx_core", reason=f"ltx_core not importable from LTX2_SRC={LTX2_SRC}")

from ltx_core.components.diffusion_steps import EulerDiffusionStep  # noqa: E402
from ltx_core.components.guiders import MultiModalGuider, MultiModalGuiderParams  # noqa: E402
from ltx_core.loader.module_ops import ModuleOps  # noqa: E402
from ltx_core.loader.single_gpu_model_builder import SingleGPUModelBuilder  # noqa: E402
from ltx_core.model.audio_vae.model_configurator import (  # noqa: E402
    AUDIO_VAE_DECODER_COMFY_KEYS_FILTER,
    VOCODER_COMFY_KEYS_FILTER,
    AudioDecoderConfigurator,
    VocoderConfigurator,
)
from ltx_core.model.transformer import (  # noqa: E402
    LTXV_MODEL_COMFY_RENAMING_MAP,
    LTXModelConfigurator,
    Modality,
    X0Model,
)
from ltx_core.model.video_vae.model_configurator import (  # noqa: E402
    VAE_DECODER_COMFY_KEYS_FILTER,
    VideoDecoderConfigurator,
)
from ltx_core.types import LatentState  # noqa: E402
from ltx_pipelines.utils.denoisers import GuidedDenoiser, SimpleDenoiser  # noqa: E402
from ltx_pipelines.utils.samplers import euler_denoising_loop  # noqa: E402

FORWARD_TOLERANCE = 1e-4
LOOP_TOLERANCE = 1e-3
DEV_STEPS = 4
TIMESTEP_SCALE = 1000  # diffusers passes timesteps and σ x 1000, ltx-core σ itself


def relative_error(got: torch.Tensor, reference: torch.Tensor) -> float:
    """max |got - reference| / max |reference|."""
    return float((got.float() - reference.float()).abs().max() / reference.float().abs().max())


@pytest.fixture(scope="module")
def ltx_transformer(smoke_files):
    builder = SingleGPUModelBuilder(LTXModelConfigurator, str(smoke_files.checkpoint), LTXV_MODEL_COMFY_RENAMING_MAP)
    return builder.build(device=torch.device("cpu"), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def image():
    pixels = np.random.default_rng(0).integers(0, 255, (TINY_HEIGHT, TINY_WIDTH, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _loaded(smoke_files, image_to_video: bool):
    return load_pipeline(
        smoke_files.checkpoint, smoke_files.text_encoder, image_to_video=image_to_video, torch_dtype=torch.float32
    ).pipe


def _call(pipe, request, image) -> dict:
    kwargs = pipeline_kwargs(pipe, request)
    if image is not None:
        kwargs |= {"image": image, "image_crf": 0}
    return kwargs


def _first_call(pipe, request, image) -> dict:
    use_schedule(pipe, request.schedule)
    return capture_transformer_call(
        pipe, {**_call(pipe, request, image), "generator": torch.Generator().manual_seed(42)}
    )


def _per_token(timestep: torch.Tensor, batch: int, tokens: int) -> torch.Tensor:
    """diffusers' (B,) or (B, T) timestep as ltx-core's per-token σ, (B, T)."""
    return (timestep.reshape(batch, -1) / TIMESTEP_SCALE).expand(batch, tokens)


def _modalities(kwargs: dict) -> tuple[Modality, Modality]:
    """ltx-core inputs equal to one diffusers transformer call's."""
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


@pytest.mark.parametrize("image_to_video", [False, True], ids=["t2v", "i2v"])
def test_one_transformer_forward_matches_ltx_core(smoke_files, ltx_transformer, image, image_to_video):
    pipe = _loaded(smoke_files, image_to_video)
    kwargs = _first_call(pipe, tiny_request(), image if image_to_video else None)
    if image_to_video:  # the conditioned first frame is what makes the I2V path differ
        assert bool((kwargs["timestep"] == 0).any()) and bool((kwargs["timestep"] > 0).any())
    with torch.no_grad():
        got = pipe.transformer(**{**kwargs, "return_dict": False})
        reference = ltx_transformer(*_modalities(kwargs), None)
    for stream, ours, theirs in zip(("video", "audio"), got, reference, strict=True):
        assert relative_error(ours, theirs) < FORWARD_TOLERANCE, stream


def _guider(scale: float, negative: torch.Tensor, num_layers: int) -> MultiModalGuider:
    """ltx-pipelines LTX_2_3_PARAMS (CFG ``scale``, STG 1 on block 28, modality 3, rescale 0.7) for this depth."""
    params = MultiModalGuiderParams(
        cfg_scale=scale, stg_scale=1.0, stg_blocks=[min(28, num_layers - 1)], rescale_scale=0.7, modality_scale=3.0
    )
    return MultiModalGuider(params=params, negative_context=negative)


def _ltx_pipelines_loop(transformer, kwargs: dict, sigmas: list[float], guidance: float | None):
    """ltx-pipelines' Euler loop from the delivery's first-call inputs; guidance None = distilled (SimpleDenoiser)."""
    guided = guidance is not None
    row = slice(1, 2) if guided else slice(0, 1)  # CFG batches (negative, positive)
    video, audio = _modalities(kwargs)
    denoise_mask = (video.timesteps[row] > 0).to(torch.float32)[..., None]

    def state(modality: Modality, mask: torch.Tensor) -> LatentState:
        latent = modality.latent[row].float()
        return LatentState(latent=latent, denoise_mask=mask, positions=modality.positions[row], clean_latent=latent)

    audio_mask = torch.ones((*audio.latent[row].shape[:2], 1))
    positive = (video.context[row], audio.context[row])
    if guided:
        layers = transformer.num_blocks
        denoiser = GuidedDenoiser(
            *positive,
            video_guider=_guider(guidance, video.context[:1], layers),
            audio_guider=_guider(7.0, audio.context[:1], layers),
        )
    else:
        denoiser = SimpleDenoiser(*positive)
    with torch.no_grad():
        video_state, audio_state = euler_denoising_loop(
            torch.tensor(sigmas, dtype=torch.float32),
            state(video, denoise_mask),
            state(audio, audio_mask),
            EulerDiffusionStep(),
            X0Model(transformer),
            denoiser,
        )
    return video_state.latent, audio_state.latent


def _delivery_final_latents(pipe, request, image):
    """The pipeline's final video and audio latents (packed, normalised) and the σ it ran."""
    use_schedule(pipe, request.schedule)
    with torch.no_grad():
        video, audio = pipe(
            **{**_call(pipe, request, image), "output_type": "latent"},
            generator=torch.Generator().manual_seed(42),
            return_dict=False,
        )
    packed_video = pipe._pack_latents(
        pipe._normalize_latents(video, pipe.vae.latents_mean, pipe.vae.latents_std, pipe.vae.config.scaling_factor),
        pipe.transformer_spatial_patch_size,
        pipe.transformer_temporal_patch_size,
    )
    packed_audio = pipe._normalize_audio_latents(
        pipe._pack_audio_latents(audio), pipe.audio_vae.latents_mean, pipe.audio_vae.latents_std
    )
    return packed_video, packed_audio, pipe.scheduler.sigmas.tolist()


@pytest.mark.parametrize(
    ("image_to_video", "schedule"),
    [(False, "dev"), (True, "dev"), (False, DISTILLED)],
    ids=["t2v-dev", "i2v-dev", "t2v-distilled"],
)
def test_final_latents_match_ltx_pipelines(smoke_files, ltx_transformer, image, image_to_video, schedule):
    pipe = _loaded(smoke_files, image_to_video)
    steps, guidance = (DISTILLED_STEPS, 1.0) if schedule == DISTILLED else (DEV_STEPS, 3.0)
    request = dataclasses.replace(tiny_request(), steps=steps, guidance=guidance, schedule=schedule)
    conditioning = image if image_to_video else None
    first = _first_call(pipe, request, conditioning)
    assert bool((first["encoder_attention_mask"] == 1).all())  # ltx-pipelines passes no context mask
    video, audio, sigmas = _delivery_final_latents(pipe, request, conditioning)
    reference = _ltx_pipelines_loop(ltx_transformer, first, sigmas, None if schedule == DISTILLED else guidance)
    for stream, ours, theirs in zip(("video", "audio"), (video, audio), reference, strict=True):
        assert relative_error(ours, theirs) < LOOP_TOLERANCE, stream


def _ltx_module(configurator, path: Path, sd_ops, module_ops: tuple = ()):
    builder = SingleGPUModelBuilder(configurator, str(path), sd_ops, module_ops=module_ops)
    return builder.build(device=torch.device("cpu"), dtype=torch.float32).eval()


def _mel_input_width(width: int) -> ModuleOps:
    """ltx-core builds the vocoder's input convolutions for 128 channels (2 x 64 mel bins, ``vocoder.py`` conv_pre);
    the tiny model has 2 x 8: only that width changes, the layer is ltx-core's own Conv1d(k=7, padding=3)."""

    def narrow(vocoder: torch.nn.Module) -> torch.nn.Module:
        for generator in (vocoder.vocoder, vocoder.bwe_generator):
            conv = generator.conv_pre
            generator.conv_pre = torch.nn.Conv1d(width, conv.out_channels, 7, padding=3, device=conv.weight.device)
        return vocoder

    return ModuleOps("tiny mel width", lambda module: hasattr(module, "bwe_generator"), narrow)


def _with_vae_section(smoke, folder: Path, drop: tuple[str, ...]) -> Path:
    """The smoke file with its ``vae`` metadata lacking ``drop``: what ltx-core then builds is its default."""
    with safe_open(str(smoke.checkpoint), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - not a Mapping
        config = json.loads(handle.metadata()["config"])
    config["vae"] = {key: value for key, value in config["vae"].items() if key not in drop}
    path = folder / "vae-defaults.safetensors"
    save_file(tensors, str(path), metadata={"config": json.dumps(config)})
    return path


# The fields ltx-core defaults when absent (decoder padding reflect, non-causal decoder); the shapes path must agree.
VAE_DEFAULTED_FIELDS = ("spatial_padding_mode", "causal_decoder")


@pytest.mark.parametrize("files", ["smoke_files", "smoke_files_partial_metadata"], ids=["metadata", "no-vae-section"])
def test_video_decode_matches_ltx_core(files, request, smoke_files, tmp_path):
    smoke = request.getfixturevalue(files)
    reference_file = (
        smoke.checkpoint if files == "smoke_files" else _with_vae_section(smoke_files, tmp_path, VAE_DEFAULTED_FIELDS)
    )
    decoder = _ltx_module(VideoDecoderConfigurator, reference_file, VAE_DECODER_COMFY_KEYS_FILTER)
    pipe = _loaded(smoke, image_to_video=False)
    vae = pipe.vae
    latent = torch.randn(1, vae.config.latent_channels, 2, 2, 3, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = decoder(latent)
        got = vae.decode(
            pipe._denormalize_latents(latent, vae.latents_mean, vae.latents_std, vae.config.scaling_factor),
            None,
            return_dict=False,
        )[0]
    assert got.shape == reference.shape and relative_error(got, reference) < FORWARD_TOLERANCE


def test_audio_decode_and_vocoder_match_ltx_core(smoke_files):
    audio_decoder = _ltx_module(AudioDecoderConfigurator, smoke_files.checkpoint, AUDIO_VAE_DECODER_COMFY_KEYS_FILTER)
    pipe = _loaded(smoke_files, image_to_video=False)
    vocoder = _ltx_module(
        VocoderConfigurator,
        smoke_files.checkpoint,
        VOCODER_COMFY_KEYS_FILTER,
        (_mel_input_width(pipe.vocoder.config.in_channels),),
    )
    audio_vae = pipe.audio_vae
    mel_bins = audio_vae.config.mel_bins // pipe.audio_vae_mel_compression_ratio
    latent = torch.randn(1, audio_vae.config.latent_channels, 6, mel_bins, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference_mel = audio_decoder(latent)
        packed = pipe._denormalize_audio_latents(
            pipe._pack_audio_latents(latent), audio_vae.latents_mean, audio_vae.latents_std
        )
        mel = audio_vae.decode(pipe._unpack_audio_latents(packed, 6, num_mel_bins=mel_bins), return_dict=False)[0]
        assert mel.shape == reference_mel.shape and relative_error(mel, reference_mel) < FORWARD_TOLERANCE
        reference_wave = vocoder(reference_mel)
        wave = pipe.vocoder(reference_mel)
    assert wave.dtype == torch.float32  # ltx-core runs the vocoder in float32 whatever the pipeline dtype
    assert wave.shape == reference_wave.shape and relative_error(wave, reference_wave) < FORWARD_TOLERANCE
