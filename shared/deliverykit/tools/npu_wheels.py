"""The torch-npu wheels on PyPI read as data: op schemas, documented values, the ``torch.npu`` API, env names.

No NPU and no CANN are needed, and ``torch_npu`` is never imported (without CANN that breaks ``import torch``): a wheel
is a zip file, and what a delivery calls is written in it as plain files. ``torch_npu/csrc/aten/
npu_native_functions_by_codegen.yaml`` holds each op's schema (``func: npu_rms_norm(Tensor self, ...) -> ...``),
``torch_npu/_op_plugin_docs.py`` the documentation with the accepted ``input_layout`` / ``sparse_mode`` values,
``torch_npu/npu/*.py`` the Python side of ``torch.npu``, and ``torch_npu/lib/libtorch_npu.so`` the names of the
environment variables the runtime reads. The conformance test (``shared/tests/test_npu_conformance.py``) checks every
call the product code makes against the wheels of :data:`CHECKED_VERSIONS`, and the DrivingSDK function
``deliverykit.ops`` calls against the ``mx-driving`` wheels of :data:`MX_DRIVING_VERSIONS` (:func:`function_params`).
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import subprocess
import sys
import warnings
import zipfile
from collections.abc import Iterable
from pathlib import Path

# torch-npu releases checked, one per torch minor of the supported-versions table (newest post release), plus the
# newest release; :data:`deliverykit.device.TORCH_NPU_MINIMUM` is the oldest a run accepts.
CHECKED_VERSIONS = ("2.6.0.post5", "2.9.0.post9", "2.13.0", "2.14.0")
# mx-driving (DrivingSDK) releases checked: the optional sparse-convolution kernel (for torch 2.6-2.8 on Atlas A2).
MX_DRIVING_VERSIONS = ("26.1.0.post2", "26.2.0.post2")
ARCHES = ("x86_64", "aarch64")
_MANYLINUX = ("manylinux2014", "manylinux_2_17", "manylinux_2_24", "manylinux_2_27", "manylinux_2_28")
CACHE_ENV_VAR = "DELIVERYKIT_WHEEL_CACHE"

_SCHEMAS = "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml"
_DOCS = "torch_npu/_op_plugin_docs.py"
_NPU_MODULES = ("torch_npu/npu/__init__.py", "torch_npu/npu/memory.py", "torch_npu/npu/utils.py")
_LIBRARY = "torch_npu/lib/libtorch_npu.so"


class WheelUnavailable(RuntimeError):
    """The wheel is neither cached nor downloadable here (offline, or the index does not serve it)."""


@dataclasses.dataclass(frozen=True)
class Param:
    """One argument of an op schema: ``int[]? actual_seq_qlen=None`` -> type ``int[]?``, default ``None``."""

    name: str
    type: str
    default: str | None
    keyword_only: bool

    @property
    def required(self) -> bool:
        return self.default is None and not self.keyword_only


@dataclasses.dataclass(frozen=True)
class Schema:
    name: str
    params: tuple[Param, ...]

    def param(self, name: str) -> Param | None:
        return next((param for param in self.params if param.name == name), None)


@dataclasses.dataclass
class Wheel:
    """What one torch-npu wheel says about the API a delivery calls."""

    version: str
    arch: str
    schemas: dict[str, Schema]
    docs: dict[str, str]
    npu_functions: dict[str, tuple[str, ...]]  # torch.npu function -> its parameter names
    python_sources: str  # the wheel's Python files, for names the Python side reads
    library: bytes  # libtorch_npu.so, for names only the C++ runtime reads

    def documented_values(self, op: str, argument: str) -> set[str]:
        """The values the documentation of ``op`` lists for ``argument`` (``input_layout``: BSH, ..., TND)."""
        line = next((ln for ln in self.docs.get(op, "").splitlines() if ln.strip().startswith(f"{argument}:")), "")
        if argument == "sparse_mode":
            supported = line.partition("支持配置值为")[2]
            return set(re.findall(r"\d+", re.split(r"[。.]", supported, maxsplit=1)[0]))
        return set(re.findall(r"(?<![A-Za-z])[A-Z]{3,4}(?![A-Za-z])", line))

    def reads_variable(self, name: str) -> bool:
        return name in self.python_sources or name.encode() in self.library


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for char in text:
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return parts


def parse_schema(line: str) -> Schema:
    """``npu_swiglu(Tensor self, int dim=-1) -> Tensor`` (torchgen's function schema) as a :class:`Schema`."""
    match = re.match(r"\s*(?:-\s*)?(?:func:\s*)?([\w.]+)\((.*)\)\s*->", line)
    if match is None:
        raise ValueError(f"not a function schema: {line!r}")
    params, keyword_only = [], False
    for part in _split_top_level(match.group(2)):
        if part == "*":
            keyword_only = True
            continue
        declaration, _, default = part.partition("=")
        type_, _, name = declaration.strip().rpartition(" ")
        params.append(Param(name, type_, default.strip() if default else None, keyword_only))
    return Schema(match.group(1), tuple(params))


def _docs(source: str) -> dict[str, str]:
    """``_add_torch_npu_docstr("name", '''doc''')`` calls of ``_op_plugin_docs.py`` as ``{name: doc}``."""
    docs = {}
    with warnings.catch_warnings():  # the docs are written with invalid escapes ("\_"): torch-npu's, not ours
        warnings.simplefilter("ignore", (DeprecationWarning, SyntaxWarning))
        tree = ast.parse(source)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", "") == "_add_torch_npu_docstr"
            and len(node.args) == 2
        ):
            name, doc = (arg.value if isinstance(arg, ast.Constant) else None for arg in node.args)
            if isinstance(name, str) and isinstance(doc, str):
                docs[name] = doc
    return docs


def _functions(source: str) -> dict[str, tuple[str, ...]]:
    tree = ast.parse(source)
    return {
        node.name: tuple(arg.arg for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs))
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
    }


def read_wheel(path: str | os.PathLike, version: str, arch: str) -> Wheel:
    """The facts of one wheel, read from the zip without unpacking it."""
    with zipfile.ZipFile(path) as wheel:
        names = set(wheel.namelist())

        def text(name: str) -> str:
            return wheel.read(name).decode("utf-8") if name in names else ""

        schemas = {}
        for line in text(_SCHEMAS).splitlines():
            if "func:" in line and "(" in line:  # the "supported:" list names aten ops without a schema
                schema = parse_schema(line)
                schemas.setdefault(schema.name, schema)
        functions: dict[str, tuple[str, ...]] = {}
        for module in _NPU_MODULES:
            functions.update(_functions(text(module)))
        sources = "\n".join(
            text(name) for name in sorted(names) if name.startswith("torch_npu/") and name.endswith(".py")
        )
        library = wheel.read(_LIBRARY) if _LIBRARY in names else b""
        docs = _docs(text(_DOCS))
    return Wheel(version, arch, schemas, docs, functions, sources, library)


def cache_dir() -> Path:
    """Where wheels are kept between runs: ``$DELIVERYKIT_WHEEL_CACHE``, else inside the active venv, else ~/.cache."""
    if os.environ.get(CACHE_ENV_VAR):
        return Path(os.environ[CACHE_ENV_VAR])
    if sys.prefix != sys.base_prefix:
        return Path(sys.prefix) / "cache" / "torch-npu-wheels"
    return Path.home() / ".cache" / "deliverykit" / "torch-npu-wheels"


def _cached(folder: Path, package: str, version: str, arch: str) -> Path | None:
    pattern = f"{package.replace('-', '_')}-{version}-cp311-cp311-*{arch}*.whl"
    return next(iter(sorted(folder.glob(pattern))), None)


def fetch_wheel(
    version: str, arch: str, folder: Path | None = None, timeout_s: float = 300, package: str = "torch-npu"
) -> Path:
    """The CPython 3.11 wheel of ``package`` (torch-npu, mx-driving) ``version`` for ``arch``: cached, or downloaded
    once with pip (no deps, never installed). :class:`WheelUnavailable` when pip cannot get it (offline)."""
    folder = folder or cache_dir()
    found = _cached(folder, package, version, arch)
    if found is not None:
        return found
    folder.mkdir(parents=True, exist_ok=True)
    platforms = [argument for tag in _MANYLINUX for argument in ("--platform", f"{tag}_{arch}")]
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
        "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp", *platforms,
        f"{package}=={version}", "--dest", str(folder),
    ]  # fmt: skip
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise WheelUnavailable(f"pip download {package}=={version} ({arch}) failed: {err}") from err
    found = _cached(folder, package, version, arch)
    if result.returncode != 0 or found is None:
        last = (result.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise WheelUnavailable(f"pip download {package}=={version} ({arch}) failed: {last}")
    return found


def function_params(path: str | os.PathLike, member: str, owner: str, name: str) -> tuple[str, ...] | None:
    """The parameter names of ``owner.forward`` (a class: an autograd Function, ``ctx`` dropped) or of function
    ``owner`` in the wheel's ``member``, provided module-level ``name`` is bound to ``owner.apply`` / ``owner``;
    None when any of them is missing."""
    with zipfile.ZipFile(path) as wheel:
        if member not in wheel.namelist():
            return None
        tree = ast.parse(wheel.read(member).decode("utf-8"))
    bound = {
        ast.unparse(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    }
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == owner and f"{owner}.apply" in bound:
            forward = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
            return None if forward is None else tuple(arg.arg for arg in forward.args.args[1:])
        if isinstance(node, ast.FunctionDef) and node.name == owner and (owner == name or owner in bound):
            return tuple(arg.arg for arg in (*node.args.posonlyargs, *node.args.args))
    return None


# --------------------------------------------------------------------------------------- what the product code calls


@dataclasses.dataclass(frozen=True)
class CallSite:
    """A use of ``torch_npu.<op>`` or of a ``torch.npu`` function in the product code."""

    where: str  # path:line
    target: str  # "op" (torch_npu.<name>) or "npu" (a torch.npu / device-module function)
    name: str
    positional: int  # positional arguments given (a *args counts as none)
    keywords: tuple[tuple[str, object], ...]  # (keyword, its literal value or ...); ("**", ...) for **kwargs
    called: bool  # False where the function is passed on (swiglu_via(torch_npu.npu_swiglu, ...))
    forwards: bool = False  # the call passes *args: the positional count is unknown


def _literal(node: ast.AST) -> object:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ...


def _npu_function_owner(node: ast.AST, device_module: bool) -> bool:
    """``torch.npu``, ``torch_npu.npu``, ``torch.get_device_module(...)`` or (in deliverykit.device) ``self.module``."""
    dotted = ast.unparse(node)
    if dotted in ("torch.npu", "torch_npu.npu") or (device_module and dotted == "self.module"):
        return True
    return isinstance(node, ast.Call) and ast.unparse(node.func) == "torch.get_device_module"


def scan_calls(paths: Iterable[Path], root: Path) -> list[CallSite]:
    """Every use of a torch_npu op or torch.npu function in ``paths``, found by their syntax (no hand list).

    In ``deliverykit/device.py`` the device module (``self.module``) and the names passed to ``_memory_query`` count
    too: that is where the runtime's ``torch.npu`` functions are called on an NPU.
    """
    sites = []
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        device_module = path.name == "device.py" and path.parent.name == "deliverykit"
        calls = {id(node.func): node for node in ast.walk(tree) if isinstance(node, ast.Call)}
        for node in ast.walk(tree):
            where = f"{path.relative_to(root)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("_memory_query") and device_module:
                names = [arg.value for arg in node.args if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
                sites += [CallSite(where, "npu", names[-1], 1, (), True)] if len(names) == 2 else []
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "hasattr" and device_module:
                owner, name = node.args if len(node.args) == 2 else (None, None)
                if owner is not None and _npu_function_owner(owner, True) and isinstance(name, ast.Constant):
                    sites.append(CallSite(where, "npu", name.value, 0, (), False))
            if not isinstance(node, ast.Attribute):
                continue
            if ast.unparse(node.value) == "torch_npu" and node.attr.startswith("npu_"):
                target = "op"
            elif _npu_function_owner(node.value, device_module):
                target = "npu"
            else:
                continue
            call = calls.get(id(node))
            if call is None:
                sites.append(CallSite(where, target, node.attr, 0, (), False))
                continue
            positional = sum(not isinstance(arg, ast.Starred) for arg in call.args)
            keywords = tuple((kw.arg or "**", _literal(kw.value) if kw.arg else ...) for kw in call.keywords)
            forwards = any(isinstance(arg, ast.Starred) for arg in call.args)
            sites.append(CallSite(where, target, node.attr, positional, keywords, True, forwards))
    return sites


# -------------------------------------------------------------------------------------------- checks against a wheel

_SCHEMA_TYPES = {"int": (int,), "float": (float, int), "bool": (bool,), "str": (str,)}


def _value_fits(value: object, type_: str) -> bool:
    """Whether a Python literal can be passed where the schema says ``type_`` (``int[]?``, ``float``, ``str``...)."""
    if value is ...:
        return True  # not a literal: its type is the callers' tests' business
    optional = type_.endswith("?")
    base = type_.rstrip("?")
    if value is None:
        return optional
    if base.endswith("[]"):
        return isinstance(value, (list, tuple)) and all(_value_fits(v, base[:-2]) for v in value)
    kinds = _SCHEMA_TYPES.get(base)
    if kinds is None:
        return True  # Tensor, ScalarType, ...: not a literal's type
    return isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)


def _schema_default(text: str) -> object:
    return ast.literal_eval(text) if text not in ("[]",) else []


def reference_problems(reference: object, schema: Schema) -> list[str]:
    """How the signature of an op's CPU reference (what callers are tested against) disagrees with the op's schema.

    Callers pass the required arguments by position and the others by name, as the CPU tests run them on the
    reference: so the required ones must match in number, the others by name, default and type.
    """
    import inspect

    params = list(inspect.signature(reference).parameters.values())
    problems = []
    required = [p for p in params if p.default is p.empty]
    schema_required = [p for p in schema.params if p.required]
    if len(required) != len(schema_required):
        problems.append(
            f"{len(required)} required argument(s) ({', '.join(p.name for p in required)}), the op has "
            f"{len(schema_required)} ({', '.join(p.name for p in schema_required)})"
        )
    for index, param in enumerate(params):
        if param.default is param.empty:
            continue
        found = schema.param(param.name)
        if found is None:
            problems.append(f"{param.name}: the op has no such argument")
            continue
        if found.default is None or _schema_default(found.default) != param.default:
            problems.append(f"{param.name}: default {param.default!r}, the op's is {found.default}")
        if not _value_fits(param.default, found.type):
            problems.append(f"{param.name}: default {param.default!r} does not fit the op's type {found.type}")
        position = schema.params.index(found)
        if param.kind is param.POSITIONAL_OR_KEYWORD and not found.keyword_only and position != index:
            problems.append(f"{param.name}: position {index}, the op's is {position}")
    return problems


def call_problems(site: CallSite, schema: Schema, documented: dict[str, set[str]]) -> list[str]:
    """How one direct call of an op disagrees with its schema: unknown keyword, literal of the wrong type, a value
    the documentation does not list, missing required arguments."""
    problems = []
    given = {name for name, _ in site.keywords}
    for name, value in site.keywords:
        if name == "**":
            continue
        param = schema.param(name)
        if param is None:
            problems.append(f"{site.where}: {site.name}(..., {name}=...): the op has no argument {name!r}")
        elif not _value_fits(value, param.type):
            problems.append(f"{site.where}: {site.name}({name}={value!r}): the op wants {param.type}")
        elif name in documented and value is not ... and str(value) not in documented[name]:
            problems.append(
                f"{site.where}: {site.name}({name}={value!r}): the documentation lists {sorted(documented[name])}"
            )
    if site.called and "**" not in given and not site.forwards:
        required = [param for param in schema.params if param.required]
        missing = [param.name for param in required[site.positional :] if param.name not in given]
        if missing:
            problems.append(f"{site.where}: {site.name}(...) lacks the required argument(s) {', '.join(missing)}")
    return problems
