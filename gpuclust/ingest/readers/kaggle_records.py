"""Kaggle ``borg_traces_data.csv`` records -> canonical rows: the cells of one record parsed
(nested cells by the safe literal parser :mod:`gpuclust.ingest.readers._pylit`) into an
``instance_events`` row, an ``instance_usage`` row and ``instance_constraints`` rows, and the
records of one chunk converted to canonical tables (:class:`_Batch`), with exact duplicate
usage rows within the file dropped.  Read by :mod:`gpuclust.ingest.readers.kaggle_csv`.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpuclust.ingest.base import Chunk, Reject, SourceFile, clip_raw
from gpuclust.ingest.readers import _pylit
from gpuclust.ingest.readers.kaggle_columns import (
    _INT_COLUMNS,
    _USAGE_PRESENCE,
    UNKNOWN_INSTANCE_INDEX,
    UNKNOWN_MACHINE_ID,
)
from gpuclust.ingest.readers.v2_csv import conform_rows
from gpuclust.schema import CPU_PERCENTILE_COLUMNS, Relation

#: pandas writes an integer column that held a NaN as floats ("399853286886.0"); the digits
#: before an all-zero fraction are the exact integer (read as text, never through float64).
_WHOLE_DECIMAL = re.compile(r"^\s*([+-]?\d+)\.0*\s*$")
_N_DIST, _N_TAIL = 11, 9
_PCT_DIST = CPU_PERCENTILE_COLUMNS[:_N_DIST]
_PCT_TAIL = CPU_PERCENTILE_COLUMNS[_N_DIST:]
#: Undecodable bytes, kept by the "surrogateescape" decoder so the record can be rejected.
_SURROGATE = re.compile("[\udc80-\udcff]")
_RELATION_NAMES = {r.name: int(r) for r in Relation}


class _RecordError(Exception):
    pass


def _int_text(s: str) -> str | None:
    """Integer text for conform (exact); empty -> None; ``123.0`` -> ``123``."""
    if s == "":
        return None
    m = _WHOLE_DECIMAL.match(s)
    return m.group(1) if m else s


def _float_text(s: str) -> str | None:
    return None if s.strip() == "" else s


def _resources(s: str, col: str) -> tuple[float | None, float | None]:
    if s.strip() == "":
        return None, None
    try:
        return _pylit.parse_resources(s)
    except _pylit.PyLitError as e:
        raise _RecordError(f"column {col}: {e}") from None


def _array(s: str, n: int, col: str) -> tuple[float | None, ...] | None:
    if s.strip() == "":
        return None
    try:
        return _pylit.parse_float_array(s, n)
    except _pylit.PyLitError as e:
        raise _RecordError(f"column {col}: {e}") from None


def _constraints(s: str) -> list[tuple[str | None, str | None, int | None]]:
    """``[]`` -> no rows; a list of ``{'name', 'value', 'relation'}`` dicts -> rows."""
    if s.strip() == "":
        return []
    try:
        v = _pylit.parse(s)
    except _pylit.PyLitError as e:
        raise _RecordError(f"column constraint: {e}") from None
    if not isinstance(v, (list, tuple)):
        raise _RecordError(f"column constraint: expected a list, got {type(v).__name__}")
    rows = []
    for c in v:
        if not isinstance(c, dict) or not set(c) <= {"name", "value", "relation"}:
            raise _RecordError(f"column constraint: element {c!r:.80} is not a {{name, value, relation}} dict")
        name, value, rel = c.get("name"), c.get("value"), c.get("relation")
        if isinstance(rel, str):
            if rel not in _RELATION_NAMES:
                raise _RecordError(f"column constraint: unknown relation {rel!r}")
            rel = _RELATION_NAMES[rel]
        elif rel is not None and (isinstance(rel, bool) or not isinstance(rel, int)):
            raise _RecordError(f"column constraint: relation {rel!r} is not an integer code")
        if name is not None and not isinstance(name, str):
            raise _RecordError(f"column constraint: name {name!r} is not a string")
        if value is not None and not isinstance(value, (str, int, float)):
            raise _RecordError(f"column constraint: value {value!r} is not a string")
        rows.append((name, None if value is None else str(value), rel))
    return rows


def _row_keys(tbl: pa.Table) -> list[bytes]:
    """A 16-byte digest of every row's exact canonical values (validity + value bits per column)."""
    n = tbl.num_rows
    parts = []
    for col in tbl.columns:
        arr = col.combine_chunks()
        valid = np.asarray(pc.is_valid(arr).to_numpy(zero_copy_only=False), dtype=np.uint8).reshape(n, 1)
        vals = np.ascontiguousarray(pc.fill_null(arr, 0).to_numpy(zero_copy_only=False))
        parts.append(valid)
        parts.append(vals.view(np.uint8).reshape(n, vals.dtype.itemsize))
    mat = np.ascontiguousarray(np.hstack(parts))
    return [hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in mat]


class _Batch:
    """Raw records of one chunk, converted to canonical tables in :meth:`finish`."""

    def __init__(self, src: SourceFile, idx: dict[str, int], ncols: int, seen: set[bytes]):
        self.src = src
        self.ncols = ncols
        self.fname = str(src.path)
        self.idx = idx
        self.seen = seen
        self.ev: dict[str, list[Any]] = {
            k: []
            for k in (
                "time",
                "type",
                "collection_id",
                "scheduling_class",
                "collection_type",
                "priority",
                "alloc_collection_id",
                "instance_index",
                "machine_id",
                "req_cpu",
                "req_mem",
            )
        }
        self.us_rec: list[int] = []
        self.us: dict[str, list[Any]] = {
            k: []
            for k in (
                "start_time",
                "end_time",
                "collection_id",
                "alloc_collection_id",
                "collection_type",
                "avg_cpu",
                "avg_mem",
                "max_cpu",
                "max_mem",
                "sample_cpu",
                "assigned_mem",
                "page_cache_mem",
                "cpi",
                "mai",
                "sample_rate",
                *CPU_PERCENTILE_COLUMNS,
            )
        }
        self.con_rec: list[int] = []
        self.con: dict[str, list[Any]] = {
            k: [] for k in ("time", "collection_id", "instance_index", "name", "value", "relation")
        }
        self.lines: list[int] = []
        self.raws: list[str] = []
        # (line, row, reason, raw) of records rejected before column building
        self.rejects: list[tuple[int, int, str, str]] = []
        self.rows: list[int] = []
        self.rows_read = 0

    # -- per record -----------------------------------------------------------------------
    def add(self, line: int, row: int, fields: list[str], raw: str) -> None:
        """One record starting at 1-based ``line``; ``row`` is its 0-based index among data records."""
        self.rows_read += 1
        ncols = self.ncols
        if not fields:
            self.rejects.append((line, row, "empty line", raw))
            return
        if len(fields) != ncols:
            self.rejects.append((line, row, f"expected {ncols} fields, found {len(fields)}", raw))
            return
        if _SURROGATE.search(raw):
            self.rejects.append(
                (
                    line,
                    row,
                    "record is not valid UTF-8",
                    raw.encode("utf-8", "surrogateescape").decode("utf-8", "replace"),
                )
            )
            return
        g = self._get(fields)
        try:
            rec = self._convert(g)
        except _RecordError as e:
            self.rejects.append((line, row, str(e), raw))
            return
        ev, us, cons = rec
        r = len(self.lines)
        self.lines.append(line)
        self.rows.append(row)
        self.raws.append(raw)
        for k, v in ev.items():
            self.ev[k].append(v)
        if us is not None:
            self.us_rec.append(r)
            for k, v in us.items():
                self.us[k].append(v)
        for name, value, rel in cons:
            self.con_rec.append(r)
            self.con["time"].append(ev["time"])
            self.con["collection_id"].append(ev["collection_id"])
            self.con["instance_index"].append(ev["instance_index"])
            self.con["name"].append(name)
            self.con["value"].append(value)
            self.con["relation"].append(rel)

    def _get(self, fields: list[str]) -> dict[str, str]:
        return {k: fields[i] for k, i in self.idx.items()}

    def _convert(self, g: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any] | None, list]:
        ints = {k: _int_text(g[k]) for k in _INT_COLUMNS if k in g}
        req_cpu, req_mem = _resources(g["resource_request"], "resource_request")
        cons = _constraints(g["constraint"])
        cid = ints["collection_id"]
        c1 = ints.get("collection_id_1")
        if c1 is not None and cid is not None and c1 != cid:
            raise _RecordError(f"column collection_id_1: {c1} differs from collection_id {cid}")
        ev = {
            "time": ints["time"],
            "type": ints["instance_events_type"],
            "collection_id": cid,
            "scheduling_class": ints["scheduling_class"],
            "collection_type": ints["collection_type"],
            "priority": ints["priority"],
            "alloc_collection_id": ints["alloc_collection_id"],
            "instance_index": ints["instance_index"],
            "machine_id": ints["machine_id"],
            "req_cpu": req_cpu,
            "req_mem": req_mem,
        }
        if all(g.get(k, "").strip() == "" for k in _USAGE_PRESENCE):
            return ev, None, cons
        c2 = ints.get("collection_id_2")
        if c2 is not None and cid is not None and c2 != cid:
            raise _RecordError(f"column collection_id_2: {c2} differs from collection_id {cid}")
        avg = _resources(g["average_usage"], "average_usage")
        mx = _resources(g["maximum_usage"], "maximum_usage")
        smp = _resources(g["random_sample_usage"], "random_sample_usage")
        dist = _array(g["cpu_usage_distribution"], _N_DIST, "cpu_usage_distribution")
        tail = _array(g["tail_cpu_usage_distribution"], _N_TAIL, "tail_cpu_usage_distribution")
        us: dict[str, Any] = {
            "start_time": ints["start_time"],
            "end_time": ints["end_time"],
            "collection_id": c2 if c2 is not None else cid,
            "alloc_collection_id": ints["alloc_collection_id"],
            "collection_type": ints["collection_type"],
            "avg_cpu": avg[0],
            "avg_mem": avg[1],
            "max_cpu": mx[0],
            "max_mem": mx[1],
            "sample_cpu": smp[0],
            "assigned_mem": _float_text(g["assigned_memory"]),
            "page_cache_mem": _float_text(g["page_cache_memory"]),
            "cpi": _float_text(g["cycles_per_instruction"]),
            "mai": _float_text(g["memory_accesses_per_instruction"]),
            "sample_rate": _float_text(g["sample_rate"]),
        }
        for cols, vals in ((_PCT_DIST, dist), (_PCT_TAIL, tail)):
            for k, c in enumerate(cols):
                us[c] = None if vals is None else vals[k]
        return ev, us, cons

    # -- per chunk ------------------------------------------------------------------------
    def finish(self, bytes_done: int) -> Chunk:
        n = len(self.lines)
        rec_bad = np.zeros(n, dtype=bool)
        rec_why: list[str | None] = [None] * n

        def arrays(d: dict[str, list[Any]], floats: tuple[str, ...]) -> dict[str, pa.Array]:
            out = {}
            for k, v in d.items():
                if k in floats:
                    out[k] = pa.array(v, pa.float64())
                else:
                    out[k] = pa.array(v, pa.string())
            return out

        ev_cols = arrays(self.ev, ("req_cpu", "req_mem"))
        ev_cols["alloc_instance_index"] = pa.nulls(n, pa.int32())
        ev_tbl, ev_bad, ev_why = conform_rows("instance_events", ev_cols, n, np.zeros(n, dtype=bool), [None] * n)
        for i in np.flatnonzero(ev_bad):
            rec_bad[i], rec_why[i] = True, ev_why[i]

        us_rec = np.asarray(self.us_rec, dtype=np.int64)
        nu = len(us_rec)
        float_us = ("avg_cpu", "avg_mem", "max_cpu", "max_mem", "sample_cpu", *CPU_PERCENTILE_COLUMNS)
        us_cols = arrays(self.us, float_us)
        us_cols["instance_index"] = pa.array(np.full(nu, UNKNOWN_INSTANCE_INDEX, dtype=np.int32))
        us_cols["machine_id"] = pa.array(np.full(nu, UNKNOWN_MACHINE_ID, dtype=np.int64))
        us_tbl, us_bad, us_why = conform_rows("instance_usage", us_cols, nu, np.zeros(nu, dtype=bool), [None] * nu)
        for j in np.flatnonzero(us_bad):
            i = us_rec[j]
            if not rec_bad[i]:
                rec_bad[i], rec_why[i] = True, f"usage: {us_why[j]}"

        con_rec = np.asarray(self.con_rec, dtype=np.int64)
        nc = len(con_rec)
        con_cols = {k: pa.array(v, pa.string()) for k, v in self.con.items() if k != "relation"}
        con_cols["relation"] = pa.array(self.con["relation"], pa.int64())
        con_tbl, con_bad, con_why = conform_rows(
            "instance_constraints", con_cols, nc, np.zeros(nc, dtype=bool), [None] * nc
        )
        for j in np.flatnonzero(con_bad):
            i = con_rec[j]
            if not rec_bad[i]:
                rec_bad[i], rec_why[i] = True, f"constraint: {con_why[j]}"

        # Keep only rows of records that are good in every table.
        ev_tbl = ev_tbl.filter(pa.array(~rec_bad[~ev_bad])) if rec_bad.any() else ev_tbl
        us_good = ~rec_bad[us_rec] if nu else np.zeros(0, dtype=bool)
        con_good = ~rec_bad[con_rec] if nc else np.zeros(0, dtype=bool)
        us_tbl = us_tbl.filter(pa.array(us_good[~us_bad]))
        con_tbl = con_tbl.filter(pa.array(con_good[~con_bad]))

        # Exact duplicate usage rows within the file: keep the first.
        dedup = 0
        if us_tbl.num_rows:
            keep = np.ones(us_tbl.num_rows, dtype=bool)
            for r, key in enumerate(_row_keys(us_tbl)):
                if key in self.seen:
                    keep[r] = False
                else:
                    self.seen.add(key)
            dedup = int((~keep).sum())
            if dedup:
                us_tbl = us_tbl.filter(pa.array(keep))

        rejects = list(self.rejects)
        for i in np.flatnonzero(rec_bad):
            rejects.append((self.lines[i], self.rows[i], rec_why[i] or "rejected", self.raws[i]))
        rejects.sort(key=lambda t: t[0])
        return Chunk(
            tables={"instance_events": ev_tbl, "instance_usage": us_tbl, "instance_constraints": con_tbl},
            rejects=[Reject(file=self.fname, line=ln, row=rw, reason=w, raw=clip_raw(r)) for ln, rw, w, r in rejects],
            rows_read=self.rows_read,
            bytes_done=bytes_done,
            rows_deduplicated=dedup,
        )
