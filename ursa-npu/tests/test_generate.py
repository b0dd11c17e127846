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
