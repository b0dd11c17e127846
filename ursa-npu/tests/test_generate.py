"""Image sizes the VQ model can make, and prompt lengths (truncation must be detectable, not silent)."""

from __future__ import annotations

import pytest

from deliverykit.errors import DeliveryError, ExitCode
from ursa_npu.generate import ImageRequest, check_image_size, check_request, nearest_multiples, prompt_token_count
from ursa_npu.tiny import build_tokenizer


@pytest.mark.parametrize(
    ("value", "expected"), [(500, [496, 512]), (512, [512]), (7, [16]), (16, [16]), (520, [512, 528])]
)
def test_nearest_multiples(value, expected):
    assert nearest_multiples(value, 16) == expected


def test_check_image_size_names_the_nearest_valid_values():
    check_image_size(512, 320, 16)
    with pytest.raises(
        DeliveryError, match=r"--width 500 is not supported.*stride 16; nearest valid: 496 or 512"
    ) as err:
        check_image_size(512, 500, 16)
    assert err.value.exit_code == ExitCode.USAGE
    with pytest.raises(DeliveryError, match=r"--height 0 .* nearest valid: 16"):
        check_image_size(0, 512, 16)


def test_check_request_wants_a_step_and_a_size_the_vq_model_can_make():
    request = ImageRequest("a cat", "", seed=0, steps=1, guidance=7.0, height=32, width=32)
    check_request(request, 16)
    with pytest.raises(DeliveryError, match="steps 0: need at least 1"):
        check_request(ImageRequest(**{**request.as_dict(), "steps": 0}), 16)
    with pytest.raises(DeliveryError, match="--width 40 is not supported"):
        check_request(ImageRequest(**{**request.as_dict(), "width": 40}), 16)


def test_prompt_token_count_is_taken_before_truncation():
    tokenizer = build_tokenizer()
    prompt = " ".join(["cat"] * 40)
    assert prompt_token_count(tokenizer, prompt) == 40
    truncated = tokenizer(prompt, max_length=16, truncation=True, padding="max_length").input_ids
    assert len(truncated) == 16  # what the pipeline feeds the model: the count above is what tells it was cut


def test_generate_audits_the_transformer_before_offloading_it(tiny_weights, diffnext_classes, monkeypatch):
    """On an accelerator the transformer leaves the device after diffusion: an audit afterwards would report every
    parameter as a CPU fallback. The order of the calls is what decides it, so it is checked on the CPU too."""
    import torch

    from deliverykit import device as devices
    from ursa_npu import generate as generation
    from ursa_npu.loader import check_weights_folder, load_pipeline

    pipe = load_pipeline(check_weights_folder(tiny_weights), diffnext_classes, torch.float32)
    pipe.set_progress_bar_config(disable=True)
    calls, audit, move = [], devices.audit_placement, pipe.transformer.to
    monkeypatch.setattr(
        devices, "audit_placement", lambda model, device: calls.append(("audit", model)) or audit(model, device)
    )
    monkeypatch.setattr(pipe.transformer, "to", lambda *a, **k: calls.append(("to", a[0] if a else k)) or move(*a, **k))
    request = generation.ImageRequest("a cat", "", seed=0, steps=2, guidance=7.0, height=32, width=32)
    result = generation.generate(pipe, request, device=torch.device("cpu"), max_prompt_length=16)
    kinds = [(kind, target if kind == "to" else type(target).__name__) for kind, target in calls]
    assert kinds.index(("audit", type(pipe.transformer).__name__)) < kinds.index(("to", "cpu"))
    assert [audit.model_device for audit in result.placement] == ["cpu", "cpu"]
