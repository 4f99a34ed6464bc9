"""The import graph of the gpuclust package, read from the source (``ast``), for the layer and
cycle rules of tests/test_code_rules.py.

Every ``import`` / ``from ... import`` statement of every module counts, wherever it is: at the
top, inside a function (a lazy import is still a dependency), in a ``try``.  So does
``importlib.import_module`` of a module named by a string literal, or by a module-level
constant holding one.  Not counted: imports under ``if TYPE_CHECKING:`` (they never run), and
modules looked up by a name built at run time (the registries: ``gpuclust.cli.COMMANDS``, the
analyses', backends' and readers' tables).

Run it to see the graph::

    python tests/import_graph.py            # the package graph and any cycle inside a package

(a package's ``command`` module counted as the command line's, :func:`command_member`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1] / "gpuclust"


@dataclass(frozen=True)
class Import:
    """``importer`` imports ``target`` (both module names) at line ``line`` of the importer."""

    importer: str
    target: str
    line: int

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} -> {self.target}"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package: ``{dotted name: file}`` (a package is its ``__init__``)."""
    return {module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _type_checking(node: ast.AST) -> bool:
    t = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING")
        or (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")
    )


def _imported(name: str, path: Path, mods: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """(module name as written, line) of each import in one module."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    constants = {
        t.id: n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
        for t in n.targets
        if isinstance(t, ast.Name)
    }

    def walk(node: ast.AST) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                for n in child.orelse:  # type: ignore[attr-defined]
                    yield from walk_one(n)
            else:
                yield from walk_one(child)

    def walk_one(node: ast.AST) -> Iterator[tuple[str, int]]:
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importer's package up
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:  # `from pkg import module` imports the module
                yield (f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base), node.lineno
        else:
            if (
                isinstance(node, ast.Call)
                and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "import_module"
                and node.args
            ):
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    yield arg.value, node.lineno
                elif isinstance(arg, ast.Name) and arg.id in constants:
                    yield constants[arg.id], node.lineno
            yield from walk(node)

    yield from walk(tree)


def imports(root: Path = ROOT) -> list[Import]:
    """Every import of a gpuclust module by a gpuclust module (see the module docstring), resolved to
    the module it loads (``from gpuclust.engine import run`` -> ``gpuclust.engine``)."""
    mods = modules(root)
    top = root.name
    out = []
    for name, path in mods.items():
        for target, line in _imported(name, path, mods):
            if target != top and not target.startswith(top + "."):
                continue
            while target not in mods and "." in target:  # a name inside a module
                target = target.rpartition(".")[0]
            if target in mods:  # (not a compiled extension)
                out.append(Import(name, target, line))
    return out


def member(package: str, module: str) -> str | None:
    """The member of ``package`` that holds ``module``: ``package`` itself for its ``__init__``, a
    module directly in it, or a sub-package (all of it); ``None`` for a module outside it."""
    if module == package:
        return package
    if not module.startswith(package + "."):
        return None
    return f"{package}.{module[len(package) + 1 :].split('.')[0]}"


def command_member(package: str, module: str) -> str | None:
    """:func:`member`, except that at the top a package's ``command`` module (its command-line
    face, registered by ``gpuclust.cli``) counts as part of ``gpuclust.cli``, the command line."""
    top = package.split(".")[0]
    if package == top and module.rsplit(".", 1)[-1] == "command":
        return f"{top}.cli"
    return member(package, module)


def graph(package: str, edges: list[Import], member_of: Any = None) -> dict[str, dict[str, Import]]:
    """The imports between the members of ``package``: ``{member: {member it imports: one such import}}``
    (``member_of(package, module)``: the member holding a module, :func:`member` by default)."""
    member_of = member_of or member
    out: dict[str, dict[str, Import]] = {}
    for e in edges:
        a, b = member_of(package, e.importer), member_of(package, e.target)
        if a is not None and b is not None and a != b:
            out.setdefault(a, {}).setdefault(b, e)
    return out


def cycles(g: dict[str, dict[str, Import]]) -> list[list[str]]:
    """The strongly connected components of more than one member (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return sorted(out)


def packages(root: Path = ROOT) -> list[str]:
    """The package and its sub-packages, by name."""
    return sorted(module_name(p, root) for p in root.rglob("__init__.py"))


if __name__ == "__main__":
    edges = imports()
    top = graph(ROOT.name, edges, command_member)
    for a in sorted(top):
        print(a, "->", ", ".join(sorted(b.removeprefix(ROOT.name + ".") for b in top[a])))
    for pkg in packages():
        g = graph(pkg, edges, command_member)
        for comp in cycles(g):
            print(f"\ncycle in {pkg}: {comp}")
            for a in comp:
                print("   ", "\n    ".join(str(e) for b, e in g.get(a, {}).items() if b in comp))
