"""The text/image → video session every front end drives: ``inference.py`` (one video, ``--batch``) and ``app.py``.

Built once (:meth:`Session.load`: the single file and Gemma-3 loaded strictly and offline, then prepared: ranks,
NPU attention, RoPE precision, LoRA, memory plan), it runs typed requests (:meth:`Session.run` → :class:`Result`)
and writes a result's video, frames and report together or not at all (:meth:`Session.write`, into
:func:`video_outputs`), as a diffusers script builds a pipeline and calls it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from pathlib import Path
from typing import Any

from deliverykit.files import RunOutputs
from deliverykit.timing import repeat_runs

from .generate import GenerationRequest, GenerationResult, ModelFiles, PreparedPipeline, load_prepared
from .parallel import ParallelSpec
from .report import generation_report
from .schedules import ScheduleChoice
from .video_io import frame_paths, write_mp4, write_png

MANIFEST = Path(__file__).resolve().parents[1] / "weights-manifest.json"  # the pinned release's files


def video_outputs(video: Path, report: str | None = None) -> RunOutputs:
    """One request's video, its first and last frames and its report file(s) (``report.json`` beside them,
    ``--report``): checked now (exit 6), written by :meth:`Session.write`."""
    first, last = frame_paths(video)
    return RunOutputs.declare({"video": video, "first_frame": first, "last_frame": last}, report)


@dataclasses.dataclass(frozen=True)
class Request:
    """One video to make: the pipeline call, its seed, and how it was asked (the first-frame file and preset as given,
    for the report); ``encode_ms`` when its prompt was encoded ahead (:meth:`Session.encode_ahead`)."""

    call: GenerationRequest
    seed: int
    image_file: str | None = None
    preset: str | None = None
    encode_ms: float | None = None


@dataclasses.dataclass(frozen=True)
class Result:
    """The runs of one request: ``warmup`` untimed ones first, then the timed ones; the last one is written."""

    request: Request
    runs: list[GenerationResult]
    warmup: int

    @property
    def last(self) -> GenerationResult:
        return self.runs[-1]


@dataclasses.dataclass(frozen=True)
class Session:
    """The prepared pipeline of this process (one rank of a multi-card run), its schedule, and what every report of
    this process records of the model and its files."""

    prepared: PreparedPipeline
    schedule: ScheduleChoice
    model: dict[str, Any]  # smoke, checkpoint and text_encoder as the flags named them
    weights: list[dict[str, Any]]

    @classmethod
    def load(
        cls,
        args: argparse.Namespace,
        files: ModelFiles,
        context: Any,
        stack: contextlib.ExitStack,
        *,
        spec: ParallelSpec,
        schedule: ScheduleChoice,
        image_to_video: bool,
    ) -> Session:
        """Load ``files`` (:meth:`ModelFiles.from_args`, made before the process group exists) on ``context``'s
        device and prepare it; the memory plan is chosen, applied by :meth:`place`."""
        options = {"image_to_video": image_to_video, "manifest": MANIFEST, "pipeline": schedule.pipeline}
        prepared, weights = load_prepared(args, files, context, spec, stack, **options)
        model = {"smoke": args.smoke, "checkpoint": args.weights, "text_encoder": args.text_encoder}
        return cls(prepared, schedule, model, weights)

    @property
    def device(self) -> Any:
        return self.prepared.device

    def encode_ahead(self, request: Request) -> Request:
        """The prompt encoded now where the ranks or the memory plan need it before the call (else unchanged)."""
        call, encode_ms = self.prepared.encode_ahead(request.call)
        return dataclasses.replace(request, call=call, encode_ms=encode_ms)

    def place(self) -> None:
        """Apply the memory plan (after the prompts that needed Gemma-3 on the device) and audit placement."""
        self.prepared.place()

    def run(self, request: Request, *, warmup: int = 0, runs: int = 1) -> Result:
        """Generate ``request`` ``warmup + runs`` times (``--bench``; once otherwise), every run from its seed."""
        generations = repeat_runs(lambda: self.prepared.generate(request.call, request.seed), warmup, runs)
        return Result(request, generations, warmup)

    def write(self, result: Result, outputs: RunOutputs) -> dict[str, Any]:
        """The video with its audio, its first and last frames and the report(s) (:func:`video_outputs`), complete
        and together or not at all; returns the evidence."""
        last, fps = result.last, result.request.call.fps
        with outputs.commit() as commit:
            write_mp4(commit.files["video"], last.video, last.audio, last.sample_rate, fps)
            write_png(commit.files["first_frame"], last.video[0])
            write_png(commit.files["last_frame"], last.video[-1])
            names = {f"{name}_file": path.name for name, path in outputs.files.items()}
            evidence, commit.report = generation_report(self, result, names)
        return evidence
