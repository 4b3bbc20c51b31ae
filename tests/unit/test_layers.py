"""The layers import downwards only: every import of every module of zarrfs/ (top level, inside
functions, under TYPE_CHECKING) is read with `ast` and checked against the order that
docs/ARCHITECTURE.md states, so the document and the code cannot part and no package cycle
can come back."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from support import REPO

PACKAGE = REPO / "zarrfs"
ARCHITECTURE = REPO / "docs" / "ARCHITECTURE.md"


def layer_order(text: str) -> list[list[str]]:
    """The layers of the fenced block under "### The order of layers", lowest first; each layer
    a list of units (a top-level module or a package of zarrfs/)."""
    section = re.search(r"^### The order of layers\n(.*?)^```\n(.*?)^```", text, re.S | re.M)
    assert section is not None, "docs/ARCHITECTURE.md has no '### The order of layers' with a fenced block"
    lines = [line.split("#")[0].strip() for line in section.group(2).splitlines()]
    return [[unit.strip() for unit in line.split(",")] for line in reversed(lines) if line]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool, root: Path) -> set[str]:
    """The zarrfs modules (or packages) SOURCE imports anywhere in it, relative imports resolved;
    `from pkg import name` counts as an import of `pkg.name` when that is a module."""
    here = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == root.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1] + ([node.module] if node.module else [])
                target = ".".join(base)
            else:
                target = node.module or ""
            if target.split(".")[0] != root.name:
                continue
            for alias in node.names:
                sub = root.parent.joinpath(*f"{target}.{alias.name}".split("."))
                found.add(f"{target}.{alias.name}" if sub.is_dir() or sub.with_suffix(".py").is_file() else target)
    return found


def unit_of(module: str) -> str:
    """The unit a module belongs to: its top-level module or package under zarrfs/."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def violations(root: Path, layers: list[list[str]]) -> list[str]:
    """Each import of a module under ROOT into a higher layer, or into another unit of its own
    layer, and each unit the order does not place."""
    rank = {unit: n for n, layer in enumerate(layers) for unit in layer}
    rank[root.name] = -1  # the package's __init__ (its version) is below everything and imports nothing
    out = []
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        unit = unit_of(module)
        if unit not in rank:
            out.append(f"{module}: {unit} has no place in the order of layers")
            continue
        for target in sorted(imported_modules(path.read_text(), module, path.name == "__init__.py", root)):
            other = unit_of(target)
            if other == unit:
                continue
            if other not in rank or rank[other] >= rank[unit]:
                out.append(f"{module} imports {target}: {unit} may not import {other}")
    return out


def test_every_import_follows_the_order_of_layers():
    layers = layer_order(ARCHITECTURE.read_text())
    assert violations(PACKAGE, layers) == []


def test_every_unit_is_placed_once():
    units = [unit for layer in layer_order(ARCHITECTURE.read_text()) for unit in layer]
    on_disk = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"} | {
        p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()
    }
    assert sorted(units) == sorted(on_disk)


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(
    ("importer", "target"),
    [
        ("from ..top import thing\n", "zarrfs.top.thing"),  # relative, from a package's module
        ("from ..top.thing import name\n", "zarrfs.top.thing"),
        ("def f():\n    from zarrfs.top import thing\n", "zarrfs.top.thing"),  # inside a function
        ("import typing\nif typing.TYPE_CHECKING:\n    from .. import top\n", "zarrfs.top"),  # for types only
        ("import zarrfs.top\n", "zarrfs.top"),
    ],
)
def test_an_upward_import_is_found_wherever_it_is(tmp_path: Path, importer: str, target: str):
    root = tmp_path / "zarrfs"
    files = {"__init__.py": "", "low/__init__.py": "", "low/a.py": importer, "top/__init__.py": "", "top/thing.py": ""}
    write(root, files)
    assert violations(root, [["low"], ["top"]]) == [f"zarrfs.low.a imports {target}: low may not import top"]
    assert violations(root, [["top"], ["low"]]) == []


def test_units_of_one_layer_do_not_import_each_other(tmp_path: Path):
    root = tmp_path / "zarrfs"
    write(root, {"__init__.py": "", "a.py": "from . import b\n", "b.py": "", "c.py": "from .b import x\n"})
    assert violations(root, [["b"], ["a", "c"]]) == []
    assert violations(root, [["a", "b", "c"]]) == [
        "zarrfs.a imports zarrfs.b: a may not import b",
        "zarrfs.c imports zarrfs.b: c may not import b",
    ]


def import_cycles(root: Path, package: str) -> list[list[str]]:
    """Cycles among the imports (any: inside functions, for types only) of PACKAGE's modules."""
    graph = {}
    for path in sorted((root.parent / package.replace(".", "/")).rglob("*.py")):
        module = module_name(path, root)
        found = imported_modules(path.read_text(), module, path.name == "__init__.py", root)
        graph[module] = {t for t in found if t.startswith(package + ".") or t == package}
    cycles, state, stack = [], {}, []

    def visit(module: str) -> None:
        state[module] = "open"
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in graph:
                continue
            if state.get(other) == "open":
                cycles.append([*stack[stack.index(other) :], other])
            elif other not in state:
                visit(other)
        stack.pop()
        state[module] = "done"

    for module in graph:
        if module not in state:
            visit(module)
    return cycles


def test_the_engines_core_is_built_without_its_fast_paths():
    """engine/fastpath/ holds optional strategies: the core (loads, read-ahead, write-back, ...)
    names what it asks of them as protocols and never imports them; only the composition root
    (engine/__init__.py) does. And the engine's modules import one another without a cycle."""
    engine = PACKAGE / "engine"
    for path in sorted(engine.glob("*.py")):
        if path.name == "__init__.py":
            continue
        module = module_name(path, PACKAGE)
        found = imported_modules(path.read_text(), module, False, PACKAGE)
        assert not [t for t in found if t.startswith("zarrfs.engine.fastpath")], module
    assert import_cycles(PACKAGE, "zarrfs.engine") == []


def namespace_users(root: Path) -> list[str]:
    """Modules of tree/ other than namespace.py that import the namespace, name it, or take or keep
    an `ns`: each part of the tree is given the parts it uses (docs/ARCHITECTURE.md, "Within tree/")."""
    out = []
    for path in sorted((root / "tree").glob("*.py")):
        if path.name == "namespace.py":
            continue
        module = module_name(path, root)
        source = path.read_text()
        if f"{root.name}.tree.namespace" in imported_modules(source, module, path.name == "__init__.py", root):
            out.append(f"{module} imports the namespace")
        for node in ast.walk(ast.parse(source)):
            name = (
                node.id
                if isinstance(node, ast.Name)
                else node.arg
                if isinstance(node, ast.arg)
                else node.attr
                if isinstance(node, ast.Attribute)
                else None
            )
            if name in ("ns", "Namespace"):
                out.append(f"{module}:{node.lineno} uses {name}")
    return out


def test_no_part_of_the_tree_takes_the_namespace():
    assert namespace_users(PACKAGE) == []


@pytest.mark.parametrize(
    "source",
    [
        "from .namespace import Namespace\n",
        "class Part:\n    def __init__(self, ns):\n        pass\n",
        "def f(part):\n    return part.ns.engine\n",
    ],
)
def test_a_part_taking_the_namespace_is_found(tmp_path: Path, source: str):
    root = tmp_path / "zarrfs"
    write(root, {"__init__.py": "", "tree/__init__.py": "", "tree/namespace.py": "", "tree/part.py": source})
    assert namespace_users(root) != []
    assert [u for u in namespace_users(root) if not u.startswith("zarrfs.tree.part")] == []


def test_an_import_cycle_is_found(tmp_path: Path):
    root = tmp_path / "zarrfs"
    write(
        root,
        {
            "__init__.py": "",
            "p/__init__.py": "",
            "p/a.py": "from . import b\n",
            "p/b.py": "import typing\nif typing.TYPE_CHECKING:\n    from .a import x\n",
        },
    )
    assert import_cycles(root, "zarrfs.p") == [["zarrfs.p.a", "zarrfs.p.b", "zarrfs.p.a"]]
