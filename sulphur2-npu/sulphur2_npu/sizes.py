"""The sizes an LTX-2.3 model can make: width and height multiples of 32, frame counts of the form 8k + 1.

Why: the video VAE compresses 32x in space and 8x in time with one extra (causal) first frame, so any other size is
either rejected deep inside the pipeline (diffusers checks height/width only, after loading 46 GB) or silently
rounded down (frames). Checking first, and naming the nearest valid values, turns that into a one-line fix.

Upper bounds: LTX-2.3's RoPE places video tokens at pixel and second coordinates as fractions of its positional
range, ``positional_embedding_max_pos = [20 s, 2048 px, 2048 px]`` (the checkpoint metadata; diffusers'
``pos_embed_max_pos``, ``base_height``, ``base_width``). Beyond it positions leave the trained range, and a
1048576-pixel side would only fail later in the allocator; so width and height are at most 2048 and a video at most
20 s long: ``num_frames <= 20 * fps + 1`` rounded down to 8k+1 (481 at 24 fps).
"""

from __future__ import annotations

from deliverykit.errors import DeliveryError, ExitCode

SPATIAL_MULTIPLE = 32  # AutoencoderKLLTX2Video spatial compression
TEMPORAL_MULTIPLE = 8  # ... temporal compression; frames = 8k + 1
MAX_SIDE = 2048  # RoPE positional range in pixels (base_height / base_width)
MAX_SECONDS = 20  # RoPE positional range in seconds (pos_embed_max_pos)


class InvalidSizeError(DeliveryError):
    """A width, height or frame count the model cannot make (a bad argument: exit code 2)."""

    exit_code = ExitCode.USAGE


def nearest_multiples(value: int, multiple: int, offset: int = 0) -> tuple[int, ...]:
    """The valid values ``multiple * k + offset`` (k >= 1, or k >= 0 with an offset) just below and above ``value``.

    One value when ``value`` is below the smallest valid one; ``(value,)`` when it is valid.
    """
    smallest = offset if offset > 0 else multiple
    if value <= smallest:
        return (smallest,)
    below = (value - offset) // multiple * multiple + offset
    if below == value:
        return (value,)
    return (below, below + multiple)


def _check(name: str, value: int, multiple: int, offset: int, rule: str) -> str | None:
    valid = nearest_multiples(value, multiple, offset)
    if valid == (value,):
        return None
    return f"{name} {value} is not {rule} (nearest valid: {' or '.join(str(v) for v in valid)})"


def max_num_frames(fps: int) -> int:
    """The longest video the RoPE range covers at ``fps``: 8k+1 frames lasting at most ``MAX_SECONDS``."""
    return MAX_SECONDS * fps // TEMPORAL_MULTIPLE * TEMPORAL_MULTIPLE + 1


def validate_size(width: int, height: int, num_frames: int, fps: int = 24, *, two_stage: bool = False) -> None:
    """Raise :class:`InvalidSizeError` naming every invalid value and its nearest valid ones; else return None.

    ``two_stage``: stage 1 runs at half the width and height, so both must be multiples of twice the VAE's factor.
    """
    multiple = 2 * SPATIAL_MULTIPLE if two_stage else SPATIAL_MULTIPLE
    frames_limit = max_num_frames(fps)
    too_large = [
        f"{name} {value} is above the maximum {limit}"
        for name, value, limit in (
            ("--width", width, MAX_SIDE),
            ("--height", height, MAX_SIDE),
            ("--num-frames", num_frames, frames_limit),
        )
        if value > limit
    ]
    if too_large:
        raise InvalidSizeError(
            "; ".join(too_large) + f": LTX-2.3's positional range is {MAX_SIDE} px per side and {MAX_SECONDS} s "
            f"({frames_limit} frames at --fps {fps}); pass at most --width {MAX_SIDE} --height {MAX_SIDE} "
            f"--num-frames {frames_limit}"
        )
    problems = [
        _check("--width", width, multiple, 0, f"a positive multiple of {multiple}"),
        _check("--height", height, multiple, 0, f"a positive multiple of {multiple}"),
        _check("--num-frames", num_frames, TEMPORAL_MULTIPLE, 1, f"{TEMPORAL_MULTIPLE}k+1"),
    ]
    problems = [p for p in problems if p]
    if problems:
        raise InvalidSizeError(
            "; ".join(problems) + f": the video VAE compresses {SPATIAL_MULTIPLE}x in space and "
            f"{TEMPORAL_MULTIPLE}x in time after the first frame"
            + (
                " and a two-stage pipeline's first stage runs at half the size (or pass --pipeline one-stage)"
                if two_stage
                else ""
            )
        )
