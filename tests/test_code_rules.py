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
