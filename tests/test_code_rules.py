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


#: The analyses' comparisons of a backend's name, each about placement or sizing
#: (docs/developer/engine.md, "Where an analysis looks at the backend").
BACKEND_NAME_CHECKS = {
    "_kept.py": 1,
    "_task_ratios.py": 1,
    "_peak_sim.py": 1,
    "_usage_distribution_parts.py": 2,
    "overcommit.py": 1,
}


def test_analyses_compare_backend_names_only_where_the_docs_say():
    import re

    found: dict[str, int] = {}
    for f in sorted((ROOT / "analyses").rglob("*.py")):
        for _, line in _code_lines(f):
            if re.search(r"""(\.name|backend_name)\s*[!=]=\s*["'](cpu|gpu)["']""", line):
                found[f.name] = found.get(f.name, 0) + 1
    assert found == BACKEND_NAME_CHECKS, "say why in docs/developer/engine.md and list it here"


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


#: Functions allowed past 80 lines, each with its reason.
_LONG_FUNCTIONS = {
    # numba-compiled per-byte loop (the fallback of the C reader, _fast_usage_c.c, which it mirrors
    # line for line): its parse state is locals the compiler keeps in registers across the loop.
    ("ingest/readers/_fast_usage_kernel.py", "parse_usage"),
}


def _function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function from ``def`` to its end, its docstring left out (a public numpydoc
    docstring may be long; the code may not)."""
    n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        n -= first.end_lineno - first.lineno + 1  # type: ignore[operator]
    return n


def test_no_function_over_80_lines():
    """Issue 36: a function does one thing that fits on a screen; split longer ones into named steps."""
    long = [
        f"{f.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)"
        for f in sorted(ROOT.rglob("*.py"))
        for node in ast.walk(ast.parse(f.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and (n := _function_lines(node)) > 80
        and (str(f.relative_to(ROOT)), node.name) not in _LONG_FUNCTIONS
    ]
    assert not long, "\n".join(long)


def test_function_length_counts_code_not_docstring():
    code = "def f():\n    '''doc\n\n    more'''\n" + "    x = 1\n" * 79
    (node,) = ast.parse(code).body
    assert isinstance(node, ast.FunctionDef) and _function_lines(node) == 80
    (node,) = ast.parse(code + "    x = 2\n").body
    assert isinstance(node, ast.FunctionDef) and _function_lines(node) == 81


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


# ------------------------------------------------------------------ package direction (issue 36)
#: The layers of gpuclust, lowest first: a member of the package (a top-level module, or a
#: sub-package with everything in it) imports only members of its own layer or of a layer below,
#: lazy imports included.  Every member is placed here, so a new one is placed on purpose.
LAYERS: tuple[tuple[str, ...], ...] = (
    # the kit: leaf modules every layer uses (``gpuclust`` itself: its ``__init__``, which imports
    # only the schema and resolves the public API by name, on first use, from the layers above)
    (
        "gpuclust",
        "gpuclust.schema",
        "gpuclust.errors",
        "gpuclust._files",
        "gpuclust._xp",
        "gpuclust._lazy",
        "gpuclust._cache",
        "gpuclust._memory",
        "gpuclust._parallel",
        "gpuclust._progress",
        "gpuclust._kernels",
        "gpuclust.arrow_numpy",
        "gpuclust.stats",
        "gpuclust.stream_quantiles",
        "gpuclust.trace_time",
        "gpuclust.tiers",
        "gpuclust.keys",
    ),
    # data on disk and in memory: the dataset, its layout, tables; `gpuclust optimize` rewrites a dataset
    ("gpuclust.layout", "gpuclust.tables", "gpuclust.dataset", "gpuclust._optimize_passes", "gpuclust.optimize"),
    ("gpuclust.partials",),  # mergeable partial results (moments, keyed sums)
    ("gpuclust.backends",),  # the array backends and their kernels
    ("gpuclust.parted",),  # tables written in parts, finalized shard by shard on a backend
    ("gpuclust.ingest",),  # raw traces -> a dataset
    ("gpuclust.synth",),  # a synthetic trace, ingested
    ("gpuclust.analyses",),
    ("gpuclust.engine",),  # runs analyses over a dataset
    ("gpuclust.info",),  # what a dataset holds and which analyses can run on it
    ("gpuclust.claims",),  # published observations computed from analyses' results
    ("gpuclust.report",),  # results folders, plots, the HTML report
    ("gpuclust.demo", "gpuclust.cli", "gpuclust.__main__"),  # the command line
)

#: Imports that still go up a layer, each with why, as ``(importing module, member it imports)``;
#: the cycle test skips them too.  None is: move what two layers share down instead.
UPWARD_ALLOWED: dict[tuple[str, str], str] = {}

#: Cycles inside a package allowed for now, each with why (members, sorted).  None is.
CYCLES_ALLOWED: dict[tuple[str, ...], str] = {}


def _layer_edges() -> tuple[list, list]:
    """gpuclust's imports (tests/import_graph.py: every import statement, lazy ones included,
    ``TYPE_CHECKING`` ones not): all of them, and those not in :data:`UPWARD_ALLOWED`."""
    from import_graph import command_member, imports

    edges = imports(ROOT)
    allowed = {(e.importer, command_member(ROOT.name, e.target)) for e in edges} & set(UPWARD_ALLOWED)
    return edges, [e for e in edges if (e.importer, command_member(ROOT.name, e.target)) not in allowed]


def test_packages_import_down_the_layers_only():
    """Issue 36: gpuclust's packages and top-level modules form the layers of :data:`LAYERS`; none
    imports a member of a higher layer, a lazy import inside a function included (it is a
    dependency all the same).  A package's ``command`` module (its command-line face, registered by
    ``gpuclust.cli``) is in the command line's layer: ``engine/command.py`` runs
    ``gpuclust.report.analyze``.  What two layers share lives in the lower one
    (``gpuclust.errors``: exit statuses, ``BackendUnavailable``, ``OutputError``;
    ``gpuclust.trace_time``: the ``--from/--to`` reading that ingest and the engine share;
    ``gpuclust.report.analyze``: running analyses into a results folder, above the engine)."""
    from import_graph import command_member, modules

    placed = [m for names in LAYERS for m in names]
    members = {m for m in modules(ROOT) if m.count(".") <= 1}
    assert len(placed) == len(set(placed)), "a member is in two layers"
    assert members == set(placed), {"not placed in LAYERS": members - set(placed), "gone": set(placed) - members}
    edges, kept = _layer_edges()
    layer = {m: k for k, names in enumerate(LAYERS) for m in names}

    bad = sorted(
        f"{e} ({a} is in layer {layer[a]}, {b} in layer {layer[b]})"
        for e in kept
        if (a := command_member(ROOT.name, e.importer)) != (b := command_member(ROOT.name, e.target))
        and layer[a] < layer[b]
    )
    assert not bad, "imports up the layers:\n" + "\n".join(bad)
    used = {(e.importer, command_member(ROOT.name, e.target)) for e in edges}
    assert set(UPWARD_ALLOWED) <= used, f"allowed but no longer imported (drop them): {set(UPWARD_ALLOWED) - used}"


def test_no_import_cycles_inside_a_package():
    """Issue 36: inside each package (gpuclust itself, whose members are its top-level modules and
    sub-packages; each sub-package, whose members are its modules, its ``__init__`` and its own
    sub-packages) the imports between members have no cycle (no strongly connected component of
    two or more members), lazy imports included.  Imports under ``if TYPE_CHECKING:`` are not
    counted: they never run.  A cycle is broken by moving what both ends need into a module of
    its own (``claims.model``: the claim types the catalog and the evaluation share;
    ``ingest.readers._pow10``: the table both fast JSON kernels index)."""
    from import_graph import command_member, cycles, graph, packages

    _, edges = _layer_edges()
    found = {pkg: cycles(graph(pkg, edges, command_member)) for pkg in packages(ROOT)}
    bad = [f"{pkg}: {c}" for pkg, cs in found.items() for c in cs if tuple(c) not in CYCLES_ALLOWED]
    assert not bad, "import cycles:\n" + "\n".join(bad)
    still = {tuple(c) for cs in found.values() for c in cs}
    assert set(CYCLES_ALLOWED) <= still, f"allowed cycles that are gone (drop them): {set(CYCLES_ALLOWED) - still}"


#: What only gpuclust/tiers.py defines (issue 36: the tier map resolution, priority -> tier code and
#: the tier names were each written several times): functions, methods and class attributes.
_TIER_NAMES_ONLY_IN_TIERS = ("resolve_tier_map", "tier_codes", "tier_names", "check_tier_slots")


def _is_tier_count(node: ast.AST) -> bool:
    """Whether ``node`` is ``len(<a tier map>.names)``."""
    return (
        isinstance(node, ast.Call)
        and _name(node.func) == "len"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Attribute)
        and node.args[0].attr == "names"
    )


def _tier_copies(path: Path, boundaries: set[int], root: Path = ROOT) -> list[str]:
    """A module's tier code outside gpuclust/tiers.py: a definition named as one of
    :data:`_TIER_NAMES_ONLY_IN_TIERS` (leading underscores ignored), a ``searchsorted`` over a tier
    map's ``bounds``, a priority compared with a tier boundary literal (``prio >= 120``), or a
    map's tier count compared with a limit (``len(tm.names) + 1 > 17``: ``check_tier_slots``)."""
    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names = [node.name]
        elif isinstance(node, ast.ClassDef):
            for st in node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    names.append(st.target.id)
                elif isinstance(st, ast.Assign):
                    names += [t.id for t in st.targets if isinstance(t, ast.Name)]
        for n in names:
            if n.lstrip("_") in _TIER_NAMES_ONLY_IN_TIERS:
                bad.append(f"{path.relative_to(root)}:{node.lineno}: defines {n}")
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "searchsorted":
            if any(isinstance(a, ast.Attribute) and a.attr == "bounds" for arg in node.args for a in ast.walk(arg)):
                bad.append(f"{path.relative_to(root)}:{node.lineno}: searchsorted over tier bounds")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            limit = any(isinstance(op, ast.Gt | ast.GtE | ast.Lt | ast.LtE) for op in node.ops)
            if limit and any(_is_tier_count(n) for s in sides for n in ast.walk(s)):
                bad.append(f"{path.relative_to(root)}:{node.lineno}: tier count checked (check_tier_slots)")
            lits = {s.value for s in sides if isinstance(s, ast.Constant) and type(s.value) is int}
            if lits & boundaries and any("prio" in ast.unparse(s).lower() for s in sides):
                bad.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return bad


def test_tiers_are_resolved_coded_and_named_only_in_gpuclust_tiers():
    """Issue 36: one tiers module.  Which tier map an analysis uses, the tier code of a priority
    (on any backend), the tier names and whether a map's tiers fit an analysis' tier slots come
    from gpuclust/tiers.py (the maps themselves from gpuclust/schema.py); a copy elsewhere fails
    here: a function or attribute of those names, a ``searchsorted`` over ``TierMap.bounds``, a
    priority compared with a tier boundary (the lowest priority of a tier of a named map above 2,
    or the one below it: smaller numbers are too common to tell), or a tier count compared with a
    limit."""
    from gpuclust.schema import TIER_MAPS

    boundaries = {v for tm in TIER_MAPS.values() for b in tm.bounds if b > 2 for v in (b, b - 1)}
    bad = []
    for f in sorted(ROOT.rglob("*.py")):
        if f.relative_to(ROOT).as_posix() != "tiers.py":
            bad += _tier_copies(f, boundaries)
    assert not bad, (
        "use gpuclust.tiers (resolve_tier_map, tier_codes, tier_names, TierNames, check_tier_slots):\n" + "\n".join(bad)
    )


def test_the_tier_copy_check_finds_a_tier_count_check(tmp_path: Path) -> None:
    """The check above finds a tier count checked by hand (and not other lengths)."""
    f = tmp_path / "copy.py"
    f.write_text(
        "if len(tm.names) + 1 > _T:\n    raise ValueError\nif len(cols) > 3 or code == len(tm.names):\n    pass\n"
    )
    assert [b.split(": ", 1)[1] for b in _tier_copies(f, set(), tmp_path)] == ["tier count checked (check_tier_slots)"]


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
