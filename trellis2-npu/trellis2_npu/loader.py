"""Loading: DINOv3 from its downloaded folder, and the whole TRELLIS.2 pipeline through the patched upstream, each
refused before any work when its weights are missing, of another model, truncated or not the pinned release.

DINOv3 (the conditioning model) is checked by :func:`check_weights_folder` and loaded strictly by :func:`load_dinov3`;
the full pipeline's folders are checked against the manifest by :func:`check_weights` and built by
:func:`load_pipeline` with upstream's ``from_pretrained`` (patched to load strictly, :mod:`.hooks`).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from transformers import DINOv3ViTModel

from deliverykit.assets.loadcheck import check_models_for_loading
from deliverykit.assets.manifest import load_manifest
from deliverykit.device import half_compute_dtype
from deliverykit.errors import WeightsError

from . import precision
from .dinov3 import MODEL_ID, MODEL_TYPE, RANDOM_WEIGHTS_METADATA_KEY, WEIGHTS_FILE
from .offload import lazy_model_loading

DELIVERY_DIR = Path(__file__).resolve().parent.parent
MANIFEST = DELIVERY_DIR / "weights-manifest.json"
MAIN_MODEL = "microsoft/TRELLIS.2-4B"
AUXILIARY_MODELS = ("microsoft/TRELLIS-image-large", "facebook/dinov3-vitl16-pretrain-lvd1689m")


def download_hint(weights_dir: str | os.PathLike) -> str:
    return (
        f"download {MODEL_ID} into it (deliverykit weights download --manifest trellis2-npu/weights-manifest.json "
        f"--root <weights root>) or run with --smoke"
    )


def check_weights_folder(weights_dir: str | os.PathLike) -> Path:
    """Fail fast, with one line, on a folder that cannot hold DINOv3 weights: missing, wrong model, bad file.

    ``safe_open`` parses the safetensors header and checks it against the file length, so a truncated or
    corrupt file is caught here instead of as a cryptic error (or silently random weights) later.
    """
    folder = Path(weights_dir)
    if not folder.is_dir():
        raise WeightsError(f"weights folder {folder} does not exist; {download_hint(folder)}")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise WeightsError(f"{config_path} is missing; {download_hint(folder)}")
    try:
        model_type = json.loads(config_path.read_text(encoding="utf-8")).get("model_type")
    except (ValueError, AttributeError) as err:
        raise WeightsError(f"{config_path} is not a valid JSON config ({err}); {download_hint(folder)}") from err
    if model_type != MODEL_TYPE:
        raise WeightsError(
            f"{config_path} describes model_type {model_type!r}, expected {MODEL_TYPE!r} ({MODEL_ID}); "
            "point --weights at the DINOv3 folder"
        )
    weights_path = folder / WEIGHTS_FILE
    if not weights_path.is_file():
        raise WeightsError(f"{weights_path} is missing; {download_hint(folder)}")
    try:
        with safe_open(weights_path, framework="pt") as handle:
            handle.keys()
    except (SafetensorError, OSError, ValueError) as err:
        raise WeightsError(f"{weights_path} is truncated or corrupt ({err}); {download_hint(folder)}") from err
    return folder


def weights_are_random(weights_dir: str | os.PathLike) -> bool:
    """True when the file was written by :func:`trellis2_npu.tiny.save_random_dinov3` (it says so in its header)."""
    with safe_open(Path(weights_dir) / WEIGHTS_FILE, framework="pt") as handle:
        return (handle.metadata() or {}).get(RANDOM_WEIGHTS_METADATA_KEY) == "true"


def load_dinov3(
    weights_dir: str | os.PathLike, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
) -> DINOv3ViTModel:
    """Load DINOv3 from a local folder, strictly: any missing, unexpected or mis-shaped key fails the load.

    transformers only warns about missing keys and leaves them randomly initialised; for a delivery that would
    be a silently wrong model, so the loading info is checked here.
    """
    folder = check_weights_folder(weights_dir)
    try:
        model, info = DINOv3ViTModel.from_pretrained(
            folder, local_files_only=True, output_loading_info=True, dtype=dtype
        )
    except (OSError, ValueError, RuntimeError) as err:
        raise WeightsError(f"cannot load {folder} as {MODEL_ID} ({err}); {download_hint(folder)}") from err
    problems = {
        kind: sorted(info.get(kind) or [])
        for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")
    }
    problems = {kind: keys for kind, keys in problems.items() if keys}
    if problems:
        summary = "; ".join(f"{kind}: {', '.join(map(str, keys[:3]))}" for kind, keys in problems.items())
        raise WeightsError(
            f"{folder}/{WEIGHTS_FILE} does not match the DINOv3 architecture ({summary}): it holds another model's "
            f"tensors or an incomplete file; {download_hint(folder)}"
        )
    return model.to(device).eval()


def main_folder(weights_dir: str | os.PathLike) -> Path:
    """The ``TRELLIS.2-4B`` folder (with ``pipeline.json``): ``weights_dir`` itself or its ``TRELLIS.2-4B``."""
    folder = Path(weights_dir)
    if not (folder / "pipeline.json").is_file() and (folder / "TRELLIS.2-4B" / "pipeline.json").is_file():
        folder = folder / "TRELLIS.2-4B"
    if not (folder / "pipeline.json").is_file():
        raise WeightsError(
            f"{weights_dir} has no pipeline.json; download the weights with: deliverykit weights download "
            f"--manifest {DELIVERY_DIR.name}/weights-manifest.json --root ROOT, then pass --weights ROOT/TRELLIS.2-4B"
        )
    return folder


def check_weights(weights_dir: str | os.PathLike, *, strict: bool = False) -> list[Any]:
    """The manifest check (:mod:`deliverykit.assets.loadcheck`) of every model the run loads, before loading any.

    The main folder always; the auxiliary models where the download puts them, ``<root>/<local_dir>``. One found
    elsewhere is left to the loader's own checks. The background-removal model is :mod:`.rembg`'s.
    """
    folder = main_folder(weights_dir)
    wanted = AUXILIARY_MODELS
    models = [(folder, MAIN_MODEL)] + [
        (folder.parent / model.local_dir, model.id)
        for model in load_manifest(MANIFEST, validate=False).models
        if model.id in wanted and (folder.parent / model.local_dir).is_dir()
    ]
    return check_models_for_loading(MANIFEST, models, strict=strict)


TEXTURING_CONFIG = "texturing_pipeline.json"


def texturing_folder(weights_dir: str | os.PathLike) -> Path:
    """The ``TRELLIS.2-4B`` folder, refused (exit 4) before loading when it has no ``texturing_pipeline.json``."""
    folder = main_folder(weights_dir)
    if not (folder / TEXTURING_CONFIG).is_file():
        raise WeightsError(
            f"{folder} has no {TEXTURING_CONFIG} (texturing needs it and ckpts/shape_enc_next_dc_f16c32_fp16.*); "
            f"download them with: deliverykit weights download --manifest {DELIVERY_DIR.name}/weights-manifest.json "
            "--root ROOT --all-files"
        )
    return folder


def load_pipeline(
    weights_dir: str | os.PathLike,
    device: torch.device,
    pipeline_class,
    config_file: str = "pipeline.json",
    offload: bool = False,
) -> Any:
    """Upstream's ``from_pretrained`` on a local folder, strictly, then moved to ``device``; with ``offload`` the
    large models are loaded when a stage uses them and freed after (:mod:`.offload`).

    ``weights_dir`` is the ``TRELLIS.2-4B`` folder (with ``pipeline.json``) or the root above it; models referenced
    by hub id (``microsoft/TRELLIS-image-large/...``, DINOv3) are looked up next to it (``<root>/<repo>``).
    ``config_file``: ``pipeline.json`` (image → 3D) or ``texturing_pipeline.json``; only the models the class loads
    (its ``model_names_to_load``, when it has one) must be present.
    """
    folder = main_folder(weights_dir)
    set_model_roots([folder.parent])
    references = json.loads((folder / config_file).read_text(encoding="utf-8"))["args"]["models"]
    wanted = getattr(pipeline_class, "model_names_to_load", None)
    absent = [
        ref
        for key, ref in references.items()
        if (wanted is None or key in wanted) and resolve_model_path(ref, base=folder) is None
    ]
    if absent:
        raise WeightsError(
            f"{folder}: checkpoints not found: {', '.join(absent)} (looked in {folder} and {folder.parent})"
        )
    from trellis2 import models  # the patched upstream, imported with pipeline_class

    with contextlib.ExitStack() as stack:
        if half_compute_dtype(device) == torch.float32:  # entered first: the offloaded models build in it
            stack.enter_context(precision.fp32_half_models(models))
        if offload:
            stack.enter_context(lazy_model_loading(models))
        pipeline = pipeline_class.from_pretrained(str(folder), config_file=config_file)
    pipeline.to(device)
    return pipeline


_model_roots: list[Path] = []


def set_model_roots(roots: Sequence[str | os.PathLike]) -> None:
    """Folders where hub ids ``org/repo[/sub/path]`` are looked up as ``<root>/repo[/sub/path]``."""
    _model_roots[:] = [Path(root) for root in roots]


def resolve_model_path(name: str, base: str | os.PathLike | None = None) -> str | None:
    """A local path for upstream's model reference ``name``, or None to let upstream use the hub.

    Tried in order: ``<base>/<name>`` (upstream's own rule), ``name`` itself, then for a hub id ``org/repo/rest``
    ``<root>/repo/rest`` for each root of :func:`set_model_roots` and ``base``'s parent (the layout of
    ``deliverykit weights download``: ``<root>/TRELLIS.2-4B``, ``<root>/TRELLIS-image-large``, ...).
    """
    candidates = []
    if base is not None:
        candidates.append(Path(base) / name)
    candidates.append(Path(name))
    parts = name.split("/")
    roots = [*_model_roots, *([Path(base).parent] if base is not None else [])]
    if len(parts) >= 2:
        candidates += [root.joinpath(*parts[1:]) for root in roots]
    for candidate in candidates:
        if candidate.is_dir() or Path(f"{candidate}.json").is_file():
            return str(candidate)
    return None
