"""Upstream patches: a delivery's small patches against a pinned upstream commit, applied all or none.

A delivery never commits upstream code. ``<delivery>/patches/upstream.json`` (schema ``schemas/upstream.schema.json``)
names the upstream repository, the URLs to clone it from and the pinned commit; ``<delivery>/patches/NNNN-*.patch``
apply on top of that commit, in file-name order.

- :func:`check_pin` compares a checkout's ``HEAD`` with the pin. A tree without git (an extracted tarball) has no
  known commit: it is patched with ``patch -p1`` instead of ``git apply``, and the caller gets a warning.
- :func:`check_patches`, :func:`apply_patches` and :func:`patch_status` never run a patch tool on the user's tree.
  They copy the files the patches name into a scratch folder and apply the patches there one after another, so that
  each patch is checked on top of the previous ones. :func:`apply_patches` moves the results into the tree only when
  every patch applied: a patch that fails, first or last, leaves the tree as it was.
- :func:`clone_upstream` clones the pinned commit from the first URL that serves it.
- :func:`find_patched_upstream` is what a delivery calls at run time (``--upstream`` or ``$ENV``, checked against the
  pin and the patches), and :func:`import_from_checkout` the one way code is imported from a checkout: upstream trees
  are source folders, not installed packages, and no delivery touches ``sys.path``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

from deliverykit.errors import DeliveryError, ExitCode, OutputError
from deliverykit.process import run_tool

# Shipped inside the package so a vendored deliverykit validates too.
SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "upstream.schema.json"
METADATA_NAME = "upstream.json"
PATCH_NAME = re.compile(r"^(\d{4})-.+\.patch$")

# PatchResult.state values.
OK = "ok"
FAILS = "fails"
NOT_CHECKED = "not checked"  # an earlier patch failed, so there is nothing to check this one on top of
APPLIED = "applied"
NOT_APPLIED = "not applied"

# Variables that would point git at another repository than the folder it runs in.
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_C_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13}


class PatchError(DeliveryError):
    """Wrong upstream commit, a patch that does not apply, or unusable metadata, patches or upstream tree.

    ``ExitCode.INPUT``: the upstream tree and the patches are the input of these commands, and the fix is the same as
    for a wrong input file (pass the right checkout, or fix the patch), so no new exit code is needed.
    """

    exit_code = ExitCode.INPUT


@dataclasses.dataclass(frozen=True)
class Upstream:
    """A delivery's ``patches/upstream.json``."""

    name: str
    urls: tuple[str, ...]
    commit: str
    notes: str
    path: Path

    @property
    def patches_dir(self) -> Path:
        return self.path.parent


@dataclasses.dataclass(frozen=True)
class Tree:
    """An upstream source tree, with its commit when it is the top folder of a git checkout."""

    path: Path
    commit: str | None

    @property
    def tool(self) -> str:
        """``git`` (``git apply``) for a checkout, ``patch`` for a tree without git."""
        return "git" if self.commit is not None else "patch"


@dataclasses.dataclass(frozen=True)
class PatchResult:
    patch: Path
    state: str
    reason: str = ""  # first line of the tool's explanation when the patch does not apply

    @property
    def name(self) -> str:
        return self.patch.name


@dataclasses.dataclass(frozen=True)
class CloneResult:
    path: Path
    url: str  # the URL that served the pinned commit
    failures: tuple[tuple[str, str], ...]  # (url, first line of git's reason) for each URL tried before it


# ----------------------------------------------------------------------------------------------------------------
# Metadata and patch files


def metadata_path(delivery: str | os.PathLike) -> Path:
    return Path(delivery) / "patches" / METADATA_NAME


def validate_upstream_data(data: Any, source: str = METADATA_NAME) -> None:
    """Raise :class:`PatchError` naming the JSON path of the most relevant schema error in ``data``."""
    try:
        import jsonschema
    except ImportError as err:
        raise PatchError(f"validating {source} needs the jsonschema package: pip install jsonschema") from err
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_PATH.read_text(encoding="utf-8")))
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        message = " ".join(error.message.split())
        if len(message) > 200:
            message = message[:197] + "..."
        raise PatchError(f"upstream metadata {source} is invalid at {error.json_path}: {message}")


def load_upstream(delivery: str | os.PathLike) -> Upstream:
    """Read and validate ``<delivery>/patches/upstream.json``."""
    path = metadata_path(delivery)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise PatchError(f"{path} not found; pass the delivery folder (e.g. trellis2-npu) to --delivery") from err
    except OSError as err:
        raise PatchError(f"cannot read {path} ({err.strerror})") from err
    except json.JSONDecodeError as err:
        raise PatchError(f"{path} is not valid JSON (line {err.lineno}: {err.msg})") from err
    validate_upstream_data(data, str(path))
    return Upstream(data["name"], tuple(data["urls"]), data["commit"], data["notes"], path)


def find_patches(delivery: str | os.PathLike) -> list[Path]:
    """The delivery's ``patches/NNNN-*.patch`` in order; a ``.patch`` named otherwise is refused, not skipped."""
    numbers: dict[str, Path] = {}
    for patch in sorted((Path(delivery) / "patches").glob("*.patch")):
        match = PATCH_NAME.match(patch.name)
        if match is None:
            raise PatchError(f"patch {patch} is not named NNNN-<name>.patch; rename it so that its place is explicit")
        if match.group(1) in numbers:
            raise PatchError(f"patches {numbers[match.group(1)].name} and {patch.name} share a number; renumber one")
        numbers[match.group(1)] = patch
    return list(numbers.values())


def patch_paths(patch: str | os.PathLike) -> list[str]:
    """Tree-relative paths a patch reads or writes, from its headers, as ``git apply`` and ``patch -p1`` see them.

    Hunk bodies are skipped by their line counts, since a removed line can itself start with ``--- ``.
    """
    patch = Path(patch)
    paths: set[str] = set()
    old = new = 0  # lines left in the current hunk
    for raw_line in patch.read_text(encoding="utf-8", errors="surrogateescape").split("\n"):
        line = raw_line.rstrip("\r")
        if old > 0 or new > 0:
            if line[:1] in (" ", "", "-"):
                old -= 1
            if line[:1] in (" ", "", "+"):
                new -= 1
            continue
        names: list[str | None] = []
        if hunk := _HUNK.match(line):
            old, new = int(hunk.group(1) or 1), int(hunk.group(2) or 1)
        elif line.startswith(("--- ", "+++ ")):
            names = [_strip_prefix(_header_name(line[4:]))]
        elif line.startswith(("rename from ", "rename to ", "copy from ", "copy to ")):
            names = [_header_name(line.split(" ", 2)[2])]
        elif line.startswith("diff --git "):  # the only header naming the file of a mode change or an empty new file
            names = [_strip_prefix(name) for name in _git_header_names(line[len("diff --git ") :])]
        for name in names:
            if name is not None:
                paths.add(_inside_tree(name, patch))
    return sorted(paths)


def _header_name(field: str) -> str | None:
    """The file name opening a header field: C-quoted by git when unusual, else up to a tab (a date may follow)."""
    if field.startswith('"'):
        return _unquote(field)[0]
    name = field.split("\t", 1)[0]
    return None if name == "/dev/null" else name


def _git_header_names(rest: str) -> list[str]:
    if rest.startswith('"'):
        first, rest = _unquote(rest)
        rest = rest.lstrip(" ")
        return [first, _unquote(rest)[0] if rest.startswith('"') else rest]
    # "a/X b/X": split in the middle when both halves name the same file (git's own rule, as X may hold spaces).
    half = (len(rest) - 1) // 2
    first, second = rest[:half], rest[half + 1 :]
    if rest[half : half + 1] == " " and first.partition("/")[2] == second.partition("/")[2]:
        return [first, second]
    return []  # a rename: its "rename from/to" lines name the files


def _unquote(text: str) -> tuple[str, str]:
    """Decode the C-quoted name git writes at the start of ``text``; returns (name, text after the closing quote)."""
    out = bytearray()
    i = 1
    while i < len(text) and text[i] != '"':
        if text[i] == "\\" and i + 1 < len(text):
            escaped = text[i + 1]
            if escaped in "01234567":
                out.append(int(text[i + 1 : i + 4], 8))
                i += 4
                continue
            out.append(_C_ESCAPES.get(escaped, ord(escaped)))
            i += 2
            continue
        out += text[i].encode("utf-8", "surrogateescape")
        i += 1
    return out.decode("utf-8", "surrogateescape"), text[i + 1 :]


def _strip_prefix(name: str | None) -> str | None:
    """Drop the first path component (``a/``, ``b/``), as ``-p1`` does."""
    if name is None or "/" not in name:
        return None
    return name.split("/", 1)[1]


def _inside_tree(name: str, patch: Path) -> str:
    if name.startswith("/") or ".." in PurePosixPath(name).parts:
        raise PatchError(f"patch {patch.name} names {name}, which is outside the source tree; fix the patch")
    return name


# ----------------------------------------------------------------------------------------------------------------
# The upstream tree and its pin


def open_tree(path: str | os.PathLike) -> Tree:
    path = Path(path)
    if not path.is_dir():
        raise PatchError(
            f"upstream folder {path} not found; pass the upstream source tree to --upstream "
            "(deliverykit upstream clone makes one)"
        )
    return Tree(path, _head_commit(path))


def _head_commit(path: Path) -> str | None:
    """HEAD when ``path`` is the top folder of a checkout; None without git, or inside another checkout."""
    if shutil.which("git") is None:
        return None
    top = _run(["git", "rev-parse", "--show-toplevel"], path)
    if top.returncode != 0 or Path(top.stdout.strip()).resolve() != path.resolve():
        return None  # a tarball extracted inside another repository: that repository's HEAD says nothing
    head = _run(["git", "rev-parse", "--verify", "--quiet", "HEAD^{commit}"], path)
    return head.stdout.strip() if head.returncode == 0 else None


def pin_mismatch(tree: Tree, upstream: Upstream) -> str | None:
    """Why ``tree`` may not be the pinned commit (another commit, or no git to tell); None when it is."""
    if tree.commit is None:
        return (
            f"{tree.path} is not a git checkout, so its commit is unknown; the patches are made for "
            f"{upstream.name} at {upstream.commit}"
        )
    if tree.commit != upstream.commit:
        return f"upstream checkout {tree.path} is at {tree.commit}, but {upstream.name} is pinned at {upstream.commit}"
    return None


def check_pin(tree: Tree, upstream: Upstream, *, force: bool = False) -> str | None:
    """Refuse a checkout at another commit than the pin unless ``force``; return the warning to show, if any."""
    problem = pin_mismatch(tree, upstream)
    if problem is None or tree.commit is None:
        return problem
    if force:
        return f"{problem}; going on because of --force"
    raise PatchError(
        f"{problem}; check out the pin with: git -C {shlex.quote(str(tree.path))} checkout {upstream.commit} "
        "(or pass --force to try the patches anyway)"
    )


# ----------------------------------------------------------------------------------------------------------------
# Checking, applying, status


def check_patches(tree: Tree, patches: Sequence[Path]) -> list[PatchResult]:
    """Whether each patch applies on top of the previous ones; reads the tree only."""
    with _scratch_copy(tree, patches) as scratch:
        return _apply_in_order(tree.tool, scratch, patches)


def apply_patches(tree: Tree, patches: Sequence[Path]) -> list[PatchResult]:
    """Apply every patch, or none: the tree changes only when every result is ``ok``.

    The patched files are first staged next to their targets and then renamed over them, so even a write error
    (a full disk) leaves the tree as it was; it raises :class:`OutputError` then.
    """
    with _scratch_copy(tree, patches) as scratch:
        results = _apply_in_order(tree.tool, scratch, patches)
        if all(result.state == OK for result in results):
            _move_results(scratch, tree.path)
        return results


def patch_status(tree: Tree, patches: Sequence[Path]) -> list[PatchResult]:
    """``applied`` or ``not applied`` for each patch; reads the tree only.

    Patches are undone from the last one, so that a patch which a later applied patch builds on still reads as
    applied.
    """
    results = []
    with _scratch_copy(tree, patches) as scratch:
        for patch in reversed(patches):
            reason = _apply_one(tree.tool, scratch.root, patch, reverse=True)
            results.append(PatchResult(patch, NOT_APPLIED if reason else APPLIED))
    return results[::-1]


@dataclasses.dataclass(frozen=True)
class _Scratch:
    root: Path
    copied: frozenset[str]  # tree-relative paths copied from the tree


@contextlib.contextmanager
def _scratch_copy(tree: Tree, patches: Sequence[Path]) -> Iterator[_Scratch]:
    """A temporary folder with copies of the tree's files that the patches name: the tools read nothing else."""
    _require_tool(tree.tool)
    paths = sorted({path for patch in patches for path in patch_paths(patch)})
    with tempfile.TemporaryDirectory(prefix="deliverykit-patches-") as tmp:
        root = Path(tmp, "tree")
        root.mkdir()
        copied = set()
        for path in paths:
            source = tree.path / path
            if source.is_symlink() or source.is_file():
                (root / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, root / path, follow_symlinks=False)
                copied.add(path)
        yield _Scratch(root, frozenset(copied))


def _apply_in_order(tool: str, scratch: _Scratch, patches: Sequence[Path]) -> list[PatchResult]:
    results: list[PatchResult] = []
    for patch in patches:
        failed = next((r for r in results if r.state != OK), None)
        if failed is not None:
            results.append(PatchResult(patch, NOT_CHECKED, f"{failed.name} does not apply"))
            continue
        reason = _apply_one(tool, scratch.root, patch, reverse=False)
        results.append(PatchResult(patch, FAILS, reason) if reason else PatchResult(patch, OK))
    return results


def _apply_one(tool: str, root: Path, patch: Path, *, reverse: bool) -> str | None:
    """Dry-run ``patch`` in ``root``, then apply it if that passed; None on success, else the tool's reason."""
    # The scratch folder is no repository: git must not find one above it (e.g. when TMPDIR is inside a checkout).
    for dry_run in (True, False):
        done = _run(_tool_command(tool, patch, reverse, dry_run), root, GIT_CEILING_DIRECTORIES=str(root.parent))
        if done.returncode != 0:
            return _reason(tool, done.stdout + done.stderr)
    return None


def _tool_command(tool: str, patch: Path, reverse: bool, dry_run: bool) -> list[str]:
    patch = patch.resolve()  # the tool runs in the scratch folder
    if tool == "git":
        return ["git", "apply", *(["--reverse"] if reverse else []), *(["--check"] if dry_run else []), str(patch)]
    # -f: never ask (patch prompts on the terminal, e.g. for a missing file); -N: an applied patch fails instead of
    # being reversed; no fuzz, like git apply; no .orig backups, which would be moved into the tree with the results.
    options = ["-p1", "-f", "-N", "--fuzz=0", "--no-backup-if-mismatch"]
    return ["patch", *options, *(["-R"] if reverse else []), *(["--dry-run"] if dry_run else []), "-i", str(patch)]


def _reason(tool: str, output: str) -> str:
    """The first line of the tool's explanation, e.g. ``patch failed: a.py:12`` or ``a.py: Hunk #1 FAILED at 12.``."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if tool == "git":
        errors = [line.split(": ", 1)[1] for line in lines if line.startswith(("error: ", "fatal: "))]
        return (errors or lines or ["failed"])[0]
    current = None  # patch prints "checking file X" before what went wrong with X
    for line in lines:
        if line.startswith(("checking file ", "patching file ")):
            current = line.split(" ", 2)[2]
        else:
            return f"{current}: {line}" if current else line
    return "failed"


def _move_results(scratch: _Scratch, tree: Path) -> None:
    """Put the scratch results into ``tree``: stage every file next to its target, then rename them all over."""
    written = _files_under(scratch.root)
    staged: list[tuple[Path, Path]] = []
    made_dirs: list[Path] = []
    try:
        for path in sorted(written):
            target = tree / path
            _make_dirs(target.parent, tree, made_dirs)
            staged.append((_stage(scratch.root / path, target), target))
    except BaseException as err:
        for temp, _ in staged:
            temp.unlink(missing_ok=True)
        for folder in reversed(made_dirs):
            with contextlib.suppress(OSError):
                folder.rmdir()
        if isinstance(err, OSError):
            raise OutputError(
                f"cannot write the patched files into {tree} ({err}); nothing was changed: "
                "make the tree writable and apply again"
            ) from err
        raise
    for temp, target in staged:
        os.replace(temp, target)
    for path in sorted(scratch.copied - written):  # deleted (or renamed away) by a patch
        (tree / path).unlink()
        _remove_empty_dirs((tree / path).parent, tree)


def _files_under(root: Path) -> set[str]:
    found = set()
    for folder, dirnames, filenames in os.walk(root):
        links = [name for name in dirnames if os.path.islink(os.path.join(folder, name))]
        for name in filenames + links:
            found.add(Path(folder, name).relative_to(root).as_posix())
    return found


def _make_dirs(folder: Path, tree: Path, made: list[Path]) -> None:
    missing = []
    while folder != tree and not folder.is_dir():
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        folder.mkdir()
        made.append(folder)


def _stage(source: Path, target: Path) -> Path:
    """A copy of ``source`` (content and mode, or the link) in a new hidden file next to ``target``."""
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".deliverykit")
    os.close(fd)
    temp = Path(name)
    try:
        if source.is_symlink():
            temp.unlink()
            os.symlink(os.readlink(source), temp)
        else:
            shutil.copy2(source, temp)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return temp


def _remove_empty_dirs(folder: Path, tree: Path) -> None:
    """Remove folders a deletion left empty, as git apply and patch do; a non-empty one stops it."""
    while folder != tree:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


# ----------------------------------------------------------------------------------------------------------------
# Using a patched tree from a delivery


def _clone_hint(delivery: Path, target: str = "DIR") -> str:
    return f"python -m deliverykit upstream clone --delivery {delivery.name} --into {target}"


def find_upstream_tree(
    delivery: str | os.PathLike, upstream: str | os.PathLike | None = None, *, env_var: str, marker: str
) -> Path:
    """The upstream tree a delivery runs on: ``upstream`` (its ``--upstream`` flag), else ``$env_var``.

    ``marker`` is a file every such tree has (``pkg/__init__.py``); without it the folder is refused, naming the
    command that makes a patched checkout.
    """
    delivery = Path(delivery)
    source = "--upstream"
    if upstream is None and os.environ.get(env_var):
        upstream, source = os.environ[env_var], f"${env_var}"
    if upstream is None:
        raise PatchError(
            f"no upstream checkout given (no --upstream, no ${env_var}); make one with: {_clone_hint(delivery)}, "
            "then pass --upstream DIR"
        )
    path = Path(upstream)
    if not (path / marker).is_file():
        raise PatchError(
            f"{source} {path} is not the upstream checkout ({marker} missing); make one with: "
            f"{_clone_hint(delivery, shlex.quote(str(path)))}"
        )
    return path


def require_patched(delivery: str | os.PathLike, path: str | os.PathLike) -> Tree:
    """Fail, naming the fixing command, unless ``path`` is the pinned commit with every patch of ``delivery`` applied.

    A tree without git (an extracted tarball) has no known commit: only the patches are checked.
    """
    delivery = Path(delivery)
    upstream = load_upstream(delivery)
    tree = open_tree(path)
    quoted = shlex.quote(str(path))
    apply = f"python -m deliverykit patches apply --delivery {delivery.name} --upstream {quoted}"
    if tree.commit is not None and tree.commit != upstream.commit:
        raise PatchError(
            f"upstream checkout {path} is at {tree.commit[:12]}, but {delivery.name} needs {upstream.name} at "
            f"{upstream.commit[:12]}; fix with: git -C {quoted} checkout {upstream.commit} && {apply}"
        )
    missing = [result.name for result in patch_status(tree, find_patches(delivery)) if result.state != APPLIED]
    if missing:
        raise PatchError(f"upstream {path} lacks the patches {', '.join(missing)}; fix with: {apply}")
    return tree


def find_patched_upstream(
    delivery: str | os.PathLike, upstream: str | os.PathLike | None = None, *, env_var: str, marker: str
) -> Path:
    """The checkout a delivery runs on (:func:`find_upstream_tree`), refused unless pinned and patched (exit 3)."""
    path = find_upstream_tree(delivery, upstream, env_var=env_var, marker=marker)
    require_patched(delivery, path)
    return path


class _CheckoutFinder(importlib.abc.MetaPathFinder):
    """Finds the top-level packages of upstream source folders (those folders' sub-folders with an ``__init__.py``),
    ahead of installed ones; nothing else in the folders becomes importable."""

    def __init__(self, folders: Sequence[str]) -> None:
        self.folders = list(folders)
        self.packages = {
            child.name for folder in folders for child in Path(folder).iterdir() if (child / "__init__.py").is_file()
        }

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.packages:
            return None  # submodules resolve through their package's __path__
        return importlib.machinery.PathFinder.find_spec(fullname, self.folders)


_CHECKOUT_FINDERS: dict[tuple[str, ...], _CheckoutFinder] = {}


def import_from_checkout(module: str, *folders: str | os.PathLike) -> ModuleType:
    """Import ``module`` from upstream source folders (a checkout's root, ``packages/*/src``), which are not installed.

    Their top-level packages are found first, ahead of installed ones, by an import finder added once per set of
    folders; ``sys.path`` is left alone, so the checkout's other files (scripts, examples, a stray ``utils.py``)
    shadow nothing.
    """
    key = tuple(str(Path(folder).resolve()) for folder in folders)
    if key not in _CHECKOUT_FINDERS:
        _CHECKOUT_FINDERS[key] = _CheckoutFinder(key)
        sys.meta_path.insert(0, _CHECKOUT_FINDERS[key])
    return importlib.import_module(module)


# ----------------------------------------------------------------------------------------------------------------
# Cloning


def clone_upstream(upstream: Upstream, into: str | os.PathLike, urls: Sequence[str] | None = None) -> CloneResult:
    """Clone ``upstream`` at its pinned commit into ``into`` (new or empty), from the first URL that serves it.

    ``urls`` replaces the metadata's list. Each try clones into a hidden folder next to ``into``, renamed onto it
    only once the pinned commit is checked out, so a failed or interrupted clone leaves nothing behind.
    """
    _require_tool("git")
    into = Path(into).absolute()  # git runs in other folders: a relative path would point elsewhere
    if into.exists() and (not into.is_dir() or any(into.iterdir())):
        raise OutputError(f"{into} exists and is not empty; pass a new or empty folder to --into (nothing was changed)")
    failures: list[tuple[str, str]] = []
    for url in urls or upstream.urls:
        try:
            into.parent.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(dir=into.parent, prefix=f".{into.name}.clone-"))
        except OSError as err:
            message = f"cannot create a folder in {into.parent} ({err.strerror}); pick a writable --into"
            raise OutputError(message) from err
        try:
            reason = _clone_at(url, upstream.commit, work / "repo")
            if reason is None:
                (work / "repo").rename(into)  # also replaces an empty folder
                return CloneResult(into, url, tuple(failures))
            failures.append((url, reason))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    tried = "; ".join(f"{url} ({reason})" for url, reason in failures)
    raise PatchError(
        f"could not clone {upstream.name} at {upstream.commit}: {tried}; check the network or pass a mirror with --url"
    )


def _clone_at(url: str, commit: str, dest: Path) -> str | None:
    """Clone ``url`` into ``dest`` and check out ``commit``; None on success, else the first line of git's reason."""
    env = {
        "GIT_TERMINAL_PROMPT": "0",  # a missing or private repository must fail, not wait for a password
        # Give up on a stalled mirror (under 1 kB/s for a minute) and try the next URL.
        "GIT_HTTP_LOW_SPEED_LIMIT": os.environ.get("GIT_HTTP_LOW_SPEED_LIMIT", "1000"),
        "GIT_HTTP_LOW_SPEED_TIME": os.environ.get("GIT_HTTP_LOW_SPEED_TIME", "60"),
    }
    steps = (
        ["git", "clone", "--quiet", "--no-checkout", url, str(dest)],
        ["git", "-C", str(dest), "checkout", "--quiet", "--detach", commit],
    )
    for args in steps:
        done = _run(args, dest.parent, **env)
        if done.returncode != 0:
            return _reason("git", done.stdout + done.stderr)
    return None


# ----------------------------------------------------------------------------------------------------------------
# Processes


def _require_tool(tool: str) -> None:
    if shutil.which(tool) is None:
        fix = "install git" if tool == "git" else "install it (apt-get install patch) or use a git checkout instead"
        raise PatchError(f"the {tool} command is not installed and is needed here; {fix}")


def _run(args: Sequence[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run_tool(args, cwd, env)
