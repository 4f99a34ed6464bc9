"""Time selections ``[from, to)`` of trace time, with Parquet row-group pushdown.

The ``--from`` / ``--to`` values are read by :mod:`gpuclust.trace_time` (trace time or the cell's
wall-clock, into a :class:`~gpuclust.trace_time.Selection`); this module applies a selection to a run.

What a selection means is decided per analysis by a **rule** on the table it streams
(:data:`RULES`); the engine (:func:`attach`, :func:`prune_plans`, :func:`columns_for`):

* reads only the Parquet row groups whose min/max statistics allow a selected row (a row group
  without statistics is always read: pruning never drops a selected row);
* filters the rows of every partition by the rule before they reach the analysis' ``partial``;
* leaves the analyses' contexts (state built from events: priorities, running intervals,
  capacities) reading their side tables whole, and maps overcommit's trace window onto the
  selection.

So a selected run equals the run over the dataset whose streamed table was filtered first by the
rule (``tests/engine/test_selection.py`` checks this against DuckDB and filtered Arrow tables).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuclust.engine.partition import PartitionSpec, Piece
from gpuclust.trace_time import Selection, SelectionError, selection_of

__all__ = [
    "RULES",
    "SelectedSource",
    "attach",
    "columns_for",
    "data_span",
    "prune_plans",
    "rule_of",
    "unwrap",
]

_NULL = int(np.iinfo(np.int64).min)


# --------------------------------------------------------------------------------- rules
@dataclass(frozen=True)
class Rule:
    """Which rows of a streamed table a selection keeps: ``lo`` column >= from (or, ``overlap``,
    ``hi`` column > from), ``lo`` column < to; NULL times are never selected."""

    name: str
    lo: str  # compared with to (and with from unless hi is set)
    hi: str | None = None  # overlap: compared with from
    uses_from: bool = True
    text: str = ""

    @property
    def columns(self) -> tuple[str, ...]:
        return (self.lo,) if self.hi is None else (self.lo, self.hi)


#: The rules, by name.
RULES = {
    "start": Rule("start", "start_time", text="usage windows with start_time in [from, to)"),
    "overlap": Rule(
        "overlap",
        "start_time",
        "end_time",
        text="usage windows overlapping [from, to): start_time < to and end_time > from",
    ),
    "time": Rule("time", "time", text="events with time in [from, to)"),
    "before-to": Rule(
        "before-to", "time", uses_from=False, text="events with time < to (state up to the selection's end)"
    ),
}
#: Analyses whose rule is not their table's default.
RULE_BY_ANALYSIS = {"overcommit": "overlap", "machine-shapes": "before-to"}
#: Default rule of an analysis streaming each table.
RULE_BY_TABLE = {
    "instance_usage": "start",
    "instance_events": "time",
    "collection_events": "time",
    "machine_events": "before-to",
    "machine_attributes": "before-to",
}


def rule_of(analysis: Any) -> Rule:
    """The selection rule of an analysis: its ``selection_rule`` attribute, else
    :data:`RULE_BY_ANALYSIS`, else its table's default (:data:`RULE_BY_TABLE`)."""
    name = (
        getattr(analysis, "selection_rule", None)
        or RULE_BY_ANALYSIS.get(analysis.name)
        or RULE_BY_TABLE.get(analysis.table)
    )
    if name is None:
        raise SelectionError(f"{analysis.name}: no time selection is defined for table {analysis.table}")
    return RULES[name]


def row_mask(rule: Rule, sel: Selection, cols: dict[str, Any], xp: Any = np) -> Any:
    """Boolean mask of the rows ``rule`` keeps (``cols``: engine columns, NULL ints = dtype min)."""
    lo = cols[rule.lo]
    keep = lo != _NULL
    if sel.end is not None:
        keep &= lo < sel.end
    if sel.start is not None and rule.uses_from:
        if rule.hi is None:
            keep &= lo >= sel.start
        else:
            hi = cols[rule.hi]
            keep &= (hi != _NULL) & (hi > sel.start)
    return keep


def _group_may_hold(rule: Rule, sel: Selection, stats: dict[str, tuple[int, int] | None]) -> bool:
    """Whether a row group with these (min, max) statistics can hold a selected row (``None``:
    no statistics, so it might)."""
    lo = stats.get(rule.lo)
    if lo is not None and sel.end is not None and lo[0] >= sel.end:
        return False
    if sel.start is not None and rule.uses_from:
        hi = stats.get(rule.hi or rule.lo)
        if hi is not None and (hi[1] <= sel.start if rule.hi is not None else hi[1] < sel.start):
            return False
    return True


# --------------------------------------------------------------------------------- source
class SelectedSource:
    """A source with a selection: reads (for contexts) are the inner source's, whole; partitions
    of streamed tables are pruned and filtered by the engine (:func:`prune_plans`).

    ``stats`` accumulates, per streamed table, the row groups and compressed bytes a run read
    against what reading the same columns without the selection would have read.
    """

    def __init__(self, inner: Any, selection: Selection):
        self.inner = inner
        self.selection = selection
        self.stats: dict[str, dict[str, int]] = {}

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "selection", "stats"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def read(self, table: str, columns: Sequence[str] | None = None) -> Any:
        return self.inner.read(table, columns)

    def num_rows(self, table: str) -> int:
        """Rows of ``table`` its default rule selects (:data:`RULE_BY_TABLE`; what a context that
        sizes its work by the streamed table, e.g. usage-distribution's ``strategy=auto``, sees),
        counted exactly from the time columns of the row groups that may hold them."""
        if table not in RULE_BY_TABLE:
            return int(self.inner.num_rows(table))
        key = f"_rows_{table}"
        if key not in self.__dict__:
            self.__dict__[key] = _count_selected(self.inner, table, RULES[RULE_BY_TABLE[table]], self.selection)
        return int(self.__dict__[key])

    def describe(self) -> dict[str, Any]:
        """The selection, its read statistics and the span of each streamed table's time column
        in the whole dataset, ``data_span_us`` (``_run.json``'s ``selection``: a selection that
        keeps no row can then say where the data is)."""
        return {
            **self.selection.to_json(),
            "read": {t: dict(s) for t, s in self.stats.items()},
            "data_span_us": {t: data_span(self.inner, t) for t in self.stats},
        }


def data_span(source: Any, table: str) -> dict[str, Any] | None:
    """``{"column", "min", "max"}``: the first and last trace time of ``table``'s time column (its
    default rule's, :data:`RULE_BY_TABLE`), NULLs and "after the trace" (2^63-1) left out, from the
    row groups' Parquet statistics (a row group without them, or whose maximum is 2^63-1, is read);
    ``None`` when there is no such value."""
    import pyarrow.parquet as pq

    from gpuclust.engine.partition import column_to_numpy
    from gpuclust.schema import TIME_AFTER_TRACE

    rule = RULES.get(RULE_BY_TABLE.get(table, ""))
    if rule is None:
        return None
    col = rule.lo
    ends: list[int] = []

    def take(column: Any) -> None:
        a = column_to_numpy(column)
        a = a[(a != _NULL) & (a < TIME_AFTER_TRACE)]
        if a.size:
            ends.extend((int(a.min()), int(a.max())))

    files = source.files(table) if hasattr(source, "files") else None
    if not files:
        take(source.read(table, [col]).column(0))
    for f in files or ():
        for g, (_, n, _, st) in enumerate(_file_groups(str(f), (col,))):
            mm = st.get(col)
            if n and mm is not None and mm[1] < TIME_AFTER_TRACE:
                ends.extend(mm)
            elif n:
                take(pq.ParquetFile(f).read_row_group(g, columns=[col]).column(0))
    return {"column": col, "min": min(ends), "max": max(ends)} if ends else None


def _count_selected(source: Any, table: str, rule: Rule, sel: Selection) -> int:
    from gpuclust.engine.partition import column_to_numpy

    def count(t: Any) -> int:
        return int(row_mask(rule, sel, {c: column_to_numpy(t.column(c)) for c in rule.columns}).sum())

    files = source.files(table) if hasattr(source, "files") else None
    if not files:
        return count(source.read(table, list(rule.columns)))
    from gpuclust.dataset import open_parquet, reading

    n = 0
    for f in files:
        groups = [
            g for g, (_, _, _, st) in enumerate(_file_groups(str(f), rule.columns)) if _group_may_hold(rule, sel, st)
        ]
        if groups:
            with reading(f):
                t = open_parquet(f).read_row_groups(groups, columns=list(rule.columns))
            n += count(t)
    return n


def unwrap(source: Any) -> Any:
    """The source without its selection (what partitions are planned on)."""
    return source.inner if isinstance(source, SelectedSource) else source


def attach(source: Any, analyses: list[Any], time_from: Any = None, time_to: Any = None) -> tuple[Any, list[Any]]:
    """``(source, analyses)`` with the selection attached: a :class:`SelectedSource` and the
    analyses bound to it (overcommit's window).  Without ``time_from`` / ``time_to`` a source that
    already carries a selection keeps it; a plain source is returned as is."""
    from gpuclust.engine.contexts import resolve_analyses

    analyses = resolve_analyses(analyses)
    sel = selection_of(unwrap(source), time_from, time_to)
    if sel is None:
        if not isinstance(source, SelectedSource):
            return source, list(analyses)
        sel = source.selection
    elif isinstance(source, SelectedSource):
        if source.selection != sel:
            raise SelectionError("the source already carries a different selection")
    else:
        source = SelectedSource(source, sel)
    return source, [bind(a, sel) for a in analyses]


def bind(analysis: Any, sel: Selection) -> Any:
    """``analysis`` with the selection mapped onto its own window options (overcommit's
    ``window_start_us`` / ``window_end_us``); an explicit, different value is an error."""
    rule_of(analysis)  # an analysis with no rule for its table is an error here, before any work
    fields = {f.name: f for f in dataclasses.fields(analysis)} if dataclasses.is_dataclass(analysis) else {}
    changes = {}
    for opt, val in (("window_start_us", sel.start), ("window_end_us", sel.end)):
        if opt not in fields or val is None:
            continue
        cur, default = getattr(analysis, opt), fields[opt].default
        if cur != default and cur != val:
            flag = "--from" if opt == "window_start_us" else "--to"
            raise SelectionError(
                f"{analysis.name}: option {opt}={cur} conflicts with {flag} ({val} us); give one of them"
            )
        if cur != val:
            changes[opt] = val
    return dataclasses.replace(analysis, **changes) if changes else analysis


# --------------------------------------------------------------------------------- pruning
@dataclass(frozen=True)
class SelectedSpec(PartitionSpec):
    """A partition whose rows are filtered by ``selection`` (per analysis rule) before the partial."""

    selection: Selection | None = field(default=None)


def _file_groups(path: str, columns: Sequence[str]) -> list[tuple[int, int, int, dict[str, tuple[int, int] | None]]]:
    """Per row group of a Parquet file: (first row, rows, compressed bytes of ``columns``,
    {column: (min, max) or None})."""
    from gpuclust.dataset import open_parquet

    md = open_parquet(path).metadata
    names = [md.schema.column(j).name for j in range(md.num_columns)]
    idx = {c: names.index(c) for c in columns if c in names}
    out, off = [], 0
    for g in range(md.num_row_groups):
        rg = md.row_group(g)
        st: dict[str, tuple[int, int] | None] = {}
        size = 0
        for c, j in idx.items():
            cc = rg.column(j)
            size += int(cc.total_compressed_size)
            s = cc.statistics
            st[c] = (int(s.min), int(s.max)) if s is not None and s.has_min_max else None
        out.append((off, rg.num_rows, size, st))
        off += rg.num_rows
    return out


def prune_plans(
    source: Any,
    plans: dict[str, tuple[list[int], list[PartitionSpec]]],
    analyses: Sequence[Any],
    partitions: int | str = 1,
    cut_points: Any = None,
    multiple_of: int = 1,
    progress: Any = None,
    auto_rows: dict[str, int] | None = None,
) -> dict[str, tuple[list[int], list[PartitionSpec]]]:
    """Each table's partitions reduced to the Parquet row groups that may hold selected rows (for
    any of the analyses streaming it), as :class:`SelectedSpec` (rows filtered before the partial).

    Without explicit ``cut_points`` the surviving row groups are re-cut into partitions (``"auto"``:
    about :data:`gpuclust.engine.partition.AUTO_PARTITION_ROWS` selected-candidate rows each), so a
    one-day selection of a month is not one busy partition among thirty idle ones.
    """
    if not isinstance(source, SelectedSource):
        return plans
    from gpuclust.engine.partition import AUTO_PARTITION_ROWS

    sel = source.selection
    out: dict[str, tuple[list[int], list[PartitionSpec]]] = {}
    for table, (idx, specs) in plans.items():
        rules = [rule_of(analyses[k]) for k in idx]
        read_cols = sorted({c for k in idx for c in analyses[k].columns} | {c for r in rules for c in r.columns})
        st = source.stats.setdefault(
            table, {"passes": 0, "row_groups": 0, "row_groups_read": 0, "bytes": 0, "bytes_read": 0}
        )
        st["passes"] += 1
        cache: dict[str, Any] = {}
        kept: list[list[Piece]] = []
        for spec in specs:
            pieces: list[Piece] = []
            for p in spec.pieces:
                if p.file is None:
                    pieces.append(p)
                    continue
                groups = cache.get(p.file)
                if groups is None:
                    groups = cache[p.file] = _file_groups(p.file, read_cols)
                for g0, n, size, gst in groups:
                    s, e = max(p.start, g0), min(p.stop, g0 + n)
                    if e <= s:
                        continue
                    st["row_groups"] += 1
                    st["bytes"] += size
                    if any(_group_may_hold(r, sel, gst) for r in rules):
                        st["row_groups_read"] += 1
                        st["bytes_read"] += size
                        if pieces and pieces[-1].file == p.file and pieces[-1].stop == s:
                            pieces[-1] = Piece(pieces[-1].start, e, p.file)
                        else:
                            pieces.append(Piece(s, e, p.file))
            kept.append(pieces)
        if any(sp.grain is not None for sp in specs):
            # partitions of whole buckets (a bucketed layout): keep them, pruned inside
            out[table] = (
                idx,
                [
                    SelectedSpec(table, sp.index, tuple(ps), sp.grain, sp.buckets, sp.side, selection=sel)
                    for sp, ps in zip(specs, kept, strict=True)
                ],
            )
        else:
            if any(getattr(analyses[k], "whole_instances", False) for k in idx):
                kept = [[p for ps in kept for p in ps]]  # every instance whole: still one partition
            elif cut_points is None and all(p.file is not None for ps in kept for p in ps):
                kept = _recut(
                    [p for ps in kept for p in ps],
                    partitions,
                    multiple_of,
                    (auto_rows or {}).get(table, AUTO_PARTITION_ROWS),
                )
            out[table] = (idx, [SelectedSpec(table, k, tuple(ps), selection=sel) for k, ps in enumerate(kept)])
        if progress is not None:
            pct = 100.0 * st["bytes_read"] / st["bytes"] if st["bytes"] else 100.0
            progress.phase(
                f"selection {sel.start}..{sel.end} us: {table}: {st['row_groups_read']} of "
                f"{st['row_groups']} row groups, {st['bytes_read']:,} of {st['bytes']:,} bytes ({pct:.1f}%)"
            )
    return out


def _recut(pieces: list[Piece], partitions: int | str, multiple_of: int, auto_rows: int) -> list[list[Piece]]:
    """Contiguous runs of ``pieces`` (row-group runs, in order) as about equal partitions by rows."""
    units: list[Piece] = pieces
    total = sum(p.stop - p.start for p in units)
    if partitions == "auto":
        k = max(1, -(-total // auto_rows))
        if total >= multiple_of > 1:
            k = -(-k // multiple_of) * multiple_of
    else:
        k = int(partitions)
    if not units:
        return [[] for _ in range(k)]
    out: list[list[Piece]] = [[] for _ in range(k)]
    acc = 0
    for p in units:
        j = min(k - 1, int(acc * k // total)) if total else 0
        out[j].append(p)
        acc += p.stop - p.start
    return out


# --------------------------------------------------------------------------------- rows
def extra_columns(spec: Any, analyses: Sequence[Any]) -> set[str]:
    """The time columns the selection of ``spec`` reads besides the analyses' own."""
    if getattr(spec, "selection", None) is None:
        return set()
    return {c for a in analyses for c in rule_of(a).columns}


def columns_for(
    spec: Any, analysis: Any, cols: dict[str, Any], backend: Any, masks: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The columns handed to ``analysis.partial``: its own, rows filtered by its rule when the
    partition carries a selection (``masks`` caches one mask per rule across analyses)."""
    sel = getattr(spec, "selection", None)
    if sel is None:
        return {c: cols[c] for c in analysis.columns}
    rule = rule_of(analysis)
    masks = {} if masks is None else masks
    if rule.name not in masks:
        masks[rule.name] = row_mask(rule, sel, cols, backend.xp)
    m = masks[rule.name]
    return {c: cols[c][m] for c in analysis.columns}


def run_info(source: Any) -> dict[str, Any]:
    """``{"selection": ...}`` for ``_run.json`` when ``source`` carries a selection, else ``{}``."""
    return {"selection": source.describe()} if isinstance(source, SelectedSource) else {}
