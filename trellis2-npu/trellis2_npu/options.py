"""What one run asks for, from the command line (or ``app.py``'s and ``serve.py``'s start-up flags), checked before
anything loads.

The flag groups the front ends share (pipeline, GLB export, background removal), the texturing flags, and the checks
that need no model: the pipeline flags' and texturing's refusals (exit 2), the dtype, a ``--batch`` line's steps, and
which background-removal model an image without alpha needs (exit 3 when there is none). Imports no torch, so usage
errors come at once.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from deliverykit.errors import ExitCode, InputError

if TYPE_CHECKING:
    from .geometry.export import ExportOptions

PIPELINE_TYPES = ("512", "1024", "1024_cascade", "1536_cascade")  # upstream's pipeline_type values
DEFAULT_PIPELINE_TYPE = "1024_cascade"  # the released pipeline.json's default_pipeline_type
MEMORY_PLANS = ("none", "stage-offload")  # trellis2_npu.memory
MEMORY_CHOICES = ("auto", *MEMORY_PLANS)
BUILTIN_MESH = object()  # --mesh without a file: the tiny built-in mesh (--smoke only)
SMOKE_STEPS = 2  # sampler steps of every flow stage with --smoke (inference.py, app.py and serve.py)
STEPS_HELP = f"sampler steps for every flow stage (default: pipeline.json's; {SMOKE_STEPS} with --smoke)"
# refused with --mesh; not --remesh/--no-remesh, which a texturing run may pass either way (it never remeshes)
IMAGE_TO_3D_EXPORT_FLAGS = ("decimation_target", "remesh_band", "remesh_project")
FLAG_NAMES = {"decimation_target": "--faces/--decimation-target"}  # a flag whose option name is not its dest's


def add_pipeline_args(parser: argparse.ArgumentParser) -> None:
    """``--pipeline`` and ``--upstream``, the same in ``inference.py`` and ``serve.py`` (where ``--pipeline`` is the
    requests' default)."""
    parser.add_argument(
        "--pipeline",
        metavar="{" + ",".join(PIPELINE_TYPES) + "}",
        help=f"pipeline type (default: pipeline.json's, {DEFAULT_PIPELINE_TYPE})",
    )
    parser.add_argument("--upstream", help="patched TRELLIS.2 checkout (default: $TRELLIS2_SRC)")


def add_memory_args(parser: argparse.ArgumentParser) -> None:
    """``--memory``, the same in ``inference.py``, ``serve.py`` and ``app.py``: which models stay on the device."""
    parser.add_argument(
        "--memory",
        choices=MEMORY_CHOICES,
        default="auto",
        help="memory plan of the image → 3D pipeline: none (every model on the device), stage-offload (only the "
        "running stage's model there; the others in host memory, or on a CPU host read from disk when used); default "
        "auto: none where the device's free memory holds it, else stage-offload (README, Memory plans)",
    )
    parser.add_argument(
        "--max-num-tokens",
        type=token_count,
        help="a cascade's token budget (upstream's max_num_tokens): the output grid is lowered by 128 until the 1024 "
        "flows' tokens are below it, down to 1024; default: what the free memory holds, at most upstream's 49152",
    )


def token_count(text: str) -> int:
    """``--max-num-tokens``' type: a whole number of at least 1 (every front end refuses the rest as it parses)."""
    value = int(text)  # not a number: argparse's "invalid token_count value"
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: need at least 1")
    return value


def unsupported_pipeline(pipeline_type: str) -> str | None:
    """The refusal of a pipeline type upstream does not have (the flag's, or a served request's), else None."""
    if pipeline_type in PIPELINE_TYPES:
        return None
    return f"--pipeline {pipeline_type}: unsupported; pick one of {', '.join(PIPELINE_TYPES)}"


def check_model_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The usage errors (exit 2) ``inference.py`` and ``serve.py`` share: pipeline type, steps, background removal,
    and a model to load."""
    refused = None if args.pipeline is None else unsupported_pipeline(args.pipeline)
    if refused:
        parser.error(refused)
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps {args.steps}: need at least 1")
    if args.no_rembg and args.rembg_model:
        parser.error("--no-rembg and --rembg-model exclude each other")
    if not args.weights and not args.smoke:
        parser.error("pass --weights DIR (downloaded TRELLIS.2-4B folder) or --smoke {tiny,full}")


def add_export_args(parser: argparse.ArgumentParser) -> None:
    """The GLB export flags, the same here and in ``app.py`` (where they are the page's defaults)."""
    export_flags = parser.add_argument_group("GLB export")
    export_flags.add_argument(
        "--faces",
        "--decimation-target",
        dest="decimation_target",
        type=int,
        default=500_000,
        metavar="N",
        help="face budget of the exported mesh: the simplification's target (default 500000, as upstream's app.py; at "
        "least 4; --decimation-target is upstream's name for it)",
    )
    export_flags.add_argument(
        "--texture-size", type=int, default=2048, help="texture side, a power of two <= 8192 (default 2048)"
    )
    export_flags.add_argument(
        "--remesh",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="upstream's narrow-band dual-contouring remesh (closed, single-sided; inner shells dropped). On by "
        "default, as upstream's example.py/app.py; --no-remesh exports the decoded surface as it is (open, "
        "double-sided; about half the export time on the CPU: README, GLB export)",
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
    export_flags.add_argument(
        "--preview-frames",
        type=int,
        default=60,
        help="frames of preview.mp4, the asset turning once at 15 fps, 256² (default 60; 0: no video; up to 600)",
    )


def export_options(args: argparse.Namespace) -> ExportOptions:
    """The GLB export flags as one value: every request's options (``app.py``: the page's defaults)."""
    from .geometry.export import ExportOptions

    return ExportOptions(args.decimation_target, args.texture_size, args.remesh, args.remesh_band, args.remesh_project)


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


def add_texturing_args(parser: argparse.ArgumentParser) -> None:
    """``--mesh`` and ``--resolution``: texturing an existing mesh instead of generating one."""
    texturing_flags = parser.add_argument_group("texturing an existing mesh (texturing_pipeline.json)")
    texturing_flags.add_argument(
        "--mesh",
        nargs="?",
        const=BUILTIN_MESH,
        metavar="FILE",
        help="texture this mesh (.glb, .gltf, .obj, .ply) from --image instead of generating one; "
        "with --smoke and no FILE, a built-in tiny mesh",
    )
    texturing_flags.add_argument(
        "--resolution", type=int, help="texturing voxel grid: 512, 1024 or 1536 (default 1024; 64 with --smoke)"
    )


def check_texturing_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--mesh keeps the given surface: the image → 3D pipeline and export flags make no sense with it."""
    if args.mesh is BUILTIN_MESH and not args.smoke:
        parser.error("--mesh needs a mesh file (.glb, .gltf, .obj, .ply); the built-in tiny mesh goes with --smoke")
    if args.batch or args.pipeline:
        parser.error("--mesh textures one mesh; --batch and --pipeline are image → 3D flags")
    if args.smoke == "full":
        parser.error("--smoke full is the image → 3D pipeline at released sizes; texturing has --smoke tiny")
    if args.memory != parser.get_default("memory"):
        parser.error(
            f"--memory {args.memory}: the plans are the image → 3D pipeline's; texturing keeps upstream's placement "
            "(only the running stage's model on the device)"
        )
    changed = [name for name in IMAGE_TO_3D_EXPORT_FLAGS if getattr(args, name) != parser.get_default(name)]
    if changed:
        flags = ", ".join(FLAG_NAMES.get(name, "--" + name.replace("_", "-")) for name in changed)
        parser.error(f"{flags}: the texturing pipeline keeps the mesh as given (no remesh or simplification)")


def check_dtype(args: argparse.Namespace) -> None:
    """Both pipelines run in the checkpoints' own dtypes: only ``--dtype fp32`` (the default) is accepted."""
    if args.dtype != "fp32":
        raise InputError(
            "--dtype: the full pipeline runs in the checkpoints' own dtypes; pass --dtype fp32", ExitCode.USAGE
        )


def rembg_model(args: argparse.Namespace, needs_rembg: bool, weights_files: list) -> tuple:
    """The background-removal model an image without alpha needs (checked, its records added to ``weights_files``):
    none (the smoke models have none) is one error line, exit 3, before the pipeline loads."""
    if not needs_rembg or args.no_rembg:
        return None, weights_files
    from . import loader, rembg

    root = None if args.smoke else loader.main_folder(args.weights).parent
    rembg_model = rembg.require_rembg_model(rembg.find_rembg_model(args.rembg_model, root), root)
    return rembg_model, [*weights_files, *rembg.check_rembg_model(rembg_model, strict=args.strict_manifest)]


def check_steps(fields: dict) -> None:
    """A ``--batch`` line's ``steps``, checked like ``--steps``."""
    if fields.get("steps", 1) < 1:
        raise InputError(f"steps {fields['steps']}: need at least 1", ExitCode.USAGE)
