"""The text → image session every front end drives: ``inference.py`` (one image, ``--batch``) and ``app.py``.

Built once from the checked flags (:meth:`Session.load`: the weights and the patched diffnext, on the device), it
runs typed requests (:meth:`Session.run` → :class:`Result`) and writes a result's files together or not at all
(:meth:`Session.write`, into :func:`image_outputs`), as a diffusers script builds a pipeline and calls it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image

from deliverykit import cli
from deliverykit import device as devices
from deliverykit.assets.loadcheck import check_weights_for_loading, smoke_weights, weights_record
from deliverykit.files import RunOutputs
from deliverykit.timing import repeat_runs

from . import MODEL_ID, tiny, upstream
from .generate import DEFAULT_MAX_PROMPT_LENGTH, Generation, ImageRequest, check_request, generate, prompt_token_count
from .loader import MANIFEST, ModelSource, check_weights_folder, load_pipeline
from .report import generation_report

if TYPE_CHECKING:
    import numpy as np

IMAGE_FORMATS = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG"}


def image_outputs(image: Path, report: str | None = None) -> RunOutputs:
    """One request's image and report file(s) (``report.json`` beside it, ``--report``): checked now (exit 6),
    written by :meth:`Session.write`."""
    return RunOutputs.declare({"image": image}, report)


@dataclasses.dataclass(frozen=True)
class Result:
    """The runs of one request: ``warmup`` untimed ones first, then the timed ones; the last one's image is written."""

    request: ImageRequest
    runs: list[Generation]
    warmup: int
    prompt_tokens: int

    @property
    def image(self) -> np.ndarray:
        return self.runs[-1].image


@dataclasses.dataclass(frozen=True)
class Session:
    """The pipeline on its device and what every report of this process records."""

    source: ModelSource
    pipe: Any
    device: Any
    dtype_name: str
    max_prompt_length: int
    weights: list[dict[str, Any]]
    random_weights: bool
    checkout: Path

    @classmethod
    def load(cls, source: ModelSource, stack: contextlib.ExitStack, device_spec: str | None) -> Session:
        """Load the downloaded folder (or a tiny random URSA written in the released layout) onto the device."""
        args = source.args
        device = devices.resolve_device(device_spec)
        dtype_name = args.dtype or devices.backend(device).default_dtype("fp16")
        folder, weights_files = source.folder, []
        if folder is not None and not folder.random_weights:
            weights_files = check_weights_for_loading(MANIFEST, folder.path, MODEL_ID, strict=args.strict_manifest)
        checkout = upstream.find_patched_upstream(args.upstream)
        classes = upstream.import_diffnext(checkout)
        if args.smoke:
            home = stack.enter_context(tempfile.TemporaryDirectory(prefix="ursa-smoke-"))
            os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here comes from the hub
            folder = check_weights_folder(tiny.write_tiny_weights(home, classes, variant=args.smoke, seed=0))
            weights_files = smoke_weights(folder.path)
        pipe = load_pipeline(folder, classes, cli.torch_dtype(dtype_name))
        pipe.set_progress_bar_config(disable=True)
        pipe.to(device)
        default_length = source.variant.max_prompt_length if source.variant else DEFAULT_MAX_PROMPT_LENGTH
        max_prompt_length = args.max_prompt_length or default_length
        record = weights_record(weights_files)
        return cls(source, pipe, device, dtype_name, max_prompt_length, record, folder.random_weights, checkout)

    @property
    def model(self) -> dict[str, Any]:
        """What was loaded, as the flags named it."""
        smoke = self.source.args.smoke
        return {"smoke": smoke, "weights": None if smoke else str(self.source.args.weights)}

    def default_request(self, prompt: str, steps: int | None = None) -> ImageRequest:
        return self.source.default_request(prompt, steps)

    def check(self, request: ImageRequest) -> None:
        """A request this model cannot make is refused (exit 2) before it runs."""
        check_request(request, self.source.stride)

    def run(self, request: ImageRequest, *, warmup: int = 0, runs: int = 1) -> Result:
        """Generate ``request`` ``warmup + runs`` times (``--bench``; once otherwise)."""
        prompt_tokens = prompt_token_count(self.pipe.tokenizer, request.prompt)
        if prompt_tokens > self.max_prompt_length:
            print(
                f"warning: the prompt has {prompt_tokens} tokens; the model reads only the first "
                f"{self.max_prompt_length} (--max-prompt-length), the rest is ignored",
                file=sys.stderr,
            )

        def once() -> Generation:
            return generate(self.pipe, request, device=self.device, max_prompt_length=self.max_prompt_length)

        generations = repeat_runs(once, warmup, runs)
        return Result(request, generations, warmup, prompt_tokens)

    def write(self, result: Result, outputs: RunOutputs) -> dict[str, Any]:
        """The image and its report(s) (:func:`image_outputs`), complete and together or not at all; returns the
        evidence."""
        image = outputs["image"]
        image_format = IMAGE_FORMATS[image.suffix.lower()]
        with outputs.commit() as commit:
            options = {"quality": 95} if image_format == "JPEG" else {}
            Image.fromarray(result.image).save(commit.files["image"], format=image_format, **options)
            evidence, commit.report = generation_report(self, result, image.name)
        return evidence
