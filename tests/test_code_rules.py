"""The analysis kit's rules (issue 8, docs/DESIGN habits), checked on the source: analyses never
branch on the array module or pick a backend themselves, and no module imports another package's
private helpers."""

from __future__ import annotations

import ast
import re
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


#: Constants of 64-bit hashes (splitmix64, golden ratio, xxhash primes): only gpuclust/keys.py has them.
_HASH_CONSTANTS = {
    0x9E3779B97F4A7C15,
    0xBF58476D1CE4E5B9,
    0x94D049BB133111EB,
    0x2545F4914F6CDD1D,
    0xC2B2AE3D27D4EB4F,
    0x165667B19E3779F9,
    0xFF51AFD7ED558CCD,
    0xC4CEB9FE1A85EC53,
}
#: Names of a key's span (the buckets per code, the tiers per machine): ``x * span + y`` packs a key.
_SPAN_NAME = re.compile(r"^(span|\w+_span|n_buckets|B1?|nb|T|n_platforms)$")
_BITS_NAME = re.compile(r"^_?[A-Z_]*BITS$")
#: Modules that still pack keys inline (``code * T + tier``), to move to gpuclust.keys once the
#: modules being split around them have settled.
_PACKING_PENDING = {
    "analyses/lifecycle.py",
    "analyses/_lifecycle_finalize.py",
    "analyses/overcommit.py",
    "analyses/_overcommit_partial.py",
    "analyses/_overcommit_finalize.py",
}
#: Modules whose shifts are not keys: 128-bit integer arithmetic.
_NOT_KEYS = {"ingest/readers/_fast_usage_kernel.py"}


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _inline_keys(tree: ast.AST) -> list[tuple[int, str]]:
    """Where ``tree`` hashes or packs integer keys by hand: a hash constant; ``a * span + b`` or
    ``| b``; ``k // span`` / ``k % span``; ``a << n | b`` or ``+ b``; a shift by a ``*_BITS``
    constant; ``k *= span``, ``k += code * span`` (span: a name :data:`_SPAN_NAME` matches;
    ``1 << n``, a power of two, is not a key)."""
    hits = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value in _HASH_CONSTANTS:
            hits.append((line, f"hash constant {node.value:#x}"))
        elif isinstance(node, ast.BinOp):
            op = node.op
            if isinstance(op, (ast.Add, ast.BitOr)):
                for side in (node.left, node.right):
                    if isinstance(side, ast.BinOp) and isinstance(side.op, ast.LShift):
                        if not isinstance(side.left, ast.Constant):  # (1 << n) + m: a power of two
                            hits.append((line, "a << n | b"))
                    elif isinstance(side, ast.BinOp) and isinstance(side.op, ast.Mult):
                        if _SPAN_NAME.match(_name(side.right) or ""):
                            hits.append((line, "a * span + b"))
            elif isinstance(op, (ast.FloorDiv, ast.Mod)) and _SPAN_NAME.match(_name(node.right) or ""):
                hits.append((line, "k // span, k % span"))
            elif isinstance(op, (ast.LShift, ast.RShift)) and _BITS_NAME.match(_name(node.right) or ""):
                if isinstance(node.left, ast.Constant):  # 1 << BITS: a power of two
                    continue
                hits.append((line, "a << BITS"))
        elif isinstance(node, ast.AugAssign):
            if isinstance(node.op, (ast.LShift, ast.RShift)) and _BITS_NAME.match(_name(node.value) or ""):
                hits.append((line, "a <<= BITS"))
            elif isinstance(node.op, ast.Mult) and _SPAN_NAME.match(_name(node.value) or ""):
                hits.append((line, "k *= span"))
            elif isinstance(node.op, (ast.Add, ast.BitOr)) and isinstance(node.value, ast.BinOp):
                v = node.value
                if isinstance(v.op, ast.Mult) and _SPAN_NAME.match(_name(v.right) or ""):
                    hits.append((line, "k += code * span"))
    return sorted(set(hits))


def test_keys_are_hashed_and_packed_by_gpuclust_keys():
    """One hash and one packing of integer keys, in gpuclust/keys.py (``hash64``, ``splitmix64``,
    ``pack`` / ``unpack``, ``pack_bits`` / ``unpack_bits``): no module hashes or packs by hand."""
    bad = []
    for f in sorted(ROOT.rglob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        if rel == "keys.py" or rel in _NOT_KEYS:
            continue
        for line, what in _inline_keys(ast.parse(f.read_text())):
            if rel in _PACKING_PENDING and not what.startswith("hash"):
                continue
            bad.append(f"{rel}:{line}: {what}")
    assert not bad, "hash and pack integer keys with gpuclust.keys:\n" + "\n".join(bad)


def test_the_inline_key_check_finds_each_scheme():
    """The check above finds each scheme it names (and not plain arithmetic)."""
    src = """
h = x * 0x9E3779B97F4A7C15
key = code * ctx.span + bucket
key = code * span | bucket
code, bucket = key // span, key % span
k = (hi << 32) | lo
k = (hi << n) + lo
size = (1 << bits) + n
b = key >> _TIER_BITS
k <<= ROW_BITS
k *= ctx.n_platforms
k += code * ctx.span
cells = machines * span
end = origin + n_buckets * width
mask = 1 << ROW_BITS
step = total // max(span, 1)
y = a * b + c
"""
    found = [line for line, _ in _inline_keys(ast.parse(src))]
    assert found == [2, 3, 4, 5, 6, 7, 9, 10, 11, 12], found
