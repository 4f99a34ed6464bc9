"""The analysis kit's rules (issue 8, docs/DESIGN habits), checked on the source: analyses never
branch on the array module or pick a backend themselves, and no module imports another package's
private helpers."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "gpuclust"


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """Source lines outside docstrings and comments (doctest examples may call anything)."""
    tree = ast.parse(path.read_text())
    doc = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Expr)
            and isinstance(getattr(node, "value", None), ast.Constant)
            and isinstance(node.value.value, str)
        ):
            doc.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return [(i, line.split("#", 1)[0]) for i, line in enumerate(path.read_text().splitlines(), 1) if i not in doc]


def test_analyses_do_not_branch_on_the_array_module_or_pick_a_backend():
    bad = []
    for f in sorted((ROOT / "analyses").rglob("*.py")):
        for i, line in _code_lines(f):
            if any(s in line for s in ("xp is np", "xp is not np", "get_backend(", "gpu_available(")):
                bad.append(f"{f.name}:{i}: {line.strip()}")
    assert not bad, "analyses use backend.ops / gpuclust.backends.backend_of instead:\n" + "\n".join(bad)


def test_analyses_do_not_probe_backend_capabilities():
    """What a backend's ops offer is declared on every backend (``lookup_block_rows``,
    ``lookup_slot_tables``: gpuclust/backends/cpu.py and gpu.py), so analyses read it; a
    ``getattr`` / ``hasattr`` probe of the ops would hide a backend that lacks it."""
    import re

    bad = []
    for f in sorted((ROOT / "analyses").rglob("*.py")):
        for i, line in _code_lines(f):
            if re.search(r"(getattr|hasattr)\((backend\.|be\.)?ops\b", line):
                bad.append(f"{f.name}:{i}: {line.strip()}")
    assert not bad, "declare the attribute on every backend's ops instead:\n" + "\n".join(bad)


def test_both_backends_declare_the_same_lookup_attributes():
    from gpuclust.backends import cpu, gpu

    for name in ("lookup_block_rows", "lookup_slot_tables"):
        assert hasattr(cpu, name) and hasattr(gpu, name), name


def test_array_module_calls_that_differ_on_cupy_go_through_xp_helpers():
    """``xp.bincount`` refuses an empty array on CuPy (not on NumPy): the package calls
    ``gpuclust._xp.bincount`` instead (tests/generic_backend.py runs the analyses into the rest)."""
    bad = []
    for f in sorted(ROOT.rglob("*.py")):
        if f.name == "_xp.py":
            continue
        for i, line in _code_lines(f):
            if "xp.bincount(" in line.replace("np.bincount(", "") or "cp.bincount(" in line:
                bad.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not bad, "use gpuclust._xp.bincount(xp, ...):\n" + "\n".join(bad)


def test_no_private_names_imported_across_packages():
    """``from gpuclust.<pkg>... import _name`` (or anything from a private module of ``<pkg>``,
    e.g. ``analyses._lookup``) only inside ``<pkg>``; the top-level ``gpuclust._*`` modules are
    project-wide internals."""
    bad = []
    for f in sorted(ROOT.rglob("*.py")):
        rel = f.relative_to(ROOT).parts
        pkg = rel[0] if len(rel) > 1 else None
        for node in ast.walk(ast.parse(f.read_text())):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("gpuclust."):
                continue
            parts = node.module.split(".")
            if parts[1] == pkg:
                continue
            private_module = any(p.startswith("_") for p in parts[2:])  # gpuclust._x: project-wide
            for alias in node.names:
                if alias.name.startswith("_") or private_module:
                    bad.append(f"{'/'.join(rel)}:{node.lineno}: from {node.module} import {alias.name}")
    assert not bad, "\n".join(bad)


def test_no_module_over_600_lines():
    """Issue 36: modules small enough to read; split a module by responsibility before it grows past this."""
    big = {
        str(f.relative_to(ROOT)): n for f in sorted(ROOT.rglob("*.py")) if (n := len(f.read_text().splitlines())) > 600
    }
    assert not big, big


def _analysis_classes() -> list[type]:
    """Every analysis class in gpuclust/analyses (the registered ones and their prerequisite passes)."""
    import importlib
    import pkgutil

    import gpuclust.analyses as pkg
    from gpuclust.analyses.base import Analysis

    for m in pkgutil.walk_packages(pkg.__path__, "gpuclust.analyses."):
        importlib.import_module(m.name)
    out, todo = [], list(Analysis.__subclasses__())
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo += cls.__subclasses__()
    return sorted({c for c in out if c.__module__.startswith("gpuclust.analyses")}, key=lambda c: c.__qualname__)


def test_analyses_check_options_only_by_their_declarations():
    """Issue 36: an option's checks are declared on it (``option(..., gt=0, check=...)``) and a rule
    between options in ``option_relations``; ``Analysis.__post_init__`` checks them all, so no
    analysis class defines its own ``__post_init__``."""
    bad = [f"{c.__module__}.{c.__qualname__}" for c in _analysis_classes() if "__post_init__" in vars(c)]
    assert not bad, "declare the checks on the options instead of a __post_init__:\n" + "\n".join(bad)


def test_analysis_parameters_docs_come_from_the_options():
    """Issue 36: the Parameters section of an analysis docstring is generated from its option
    declarations (``Analysis.__init_subclass__``), never written by hand beside them."""
    import inspect
    import re

    from gpuclust.analyses.options import options_of

    section = re.compile(r"^\s*Parameters\s*\n\s*-{3,}", re.M)
    bad = []
    for cls in _analysis_classes():
        tree = ast.parse(Path(inspect.getfile(cls)).read_text())
        node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
        opts = options_of(cls)
        if opts and section.search(ast.get_docstring(node) or ""):
            bad.append(f"{cls.__qualname__}: hand-written Parameters")
        missing = [
            o.name for o in opts if f"\n{o.name} : {o.kind}, default {o.default_str}\n" not in (cls.__doc__ or "")
        ]
        if missing:
            bad.append(f"{cls.__qualname__}: no generated entry for {missing}")
    assert not bad, "\n".join(bad)


def test_run_flags_that_set_options_are_declared_on_the_option():
    """Issue 36: ``--tier-map`` / ``--mode`` stand for ``-O tier_map=`` / ``-O mode=``; such a flag is
    declared on the option (``option(..., flag=...)``, :data:`FLAG_OPTIONS`), not beside it."""
    import argparse

    from gpuclust.analyses import REGISTRY
    from gpuclust.analyses.options import FLAG_OPTIONS
    from gpuclust.engine.command import add_run_options

    p = argparse.ArgumentParser()
    add_run_options(p)
    option_names = {o.name for e in REGISTRY.values() for o in e.options}
    flags = {a.dest: tuple(a.option_strings) for a in p._actions if a.dest in option_names}
    assert flags == {o.name: (o.flag,) for o in FLAG_OPTIONS}
    for o in FLAG_OPTIONS:
        declared = [e.name for e in REGISTRY.values() for d in e.options if d.name == o.name and d.flag == o.flag]
        assert declared, f"no analysis option is {o.flag}'s {o.name}"
