"""The a2v pipeline (ltx-pipelines' ``A2VidPipelineTwoStage``) on the tiny model: its flags, its batch field, what its
transformer calls get and the sound track of the mp4. Equality with ltx-pipelines itself, stage by stage, is
``test_reference_ltx.py::test_audio_to_video_pipeline_matches_ltx_pipelines`` (needs ``LTX2_SRC``)."""

from __future__ import annotations

import dataclasses
import json

import av
import numpy as np
import pytest
import torch
from PIL import Image

from deliverykit.errors import DeliveryError, ExitCode
from deliverykit.testing import sine_wav
from sulphur2_npu import ltx_peer
from sulphur2_npu.options import A2V
from sulphur2_npu.schedules import ScheduleChoice
from sulphur2_npu.tiny import TINY_TWO_STAGE_PRESET

RATE, HZ = 22_050, 440.0
SECONDS = TINY_TWO_STAGE_PRESET.num_frames / 24


@pytest.fixture(scope="module")
def sound(tmp_path_factory):
    """A 440 Hz mono WAV, a little longer than the smoke's video."""
    return sine_wav(tmp_path_factory.mktemp("a2v") / "tone.wav", SECONDS + 0.1, rate=RATE, hz=HZ)


def test_audio_with_another_pipeline_is_refused_before_loading(run_cli, sound, tmp_path):
    code, _, err = run_cli("--smoke", "--device", "cpu", "--audio", sound, "--output", tmp_path / "out.mp4")
    assert code == ExitCode.USAGE and err.count("error:") == 1, err
    assert "--audio is for the a2v pipeline, not distilled" in err
    assert "Traceback" not in err and not list(tmp_path.iterdir())


def test_the_a2v_pipeline_needs_a_sound_track_beyond_the_smoke():
    from sulphur2_npu.request import build_request

    fields = {"fps": 24, "pipeline": A2V, "prompt": "a fox"}
    schedule = ScheduleChoice("dev", "test", pipeline=A2V, pipeline_why="test")
    with pytest.raises(DeliveryError, match="the a2v pipeline needs --audio FILE") as refused:
        build_request(fields, smoke=False, schedule=schedule)
    assert refused.value.exit_code == ExitCode.USAGE
    assert build_request(fields, smoke=True, schedule=schedule).pipeline == A2V  # the smoke brings its tone


def test_an_unreadable_sound_track_is_bad_input(run_cli, tmp_path):
    code, _, err = run_cli(
        "--smoke",
        "--device",
        "cpu",
        "--pipeline",
        A2V,
        "--audio",
        tmp_path / "gone.wav",
        "--output",
        tmp_path / "x.mp4",
    )
    assert code == ExitCode.INPUT and "--audio" in err and "gone.wav does not exist" in err
    assert not list(tmp_path.iterdir())


def test_the_sound_track_is_held_in_every_transformer_call(smoke_files, sound):
    """ltx-pipelines' frozen audio (``ModalitySpec(frozen=True, noise_scale=0)``): every call of both stages gets the
    encoded sound, un-noised, with audio timestep and σ 0 (also in the audio cross-attention's AdaLN, which takes the
    stream's own timesteps as ltx-core does), while the video's σ runs its schedules."""
    from sulphur2_npu.accuracy import tiny_request
    from sulphur2_npu.audio_io import read_audio
    from sulphur2_npu.audio_to_video import audio_to_video_pipeline, encode_audio
    from sulphur2_npu.generate import generate
    from sulphur2_npu.loader import load_pipeline
    from sulphur2_npu.stages import load_stage_parts

    pipe = load_pipeline(smoke_files.checkpoint, smoke_files.text_encoder, torch_dtype=torch.float32).pipe
    parts = load_stage_parts(pipe, A2V, upsampler=smoke_files.upsampler, distilled_lora=(smoke_files.distilled_lora, 1))
    size = TINY_TWO_STAGE_PRESET
    request = dataclasses.replace(
        tiny_request(), width=size.width, height=size.height, steps=2, schedule="dev", pipeline=A2V
    )
    request = dataclasses.replace(request, audio=read_audio(sound, request.num_frames / request.fps))
    latent = encode_audio(audio_to_video_pipeline(pipe), request.audio, request.num_frames / request.fps)
    audio_vae = pipe.audio_vae
    expected = pipe._normalize_audio_latents(
        pipe._pack_audio_latents(latent), audio_vae.latents_mean, audio_vae.latents_std
    )
    capture = ltx_peer.StageCapture(pipe, ("upsample", "decode_video"))
    recorded, cross = [], []  # what the transformer receives after every pre-hook; the audio cross-attention AdaLN's
    hooks = [
        pipe.transformer.register_forward_pre_hook(lambda m, a, k: recorded.append(k), with_kwargs=True),
        pipe.transformer.av_cross_attn_audio_scale_shift.register_forward_pre_hook(lambda m, a: cross.append(a[0])),
    ]
    try:
        result = generate(pipe, request, device="cpu", generator=torch.Generator().manual_seed(0), parts=parts)
    finally:
        capture.close()
        for hook in hooks:
            hook.remove()
    assert len(recorded) == len(capture.calls) == len(cross) > 4
    assert not any(timesteps.any() for timesteps in cross)  # its own timesteps (reference_fixes), the sound's: 0
    for call, seen in zip(capture.calls, recorded, strict=True):
        rows = call["audio_hidden_states"]
        assert all(torch.equal(row, expected[0]) for row in rows)  # every CFG row: the sound itself
        assert not seen["audio_timestep"].any() and not seen["audio_sigma"].any()
        assert seen["sigma"].reshape(-1)[0] > 0
    assert result.stages["decode"]["audio_from"] == "input"
    assert torch.equal(result.audio, request.audio.waveform) and result.sample_rate == RATE


def test_batch_lines_take_their_sound_tracks_relative_to_their_file_and_the_mp4_carries_it(run_cli, sound, tmp_path):
    """One line with a sound track, one with a first frame too (ltx-pipelines' A2V takes images: the image-to-video
    pipeline holding the sound; stage by stage, the peer test's ``sound+image`` case)."""
    Image.new("RGB", (128, 64), (30, 200, 60)).save(sound.parent / "first.png")
    batch = sound.parent / "a2v.jsonl"
    lines = [{"prompt": "a fox", "audio": sound.name}, {"prompt": "a fox", "audio": sound.name, "image": "first.png"}]
    batch.write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = ["--smoke", "--device", "cpu", "--pipeline", A2V, "--batch", batch, "--output", tmp_path / "out"]
    code, _, err = run_cli(*argv)
    assert code == ExitCode.OK, err
    with_image = json.loads((tmp_path / "out" / "00001" / "report.json").read_text())["inputs"]
    assert with_image["mode"] == "a2v" and with_image["image"].endswith("first.png")
    folder = tmp_path / "out" / "00000"
    report = json.loads((folder / "report.json").read_text())
    assert report["inputs"]["pipeline"] == A2V and report["inputs"]["mode"] == "a2v"
    audio = report["inputs"]["audio"]  # the report names no path of this machine: the folder is DIR
    assert audio["source"].endswith("/tone.wav") and audio["sample_rate"] == RATE
    assert audio["seconds"] == pytest.approx(SECONDS, abs=1 / RATE)  # whole samples
    with av.open(str(folder / "00000.mp4")) as container:
        stream = container.streams.audio[0]
        assert stream.rate == RATE and stream.channels == 2
        left = np.concatenate([frame.to_ndarray()[0] for frame in container.decode(stream)])
    spectrum = np.abs(np.fft.rfft(left * np.hanning(len(left))))
    assert abs(np.argmax(spectrum) * RATE / len(left) - HZ) < 2 * RATE / len(left)  # the file's tone, AAC-coded
