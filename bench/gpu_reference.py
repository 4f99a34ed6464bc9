"""The device check's reference step: the check's data on the cpu backend and in DuckDB, on the
same node, for issue 34's per-analysis ratios (each analysis on resident data >= 20x the cpu
backend warm, and >= 10x DuckDB on resident tables for the parts SQL expresses).

    python bench/gpu_check.py reference DS --json OUT.json [--backend gpu] [--ref REF.pkl]

1. **DuckDB** (``SET threads`` = usable cores): the tables that the SQL peers of
   ``bench/cpu_vs_duckdb.py`` read are loaded as in-memory tables (timed), then each case whose
   SQL reads its tables whole (``read_parquet('DS/<table>/**/*.parquet', ...)``, replaced by the
   table's name; a case that reads files by row number or writes tables is left out, and says so)
   runs twice on them: the second run is ``duckdb_s``.
2. **gpuclust on ``--backend``**, resident: each case's analysis with the case's options, a first
   run (kernels compiled) then the best of two: ``gpu_s`` beside ``duckdb_s``.
3. **the cpu backend**, resident, every core: each of the 13 analyses at its defaults, run twice,
   slowest last (usage-distribution), each recorded as it ends: ``cpu_s`` is the second run (warm:
   its contexts cached, as the device study's warm runs' are; a first pass that is a context, as
   usage-distribution's brackets are, too), ``first_s`` the first; the first runs' results are
   compared with the study step's (``--ref``) where that ran.

The record is written after every measurement, so a step cut at its limit says how far it got.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gpu_check import _dump, compare_runs  # noqa: E402  (the check's record, written whole or not at all)

#: An SQL peer's read of a whole table (what becomes the resident table's name).
_WHOLE_TABLE = re.compile(r"read_parquet\('[^']*/(\w+)/\*\*/\*\.parquet', hive_partitioning=false\)")
#: case -> (SQL on resident tables, analysis, its options, the tables the SQL reads)
Cases = dict[str, tuple[str, str, dict[str, str], set[str]]]
#: The cpu backend's analyses in the order they run: the slow one last (a cut step keeps the rest).
_LAST = ("usage-distribution",)


def resident_sql(sql: str) -> tuple[str, set[str]] | None:
    """``sql`` over resident tables (each whole-table ``read_parquet`` replaced by the table's name)
    and the tables it reads; None where some other read of files remains (by row number)."""
    tables = set(_WHOLE_TABLE.findall(sql))
    out = _WHOLE_TABLE.sub(lambda m: m.group(1), sql)
    return None if "read_parquet" in out else (out, tables)


def sql_cases(ds: Path) -> tuple[Cases, dict[str, str]]:
    """The cases of ``bench/cpu_vs_duckdb.py`` that run on resident tables (:data:`Cases`), and
    the others with why they are left out."""
    from cpu_vs_duckdb import CASES

    cases, left = {}, {}
    for case, (_, build, (name, options)) in CASES.items():
        if "out" in inspect.signature(build).parameters:
            left[case] = "writes its tables as Parquet (not a query on resident tables)"
        elif (r := resident_sql(build(ds))) is None:
            left[case] = "reads files by row number (its order is the files')"
        else:
            cases[case] = (r[0], name, options, r[1])
    return cases, left


def duckdb_part(ds: Path, cases: Cases, rec: dict[str, Any], out: Path) -> None:
    """Load the cases' tables into DuckDB's memory, then time each case's query twice."""
    import os

    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads={len(os.sched_getaffinity(0))}")
    con.execute("SET enable_progress_bar=false")
    tables = sorted({t for _, _, _, read in cases.values() for t in read})
    t = time.perf_counter()
    for table in tables:
        con.execute(
            f"CREATE TABLE {table} AS SELECT * FROM read_parquet('{ds}/{table}/**/*.parquet', hive_partitioning=false)"
        )
    rec["duckdb_load_s"] = time.perf_counter() - t
    rec["duckdb_tables"] = tables
    _dump(out, rec)
    for case, (sql, _, _, _) in cases.items():
        runs = []
        for _ in range(2):
            t = time.perf_counter()
            rows = len(con.execute(sql).fetchall())
            runs.append(time.perf_counter() - t)
        rec["cases"].setdefault(case, {}).update(duckdb_s=runs[-1], duckdb_first_s=runs[0], duckdb_rows=rows)
        _dump(out, rec)
    con.close()


def gpuclust_part(ds: Path, backend: str, cases: Cases, rec: dict[str, Any], out: Path) -> None:
    """Each case's analysis with its options on ``backend``, resident: the best of two warm runs."""
    import gpuclust
    from gpuclust.analyses.registry import create

    study = gpuclust.open(ds, backend=backend)
    t = time.perf_counter()
    study.persist()
    rec["gpuclust_load_s"] = time.perf_counter() - t
    for case, (_, name, options, _) in cases.items():
        a = create(name, **options)
        study.run([a])  # (kernels compiled, contexts made)
        best = float("inf")
        for _ in range(2):
            t = time.perf_counter()
            study.run([a])
            best = min(best, time.perf_counter() - t)
        rec["cases"].setdefault(case, {})[f"{backend}_s"] = best
        _dump(out, rec)
    study.release()
    study.close()


def cpu_part(ds: Path, ref: Path | None, rec: dict[str, Any], out: Path) -> None:
    """The 13 analyses at their defaults on the cpu backend, resident, every core, one at a time."""
    import gpuclust
    from gpuclust.analyses.registry import names

    order = [n for n in names() if n not in _LAST] + [n for n in _LAST if n in names()]
    study = gpuclust.open(ds, backend="cpu")
    t = time.perf_counter()
    study.persist()
    rec["cpu_load_s"] = time.perf_counter() - t
    rec["cpu_threads"] = study.workers
    _dump(out, rec)
    got: dict[str, Any] = {}
    for n in order:
        t = time.perf_counter()
        got.update(study.run(n))
        first = time.perf_counter() - t
        t = time.perf_counter()
        study.run(n)
        rec["analyses"][n] = {
            "cpu_s": time.perf_counter() - t,
            "first_s": first,
            "phases": dict(study.last_run_seconds),
        }
        _dump(out, rec)
    if ref is not None and ref.exists():
        rec["equal_to_study"] = compare_runs(ref, got)
        _dump(out, rec)
    study.close()


def reference_step(ds: Path, out: Path, backend: str, ref: Path | None) -> None:
    rec: dict[str, Any] = {"backend": backend, "cases": {}, "analyses": {}}
    cases, left = sql_cases(ds)
    rec["left_out"] = left
    _dump(out, rec)
    duckdb_part(ds, cases, rec, out)
    gpuclust_part(ds, backend, cases, rec, out)
    cpu_part(ds, ref, rec, out)
    print(json.dumps(rec, default=str)[:3000], flush=True)


def analyses_record(study: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    """The record's ``analyses``: per analysis the study step's warm device seconds (``gpu_s``),
    the reference step's warm cpu seconds (``cpu_s``) and the DuckDB seconds of its first
    SQL case (``duckdb_s``, with ``duckdb_case``: that case, the device's seconds on it and their
    ratio); None where a step did not measure it."""
    from cpu_vs_duckdb import CASES

    out: dict[str, Any] = {}
    for n in sorted({*study, *ref.get("analyses", {})}):
        cpu = ref.get("analyses", {}).get(n, {})
        out[n] = {"gpu_s": study.get(n, {}).get("s"), "cpu_s": cpu.get("cpu_s"), "duckdb_s": None}
    backend = ref.get("backend", "gpu")
    for case, got in ref.get("cases", {}).items():
        n = CASES[case][2][0]
        if n in out and out[n]["duckdb_s"] is None and got.get("duckdb_s") is not None:
            mine = got.get(f"{backend}_s")
            out[n]["duckdb_s"] = got["duckdb_s"]
            out[n]["duckdb_case"] = {
                "case": case,
                f"{backend}_s": mine,
                "ratio": got["duckdb_s"] / mine if mine else None,
            }
    return out
