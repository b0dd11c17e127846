"""Schedules: our schedulers give ltx-core's sigmas (dev: LTX2Scheduler; distilled: DISTILLED_SIGMA_VALUES), auto."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift

from sulphur2_npu.generate import GenerationRequest
from sulphur2_npu.presets import PRESETS
from sulphur2_npu.schedules import (
    DEV,
    DISTILLED,
    DISTILLED_SIGMAS,
    choose_schedule,
    for_schedule,
    make_scheduler,
)

FLOAT32_ROUNDING = 2.5e-7  # 2 ulp at 1.0: ltx-core computes in float32, the reference in float64


def _pipeline_sigmas(schedule: str, steps: int, tokens: int, sigmas=None) -> torch.Tensor:
    """The scheduler's sigmas as ``LTX2Pipeline.__call__`` sets them ("5. Prepare timesteps") for ``tokens`` tokens."""
    scheduler = make_scheduler(schedule)
    config = scheduler.config
    mu = calculate_shift(
        tokens, config.base_image_seq_len, config.max_image_seq_len, config.base_shift, config.max_shift
    )
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps) if sigmas is None else sigmas, mu=mu)
    return scheduler.sigmas


@pytest.mark.parametrize(
    ("steps", "tokens"),
    [(30, 16 * 16 * 24), (20, 16 * 16 * 24), (10, 10 * 16 * 7), (30, 17 * 30 * 16), (40, 12), (2, 4096)],
    ids=["ltx23-30-balanced", "balanced", "mini", "quality", "tiny-40", "two-steps"],
)
def test_dev_scheduler_gives_ltx2_scheduler_sigmas_at_any_token_count(ltx2_scheduler_sigmas, steps, tokens):
    got = _pipeline_sigmas(DEV, steps, tokens)
    expected = torch.tensor(ltx2_scheduler_sigmas(steps), dtype=torch.float64)
    assert got.shape == (steps + 1,) and got[-1] == 0 and got[-2] == pytest.approx(0.1, abs=FLOAT32_ROUNDING)
    assert torch.allclose(got.double(), expected, rtol=0, atol=FLOAT32_ROUNDING), (got - expected).abs().max()


@pytest.mark.parametrize("tokens", [12, 1120, 6144, 8160, 100_000])
def test_distilled_scheduler_keeps_the_sigmas_exactly(ltx_core_distilled_sigmas, tokens):
    got = _pipeline_sigmas(DISTILLED, len(DISTILLED_SIGMAS), tokens, sigmas=list(DISTILLED_SIGMAS))
    assert torch.equal(got, torch.tensor(ltx_core_distilled_sigmas, dtype=torch.float32))  # ltx-core's float32 tensor


def test_the_dev_config_would_move_the_distilled_sigmas():
    """Why distilled needs its own scheduler: the dev shift and stretch change every sigma below 1."""
    moved = _pipeline_sigmas(DEV, len(DISTILLED_SIGMAS), 6144, sigmas=list(DISTILLED_SIGMAS))
    assert (moved[1:-1] - torch.tensor(DISTILLED_SIGMAS[1:])).abs().min() > 1e-3


@pytest.mark.parametrize(
    ("file_name", "expected"),
    [
        ("sulphur_distil_bf16.safetensors", DISTILLED),
        ("ltx-2.3-22b-distilled.safetensors", DISTILLED),
        ("Sulphur_DISTIL_bf16.safetensors", DISTILLED),
        ("sulphur_dev_bf16.safetensors", DEV),
        ("sulphur2-tiny.safetensors", DEV),
    ],
)
def test_auto_picks_distilled_by_file_name(file_name, expected):
    choice = choose_schedule("auto", Path("/weights/distilled-models") / file_name)  # the folder does not count
    assert choice.name == expected and choice.why.startswith("auto: the file name " + file_name)


def test_an_explicit_schedule_wins_over_the_name():
    assert choose_schedule("dev", Path("sulphur_distil_bf16.safetensors")).name == DEV
    assert choose_schedule(DISTILLED, Path("sulphur_dev_bf16.safetensors")).why == "--schedule distilled"
    with pytest.raises(ValueError, match="expected auto, dev, distilled"):
        choose_schedule("karras", Path("x.safetensors"))


def test_distilled_keeps_the_size_with_eight_steps_and_no_guidance():
    preset = PRESETS["balanced"]
    got = for_schedule(preset, DISTILLED)
    assert (got.width, got.height, got.num_frames, got.steps, got.guidance) == (768, 512, 121, 8, 1.0)
    assert for_schedule(preset, DEV) == preset
    request = for_schedule(GenerationRequest.from_preset(preset, "a fox"), DISTILLED)
    assert (request.schedule, request.steps, request.guidance, request.width) == (DISTILLED, 8, 1.0, 768)


@pytest.mark.parametrize(("steps", "guidance"), [(20, 1.0), (8, 3.0)])
def test_a_distilled_request_with_other_steps_or_guidance_is_refused(steps, guidance):
    with pytest.raises(ValueError, match="8 fixed steps and no guidance"):
        GenerationRequest("a fox", 96, 64, 9, steps=steps, guidance=guidance, schedule=DISTILLED)
