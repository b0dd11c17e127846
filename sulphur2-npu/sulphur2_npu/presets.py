"""Named generation settings (``--preset``): size, length, steps and guidance in one word.

The real model has one sensible operating range (LTX-2.3: 768x512 stage-1 resolution, 121 frames = 5 s at 24 fps,
30 steps, CFG 3; ltx-pipelines ``LTX_2_3_PARAMS`` at 400fd310); the presets step down from it so that a first run
on a new card is minutes, not an hour:

- ``mini``: 512x320, 49 frames (2 s), 10 steps: a quick end-to-end check of a card, memory plan and install.
- ``balanced``: 768x512, 121 frames (5 s), 20 steps: LTX-2.3's stage-1 resolution and length, fewer steps.
- ``quality``: 960x544, 121 frames (5 s), 30 steps: LTX-2.3's step count at its HQ stage-1 resolution (1920x1088/2).

All use guidance 3 (``--guidance``, the video CFG scale; see ``generate.guidance_kwargs``) with the dev schedule; the
distilled schedule keeps their size and length with its own 8 steps and no guidance (``schedules.for_schedule``).
``--width``, ``--height``, ``--num-frames``, ``--steps`` and ``--guidance`` override single values. Every size is
valid for the VAE (``sizes.validate_size``).
"""

from __future__ import annotations

import argparse
import dataclasses

from deliverykit.errors import DeliveryError, ExitCode
from sulphur2_npu.options import DEV


@dataclasses.dataclass(frozen=True)
class Preset:
    width: int
    height: int
    num_frames: int
    steps: int
    guidance: float

    def as_dict(self) -> dict[str, int | float]:
        return dataclasses.asdict(self)


PRESETS: dict[str, Preset] = {
    "mini": Preset(width=512, height=320, num_frames=49, steps=10, guidance=3.0),
    "balanced": Preset(width=768, height=512, num_frames=121, steps=20, guidance=3.0),
    "quality": Preset(width=960, height=544, num_frames=121, steps=30, guidance=3.0),
}
DEFAULT_PRESET = "balanced"


def add_preset_arguments(parser: argparse.ArgumentParser) -> None:
    """``--preset`` and the flags that override single values of it, the same in inference.py and its batch lines."""
    presets = "; ".join(f"{name} {p.width}x{p.height}x{p.num_frames}, {p.steps} steps" for name, p in PRESETS.items())
    parser.add_argument(
        "--preset",
        choices=tuple(PRESETS),
        help=f"size, length, steps and guidance ({presets}; default {DEFAULT_PRESET}, the tiny size with --smoke)",
    )
    parser.add_argument("--width", type=int, help="video width, a multiple of 32 (overrides the preset)")
    parser.add_argument("--height", type=int, help="video height, a multiple of 32 (overrides the preset)")
    parser.add_argument("--num-frames", type=int, help="frames, 8k+1 (overrides the preset)")
    parser.add_argument("--steps", type=int, help="denoising steps (dev schedule; overrides the preset)")
    parser.add_argument(
        "--guidance", type=float, help="video CFG scale (dev schedule); <= 1 turns all guidance off (distill LoRA)"
    )


def resolve_preset(preset: str | Preset, **overrides: int | float | None) -> Preset:
    """``preset`` (a name from :data:`PRESETS`, or a :class:`Preset`) with every override that is not None applied.

    Overrides are the field names: ``width=``, ``height=``, ``num_frames=``, ``steps=``, ``guidance=``.
    """
    if isinstance(preset, str):
        if preset not in PRESETS:
            raise ValueError(f"preset {preset!r}; expected one of {', '.join(PRESETS)}")
        preset = PRESETS[preset]
    unknown = set(overrides) - {field.name for field in dataclasses.fields(Preset)}
    if unknown:
        raise TypeError(f"unknown preset fields {sorted(unknown)}")
    return dataclasses.replace(preset, **{k: v for k, v in overrides.items() if v is not None})


def settings_for(preset: str | Preset, schedule: str, **overrides: int | float | None) -> Preset:
    """``preset`` with ``overrides`` (:func:`resolve_preset`) as ``schedule`` runs it (``schedules.for_schedule``).

    The dev schedule needs 2 steps or more: a usage error (exit 2) otherwise.
    """
    settings = resolve_preset(preset, **overrides)
    if schedule == DEV and settings.steps < 2:
        raise DeliveryError(
            f"--steps {settings.steps}: the dev schedule needs at least 2 steps (LTX-2.3 stretches its last non-zero "
            "sigma to 0.1, which one step cannot); pass --steps 2 or more",
            ExitCode.USAGE,
        )
    from sulphur2_npu.schedules import for_schedule  # imports diffusers: not at module import (fast --help)

    return for_schedule(settings, schedule)
