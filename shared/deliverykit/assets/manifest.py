"""Weights manifests: which model files a delivery needs, and whether the user's copies are those files.

A manifest (``<delivery>/weights-manifest.json``, schema ``weights-manifests/schema.json``) lists, per model
repository, each file's repo path, exact size and sha256. Files live at ``<root>/<local_dir>/<path>``, in the hub's
repo layout, so a folder made by ``snapshot_download(local_dir=...)`` verifies as is.

- :func:`verify` compares a weights root with the manifest. It only reads: hashing is streamed in chunks, and
  no file is ever written, moved or deleted.
- :mod:`deliverykit.assets.loadcheck` is the cheap check an ``inference.py`` runs before loading (missing or corrupt:
  refused; complete but not the release: a warning), so a truncated download fails with the fix instead of a
  cryptic ``safetensors`` error.
- :func:`pin` fills unknown sizes and hashes from downloaded files; it never overwrites a known value.
- :func:`download` fetches the listed files from Hugging Face or ModelScope, then verifies them.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import importlib
import inspect
import json
import logging
import os
import shlex
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from deliverykit.errors import WeightsError
from deliverykit.files import write_json_atomic
from deliverykit.imports import is_package_installed

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
# Shipped inside the package so a vendored deliverykit validates too; weights-manifests/schema.json links here.
SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "weights_manifest.schema.json"
# Read per call (not bound as a default argument) so that tests can shrink it.
CHUNK_SIZE = 8 * 1024 * 1024

# FileCheck.status values.
OK = "ok"
MISSING = "missing"
WRONG_SIZE = "wrong_size"
WRONG_HASH = "wrong_hash"
UNCHECKED_HASH = "unchecked_hash"  # size right (or unknown), sha256 not compared: quick mode or no known sha256
STATUSES = (OK, MISSING, WRONG_SIZE, WRONG_HASH, UNCHECKED_HASH)
PASSING = (OK, UNCHECKED_HASH)


@dataclasses.dataclass(frozen=True)
class HubSpec:
    """How one hub's ``snapshot_download`` is called."""

    name: str
    module: str
    manifest_key: str  # key in the manifest's ``hub`` object
    repo_arg: str  # name of the repository argument of ``snapshot_download``
    token_env: str
    pins_revision: bool  # False: the manifest's revision is a Hugging Face commit, meaningless on this hub


HUBS = {
    "hf": HubSpec("Hugging Face", "huggingface_hub", "huggingface", "repo_id", "HF_TOKEN", pins_revision=True),
    "modelscope": HubSpec("ModelScope", "modelscope", "modelscope", "model_id", "MODELSCOPE_API_TOKEN", False),
}


@dataclasses.dataclass(frozen=True)
class ManifestFile:
    path: str
    bytes: int | None
    sha256: str | None
    component: str
    required: bool
    source: str


@dataclasses.dataclass(frozen=True)
class ModelSource:
    id: str
    role: str
    revision: str | None
    hub: dict[str, str | None]
    license: str
    gated: bool
    local_dir: str
    files: tuple[ManifestFile, ...]
    license_url: str | None = None
    notes: str | None = None

    def hub_id(self, hub: str) -> str | None:
        return self.hub.get(_hub_spec(hub).manifest_key)


@dataclasses.dataclass(frozen=True)
class Manifest:
    delivery: str
    models: tuple[ModelSource, ...]
    path: Path | None = None
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def display_path(self) -> str:
        return str(self.path) if self.path is not None else "<manifest>"

    def model(self, model_id: str) -> ModelSource:
        for model in self.models:
            if model.id == model_id:
                return model
        known = ", ".join(m.id for m in self.models)
        raise WeightsError(f"model {model_id} is not in weights manifest {self.display_path} (it lists: {known})")

    def select(self, model_ids: Iterable[str] | None = None) -> tuple[ModelSource, ...]:
        """The models named by ``model_ids`` (all when None), in manifest order."""
        if model_ids is None:
            return self.models
        wanted = {self.model(model_id).id for model_id in model_ids}
        return tuple(m for m in self.models if m.id in wanted)


@dataclasses.dataclass(frozen=True)
class FileCheck:
    """What :func:`verify` found for one manifest file."""

    model_id: str
    path: str  # repo-relative, as in the manifest
    local_path: Path
    required: bool
    status: str
    expected_bytes: int | None
    actual_bytes: int | None
    expected_sha256: str | None
    actual_sha256: str | None

    @property
    def passed(self) -> bool:
        """True when nothing is known to be wrong (``unchecked_hash`` passes: its size matched or is unknown)."""
        return self.status in PASSING

    def describe(self) -> str:
        if self.status == MISSING:
            return "missing"
        if self.status == WRONG_SIZE:
            return f"{self.actual_bytes} bytes instead of {self.expected_bytes}"
        if self.status == WRONG_HASH:
            return f"sha256 {self.actual_sha256} instead of {self.expected_sha256}"
        if self.status == UNCHECKED_HASH:
            return "present, sha256 not checked"
        return "ok"


@dataclasses.dataclass(frozen=True)
class VerifySummary:
    total: int
    counts: dict[str, int]
    required_failures: tuple[FileCheck, ...]
    optional_failures: tuple[FileCheck, ...]
    unchecked_hashes: int

    @property
    def ok(self) -> bool:
        return not self.required_failures


def summarize_checks(checks: Sequence[FileCheck]) -> VerifySummary:
    """Counts per status; the run passes when every required file passed."""
    counts = {status: sum(c.status == status for c in checks) for status in STATUSES}
    return VerifySummary(
        total=len(checks),
        counts=counts,
        required_failures=tuple(c for c in checks if c.required and not c.passed),
        optional_failures=tuple(c for c in checks if not c.required and not c.passed),
        unchecked_hashes=counts[UNCHECKED_HASH],
    )


# ----------------------------------------------------------------------------------------------------------------
# Loading and validation


def load_schema(schema_path: str | os.PathLike | None = None) -> dict[str, Any]:
    path = Path(schema_path) if schema_path is not None else SCHEMA_PATH
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise WeightsError(
            f"weights manifest schema {path} not found; "
            "install deliverykit editable from the repository (pip install -e shared)"
        ) from err


def validate_manifest_data(data: Any, source: str = "<manifest>", schema_path: str | os.PathLike | None = None) -> None:
    """Raise :class:`WeightsError` naming the JSON path of the most relevant schema error in ``data``."""
    try:
        import jsonschema
    except ImportError as err:
        raise WeightsError(
            "validating a weights manifest needs the jsonschema package: pip install jsonschema==4.26.0"
        ) from err
    validator = jsonschema.Draft202012Validator(load_schema(schema_path))
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        message = " ".join(error.message.split())
        if len(message) > 200:
            message = message[:197] + "..."
        raise WeightsError(f"weights manifest {source} is invalid at {error.json_path}: {message}")


def load_manifest(
    path: str | os.PathLike, *, validate: bool = True, schema_path: str | os.PathLike | None = None
) -> Manifest:
    """Read a manifest; with ``validate`` (default) it must match the schema.

    ``validate=False`` skips the schema (and so the jsonschema dependency) but still rejects a malformed file.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as err:
        raise WeightsError(f"weights manifest {path} not found; pass the delivery's weights-manifest.json") from err
    except OSError as err:
        raise WeightsError(f"cannot read weights manifest {path} ({err.strerror})") from err
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise WeightsError(
            f"weights manifest {path} is not valid JSON (line {err.lineno}: {err.msg}); restore the delivery's "
            f"weights-manifest.json (git checkout -- {path}) or fix that line"
        ) from err
    if validate:
        validate_manifest_data(data, str(path), schema_path)
    return parse_manifest(data, path)


def parse_manifest(data: dict[str, Any], path: Path | None = None) -> Manifest:
    """Build a :class:`Manifest` from already parsed JSON and check what the schema cannot (uniqueness)."""
    source = str(path) if path is not None else "<manifest>"
    try:
        if data["schema_version"] != SCHEMA_VERSION:
            raise WeightsError(
                f"weights manifest {source} has schema_version {data['schema_version']!r}; "
                f"this deliverykit reads version {SCHEMA_VERSION}"
            )
        models = tuple(_parse_model(m) for m in data["models"])
        manifest = Manifest(delivery=data["delivery"], models=models, path=path, raw=json.loads(json.dumps(data)))
    except (KeyError, TypeError, AttributeError) as err:
        raise WeightsError(f"weights manifest {source} is malformed ({type(err).__name__}: {err})") from err
    _check_unique(manifest, source)
    return manifest


def _parse_model(data: dict[str, Any]) -> ModelSource:
    files = tuple(
        ManifestFile(
            path=f["path"],
            bytes=f["bytes"],
            sha256=f["sha256"],
            component=f["component"],
            required=bool(f["required"]),
            source=f["source"],
        )
        for f in data["files"]
    )
    return ModelSource(
        id=data["id"],
        role=data["role"],
        revision=data["revision"],
        hub=dict(data["hub"]),
        license=data["license"],
        gated=bool(data["gated"]),
        local_dir=data["local_dir"],
        files=files,
        license_url=data.get("license_url"),
        notes=data.get("notes"),
    )


def _check_unique(manifest: Manifest, source: str) -> None:
    seen_ids: set[str] = set()
    seen_dirs: set[str] = set()
    for i, model in enumerate(manifest.models):
        if model.id in seen_ids:
            raise WeightsError(f"weights manifest {source} is invalid at $.models[{i}].id: {model.id} is listed twice")
        if model.local_dir in seen_dirs:
            raise WeightsError(
                f"weights manifest {source} is invalid at $.models[{i}].local_dir: {model.local_dir} is used twice"
            )
        seen_ids.add(model.id)
        seen_dirs.add(model.local_dir)
        paths: set[str] = set()
        for j, file in enumerate(model.files):
            if file.path in paths:
                raise WeightsError(
                    f"weights manifest {source} is invalid at $.models[{i}].files[{j}].path: "
                    f"{file.path} is listed twice"
                )
            paths.add(file.path)


def _as_manifest(manifest: Manifest | str | os.PathLike) -> Manifest:
    return manifest if isinstance(manifest, Manifest) else load_manifest(manifest)


# ----------------------------------------------------------------------------------------------------------------
# Hashing and verification


def sha256_file(path: str | os.PathLike, *, chunk_size: int | None = None, progress: Any = None) -> str:
    """Streamed sha256 of a file: memory stays at one chunk (8 MiB) whatever the file size.

    ``progress`` is anything with ``update(n_bytes)``, e.g. a tqdm bar.
    """
    size = chunk_size or CHUNK_SIZE
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        while chunk := stream.read(size):
            digest.update(chunk)
            if progress is not None:
                progress.update(len(chunk))
    return digest.hexdigest()


class _NoProgress:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress_bar(total: int, desc: str, enabled: bool) -> Any:
    """A tqdm byte bar when tqdm is installed and stderr is a terminal; tqdm is optional (the weights extra)."""
    if not enabled or total <= 0 or not is_package_installed("tqdm"):
        return _NoProgress()
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, disable=None, leave=False)


@dataclasses.dataclass(frozen=True)
class _Entry:
    model: ModelSource
    file: ManifestFile
    local_path: Path


def _entries_for(model: ModelSource, model_dir: Path, paths: Iterable[str] | None = None) -> list[_Entry]:
    wanted = None if paths is None else set(paths)
    return [_Entry(model, f, model_dir / f.path) for f in model.files if wanted is None or f.path in wanted]


def _check_entries(entries: Sequence[_Entry], quick: bool, progress: bool) -> list[FileCheck]:
    """Sizes first (cheap, catches truncation), then one streamed hashing pass with a progress bar over all bytes."""
    sizes: list[int | None] = []
    for entry in entries:
        local = entry.local_path
        sizes.append(local.stat().st_size if local.is_file() else None)

    def needs_hash(entry: _Entry, size: int | None) -> bool:
        expected = entry.file.bytes
        return not quick and size is not None and (expected is None or size == expected)

    total = sum(size for entry, size in zip(entries, sizes, strict=True) if needs_hash(entry, size) and size)
    bar = _progress_bar(total, "sha256", progress)
    checks = []
    try:
        for entry, size in zip(entries, sizes, strict=True):
            file = entry.file
            actual_sha = sha256_file(entry.local_path, progress=bar) if needs_hash(entry, size) else None
            if size is None:
                status = MISSING
            elif file.bytes is not None and size != file.bytes:
                status = WRONG_SIZE
            elif actual_sha is None or file.sha256 is None:
                status = UNCHECKED_HASH
            elif actual_sha == file.sha256:
                status = OK
            else:
                status = WRONG_HASH
            checks.append(
                FileCheck(
                    model_id=entry.model.id,
                    path=file.path,
                    local_path=entry.local_path,
                    required=file.required,
                    status=status,
                    expected_bytes=file.bytes,
                    actual_bytes=size,
                    expected_sha256=file.sha256,
                    actual_sha256=actual_sha,
                )
            )
    finally:
        bar.close()
    return checks


def _require_root(root: Path, manifest: Manifest, what: str = "weights root") -> None:
    if not root.is_dir():
        raise WeightsError(
            f"{what} {root} does not exist or is not a folder; download with: {download_command(manifest, root)}"
        )


def verify(
    manifest: Manifest | str | os.PathLike,
    root: str | os.PathLike | None,
    quick: bool = False,
    models: Iterable[str] | None = None,
    files: Iterable[str] | None = None,
    *,
    progress: bool = True,
    model_dir: str | os.PathLike | None = None,
) -> list[FileCheck]:
    """Check ``<root>/<local_dir>/<path>`` of every manifest file (or of the given models / repo paths).

    ``quick`` compares sizes only (seconds instead of minutes for ~17 GB); the full mode also streams every file
    through sha256. Files are only read. ``model_dir`` (one model, ``root`` ignored): that model's files are in
    that folder itself.
    """
    manifest = _as_manifest(manifest)
    selected = manifest.select(models)
    model_dirs = _model_dirs(selected, root, model_dir)
    if model_dir is None:
        _require_root(Path(root), manifest)
    elif not Path(model_dir).is_dir():
        command = download_command(manifest, None, [m.id for m in selected], model_dir=model_dir)
        raise WeightsError(f"model folder {model_dir} does not exist or is not a folder; download with: {command}")
    wanted = None if files is None else list(files)
    if wanted is not None:
        known = {f.path for m in selected for f in m.files}
        unknown = [p for p in wanted if p not in known]
        if unknown:
            raise WeightsError(f"{unknown[0]} is not a file of the selected models in {manifest.display_path}")
    entries = [e for m in selected for e in _entries_for(m, model_dirs[m.id], wanted)]
    return _check_entries(entries, quick=quick, progress=progress)


def _model_dirs(
    selected: Sequence[ModelSource], root: str | os.PathLike | None, model_dir: str | os.PathLike | None
) -> dict[str, Path]:
    """Where each selected model's files live: ``<root>/<local_dir>``, or ``model_dir`` for exactly one model."""
    if model_dir is None:
        if root is None:
            raise WeightsError("pass a weights root (--root) or one model's folder (--model-dir with one --model)")
        return {m.id: Path(root) / m.local_dir for m in selected}
    if len(selected) != 1:
        raise WeightsError(
            f"--model-dir names one model's folder; pick the model with --model ({', '.join(m.id for m in selected)})"
        )
    return {selected[0].id: Path(model_dir)}


def resolve_model_dir(root_or_model_dir: str | os.PathLike, model: ModelSource) -> tuple[Path, Path]:
    """(model folder, weights root) for a path that is either the weights root or the model's own folder.

    ``<path>/<local_dir>`` wins when it exists; a folder named like ``local_dir`` is the model folder; any other
    folder holding one of the model's files is used as the model folder directly (the root is then the folder
    itself, so a fresh download lands in ``<path>/<local_dir>`` and is preferred next time).
    """
    path = Path(root_or_model_dir)
    if (path / model.local_dir).is_dir():
        return path / model.local_dir, path
    if path.name == model.local_dir:
        return path, path.parent
    if any((path / f.path).is_file() for f in model.files):
        return path, path
    return path / model.local_dir, path


def download_command(
    manifest: Manifest | str | os.PathLike,
    root: str | os.PathLike | None,
    model_ids: Sequence[str] | None = None,
    hub: str = "hf",
    *,
    model_dir: str | os.PathLike | None = None,
    all_files: bool = False,
) -> str:
    """The shell command that downloads (and then verifies) the manifest's files into ``root``.

    ``model_dir`` (with one model id, instead of ``root``): into that folder itself, whatever its name;
    ``all_files``: optional files too.
    """
    manifest_path = manifest.display_path if isinstance(manifest, Manifest) else str(manifest)
    where = ["--model-dir", str(model_dir)] if model_dir is not None else ["--root", str(root)]
    parts = ["deliverykit", "weights", "download", "--manifest", manifest_path, *where]
    for model_id in model_ids or ():
        parts += ["--model", model_id]
    if hub != "hf":
        parts += ["--hub", hub]
    if all_files:
        parts.append("--all-files")
    return shlex.join(parts)


# ----------------------------------------------------------------------------------------------------------------
# Pinning


@dataclasses.dataclass(frozen=True)
class PinEntry:
    model_id: str
    path: str
    local_path: Path
    action: str  # "filled", "conflict", "missing", "pinned" (both values already known; file not read)
    detail: str
    bytes: int | None = None
    sha256: str | None = None


@dataclasses.dataclass(frozen=True)
class PinReport:
    manifest_path: Path
    entries: tuple[PinEntry, ...]
    written: bool

    @property
    def conflicts(self) -> tuple[PinEntry, ...]:
        return tuple(e for e in self.entries if e.action == "conflict")

    @property
    def filled(self) -> tuple[PinEntry, ...]:
        return tuple(e for e in self.entries if e.action == "filled")

    @property
    def ok(self) -> bool:
        return not self.conflicts


def pin(
    manifest_path: str | os.PathLike,
    root: str | os.PathLike,
    *,
    models: Iterable[str] | None = None,
    progress: bool = True,
) -> PinReport:
    """Fill null ``bytes``/``sha256`` from the files under ``root`` and rewrite the manifest atomically.

    A file whose size or hash contradicts a known value is a conflict: then nothing is written at all, since either
    the download or the manifest is wrong and a person has to decide which.
    """
    manifest = load_manifest(manifest_path)
    root = Path(root)
    _require_root(root, manifest)
    selected = {m.id for m in manifest.select(models)}
    raw = manifest.raw

    pending: list[tuple[_Entry, dict[str, Any]]] = []
    entries: list[PinEntry] = []
    for model, raw_model in zip(manifest.models, raw["models"], strict=True):
        if model.id not in selected:
            continue
        for entry, raw_file in zip(_entries_for(model, root / model.local_dir), raw_model["files"], strict=True):
            file = entry.file
            if not entry.local_path.is_file():
                left = "left as pinned" if file.bytes is not None and file.sha256 is not None else "left null"
                entries.append(PinEntry(model.id, file.path, entry.local_path, "missing", f"not on disk, {left}"))
            else:  # fully pinned entries too: a local file that contradicts them is a conflict, never skipped
                pending.append((entry, raw_file))

    total = sum(entry.local_path.stat().st_size for entry, _ in pending)
    bar = _progress_bar(total, "sha256", progress)
    try:
        for entry, raw_file in pending:
            entries.append(_pin_one(entry, raw_file, bar))
    finally:
        bar.close()

    conflicts = [e for e in entries if e.action == "conflict"]
    written = False
    if not conflicts and any(e.action == "filled" for e in entries):
        validate_manifest_data(raw, str(manifest.path))
        write_json_atomic(manifest.path, raw)
        written = True
    return PinReport(manifest_path=Path(manifest_path), entries=tuple(entries), written=written)


def _pin_one(entry: _Entry, raw_file: dict[str, Any], bar: Any) -> PinEntry:
    file = entry.file
    size = entry.local_path.stat().st_size
    digest = sha256_file(entry.local_path, progress=bar)
    args = (entry.model.id, file.path, entry.local_path)
    if file.bytes is not None and size != file.bytes:
        return PinEntry(*args, "conflict", f"file has {size} bytes, manifest says {file.bytes}", size, digest)
    if file.sha256 is not None and digest != file.sha256:
        return PinEntry(*args, "conflict", f"file has sha256 {digest}, manifest says {file.sha256}", size, digest)
    if file.bytes is not None and file.sha256 is not None:
        return PinEntry(*args, "pinned", "already pinned; the local file matches", size, digest)
    filled = []
    if file.bytes is None:
        raw_file["bytes"] = size
        filled.append("bytes")
    if file.sha256 is None:
        raw_file["sha256"] = digest
        filled.append("sha256")
    raw_file["source"] = (
        f"{raw_file['source']}; {' and '.join(filled)} pinned from a local file (deliverykit weights pin)"
    )
    return PinEntry(*args, "filled", f"filled {' and '.join(filled)}", size, digest)


# ----------------------------------------------------------------------------------------------------------------
# Downloading


def _hub_spec(hub: str) -> HubSpec:
    try:
        return HUBS[hub]
    except KeyError:
        raise WeightsError(f"unknown hub {hub!r}; use one of: {', '.join(HUBS)}") from None


def snapshot_download_kwargs(
    model: ModelSource,
    root: str | os.PathLike | None,
    hub: str = "hf",
    *,
    include_optional: bool = False,
    model_dir: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Keyword arguments of the hub's ``snapshot_download`` for ``model`` (no hub import, so it is testable).

    Only the manifest's files are allowed (required ones unless ``include_optional``), into
    ``<root>/<local_dir>`` (or ``model_dir``). The token comes from the hub's environment variable only, never from
    arguments.
    ModelScope gets no revision: the manifest's revision is a Hugging Face commit, and the sha256 check after the
    download is what ties a ModelScope copy to the pinned content.
    """
    spec = _hub_spec(hub)
    repo_id = model.hub_id(hub)
    if repo_id is None:
        others = [name for name in HUBS if name != hub and model.hub_id(name)]
        fix = f"use --hub {others[0]}" if others else "download it by hand"
        raise WeightsError(f"{model.id} has no {spec.name} id in the weights manifest; {fix}")
    paths = [f.path for f in model.files if include_optional or f.required]
    kwargs: dict[str, Any] = {spec.repo_arg: repo_id}
    if spec.pins_revision and model.revision is not None:
        kwargs["revision"] = model.revision
    kwargs["local_dir"] = str(Path(model_dir) if model_dir is not None else Path(root) / model.local_dir)
    kwargs["allow_patterns"] = [glob.escape(p) for p in paths]  # literal paths: [ ] * ? are fnmatch syntax
    token = os.environ.get(spec.token_env)
    if token:
        kwargs["token"] = token
    return kwargs


def _import_hub(spec: HubSpec) -> Any:
    try:
        return importlib.import_module(spec.module)
    except ImportError as err:
        raise WeightsError(
            f"downloading from {spec.name} needs the {spec.module} package: pip install {spec.module}"
        ) from err


def _check_supported(function: Any, kwargs: dict[str, Any], spec: HubSpec) -> None:
    """Refuse before downloading when an old hub package lacks an argument (it would raise TypeError mid-way)."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    unsupported = [name for name in kwargs if name not in parameters]
    if unsupported:
        raise WeightsError(
            f"the installed {spec.module} has a snapshot_download without {', '.join(unsupported)}; "
            f"upgrade it: pip install -U {spec.module}"
        )


def download(
    manifest: Manifest | str | os.PathLike,
    root: str | os.PathLike | None,
    hub: str = "hf",
    *,
    models: Iterable[str] | None = None,
    include_optional: bool = False,
    quick: bool = False,
    progress: bool = True,
    model_dir: str | os.PathLike | None = None,
) -> list[FileCheck]:
    """Download the manifest's files (required ones unless ``include_optional``) into ``root``, then verify them.

    ``model_dir`` (one model, instead of ``root``): into that folder itself.
    """
    manifest = _as_manifest(manifest)
    spec = _hub_spec(hub)
    selected = manifest.select(models)
    model_dirs = _model_dirs(selected, root, model_dir)
    # Build every call first: a missing hub id fails before anything is downloaded.
    calls = [
        (
            model,
            snapshot_download_kwargs(
                model, None, hub, include_optional=include_optional, model_dir=model_dirs[model.id]
            ),
        )
        for model in selected
    ]
    snapshot_download = _import_hub(spec).snapshot_download
    for folder in model_dirs.values():
        folder.parent.mkdir(parents=True, exist_ok=True)
    entries: list[_Entry] = []
    for model, kwargs in calls:
        if not kwargs["allow_patterns"]:
            why = "only optional files (--all-files downloads them)" if model.files else "no file list yet"
            logger.warning("%s skipped: the weights manifest has %s", model.id, why)
            continue
        _check_supported(snapshot_download, kwargs, spec)
        logger.info("downloading %d file(s) of %s from %s", len(kwargs["allow_patterns"]), model.id, spec.name)
        try:
            snapshot_download(**kwargs)
        except Exception as err:
            hint = ""
            if model.gated and "token" not in kwargs:
                hint = f"; the repository is gated: accept its terms on the model page and set {spec.token_env}"
            first_line = (str(err).strip().splitlines() or [""])[0]
            raise WeightsError(
                f"downloading {model.id} from {spec.name} failed ({type(err).__name__}: {first_line}){hint}"
            ) from err
        paths = [f.path for f in model.files if include_optional or f.required]
        entries += _entries_for(model, model_dirs[model.id], paths)
    return _check_entries(entries, quick=quick, progress=progress)
