"""The loaded delivery against Lightricks' own code: ltx-core / ltx-pipelines at 400fd310 as a test-only peer.

Both sides load the same tiny LTX-2.3 single file (ltx-core key layout and metadata config; for the transformer tests
its transformer is one ltx-core built, initialised and saved under its own names) and get the same inputs; fp32 on
the CPU (``sulphur2_npu.ltx_peer``). Tolerances, relative to the reference's peak: 1e-4 for
one forward or decode, 1e-3 for the final latents of a loop (float32 summation order differs between the two
implementations: measured ~3e-7 per forward and ~1e-6 after the loops, which amplify it through CFG 3-7).

The peer is the pinned checkout, not PyPI (``ltx-core`` 1.0.0 there predates 400fd310). Run with
``LTX2_SRC=/path/to/LTX-2`` (Lightricks/LTX-2 checked out at 400fd31054597515f47125691032c04b1c3ee24e); without it
the module is skipped.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import save_file

from sulphur2_npu import ltx_peer, upsampler
from sulphur2_npu.accuracy import tiny_request
from sulphur2_npu.loader import load_pipeline
from sulphur2_npu.options import TWO_STAGE, TWO_STAGE_HQ
from sulphur2_npu.schedules import DISTILLED, DISTILLED_STEPS
from sulphur2_npu.tiny import TINY_CALL, TINY_HEIGHT, TINY_WIDTH, SmokeFiles

SOURCE = ltx_peer.peer_source()
if SOURCE is None:
    pytest.skip(
        f"ltx-core peer not configured: set {ltx_peer.ENV} to a Lightricks/LTX-2 checkout at 400fd310",
        allow_module_level=True,
    )
try:
    ltx_peer.import_peer(SOURCE)
except ImportError as err:
    pytest.skip(f"ltx_core not importable from {ltx_peer.ENV}={SOURCE}: {err}", allow_module_level=True)
pytest.importorskip("einops", reason="the ltx-core peer needs einops (ci/requirements-dev.txt)")

FORWARD_TOLERANCE = 1e-4
LOOP_TOLERANCE = 1e-3
DEV_STEPS = 4
# The fields ltx-core defaults when absent (decoder padding reflect, non-causal decoder); the shapes path must agree.
VAE_DEFAULTED_FIELDS = ("spatial_padding_mode", "causal_decoder")


@pytest.fixture(scope="module")
def ltx_files(smoke_files, tmp_path_factory):
    """The smoke file whose transformer ltx-core built, initialised and saved under its own key names."""
    path = tmp_path_factory.mktemp("ltx-core-written") / "ltx-core-transformer.safetensors"
    return SmokeFiles(ltx_peer.write_ltx_core_transformer(smoke_files.checkpoint, path), smoke_files.text_encoder)


@pytest.fixture(scope="module")
def ltx_transformer(ltx_files):
    return ltx_peer.transformer(ltx_files.checkpoint)


@pytest.fixture(scope="module")
def image():
    pixels = np.random.default_rng(0).integers(0, 255, (TINY_HEIGHT, TINY_WIDTH, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _loaded(smoke_files, image_to_video: bool = False):
    return load_pipeline(
        smoke_files.checkpoint, smoke_files.text_encoder, image_to_video=image_to_video, torch_dtype=torch.float32
    ).pipe


@pytest.mark.parametrize("image_to_video", [False, True], ids=["t2v", "i2v"])
def test_the_seed_gives_ltx_pipelines_initial_noise(ltx_files, image, image_to_video):
    """The same seed starts the same video as ltx-pipelines: its ``GaussianNoiser`` draws the video's noise, then the
    audio's, in token order from one generator, and so does the delivery (``reference_fixes``, 3.). Exactly equal:
    both are ``torch.randn`` of the same shape and dtype from the same generator state."""
    pipe = _loaded(ltx_files, image_to_video)
    errors = ltx_peer.initial_noise_errors(pipe, tiny_request(), image if image_to_video else None)
    assert errors == {"video noise": 0.0, "audio noise": 0.0}


@pytest.mark.parametrize("image_to_video", [False, True], ids=["t2v", "i2v"])
def test_one_transformer_forward_matches_ltx_core(ltx_files, ltx_transformer, image, image_to_video):
    pipe = _loaded(ltx_files, image_to_video)
    kwargs = ltx_peer.first_call(pipe, tiny_request(), image if image_to_video else None)
    if image_to_video:  # the conditioned first frame is what makes the I2V path differ
        assert bool((kwargs["timestep"] == 0).any()) and bool((kwargs["timestep"] > 0).any())
    with torch.no_grad():
        got = pipe.transformer(**{**kwargs, "return_dict": False})
        reference = ltx_transformer(*ltx_peer.modalities(kwargs), None)
    for stream, ours, theirs in zip(("video", "audio"), got, reference, strict=True):
        assert ltx_peer.relative_error(ours, theirs) < FORWARD_TOLERANCE, stream


@pytest.mark.parametrize(
    ("image_to_video", "schedule"),
    [(False, "dev"), (True, "dev"), (False, DISTILLED)],
    ids=["t2v-dev", "i2v-dev", "t2v-distilled"],
)
def test_final_latents_match_ltx_pipelines(ltx_files, ltx_transformer, image, image_to_video, schedule):
    """Dev: 4 steps with CFG + STG + modality isolation + rescale on both streams; distilled: 8 plain steps."""
    pipe = _loaded(ltx_files, image_to_video)
    steps, guidance = (DISTILLED_STEPS, 1.0) if schedule == DISTILLED else (DEV_STEPS, 3.0)
    request = dataclasses.replace(tiny_request(), steps=steps, guidance=guidance, schedule=schedule)
    conditioning = image if image_to_video else None
    first = ltx_peer.first_call(pipe, request, conditioning)
    assert bool((first["encoder_attention_mask"] == 1).all())  # ltx-pipelines passes no context mask
    video, audio, sigmas = ltx_peer.delivery_final_latents(pipe, request, conditioning)
    reference = ltx_peer.pipelines_loop(ltx_transformer, first, sigmas, request)
    for stream, ours, theirs in zip(("video", "audio"), (video, audio), reference, strict=True):
        assert ltx_peer.relative_error(ours, theirs) < LOOP_TOLERANCE, stream


class _ToyDenoiser:
    """A fixed smooth x0 map of each stream, as ltx-pipelines' ``Denoiser`` protocol calls it."""

    def __init__(self) -> None:
        generator = torch.Generator().manual_seed(0)
        self.weights = {16: torch.randn(16, 16, generator=generator) * 0.1, 8: torch.randn(8, 8, generator=generator)}

    def x0(self, latent: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        return torch.tanh(latent.float() @ self.weights[latent.shape[-1]]) * (1 - sigma.float()) + 0.1 * latent.float()

    def __call__(self, transformer, video_state, audio_state, sigmas, step_index):
        from ltx_pipelines.utils.types import DenoisedLatentResult

        sigma = sigmas[step_index]
        return tuple(DenoisedLatentResult(denoised=self.x0(s.latent, sigma)) for s in (video_state, audio_state))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16"])
def test_res2s_scheduler_matches_ltx_loop(dtype):
    """The delivery's res_2s scheduler driven as diffusers' LTX-2 loop drives it (x0 to velocity and back at each
    listed σ; video, then audio) against ``res2s_audio_video_denoising_loop`` with ``model_dtype`` ``dtype`` on the
    same x0 map and float32 initial noise (ltx-pipelines' states start in the model's dtype, diffusers' in float32).
    float32: within the loop tolerance. bf16: both round every state to bf16, so the final states agree but where
    float32 round-off (~1e-7) moves a value across a bf16 rounding boundary: one bf16 step there, on few elements
    (without the rounding 3e-3 of the peak on most)."""
    import numpy as np
    from ltx_core.components.diffusion_steps import Res2sDiffusionStep
    from ltx_core.types import LatentState
    from ltx_pipelines.utils.samplers import res2s_audio_video_denoising_loop

    from sulphur2_npu.res2s import res2s_scheduler
    from sulphur2_npu.schedules import HQ_SCHEDULER_CONFIG

    denoiser, generator = _ToyDenoiser(), torch.Generator().manual_seed(1)
    initial = (torch.randn(1, 30, 16, generator=generator), torch.randn(1, 7, 8, generator=generator))
    video = res2s_scheduler(HQ_SCHEDULER_CONFIG, dtype)
    audio = copy.deepcopy(video)
    for scheduler in (audio, video):
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / 6, 6), mu=1.3, device="cpu")
        scheduler.set_begin_index(0)
    ours = list(initial)
    for index, timestep in enumerate(video.timesteps):
        for stream, scheduler in enumerate((video, audio)):
            sigma = scheduler.sigmas[index]
            velocity = (ours[stream] - denoiser.x0(ours[stream].to(dtype), sigma)) / sigma
            ours[stream] = scheduler.step(velocity, timestep, ours[stream], return_dict=False)[0]

    def state(latent: torch.Tensor) -> LatentState:
        mask = torch.ones(1, latent.shape[1], 1)
        return LatentState(latent=latent.to(dtype), denoise_mask=mask, positions=None, clean_latent=latent.to(dtype))

    schedule = torch.tensor([*video.steps[:-2].tolist(), 0.0])  # what the pipeline's own scheduler gives ltx
    with torch.no_grad():
        theirs = res2s_audio_video_denoising_loop(
            schedule, *map(state, initial), Res2sDiffusionStep(), None, denoiser, model_dtype=dtype
        )
    for stream, (got, reference) in enumerate(zip(ours, (s.latent for s in theirs), strict=True)):
        if dtype == torch.float32:
            assert ltx_peer.relative_error(got, reference) < LOOP_TOLERANCE, stream
            continue
        reference = reference.float()
        step = torch.finfo(torch.bfloat16).eps * reference.abs()  # one bf16 step at each value (or less)
        assert bool(((got - reference).abs() <= step).all()), stream
        assert float((got != reference).float().mean()) <= 0.01, stream


def _with_vae_section(smoke, folder: Path, drop: tuple[str, ...]) -> Path:
    """The smoke file with its ``vae`` metadata lacking ``drop``: what ltx-core then builds is its default."""
    with safe_open(str(smoke.checkpoint), framework="pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - not a Mapping
        config = json.loads(handle.metadata()["config"])
    config["vae"] = {key: value for key, value in config["vae"].items() if key not in drop}
    path = folder / "vae-defaults.safetensors"
    save_file(tensors, str(path), metadata={"config": json.dumps(config)})
    return path


@pytest.mark.parametrize("files", ["smoke_files", "smoke_files_partial_metadata"], ids=["metadata", "no-vae-section"])
def test_video_decode_matches_ltx_core(files, request, smoke_files, tmp_path):
    smoke = request.getfixturevalue(files)
    if files == "smoke_files":
        reference_file = smoke.checkpoint
    else:
        reference_file = _with_vae_section(smoke_files, tmp_path, VAE_DEFAULTED_FIELDS)
    decoder = ltx_peer.video_decoder(reference_file)
    pipe = _loaded(smoke)
    vae = pipe.vae
    latent = torch.randn(1, vae.config.latent_channels, 2, 2, 3, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = decoder(latent)
        denormalized = pipe._denormalize_latents(latent, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
        got = vae.decode(denormalized, None, return_dict=False)[0]
    assert got.shape == reference.shape and ltx_peer.relative_error(got, reference) < FORWARD_TOLERANCE


def test_text_connectors_match_ltx_core(smoke_files, tmp_path):
    """Gemma's per-layer hidden states (left-padded, as both tokenise) → video and audio prompt embeddings."""
    import shutil

    gemma = shutil.copytree(smoke_files.text_encoder, tmp_path / "gemma")
    # ltx-core reads only the config here but insists on the processor sidecar a real Gemma-3 download has
    (gemma / "processor_config.json").write_text("{}")
    processor = ltx_peer.embeddings_processor(smoke_files.checkpoint, gemma)
    pipe = _loaded(smoke_files)
    prompts, length = ["a red fox runs through snow", "blur"], TINY_CALL["max_sequence_length"]
    tokens = pipe.tokenizer(prompts, padding="max_length", max_length=length, truncation=True, return_tensors="pt")
    assert pipe.tokenizer.padding_side == "left" and not tokens.attention_mask.all()  # padding is exercised
    with torch.no_grad():
        layers = pipe.text_encoder(**tokens, output_hidden_states=True).hidden_states
        reference = processor.process_hidden_states(layers, tokens.attention_mask, padding_side="left")
        packed = torch.stack(layers, dim=-1).flatten(2, 3)  # what diffusers' encode_prompt hands the connectors
        video, audio, mask = pipe.connectors(packed, tokens.attention_mask, padding_side="left")
    for got, want in ((video, reference.video_encoding), (audio, reference.audio_encoding)):
        assert got.shape == want.shape and ltx_peer.relative_error(got, want) < FORWARD_TOLERANCE
    assert torch.equal(mask.bool(), reference.attention_mask.bool())


def test_video_encode_matches_ltx_core(smoke_files):
    """The I2V conditioning path encodes the first frame: ltx-core's encoder returns normalised latent means."""
    encoder = ltx_peer.video_encoder(smoke_files.checkpoint)
    pipe = _loaded(smoke_files, image_to_video=True)
    vae = pipe.vae
    pixels = torch.rand(1, 3, 9, TINY_HEIGHT, TINY_WIDTH, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        reference = encoder(pixels)
        means = vae.encode(pixels).latent_dist.mode()
        got = pipe._normalize_latents(means, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    assert got.shape == reference.shape and ltx_peer.relative_error(got, reference) < FORWARD_TOLERANCE


def test_tiled_video_encode_matches_ltx_core(smoke_files):
    """Retake's source encoded as ltx-pipelines' ``video_latent_from_file`` encodes it: ltx-core's ``tiled_encode``
    with ``TileSizeConfig.default()``. 97 frames (13 latent frames: two temporal tiles, the second starting one
    frame early) by 832 px wide (26 latent columns: two spatial tiles) crosses both kinds of seam; one forward's
    tolerance (each tile is one forward; the blend is exact arithmetic on them)."""
    from ltx_core.tiling import TileSizeConfig

    from sulphur2_npu.tiled_encode import tiled_encode

    encoder = ltx_peer.video_encoder(smoke_files.checkpoint)
    pipe = _loaded(smoke_files)
    vae = pipe.vae
    pixels = torch.rand(1, 3, 97, 32, 832, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        reference = encoder.tiled_encode(pixels, TileSizeConfig.default())
        whole = encoder(pixels)
    got = pipe._normalize_latents(tiled_encode(vae, pixels), vae.latents_mean, vae.latents_std)
    assert got.shape == reference.shape == (1, 8, 13, 1, 26)
    assert ltx_peer.relative_error(got, reference) < FORWARD_TOLERANCE
    assert ltx_peer.relative_error(whole, reference) > 100 * FORWARD_TOLERANCE  # the seams are there to see


def test_audio_decode_and_vocoder_match_ltx_core(smoke_files):
    pipe = _loaded(smoke_files)
    audio_decoder = ltx_peer.audio_decoder(smoke_files.checkpoint)
    vocoder = ltx_peer.vocoder(smoke_files.checkpoint, pipe.vocoder.config.in_channels)
    audio_vae = pipe.audio_vae
    mel_bins = audio_vae.config.mel_bins // pipe.audio_vae_mel_compression_ratio
    latent = torch.randn(1, audio_vae.config.latent_channels, 6, mel_bins, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference_mel = audio_decoder(latent)
        packed = pipe._pack_audio_latents(latent)
        packed = pipe._denormalize_audio_latents(packed, audio_vae.latents_mean, audio_vae.latents_std)
        mel = audio_vae.decode(pipe._unpack_audio_latents(packed, 6, num_mel_bins=mel_bins), return_dict=False)[0]
        assert mel.shape == reference_mel.shape and ltx_peer.relative_error(mel, reference_mel) < FORWARD_TOLERANCE
        reference_wave = vocoder(reference_mel)
        wave = pipe.vocoder(reference_mel)
    assert wave.dtype == torch.float32  # ltx-core runs the vocoder in float32 whatever the pipeline dtype
    assert wave.shape == reference_wave.shape and ltx_peer.relative_error(wave, reference_wave) < FORWARD_TOLERANCE


def test_upsampler_matches_ltx_core(smoke_files):
    """The released layout loaded by both sides; ours is the pipeline's path (un-normalised latents in, diffusers
    normalises stage 2's input), ltx-core's is ``upsample_video`` between the video encoder's statistics."""
    pipe = _loaded(smoke_files)
    ours, _ = upsampler.load_upsampler(smoke_files.upsampler, latent_channels=8, torch_dtype=torch.float32)
    theirs = ltx_peer.latent_upsampler(smoke_files.upsampler)
    encoder = ltx_peer.video_encoder(smoke_files.checkpoint)
    normalised = torch.randn((1, 8, 2, 2, 3), generator=torch.Generator().manual_seed(0))
    vae = pipe.vae
    raw = pipe._denormalize_latents(normalised, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    got = pipe._normalize_latents(upsampler.upsample(ours, raw), vae.latents_mean, vae.latents_std)
    shape = tuple(normalised.shape)
    reference = ltx_peer.upsample_tokens(normalised.flatten(2).transpose(1, 2), shape, encoder, theirs)
    assert got.shape == (1, 8, 2, 4, 6)
    assert ltx_peer.relative_error(got.flatten(2).transpose(1, 2), reference) < FORWARD_TOLERANCE


@pytest.mark.parametrize(
    ("pipeline", "image_to_video"),
    [(DISTILLED, False), (TWO_STAGE, False), (DISTILLED, True), (TWO_STAGE_HQ, False), (TWO_STAGE_HQ, True)],
    ids=["distilled", "two-stage", "distilled-i2v", "two-stage-hq", "two-stage-hq-i2v"],
)  # fmt: skip
def test_two_stage_pipelines_match_ltx_pipelines(
    ltx_files, ltx_transformer, smoke_files, image, pipeline, image_to_video
):
    """Stage 1 (from the delivery's first-call inputs), the upsampler, stage 2's re-noising (the same generator
    stream: stage 1's two draws, then ltx-core's ``GaussianNoiser``) and stage 2's loop (with the distilled LoRA fused
    by ltx-core for ``two-stage``) all run by Lightricks' code, each compared with the delivery's ``generate``.
    ``two-stage-hq``: both loops ltx-pipelines' res_2s with its SDE noise, stage 1 guided by ``LTX_2_3_HQ_PARAMS``,
    each stage's σ from ltx-pipelines' own schedule (stage 1's from its token count)."""
    pipe = _loaded(ltx_files, image_to_video)
    given = {"image": image} if image_to_video else {}
    errors = ltx_peer.two_stage_errors(pipe, ltx_transformer, ltx_files.checkpoint, smoke_files, pipeline, **given)
    assert set(errors) == {"stage 1 video", "stage 2 input video", "stage 2 input audio", "stage 2 video", "audio"}
    for name, error in errors.items():
        assert error < LOOP_TOLERANCE, name


def test_keyframe_pipeline_matches_ltx_pipelines(ltx_files, ltx_transformer, smoke_files, tmp_path):
    """``KeyframeInterpolationPipeline`` run by Lightricks' code from the keyframe files alone (its own image reading,
    video encoder, guiding latents, ``create_noised_state`` on the seed's stream): each stage's first transformer
    inputs one to one (noisy tokens, keyframe positions, per-token σ), within float32 rounding of a few encoder
    convolutions; the stages' results within the loop tolerance."""
    pipe = _loaded(ltx_files)
    errors = ltx_peer.keyframe_errors(pipe, ltx_transformer, ltx_files.checkpoint, smoke_files, tmp_path)
    inputs = [
        f"stage {n} {what}" for n in (1, 2) for what in ("video input", "audio input", "positions", "denoise mask")
    ]
    assert set(errors) == {*inputs, "stage 1 video", "stage 2 video", "audio"}
    for name in inputs:
        assert errors[name] < FORWARD_TOLERANCE, (name, errors[name])
    for name in ("stage 1 video", "stage 2 video", "audio"):
        assert errors[name] < LOOP_TOLERANCE, (name, errors[name])


@pytest.mark.parametrize("image_to_video", [False, True], ids=["sound", "sound+image"])
def test_audio_to_video_pipeline_matches_ltx_pipelines(ltx_files, ltx_transformer, smoke_files, image, image_to_video):
    """``A2VidPipelineTwoStage`` run by Lightricks' code on the smoke's sound track (and a first frame): its audio
    encoding (ltx-core's encoder; its own torchaudio mel front end where torchaudio imports), stage 1 with that audio
    frozen, the upsampler, stage 2's re-noising and loop with the audio frozen again (the first frame held in both
    stages); the delivery's tokens at each hand-over."""
    pipe = _loaded(ltx_files, image_to_video)
    errors = ltx_peer.a2v_errors(
        pipe, ltx_transformer, ltx_files.checkpoint, smoke_files, image=image if image_to_video else None
    )
    front_end = errors.pop("front end")
    assert errors["audio latent"] < FORWARD_TOLERANCE, (front_end, errors["audio latent"])
    handovers = {"audio latent", "stage 1 video", "stage 1 audio held", "stage 2 input video", "stage 2 video"}
    assert set(errors) == handovers
    for name, error in errors.items():
        assert error < LOOP_TOLERANCE, (name, error, front_end)


@pytest.mark.parametrize("sound", [True, False], ids=["with-sound", "silent"])
def test_retake_pipeline_matches_ltx_pipelines(ltx_files, ltx_transformer, tmp_path, sound):
    """``RetakePipeline`` run by Lightricks' code on an mp4 written here (its own video and sound reading, encoders,
    ``TemporalRegionMask`` on both streams, ``GaussianNoiser`` on the seed's stream, the distilled loop): the first
    transformer inputs token by token (noisy latents, positions, each stream's per-token σ), the final latents within
    the loop tolerance, and what lies outside the span kept as the source's latent; a silent source's sound is made
    whole in both."""
    pipe = _loaded(ltx_files)
    errors = ltx_peer.retake_errors(pipe, ltx_transformer, ltx_files.checkpoint, tmp_path, sound=sound)
    front_end = errors.pop("front end")
    inputs = {"video input", "audio input", "positions", "denoise mask", "audio denoise mask"}
    kept = {"kept video", "kept audio"} if sound else {"kept video"}
    assert set(errors) == inputs | kept | {"video", "audio"}
    for name in inputs | kept:
        assert errors[name] < FORWARD_TOLERANCE, (name, errors[name], front_end)
    for name in ("video", "audio"):
        assert errors[name] < LOOP_TOLERANCE, (name, errors[name], front_end)


@pytest.mark.parametrize("container", ["wav", "m4a", "mp4"])
def test_sound_files_read_as_ltx_pipelines_reads_them(tmp_path, container):
    """``audio_io.read_audio`` against ltx-pipelines' ``decode_audio_from_file`` (start 0, the video's duration) on a
    PCM WAV, an AAC track, whose first frame PyAV may place before 0 (the codec's priming samples), and the AAC track
    of a video in several frames (ltx-pipelines seeks to the start first, which changes what the AAC decoder gives:
    this case fails without the same seek in ``read_audio``)."""
    import av
    from ltx_pipelines.utils.media_io import decode_audio_from_file

    from sulphur2_npu.audio_io import read_audio

    rate, seconds = 22_050, 0.4
    path = tmp_path / f"tone.{container}"
    time = np.arange(round(rate * 0.6)) / rate
    stereo = np.stack([np.sin(2 * np.pi * 330 * time), 0.5 * np.sin(2 * np.pi * 550 * time)]).astype(np.float32)
    if container == "mp4":  # as the delivery writes its videos: H.264 + AAC muxed by diffusers' encode_video
        from sulphur2_npu.video_io import write_mp4

        write_mp4(path, np.zeros((9, 64, 96, 3), dtype=np.float32), torch.from_numpy(stereo), rate, fps=24)
    else:
        with av.open(str(path), "w") as output:
            stream = output.add_stream("pcm_s16le" if container == "wav" else "aac", rate=rate, layout="stereo")
            planar = "s16p" if container == "wav" else "fltp"
            samples = (stereo * 32767).astype(np.int16) if container == "wav" else stereo
            frame = av.AudioFrame.from_ndarray(samples, format=planar, layout="stereo")
            frame.sample_rate = rate
            for packet in (*stream.encode(frame), *stream.encode(None)):
                output.mux(packet)
    reference = decode_audio_from_file(str(path), torch.device("cpu"), 0.0, seconds)
    clip = read_audio(path, seconds)
    assert clip.sample_rate == reference.sampling_rate == rate
    torch.testing.assert_close(clip.waveform, reference.waveform[0].float(), rtol=0, atol=0)  # the same samples
