"""The shape of the code base, checked from its source: deliverykit's layers, no import cycle, no sys.path edits.

These are properties a reshaping must keep (issue RX): a runtime module that starts importing a maintainer tool, two
modules importing each other, or code bootstrapping its imports by editing ``sys.path`` fails here, naming the file.
"""

from __future__ import annotations

import ast
import os
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
