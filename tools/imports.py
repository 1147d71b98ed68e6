"""The house drawn from its imports: the modules of ``multiconnector/`` and ``bench/``.

Every import counts, wherever it is written: at the top of a module, inside a function (imported
on demand), under ``if TYPE_CHECKING:`` (a type is a dependency too), and
``importlib.import_module("name")`` with a literal name. Only imports of the two trees' own
modules are drawn; the standard library and third-party packages are not.

* A **module** is a file (a package is its ``__init__.py``); an **arrow** goes from the importer
  to what it imports. A **cycle** is a set of modules each reachable from every other.
* A **room** is a top-level module or subpackage: ``multiconnector.check`` holds every module
  under ``multiconnector/check/``; ``multiconnector`` itself is its ``__init__.py``; each module
  of ``bench/`` is a room of its own. Rooms sit on **floors**: a room imports only rooms on
  lower floors (floor 0 imports none), when there is no cycle between rooms.
* A **private name** is one that starts with one underscore. Importing one from another module
  is counted; importing one from a module of another package (``multiconnector/usermachine/``
  from ``multiconnector/``, say) is a **crossing**, as is importing a private module
  (``_validate``) from outside the package that holds it.
* ``sys.path`` edits in these trees are listed too: a module imports by its package, not by a
  folder put on the path.

Run ``python tools/imports.py`` (``--modules`` lists every module's arrows too); it exits 1 when
there is a cycle or a crossing. ``tests/test_imports.py`` asserts the same.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("multiconnector", "bench")


@dataclass(frozen=True)
class Import:
    """One imported name (or module), where it is written."""

    importer: str
    target: str  # the module imported from
    name: str | None  # the name imported from it, None for the module itself
    line: int


@dataclass
class Graph:
    modules: dict[str, Path]
    imports: list[Import]
    path_edits: list[tuple[str, int]] = field(default_factory=list)

    @property
    def arrows(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {m: set() for m in self.modules}
        for imp in self.imports:
            if imp.target != imp.importer:
                out[imp.importer].add(imp.target)
        return out

    @property
    def room_arrows(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {room_of(m): set() for m in self.modules}
        for source, targets in self.arrows.items():
            for target in targets:
                if room_of(source) != room_of(target):
                    out[room_of(source)].add(room_of(target))
        return out

    def private_imports(self) -> list[Import]:
        """Private names imported from another module."""
        return [
            i
            for i in self.imports
            if i.name is not None and is_private(i.name) and i.target != i.importer
        ]

    def crossings(self) -> list[Import]:
        """Private names imported across packages, and private modules used from outside."""
        out = [i for i in self.private_imports() if package_of(i.importer) != package_of(i.target)]
        for imp in self.imports:
            owner = private_owner(imp.target)
            if owner is not None and not within(imp.importer, owner):
                out.append(imp)
        return out


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def package_of(module: str) -> str:
    """The package a module sits in (a package's ``__init__`` sits in the package itself)."""
    return module.rpartition(".")[0]


def private_owner(module: str) -> str | None:
    """The package a private module (or a module under a private package) belongs to."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if is_private(part):
            return ".".join(parts[:i])
    return None


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def room_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def find_modules(root: Path, trees: Sequence[str] = TREES) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for tree in trees:
        for path in sorted((root / tree).rglob("*.py")):
            if "__pycache__" not in path.parts:
                found[module_name(path, root)] = path
    return found


def _resolve(importer: str, is_package: bool, level: int, module: str | None) -> str:
    if level == 0:
        return module or ""
    base = importer.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([module] if module else []))


def _imports_of(
    module: str, path: Path, modules: Mapping[str, Path]
) -> tuple[list[Import], list[int]]:
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    # A script's folder is on its path: in a tree that is no package, a bare name that is a
    # sibling file is that sibling.
    folder = package_of(module) if not is_package else module
    found: list[Import] = []
    edits: list[int] = []

    def known(name: str) -> str | None:
        if name in modules:
            return name
        sibling = f"{folder}.{name}" if folder else name
        if folder and sibling in modules and not (path.parent / "__init__.py").exists():
            return sibling
        return None

    def add(target: str, name: str | None, line: int) -> None:
        resolved = known(target)
        if resolved is None:
            head, _, tail = target.rpartition(".")
            if head and (resolved := known(head)) is not None:
                found.append(Import(module, resolved, tail, line))
            return
        if name is not None and (sub := known(f"{resolved}.{name}")) is not None:
            found.append(Import(module, sub, None, line))
        else:
            found.append(Import(module, resolved, name, line))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, None, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            for alias in node.names:
                add(base, alias.name if alias.name != "*" else None, node.lineno)
        elif isinstance(node, ast.Call):
            func = node.func
            name = ast.unparse(func)
            if (
                name in ("importlib.import_module", "import_module")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                add(node.args[0].value, None, node.lineno)
            elif name.startswith("sys.path.") and name.rpartition(".")[2] in ("insert", "append"):
                edits.append(node.lineno)
    return found, edits


def build(root: Path = ROOT, trees: Sequence[str] = TREES) -> Graph:
    modules = find_modules(root, trees)
    graph = Graph(modules, [])
    for module, path in modules.items():
        found, edits = _imports_of(module, path, modules)
        graph.imports += found
        graph.path_edits += [(module, line) for line in edits]
    return graph


def cycles(arrows: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(root: str) -> None:
        nonlocal counter
        work: list[tuple[str, Iterable[str]]] = [(root, iter(sorted(arrows.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(arrows.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for node in sorted(arrows):
        if node not in index:
            visit(node)
    return sorted(found)


def floors(arrows: Mapping[str, Iterable[str]]) -> dict[str, int]:
    """Each node's floor: 0 for one that imports nothing, else one above its highest import.
    The nodes of a cycle share a floor (the cycle is drawn as one node)."""
    component = {node: node for node in arrows}
    for members in cycles(arrows):
        for member in members:
            component[member] = members[0]
    merged: dict[str, set[str]] = defaultdict(set)
    for node, targets in arrows.items():
        merged[component[node]] |= {component[t] for t in targets} - {component[node]}
    level: dict[str, int] = {}

    def height(node: str) -> int:
        if node not in level:
            level[node] = 1 + max((height(t) for t in merged[node]), default=-1)
        return level[node]

    return {node: height(component[node]) for node in arrows}


def _arrow_count(arrows: Mapping[str, Iterable[str]]) -> int:
    return sum(len(set(t)) for t in arrows.values())


def summary(graph: Graph) -> dict[str, int]:
    rooms = graph.room_arrows
    return {
        "modules": len(graph.modules),
        "module arrows": _arrow_count(graph.arrows),
        "module cycles": len(cycles(graph.arrows)),
        "rooms": len(rooms),
        "floors": 1 + max(floors(rooms).values(), default=-1),
        "room arrows": _arrow_count(rooms),
        "room cycles": len(cycles(rooms)),
        "private names imported from another module": len(graph.private_imports()),
        "crossings (private names or modules across packages)": len(graph.crossings()),
        "sys.path edits": len(graph.path_edits),
    }


def report(graph: Graph, *, modules: bool = False) -> str:
    lines: list[str] = []
    rooms = graph.room_arrows
    levels = floors(rooms)
    lines.append("rooms by floor (a room imports only rooms below it unless in a cycle):")
    for floor in sorted(set(levels.values()), reverse=True):
        lines.append(f"  floor {floor}:")
        for room in sorted(r for r, f in levels.items() if f == floor):
            targets = ", ".join(sorted(rooms[room])) or "-"
            lines.append(f"    {room} -> {targets}")
    if modules:
        lines.append("modules:")
        for module, imported in sorted(graph.arrows.items()):
            lines.append(f"  {module} -> {', '.join(sorted(imported)) or '-'}")
    lines.append("room cycles:")
    lines += [f"  {' <-> '.join(c)}" for c in cycles(rooms)] or ["  none"]
    lines.append("module cycles:")
    lines += [f"  {' <-> '.join(c)}" for c in cycles(graph.arrows)] or ["  none"]
    lines.append("crossings (private names or modules across packages):")
    lines += [
        f"  {i.importer}:{i.line} imports {i.target}" + (f".{i.name}" if i.name else "")
        for i in graph.crossings()
    ] or ["  none"]
    lines.append("sys.path edits:")
    lines += [f"  {m}:{line}" for m, line in graph.path_edits] or ["  none"]
    lines.append("summary:")
    lines += [f"  {key}: {value}" for key, value in summary(graph).items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--modules", action="store_true", help="every module's arrows too")
    args = parser.parse_args(argv)
    graph = build()
    print(report(graph, modules=args.modules))
    bad = cycles(graph.arrows) or cycles(graph.room_arrows) or graph.crossings()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
