"""What one video asks for, from the command line flags, checked before anything loads.

:func:`build_request` turns the fields (the flags' names: ``prompt``, ``preset``, ``width``, ``steps``, ...) into a
:class:`~sulphur2_npu.generate.GenerationRequest` and refuses, as a usage error (exit 2), what no model is needed to
refuse: steps or guidance with the distilled schedule, one dev step, a size the VAE cannot make, a request that does
not fit ``--parallel``. The first-frame image is read by the caller (``video_io.read_image``), when it runs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sulphur2_npu.generate import DEFAULT_MAX_SEQUENCE_LENGTH, GenerationRequest, guidance_kwargs
from sulphur2_npu.parallel import ParallelSpec, check_guidance_degree, check_ulysses_lengths, guidance_rows
from sulphur2_npu.presets import DEFAULT_PRESET, settings_for
from sulphur2_npu.schedules import ScheduleChoice, refuse_fixed_settings
from sulphur2_npu.sizes import validate_size
from sulphur2_npu.tiny import TINY_CALL, TINY_PRESET

SIZE_FIELDS = ("width", "height", "num_frames", "steps", "guidance")


def build_request(
    fields: Mapping[str, Any], *, smoke: bool, schedule: ScheduleChoice, spec: ParallelSpec | None = None
) -> GenerationRequest:
    """The request of ``fields`` (absent or None: the preset's value; with ``smoke``, the tiny model's call).

    Args:
        fields (`Mapping`): ``prompt``, ``negative_prompt``, ``preset``, ``width``, ``height``, ``num_frames``,
            ``steps``, ``guidance`` and ``fps``, as the flags name them (other keys are ignored).
        smoke (`bool`): the tiny model: its size without a preset, its prompts and its text window.
        schedule (`ScheduleChoice`): the run's schedule (``schedules.choose_schedule``).
        spec (`ParallelSpec`, *optional*): ``--parallel``; the request must fit it.
    """
    refuse_fixed_settings(schedule, steps=fields.get("steps"), guidance=fields.get("guidance"))
    preset = fields.get("preset") or (TINY_PRESET if smoke else DEFAULT_PRESET)
    settings = settings_for(preset, schedule.name, **{name: fields.get(name) for name in SIZE_FIELDS})
    validate_size(settings.width, settings.height, settings.num_frames, fields["fps"])
    text_tokens = TINY_CALL["max_sequence_length"] if smoke else DEFAULT_MAX_SEQUENCE_LENGTH
    if spec is not None:
        check_guidance_degree(spec, len(guidance_rows(guidance_kwargs(settings.guidance, num_layers=1))))
        check_ulysses_lengths(spec, settings.width, settings.height, settings.num_frames, text_tokens)
    negative_prompt = fields.get("negative_prompt")
    if negative_prompt is None:
        negative_prompt = TINY_CALL["negative_prompt"] if smoke else ""
    return GenerationRequest.from_preset(
        settings,
        fields.get("prompt") or TINY_CALL["prompt"],
        negative_prompt=negative_prompt,
        fps=fields["fps"],
        schedule=schedule.name,
        max_sequence_length=text_tokens,
    )
