"""inference.py end to end on the smoke model: mp4 with audio (probed with PyAV), PNG frames, report, bad input.

The smoke run loads the tiny model (seed 0) through the real loader; its frames must equal those of the tiny pipeline
built directly from the same modules, called with the hand-written ``TINY_CALL`` (the independent reference).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import types

import av
import jsonschema
import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from deliverykit.errors import ExitCode
from deliverykit.report import SCHEMA_PATH
from deliverykit.testing import assert_images_equal_up_to_rounding, header_only_png
from sulphur2_npu import video_io
from sulphur2_npu.tiny import TINY_CALL, TINY_HEIGHT, TINY_NUM_FRAMES, TINY_WIDTH, tiny_pipeline
from sulphur2_npu.video_io import to_uint8

SMOKE = ("--smoke", "--device", "cpu", "--pipeline", "one-stage")  # the pipelines: test_stages.py


def _seed():
    return torch.Generator().manual_seed(42)  # the CLI's default --seed, on a CPU generator


def _input_image() -> Image.Image:
    pixels = np.random.default_rng(1).integers(0, 255, (TINY_HEIGHT, TINY_WIDTH, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def _cli_run(run_cli, folder, *extra, model=SMOKE):
    output = folder / "out.mp4"
    code, out, err = run_cli(*model, "--output", output, *extra)
    assert code == 0, err
    return types.SimpleNamespace(output=output, out=out, err=err, folder=folder)


@pytest.fixture(scope="module")
def t2v(run_cli, tmp_path_factory):
    return _cli_run(run_cli, tmp_path_factory.mktemp("t2v"))


@pytest.fixture(scope="module")
def i2v(run_cli, tmp_path_factory):
    folder = tmp_path_factory.mktemp("i2v")
    _input_image().save(folder / "first.png")
    return _cli_run(run_cli, folder, "--image", folder / "first.png")


def _probe(path) -> dict:
    with av.open(str(path)) as container:
        video = [s for s in container.streams if s.type == "video"]
        audio = [s for s in container.streams if s.type == "audio"]
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        return {
            "video_streams": len(video),
            "audio_streams": len(audio),
            "frames": np.stack(frames),
            "fps": float(video[0].average_rate),
            "sample_rate": audio[0].sample_rate if audio else None,
            "channels": audio[0].codec_context.channels if audio else None,
        }


def _expect_video_with_audio(run, reference_frames: np.ndarray, sample_rate: int):
    info = _probe(run.output)
    assert info["video_streams"] == 1 and info["audio_streams"] == 1
    assert info["frames"].shape == (TINY_NUM_FRAMES, TINY_HEIGHT, TINY_WIDTH, 3) and info["fps"] == 24.0
    assert info["sample_rate"] == sample_rate and info["channels"] == 2
    first, last = (np.asarray(Image.open(run.folder / f"out_{name}.png")) for name in ("first", "last"))
    # The CLI's process and this one may run other kernels (float32 reordering): a pixel may round to the next level.
    assert_images_equal_up_to_rounding(first, to_uint8(reference_frames[0]), "first frame")
    assert_images_equal_up_to_rounding(last, to_uint8(reference_frames[-1]), "last frame")
    files = sorted(p.name for p in run.folder.iterdir() if p.name != "first.png")
    assert files == ["out.mp4", "out_first.png", "out_last.png", "report.json"]  # no temporary files left


def test_text_to_video_smoke_writes_mp4_with_audio_and_the_reference_frames(t2v, tiny_components):
    reference = tiny_pipeline(components=tiny_components)(**TINY_CALL, generator=_seed())
    _expect_video_with_audio(t2v, reference.frames[0], tiny_components["vocoder"].config.output_sampling_rate)


def test_image_to_video_smoke_writes_mp4_with_audio_and_the_reference_frames(i2v, tiny_components):
    pipe = tiny_pipeline(components=tiny_components, image_to_video=True)
    reference = pipe(image=_input_image(), **TINY_CALL, generator=_seed())
    _expect_video_with_audio(i2v, reference.frames[0], tiny_components["vocoder"].config.output_sampling_rate)
    assert "MODE=i2v" in i2v.out.splitlines()


def test_group_offload_encodes_the_prompt_first_and_gives_the_same_frames(run_cli, tmp_path, tiny_components):
    run = _cli_run(run_cli, tmp_path, "--memory", "group-offload")
    reference = tiny_pipeline(components=tiny_components)(**TINY_CALL, generator=_seed())
    _expect_video_with_audio(run, reference.frames[0], tiny_components["vocoder"].config.output_sampling_rate)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["memory_plan"]["free_text_encoder"] is True and report["timing"]["encode_prompt_ms"] > 0


def test_report_records_timings_plan_and_checkpoint(t2v):
    report = json.loads((t2v.folder / "report.json").read_text())
    jsonschema.validate(report, json.loads(SCHEMA_PATH.read_text()))
    assert report["kind"] == "inference" and report["random_weights"] is True
    assert report["model"]["family"] == "LTX-2.3" and report["model"]["config_source"] == "metadata"
    assert report["memory_plan"]["name"] == "none" and report["memory_plan"]["expected_peak_gb"] is None
    assert report["timing"]["encode_prompt_ms"] is None  # the pipeline encodes the prompt itself
    inputs = report["inputs"]
    assert (inputs["width"], inputs["height"], inputs["num_frames"], inputs["steps"]) == (96, 64, 9, 2)
    timing = report["timing"]
    assert timing["load_s"] > 0 and len(timing["runs"]) == 1 and len(timing["runs"][0]["step_ms"]) == 2
    run = timing["runs"][0]
    for name, key in (("first_step", "first_step_ms"), ("per_step", "per_step_ms"), ("vae_decode", "decode_ms")):
        assert timing[name]["median_ms"] == run[key] > 0
    assert run["total_ms"] >= run["first_step_ms"] + run["per_step_ms"] + run["decode_ms"]
    results = report["results"]
    assert results["frames"] == 9 and results["audio_sample_rate"] == 48000 and results["peak_device_memory_mb"] is None
    evidence = report["evidence"]
    assert evidence["PEAK_MEMORY_MB"] == "n/a" and evidence["MEMORY_PLAN"] == "none"
    assert evidence["RANDOM_WEIGHTS"] == "true" and evidence["OUTPUT_SHAPE"] == "[9, 64, 96, 3]"
    lines = dict(line.split("=", 1) for line in t2v.out.splitlines() if "=" in line and line.isascii())
    assert lines["CHECKPOINT_FAMILY"] == "LTX-2.3" and lines["EXIT_CODE"] == "0" and "FIRST_STEP_MS" in lines
    assert "memory plan: none" in t2v.out
    assert lines["SCHEDULE"] == evidence["SCHEDULE"] == inputs["schedule"] == "dev" and len(results["sigmas"]) == 3
    assert "schedule: dev (auto: the file name sulphur2-tiny.safetensors has no 'distil')" in t2v.out


@pytest.mark.heavy
def test_a_distil_file_name_runs_the_distilled_schedule(run_cli, tmp_path, smoke_files, ltx_core_distilled_sigmas):
    model = tmp_path / "sulphur_distil_tiny.safetensors"
    model.symlink_to(smoke_files.checkpoint)
    weights = (
        "--model",
        model,
        "--text-encoder",
        smoke_files.text_encoder,
        "--device",
        "cpu",
        "--pipeline",
        "one-stage",
    )
    small = ("--width", "96", "--height", "64", "--num-frames", "9")  # the schedule does not depend on the size
    run = _cli_run(run_cli, tmp_path, "--prompt", "a fox", *small, model=weights)
    report = json.loads((tmp_path / "report.json").read_text())
    inputs, evidence = report["inputs"], report["evidence"]
    assert inputs["schedule"] == evidence["SCHEDULE"] == "distilled" and (inputs["steps"], inputs["guidance"]) == (8, 1)
    assert report["results"]["sigmas"] == [float(np.float32(s)) for s in ltx_core_distilled_sigmas]
    assert len(report["timing"]["runs"][0]["step_ms"]) == 8 and "SCHEDULE=distilled" in run.out.splitlines()
    assert "schedule: distilled (auto: the file name sulphur_distil_tiny.safetensors contains 'distil')" in run.out
    # not a file of the pinned release: loaded after one warning line, and recorded as such with its sha256
    warnings = [line for line in run.err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "sulphur_distil_tiny.safetensors (not a file of the release)" in warnings[0]
    [weights] = report["weights"]
    # the report names no path of this machine (portable_paths: tmp_path is outside the checkout, so DIR/<name>)
    assert (weights["path"], weights["status"]) == (f"DIR/{model.name}", "differs")
    assert weights["sha256"] == hashlib.sha256(smoke_files.checkpoint.read_bytes()).hexdigest()


def test_strict_manifest_refuses_a_checkpoint_that_is_not_the_release(fail, smoke_files):
    model = ("--model", smoke_files.checkpoint, "--text-encoder", smoke_files.text_encoder, "--prompt", "x")
    fail(*model, "--device", "cpu", "--strict-manifest", code=ExitCode.WEIGHTS, match="differ from the pinned release")


# ----------------------------------------------------------------------------------------------------- bad input


def _write(path, tensors):
    save_file(tensors, str(path))
    return path


@pytest.fixture
def fail(run_cli, tmp_path):
    """Run the CLI expecting failure: exit code, one ``error:`` line with ``match``, nothing in the output folder."""

    def run(*argv, code: ExitCode, match: str):
        folder = tmp_path / "out"
        got, _, err = run_cli(*argv, "--output", folder / "out.mp4")
        assert got == code, err
        if code != ExitCode.FAILURE:
            errors = [line for line in err.splitlines() if line.startswith("error:")]
            assert len(errors) == 1 and match in errors[0], err
            assert "Traceback" not in err
        assert not folder.exists(), "a failed run left its output folder (or files in it) behind"
        return err

    return run


def _flux_file(folder, smoke_files):
    flux = {"double_blocks.0.img_attn.qkv.weight": torch.zeros(2), "single_blocks.0.linear1.weight": torch.zeros(2)}
    return _write(folder / "flux.safetensors", flux)


def _fp8_file(folder, smoke_files):
    fp8 = {
        "model.diffusion_model.audio_adaln_single.linear.weight": torch.zeros(4, 4, dtype=torch.float8_e4m3fn),
        "model.diffusion_model.audio_adaln_single.linear.weight_scale": torch.ones(1),
    }
    return _write(folder / "fp8.safetensors", fp8)


def _truncated_file(folder, smoke_files):
    corrupt = folder / "corrupt.safetensors"
    corrupt.write_bytes(smoke_files.checkpoint.read_bytes()[:4096])  # a truncated download
    return corrupt


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (_flux_file, "looks like Flux"),
        (_fp8_file, "fp8-mixed checkpoint"),
        (_truncated_file, "not a readable safetensors file"),
    ],
    ids=["not-ltx", "fp8", "corrupt"],
)
def test_bad_checkpoint(fail, tmp_path, smoke_files, make, match):
    model = make(tmp_path, smoke_files)
    fail(
        "--model",
        model,
        "--text-encoder",
        smoke_files.text_encoder,
        "--prompt",
        "x",
        code=ExitCode.WEIGHTS,
        match=match,
    )


def test_missing_text_encoder_folder(fail, tmp_path, smoke_files):
    fail(
        "--model",
        smoke_files.checkpoint,
        "--text-encoder",
        tmp_path / "gemma",
        "--prompt",
        "x",
        code=ExitCode.INPUT,
        match="text encoder folder",
    )


def test_invalid_sizes_name_the_nearest_valid_values(fail):
    fail(
        *SMOKE,
        "--width",
        100,
        "--num-frames",
        10,
        code=ExitCode.USAGE,
        match="--width 100 is not a positive multiple of 32 (nearest valid: 96 or 128); --num-frames 10 is not 8k+1 "
        "(nearest valid: 9 or 17)",
    )


DISTILLED_BY_NAME = (
    "--model",
    "missing/sulphur_distil_bf16.safetensors",
    "--text-encoder",
    "gemma",
    "--prompt",
    "x",
    "--pipeline",
    "one-stage",
)


@pytest.mark.parametrize(
    ("argv", "given"),
    [
        ((*SMOKE, "--schedule", "distilled", "--steps", 4), "--steps"),
        ((*DISTILLED_BY_NAME, "--steps", 8, "--guidance", 1), "--steps and --guidance"),  # checked before any file
    ],
    ids=["explicit", "auto-by-name"],
)
def test_steps_or_guidance_with_the_distilled_schedule_is_a_usage_error(fail, argv, given):
    err = fail(*argv, code=ExitCode.USAGE, match=f"{given} cannot be used with the distilled schedule")
    assert "8 fixed sigmas and no guidance" in err and "--schedule dev" in err


def test_one_dev_step_is_a_usage_error(fail):
    fail(*SMOKE, "--steps", 1, code=ExitCode.USAGE, match="the dev schedule needs at least 2 steps")


def test_lora_for_another_architecture(fail, tmp_path):
    flux_lora = {f"diffusion_model.double_blocks.0.img_attn.qkv.lora_{side}.weight": torch.zeros(4, 4) for side in "AB"}
    lora = _write(tmp_path / "flux_lora.safetensors", flux_lora)
    fail(*SMOKE, "--lora", lora, code=ExitCode.INPUT, match="does not fit this LTX-2.3 model")


def test_unreadable_image(fail, tmp_path):
    (tmp_path / "photo.png").write_text("not a picture")
    fail(*SMOKE, "--image", tmp_path / "photo.png", code=ExitCode.INPUT, match="is not a readable image")


def test_sequential_offload_is_refused_on_the_cpu(fail):
    fail(*SMOKE, "--memory", "sequential", code=ExitCode.USAGE, match="--memory sequential")


def test_output_must_be_mp4(run_cli, tmp_path):
    code, _, err = run_cli(*SMOKE, "--output", tmp_path / "out.avi")
    assert code == ExitCode.USAGE and "use a .mp4 file name" in err


def test_nan_output_writes_nothing(fail):
    from diffusers import LTX2VideoTransformer3DModel

    def poison(module, args, output):
        if isinstance(module, LTX2VideoTransformer3DModel):
            return tuple(torch.full_like(o, float("nan")) for o in output)
        return None

    handle = torch.nn.modules.module.register_module_forward_hook(poison)
    try:
        fail(*SMOKE, code=ExitCode.NUMERICS, match="NaN/Inf in the generated video frames")
    finally:
        handle.remove()


def test_failed_encode_leaves_no_partial_files(fail, monkeypatch):
    def broken(video, fps, output_path, **kwargs):
        with open(output_path, "wb") as handle:
            handle.write(b"\x00" * 100)
        raise RuntimeError("encoder crashed")

    monkeypatch.setattr(video_io, "encode_video", broken)
    err = fail(*SMOKE, code=ExitCode.FAILURE, match="")
    assert "encoder crashed" in err


def test_decompression_bomb_image_is_one_input_error(fail, tmp_path):
    bomb = header_only_png(tmp_path / "bomb.png", 40000, 40000)
    fail(*SMOKE, "--image", bomb, code=ExitCode.INPUT, match="has 1,600,000,000 pixels, over the 89,478,485")


def test_sizes_beyond_the_positional_range_are_refused_before_loading(fail):
    fail(
        *SMOKE, "--width", 1048576, "--height", 1048576,
        code=ExitCode.USAGE, match="--width 1048576 is above the maximum 2048; --height 1048576 is above the maximum",
    )  # fmt: skip


def test_a_full_disk_while_writing_leaves_no_output(fail, monkeypatch):
    """ENOSPC injected into the PNG writer after the mp4 was written: nothing appears, report.json included."""

    def full_disk(self, fp, *args, **kwargs):
        with open(fp, "wb") as handle:
            handle.write(b"\x89PNG")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Image.Image, "save", full_disk)
    fail(*SMOKE, code=ExitCode.OUTPUT, match="out_first.png (No space left on device); free space or choose another")
