"""The shape of the code base, checked from its source: deliverykit's layers, no import cycle, no sys.path edits.

These are properties a reshaping must keep (issue RX): a runtime module that starts importing a maintainer tool, two
modules importing each other, or code bootstrapping its imports by editing ``sys.path`` fails here, naming the file.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {
    "deliverykit": REPO / "shared" / "deliverykit",
    "trellis2_npu": REPO / "trellis2-npu" / "trellis2_npu",
    "sulphur2_npu": REPO / "sulphur2-npu" / "sulphur2_npu",
    "ursa_npu": REPO / "ursa-npu" / "ursa_npu",
}
# deliverykit's layers, lowest first: a module may import its own layer and the ones before it.
LAYERS = ("deliverykit", "deliverykit.assets", "deliverykit.tools")


def module_name(path: Path, package: str, root: Path) -> str:
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:``: names for annotations only, never imported at run time (a
    report's ``Session`` annotation, while the session calls the report)."""
    skipped = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")
        for inner in ast.walk(node)
    }
    return [node for node in ast.walk(tree) if id(node) not in skipped]


def first_party_imports(path: Path, name: str) -> set[str]:
    """Modules of our packages that ``path`` (module ``name``) imports at run time, at any depth of its code."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in _runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {module for module in found if module.split(".")[0] in PACKAGES}


def import_graph() -> dict[str, set[str]]:
    modules = {}
    for package, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            modules[module_name(path, package, root)] = path
    return {
        name: {m for m in first_party_imports(path, name) if m in modules and m != name}
        for name, path in modules.items()
    }


def layer_of(module: str) -> int:
    if module == "deliverykit.__main__":  # `python -m deliverykit`: the command line's entry point
        return LAYERS.index("deliverykit.tools")
    return max(i for i, layer in enumerate(LAYERS) if module == layer or module.startswith(layer + "."))


def test_deliverykit_layers_import_only_downwards():
    upward = [
        f"{name} imports {target}"
        for name, targets in import_graph().items()
        if name.startswith("deliverykit")
        for target in targets
        if target.startswith("deliverykit") and layer_of(target) > layer_of(name)
    ]
    assert not upward, upward


def test_no_delivery_imports_another():
    crossing = [
        f"{name} imports {target}"
        for name, targets in import_graph().items()
        for target in targets
        if name.split(".")[0] != "deliverykit" and target.split(".")[0] not in ("deliverykit", name.split(".")[0])
    ]
    assert not crossing, crossing


def test_no_import_cycle():
    graph, state, cycles = import_graph(), {}, []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, cycles


def test_no_sys_path_edits_outside_tests():
    """Deliveries are installed packages, and upstream checkouts are imported by deliverykit.assets.patches'
    finder: nothing needs ``sys.path``."""
    offenders = []
    for path in _code_outside_tests():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            if call and node.func.attr in ("insert", "append", "extend") and ast.unparse(node.func.value) == "sys.path":
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders


def _code_outside_tests() -> list[Path]:
    """The repository's ``.py`` files outside tests/ and hidden folders, which are pruned unvisited (.venv holds
    tens of thousands of files: walking it took most of this test's 8 s)."""
    found = []
    for folder, dirnames, filenames in os.walk(REPO):
        dirnames[:] = [name for name in dirnames if not name.startswith(".") and name not in ("tests", "__pycache__")]
        found += [Path(folder) / name for name in filenames if name.endswith(".py")]
    return found


# A number with a unit of time, size, share or speed, as a measurement is written ("took 9 s", "~3× slower", "60 %").
FIGURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:ms|s|min|GB|GiB|MB|MiB|KiB|%|×|x faster|x slower|it/s)(?!\w)")
# Figures that are constants or specifications, not measurements that drift: (module, the figure's text).
DOCSTRING_CONSTANTS = {
    ("deliverykit.assets.loadcheck", "46 GB"),  # Sulphur-2's checkpoint size
    ("deliverykit.assets.manifest", "8 MiB"),  # the hashing chunk
    ("deliverykit.assets.manifest", "17 GB"),  # TRELLIS.2-4B's files
    ("trellis2_npu.geometry.texture_bake", "75 %"),  # xatlas' assumed utilisation
    ("trellis2_npu.full_size", "5 GB"),  # the hard-linked 512 weights
    ("trellis2_npu.full_size", "16×"),  # the paper's SC-VAE downsampling
    ("trellis2_npu.full_size", "11 GB"),  # the written released-size weights
    ("trellis2_npu.full_size", "10 min"),  # ... and the time it takes, for whoever runs --smoke full
    ("trellis2_npu.full_size", "6 GB"),
    ("trellis2_npu.offload", "17 GB"),  # the stages' parameters in host memory
    ("trellis2_npu.preview", "256 ×"),  # the preview's layout
    ("trellis2_npu.geometry.mesh_repair", "1 %"),  # CuMesh's documented threshold rule
    ("trellis2_npu.geometry.mesh_repair", "3×"),  # the simplifications' count
    ("trellis2_npu.tiny", "50%"),  # random weights' occupancy
    ("sulphur2_npu.presets", "5 s"),  # preset lengths at 24 fps
    ("sulphur2_npu.presets", "2 s"),
    ("sulphur2_npu.sizes", "46 GB"),
    ("sulphur2_npu.sizes", "20 s"),  # LTX-2.3's positional range
    ("sulphur2_npu.checkpoint", "46 GB"),
    ("sulphur2_npu.memory", "32 GB"),  # the cards and the components' sizes the plans are computed from
    ("sulphur2_npu.memory", "64 GB"),
    ("sulphur2_npu.memory", "38 GB"),
    ("sulphur2_npu.memory", "24 GB"),
    ("sulphur2_npu.memory", "6 GB"),
    ("sulphur2_npu.memory", "2 GB"),
    ("sulphur2_npu.memory", "70 GB"),
    ("sulphur2_npu.memory", "0.8 GB"),  # one prompt's embeddings, computed from the shapes
    ("ursa_npu.accuracy", "4.5 %"),  # what the thresholds allow, derived from their definitions
    ("ursa_npu.accuracy", "1 %"),
    ("ursa_npu.accuracy", "2.2 %"),
}


def docstring_figures() -> set[tuple[str, str]]:
    found = set()
    for package, root in PACKAGES.items():
        for path in root.rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node) or ""
                    found |= {(module_name(path, package, root), match.group(0)) for match in FIGURE.finditer(doc)}
    return found


def test_docstrings_hold_no_measured_figures():
    """Measured figures drift from the code that docstrings describe (texture_bake said "362 now", then "272 now"):
    they live in results/*.json and the READMEs, and a docstring names the benchmark instead."""
    figures = docstring_figures()
    assert not figures - DOCSTRING_CONSTANTS, sorted(figures - DOCSTRING_CONSTANTS)
    assert not DOCSTRING_CONSTANTS - figures, f"no longer in a docstring: {sorted(DOCSTRING_CONSTANTS - figures)}"


MAX_PARAMETERS = 8
FRONT_ENDS = [
    REPO / d / name for d in ("trellis2-npu", "sulphur2-npu", "ursa-npu") for name in ("inference.py", "app.py")
]
# Signatures another API fixes: a reference of an op's documented schema, drop-ins called with upstream's or a
# library's arguments, and the page callbacks gradio calls with one argument per input field.
SIGNATURES_FIXED_ELSEWHERE = {
    "deliverykit/ops.py::_fusion_attention_reference",  # torch_npu.npu_fusion_attention's schema
    "trellis2_npu/geometry/export.py::to_glb",  # o_voxel.postprocess.to_glb, as upstream calls it
    "trellis2_npu/geometry/voxelize.py::mesh_to_flexible_dual_grid",  # o_voxel.convert's
    "sulphur2_npu/attention.py::dispatch_ltx2_attention",  # diffusers' dispatch_attention_fn
    "sulphur2_npu/keyframes.py::prepare_latents",  # LTX2ConditionPipeline's, as its __call__ calls it
    "trellis2-npu/app.py::run",  # gradio: the page's inputs
    "sulphur2-npu/app.py::run",
}


def wide_signatures() -> set[str]:
    """``path::function`` of every product function with more than :data:`MAX_PARAMETERS` parameters (self, cls not
    counted; ``*args``, ``**kwargs`` one each), paths from the package's or the delivery's folder."""
    files = [(path, root.parent) for root in PACKAGES.values() for path in root.rglob("*.py")]
    files += [(path, REPO) for path in FRONT_ENDS if path.is_file()]
    found = set()
    for path, base in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                names = [
                    a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs) if a.arg not in ("self", "cls")
                ]
                if len(names) + bool(args.vararg) + bool(args.kwarg) > MAX_PARAMETERS:
                    found.add(f"{path.relative_to(base).as_posix()}::{node.name}")
    return found


def test_no_function_takes_more_than_eight_parameters():
    """A wide signature is a bag of run state passed along by hand: a typed request, session or result holds it."""
    wide = wide_signatures()
    assert wide <= SIGNATURES_FIXED_ELSEWHERE, sorted(wide - SIGNATURES_FIXED_ELSEWHERE)
    assert wide >= SIGNATURES_FIXED_ELSEWHERE, f"now narrow, drop from the list: {SIGNATURES_FIXED_ELSEWHERE - wide}"


def test_trellis2_geometry_is_a_library_of_its_own():
    """The GLB export's geometry imports only itself, two kernels and deliverykit (no model, no upstream, no run
    step), and the package's top level keeps the run steps a reader follows (at most 24 modules)."""
    geometry = "trellis2_npu.geometry"
    allowed = {"trellis2_npu", geometry, "trellis2_npu.voxel_lookup", "trellis2_npu.grid_sample"}
    for module, imports in import_graph().items():
        if module.startswith(geometry + "."):
            outside = {m for m in imports if not m.startswith((geometry + ".", "deliverykit")) and m not in allowed}
            assert not outside, f"{module} imports {sorted(outside)}"
    assert len([p for p in PACKAGES["trellis2_npu"].glob("*.py") if p.name != "__init__.py"]) <= 24
