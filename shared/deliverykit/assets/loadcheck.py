"""The check every ``inference.py`` runs on real weights before loading them, and the weights record of its report.

Each required manifest file falls in one of three classes, the same in every delivery:

- **missing**, or **incomplete or corrupt** (a ``.safetensors`` whose header or data length does not fit the file, a
  ``.json`` that does not parse, any other file of the wrong size): :class:`WeightsError`, exit 4, with the download
  command that puts the files where the user pointed;
- **complete but not the release** (valid, but its size or, for small files, its sha256 differs from the manifest:
  a re-serialised ``config.json``, a ModelScope mirror, a fine-tune): loaded, after one ``warning:`` line naming the
  files; the strict key/shape load that follows is the architecture guarantee. ``--strict-manifest`` (or
  ``DELIVERYKIT_STRICT_MANIFEST=1``) makes this an error too;
- **the release** (sizes match; small files also by sha256): loaded silently.

Sizes are compared for every file; only files up to :data:`CHEAP_HASH_BYTES` are hashed, since a load must not pay
for hashing 46 GB (``deliverykit weights verify`` does the full check).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import struct
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from deliverykit.assets.manifest import (
    ManifestFile,
    ModelSource,
    download_command,
    load_manifest,
    resolve_model_dir,
    sha256_file,
)
from deliverykit.errors import WeightsError
from deliverykit.imports import is_package_installed

STRICT_ENV_VAR = "DELIVERYKIT_STRICT_MANIFEST"
CHEAP_HASH_BYTES = 64 * 2**20  # configs, tokenizers, small checkpoints: hashed at load; larger files by size only
# The header of a safetensors file: its length, read as a little-endian u64, precedes it. Real headers are at
# most a few MiB; the safetensors library refuses more than 100 MB.
_SAFETENSORS_MAX_HEADER = 100_000_000

# LoadedFile.status values
RELEASE = "release"  # matches the manifest (by size; small files by sha256 too)
DIFFERS = "differs"  # complete and valid, but not the released bytes
UNPINNED = "unpinned"  # the manifest has no size for it: nothing to compare
RANDOM = "random"  # written by a smoke run


@dataclasses.dataclass(frozen=True)
class LoadedFile:
    """One weights file that a run loads, as its report records it."""

    path: Path
    bytes: int
    sha256: str | None
    sha256_source: str | None  # "computed" (hashed here), "manifest" (size matched the release), None (not hashed)
    status: str
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "bytes": self.bytes,
            "sha256": self.sha256,
            "sha256_source": self.sha256_source,
            "status": self.status,
        }


def strict_manifest(flag: bool = False) -> bool:
    """``--strict-manifest`` given, or ``$DELIVERYKIT_STRICT_MANIFEST`` set to 1/true/yes."""
    return flag or os.environ.get(STRICT_ENV_VAR, "").strip().lower() in ("1", "true", "yes")


def format_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` is incomplete or corrupt, judged by its format alone; None when valid or of an unknown format.

    ``.safetensors``: the 8-byte header length, the JSON header and the tensors' data offsets must fit the file
    size exactly (what a truncated download breaks). ``.json``: it must parse.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".json":
        try:
            json.loads(path.read_bytes())
        except (ValueError, UnicodeDecodeError) as err:
            return f"not valid JSON ({err})"
        return None
    if suffix != ".safetensors":
        return None
    size = path.stat().st_size
    with open(path, "rb") as stream:
        prefix = stream.read(8)
        if len(prefix) < 8:
            return f"{size} bytes, shorter than a safetensors header"
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > min(size - 8, _SAFETENSORS_MAX_HEADER):
            return f"its header claims {header_len} bytes but the file has {size}"
        try:
            header = json.loads(stream.read(header_len))
        except (ValueError, UnicodeDecodeError) as err:
            return f"its safetensors header is not valid JSON ({err})"
    if not isinstance(header, dict):
        return "its safetensors header is not a JSON object"
    data_bytes = size - 8 - header_len
    ends = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            return f"tensor {name} has no valid data_offsets in the safetensors header"
        ends.append(offsets[1])
    needed = max(ends, default=0)
    if needed != data_bytes:
        return f"its tensors need {needed} data bytes but the file holds {data_bytes}"
    return None


def _record(path: Path, size: int, expected: ManifestFile | None, *, always_hash: bool = False) -> LoadedFile:
    """Classify one complete, valid file against its manifest entry (None: the release has no such file)."""
    known_size = expected is not None and expected.bytes is not None
    digest = sha256_file(path) if always_hash or size <= CHEAP_HASH_BYTES else None
    if digest is not None:
        sha256, source = digest, "computed"
    elif known_size and size == expected.bytes and expected.sha256:
        sha256, source = expected.sha256, "manifest"
    else:
        sha256, source = None, None
    if expected is None:
        return LoadedFile(path, size, sha256, source, DIFFERS, "not a file of the release")
    if not known_size:
        return LoadedFile(path, size, sha256, source, UNPINNED)
    if size != expected.bytes:
        return LoadedFile(path, size, sha256, source, DIFFERS, f"{size} bytes instead of {expected.bytes}")
    if digest is not None and expected.sha256 and digest != expected.sha256:
        return LoadedFile(path, size, sha256, source, DIFFERS, "same size, other sha256")
    return LoadedFile(path, size, sha256, source, RELEASE)


def _fix(manifest_path: Path, model: ModelSource, model_dir: Path, expected: ManifestFile | None) -> str:
    """The download that puts the file into ``model_dir`` itself, never into ``model_dir/<local_dir>``."""
    if expected is None:
        return "download it again from where it came from (it is not a file of the pinned release)"
    extra = {"all_files": not expected.required}
    if model_dir.name == model.local_dir:
        command = download_command(manifest_path, model_dir.parent, model_ids=[model.id], **extra)
    else:
        command = download_command(manifest_path, None, model_ids=[model.id], model_dir=model_dir, **extra)
    return f"download with: {command}"


def _model(manifest_path: Path, model_id: str) -> ModelSource:
    return load_manifest(manifest_path, validate=is_package_installed("jsonschema")).model(model_id)


def check_weights_for_loading(
    manifest_path: str | os.PathLike,
    location: str | os.PathLike,
    model_id: str,
    *,
    strict: bool = False,
) -> list[LoadedFile]:
    """Refuse missing or corrupt files, warn about (or, ``strict``, refuse) complete ones that differ from the release.

    ``location`` is the weights root or the model's own folder (see :func:`.manifest.resolve_model_dir`);
    every required file of the model is checked. Returns what the report records (:func:`weights_record`).
    ``strict`` is combined with ``$DELIVERYKIT_STRICT_MANIFEST`` (:func:`strict_manifest`).
    """
    return check_models_for_loading(manifest_path, [(location, model_id)], strict=strict)


def check_models_for_loading(
    manifest_path: str | os.PathLike,
    models: Sequence[tuple[str | os.PathLike, str]],
    *,
    strict: bool = False,
) -> list[LoadedFile]:
    """:func:`check_weights_for_loading` for several ``(location, model_id)`` at once: one warning line for all."""
    manifest_path = Path(manifest_path)
    checked = []
    for location, model_id in models:
        model = _model(manifest_path, model_id)
        given = Path(location)
        model_dir, root = resolve_model_dir(given, model)
        if not given.is_dir():
            command = download_command(manifest_path, root, model_ids=[model.id])
            raise WeightsError(f"weights folder {given} not found for {model.id}; download with: {command}")
        required = [f.path for f in model.files if f.required]
        checked.append((model, model_dir, _check(manifest_path, model, model_dir, required)))
    _judge(manifest_path, checked, strict)
    return [record for _, _, records in checked for record in records]


def check_file_for_loading(
    manifest_path: str | os.PathLike, path: str | os.PathLike, model_id: str, *, strict: bool = False
) -> LoadedFile:
    """:func:`check_weights_for_loading` for a single-file checkpoint, matched to the manifest file of its name.

    A file the manifest lists in a subfolder (``distill_loras/x.safetensors``) is matched by its name wherever the
    user keeps it; a name the manifest does not list (a fine-tune, a renamed copy) is a file that differs from the
    release.
    """
    manifest_path, path = Path(manifest_path), Path(path)
    model = _model(manifest_path, model_id)
    repo_path = next((f.path for f in model.files if Path(f.path).name == path.name), path.name)
    depth = len(Path(repo_path).parts) - 1
    model_dir = path.parents[depth] if depth < len(path.parents) else path.parent
    if model_dir / repo_path != path:  # kept outside the release's subfolder: check it where it is
        model_dir, repo_path = path.parent, path.name
        files = tuple(dataclasses.replace(f, path=Path(f.path).name) for f in model.files)
        model = dataclasses.replace(model, files=files)
    records = _check(manifest_path, model, model_dir, [repo_path])
    _judge(manifest_path, [(model, model_dir, records)], strict)
    return records[0]


def _check(manifest_path: Path, model: ModelSource, model_dir: Path, repo_paths: Sequence[str]) -> list[LoadedFile]:
    """Raise on the first missing or corrupt file; classify the others."""
    entries = {f.path: f for f in model.files}
    loaded = []
    for repo_path in repo_paths:
        local = model_dir / repo_path
        expected = entries.get(repo_path)
        problem = "missing" if not local.is_file() else format_problem(local)
        size = local.stat().st_size if local.is_file() else None
        checkable = local.suffix.lower() in (".json", ".safetensors")
        if problem is None and not checkable and expected is not None and expected.bytes not in (None, size):
            problem = f"{size} bytes instead of {expected.bytes} (a format that cannot be checked: maybe cut)"
        if problem is not None:
            raise WeightsError(
                f"{model.id} weights are incomplete or corrupt: {local} is {problem}; "
                f"{_fix(manifest_path, model, model_dir, expected)}"
            )
        loaded.append(_record(local, size, expected))
    return loaded


def _judge(manifest_path: Path, checked: Sequence[tuple[ModelSource, Path, list[LoadedFile]]], strict: bool) -> None:
    """One ``warning:`` line naming every differing file, or (strict) one ``WeightsError`` naming them."""
    differing = [
        (model, model_dir, [f for f in records if f.status == DIFFERS]) for model, model_dir, records in checked
    ]
    differing = [(model, model_dir, files) for model, model_dir, files in differing if files]
    if not differing:
        return
    names = "; ".join(
        f"{model.id} in {model_dir}: " + ", ".join(f"{_relative(f.path, model_dir)} ({f.detail})" for f in files)
        for model, model_dir, files in differing
    )
    if strict_manifest(strict):
        model, model_dir, _ = differing[0]
        where = ["--manifest", str(manifest_path), "--model", model.id, "--model-dir", str(model_dir)]
        verify = shlex.join(["deliverykit", "weights", "verify", *where])
        raise WeightsError(
            f"weights differ from the pinned release: {names}; pass the released files (check them with: {verify}) "
            f"or drop --strict-manifest and unset {STRICT_ENV_VAR}"
        )
    print(
        f"warning: weights differ from the pinned release: {names}; loaded anyway (strictly, by key and shape), but "
        "figures may differ from the release's (--strict-manifest refuses them)",
        file=sys.stderr,
    )


def smoke_weights(folder: str | os.PathLike) -> list[LoadedFile]:
    """Records of every random-weight file a smoke run wrote under ``folder`` and loaded (paths relative to it).

    Always hashed: the sha256 is what tells two runs (a CPU reference, an NPU run) that they ran the same model.
    """
    folder = Path(folder)
    records = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        record = _record(path, path.stat().st_size, None, always_hash=True)
        records.append(dataclasses.replace(record, path=path.relative_to(folder), status=RANDOM))
    return records


def weights_record(files: Iterable[LoadedFile]) -> list[dict[str, Any]]:
    """The report's ``weights`` section: path, bytes, sha256, where the sha256 comes from, status."""
    return [f.to_dict() for f in files]


def _relative(path: Path, folder: Path) -> str:
    try:
        return str(path.relative_to(folder))
    except ValueError:
        return str(path)


def same_weights(first: Sequence[dict[str, Any]], second: Sequence[dict[str, Any]]) -> bool:
    """Whether two :func:`weights_record` lists (say a reference saved on another machine and this run) name the same
    files: equal names, sizes and sha256, wherever the folders were."""

    def key(records: Sequence[dict[str, Any]]) -> list[tuple[str, int, str | None]]:
        return sorted((Path(r["path"]).name, r["bytes"], r["sha256"]) for r in records)

    return key(first) == key(second)
