#!/usr/bin/env python3
"""TRELLIS.2-4B image → textured 3D asset (GLB) on NPU, CUDA or CPU, through the patched microsoft/TRELLIS.2.

Runs the whole image → mesh pipeline on the patched upstream checkout (``--upstream DIR`` or ``$TRELLIS2_SRC``),
exports the textured asset.glb + preview.png (trellis2_npu.export) and writes mesh.ply, voxels.safetensors and
report.json to --output; KEY=VALUE evidence lines go to stdout:

    python trellis2-npu/inference.py --weights /data/TRELLIS.2-4B --image cat.png --pipeline 1024_cascade \
        --upstream /src/TRELLIS.2 --output out/
    python trellis2-npu/inference.py --smoke tiny --upstream /src/TRELLIS.2 --device cpu --output out/
    python trellis2-npu/inference.py --weights /data/TRELLIS.2-4B --upstream /src/TRELLIS.2 --batch photos/ \
        --output assets/    # many images, one load; resumable; torchrun / --devices 0,1,.. share it over cards

``--smoke`` (``tiny``) needs no weights: tiny random models of every stage, written in the released layout and loaded
back. The DINOv3 conditioning run alone (and its ``--smoke full``) is ``scripts/conditioning.py``.

Exit codes: 0 ok, 1 unexpected error, 2 bad arguments, 3 bad input image (or a decompression bomb; or one without
alpha and no background-removal model: --rembg-model, an RGBA image or --no-rembg) or upstream checkout (missing,
other commit, patches not applied), 4 bad weights (the background-removal folder's too), 5 device
unavailable, 6 an output cannot be written (a folder in the way, not writable, disk full), 7 NaN/Inf in the output,
9 a --batch ran but some requests failed (batch.json names them). Outputs are checked before any work and appear
together at the end, or not at all (no empty --output folder either).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path

from deliverykit import batch
from deliverykit import device as devices
from deliverykit.cli import add_batch_args, add_common_args, add_steps_and_report_args
from deliverykit.errors import ExitCode, InputError, run_main
from deliverykit.report import evidence_lines

PIPELINE_TYPES = ("512", "1024", "1024_cascade", "1536_cascade")
BATCH_FIELDS = {"image": str, "seed": int, "steps": int}
SMOKE_STEPS = 2


def add_export_args(parser: argparse.ArgumentParser) -> None:
    """The GLB export flags, the same here and in ``app.py`` (where they are the page's defaults)."""
    export_flags = parser.add_argument_group("GLB export")
    export_flags.add_argument(
        "--decimation-target",
        type=int,
        default=500_000,
        help="face budget of the simplification (default 500000, as upstream's app.py; at least 4)",
    )
    export_flags.add_argument(
        "--texture-size", type=int, default=2048, help="texture side, a power of two <= 8192 (default 2048)"
    )
    export_flags.add_argument(
        "--remesh",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="upstream's narrow-band dual-contouring remesh (closed, single-sided; inner shells dropped). Off by "
        "default (upstream's example.py/app.py turn it on): the remesh takes ~20 s on 1.3M faces, but the unwrap "
        "and bake of the remeshed surface take minutes on the CPU (README, GLB export)",
    )
    export_flags.add_argument(
        "--remesh-band", type=float, default=1.0, help="remesh offset in voxels, 0.25 to 4 (default 1)"
    )
    export_flags.add_argument(
        "--remesh-project",
        type=float,
        default=0.0,
        help="fraction 0 to 1 of the way remeshed vertices move back to the decoded surface (default 0)",
    )


def add_rembg_args(parser: argparse.ArgumentParser) -> None:
    """The background-removal flags, the same here and in ``app.py``: for an input image without alpha."""
    rembg_flags = parser.add_argument_group("background removal (images without alpha)")
    rembg_flags.add_argument(
        "--rembg-model",
        metavar="NAME_OR_DIR",
        help="BiRefNet-type folder, or RMBG-2.0 / BiRefNet under the weights root (default: <root>/RMBG-2.0, then "
        "<root>/BiRefNet; RMBG-2.0 is CC BY-NC 4.0, BiRefNet MIT); loaded from the folder only, never the hub",
    )
    rembg_flags.add_argument(
        "--no-rembg",
        action="store_true",
        help="use an image without alpha whole (no background removal; upstream's preprocessing without that step)",
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, smoke_choices=("tiny", "full"))
    parser.add_argument("--image", help="input image: RGBA with the object in alpha, or RGB (background removed)")
    parser.add_argument(
        "--pipeline",
        metavar="{512,1024,1024_cascade,1536_cascade}",
        help="pipeline type (default: pipeline.json's, 1024_cascade)",
    )
    parser.add_argument("--upstream", help="patched TRELLIS.2 checkout (default: $TRELLIS2_SRC)")
    add_rembg_args(parser)
    add_steps_and_report_args(
        parser,
        f"sampler steps for every flow stage (default: pipeline.json's; {SMOKE_STEPS} with --smoke)",
        "trellis2-npu/results/pipeline_tiny.json",
    )
    add_export_args(parser)
    add_batch_args(parser, inputs="one image path a line; or a folder of images")
    args = parser.parse_args(argv)
    if args.batch and (args.image or args.report):
        parser.error("--batch takes the images from its file, without --image or --report")
    if not args.batch and (args.devices or args.overwrite):
        parser.error("--devices and --overwrite go with --batch")
    if args.pipeline is not None and args.pipeline not in PIPELINE_TYPES:
        parser.error(f"--pipeline {args.pipeline}: unsupported; pick one of {', '.join(PIPELINE_TYPES)}")
    if args.smoke == "full":
        parser.error("--smoke full is the DINOv3-only smoke (scripts/conditioning.py); image → 3D has --smoke tiny")
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps {args.steps}: need at least 1")
    if args.no_rembg and args.rembg_model:
        parser.error("--no-rembg and --rembg-model exclude each other")
    if args.bench:
        parser.error("--bench times the DINOv3 conditioning forward: scripts/conditioning.py --bench")
    if not args.weights and not args.smoke:
        parser.error("pass --weights DIR (downloaded TRELLIS.2-4B folder) or --smoke tiny")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.devices:
        return batch.spawn_ranks(batch.parse_devices(args.devices), sys.argv if argv is None else [__file__, *argv])
    # torch, the upstream and the models: imported once the arguments are known good, so usage errors come at once
    from trellis2_npu import export, generate, image, loader, rembg, report, tiny, upstream
    from trellis2_npu.generate import declare_outputs

    started = time.perf_counter()
    # 1. Check inputs: every check that needs no model (export options, batch file, outputs, device, upstream, image).
    export.check_export_options(remesh=args.remesh, **generate.export_options(args))  # before minutes of pipeline
    items = None
    if args.batch:
        required = () if args.smoke else ("image",)
        items = batch.read_batch(
            args.batch, BATCH_FIELDS, required=required, text_field="image", image_field="image", check=_check_steps
        )
    single = None if items else declare_outputs(args.output, args.report)
    ranks = batch.Ranks.from_env()
    device = devices.resolve_device(batch.rank_device_spec(args.device, ranks))
    if args.dtype != "fp32":
        raise InputError(
            "--dtype: the full pipeline runs in the checkpoints' own dtypes; pass --dtype fp32", ExitCode.USAGE
        )
    checkout = upstream.find_patched_upstream(args.upstream)

    def prepared_image(path: str | None) -> tuple:
        if path is None and not args.smoke:
            raise InputError("the full pipeline needs --image FILE (RGBA, object in alpha, or RGB)", ExitCode.USAGE)
        picture = image.load_image(path) if path else tiny.tiny_image()
        return image.pipeline_input(picture, remove_background=not args.no_rembg)

    picture = prepared_image(args.image) if single else None
    weights_files = [] if args.smoke else loader.check_weights(args.weights, strict=args.strict_manifest)
    # Images without alpha go through upstream's background removal (unless --no-rembg), whose model is checked
    # here too: none (the smoke models have none) is one error line, exit 3, before the pipeline loads.
    needs_rembg = picture[1] if picture else any(image.needs_background_removal(i.fields.get("image")) for i in items)
    rembg_model = None
    if needs_rembg and not args.no_rembg:
        root = None if args.smoke else loader.main_folder(args.weights).parent
        rembg_model = rembg.require_rembg_model(rembg.find_rembg_model(args.rembg_model, root), root)
        weights_files = [*weights_files, *rembg.check_rembg_model(rembg_model, strict=args.strict_manifest)]

    with contextlib.ExitStack() as stack:
        # 2. Load once: the downloaded folders, or tiny random models written in the released layout; 3. prepare
        # what every request shares.
        default_steps = args.steps or (SMOKE_STEPS if args.smoke else None)
        session = generate.load_session(args, stack, device, checkout, weights_files, default_steps, rembg_model)

        # 4. Generate and 5. write, per request: its five files and report(s) together, or none.
        if single:
            evidence = generate.make_asset(
                session, picture, args.image, args.seed, session.default_steps, single, started
            )
            print("\n".join(evidence_lines(evidence, report.FULL_EVIDENCE_KEYS)))  # deliverykit's keys, then ours
            return 0

        def run_item(item: batch.BatchItem, folder: Path) -> dict:
            path, seed = item.fields.get("image"), item.fields.get("seed", args.seed)
            steps = item.fields.get("steps", session.default_steps)
            evidence = generate.make_asset(session, prepared_image(path), path, seed, steps, declare_outputs(folder))
            return {"wall_s": evidence["WALL_S"]}

        return batch.run_batch(items, run_item, args.output, overwrite=args.overwrite, ranks=ranks).exit_code


def _check_steps(fields: dict) -> None:
    if fields.get("steps", 1) < 1:
        raise InputError(f"steps {fields['steps']}: need at least 1", ExitCode.USAGE)


if __name__ == "__main__":
    sys.exit(run_main(main))
