#!/usr/bin/env python3
"""URSA-1.7B-IBQ512 text → image on NPU, CUDA or CPU, through the patched baaivision/URSA (``diffnext``).

    python ursa-npu/inference.py --upstream ~/src/URSA --weights ~/weights/URSA-1.7B-IBQ512 \
        --prompt "a red fox in the snow" --output out.jpg
    python ursa-npu/inference.py --upstream ~/src/URSA --smoke --device cpu --output out.jpg
    python ursa-npu/inference.py --upstream ~/src/URSA --weights DIR --batch prompts.jsonl --output images/
    torchrun --nproc-per-node 8 ursa-npu/inference.py ... --batch prompts.txt --output images/

``--upstream`` (or ``$URSA_SRC``) is a checkout of the pinned commit with ``ursa-npu/patches`` applied
(``python -m deliverykit upstream clone --delivery ursa-npu --into DIR`` makes one). ``--smoke [tiny|tiny512]``
needs no weights: a tiny URSA with seeded random weights is written in the real layout and loaded back. The image
and ``report.json`` beside it appear together or not at all; KEY=VALUE evidence lines go to stdout.

``--batch FILE``: JSON Lines with the fields ``prompt``, ``negative_prompt``, ``seed``, ``steps``, ``guidance``,
``height``, ``width``, ``output`` (the flags give the defaults), or plain text, one prompt a line. The model loads
once; each request writes ``OUTPUT/<name>/<name>.jpg`` and its ``report.json``; a rerun skips completed requests
(``--overwrite`` redoes them); ranks (torchrun, or ``--devices 0,1,2,3``) share the requests; with ``--ray ADDRESS``
(``auto``: this host's cluster) every device of a Ray cluster does, one actor each (README, "Many hosts").

Exit codes: 0 ok, 1 unexpected error, 2 bad arguments (including a height/width the VQ model cannot make, such as
0, a prompt that is not UTF-8, and a bad line of a --batch file, named FILE:LINE), 3 upstream checkout missing, at
another commit or unpatched, 4 weights folder incomplete or unloadable, 5 device unavailable, 6 an output cannot be
written (a folder in the way, not writable, disk full), 9 a batch ran but some requests failed (batch.json).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import typing
from collections.abc import Callable
from pathlib import Path

from deliverykit import batch, cli, cluster
from deliverykit.errors import ExitCode, run_main
from deliverykit.report import evidence_lines
from ursa_npu import options
from ursa_npu.generate import DEFAULT_GUIDANCE, DEFAULT_SIZE, DEFAULT_STEPS, ImageRequest, check_request
from ursa_npu.loader import ModelSource
from ursa_npu.options import SMOKE_PROMPT
from ursa_npu.report import EVIDENCE_KEYS
from ursa_npu.session import IMAGE_FORMATS, Session, image_outputs
from ursa_npu.tiny import SMOKE_STEPS

BATCH_FIELDS = typing.get_type_hints(ImageRequest)  # a --batch line sets any field of a request


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    options.add_model_args(parser)
    cli.add_run_args(
        parser,
        output_help="image file to write (.jpg, .jpeg or .png; report.json goes beside it); with --batch, a folder",
    )
    cli.add_batch_args(parser)
    parser.add_argument("--prompt", help="text prompt (default with --smoke: a fixed test prompt)")
    parser.add_argument("--negative-prompt", default="", help="negative prompt (default: empty, as upstream)")
    cli.add_steps_and_report_args(
        parser, f"sampling steps (default {DEFAULT_STEPS}, {SMOKE_STEPS} with --smoke)", "ursa-npu/results/x.json"
    )
    parser.add_argument(
        "--guidance", type=float, default=DEFAULT_GUIDANCE, help="classifier-free guidance scale (default 7)"
    )
    for side in ("height", "width"):
        parser.add_argument(f"--{side}", type=int, help=f"{side}, a multiple of the VQ stride (default {DEFAULT_SIZE})")
    args = parser.parse_args(argv)
    options.check_model_args(parser, args)
    if args.batch and (args.prompt or args.bench or args.report):
        parser.error("--batch takes the prompts from its file, without --prompt, --bench or --report")
    cli.check_batch_args(parser, args)
    if not (args.prompt or args.smoke or args.batch):
        parser.error("--prompt is required with --weights")
    if not args.batch and Path(args.output).suffix.lower() not in IMAGE_FORMATS:
        parser.error(f"--output {args.output}: use a .jpg, .jpeg or .png file name")
    cli.check_counts(parser, args, positive=("steps",))
    cli.check_utf8(args, ("prompt", "negative_prompt"))
    return args


def checked_default(args: argparse.Namespace) -> tuple[ModelSource, ImageRequest]:
    """The model and the request of the flags, checked: all that needs no model (a bad input fails in a second, not
    after loading 4 GB)."""
    model = ModelSource.check(args)
    default = dataclasses.replace(
        model.default_request(args.prompt or SMOKE_PROMPT, args.steps),
        negative_prompt=args.negative_prompt,
        seed=args.seed,
        guidance=args.guidance,
        height=model.size if args.height is None else args.height,  # --height 0 is an error, not the default
        width=model.size if args.width is None else args.width,
    )
    check_request(default, model.stride)
    return model, default


def item_maker(session: Session, default: ImageRequest) -> Callable[[batch.BatchItem, Path], dict]:
    """One --batch request (its fields over the flags') into its folder: the image and its report.json."""

    def run_item(item: batch.BatchItem, folder_path: Path) -> dict:
        request = dataclasses.replace(default, **item.fields)
        evidence = session.write(session.run(request), image_outputs(folder_path / f"{item.name}.jpg"))
        return {"total_ms": evidence["TOTAL_MS"]}

    return run_item


def batch_worker(argv: list[str], device: str, stack: contextlib.ExitStack) -> Callable[[batch.BatchItem, Path], dict]:
    """What a Ray actor runs for ``--batch --ray`` (``deliverykit.cluster``): the model of ``argv`` on ``device``."""
    model, default = checked_default(parse_args(argv))
    return item_maker(Session.load(model, stack, device), default)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.devices:
        return batch.spawn_ranks(batch.parse_devices(args.devices), sys.argv if argv is None else [__file__, *argv])

    # 1. Check the inputs, all that needs no model.
    model, default = checked_default(args)

    def check(fields: dict) -> None:  # one --batch line over the flags
        check_request(dataclasses.replace(default, **fields), model.stride)

    items = batch.read_batch(args.batch, BATCH_FIELDS, required=("prompt",), check=check) if args.batch else None
    if args.ray:  # the cluster's actors load the model, each on its device
        return cluster.run_from_args(items, args, __file__, argv)
    single = None if items else image_outputs(Path(args.output), args.report)
    ranks = batch.Ranks.from_env()

    with contextlib.ExitStack() as stack:
        # 2 and 3. Load and prepare, once.
        session = Session.load(model, stack, batch.rank_device_spec(args.device, ranks))

        # 4 and 5, per request: generate, then write all its outputs or none.
        if single:
            warmup, runs = (args.warmup, args.runs) if args.bench else (0, 1)
            evidence = session.write(session.run(default, warmup=warmup, runs=runs), single)
            print("\n".join(evidence_lines(evidence, EVIDENCE_KEYS)))  # deliverykit's documented keys, then ours
            return int(ExitCode.OK)
        run_item = item_maker(session, default)
        return batch.run_batch(items, run_item, args.output, overwrite=args.overwrite, ranks=ranks).exit_code


if __name__ == "__main__":
    sys.exit(run_main(main))
