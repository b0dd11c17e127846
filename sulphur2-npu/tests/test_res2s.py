"""``two-stage-hq`` (ltx-pipelines' ``TI2VidTwoStagesHQPipeline``): the res_2s scheduler's evaluations and what the
pipeline runs with it on the tiny model. Equality with ltx-pipelines' own res_2s loop is ``test_reference_ltx.py``
(``test_two_stage_pipelines_match_ltx_pipelines[two-stage-hq*]``, ``test_res2s_scheduler_matches_ltx_loop``; needs
``LTX2_SRC``)."""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from deliverykit.errors import ExitCode
from sulphur2_npu import generate as generate_module
from sulphur2_npu import stages
from sulphur2_npu.accuracy import tiny_request
from sulphur2_npu.loader import load_pipeline
from sulphur2_npu.options import TWO_STAGE_HQ
from sulphur2_npu.request import build_request
from sulphur2_npu.res2s import res2s_scheduler
from sulphur2_npu.schedules import DEV, DISTILLED_SCHEDULER_CONFIG, ScheduleChoice, use_schedule
from sulphur2_npu.tiny import TINY_TWO_STAGE_PRESET

# ltx-pipelines utils/constants.py at 400fd310: stage 2's σ (the S4 issue quotes them)
STAGE_2 = [0.909375, 0.725, 0.421875, 0.0]


def _evaluations(schedule: list[float]) -> list[float]:
    """res2s_audio_video_denoising_loop's model calls for ``schedule`` (ending in 0), written out from its source:
    0.0011 replaces the final 0, each step evaluates at σ_k and √(σ_k σ_k+1), then once more at 0.0011."""
    steps = [*schedule[:-1], 0.0011]
    calls = []
    for sigma, following in itertools.pairwise(steps):
        calls += [sigma, math.sqrt(sigma * following)]
    return [*calls, 0.0011]


def test_the_scheduler_lists_every_res2s_evaluation():
    scheduler = res2s_scheduler(DISTILLED_SCHEDULER_CONFIG, torch.float32)
    scheduler.set_timesteps(sigmas=STAGE_2[:-1], device="cpu")
    expected = _evaluations(STAGE_2)
    assert len(expected) == 2 * 3 + 1
    np.testing.assert_allclose(scheduler.sigmas.numpy(), [*expected, 0.0], rtol=1e-7)  # float32 of float64 values
    np.testing.assert_allclose(scheduler.timesteps.numpy(), np.array(expected) * 1000, rtol=1e-7)


def test_video_and_audio_copies_share_the_noise_streams():
    """diffusers' pipelines ``deepcopy`` the scheduler for the audio stream; ltx-core draws both streams' noise from
    one generator per kind, video first, so a copy must not restart the stream."""
    scheduler = res2s_scheduler(DISTILLED_SCHEDULER_CONFIG, torch.float32)
    audio = copy.deepcopy(scheduler)
    assert audio.streams is scheduler.streams
    first = torch.randn(3, generator=scheduler.streams.step)
    assert not torch.equal(torch.randn(3, generator=audio.streams.step), first)
    audio.set_timesteps(sigmas=STAGE_2[:-1], device="cpu")  # a new run starts both streams again
    assert torch.equal(torch.randn(3, generator=scheduler.streams.step), first)


@pytest.fixture
def pipe(smoke_files):
    """A fresh tiny pipeline for each test: tests load LoRAs and hooks into it."""
    return load_pipeline(smoke_files.checkpoint, smoke_files.text_encoder, torch_dtype=torch.float32).pipe


def test_two_stage_hq_runs_res2s_in_both_stages(pipe, smoke_files, ltx2_scheduler_sigmas):
    """Stage 1: 2n + 1 evaluations of the σ ``LTX2Scheduler`` gives stage 1's token count, two transformer passes
    each (CFG batch, modality isolation; no STG); stage 2: the 7 evaluations of ltx-pipelines' stage-2 σ, one pass
    each; the distilled LoRA on in both at its HQ strengths. Two runs give the same video (each stage's SDE streams
    start again), and a later Euler run gets diffusers' own scheduler back."""
    parts = stages.load_stage_parts(
        pipe, TWO_STAGE_HQ, upsampler=smoke_files.upsampler, distilled_lora=(smoke_files.distilled_lora, 1.0)
    )
    assert (parts.stage_1_adapters, parts.stage_2_adapters) == (
        {stages.DISTILLED_LORA_ADAPTER: 0.25},
        {stages.DISTILLED_LORA_ADAPTER: 0.5},
    )
    timesteps = []
    pipe.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: timesteps.append(float(kwargs["timestep"].flatten()[0])), with_kwargs=True
    )
    size = {"width": TINY_TWO_STAGE_PRESET.width, "height": TINY_TWO_STAGE_PRESET.height}
    request = dataclasses.replace(tiny_request(), **size, steps=3, pipeline=TWO_STAGE_HQ)
    runs = [
        generate_module.generate(pipe, request, device="cpu", generator=torch.Generator().manual_seed(5), parts=parts)
        for _ in range(2)
    ]
    recorded = runs[0].stages
    stage_1 = _evaluations(ltx2_scheduler_sigmas(3, tokens=recorded["stage_1"]["video_tokens"]))
    np.testing.assert_allclose(recorded["stage_1"]["sigmas"], [*stage_1, 0.0], rtol=1e-6)
    np.testing.assert_allclose(recorded["stage_2"]["sigmas"], [*_evaluations(STAGE_2), 0.0], rtol=1e-6)
    expected = [sigma for sigma in stage_1 for _ in range(2)] + _evaluations(STAGE_2)
    np.testing.assert_allclose(timesteps[: len(expected)], np.array(expected) * 1000, rtol=1e-6)
    assert len(timesteps) == 2 * len(expected)
    assert (recorded["sampler"], recorded["decode"]["audio_from"]) == ("res_2s", "stage_1")
    # the same request twice: equal up to float32 round-off between two runs (frames in [0, 1]); noise streams that
    # did not start again would move the second video by far more
    np.testing.assert_allclose(runs[0].video, runs[1].video, rtol=0, atol=1e-5)
    use_schedule(pipe, DEV)
    assert type(pipe.scheduler) is FlowMatchEulerDiscreteScheduler


def test_smoke_runs_two_stage_hq_end_to_end(run_cli, tmp_path):
    code, out, err = run_cli("--smoke", "--device", "cpu", "--pipeline", TWO_STAGE_HQ, "--output", tmp_path / "out.mp4")
    assert code == ExitCode.OK, err
    assert f"PIPELINE={TWO_STAGE_HQ}" in out and "OUTPUT_SHAPE=[9, 64, 128, 3]" in out
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["timing"]["stages"]["sampler"] == "res_2s"
    assert report["model"]["stage_adapters"]["stage_1"] == {stages.DISTILLED_LORA_ADAPTER: 0.25}


def test_a_distilled_lora_strength_is_refused_with_two_stage_hq(run_cli, tmp_path):
    lora = tmp_path / "lora.safetensors"
    argv = ["--model", tmp_path / "m.safetensors", "--text-encoder", tmp_path, "--prompt", "x"]
    argv += ["--pipeline", TWO_STAGE_HQ, "--distilled-lora", lora, "0.8", "--output", tmp_path / "out.mp4"]
    code, _, err = run_cli(*argv)
    assert code == ExitCode.USAGE and "drop the STRENGTH" in err
    assert sorted(path.name for path in tmp_path.iterdir()) == []


@pytest.mark.parametrize(("steps", "expected"), [(None, stages.HQ_STEPS), (8, 8)])
def test_two_stage_hq_takes_ltx_pipelines_hq_steps_unless_told(steps, expected):
    """``LTX_2_3_HQ_PARAMS``: 15 steps (each two model calls) whatever the preset's; ``--steps`` wins."""
    choice = ScheduleChoice(DEV, "test", pipeline=TWO_STAGE_HQ)
    fields = {"prompt": "a", "fps": 24, "preset": "balanced", "steps": steps}
    assert build_request(fields, smoke=False, schedule=choice).steps == expected
