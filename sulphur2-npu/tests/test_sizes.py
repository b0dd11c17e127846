"""Size validation: the rule (width/height 32k, frames 8k+1) and the nearest valid values named in the error."""

from __future__ import annotations

import pytest

from deliverykit.errors import ExitCode
from sulphur2_npu.sizes import InvalidSizeError, max_num_frames, nearest_multiples, validate_size


@pytest.mark.parametrize(("width", "height", "frames"), [(32, 32, 1), (96, 64, 9), (768, 512, 121), (1920, 1088, 257)])
def test_valid_sizes_pass(width, height, frames):
    validate_size(width, height, frames)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((100, 64, 9), "--width 100 is not a positive multiple of 32 (nearest valid: 96 or 128)"),
        ((96, 500, 9), "--height 500 is not a positive multiple of 32 (nearest valid: 480 or 512)"),
        ((96, 64, 100), "--num-frames 100 is not 8k+1 (nearest valid: 97 or 105)"),
        ((96, 64, 120), "--num-frames 120 is not 8k+1 (nearest valid: 113 or 121)"),
        ((10, 64, 9), "--width 10 is not a positive multiple of 32 (nearest valid: 32)"),
        ((0, 64, 9), "--width 0 is not a positive multiple of 32 (nearest valid: 32)"),
        ((96, 64, 0), "--num-frames 0 is not 8k+1 (nearest valid: 1)"),
    ],
)
def test_invalid_size_names_the_nearest_valid_values(args, expected):
    with pytest.raises(InvalidSizeError) as caught:
        validate_size(*args)
    message = str(caught.value)
    assert message.startswith(expected + ":"), message
    assert "\n" not in message and caught.value.exit_code == ExitCode.USAGE


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((1048576, 64, 9), "--width 1048576 is above the maximum 2048"),
        ((96, 1048576, 9), "--height 1048576 is above the maximum 2048"),
        ((96, 64, 1_000_001), "--num-frames 1000001 is above the maximum 481"),
    ],
)
def test_sizes_beyond_the_positional_range_name_the_maximum(args, expected):
    with pytest.raises(InvalidSizeError) as caught:
        validate_size(*args)
    message = str(caught.value)
    assert message.startswith(expected + ":") and "pass at most --width 2048 --height 2048 --num-frames 481" in message
    assert caught.value.exit_code == ExitCode.USAGE


def test_the_longest_video_is_20_seconds_of_8k_plus_1_frames():
    # 20 s at 24 fps = 480 frame intervals; at 25 fps 500 intervals round down to 496 (8k)
    assert (max_num_frames(24), max_num_frames(25), max_num_frames(1)) == (481, 497, 17)
    validate_size(2048, 2048, 481)  # the largest valid size itself passes


def test_every_invalid_value_is_named_at_once():
    with pytest.raises(InvalidSizeError) as caught:
        validate_size(33, 65, 10)
    assert [part.split()[0] for part in str(caught.value).split("; ")] == ["--width", "--height", "--num-frames"]


@pytest.mark.parametrize(("multiple", "offset"), [(32, 0), (8, 1)])
def test_nearest_multiples_agrees_with_brute_force(multiple, offset):
    smallest = offset or multiple
    valid = [multiple * k + offset for k in range(0 if offset else 1, 200)]
    for value in range(-3, 1000):
        got = nearest_multiples(value, multiple, offset)
        if value in valid:
            assert got == (value,)
        elif value < smallest:
            assert got == (smallest,)
        else:
            assert got == (max(v for v in valid if v < value), min(v for v in valid if v > value)), value
