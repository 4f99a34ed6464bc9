"""The registry's "GPU kernels" column is what each analysis' gpu run launches.

Two halves, each without a device:

* which ``kernels/*.cu`` files each gpu op launches, read from the source: a call graph of the
  gpu op modules and every gpuclust function they reach (:func:`kernel_files`), a file counted
  where a function names it (``get_function("grouped_sum.cu", ...)``, a module's ``KERNEL_FILE``);
* which ops each analysis' gpu run calls, over its options (the first two choices of each, as the
  conformance suite takes them) and in one and in three partitions (partials kept on the device,
  and merged): recorded on the device-shaped backend (``tests/device_backend.py``: the ops by
  name, and ``bincount``, whose CuPy form is :func:`gpuclust._kernels.bincount`).

The registry's ``kernels`` of an analysis must be the files its recorded ops reach, no more and
no fewer.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import re
from pathlib import Path

import pytest
from device_backend import DEVICE_GPU, OPS_CALLED, counting_device_work, resolve_gpu_to_device
from run_once import once_per_run

from gpuclust import engine
from gpuclust.analyses.registry import REGISTRY, create, names
from gpuclust.backends import EXTENSION_OP_MODULES, OP_NAMES

_CU = re.compile(r"^\w+\.cu$")
Ref = tuple[str, str]  # (module, function)


@functools.cache
def _module(name: str) -> tuple[dict[str, ast.FunctionDef], dict[str, Ref], dict[str, str], str | None]:
    """A gpuclust module's top-level functions, the names it imports from gpuclust modules (a
    function's own imports included), its module aliases, and its ``KERNEL_FILE``."""
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, name
    tree = ast.parse(Path(spec.origin).read_text())
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    names_: dict[str, Ref] = {}
    aliases: dict[str, str] = {}
    kernel_file = None
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpuclust"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if _is_module(sub):
                    aliases[a.asname or a.name] = sub
                else:
                    names_[a.asname or a.name] = (node.module, a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("gpuclust"):
                    aliases[a.asname or a.name] = a.name
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "KERNEL_FILE" for t in targets):
                kernel_file = node.value.value
    return funcs, names_, aliases, kernel_file


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


@functools.cache
def kernel_files(module: str, func: str) -> frozenset[str]:
    """The ``.cu`` files ``module.func`` launches kernels of, itself or through the gpuclust
    functions it calls."""
    return frozenset(_reach(module, func, set()))


def _reach(module: str, func: str, seen: set[Ref]) -> set[str]:
    if (module, func) in seen:
        return set()
    seen.add((module, func))
    funcs, imported, aliases, kernel_file = _module(module)
    if func not in funcs:  # re-exported: follow the import
        return _reach(*imported[func], seen) if func in imported else set()
    files: set[str] = set()
    for node in ast.walk(funcs[func]):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _CU.match(node.value):
            files.add(node.value)
        elif isinstance(node, ast.Name):
            if node.id == "KERNEL_FILE" and kernel_file:
                files.add(kernel_file)
            elif node.id in funcs and node.id != func:
                files |= _reach(module, node.id, seen)
            elif node.id in imported:
                files |= _reach(*imported[node.id], seen)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            files |= _reach(aliases[node.value.id], node.attr, seen)
    return files


def op_kernel_files(op: str) -> frozenset[str]:
    """The files the gpu backend's op ``op`` launches (``bincount``: :func:`gpuclust._xp.bincount`)."""
    if op == "bincount":
        return kernel_files("gpuclust._xp", "bincount")
    for module in ("gpuclust.backends.gpu", *EXTENSION_OP_MODULES["gpu"]):
        funcs, imported, _, _ = _module(module)
        if op in funcs or op in imported:
            return kernel_files(module, op)
    raise AssertionError(f"no gpu op {op!r}")


def test_the_call_graph_finds_the_kernels_the_ops_launch():
    """Facts of the sources, read by hand: the op's own file, one reached through a helper
    (``run_weighted_sums`` through ``_xp.bincount`` to ``_kernels.bincount``; ``grouped_comoments``
    through ``_function`` and ``KERNEL_FILE``; ``gather_repair_percentiles`` through an import in
    its body), and CuPy-only ops."""
    assert op_kernel_files("grouped_sum") == {"grouped_sum.cu"}
    assert op_kernel_files("bucket_overlap") == {"bucket_overlap.cu"}
    assert op_kernel_files("bincount") == {"grouped_sum.cu"}
    assert op_kernel_files("run_weighted_sums") == {"grouped_sum.cu"}
    assert op_kernel_files("grouped_comoments") == {"grouped_moments.cu"}
    assert op_kernel_files("mixture_quantiles") >= {"mixture.cu"}
    assert op_kernel_files("gather_repair_percentiles") == {"mixture.cu"}
    for op in ("hash_index", "scatter_max", "stable_argsort", "cummax_rows", "repeat_index"):
        assert op_kernel_files(op) == frozenset(), op
    every = {f.name for f in (Path(__file__).resolve().parents[2] / "kernels").glob("*.cu")}
    ops = {*OP_NAMES, "bincount"}
    for module in EXTENSION_OP_MODULES["gpu"]:  # (CuPy is imported lazily: these import without it)
        mod = importlib.import_module(module)
        ops |= {n for n in mod.__all__ if callable(getattr(mod, n))}
    assert set().union(*(op_kernel_files(op) for op in ops)) == every  # every file has an op that launches it


def _variants():
    """Each analysis' default and, per option, its first two choices (one of ``tier_map``): each
    distinct analysis once (a choice that is the option's default gives the default again)."""
    out = {}
    for name, entry in REGISTRY.items():
        out.setdefault(name, []).append(create(name))
        for opt in entry.options:
            for choice in (opt.choices or ())[: 1 if opt.name == "tier_map" else 2]:
                a = create(name, **{opt.name: choice})
                if a not in out[name]:  # (an equal analysis runs the same ops on the same data)
                    out[name].append(a)
    return out


def _record(folder: Path, ds: Path) -> Path:
    mp = pytest.MonkeyPatch()
    resolve_gpu_to_device(mp)
    lines = []
    try:
        for name, variants in _variants().items():
            called: set[str] = set()
            for a in variants:
                for parts in (1, 3):
                    with counting_device_work():
                        engine.run(ds, [a], backend=DEVICE_GPU, partitions=parts)
                    called |= set(OPS_CALLED)
            lines.append(f"{name}\t{','.join(sorted(called))}")
    finally:
        mp.undo()
    (folder / "ops.tsv").write_text("\n".join(lines) + "\n")
    return folder / "ops.tsv"


@pytest.fixture(scope="module")
def ops_called(tmp_path_factory, synth_cell_40) -> dict[str, set[str]]:
    """Each analysis' ops over its variants, on the synthetic cell (every column an analysis
    reads, realistic: percentile vectors, CPI, events of every kind)."""
    text = once_per_run(tmp_path_factory, "registry-kernels", lambda f: _record(f, synth_cell_40 / "ds")).read_text()
    return {n: set(filter(None, ops.split(","))) for n, ops in (line.split("\t") for line in text.splitlines())}


@pytest.mark.parametrize("analysis", names())
def test_the_registry_names_the_kernels_the_gpu_run_launches(ops_called, analysis):
    called = ops_called[analysis]
    launched = set().union(*(op_kernel_files(op) for op in called)) if called else set()
    assert set(REGISTRY[analysis].kernels) == launched, (
        f"{analysis}: its gpu run calls {sorted(called)}, which launch {sorted(launched)}; "
        f"the registry says {list(REGISTRY[analysis].kernels)}"
    )
