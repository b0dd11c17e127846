"""Checking a URSA weights folder and loading it component by component, without running code from the folder.

A hub URSA folder may name its components by custom-code shims (NOVA style, ``trust_remote_code=True``); one
written by the patched ``save_pretrained`` names diffnext modules. Either way only the **class names** in
``model_index.json`` are read: each component is built from the patched diffnext class (or ``AutoTokenizer``) with
its own ``from_pretrained``, locally, so ``trust_remote_code`` is never needed and nothing in the folder is executed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from deliverykit.errors import WeightsError

from . import tiny
from .generate import DEFAULT_GUIDANCE, DEFAULT_SIZE, DEFAULT_STEPS, ImageRequest
from .tiny import RANDOM_WEIGHTS_MARKER

if TYPE_CHECKING:  # torch arrives with the model: inference.py checks the folder before it imports torch
    import torch

MANIFEST = Path(__file__).resolve().parents[1] / "weights-manifest.json"

# component -> (class model_index.json must name, files its folder must hold); None: any tokenizer class
COMPONENTS: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "transformer": ("URSATransformer3DModel", ("config.json",)),
    "vae": ("AutoencoderVQ", ("config.json",)),
    "scheduler": ("KineticOptimalScheduler", ("scheduler_config.json", "scheduler_model.pth")),
    "tokenizer": (None, ("tokenizer_config.json",)),
}


@dataclass(frozen=True)
class WeightsFolder:
    """A checked URSA folder: its path and the VQ grid it implies."""

    path: Path
    spatial_stride: int
    codebook_size: int
    random_weights: bool


def check_weights_folder(path: str | os.PathLike) -> WeightsFolder:
    """Raise :class:`WeightsError` naming the missing piece unless ``path`` is a complete URSA pipeline folder."""
    folder = Path(path)
    index_file = folder / "model_index.json"
    if not index_file.is_file():
        raise WeightsError(
            f"{folder} has no model_index.json: not a URSA pipeline folder; pass the downloaded BAAI/URSA-1.7B-IBQ512 "
            "folder to --weights (see ursa-npu/weights-manifest.json), or use --smoke"
        )
    index = _read_json(index_file)
    for name, (expected, files) in COMPONENTS.items():
        entry = index.get(name)
        class_name = entry[-1] if isinstance(entry, list) and entry else None
        if not class_name:
            raise WeightsError(f"{index_file} has no '{name}' component; this delivery needs {', '.join(COMPONENTS)}")
        if expected and class_name != expected:
            raise WeightsError(f"{index_file} names {class_name} for '{name}', expected {expected}: not a URSA model")
        missing = [file for file in files if not (folder / name / file).is_file()]
        if missing:
            raise WeightsError(
                f"component '{name}' is incomplete: {', '.join(f'{name}/{file}' for file in missing)} missing in "
                f"{folder}; download the folder again"
            )
    vae_config = _read_json(folder / "vae" / "config.json")
    return WeightsFolder(
        path=folder,
        spatial_stride=int(vae_config.get("spatial_stride", 8)),  # upstream's default when the key is absent
        codebook_size=int(vae_config.get("num_vq_embeddings", 0)),
        random_weights=(folder / RANDOM_WEIGHTS_MARKER).is_file(),
    )


DOWNLOAD_HINT = (
    "download BAAI/URSA-1.7B-IBQ512 again (deliverykit weights download --manifest ursa-npu/weights-manifest.json "
    "--root <weights root>) or use --smoke"
)


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from the folder, or :class:`WeightsError` naming the file (not a traceback)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise WeightsError(f"{path} is not valid JSON ({err}); {DOWNLOAD_HINT}") from None
    if not isinstance(data, dict):
        raise WeightsError(f"{path} holds a JSON {type(data).__name__}, not an object; {DOWNLOAD_HINT}")
    return data


def _load(name: str, folder: Path, load: Any) -> Any:
    try:
        return load()
    except Exception as err:  # the user's fix is the same whatever the loader raised: re-download that folder
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0].rstrip(".")
        raise WeightsError(
            f"cannot load component '{name}' from {folder / name}: {first_line}; its files are truncated, corrupt "
            f"or of another model: {DOWNLOAD_HINT}"
        ) from err


def load_pipeline(weights: WeightsFolder, classes: SimpleNamespace, dtype: torch.dtype) -> Any:
    """``URSAPipeline`` built from the folder's components in ``dtype`` (on the CPU; move it with ``.to``)."""
    from transformers import AutoTokenizer

    folder = weights.path
    local = {"local_files_only": True}
    transformer = _load(
        "transformer", folder, lambda: classes.transformer.from_pretrained(folder / "transformer", dtype=dtype, **local)
    )
    vae = _load("vae", folder, lambda: classes.vae.from_pretrained(folder / "vae", dtype=dtype, **local))
    scheduler = _load("scheduler", folder, lambda: classes.scheduler.from_pretrained(str(folder / "scheduler")))
    tokenizer = _load("tokenizer", folder, lambda: AutoTokenizer.from_pretrained(folder / "tokenizer", **local))
    return classes.pipeline(transformer=transformer, scheduler=scheduler, vae=vae, tokenizer=tokenizer)


@dataclasses.dataclass
class ModelSource:
    """The model a process serves, checked before anything loads: ``inference.py`` and ``app.py`` both start here."""

    args: argparse.Namespace
    folder: WeightsFolder | None  # None with --smoke: the tiny model is written at load time
    variant: tiny.TinyVariant | None

    @classmethod
    def check(cls, args: argparse.Namespace) -> ModelSource:
        """The weights folder's layout (exit 4); its manifest and the upstream checkout are checked by
        :meth:`.session.Session.load`."""
        variant = tiny.VARIANTS.get(args.smoke)
        return cls(args, None if args.smoke else check_weights_folder(args.weights), variant)

    @property
    def stride(self) -> int:
        return self.variant.spatial_stride if self.variant else self.folder.spatial_stride

    @property
    def size(self) -> int:
        return self.variant.size if self.variant else DEFAULT_SIZE

    def default_request(self, prompt: str, steps: int | None = None) -> ImageRequest:
        """Upstream's defaults at this model's size (the smoke model's few steps with ``--smoke``)."""
        steps = steps or (tiny.SMOKE_STEPS if self.args.smoke else DEFAULT_STEPS)
        return ImageRequest(prompt, "", 42, steps, DEFAULT_GUIDANCE, self.size, self.size)
