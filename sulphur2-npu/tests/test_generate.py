"""generate(): the same frames and audio as a bare pipeline call, sound timings, guidance passes, schedules, NaNs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from deliverykit.errors import NumericsError
from sulphur2_npu.generate import GenerationRequest, generate, guidance_kwargs, pipeline_kwargs
from sulphur2_npu.tiny import TINY_CALL, TINY_HEIGHT, TINY_NUM_FRAMES, TINY_WIDTH, tiny_pipeline

TINY_REQUEST = GenerationRequest(
    prompt=TINY_CALL["prompt"],
    negative_prompt=TINY_CALL["negative_prompt"],
    width=TINY_WIDTH,
    height=TINY_HEIGHT,
    num_frames=TINY_NUM_FRAMES,
    steps=TINY_CALL["num_inference_steps"],
    guidance=TINY_CALL["guidance_scale"],
    max_sequence_length=TINY_CALL["max_sequence_length"],
)


@pytest.fixture(scope="module")
def pipe(tiny_components):
    return tiny_pipeline(components=tiny_components)


def _seed():
    return torch.Generator().manual_seed(42)


def _run_counting_passes(pipe, **changes):
    """``TINY_REQUEST`` with ``changes`` through generate(); the result and the timestep of every transformer pass."""
    timesteps = []

    def record(module, args, kwargs):
        timesteps.append(float(kwargs["timestep"][0]))

    handle = pipe.transformer.register_forward_pre_hook(record, with_kwargs=True)
    try:
        result = generate(pipe, dataclasses.replace(TINY_REQUEST, **changes), device="cpu", generator=_seed())
    finally:
        handle.remove()
    return result, timesteps


def test_same_output_as_the_bare_pipeline_call(pipe):
    result = generate(pipe, TINY_REQUEST, device="cpu", generator=_seed())
    reference = pipe(**TINY_CALL, generator=_seed())  # TINY_CALL: hand-written, not from guidance_kwargs
    assert np.array_equal(result.video, reference.frames[0]) and torch.equal(result.audio, reference.audio[0])
    assert result.video.shape == (TINY_NUM_FRAMES, TINY_HEIGHT, TINY_WIDTH, 3)
    assert result.sample_rate == pipe.vocoder.config.output_sampling_rate == 48000
    assert result.peak_memory_bytes is None  # no allocator counter on the CPU


def test_timings_cover_the_call(pipe):
    timings = generate(pipe, TINY_REQUEST, device="cpu", generator=_seed()).timings
    assert len(timings.step_ms) == TINY_REQUEST.steps and all(t > 0 for t in timings.step_ms)
    assert timings.prepare_ms > 0 and timings.decode_ms > 0
    parts = timings.prepare_ms + timings.denoise_ms + timings.decode_ms
    assert parts == pytest.approx(timings.total_ms, rel=1e-6)  # consecutive clock marks, nothing uncounted
    assert timings.first_step_ms == timings.step_ms[0] and timings.per_step_ms == timings.step_ms[1]
    assert set(timings.as_dict()) >= {"first_step_ms", "per_step_ms", "decode_ms", "total_ms", "step_ms"}


@pytest.mark.parametrize(("guidance", "calls_per_step"), [(1.0, 1), (3.0, 3)])
def test_guidance_sets_the_transformer_passes_per_step(pipe, guidance, calls_per_step):
    _, timesteps = _run_counting_passes(pipe, guidance=guidance)
    assert len(timesteps) == calls_per_step * TINY_REQUEST.steps


def test_distilled_runs_ltx_core_sigmas_with_one_pass_per_step(pipe, ltx_core_distilled_sigmas):
    result, timesteps = _run_counting_passes(pipe, schedule="distilled", steps=8, guidance=1.0)
    expected = torch.tensor(ltx_core_distilled_sigmas, dtype=torch.float32)  # ltx-core's DISTILLED_SIGMAS tensor
    assert result.sigmas == expected.tolist()
    assert timesteps == (expected[:-1] * 1000).tolist()  # each sigma once: one transformer pass per step


def test_dev_runs_ltx2_scheduler_sigmas_after_a_distilled_run(pipe, ltx2_scheduler_sigmas):
    _run_counting_passes(pipe, schedule="distilled", steps=8, guidance=1.0)  # must not leave its scheduler behind
    result, timesteps = _run_counting_passes(pipe, steps=4, guidance=1.0)
    assert result.sigmas == pytest.approx(ltx2_scheduler_sigmas(4), abs=2.5e-7)  # float32 rounding
    assert timesteps == pytest.approx([1000 * s for s in result.sigmas[:-1]])


def test_stg_block_fits_the_depth():
    assert guidance_kwargs(3.0, 48)["spatio_temporal_guidance_blocks"] == [28]  # the real 48-block transformer
    assert guidance_kwargs(3.0, 2)["spatio_temporal_guidance_blocks"] == [1]


def test_prompt_embeddings_replace_the_prompts(pipe):
    embeds = {"prompt_embeds": torch.zeros(1), "prompt_attention_mask": torch.ones(1)}
    request = GenerationRequest(**{**TINY_REQUEST.__dict__, "prompt_embeds": embeds})
    kwargs = pipeline_kwargs(pipe, request)
    assert (
        "prompt" not in kwargs
        and "negative_prompt" not in kwargs
        and kwargs["prompt_embeds"] is embeds["prompt_embeds"]
    )


def test_nan_in_the_output_raises_numerics_error(pipe):
    def poison(module, args, kwargs, output):
        return tuple(torch.full_like(o, float("nan")) for o in output)

    handle = pipe.transformer.register_forward_hook(poison, with_kwargs=True)
    try:
        with pytest.raises(NumericsError, match=r"NaN/Inf in the generated video frames \(\d+ of \d+ values\)"):
            generate(pipe, TINY_REQUEST, device="cpu", generator=_seed())
    finally:
        handle.remove()


def test_image_needs_the_image_to_video_pipeline(pipe):
    from PIL import Image

    request = GenerationRequest(**{**TINY_REQUEST.__dict__, "image": Image.new("RGB", (TINY_WIDTH, TINY_HEIGHT))})
    with pytest.raises(ValueError, match="text-to-video"):
        generate(pipe, request, device="cpu")


def test_request_from_preset_takes_every_preset_field():
    from sulphur2_npu.presets import PRESETS

    preset = PRESETS["quality"]
    request = GenerationRequest.from_preset(preset, "a fox", fps=30)
    assert (request.width, request.height, request.num_frames, request.steps, request.guidance) == (
        preset.width,
        preset.height,
        preset.num_frames,
        preset.steps,
        preset.guidance,
    )
    assert request.prompt == "a fox" and request.fps == 30 and request.image is None
