"""Memory plans on CPU with the tiny model: same frames and audio as everything resident; auto picks by free memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from deliverykit.testing import assert_equal_up_to_reordering
from sulphur2_npu.memory import (
    TWO_STAGE_GB,
    MemoryPlan,
    apply_memory_plan,
    auto_plans,
    choose_memory_plan,
    encode_prompt_then_free,
    make_plan,
)
from sulphur2_npu.tiny import TINY_CALL, tiny_pipeline

PROMPT_KEYS = ("prompt", "negative_prompt")


def _generate(pipe, **overrides):
    out = pipe(**{**TINY_CALL, **overrides}, generator=torch.Generator().manual_seed(42))
    return np.asarray(out.frames), np.asarray(out.audio)


def _run_plan(plan: MemoryPlan):
    """Encode first when the plan frees the text encoder, place the components, generate."""
    pipe = tiny_pipeline(0)
    call: dict = {}
    if plan.free_text_encoder:
        call = encode_prompt_then_free(
            pipe,
            TINY_CALL["prompt"],
            TINY_CALL["negative_prompt"],
            device="cpu",
            max_sequence_length=TINY_CALL["max_sequence_length"],
        )
        call |= dict.fromkeys(PROMPT_KEYS)
        assert pipe.text_encoder is None
    apply_memory_plan(pipe, plan, "cpu")
    return pipe, _generate(pipe, **call)


@pytest.fixture(scope="module")
def resident():
    return _run_plan(make_plan("none", "test"))[1]


@pytest.mark.parametrize("name", ["model-offload", "group-offload"])
def test_offload_plans_give_identical_frames_and_audio(resident, name):
    plan = make_plan(name, "test")
    pipe, (frames, audio) = _run_plan(plan)
    # The plans move tensors, never change the maths, and the prompt is encoded by the same code whether the pipeline
    # or encode_prompt_then_free calls it; the pipelines are different objects (kernels may sum in another order).
    assert_equal_up_to_reordering(frames, resident[0], "frames")
    assert_equal_up_to_reordering(audio, resident[1], "audio")
    if name == "group-offload":
        assert plan.free_text_encoder and plan.vae_tiling and pipe.vae.use_tiling
        # the transformer really is hooked (a plan that silently did nothing would also pass the equality)
        assert any(hasattr(m, "_diffusers_hook") for m in pipe.transformer.modules())
    else:
        assert hasattr(pipe, "_all_hooks") and pipe._all_hooks


def test_resident_plan_after_freeing_the_text_encoder_is_identical(resident):
    plan = choose_memory_plan("npu:0", free_bytes=61 * 10**9)
    assert (plan.name, plan.free_text_encoder) == ("none", True)
    _, (frames, audio) = _run_plan(plan)
    assert_equal_up_to_reordering(frames, resident[0], "frames")
    assert_equal_up_to_reordering(audio, resident[1], "audio")


def test_sequential_plan_calls_diffusers_with_the_device(monkeypatch):
    # Not runnable on CPU: accelerate's cpu_offload with device="cpu" fails inside set_module_tensor_to_device
    # (TypeError). What can be checked here is the call and the VAE tiling it comes with.
    pipe = tiny_pipeline(0)
    calls = []
    monkeypatch.setattr(pipe, "enable_sequential_cpu_offload", lambda device: calls.append(device))
    apply_memory_plan(pipe, make_plan("sequential", "test"), "cpu")
    assert calls == [torch.device("cpu")] and pipe.vae.use_tiling


@pytest.mark.parametrize(
    ("free_gb", "expected"),
    [
        (30, ("group-offload", True)),  # 32 GB 910B4: transformer streamed block by block
        (61, ("none", True)),  # 64 GB 910B: resident once Gemma is freed
        (80, ("none", False)),  # 80 GB: everything resident
        (12, ("sequential", True)),
    ],
)
@pytest.mark.parametrize("two_stage", [False, True], ids=["one-stage", "two-stage"])
def test_auto_picks_by_free_memory(free_gb, expected, two_stage):
    """The two-stage parts (upsampler, distilled LoRA) fit beside each plan on the same cards."""
    plan = choose_memory_plan("npu:0", free_bytes=free_gb * 10**9, two_stage=two_stage)
    assert (plan.name, plan.free_text_encoder) == expected
    assert plan.expected_peak_gb <= free_gb
    assert f"{free_gb:.1f} GB free" in plan.why
    one_stage = choose_memory_plan("npu:0", free_bytes=free_gb * 10**9)
    if two_stage and plan.name == "none":  # both parts resident
        assert plan.expected_peak_gb == pytest.approx(one_stage.expected_peak_gb + sum(TWO_STAGE_GB.values()))


def test_auto_reads_the_device_query_and_cpu_is_resident(monkeypatch):
    from deliverykit import memory_plans

    monkeypatch.setattr(memory_plans, "memory_info", lambda device: (30 * 10**9, 32 * 10**9))
    assert choose_memory_plan("npu:0").name == "group-offload"
    cpu = choose_memory_plan("cpu")
    assert (cpu.name, cpu.free_text_encoder, cpu.expected_peak_gb) == ("none", False, None)
    for two_stage in (False, True):
        rows = auto_plans(two_stage)
        assert [row[0] for row in rows] == sorted((row[0] for row in rows), reverse=True)


def test_unknown_plan_is_refused():
    with pytest.raises(ValueError, match="expected one of auto, none"):
        choose_memory_plan("cpu", "half")
