#!/usr/bin/env python3
"""TRELLIS.2-4B image → textured 3D asset (GLB) on NPU, CUDA or CPU, through the patched microsoft/TRELLIS.2.

Runs the whole image → mesh pipeline on the patched upstream checkout (``--upstream DIR`` or ``$TRELLIS2_SRC``),
exports the textured asset.glb + preview.png + preview.mp4 (a turntable video; trellis2_npu.geometry.export,
.turntable) and
writes mesh.ply, voxels.safetensors and report.json to --output; KEY=VALUE evidence lines go to stdout:

    python trellis2-npu/inference.py --weights ~/weights/TRELLIS.2-4B --image cat.png --pipeline 1024_cascade \
        --upstream ~/src/TRELLIS.2 --output out/
    python trellis2-npu/inference.py --smoke tiny --upstream ~/src/TRELLIS.2 --device cpu --output out/
    python trellis2-npu/inference.py --smoke full --pipeline 512 --steps 1 --upstream ~/src/TRELLIS.2 --output out/
    python trellis2-npu/inference.py --weights ~/weights/TRELLIS.2-4B --upstream ~/src/TRELLIS.2 --batch photos/ \
        --output assets/    # many images, one load; resumable; torchrun / --devices 0,1,.. share it over cards

Texturing an existing mesh (upstream's Trellis2TexturingPipeline, ``texturing_pipeline.json``): ``--mesh FILE``
(.glb, .gltf, .obj, .ply) with ``--image``, writes asset.glb, preview.png, preview.mp4, voxels.safetensors and
report.json:

    python trellis2-npu/inference.py --weights ~/weights/TRELLIS.2-4B --mesh chair.glb --image chair.png \
        --upstream ~/src/TRELLIS.2 --output out/
    python trellis2-npu/inference.py --smoke tiny --mesh --upstream ~/src/TRELLIS.2 --device cpu --output out/

``--smoke`` needs no weights: random models of every stage, written in the released layout and loaded back; ``tiny``
at tiny widths (seconds; with ``--mesh`` and no file: a built-in tiny mesh), ``full`` at the released sizes
(trellis2_npu.full_size: ≈ 11 GB written to a temporary folder, tens of minutes on a CPU). ``--memory`` says which
models stay on the device (trellis2_npu.memory): by default all of them where the free device memory holds them,
else only the running stage's; on a CPU the large models are loaded per stage and freed after
(trellis2_npu.offload). The DINOv3 conditioning run alone is ``scripts/conditioning.py``.

Exit codes: 0 ok, 1 unexpected error, 2 bad arguments, 3 bad input image (or a decompression bomb; or one without
alpha and no background-removal model: --rembg-model, an RGBA image or --no-rembg), bad input mesh (missing,
unreadable, other format, no faces, NaN/Inf) or upstream checkout (missing, other commit, patches not applied), 4
bad weights (the background-removal folder's too; texturing_pipeline.json missing), 5 device unavailable, 6 an
output cannot be written (a folder in the way, not writable, disk full), 7 NaN/Inf in the output, 9 a --batch ran
but some requests failed (batch.json names them). ``--batch --ray ADDRESS`` (``auto``: this host's cluster) spreads
the requests over every device of a Ray cluster, one actor each (README, "Many hosts"). Outputs are checked before
any work and appear together at the end, or not at all (no empty --output folder either).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deliverykit import batch
from deliverykit import device as devices
from deliverykit.cli import add_batch_args, add_common_args, add_steps_and_report_args, check_batch_args
from deliverykit.errors import ExitCode, InputError, run_main
from deliverykit.report import evidence_lines
from trellis2_npu import options

BATCH_FIELDS = {"image": str, "seed": int, "steps": int}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, smoke_choices=("tiny", "full"))
    parser.add_argument("--image", help="input image: RGBA with the object in alpha, or RGB (background removed)")
    options.add_pipeline_args(parser)
    options.add_memory_args(parser)
    options.add_rembg_args(parser)
    add_steps_and_report_args(parser, options.STEPS_HELP, "trellis2-npu/results/pipeline_tiny.json")
    options.add_export_args(parser)
    add_batch_args(parser, inputs="one image path a line; or a folder of images")
    options.add_texturing_args(parser)
    args = parser.parse_args(argv)
    if args.mesh is not None:
        options.check_texturing_args(parser, args)
    elif args.resolution is not None:
        parser.error("--resolution is the texturing grid; it goes with --mesh")
    if args.batch and (args.image or args.report):
        parser.error("--batch takes the images from its file, without --image or --report")
    check_batch_args(parser, args)
    if args.bench:
        parser.error("--bench times the DINOv3 conditioning forward: scripts/conditioning.py --bench")
    options.check_model_args(parser, args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.mesh is not None:
        return texture_mesh(args)
    if args.devices:
        return batch.spawn_ranks(batch.parse_devices(args.devices), sys.argv if argv is None else [__file__, *argv])
    # torch, the upstream and the models: imported once the arguments are known good, so usage errors come at once
    from trellis2_npu import report
    from trellis2_npu.session import Session, asset_outputs

    started = time.perf_counter()
    # 1. Check inputs: every check that needs no model (export options, batch file, outputs, device, upstream, image).
    items = read_items(args)
    if items and args.ray:  # the cluster's actors load the models, each on its device
        from deliverykit import cluster

        return cluster.run_from_args(items, args, __file__, argv)
    single = None if items else asset_outputs(args.output, args.report, video=args.preview_frames > 0)
    ranks = batch.Ranks.from_env()
    device = devices.resolve_device(batch.rank_device_spec(args.device, ranks))
    picture = prepared_image(args, args.image) if single else None
    checked = checked_before_loading(args, items, picture)

    with contextlib.ExitStack() as stack:
        # 2. Load once: the downloaded folders, or tiny random models written in the released layout; 3. prepare
        # what every request shares.
        session = Session.load(args, stack, device, checked)

        # 4. Generate and 5. write, per request: its files and report(s) together, or none.
        if single:
            asset = session.run(session.request(picture, args.image, args.seed), started)
            evidence = session.write(asset, single)
            print("\n".join(evidence_lines(evidence, report.FULL_EVIDENCE_KEYS)))  # deliverykit's keys, then ours
            return 0
        run_item = item_maker(args, session)
        return batch.run_batch(items, run_item, args.output, overwrite=args.overwrite, ranks=ranks).exit_code


def read_items(args: argparse.Namespace) -> list[batch.BatchItem] | None:
    """The export options and the ``--batch`` file checked whole (None without ``--batch``), before minutes of
    pipeline."""
    from trellis2_npu.geometry import turntable

    options.export_options(args).check()
    turntable.check_preview_frames(args.preview_frames)
    if not args.batch:
        return None
    required = () if args.smoke else ("image",)
    return batch.read_batch(
        args.batch, BATCH_FIELDS, required=required, text_field="image", image_field="image", check=options.check_steps
    )


def prepared_image(args: argparse.Namespace, path: str | None) -> tuple:
    """``path`` (or with ``--smoke`` the tiny test image) as the pipeline takes it."""
    from trellis2_npu import image, tiny

    if path is None and not args.smoke:
        raise InputError("the full pipeline needs --image FILE (RGBA, object in alpha, or RGB)", ExitCode.USAGE)
    picture = image.load_image(path) if path else tiny.tiny_image()
    return image.pipeline_input(picture, remove_background=not args.no_rembg)


def checked_before_loading(args: argparse.Namespace, items: list | None, picture: tuple | None) -> Any:
    """The upstream checkout, the weights and, for images without alpha, the background-removal model (unless
    --no-rembg): none (the smoke models have none) is one error line, exit 3, before the pipeline loads."""
    from trellis2_npu import image, loader, upstream
    from trellis2_npu.session import Checked

    options.check_dtype(args)
    checkout = upstream.find_patched_upstream(args.upstream)
    weights_files = [] if args.smoke else loader.check_weights(args.weights, strict=args.strict_manifest)
    needs_rembg = picture[1] if picture else any(image.needs_background_removal(i.fields.get("image")) for i in items)
    rembg_model, weights_files = options.rembg_model(args, needs_rembg, weights_files)
    pipeline_type = args.pipeline or options.DEFAULT_PIPELINE_TYPE  # the memory plan covers this one alone
    return Checked(checkout, weights_files, rembg_model, pipeline_types=(pipeline_type,))


def item_maker(args: argparse.Namespace, session: Any) -> Callable[[batch.BatchItem, Path], dict]:
    """One --batch request (its image, seed, steps over the flags') into its folder, with its report.json."""
    from trellis2_npu.session import asset_outputs

    def run_item(item: batch.BatchItem, folder: Path) -> dict:
        path, seed = item.fields.get("image"), item.fields.get("seed", args.seed)
        files = asset_outputs(folder, video=args.preview_frames > 0)
        asset = session.run(session.request(prepared_image(args, path), path, seed, item.fields.get("steps")))
        return {"wall_s": session.write(asset, files)["WALL_S"]}

    return run_item


def batch_worker(argv: list[str], device: str, stack: contextlib.ExitStack) -> Callable[[batch.BatchItem, Path], dict]:
    """What a Ray actor runs for ``--batch --ray`` (``deliverykit.cluster``): the models of ``argv`` on ``device``."""
    from trellis2_npu.session import Session

    args = parse_args(argv)
    items = read_items(args)
    session = Session.load(args, stack, devices.resolve_device(device), checked_before_loading(args, items, None))
    return item_maker(args, session)


def texture_mesh(args: argparse.Namespace) -> int:
    """``--mesh``: texture an existing mesh from ``--image`` with upstream's texturing pipeline, in main's steps."""
    from trellis2_npu import generate, image, loader, report, tiny, upstream
    from trellis2_npu.geometry import mesh_io, turntable
    from trellis2_npu.session import Checked, TexturingSession, asset_outputs

    started = time.perf_counter()
    # 1. Check inputs: options, outputs, device, mesh, image, weights, upstream, background removal.
    resolution = generate.check_texturing_options(args.resolution, bool(args.smoke), args.texture_size)
    turntable.check_preview_frames(args.preview_frames)
    files = asset_outputs(args.output, args.report, TexturingSession.FILES, video=args.preview_frames > 0)
    device = devices.resolve_device(args.device)
    options.check_dtype(args)
    if args.image is None and not args.smoke:
        raise InputError("texturing needs --image FILE (RGBA, object in alpha, or RGB) with --mesh", ExitCode.USAGE)
    mesh = tiny.tiny_mesh() if args.mesh is options.BUILTIN_MESH else mesh_io.read_mesh(args.mesh)
    picture = image.load_image(args.image) if args.image else tiny.tiny_image()
    picture = image.pipeline_input(picture, remove_background=not args.no_rembg)
    weights_files = []
    if not args.smoke:
        loader.texturing_folder(args.weights)
        weights_files = loader.check_weights(args.weights, strict=args.strict_manifest)
    checkout = upstream.find_patched_upstream(args.upstream)
    rembg_model, weights_files = options.rembg_model(args, picture[1], weights_files)

    with contextlib.ExitStack() as stack:
        # 2. Load once and 3. prepare: texturing_pipeline.json's models (or tiny random ones in the released layout).
        session = TexturingSession.load(args, stack, device, Checked(checkout, weights_files, rembg_model), resolution)
        # 4. Texture and 5. write asset.glb, preview.png, preview.mp4, voxels.safetensors and report.json together,
        # or none.
        names = ("tiny built-in mesh" if args.mesh is options.BUILTIN_MESH else args.mesh,
                 args.image or "tiny RGBA test image")  # fmt: skip
        asset = session.run(session.request(mesh, picture, names, args.seed), started)
        evidence = session.write(asset, files)
    print("\n".join(evidence_lines(evidence, report.TEXTURING_EVIDENCE_KEYS)))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
