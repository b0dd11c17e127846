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

import dataclasses


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
