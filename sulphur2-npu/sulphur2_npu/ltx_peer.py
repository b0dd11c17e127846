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
import functools
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
from sulphur2_npu.schedules import DISTILLED, DISTILLED_STEPS, use_schedule

ENV = "LTX2_SRC"
PINNED_COMMIT = "400fd31054597515f47125691032c04b1c3ee24e"
TIMESTEP_SCALE = 1000  # diffusers passes timesteps and σ x 1000, ltx-core σ itself
SEED = 42
EULER, RES_2S = "euler", "res_2s"  # the samplers of ltx-pipelines' loops (the report's timing.stages.sampler)
# Media libraries ltx-core / ltx-pipelines import at module level but use only for files and waveforms, which nothing
# here touches: torchaudio (ltx-core audio_vae/ops.py, the mel front end that encodes waveforms) and OpenImageIO
# (ltx-pipelines utils/media_io, EXR/HDR frames), and scipy (ltx-core components/schedulers.py, for its
# BetaScheduler only). PyPI has no torchaudio for torch 2.13 (the newest, 2.11, pins torch 2.11), so an empty module
# stands in for each one that is absent; any use of it fails loudly.
_UNUSED_IMPORTS = ("torchaudio", "OpenImageIO", "scipy")


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


def transformer(path: Path, lora: tuple[Path, float] | None = None) -> torch.nn.Module:
    """ltx-core's transformer, with ``lora`` (file, strength) fused as ltx-pipelines fuses ``--distilled-lora``
    (``LTXV_LORA_COMFY_RENAMING_MAP``), except that the delta is summed in float32: ltx-core's default
    ``bf16_fuse_rule`` rounds it to bfloat16, which would measure bf16 rounding, not the mapping."""
    from ltx_core.loader import LoraPathStrengthAndSDOps
    from ltx_core.loader.fuse_loras import bf16_fuse_rule
    from ltx_core.loader.sd_ops import LTXV_LORA_COMFY_RENAMING_MAP
    from ltx_core.loader.single_gpu_model_builder import SingleGPUModelBuilder
    from ltx_core.model.transformer import LTXV_MODEL_COMFY_RENAMING_MAP, LTXModelConfigurator

    if lora is None:
        return build(LTXModelConfigurator, path, LTXV_MODEL_COMFY_RENAMING_MAP)
    builder = SingleGPUModelBuilder(
        LTXModelConfigurator,
        str(path),
        LTXV_MODEL_COMFY_RENAMING_MAP,
        loras=(LoraPathStrengthAndSDOps(str(lora[0]), lora[1], LTXV_LORA_COMFY_RENAMING_MAP),),
        fuse_rule=dataclasses.replace(bf16_fuse_rule, aggregation_dtype=torch.float32),
    )
    return builder.build(device=torch.device("cpu"), dtype=torch.float32).eval()


def latent_upsampler(path: Path) -> torch.nn.Module:
    """ltx-core's ``LatentUpsampler`` from the released upsampler layout (config from the file's metadata)."""
    from ltx_core.model.upsampler import LatentUpsamplerConfigurator

    return build(LatentUpsamplerConfigurator, path, None)


def upsample_tokens(tokens: torch.Tensor, shape: tuple[int, ...], encoder: Any, upsampler: Any) -> torch.Tensor:
    """ltx-pipelines' ``VideoUpsampler`` on patchified stage-1 tokens of latent ``shape`` (B, C, F, H, W):
    unpatchify, ``upsample_video`` (the encoder's statistics around the upsampler), patchify again."""
    from ltx_core.components.patchifiers import VideoLatentPatchifier
    from ltx_core.model.upsampler import upsample_video
    from ltx_core.types import VideoLatentShape

    patchifier = VideoLatentPatchifier(patch_size=1)
    batch, channels, frames, height, width = shape
    latent = patchifier.unpatchify(tokens, VideoLatentShape(batch, channels, frames, height, width))
    with torch.no_grad():
        return patchifier.patchify(upsample_video(latent=latent, video_encoder=encoder, upsampler=upsampler))


def stage_2_loop(
    model: torch.nn.Module,
    kwargs: dict[str, Any],
    initial: tuple[torch.Tensor, torch.Tensor],
    sigmas: list[float],
    generator: torch.Generator,
    frozen_audio: bool = False,
    sampler: str = EULER,
) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """ltx-pipelines' stage 2: ``GaussianNoiser`` (``noise_scale`` = the first σ, video then audio, from
    ``generator``) on the ``initial`` (video, audio) tokens, then the loop of ``sampler`` (:func:`_sampling`) with
    ``SimpleDenoiser``, at the positions and contexts of the delivery's stage-2 first call ``kwargs``. Returns the
    noised and the final (video, audio) tokens. ``frozen_audio``: the audio held (a2v; its noise is still drawn, at
    mask 0). Video tokens the call conditions (timestep 0: a first frame, ltx-pipelines'
    ``VideoConditionByLatentIndex`` at strength 1) keep its latent and get denoise mask 0."""
    from ltx_core.components.noisers import GaussianNoiser
    from ltx_core.model.transformer import X0Model
    from ltx_core.types import LatentState
    from ltx_pipelines.utils.denoisers import SimpleDenoiser

    video, audio = modalities(kwargs)
    video_mask = (video.timesteps > 0).to(torch.float32)[..., None]
    conditioned = torch.where(video_mask.bool(), initial[0], kwargs["hidden_states"])
    noiser = GaussianNoiser(generator=generator)
    states = [
        noiser(
            LatentState(latent=latent, denoise_mask=mask, positions=modality.positions, clean_latent=latent),
            noise_scale=sigmas[0],
        )
        for latent, mask, modality in (
            (conditioned, video_mask, video),
            (initial[1], torch.ones((*initial[1].shape[:2], 1)), audio),
        )
    ]
    if frozen_audio:
        states[1] = _frozen(states[1], initial[1])
    loop, stepper = _sampling(sampler)
    with torch.no_grad():
        video_state, audio_state = loop(
            sigmas=torch.tensor(sigmas, dtype=torch.float32),
            video_state=states[0],
            audio_state=states[1],
            stepper=stepper,
            transformer=X0Model(model),
            denoiser=SimpleDenoiser(video.context, audio.context),
        )
    return (states[0].latent, states[1].latent), (video_state.latent, audio_state.latent)


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


def audio_encoder(path: Path) -> torch.nn.Module:
    from ltx_core.model.audio_vae.model_configurator import (
        AUDIO_VAE_ENCODER_COMFY_KEYS_FILTER,
        AudioEncoderConfigurator,
    )

    return build(AudioEncoderConfigurator, path, AUDIO_VAE_ENCODER_COMFY_KEYS_FILTER)


def encoded_audio_tokens(path: Path, clip: Any, seconds: float) -> tuple[torch.Tensor, str]:
    """:func:`encoded_audio` as patchified tokens."""
    from ltx_core.components.patchifiers import AudioPatchifier

    latent, front_end = encoded_audio(path, clip, seconds)
    return AudioPatchifier(patch_size=1).patchify(latent), front_end


def encoded_audio(path: Path, clip: Any, seconds: float) -> tuple[torch.Tensor, str]:
    """ltx-core's ``encode_audio`` of ``clip`` (an ``audio_io.AudioClip``), cut as ``A2VidPipelineTwoStage`` cuts it
    (``[1, C, L, M]``), and which front end made the mel: ltx-core's own ``AudioProcessor`` where torchaudio
    imports (a torchaudio 2.11 wheel unpacked on PYTHONPATH runs its pure-Python resample and mel), else the
    delivery's ``audio_io.log_mel`` (compared with torchaudio's in ``tests/test_audio_io.py``)."""
    from ltx_core.model.audio_vae import encode_audio
    from ltx_core.types import Audio, AudioLatentShape

    from sulphur2_npu.audio_io import log_mel

    encoder = audio_encoder(path)
    waveform = clip.waveform.unsqueeze(0)
    with torch.no_grad():
        if hasattr(sys.modules["torchaudio"], "transforms"):
            latent, front_end = encode_audio(Audio(waveform, clip.sample_rate), encoder), "ltx-core (torchaudio)"
        else:
            mel = log_mel(waveform, clip.sample_rate, target_rate=encoder.sample_rate, n_fft=encoder.n_fft,
                          hop=encoder.mel_hop_length, mels=encoder.mel_bins)  # fmt: skip
            latent, front_end = encoder(mel), "delivery (audio_io.log_mel)"
    frames = AudioLatentShape.from_duration(batch=1, duration=seconds, channels=8, mel_bins=16).frames
    return latent[:, :, :frames], front_end


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


def initial_noise_errors(pipe: Any, request: GenerationRequest, image: Any = None) -> dict[str, float]:
    """The delivery's first transformer inputs against ltx-pipelines' ``_build_state`` (``GaussianNoiser``) from the
    same seed: the video tokens that start as noise (all but a first frame's) and the audio tokens, one to one."""
    from ltx_core.components.noisers import GaussianNoiser
    from ltx_pipelines.utils.blocks import _build_state
    from ltx_pipelines.utils.types import ModalitySpec

    call = first_call(pipe, request, image)
    row, cpu = slice(-1, None), torch.device("cpu")  # the positive row: CFG batches put it last
    noiser = GaussianNoiser(generator=torch.Generator().manual_seed(SEED))  # video first, then audio: one stream
    video_tools, audio_tools = _ltx_tools(pipe, request, request.width, request.height)
    video = _build_state(ModalitySpec(call["encoder_hidden_states"][row]), video_tools, noiser, torch.float32, cpu)
    audio = _build_state(
        ModalitySpec(call["audio_encoder_hidden_states"][row]), audio_tools, noiser, torch.float32, cpu
    )
    tokens = call["hidden_states"].shape[1]
    noise = _per_token(call["timestep"], call["timestep"].shape[0], tokens)[-1] > 0  # not a conditioned frame's
    return {
        "video noise": relative_error(call["hidden_states"][row][:, noise], video.latent[:, noise]),
        "audio noise": relative_error(call["audio_hidden_states"][row], audio.latent),
    }


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


def _guiders(
    request: GenerationRequest, num_layers: int, negative: tuple[torch.Tensor, torch.Tensor], sampler: str
) -> tuple:
    """ltx-pipelines' ``LTX_2_3_PARAMS`` guiders (CFG, STG, modality, rescale 0.7) with the delivery's STG block for
    this depth, or for res_2s ``LTX_2_3_HQ_PARAMS``' (no STG, rescale 0.45 and 1), with its video CFG scale."""
    from ltx_core.components.guiders import MultiModalGuider
    from ltx_pipelines.utils.constants import LTX_2_3_HQ_PARAMS, LTX_2_3_PARAMS

    if sampler == RES_2S:
        video, audio = LTX_2_3_HQ_PARAMS.video_guider_params, LTX_2_3_HQ_PARAMS.audio_guider_params
    else:
        blocks = guidance_kwargs(request.guidance, num_layers)["spatio_temporal_guidance_blocks"]
        video = dataclasses.replace(LTX_2_3_PARAMS.video_guider_params, stg_blocks=blocks)
        audio = dataclasses.replace(LTX_2_3_PARAMS.audio_guider_params, stg_blocks=blocks)
    video = dataclasses.replace(video, cfg_scale=request.guidance)
    return MultiModalGuider(params=video, negative_context=negative[0]), MultiModalGuider(
        params=audio, negative_context=negative[1]
    )


def _sampling(sampler: str) -> tuple[Any, Any]:
    """ltx-pipelines' denoising loop and stepper: ``euler`` or ``res_2s`` (``TI2VidTwoStagesHQPipeline``'s, its
    states kept in float32: ltx-pipelines' ``model_dtype`` is its model's bf16, the tiny model here is float32)."""
    from ltx_core.components.diffusion_steps import EulerDiffusionStep, Res2sDiffusionStep
    from ltx_pipelines.utils.samplers import euler_denoising_loop, res2s_audio_video_denoising_loop

    if sampler == RES_2S:
        return functools.partial(res2s_audio_video_denoising_loop, model_dtype=torch.float32), Res2sDiffusionStep()
    return euler_denoising_loop, EulerDiffusionStep()


def pipelines_loop(
    model: torch.nn.Module,
    kwargs: dict[str, Any],
    sigmas: list[float],
    request: GenerationRequest,
    frozen_audio: torch.Tensor | None = None,
    sampler: str = EULER,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ltx-pipelines' loop of ``sampler`` (:func:`_sampling`) with ``GuidedDenoiser``, or ``SimpleDenoiser`` for the
    distilled schedule, from the delivery's first-call inputs ``kwargs``; the final video and audio latents.
    ``frozen_audio``: these audio tokens instead, held as ``ModalitySpec(frozen=True)`` holds them (a2v)."""
    from ltx_core.model.transformer import X0Model
    from ltx_core.types import LatentState
    from ltx_pipelines.utils.denoisers import GuidedDenoiser, SimpleDenoiser

    guided = request.schedule != DISTILLED
    row = slice(1, 2) if guided else slice(0, 1)  # CFG batches (negative, positive)
    video, audio = modalities(kwargs)

    def state(modality: Any, mask: torch.Tensor) -> LatentState:
        latent = modality.latent[row].float()
        return LatentState(latent=latent, denoise_mask=mask, positions=modality.positions[row], clean_latent=latent)

    video_mask = (video.timesteps[row] > 0).to(torch.float32)[..., None]  # 0 on the conditioned first frame
    audio_mask = torch.ones((*audio.latent[row].shape[:2], 1))
    audio_state = state(audio, audio_mask)
    if frozen_audio is not None:
        audio_state = _frozen(audio_state, frozen_audio)
    positive = (video.context[row], audio.context[row])
    if guided:
        negative = (video.context[:1], audio.context[:1])
        video_guider, audio_guider = _guiders(request, model.num_blocks, negative, sampler)
        denoiser = GuidedDenoiser(*positive, video_guider=video_guider, audio_guider=audio_guider)
    else:
        denoiser = SimpleDenoiser(*positive)
    loop, stepper = _sampling(sampler)
    with torch.no_grad():
        video_state, audio_state = loop(
            sigmas=torch.tensor(sigmas, dtype=torch.float32),
            video_state=state(video, video_mask),
            audio_state=audio_state,
            stepper=stepper,
            transformer=X0Model(model),
            denoiser=denoiser,
        )
    return video_state.latent, audio_state.latent


def _frozen(state: Any, latent: torch.Tensor) -> Any:
    """ltx-pipelines' ``DiffusionStage`` state of a ``ModalitySpec(frozen=True, initial_latent=latent)``: the
    latent, a zero denoise mask, ``frozen`` (so ``Modality.sigma`` is 0 too)."""
    mask = torch.zeros((*latent.shape[:2], 1))
    return dataclasses.replace(state, latent=latent, clean_latent=latent, denoise_mask=mask, frozen=True)


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


class StageCapture:
    """A two-stage ``generate`` observed where ltx-pipelines' stages meet: every transformer call's inputs and the
    latents handed to the upsampler (stage 1's result) and to the decoders (stage 2's). ``vaes``: also what the
    pipeline's own tail hands ``vae.decode`` and ``audio_vae.decode`` (seen as ``vae`` and ``audio_vae``)."""

    def __init__(self, pipe: Any, functions: tuple[str, ...] = ("upsample", "decode"), *, vaes: bool = False):
        from sulphur2_npu import generate as generate_module

        self.calls: list[dict[str, Any]] = []
        self.seen: dict[str, tuple] = {}
        self._module, self._originals = generate_module, {}
        self._hook = pipe.transformer.register_forward_pre_hook(self._call, with_kwargs=True)
        for name in functions:
            original = self._originals[name] = getattr(generate_module, name)
            setattr(generate_module, name, self._recording(name, original))
        self._vaes = [pipe.vae, pipe.audio_vae] if vaes else []
        for name, vae in zip(("vae", "audio_vae"), self._vaes, strict=False):
            vae.decode = self._recording(name, vae.decode)  # an instance attribute over the class's method

    def _call(self, module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        self.calls.append({key: value.clone() if torch.is_tensor(value) else value for key, value in kwargs.items()})

    def _recording(self, name: str, original: Any) -> Any:
        def record(*args: Any, **kwargs: Any) -> Any:
            self.seen[name] = args
            return original(*args, **kwargs)

        return record

    def close(self) -> None:
        self._hook.remove()
        for name, original in self._originals.items():
            setattr(self._module, name, original)
        for vae in self._vaes:
            del vae.decode


def _tokens(pipe: Any, video: torch.Tensor, audio: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Un-normalised (B, C, F, H, W) video and (B, C, L, M) audio latents as the transformer's normalised tokens."""
    vae, audio_vae = pipe.vae, pipe.audio_vae
    video = pipe._pack_latents(pipe._normalize_latents(video, vae.latents_mean, vae.latents_std), 1, 1)
    if audio is None:
        return (video,)
    audio = pipe._pack_audio_latents(audio)
    return video, pipe._normalize_audio_latents(audio, audio_vae.latents_mean, audio_vae.latents_std)


def _between_stages(
    capture: StageCapture, reference_video: torch.Tensor, checkpoint: Path, smoke: Any
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any], torch.Generator]:
    """ltx-pipelines between the stages: the delivery's stage-1 video (what it upsampled), ltx-core's upsampling of
    the reference's, the delivery's first stage-2 call, and the seed's generator past stage 1's two draws (one row of
    a CFG batch each), where ltx-pipelines' noiser goes on."""
    stage_1_video = capture.seen["upsample"][1]
    upsampled = upsample_tokens(
        reference_video, tuple(stage_1_video.shape), video_encoder(checkpoint), latent_upsampler(smoke.upsampler)
    )
    second = next(call for call in capture.calls if call["hidden_states"].shape[1] == upsampled.shape[1])
    generator = torch.Generator().manual_seed(SEED)
    first = capture.calls[0]
    for name in ("hidden_states", "audio_hidden_states"):
        torch.randn((1, *first[name].shape[1:]), generator=generator)
    return stage_1_video, upsampled, second, generator


@dataclasses.dataclass(frozen=True)
class ReferenceStages:
    """What ltx-pipelines runs in the two stages of a pipeline: its sampler, each stage's model and σ."""

    sampler: str
    models: tuple[torch.nn.Module, torch.nn.Module]
    sigmas: tuple[list[float], list[float]]


def reference_stages(
    pipeline: str,
    model: torch.nn.Module,
    checkpoint: Path,
    lora: tuple[Path, float],
    stage_1_shape: tuple[int, ...],
    recorded: dict[str, Any],
) -> ReferenceStages:
    """The stages of ``pipeline`` as ltx-pipelines builds them, for ``model`` (ltx-core's transformer of
    ``checkpoint``): ``distilled`` and ``two-stage`` with the delivery's σ (``recorded``: its report's
    ``timing.stages``; equal to ltx-pipelines' by ``test_schedules.py``) and ``lora`` fused in stage 2 of
    ``two-stage``; ``two-stage-hq`` res_2s with its own σ (stage 1's from ``LTX2Scheduler`` given the stage-1 latent
    of ``stage_1_shape``, stage 2's ``STAGE_2_DISTILLED_SIGMAS``) and the LoRA fused at its HQ strengths."""
    from ltx_core.components.schedulers import LTX2Scheduler
    from ltx_pipelines.utils.constants import STAGE_2_DISTILLED_SIGMA_VALUES

    from sulphur2_npu.options import TWO_STAGE_HQ
    from sulphur2_npu.stages import HQ_LORA_STRENGTHS

    sigmas = (recorded["stage_1"]["sigmas"], recorded["stage_2"]["sigmas"])
    if pipeline == DISTILLED:
        return ReferenceStages(EULER, (model, model), sigmas)
    if pipeline != TWO_STAGE_HQ:
        return ReferenceStages(EULER, (model, transformer(checkpoint, lora)), sigmas)
    steps = (len(sigmas[0]) - 2) // 2  # 2n + 1 evaluations and the terminal 0
    stage_1 = LTX2Scheduler().execute(latent=torch.empty(stage_1_shape), steps=steps).tolist()
    models = tuple(transformer(checkpoint, (lora[0], strength)) for strength in HQ_LORA_STRENGTHS)
    return ReferenceStages(RES_2S, models, (stage_1, list(STAGE_2_DISTILLED_SIGMA_VALUES)))


def two_stage_errors(
    pipe: Any, model: torch.nn.Module, checkpoint: Path, smoke: Any, pipeline: str, steps: int = 4, image: Any = None
) -> dict[str, float]:
    """The delivery's ``pipeline`` (``distilled``, ``two-stage`` or ``two-stage-hq``) on ``pipe`` against
    ltx-pipelines' stages run by Lightricks' code from the same first-call inputs: stage 1's loop on ``model``
    (ltx-core's transformer of ``checkpoint``), ltx-core's upsampler and video encoder statistics,
    ``GaussianNoiser`` from the same generator stream, stage 2's loop (``model`` with ``smoke.distilled_lora`` fused
    at 0.8 for ``two-stage``). ``two-stage-hq``: both loops res_2s, the LoRA fused at 0.25 and 0.5, stage 1's σ from
    ltx-core's ``LTX2Scheduler`` given stage 1's latent and stage 2's ``STAGE_2_DISTILLED_SIGMAS``, as its pipeline
    makes them. ``steps``: the dev stage 1's; ``image``: a first frame (``pipe`` image-to-video; its latent is the
    delivery's at each stage). Returns the relative error of each hand-over (:func:`relative_error`)."""
    from sulphur2_npu.accuracy import tiny_request
    from sulphur2_npu.generate import generate
    from sulphur2_npu.stages import load_stage_parts
    from sulphur2_npu.tiny import TINY_TWO_STAGE_PRESET

    parts = load_stage_parts(pipe, pipeline, upsampler=smoke.upsampler, distilled_lora=(smoke.distilled_lora, 0.8))
    settings = {"steps": DISTILLED_STEPS, "guidance": 1.0} if pipeline == DISTILLED else {"steps": steps}
    size = {"width": TINY_TWO_STAGE_PRESET.width, "height": TINY_TWO_STAGE_PRESET.height}
    schedule = DISTILLED if pipeline == DISTILLED else "dev"
    request = dataclasses.replace(tiny_request(), **size, **settings, schedule=schedule, pipeline=pipeline, image=image)
    capture = StageCapture(pipe)
    try:
        result = generate(pipe, request, device="cpu", generator=torch.Generator().manual_seed(SEED), parts=parts)
    finally:
        capture.close()
    stage_2 = _tokens(pipe, *capture.seen["decode"][1:])
    first = capture.calls[0]
    half = dataclasses.replace(
        request, width=request.width // 2, height=request.height // 2, pipeline="one-stage", image=None
    )
    shape = tuple(capture.seen["upsample"][1].shape)
    plan = reference_stages(pipeline, model, checkpoint, (smoke.distilled_lora, 0.8), shape, result.stages)
    reference_1 = pipelines_loop(plan.models[0], first, plan.sigmas[0], half, sampler=plan.sampler)
    stage_1_video, upsampled, second, generator = _between_stages(capture, reference_1[0], checkpoint, smoke)
    initial = (upsampled, reference_1[1])
    noised, reference_2 = stage_2_loop(plan.models[1], second, initial, plan.sigmas[1], generator, sampler=plan.sampler)
    # DistilledPipeline decodes stage 2's audio; TI2VidTwoStages(HQ)Pipeline "refines video only", decoding stage 1's
    audio_reference = reference_2[1] if pipeline == DISTILLED else reference_1[1]
    return {
        "stage 1 video": relative_error(_tokens(pipe, stage_1_video)[0], reference_1[0]),
        "stage 2 input video": relative_error(second["hidden_states"], noised[0]),
        "stage 2 input audio": relative_error(second["audio_hidden_states"], noised[1]),
        "stage 2 video": relative_error(stage_2[0], reference_2[0]),
        "audio": relative_error(stage_2[1], audio_reference),
    }


def a2v_errors(
    pipe: Any, model: torch.nn.Module, checkpoint: Path, smoke: Any, steps: int = 4, image: Any = None
) -> dict[str, Any]:
    """The delivery's ``a2v`` pipeline on ``pipe`` (the smoke's sound track; ``image``: its first frame, ``pipe``
    image-to-video) against ``A2VidPipelineTwoStage``'s parts run by Lightricks' code: the sound encoded by ltx-core
    (:func:`encoded_audio_tokens`), stage 1's guided loop on ``model`` with that audio frozen, the upsampler, stage
    2's re-noising on the same generator stream and its loop with the distilled LoRA fused at 0.8, the audio frozen
    again. The first frame's latent is the delivery's at each stage (ltx-core's video encoder is compared with it in
    ``tests/test_reference_ltx.py``). Relative errors of each hand-over, and the mel's ``front end``."""
    from sulphur2_npu.accuracy import tiny_request
    from sulphur2_npu.generate import generate
    from sulphur2_npu.options import A2V
    from sulphur2_npu.stages import load_stage_parts
    from sulphur2_npu.tiny import TINY_TWO_STAGE_PRESET, smoke_sound

    lora = (smoke.distilled_lora, 0.8)
    parts = load_stage_parts(pipe, A2V, upsampler=smoke.upsampler, distilled_lora=lora)
    size = {"width": TINY_TWO_STAGE_PRESET.width, "height": TINY_TWO_STAGE_PRESET.height}
    request = dataclasses.replace(tiny_request(), **size, steps=steps, schedule="dev", pipeline=A2V)
    request = dataclasses.replace(request, audio=smoke_sound(request.num_frames / request.fps), image=image)
    sound, front_end = encoded_audio_tokens(checkpoint, request.audio, request.num_frames / request.fps)
    capture = StageCapture(pipe, ("upsample", "decode_video"))
    try:
        result = generate(pipe, request, device="cpu", generator=torch.Generator().manual_seed(SEED), parts=parts)
    finally:
        capture.close()
    first = capture.calls[0]
    half = dataclasses.replace(
        request, width=request.width // 2, height=request.height // 2, pipeline="one-stage", audio=None, image=None
    )
    reference_1 = pipelines_loop(model, first, result.stages["stage_1"]["sigmas"], half, frozen_audio=sound)
    stage_1_video, upsampled, second, generator = _between_stages(capture, reference_1[0], checkpoint, smoke)
    sigmas_2 = result.stages["stage_2"]["sigmas"]
    noised, reference_2 = stage_2_loop(
        transformer(checkpoint, lora), second, (upsampled, sound), sigmas_2, generator, frozen_audio=True
    )
    return {
        "audio latent": relative_error(first["audio_hidden_states"][1:], sound),
        "stage 1 video": relative_error(_tokens(pipe, stage_1_video)[0], reference_1[0]),
        "stage 1 audio held": relative_error(second["audio_hidden_states"], reference_1[1]),
        "stage 2 input video": relative_error(second["hidden_states"], noised[0]),
        "stage 2 video": relative_error(_tokens(pipe, capture.seen["decode_video"][1])[0], reference_2[0]),
        "front end": front_end,
    }


def _ltx_tools(pipe: Any, request: GenerationRequest, width: int, height: int) -> tuple[Any, Any]:
    """ltx-pipelines' ``DiffusionStage`` latent tools (video, audio) for one stage's frame size, with the latent
    channels and audio rates of ``pipe``'s model (ltx-pipelines' defaults are the real model's)."""
    from ltx_core.components.patchifiers import AudioPatchifier, VideoLatentPatchifier
    from ltx_core.tools import AudioLatentTools, VideoLatentTools
    from ltx_core.types import VIDEO_SCALE_FACTORS, AudioLatentShape, VideoLatentShape, VideoPixelShape

    pixels = VideoPixelShape(batch=1, frames=request.num_frames, height=height, width=width, fps=request.fps)
    channels = pipe.vae.config.latent_channels
    video_shape = VideoLatentShape.from_pixel_shape(pixels, channels, scale_factors=VIDEO_SCALE_FACTORS)
    audio_shape = AudioLatentShape.from_video_pixel_shape(
        pixels,
        channels=pipe.audio_vae.config.latent_channels,
        mel_bins=pipe.audio_vae.config.mel_bins // pipe.audio_vae_mel_compression_ratio,
        sample_rate=pipe.audio_sampling_rate,
        hop_length=pipe.audio_hop_length,
        audio_latent_downsample_factor=pipe.audio_vae_temporal_compression_ratio,
    )
    video = VideoLatentTools(VideoLatentPatchifier(patch_size=1), video_shape, request.fps, VIDEO_SCALE_FACTORS)
    return video, AudioLatentTools(AudioPatchifier(patch_size=1), audio_shape)


def _guiding_latents(images: list[Any], width: int, height: int, encoder: Any) -> list[Any]:
    """ltx-pipelines' ``image_conditionings_by_adding_guiding_latent`` (every image a ``VideoConditionByKeyframeIndex``,
    read from its file as ``KeyframeInterpolationPipeline`` reads it) at one stage's size."""
    from ltx_pipelines.utils.helpers import image_conditionings_by_adding_guiding_latent

    with torch.no_grad():
        return image_conditionings_by_adding_guiding_latent(images, height, width, encoder, torch.float32, "cpu")


def _conditioning_errors(call: dict[str, Any], row: slice, video: Any, audio: Any, sigma: float) -> dict[str, float]:
    """One delivery transformer call's inputs against ltx-core's noised states, token by token: the noisy latents,
    the positions (keyframe tokens at their frames) and the per-token σ (σ x the denoise mask)."""
    batch = call["hidden_states"][row].shape[0]
    timesteps = _per_token(call["timestep"], call["timestep"].shape[0], call["hidden_states"].shape[1])[row]
    return {
        "video input": relative_error(call["hidden_states"][row], video.latent),
        "audio input": relative_error(call["audio_hidden_states"][row], audio.latent),
        "positions": relative_error(call["video_coords"][row], video.positions.expand(batch, -1, -1, -1)),
        "denoise mask": float((timesteps - sigma * video.denoise_mask[..., 0]).abs().max()),
    }


def keyframe_errors(
    pipe: Any, model: torch.nn.Module, checkpoint: Path, smoke: Any, folder: Path, steps: int = 4
) -> dict[str, float]:
    """The delivery's ``keyframes`` pipeline on ``pipe`` against ``KeyframeInterpolationPipeline``'s stages run by
    Lightricks' code: a full-strength keyframe at frame 0 and a partial one at the last frame, written to ``folder``
    and read back by ltx-pipelines; its guiding latents, ``create_noised_state`` (``GaussianNoiser`` on the same
    generator stream), the guided Euler loop of stage 1 on ``model`` (ltx-core's transformer of ``checkpoint``), the
    upsampler, stage 2 with the distilled LoRA fused at 0.8. Returns the relative error of every hand-over and of
    each stage's first-call inputs (:func:`_conditioning_errors`); everything independent of the delivery but the
    text contexts."""
    from ltx_core.components.diffusion_steps import EulerDiffusionStep
    from ltx_core.components.noisers import GaussianNoiser
    from ltx_core.model.transformer import X0Model
    from ltx_core.model.upsampler import upsample_video
    from ltx_pipelines.utils.args import ImageConditioningInput
    from ltx_pipelines.utils.blocks import _build_state
    from ltx_pipelines.utils.denoisers import GuidedDenoiser, SimpleDenoiser
    from ltx_pipelines.utils.samplers import euler_denoising_loop
    from ltx_pipelines.utils.types import ModalitySpec
    from PIL import Image

    from sulphur2_npu.accuracy import tiny_request
    from sulphur2_npu.generate import generate
    from sulphur2_npu.keyframes import Keyframe
    from sulphur2_npu.options import KEYFRAMES
    from sulphur2_npu.stages import load_stage_parts
    from sulphur2_npu.tiny import TINY_TWO_STAGE_PRESET

    lora = (smoke.distilled_lora, 0.8)
    parts = load_stage_parts(pipe, KEYFRAMES, upsampler=smoke.upsampler, distilled_lora=lora)
    size = TINY_TWO_STAGE_PRESET
    last = size.num_frames - 1
    generator = torch.Generator().manual_seed(SEED)
    images = []
    for index, (frame, strength) in enumerate(((0, 1.0), (last, 0.6))):
        pixels = torch.randint(0, 256, (size.height + 16, size.width + 24, 3), generator=generator, dtype=torch.uint8)
        path = folder / f"keyframe-{index}.png"
        Image.fromarray(pixels.numpy()).save(path)
        images.append(ImageConditioningInput(str(path), frame, strength, crf=0))
    keyframes = tuple(Keyframe(Image.open(x.path).convert("RGB"), x.frame_idx, x.strength, 0) for x in images)
    request = dataclasses.replace(
        tiny_request(), width=size.width, height=size.height, steps=steps, pipeline=KEYFRAMES, keyframes=keyframes
    )
    capture = StageCapture(pipe)
    try:
        result = generate(pipe, request, device="cpu", generator=torch.Generator().manual_seed(SEED), parts=parts)
    finally:
        capture.close()
    first = capture.calls[0]
    encoder = video_encoder(checkpoint)
    noiser = GaussianNoiser(generator=torch.Generator().manual_seed(SEED))
    positive = (first["encoder_hidden_states"][1:2], first["audio_encoder_hidden_states"][1:2])
    video_tools, audio_tools = _ltx_tools(pipe, request, size.width // 2, size.height // 2)
    guides = _guiding_latents(images, size.width // 2, size.height // 2, encoder)
    video = _build_state(ModalitySpec(positive[0], guides), video_tools, noiser, torch.float32, torch.device("cpu"))
    audio = _build_state(ModalitySpec(positive[1]), audio_tools, noiser, torch.float32, torch.device("cpu"))
    inputs_1 = _conditioning_errors(first, slice(1, 2), video, audio, 1.0)
    errors = {f"stage 1 {name}": error for name, error in inputs_1.items()}
    negative = (first["encoder_hidden_states"][:1], first["audio_encoder_hidden_states"][:1])
    guiders = _guiders(request, model.num_blocks, negative, EULER)
    sigmas_1 = torch.tensor(result.stages["stage_1"]["sigmas"], dtype=torch.float32)
    with torch.no_grad():
        video, audio = euler_denoising_loop(
            sigmas_1, video, audio, EulerDiffusionStep(), X0Model(model), GuidedDenoiser(*positive, *guiders)
        )
    video = video_tools.unpatchify(video_tools.clear_conditioning(video))
    audio = audio_tools.unpatchify(audio_tools.clear_conditioning(audio))
    stage_1 = capture.seen["upsample"][1]
    errors["stage 1 video"] = relative_error(_tokens(pipe, stage_1)[0], video.latent.flatten(2).transpose(1, 2))
    with torch.no_grad():
        upsampler = latent_upsampler(smoke.upsampler)
        upsampled = upsample_video(latent=video.latent, video_encoder=encoder, upsampler=upsampler)
    sigmas_2 = result.stages["stage_2"]["sigmas"]
    second = capture.calls[1 - len(sigmas_2)]  # stage 2's first of its one call a step
    video_tools, audio_tools = _ltx_tools(pipe, request, size.width, size.height)
    guides = _guiding_latents(images, size.width, size.height, encoder)
    specs = (
        ModalitySpec(positive[0], guides, noise_scale=sigmas_2[0], initial_latent=upsampled),
        ModalitySpec(positive[1], noise_scale=sigmas_2[0], initial_latent=audio.latent),
    )
    video = _build_state(specs[0], video_tools, noiser, torch.float32, torch.device("cpu"))  # one noiser, one stream
    audio = _build_state(specs[1], audio_tools, noiser, torch.float32, torch.device("cpu"))
    inputs_2 = _conditioning_errors(second, slice(0, 1), video, audio, sigmas_2[0])
    errors |= {f"stage 2 {name}": error for name, error in inputs_2.items()}
    with torch.no_grad():
        video, audio = euler_denoising_loop(
            torch.tensor(sigmas_2, dtype=torch.float32),
            video,
            audio,
            EulerDiffusionStep(),
            X0Model(transformer(checkpoint, lora)),
            SimpleDenoiser(*positive),
        )
    final = _tokens(pipe, *capture.seen["decode"][1:])
    errors["stage 2 video"] = relative_error(final[0], video_tools.clear_conditioning(video).latent)
    errors["audio"] = relative_error(final[1], audio_tools.clear_conditioning(audio).latent)
    return errors


def retake_errors(pipe: Any, model: torch.nn.Module, checkpoint: Path, folder: Path, sound: bool = True) -> dict:
    """The delivery's ``retake`` pipeline on ``pipe`` against ``RetakePipeline``'s parts run by Lightricks' code, on
    a source mp4 written to ``folder`` (the smoke's picture, with the smoke's tone or, ``sound`` False, silent) and a
    span inside its second latent frame: ltx-pipelines reads and encodes the file (``video_latent_from_file``,
    ``decode_audio_from_file`` and ltx-core's ``encode_audio`` via :func:`encoded_audio`), builds both states with
    ``TemporalRegionMask`` and ``GaussianNoiser`` on the seed's stream (``_build_state``) and runs the distilled
    Euler loop on ``model``. Relative errors of the first call's inputs (latents, positions, per-token σ of both
    streams), of the final latents, and of the kept tokens against the source's (``kept``); and which mel front end
    encoded the reference's sound (``front end``)."""
    from ltx_core.components.diffusion_steps import EulerDiffusionStep
    from ltx_core.components.noisers import GaussianNoiser
    from ltx_core.conditioning.types.noise_mask_cond import TemporalRegionMask
    from ltx_core.model.transformer import X0Model
    from ltx_core.types import VideoPixelShape
    from ltx_pipelines.utils.blocks import _build_state
    from ltx_pipelines.utils.denoisers import SimpleDenoiser
    from ltx_pipelines.utils.helpers import video_latent_from_file
    from ltx_pipelines.utils.media_io import decode_audio_from_file
    from ltx_pipelines.utils.samplers import euler_denoising_loop
    from ltx_pipelines.utils.types import ModalitySpec

    from sulphur2_npu.accuracy import tiny_request
    from sulphur2_npu.audio_io import AudioClip
    from sulphur2_npu.generate import generate
    from sulphur2_npu.options import RETAKE
    from sulphur2_npu.retake import probe_video, read_retake
    from sulphur2_npu.tiny import TINY_PRESET, smoke_frames, smoke_sound
    from sulphur2_npu.video_io import write_mp4

    size, fps = TINY_PRESET, 24
    seconds = size.num_frames / fps
    path = folder / ("source.mp4" if sound else "silent.mp4")
    frames = smoke_frames(size.width, size.height, size.num_frames).float().numpy() / 255
    tone = smoke_sound(seconds + 0.2)
    write_mp4(path, frames, tone.waveform if sound else None, tone.sample_rate, fps)
    span = (0.1, 0.25)  # inside the second latent frame (pixel frames 1 to 8) and a few audio latent frames
    retake = read_retake(path, probe_video(path), *span)
    request = dataclasses.replace(
        tiny_request(), steps=DISTILLED_STEPS, guidance=1.0, schedule=DISTILLED, pipeline=RETAKE, retake=retake
    )
    capture = StageCapture(pipe, (), vaes=True)
    try:
        result = generate(pipe, request, device="cpu", generator=torch.Generator().manual_seed(SEED))
    finally:
        capture.close()
    call = capture.calls[0]
    pixels = VideoPixelShape(batch=1, frames=size.num_frames, height=size.height, width=size.width, fps=float(fps))
    with torch.no_grad():
        video_latent = video_latent_from_file(
            video_encoder(checkpoint), str(path), pixels, torch.device("cpu"), torch.float32
        )
    contexts = (call["encoder_hidden_states"], call["audio_encoder_hidden_states"])
    video_tools, audio_tools = _ltx_tools(pipe, request, size.width, size.height)
    mask = (TemporalRegionMask(start_time=span[0], end_time=span[1], fps=float(fps)),)
    audio_latent, audio_mask, front_end = None, (), "none (a silent source)"
    if sound:
        decoded = decode_audio_from_file(str(path), torch.device("cpu"), 0.0, seconds)
        clip = AudioClip(decoded.waveform[0].float(), decoded.sampling_rate, str(path))
        audio_latent, front_end = encoded_audio(checkpoint, clip, seconds)
        audio_mask = mask
    noiser = GaussianNoiser(generator=torch.Generator().manual_seed(SEED))
    cpu = torch.device("cpu")
    video = _build_state(
        ModalitySpec(contexts[0], list(mask), initial_latent=video_latent), video_tools, noiser, torch.float32, cpu
    )
    audio = _build_state(
        ModalitySpec(contexts[1], list(audio_mask), initial_latent=audio_latent),
        audio_tools,
        noiser,
        torch.float32,
        cpu,
    )
    errors = _conditioning_errors(call, slice(0, 1), video, audio, 1.0)
    audio_timesteps = _per_token(call["audio_timestep"], 1, call["audio_hidden_states"].shape[1])
    errors["audio denoise mask"] = float((audio_timesteps - audio.denoise_mask[..., 0]).abs().max())
    kept_video, kept_audio = video.denoise_mask[0, :, 0] == 0, audio.denoise_mask[0, :, 0] == 0
    with torch.no_grad():
        video, audio = euler_denoising_loop(
            torch.tensor(result.sigmas, dtype=torch.float32),
            video,
            audio,
            EulerDiffusionStep(),
            X0Model(model),
            SimpleDenoiser(*contexts),
        )
    final = _tokens(pipe, capture.seen["vae"][0], capture.seen["audio_vae"][0])
    errors["video"] = relative_error(final[0], video.latent)
    errors["audio"] = relative_error(final[1], audio.latent)
    source = _tokens(pipe, video_latent.float(), audio_latent) if sound else _tokens(pipe, video_latent.float())
    errors["kept video"] = relative_error(final[0][:, kept_video], source[0][:, kept_video])
    if sound:
        errors["kept audio"] = relative_error(final[1][:, kept_audio], source[1][:, kept_audio])
    return {**errors, "front end": front_end}
