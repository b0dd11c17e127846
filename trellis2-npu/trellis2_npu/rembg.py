"""Background removal for an image without alpha: which BiRefNet folder, its checks before loading, its loading.

Upstream's pipeline.json names ``briaai/RMBG-2.0`` (CC BY-NC 4.0: non-commercial use only) and its ``BiRefNet``
class defaults to ``ZhengPeng7/BiRefNet`` (MIT), the same architecture. Both run transformers' remote code
(``trust_remote_code``): here it is only ever the code in the local folder, which the download pins to the
manifest's revision and the load check compares with the manifest's sha256. Nothing here goes to the hub.

- :func:`find_rembg_model` — ``--rembg-model NAME_OR_DIR``, or by default ``<root>/RMBG-2.0``, then
  ``<root>/BiRefNet`` (``None`` when neither exists, and always without a root: the smoke models have none).
- :func:`check_rembg_model` — before the pipeline loads: the folder's files against the manifest (exit 4), the
  packages its remote code imports and torchvision (exit 3, with the ways out).
- :func:`require_rembg_model` — the one-line error for an image without alpha when no model is available (exit 3).
- :func:`select_rembg_model` / :func:`load_rembg_model` — the model that upstream's ``BiRefNet`` class loads
  (through :func:`trellis2_npu.hooks.load_background_removal`), with its licence printed as one line.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

from deliverykit.assets.loadcheck import check_file_for_loading, format_problem
from deliverykit.assets.manifest import download_command, load_manifest
from deliverykit.errors import InputError, WeightsError

DELIVERY_DIR = Path(__file__).resolve().parent.parent
MANIFEST = DELIVERY_DIR / "weights-manifest.json"
MANIFEST_ARG = f"{DELIVERY_DIR.name}/weights-manifest.json"
# The two released BiRefNet checkpoints, by their download folder (<root>/<local_dir>); default order: pipeline.json's
# RMBG-2.0 first, then the MIT-licensed BiRefNet.
KNOWN_MODELS = {"RMBG-2.0": "briaai/RMBG-2.0", "BiRefNet": "ZhengPeng7/BiRefNet"}
LICENSES = {
    "briaai/RMBG-2.0": "CC BY-NC 4.0 (non-commercial use only; commercial use needs an agreement with BRIA)",
    "ZhengPeng7/BiRefNet": "MIT",
}
AUTO_CLASS = "AutoModelForImageSegmentation"
WEIGHTS_FILES = ("model.safetensors", "pytorch_model.bin")


@dataclasses.dataclass(frozen=True)
class RembgModel:
    """A background-removal folder and what it is: ``model_id`` is a manifest id, or None for another folder."""

    folder: Path
    model_id: str | None

    @property
    def license(self) -> str:
        if self.model_id is None:
            return "unknown (not a release listed in the weights manifest: see its model card)"
        return LICENSES[self.model_id]

    def describe(self) -> str:
        name = self.model_id or "a BiRefNet-type model"
        return f"background removal: {name} from {self.folder}; licence {self.license}"


def download_hint(root: str | os.PathLike | None = None) -> str:
    """How to get the MIT-licensed BiRefNet into ``<root>/BiRefNet`` at the manifest's revision."""
    where = str(root) if root is not None else "ROOT"
    command = download_command(MANIFEST_ARG, where, model_ids=["ZhengPeng7/BiRefNet"], all_files=True)
    return f"download BiRefNet with: {command}"


def _identify(folder: Path) -> str | None:
    """The manifest id of ``folder``: by its download folder name, else by its weights' size; None if neither."""
    if folder.name in KNOWN_MODELS:
        return KNOWN_MODELS[folder.name]
    weights = folder / "model.safetensors"
    if weights.is_file():
        size = weights.stat().st_size
        for model in load_manifest(MANIFEST, validate=False).models:
            if model.id in LICENSES and any(f.path == weights.name and f.bytes == size for f in model.files):
                return model.id
    return None


def find_rembg_model(choice: str | None, root: str | os.PathLike | None) -> RembgModel | None:
    """The folder ``--rembg-model`` names (a folder, or ``RMBG-2.0``/``BiRefNet``/a hub id under ``root``), else the
    first of ``<root>/RMBG-2.0``, ``<root>/BiRefNet`` that exists; None when there is none (or no ``root``).

    A ``choice`` that names no folder is a :class:`WeightsError` (exit 4) saying where it looked and how to fill it.
    """
    if choice:
        path = Path(choice).expanduser()
        name = choice.rstrip("/").split("/")[-1]
        candidates = [path]
        if root is not None and name in KNOWN_MODELS:
            candidates.append(Path(root) / name)
        for candidate in candidates:
            if candidate.is_dir():
                return RembgModel(candidate, _identify(candidate))
        looked = " or ".join(str(c) for c in candidates)
        raise WeightsError(f"--rembg-model {choice}: no folder at {looked}; {download_hint(root)}; or name a folder")
    if root is None:
        return None
    for name in KNOWN_MODELS:
        folder = Path(root) / name
        if folder.is_dir():
            return RembgModel(folder, KNOWN_MODELS[name])
    return None


def no_model_message(root: str | os.PathLike | None) -> str:
    if root is None:
        where = "the smoke models have no background-removal weights"
    else:
        where = f"no background-removal model in {Path(root) / 'RMBG-2.0'} or {Path(root) / 'BiRefNet'}"
    return (
        f"the image has no alpha channel and {where}; pass --rembg-model DIR (a BiRefNet or RMBG-2.0 folder: "
        f"{download_hint(root)}), an RGBA image with the object in alpha, or --no-rembg to use the image whole"
    )


def require_rembg_model(model: RembgModel | None, root: str | os.PathLike | None) -> RembgModel:
    """``model``, or the one-line :class:`InputError` (exit 3) for an image without alpha that nothing can cut out."""
    if model is None:
        raise InputError(no_model_message(root))
    return model


def _auto_map(folder: Path) -> dict[str, str]:
    config_path = folder / "config.json"
    fix = f"{download_hint(folder.parent)}; or pass --rembg-model DIR"
    if not config_path.is_file():
        raise WeightsError(f"background-removal folder {folder} has no config.json; {fix}")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise WeightsError(f"{config_path} is not valid JSON ({err}); {fix}") from err
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    if not isinstance(auto_map, dict) or AUTO_CLASS not in auto_map:
        raise WeightsError(
            f"{config_path} has no auto_map for {AUTO_CLASS}: not a BiRefNet/RMBG-2.0 folder; {fix}, or --no-rembg"
        )
    return auto_map


def _code_files(folder: Path, auto_map: dict[str, str]) -> list[Path]:
    modules = {str(ref).split("--")[-1].rsplit(".", 1)[0] for ref in auto_map.values()}
    return [folder / f"{module}.py" for module in sorted(modules)]


def check_rembg_model(model: RembgModel, *, strict: bool = False) -> list[Any]:
    """Everything about ``model`` that can be checked before the pipeline loads; returns its weights records.

    Exit 4 (:class:`WeightsError`): no ``config.json`` with an ``auto_map`` for ``AutoModelForImageSegmentation``,
    a code file or the weights missing, incomplete or corrupt, or (a manifest model) a file of the pinned release
    missing; complete files that differ from it give one ``warning:`` line (refused with ``strict``). Exit 3
    (:class:`InputError`): a package its remote code imports, or torchvision, cannot be imported here.
    """
    folder = model.folder
    auto_map = _auto_map(folder)
    fix = f"{download_hint(folder.parent)}; or pass --rembg-model DIR"
    for code in _code_files(folder, auto_map):
        if not code.is_file():
            raise WeightsError(f"background-removal folder {folder} has no {code.name} (named by config.json); {fix}")
    weights = [folder / name for name in WEIGHTS_FILES if (folder / name).is_file()]
    if not weights:
        raise WeightsError(f"background-removal folder {folder} has no weights ({' or '.join(WEIGHTS_FILES)}); {fix}")
    problem = format_problem(weights[0])
    if problem is not None:
        raise WeightsError(f"{weights[0]} is incomplete or corrupt: {problem}; {fix}")
    records = []
    if model.model_id is not None:
        manifest_model = load_manifest(MANIFEST, validate=False).model(model.model_id)
        records = [
            check_file_for_loading(MANIFEST, folder / entry.path, model.model_id, strict=strict)
            for entry in manifest_model.files
        ]
    check_rembg_packages(folder, auto_map)
    return records


def check_rembg_packages(folder: Path, auto_map: dict[str, str] | None = None) -> None:
    """The packages the folder's remote code imports, and torchvision (upstream's ``BiRefNet`` transforms), import."""
    from transformers.dynamic_module_utils import get_imports

    needed = {"torchvision"}
    for code in _code_files(folder, auto_map or _auto_map(folder)):
        needed.update(name for name in get_imports(code) if not name.startswith("."))
    missing = []
    for name in sorted(needed):
        try:
            if importlib.util.find_spec(name) is None:
                missing.append(name)
                continue
            if name == "torchvision":
                importlib.import_module(name)  # PyPI's x86_64 wheel fails to import beside the CPU torch
        except (ImportError, RuntimeError, ValueError):
            missing.append(name)
    if missing:
        raise InputError(
            f"background removal with {folder} needs {', '.join(missing)}, which cannot be imported here; install "
            "them (torchvision matching your torch: torchvision==0.28.0 for torch 2.13.0, on x86_64 from "
            "https://download.pytorch.org/whl/cpu), or pass an RGBA image with the object in alpha, or --no-rembg "
            "to use the image whole"
        )


_selected: RembgModel | None = None


def select_rembg_model(model: RembgModel | None) -> None:
    """The folder upstream's ``BiRefNet`` class loads from now on (None: none, refused with the one-line error)."""
    global _selected
    _selected = model


def load_rembg_model(model_name: str) -> Any:
    """``AutoModelForImageSegmentation`` from the selected folder, its remote code from that folder only.

    ``model_name`` is upstream's reference (pipeline.json's ``briaai/RMBG-2.0``); the folder chosen by
    :func:`select_rembg_model` replaces it. Never the hub: ``local_files_only``. Prints the licence as one line.
    """
    if _selected is None:
        raise InputError(no_model_message(None).replace("the smoke models have", f"{model_name}: this run has"))
    from transformers import AutoModelForImageSegmentation

    print(_selected.describe(), flush=True)
    try:
        return AutoModelForImageSegmentation.from_pretrained(
            str(_selected.folder), trust_remote_code=True, local_files_only=True
        )
    except (OSError, ValueError) as err:
        raise WeightsError(
            f"cannot load {_selected.folder} as a background-removal model ({err}); "
            f"{download_hint(_selected.folder.parent)}; or pass --rembg-model DIR"
        ) from err
