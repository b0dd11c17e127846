"""The retake pipeline (ltx-pipelines' ``RetakePipeline``) on the tiny model: its flags and checks, which tokens it
keeps, what it writes and its batch fields. Equality with ltx-pipelines itself (its own reading of the file, encoders,
``TemporalRegionMask`` and loop) is ``test_reference_ltx.py::test_retake_pipeline_matches_ltx_pipelines`` (needs
``LTX2_SRC``)."""

from __future__ import annotations

import dataclasses
import json

import av
import pytest
import torch
from PIL import Image

from deliverykit.errors import DeliveryError, ExitCode
from sulphur2_npu import ltx_peer
from sulphur2_npu.options import RETAKE
from sulphur2_npu.schedules import DISTILLED, DISTILLED_STEPS, ScheduleChoice
from sulphur2_npu.tiny import TINY_PRESET, smoke_frames, smoke_sound

FPS = 24
SECONDS = TINY_PRESET.num_frames / FPS
SPAN = (0.1, 0.25)  # inside the second latent frame (pixel frames 1 to 8)
VIDEO_SCALE, AUDIO_SCALE = 8, 4  # LTX-2.3's VAE time compression: pixel frames, mel frames per latent frame


def _write_source(path, frames: int = TINY_PRESET.num_frames, width: int = TINY_PRESET.width, sound: bool = True):
    from sulphur2_npu.video_io import write_mp4

    pixels = smoke_frames(width, TINY_PRESET.height, frames).float().numpy() / 255
    tone = smoke_sound(frames / FPS + 0.2)
    write_mp4(path, pixels, tone.waveform if sound else None, tone.sample_rate, FPS)
    return path


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The smoke's picture and tone as an mp4 (H.264 + AAC), the size and length of the tiny one-stage run."""
    return _write_source(tmp_path_factory.mktemp("retake") / "source.mp4")


def test_held_tokens_follow_temporal_region_mask(smoke_files):
    """Which tokens are kept, against ltx-core's ``TemporalRegionMask`` written out from its definition: a token is
    remade when its time span meets ``[start, end)``; a video latent frame i > 0 spans pixel frames 8i - 7 to 8i + 1
    (frame 0 alone the first), an audio one mel frames 4i - 3 to 4i + 1 (clipped at 0), at the mel hop's rate."""
    from sulphur2_npu.loader import load_pipeline
    from sulphur2_npu.retake import RetakePipeline, retake_pipeline

    pipe = load_pipeline(smoke_files.checkpoint, smoke_files.text_encoder, torch_dtype=torch.float32).pipe
    frames = smoke_frames(TINY_PRESET.width, TINY_PRESET.height, 17)  # three latent frames
    retake = dataclasses.replace(_retake(frames, sound=True), start=0.3, end=0.5)
    remake, source = retake_pipeline(pipe, retake)
    assert isinstance(remake, RetakePipeline) and remake.transformer is pipe.transformer  # shared, not copied
    shape = source["latents"].shape
    held = remake._held_video_tokens(shape, FPS, "cpu")[0, :, 0].reshape(shape[2], -1)
    for index in range(shape[2]):
        start, end = (0, 1) if index == 0 else (VIDEO_SCALE * index - 7, VIDEO_SCALE * index + 1)
        remade = end / FPS > retake.start and start / FPS < retake.end
        assert held[index].tolist() == [0.0 if remade else 1.0] * held.shape[1], index
    remake.prepare_audio_latents(latents=source["audio_latents"], noise_scale=1.0, generator=torch.Generator())
    mel_seconds = pipe.audio_vae.config.mel_hop_length / pipe.audio_vae.config.sample_rate
    expected = [
        float((4 * i + 1) * mel_seconds > retake.start and max(0, 4 * i - 3) * mel_seconds < retake.end)
        for i in range(source["audio_latents"].shape[2])
    ]
    assert remake._sound_mask[0, :, 0].tolist() == expected and 0 < sum(expected) < len(expected)


def _retake(frames: torch.Tensor, *, sound: bool):
    from sulphur2_npu.retake import Retake

    return Retake(frames, float(FPS), smoke_sound(frames.shape[0] / FPS) if sound else None, *SPAN, "test")


@pytest.mark.parametrize("sound", [True, False], ids=["with-sound", "silent"])
def test_what_lies_outside_the_span_is_kept(smoke_files, source, tmp_path, sound):
    """What the decoders get equals, outside the span, the first transformer call's tokens taken through the
    pipeline's own tail (unpacked and denormalised, the same elementwise steps on the same values): kept tokens are
    copied, their update exactly 0. Inside the span they moved; a silent source's sound is made whole."""
    from sulphur2_npu.accuracy import tiny_request
    from sulphur2_npu.generate import generate
    from sulphur2_npu.loader import load_pipeline
    from sulphur2_npu.retake import probe_video, read_retake

    path = source if sound else _write_source(tmp_path / "silent.mp4", sound=False)
    pipe = load_pipeline(smoke_files.checkpoint, smoke_files.text_encoder, torch_dtype=torch.float32).pipe
    retake = read_retake(path, probe_video(path), *SPAN)
    assert (retake.sound is not None) == sound and retake.frames.shape == (9, 64, 96, 3)
    request = dataclasses.replace(
        tiny_request(), steps=DISTILLED_STEPS, guidance=1.0, schedule=DISTILLED, pipeline=RETAKE, retake=retake
    )
    capture = ltx_peer.StageCapture(pipe, (), vaes=True)
    try:
        result = generate(pipe, request, device="cpu", generator=torch.Generator().manual_seed(0))
    finally:
        capture.close()
    first, (video,), (audio,) = capture.calls[0], capture.seen["vae"][:1], capture.seen["audio_vae"][:1]
    vae, audio_vae = pipe.vae, pipe.audio_vae
    start = pipe._unpack_latents(first["hidden_states"], *video.shape[2:], 1, 1)
    start = pipe._denormalize_latents(start, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)
    start_audio = pipe._denormalize_audio_latents(
        first["audio_hidden_states"], audio_vae.latents_mean, audio_vae.latents_std
    )
    start_audio = pipe._unpack_audio_latents(start_audio, audio.shape[2], num_mel_bins=audio.shape[3])
    kept = (first["timestep"][0] == 0).reshape(video.shape[2:])  # per latent position, as the latents are laid out
    assert 0 < int(kept.sum()) < kept.numel()
    assert torch.equal(video[..., kept], start[..., kept]) and not torch.allclose(video[..., ~kept], start[..., ~kept])
    remade = first["audio_timestep"][0] > 0
    assert bool(remade.all()) != sound  # silent: all of it made; else the span's tokens only
    assert torch.equal(audio[:, :, ~remade], start_audio[:, :, ~remade])
    assert not torch.allclose(audio[:, :, remade], start_audio[:, :, remade])
    assert result.video.shape == (9, 64, 96, 3) and result.stages is None


def test_the_cli_retakes_a_file_and_a_batch_line_relative_to_its_file(run_cli, source, tmp_path):
    """``--video`` with the span, and the same as a ``--batch`` line (paths relative to the batch file): the mp4 has
    the source's size, length and rate, and ``report.json`` names the span."""
    batch = source.parent / "retake.jsonl"
    batch.write_text(json.dumps({"video": source.name, "retake_start": 0.1, "retake_end": 0.3}) + "\n")
    argv = ["--smoke", "--device", "cpu", "--pipeline", RETAKE]
    code, _, err = run_cli(*argv, "--video", source, "--retake-start", "0.1", "--retake-end", "0.3", "--output",
                           tmp_path / "one.mp4")  # fmt: skip
    assert code == ExitCode.OK, err
    code, _, err = run_cli(*argv, "--batch", batch, "--output", tmp_path / "many")
    assert code == ExitCode.OK, err
    for folder, name in ((tmp_path, "one"), (tmp_path / "many" / "00000", "00000")):
        inputs = json.loads((folder / "report.json").read_text())["inputs"]
        assert inputs["mode"] == RETAKE and inputs["schedule"] == DISTILLED
        assert inputs["retake"]["source"].endswith("source.mp4") and inputs["retake"]["start"] == 0.1
        assert inputs["retake"]["sound"] == "kept outside the span"
        with av.open(str(folder / f"{name}.mp4")) as container:
            stream = container.streams.video[0]
            frames = sum(1 for _ in container.decode(stream))
            assert (stream.width, stream.height, frames, stream.average_rate) == (96, 64, 9, FPS)


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("--video", "{source}"), ExitCode.USAGE, "--video is for the retake pipeline, not distilled"),
        (
            ("--pipeline", RETAKE, "--video", "{source}", "--retake-start", "0.3", "--retake-end", "0.1"),
            ExitCode.USAGE,
            "need 0 <= start < end",
        ),
        (
            ("--pipeline", RETAKE, "--video", "{source}", "--retake-start", "1", "--retake-end", "2"),
            ExitCode.USAGE,
            "the video lasts 0.375 s",
        ),
        (
            ("--pipeline", RETAKE, "--video", "{source}", "--width", "128", "--retake-start", "0", "--retake-end", "1"),
            ExitCode.USAGE,
            "a retake keeps the size and length of its --video",
        ),
        (
            ("--pipeline", RETAKE, "--video", "{ten}", "--retake-start", "0", "--retake-end", "1"),
            ExitCode.INPUT,
            "needs sides that are multiples of 32 and 8k+1 frames; cut it to 9 frames",
        ),
        (
            ("--pipeline", RETAKE, "--video", "{gone}", "--retake-start", "0", "--retake-end", "1"),
            ExitCode.INPUT,
            "gone.mp4 does not exist",
        ),
        (("--pipeline", RETAKE, "--image", "{image}"), ExitCode.USAGE, "takes its pictures from --video; drop --image"),
    ],
    ids=["another-pipeline", "span-reversed", "span-after-the-end", "size-flag", "ten-frames", "missing", "image"],
)
def test_bad_retake_requests_fail_before_loading(run_cli, source, tmp_path, args, code, message):
    files = {"source": source, "ten": _write_source(tmp_path / "ten.mp4", frames=10), "gone": tmp_path / "gone.mp4"}
    files["image"] = tmp_path / "first.png"
    Image.new("RGB", (96, 64)).save(files["image"])
    output = tmp_path / "out"
    got, _, err = run_cli(
        "--smoke", "--device", "cpu", *(a.format(**files) for a in args), "--output", output / "x.mp4"
    )
    assert got == code and err.count("error:") == 1 and message in err, err
    assert "Traceback" not in err and not output.exists()


def test_a_sound_too_short_to_encode_is_bad_input(run_cli, tmp_path):
    """A track shorter than the audio encoder's STFT window (ltx-pipelines fails inside torch there) is exit 3 with
    the fix, and nothing is written."""
    from sulphur2_npu.video_io import write_mp4

    source = tmp_path / "blip.mp4"
    pixels = smoke_frames(TINY_PRESET.width, TINY_PRESET.height, 9).numpy() / 255.0
    write_mp4(source, pixels, torch.zeros(2, 240), 48_000, FPS)  # one AAC frame: 1024 samples, 21 ms
    output = tmp_path / "out"
    code, _, err = run_cli("--smoke", "--device", "cpu", "--pipeline", RETAKE, "--video", source,
                           "--output", output / "x.mp4")  # fmt: skip
    assert code == ExitCode.INPUT and err.count("error:") == 1 and "too short for the audio encoder's STFT" in err
    assert "ffmpeg -i IN -an" in err and not output.exists()


def test_the_retake_pipeline_needs_a_source_beyond_the_smoke():
    from sulphur2_npu.request import build_request

    fields = {"fps": 24, "pipeline": RETAKE, "prompt": "a fox", "retake_start": 0.1, "retake_end": 0.2}
    schedule = ScheduleChoice(DISTILLED, "test", pipeline=RETAKE, pipeline_why="test")
    with pytest.raises(DeliveryError, match="the retake pipeline needs --video FILE") as refused:
        build_request(fields, smoke=False, schedule=schedule)
    assert refused.value.exit_code == ExitCode.USAGE
    smoke = build_request(
        {"fps": 24, "pipeline": RETAKE}, smoke=True, schedule=schedule
    )  # made-up source, middle third
    assert (smoke.width, smoke.height, smoke.num_frames) == (TINY_PRESET.width, TINY_PRESET.height, 9)
