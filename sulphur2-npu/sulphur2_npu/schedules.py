"""The two sigma schedules LTX-2.3 samples with, as diffusers schedulers that give ltx-core's numbers.

Sources: Lightricks/LTX-2 at 400fd310, ``packages/ltx-core/src/ltx_core/components/schedulers.py`` and
``packages/ltx-pipelines/src/ltx_pipelines/utils/constants.py``.

- ``dev`` (full model, guidance on): ``LTX2Scheduler.execute(steps=N)``, which ltx-pipelines' one- and two-stage
  pipelines call without ``latent=``, so the token count is the 4096 anchor and the shift is ``max_shift`` = 2.05 at
  every size: ``σ = linspace(1, 0, N + 1)``, non-zero σ ↦ ``e^2.05 / (e^2.05 + 1/σ - 1)``, then stretched so the last
  non-zero σ is 0.1. ``FlowMatchEulerDiscreteScheduler`` with ``data/scheduler_config.json`` computes the same
  (exponential time shift, ``shift_terminal`` 0.1): its ``base_shift`` = ``max_shift`` = 2.05 make diffusers'
  token-count ``mu`` the constant 2.05. (LTX-Video's 0.95..2.05 made it follow the token count like ltx-core's HQ
  pipeline: up to 0.20 off in σ at the presets.)
- ``distilled`` (the distilled weights or the distill LoRA): ``DISTILLED_SIGMA_VALUES``, 8 fixed steps, no guidance.
  diffusers' copy omits the terminal 0, which ``FlowMatchEulerDiscreteScheduler`` appends; they are passed as
  ``sigmas=`` to a scheduler that neither shifts nor stretches them (the dev config would move every one of them).
- ``two-stage-hq``'s stage 1 (``TI2VidTwoStagesHQPipeline``) calls ``LTX2Scheduler.execute(latent=..., steps=N)``:
  the shift follows stage 1's token count (0.95 at 1024 tokens, 2.05 at 4096, on the line through them), which
  diffusers' own ``mu`` computes with ``base_shift`` 0.95 (:data:`HQ_SCHEDULER_CONFIG`). Both its stages sample with
  res_2s (:func:`use_res2s`, :mod:`.res2s`).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, TypeVar

from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.ltx2.utils import DISTILLED_SIGMA_VALUES

from deliverykit.errors import DeliveryError, ExitCode

from .options import DEV, DISTILLED, DISTILLED_NAME_MARK, ONE_STAGE, SCHEDULES
from .res2s import res2s_scheduler

Settings = TypeVar("Settings")  # a dataclass with steps and guidance: presets.Preset, generate.GenerationRequest
DISTILLED_SIGMAS: tuple[float, ...] = tuple(DISTILLED_SIGMA_VALUES)
DISTILLED_STEPS = len(DISTILLED_SIGMAS)

DEV_SCHEDULER_CONFIG: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parent / "data" / "scheduler_config.json").read_text()
)
HQ_SCHEDULER_CONFIG: dict[str, Any] = {**DEV_SCHEDULER_CONFIG, "base_shift": 0.95}  # LTX2Scheduler's base_shift
DISTILLED_SCHEDULER_CONFIG: dict[str, Any] = {
    **DEV_SCHEDULER_CONFIG,
    "use_dynamic_shifting": False,
    "shift": 1.0,  # σ ↦ σ exactly
    "shift_terminal": None,
}


@dataclasses.dataclass(frozen=True)
class ScheduleChoice:
    """The schedule a run uses (``dev`` or ``distilled``; its stage 1 in a two-stage pipeline) and why, and its
    pipeline (``stages.choose_pipeline``), as printed and recorded in the report."""

    name: str
    why: str
    pipeline: str = ONE_STAGE
    pipeline_why: str = "one call at full size"


def choose_schedule(requested: str, checkpoint: Path) -> ScheduleChoice:
    """``dev`` or ``distilled`` as requested; ``auto``: distilled when the file name says so, else dev.

    The name is the only sign: ltx-core's metadata (``config`` with the module configs, ``model_version``) has no
    distilled flag, and ltx-pipelines choose the schedule by pipeline, not by file.
    """
    if requested in SCHEDULES:
        return ScheduleChoice(requested, f"--schedule {requested}")
    if requested != "auto":
        raise ValueError(f"schedule {requested!r}; expected auto, {', '.join(SCHEDULES)}")
    name = Path(checkpoint).name
    if DISTILLED_NAME_MARK in name.lower():
        return ScheduleChoice(DISTILLED, f"auto: the file name {name} contains {DISTILLED_NAME_MARK!r}")
    return ScheduleChoice(DEV, f"auto: the file name {name} has no {DISTILLED_NAME_MARK!r}")


def refuse_fixed_settings(choice: ScheduleChoice, **given: Any) -> None:
    """Usage error (exit 2) when ``given`` sets ``steps`` or ``guidance`` (not None) for the distilled schedule."""
    names = [f"--{name}" for name, value in given.items() if value is not None]
    if choice.name == DISTILLED and names:
        raise DeliveryError(
            f"{' and '.join(names)} cannot be used with the distilled schedule ({choice.why}): it has "
            f"{DISTILLED_STEPS} fixed sigmas and no guidance; drop {' and '.join(names)}, or pass "
            f"--schedule dev to set them (dev weights)",
            ExitCode.USAGE,
        )


def for_schedule(settings: Settings, schedule: str) -> Settings:
    """``settings`` (a ``Preset`` or a ``GenerationRequest``) as ``schedule`` runs them.

    Distilled keeps the size and length but has its own 8 steps and no guidance; a request also records the schedule.
    """
    changes: dict[str, Any] = {"steps": DISTILLED_STEPS, "guidance": 1.0} if schedule == DISTILLED else {}
    if "schedule" in {field.name for field in dataclasses.fields(settings)}:
        changes["schedule"] = schedule
    return dataclasses.replace(settings, **changes)


def _scheduler_config(schedule: str) -> dict[str, Any]:
    configs = {DEV: DEV_SCHEDULER_CONFIG, DISTILLED: DISTILLED_SCHEDULER_CONFIG}
    if schedule not in configs:
        raise ValueError(f"schedule {schedule!r}; expected one of {', '.join(SCHEDULES)}")
    return configs[schedule]


def make_scheduler(schedule: str) -> FlowMatchEulerDiscreteScheduler:
    """A fresh scheduler for ``schedule`` (see the module docstring for why the two differ)."""
    return FlowMatchEulerDiscreteScheduler.from_config(_scheduler_config(schedule))


def use_schedule(pipe: Any, schedule: str) -> None:
    """Give ``pipe`` the scheduler of ``schedule``; its ``sigmas=`` argument (if any) comes from ``generate``.

    A scheduler already configured for ``schedule`` is kept: ``set_timesteps`` resets it at every call anyway.
    """
    wanted = _scheduler_config(schedule)
    current = pipe.scheduler
    if type(current) is FlowMatchEulerDiscreteScheduler and all(
        current.config.get(key) == value for key, value in wanted.items()
    ):
        return
    pipe.scheduler = make_scheduler(schedule)


def use_res2s(pipe: Any, schedule: str) -> None:
    """Give ``pipe`` a fresh res_2s scheduler (:mod:`.res2s`) as ``two-stage-hq`` samples ``schedule``: dev with the
    token-count shift (its stage 1), distilled with the ``sigmas=`` it is given (its stage 2)."""
    configs = {DEV: HQ_SCHEDULER_CONFIG, DISTILLED: DISTILLED_SCHEDULER_CONFIG}
    pipe.scheduler = res2s_scheduler(configs[schedule], pipe.transformer.dtype)
