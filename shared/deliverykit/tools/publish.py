"""Publishing one delivery on its own: a standalone tree for ModelScope, Modelers or GitCode, and the push.

Users take one delivery, not the monorepo, so :func:`stage_delivery` builds a folder that works when copied anywhere:

- the delivery's tracked files (``git ls-files``; outside git every file but caches and ``outputs/``), plus the files
  it cannot do without (README, requirements, weights manifest, ``publish.json``) even before they are committed;
- ``deliverykit/`` vendored at the top, where ``inference.py``, the scripts and the tests already look for it;
- ``pyproject.toml``: the delivery's own, rewritten to package its ``<model>_npu`` together with the vendored
  deliverykit (no dependency on a deliverykit from the index), so ``pip install --no-deps -e .`` makes the scripts
  importable from anywhere;
- ``requirements.txt`` (the delivery's own pins, checked to cover every import of deliverykit but the optional ones),
  ``requirements-test.txt`` (pytest, pinned as in ``ci/requirements-dev.txt``) and ``pytest.ini`` (the monorepo's
  import mode), so ``pip install -r ...`` then ``python -m pytest`` work there;
- LICENSE (Apache-2.0, the monorepo's), a NOTICE saying what is shipped and what is not (upstream code, weights, with
  their licences), and the README with the hub's front matter and a "Standalone use" section.

The hub metadata a delivery needs beyond its README (task, base model, library) is ``<delivery>/publish.json``.
The tree is built in a hidden folder next to ``--out`` and renamed onto it, so a failure leaves nothing behind.

:func:`push_modelscope` uploads a staged tree with the ModelScope SDK; :func:`push_gitcode` commits it on top of the
remote branch in a temporary repository and pushes. Tokens come from the environment only, reach git through a
credential helper that reads the environment, and are masked in every message.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from deliverykit.assets.manifest import Manifest, load_manifest
from deliverykit.assets.patches import Upstream, find_patches, load_upstream, metadata_path
from deliverykit.errors import DeliveryError, ExitCode, OutputError
from deliverykit.process import run_tool

HUBS = ("modelscope", "modelers", "gitcode")
PUSH_TARGETS = ("modelscope", "gitcode")
TOKEN_ENV = {"modelscope": "MODELSCOPE_API_TOKEN", "gitcode": "GITCODE_TOKEN"}
GITCODE_USER_ENV = "GITCODE_USER"  # optional: the account the token belongs to, default the owner in --repo
METADATA_NAME = "publish.json"

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # the deliverykit that gets vendored: this one
# Files staging writes from the delivery's own copy even when git does not track them yet.
REQUIRED_FILES = ("README.md", "requirements.txt", "weights-manifest.json", "pyproject.toml", METADATA_NAME)
# Top-level names staging generates; a delivery shipping its own would be silently overwritten.
GENERATED = ("deliverykit", "requirements-test.txt", "pytest.ini", "LICENSE", "NOTICE")
SKIP_DIRS = frozenset({"__pycache__", ".pytest_cache", ".ruff_cache", ".git", "outputs"})
# pytest's own settings in the monorepo's pyproject.toml; tests/test_publish.py checks that they agree.
PYTEST_ADDOPTS = "-ra --import-mode=importlib"
PYTEST_MARKERS = (
    "slow: long-running test, only with RUN_SLOW=1",
    "upstream: needs a patched upstream checkout (skips without one)",
    "heavy: several processes or many seconds; the publish self-test leaves it to the in-tree run",
    "device: needs an NPU or another accelerator (require_npu / require_accelerator; deliverykit npu-check runs them)",
)
# pytest and what it needs, picked from ci/requirements-dev.txt (pytest-* plugins too); the linters stay behind.
PYTEST_PACKAGES = frozenset({"pytest", "iniconfig", "pluggy", "exceptiongroup", "tomli"})
# Imports deliverykit makes only on some paths, each behind a clear error, so a delivery need not pin them:
# torch_npu on Ascend hosts (npu-requirements.txt pins it), torchair (ships with torch_npu; compile.py falls back to
# eager without it), modelscope for `publish push --to modelscope`.
# gradio for deliverykit.app, fastapi / starlette / uvicorn / prometheus_client for deliverykit.server, ray for
# deliverykit.cluster (a delivery's requirements-app.txt pins them), selenium for the browser tests (they skip
# without it), av for deliverykit.video (pinned by the deliveries that write video), mx_driving for the optional
# DrivingSDK kernel (chosen only where it is installed: ops.Kernel.requires).
OPTIONAL_IMPORTS = frozenset({
    "torch_npu", "torchair", "modelscope", "gradio", "selenium", "av", "mx_driving",
    "fastapi", "starlette", "uvicorn", "prometheus_client", "ray",
})  # fmt: skip
# Import names whose distribution is named otherwise (after normalisation).
IMPORT_TO_DISTRIBUTION = {"PIL": "pillow", "yaml": "pyyaml"}
# Variables that would point git at another repository than the folder it runs in.
# Answers git's credential requests from the environment, so that the token is never on a command line or on disk.
# The empty value first drops the user's helpers, so that none of them stores the token.
_GIT_AUTH = (
    "-c",
    "credential.helper=",
    "-c",
    'credential.helper=!f() { test "$1" = get || return 0; '
    'echo "username=$DELIVERYKIT_GIT_USER"; echo "password=$GITCODE_TOKEN"; }; f',
)
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
_METADATA_FIELDS = {  # key -> (pattern, what it must be)
    "task": (re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*"), "a hub task id such as image-to-3d"),
    "base_model": (_REPO_ID, "a model id such as microsoft/TRELLIS.2-4B"),
    "library_name": (re.compile(r"[A-Za-z0-9][\w.-]*"), "a library name such as pytorch"),
}
# Optional "smoke": the commands (run in the delivery folder) that try it without weights, for the staged README.
_SMOKE_COMMAND = re.compile(r"python [\w ./=:-]+")
DEFAULT_SMOKE = ("python inference.py --smoke tiny --device cpu --output outputs/smoke",)


class PublishError(DeliveryError):
    """Unusable delivery metadata, an uncovered import, a bad repository id or a missing token.

    ``ExitCode.INPUT``: like the patch commands, the fix is to the input (the delivery, the arguments, the
    environment). Failures to write the tree or to reach the hub are :class:`OutputError` (``ExitCode.OUTPUT``).
    """

    exit_code = ExitCode.INPUT


@dataclasses.dataclass(frozen=True)
class HubMetadata:
    """A delivery's ``publish.json``: what the hubs' model cards need beyond the README."""

    task: str  # ModelScope task id, e.g. image-to-3d
    base_model: str  # the upstream model id
    library_name: str  # Modelers' library_name
    path: Path
    smoke: tuple[str, ...] = DEFAULT_SMOKE  # commands that run the delivery without weights, from its folder


@dataclasses.dataclass(frozen=True)
class StagedTree:
    path: Path
    hub: str
    files: tuple[str, ...]  # every file of the tree, relative, sorted
    untracked: tuple[str, ...]  # files in the delivery that git does not track, so were left out


@dataclasses.dataclass(frozen=True)
class PushResult:
    target: str  # where the files went, as shown to the user
    files: int
    commit: str | None = None  # GitCode: the commit pushed; None when the branch already held the staged tree


# ----------------------------------------------------------------------------------------------------------------
# Delivery inputs


def load_hub_metadata(delivery: str | os.PathLike) -> HubMetadata:
    """Read and check ``<delivery>/publish.json`` (``schema_version`` 1, ``task``, ``base_model``, ``library_name``)."""
    path = Path(delivery) / METADATA_NAME
    example = '{"schema_version": 1, "task": "image-to-3d", "base_model": "owner/name", "library_name": "pytorch"}'
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise PublishError(f"{path} not found; create it with the hub metadata, e.g. {example}") from err
    except (OSError, UnicodeDecodeError) as err:
        raise PublishError(f"cannot read {path} ({err})") from err
    except json.JSONDecodeError as err:
        raise PublishError(f"{path} is not valid JSON (line {err.lineno}: {err.msg})") from err
    if not isinstance(data, dict):
        raise PublishError(f"{path} must hold a JSON object like {example}")
    unknown = sorted(set(data) - {"schema_version", "smoke", *_METADATA_FIELDS})
    if unknown:
        raise PublishError(f"{path} has unknown key(s) {', '.join(unknown)}; the keys are {example}")
    if data.get("schema_version") != 1:
        raise PublishError(f"{path}: schema_version must be 1, got {data.get('schema_version')!r}")
    for key, (pattern, meaning) in _METADATA_FIELDS.items():
        value = data.get(key)
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise PublishError(f"{path}: {key} must be {meaning}, got {value!r}")
    smoke = data.get("smoke", list(DEFAULT_SMOKE))
    valid = isinstance(smoke, list) and smoke and all(isinstance(c, str) and _SMOKE_COMMAND.fullmatch(c) for c in smoke)
    if not valid:
        raise PublishError(f"{path}: smoke must be a list of commands like {list(DEFAULT_SMOKE)}, got {smoke!r}")
    return HubMetadata(data["task"], data["base_model"], data["library_name"], path, tuple(smoke))


def delivery_files(delivery: str | os.PathLike) -> tuple[list[str], list[str]]:
    """(files to stage, files left out) of a delivery, relative to it.

    Inside git: the tracked files that exist, and the untracked, not ignored ones as left out. Outside git: every
    file, skipping caches and ``outputs/``.
    """
    delivery = Path(delivery)
    if shutil.which("git") is not None and _git(["rev-parse", "--is-inside-work-tree"], delivery).returncode == 0:
        tracked = _git_paths(["ls-files", "-z", "--cached", "--", "."], delivery)
        untracked = _git_paths(["ls-files", "-z", "--others", "--exclude-standard", "--", "."], delivery)
        if not tracked:
            raise PublishError(f"git tracks no file in {delivery}; git add the delivery's files, then stage again")
        existing = [path for path in tracked if (delivery / path).is_file()]
        return existing, untracked
    return walk_files(delivery), []


def walk_files(root: str | os.PathLike) -> list[str]:
    """Every file under ``root`` (relative, sorted), skipping caches, ``.git``, ``outputs/`` and ``*.pyc``."""
    root = Path(root)
    found = []
    for folder, dirnames, filenames in os.walk(root):
        dirnames[:] = [name for name in dirnames if name not in SKIP_DIRS]
        for name in filenames:
            if not name.endswith(".pyc"):
                found.append(Path(folder, name).relative_to(root).as_posix())
    return sorted(found)


def _git_paths(args: Sequence[str], cwd: Path) -> list[str]:
    done = _git(args, cwd)
    if done.returncode != 0:
        raise PublishError(f"git {' '.join(args[:1])} failed in {cwd} ({_first_line(done.stderr)})")
    return sorted(path for path in done.stdout.split("\0") if path)


# ----------------------------------------------------------------------------------------------------------------
# Requirements


def required_imports(package_dir: str | os.PathLike) -> dict[str, list[str]]:
    """Third-party top-level modules the package imports, with the files importing them.

    Standard-library modules, the package itself, :data:`OPTIONAL_IMPORTS` and imports under ``if TYPE_CHECKING:``
    do not count. An ``except ImportError`` does not make an import optional: most only give a clearer error.
    """
    package_dir = Path(package_dir)
    found: dict[str, set[str]] = {}
    for file in sorted(package_dir.rglob("*.py")):
        if "__pycache__" in file.parts:
            continue
        visitor = _ImportVisitor()
        visitor.visit(ast.parse(file.read_text(encoding="utf-8"), filename=str(file)))
        for module in visitor.modules - OPTIONAL_IMPORTS - {package_dir.name}:
            if module not in sys.stdlib_module_names:
                found.setdefault(module, set()).add(file.relative_to(package_dir).as_posix())
    return {module: sorted(files) for module, files in sorted(found.items())}


class _ImportVisitor(ast.NodeVisitor):
    """Collects the top-level modules of absolute imports, except the type-checking-only ones."""

    def __init__(self) -> None:
        self.modules: set[str] = set()

    def visit_Import(self, node: ast.Import) -> None:
        self.modules.update(alias.name.split(".")[0] for alias in node.names)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            self.modules.add(node.module.split(".")[0])

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
        if name == "TYPE_CHECKING":
            for statement in node.orelse:
                self.visit(statement)
        else:
            self.generic_visit(node)


def requirement_names(text: str) -> set[str]:
    """Normalised distribution names a requirements file lists (options such as ``-r`` are not followed)."""
    return {name for name in map(_requirement_name, text.splitlines()) if name}


def _requirement_name(line: str) -> str | None:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line.split("#", 1)[0])
    return normalize_name(match.group(1)) if match else None


def normalize_name(name: str) -> str:
    """PEP 503 name: ``Typing_Extensions`` and ``typing.extensions`` are ``typing-extensions``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def check_requirements_cover(package_dir: str | os.PathLike, pinned: set[str], requirements: str) -> None:
    """Raise :class:`PublishError` naming each import of the package that no name in ``pinned`` installs.

    ``requirements`` names the file to fix in the message.
    """
    missing = {
        module: files
        for module, files in required_imports(package_dir).items()
        if normalize_name(IMPORT_TO_DISTRIBUTION.get(module, module)) not in pinned
    }
    if missing:
        names = ", ".join(f"{module} ({', '.join(files)})" for module, files in missing.items())
        raise PublishError(
            f"{Path(package_dir).name} imports {names}, which {requirements} does not pin; add the pin(s) there, "
            "since the staged tree installs from that file"
        )


def testing_requirements(dev_requirements: str | os.PathLike) -> str:
    """``requirements-test.txt``: the pytest lines of the monorepo's ``ci/requirements-dev.txt``, markers included."""
    path = Path(dev_requirements)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise PublishError(f"cannot read {path} ({err.strerror}); stage from a checkout of the monorepo") from err
    picked = [line for line in lines if _is_pytest_package(_requirement_name(line))]
    if not any(_requirement_name(line) == "pytest" for line in picked):
        raise PublishError(f"{path} pins no pytest; add pytest==X there")
    header = "# Test tools for `python -m pytest` here; pinned as in the monorepo's ci/requirements-dev.txt.\n"
    return header + "\n".join(picked) + "\n"


def _is_pytest_package(name: str | None) -> bool:
    return name is not None and (name in PYTEST_PACKAGES or name.startswith("pytest-"))


# ----------------------------------------------------------------------------------------------------------------
# Generated files


def front_matter(hub: str, metadata: HubMetadata) -> str:
    """The model-card YAML the hub reads from the top of README.md; GitCode reads none."""
    if hub == "modelscope":
        fields: dict[str, Any] = {
            "license": "apache-2.0",
            "frameworks": ["PyTorch"],
            "tasks": [metadata.task],
            "base_model": metadata.base_model,
        }
    elif hub == "modelers":
        fields = {
            "license": "apache-2.0",
            "hardwares": ["NPU"],
            "frameworks": ["PyTorch"],
            "library_name": metadata.library_name,
        }
    else:
        return ""
    lines = ["---"]
    for key, value in fields.items():  # values are plain YAML scalars: publish.json's patterns allow nothing else
        lines += [f"{key}:", *(f"  - {item}" for item in value)] if isinstance(value, list) else [f"{key}: {value}"]
    return "\n".join([*lines, "---", "", ""])


def standalone_section(
    delivery_name: str,
    *,
    npu_requirements: bool,
    smoke: Sequence[str] = DEFAULT_SMOKE,
    app: bool = False,
    serve: bool = False,
) -> str:
    """What changes when the delivery is used on its own; the rest of the README is written for the monorepo.

    ``app``: the delivery ships a web demo (``app.py``, ``requirements-app.txt``, ModelScope Studio's
    ``ms_deploy.json``), and the section says how to launch it; ``serve``: it ships the HTTP server (``serve.py``,
    on the same ``requirements-app.txt``).
    """
    npu = "   # on Ascend also: -r npu-requirements.txt" if npu_requirements else ""
    web = (
        "pip install -r requirements-app.txt   # the web demo (Gradio; Python >= 3.11)\n"
        "python app.py --smoke   # prints URL=http://127.0.0.1:7860/; --weights ... for the real model\n"
        if app
        else ""
    )
    if serve:
        web += "python serve.py --smoke   # the HTTP API (requirements-app.txt); prints URL=http://127.0.0.1:8000/\n"
    return (
        "## Standalone use\n\n"
        f"This is the `{delivery_name}` delivery on its own: the shared helper package is vendored in `deliverykit/`, "
        "and every command runs from this folder. Where this README writes "
        f"`{delivery_name}/...`, drop the `{delivery_name}/` prefix; `deliverykit ...` is `python -m deliverykit ...` "
        "here, `make test` is `python -m pytest`, and the other `make` targets need the monorepo.\n\n"
        "```bash\n"
        f"pip install -r requirements.txt{npu}\n"
        "pip install --no-deps -e .   # this folder's package and deliverykit, for the scripts and benchmarks\n"
        + "".join(f"{command}\n" for command in smoke)
        + web
        + "pip install -r requirements-test.txt\n"
        "python -m pytest\n"
        "```\n\n"
        + (
            "As a ModelScope Studio (创空间), this folder deploys as it is: `ms_deploy.json` runs `app.py` on the "
            "tiny random-weight model (`DELIVERY_APP_ARGS`); point it at real weights there with `--weights`.\n\n"
            if app
            else ""
        )
    )


def staged_readme(
    readme: str,
    hub: str,
    metadata: HubMetadata,
    delivery_name: str,
    *,
    npu_requirements: bool,
    app: bool = False,
    serve: bool = False,
) -> str:
    """Front matter on top, "Standalone use" before the first ``##`` section, the rest unchanged."""
    if readme.startswith("---"):
        raise PublishError(f"{delivery_name}/README.md starts with front matter; remove it, staging writes the hub's")
    section = standalone_section(
        delivery_name, npu_requirements=npu_requirements, smoke=metadata.smoke, app=app, serve=serve
    )
    first = re.search(r"^## ", readme, flags=re.MULTILINE)
    body = readme[: first.start()] + section + readme[first.start() :] if first else f"{readme.rstrip()}\n\n{section}"
    return front_matter(hub, metadata) + body


def staged_pyproject(text: str, delivery_name: str) -> str:
    """The delivery's ``pyproject.toml`` for the standalone tree: its package and the vendored deliverykit, no deps.

    The monorepo's file depends on ``deliverykit`` (installed editable next to it); the staged tree ships that
    package itself, so the dependency becomes a second package of the same distribution.
    """
    package = delivery_name.replace("-", "_")
    replacements = {
        'dependencies = ["deliverykit"]': "dependencies = []  # deliverykit is vendored here; pins: requirements.txt",
        f'include = ["{package}*"]': f'include = ["{package}*", "deliverykit*"]',
    }
    for old, new in replacements.items():
        if text.count(old) != 1:
            raise PublishError(f"{delivery_name}/pyproject.toml must have the line {old!r} once; restore it")
        text = text.replace(old, new)
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#")).strip()
    header = (
        f"# {delivery_name} on its own: its package and the vendored deliverykit. Install the pins first\n"
        "# (pip install -r requirements.txt), then this folder: pip install --no-deps -e .\n"
    )
    data = 'deliverykit = ["schemas/*.json"]'
    if "[tool.setuptools.package-data]" in body:
        body = body.replace("[tool.setuptools.package-data]", f"[tool.setuptools.package-data]\n{data}")
    else:
        body += f"\n\n[tool.setuptools.package-data]\n{data}"
    return f"{header}{body}\n"


def notice_text(delivery_name: str, manifest: Manifest, upstream: Upstream | None, *, has_patches: bool) -> str:
    """NOTICE: what this package ships (our code, Apache-2.0) and what it does not (upstream code and weights)."""
    lines = [
        f"{delivery_name}: Ascend NPU delivery package",
        "",
        "WHAT THIS PACKAGE SHIPS",
        "",
        f"The code and documentation of {delivery_name}, with the helper package deliverykit/ vendored in it, are our "
        "work, licensed under the Apache License, Version 2.0 (see LICENSE).",
        "",
        "WHAT THIS PACKAGE DOES NOT SHIP",
        "",
    ]
    if upstream is None:
        lines.append("Upstream code: none beyond the packages that requirements.txt installs.")
    else:
        code = (
            f"Upstream code: {upstream.name} at commit {upstream.commit} ({upstream.urls[0]}), under its own "
            "licence (see that repository)."
        )
        if has_patches:
            code += " The files in patches/ change that code; the lines they carry stay under its licence."
        lines.append(code)
    lines += [
        "",
        "Weights: none are included. Each checkpoint is downloaded separately by the user (see README.md and "
        "weights-manifest.json) and is under its own licence:",
        "",
    ]
    for model in manifest.models:
        revision = f"revision {model.revision[:12]}" if model.revision else "revision not pinned"
        url = f" ({model.license_url})" if model.license_url else ""
        lines.append(f"- {model.id} ({model.role}, {revision}): {model.license}{url}")
    return "\n".join(lines) + "\n"


def pytest_ini() -> str:
    return (
        "# `python -m pytest` here runs tests/ as the monorepo does (importlib import mode, so test files may share\n"
        "# names with other deliveries').\n"
        "[pytest]\n"
        f"addopts = {PYTEST_ADDOPTS}\n"
        "testpaths = tests\n"
        "markers =\n" + "".join(f"    {marker}\n" for marker in PYTEST_MARKERS)
    )


# ----------------------------------------------------------------------------------------------------------------
# Staging


def stage_delivery(delivery: str | os.PathLike, out: str | os.PathLike, hub: str = "modelscope") -> StagedTree:
    """Build the standalone tree of ``delivery`` for ``hub`` in ``out`` (new or empty).

    Everything is read and checked before anything is written; the tree is built in a hidden folder next to ``out``
    and renamed onto it, so a failure leaves ``out`` as it was.
    """
    delivery, out = Path(delivery), Path(out)
    if hub not in HUBS:
        raise PublishError(f"unknown hub {hub!r}; pass one of {', '.join(HUBS)}")
    if not delivery.is_dir():
        raise PublishError(f"delivery folder {delivery} not found; pass e.g. --delivery trellis2-npu")
    monorepo = delivery.resolve().parent
    for name in REQUIRED_FILES:
        if not (delivery / name).is_file():
            raise PublishError(f"{delivery / name} not found; a published delivery needs {', '.join(REQUIRED_FILES)}")
    license_file = monorepo / "LICENSE"
    if not license_file.is_file():
        raise PublishError(f"{license_file} not found; stage from a checkout of the monorepo (it holds the LICENSE)")

    files, untracked = delivery_files(delivery)
    files = sorted(set(files) | set(REQUIRED_FILES))
    clashes = sorted({path for path in files if path.split("/")[0] in GENERATED})
    if clashes:
        raise PublishError(f"{delivery} has {', '.join(clashes)}, which staging generates; rename or remove it")
    metadata = load_hub_metadata(delivery)
    manifest = load_manifest(delivery / "weights-manifest.json")
    upstream = load_upstream(delivery) if metadata_path(delivery).is_file() else None
    test_requirements = testing_requirements(monorepo / "ci" / "requirements-dev.txt")
    # deliverykit.testing needs pytest, which requirements-test.txt brings; everything else must be a runtime pin.
    pinned = requirement_names((delivery / "requirements.txt").read_text(encoding="utf-8"))
    check_requirements_cover(
        PACKAGE_DIR, pinned | requirement_names(test_requirements), str(delivery / "requirements.txt")
    )
    generated = {
        "README.md": staged_readme(
            (delivery / "README.md").read_text(encoding="utf-8"),
            hub,
            metadata,
            delivery.resolve().name,
            npu_requirements="npu-requirements.txt" in files,
            app="app.py" in files,
            serve="serve.py" in files,
        ),
        "pyproject.toml": staged_pyproject(
            (delivery / "pyproject.toml").read_text(encoding="utf-8"), delivery.resolve().name
        ),
        "requirements-test.txt": test_requirements,
        "pytest.ini": pytest_ini(),
        "NOTICE": notice_text(
            delivery.resolve().name, manifest, upstream, has_patches=bool(upstream and find_patches(delivery))
        ),
    }
    _check_out(out, delivery)

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.stage-"))
    except OSError as err:
        raise OutputError(f"cannot create a folder in {out.parent} ({err.strerror}); pick a writable --out") from err
    try:
        tree = work / "tree"
        tree.mkdir()
        for path in files:
            (tree / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(delivery / path, tree / path)
        shutil.copytree(PACKAGE_DIR, tree / "deliverykit", ignore=shutil.ignore_patterns(*SKIP_DIRS, "*.pyc"))
        shutil.copy2(license_file, tree / "LICENSE")
        for name, text in generated.items():
            (tree / name).write_text(text, encoding="utf-8")
        tree.rename(out)  # also replaces an empty folder
    except OSError as err:
        raise OutputError(f"cannot write the staged tree to {out} ({err}); nothing was left there") from err
    finally:
        shutil.rmtree(work, ignore_errors=True)
    left_out = tuple(path for path in untracked if path not in files)
    return StagedTree(out, hub, tuple(walk_files(out)), left_out)


def _check_out(out: Path, delivery: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OutputError(f"{out} exists and is not empty; pass a new or empty folder to --out (nothing was changed)")
    if out.resolve().is_relative_to(delivery.resolve()):
        raise OutputError(f"{out} is inside the delivery {delivery}; pass an --out outside it")


# ----------------------------------------------------------------------------------------------------------------
# Pushing


def check_repo_id(repo_id: str) -> str:
    if not _REPO_ID.fullmatch(repo_id):
        raise PublishError(f"repository id {repo_id!r} is not owner/name; pass e.g. --repo my-org/trellis2-npu")
    return repo_id


def check_staged(staged: str | os.PathLike) -> list[str]:
    """The files to push from a staged tree; refuses a folder that ``publish stage`` did not make."""
    staged = Path(staged)
    if not (staged / "deliverykit" / "__init__.py").is_file() or not (staged / "README.md").is_file():
        raise PublishError(
            f"{staged} is not a staged delivery (no README.md or deliverykit/); make one with deliverykit publish stage"
        )
    return walk_files(staged)


def token_from_env(target: str) -> str:
    """The hub token from its environment variable; never from a file or an argument, so it is never logged."""
    name = TOKEN_ENV[target]
    token = os.environ.get(name, "").strip()
    if not token:
        raise PublishError(f"{name} is not set; export {name}=<your {target} access token> and push again")
    return token


def gitcode_url(repo_id: str) -> str:
    return f"https://gitcode.com/{repo_id}.git"


def push_modelscope(staged: str | os.PathLike, repo_id: str, *, token: str, message: str) -> PushResult:
    """Upload the staged files with ``HubApi().upload_folder`` (the SDK creates the repository if needed).

    A temporary copy is uploaded, so that the SDK's upload cache never lands in the staged tree.
    """
    files = check_staged(staged)
    check_repo_id(repo_id)
    try:
        from modelscope.hub.api import HubApi
    except ImportError as err:
        raise PublishError("pushing to ModelScope needs the ModelScope SDK: pip install modelscope") from err
    with _copy_of(staged, files) as folder:
        try:
            HubApi().upload_folder(
                repo_id=repo_id, folder_path=str(folder), commit_message=message, token=token, repo_type="model"
            )
        except Exception as err:  # the SDK raises many types; each one means the upload did not happen
            reason = _first_line(str(err)) or type(err).__name__
            raise OutputError(
                _mask(
                    f"upload to ModelScope {repo_id} failed ({reason}); check the id and that "
                    f"{TOKEN_ENV['modelscope']} may write to it",
                    token,
                )
            ) from err
    return PushResult(f"https://modelscope.cn/models/{repo_id}", len(files))


def push_gitcode(
    staged: str | os.PathLike,
    repo_id: str,
    *,
    token: str,
    message: str,
    branch: str = "main",
    remote_url: str | None = None,
    username: str | None = None,
) -> PushResult:
    """Commit the staged files on top of ``branch`` of the remote and push, in a temporary repository.

    The new commit holds exactly the staged tree (files only on the remote are removed in it); the remote's
    history is kept, so no force push is needed. ``remote_url`` replaces ``https://gitcode.com/<repo_id>.git``.
    """
    files = check_staged(staged)
    check_repo_id(repo_id)
    url = remote_url or gitcode_url(repo_id)
    env = {TOKEN_ENV["gitcode"]: token, "DELIVERYKIT_GIT_USER": username or repo_id.split("/")[0]}

    with _copy_of(staged, files) as work:

        def run(*args: str, what: str) -> str:
            done = _git(args, work, env)
            if done.returncode != 0:
                reason = _first_line(done.stderr or done.stdout)
                raise OutputError(
                    _mask(
                        f"{what} {url} failed ({reason}); check that the repository exists, that "
                        f"{TOKEN_ENV['gitcode']} may write to it, and the network",
                        token,
                    )
                )
            return done.stdout

        run("init", "-q", what="preparing the push to")
        run("symbolic-ref", "HEAD", f"refs/heads/{branch}", what="preparing the push to")
        has_branch = bool(run(*_GIT_AUTH, "ls-remote", "--heads", url, f"refs/heads/{branch}", what="reading").strip())
        if has_branch:
            run(*_GIT_AUTH, "fetch", "-q", "--depth=1", url, f"refs/heads/{branch}", what="fetching")
            run("reset", "-q", "FETCH_HEAD", what="preparing the push to")  # index = remote tree, files = staged
        run("add", "-A", what="preparing the push to")
        if has_branch and _git(["diff", "--cached", "--quiet"], work).returncode == 0:
            return PushResult(f"{url} ({branch})", len(files))
        run(*_identity(work), "commit", "-q", "-m", message, what="committing for")
        run(*_GIT_AUTH, "push", "-q", url, f"HEAD:refs/heads/{branch}", what="pushing to")
        commit = run("rev-parse", "HEAD", what="reading the commit for").strip()
    return PushResult(f"{url} ({branch})", len(files), commit)


@contextlib.contextmanager
def _copy_of(staged: str | os.PathLike, files: Sequence[str]) -> Iterator[Path]:
    """A temporary copy of ``files``: the push tools write their own files (.git, caches) there, not in the tree."""
    with tempfile.TemporaryDirectory(prefix="deliverykit-publish-") as tmp:
        root = Path(tmp, "tree")
        for path in files:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(staged, path), root / path)
        yield root


def _identity(work: Path) -> list[str]:
    """The user's git identity when set, else a neutral one, so a machine without git config can push."""
    if _git(["config", "user.email"], work).stdout.strip():
        return []
    return ["-c", "user.name=deliverykit", "-c", "user.email=deliverykit@localhost"]


def _git(args: Sequence[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return run_tool(["git", *args], cwd, env)


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else ""


def _mask(text: str, secret: str) -> str:
    return text.replace(secret, "***") if secret else text
