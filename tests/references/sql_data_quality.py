"""data-quality's DuckDB SQL references (docs/analyses/data-quality.md): ``data_quality_sql``
(the usage table's SQL-expressible checks, in the order of ``DATA_QUALITY_SQL_CHECKS``) and
``data_quality_full_sql``, which writes every table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from references._sql import table_scan


def data_quality_sql(ds: Path | str) -> str:
    """data-quality's SQL-expressible subset over instance_usage, one row: the windows, NULLs (and
    NaNs) per column (in data-quality's column order), the time and machine sentinels
    (``start_zero``, ``end_after_trace``, ``machine_zero``, ``machine_dedicated``), ``short_windows``
    and ``long_windows`` against data-quality's default ``short_window_s``, ``p100_below_max`` / ``p100_above_max``,
    ``percentiles_non_monotone`` (the plain comparison chain: the benchmark data has no NULL
    levels), ``cpi_mai_present``; then, against each instance's last event (``arg_max(type,
    time)``: the benchmark's event times are distinct per instance), ``no_events_rows`` and
    ``after_end_rows``.  The events table's own checks (ties, out-of-order sequences) and the
    ratio histogram are left out: gpuclust does more than this."""
    import pyarrow as pa

    from gpuclust.analyses.registry import create
    from gpuclust.schema import CPU_PERCENTILE_COLUMNS_SORTED, SCHEMAS, TERMINAL_EVENTS, TIME_AFTER_TRACE

    dq = create("data-quality")
    cols, short_us = dq.columns, int(dq.short_window_s) * 1_000_000
    schema = SCHEMAS["instance_usage"]
    nulls = ", ".join(
        f"COUNT(*) FILTER (WHERE {c} IS NULL{f' OR isnan({c})' if pa.types.is_floating(schema.field(c).type) else ''})"
        for c in cols
    )
    levels = CPU_PERCENTILE_COLUMNS_SORTED
    chain = " AND ".join(f"{a} <= {b}" for a, b in zip(levels, levels[1:], strict=False))
    terminal = ", ".join(str(int(t)) for t in TERMINAL_EVENTS)
    u = f"read_parquet('{ds}/instance_usage/**/*.parquet', hive_partitioning=false)"
    e = f"read_parquet('{ds}/instance_events/**/*.parquet', hive_partitioning=false)"
    sql = f"""
    WITH counts AS (
        SELECT COUNT(*), {nulls},
               COUNT(*) FILTER (WHERE start_time = 0), COUNT(*) FILTER (WHERE end_time = {TIME_AFTER_TRACE}),
               COUNT(*) FILTER (WHERE machine_id = 0), COUNT(*) FILTER (WHERE machine_id = -1),
               COUNT(*) FILTER (WHERE end_time - start_time >= 0 AND end_time - start_time < {short_us}),
               COUNT(*) FILTER (WHERE end_time - start_time > {short_us}),
               COUNT(*) FILTER (WHERE cpu_p100 < max_cpu), COUNT(*) FILTER (WHERE cpu_p100 > max_cpu),
               COUNT(*) FILTER (WHERE NOT ({chain})),
               COUNT(*) FILTER (WHERE isfinite(cpi) AND isfinite(mai))
        FROM {u}),
         last AS (SELECT collection_id, instance_index, arg_max(type, time) AS type, max(time) AS time
                  FROM {e} GROUP BY ALL),
         joined AS (
        SELECT COUNT(*) FILTER (WHERE last.time IS NULL),
               COUNT(*) FILTER (WHERE last.type IN ({terminal}) AND x.start_time >= last.time)
        FROM (SELECT collection_id, instance_index, start_time FROM {u}) x
             LEFT JOIN last USING (collection_id, instance_index))
    SELECT * FROM counts, joined"""
    return sql


#: The checks of data-quality's ``checks`` table (instance_usage) that :func:`data_quality_sql`
#: returns after the windows and the NULLs per column, in its order.
DATA_QUALITY_SQL_CHECKS = (
    "start_zero",
    "end_after_trace",
    "machine_zero",
    "machine_dedicated",
    "short_windows",
    "long_windows",
    "p100_below_max",
    "p100_above_max",
    "percentiles_non_monotone",
    "cpi_mai_present",
    "no_events_rows",
    "after_end_rows",
)


def data_quality_full_sql(ds: Path | str, out: Path | str, short_window_s: int = 300, row_order: bool = False) -> str:
    """Every table gpuclust's data-quality writes (``checks``, ``columns``, ``codes``,
    ``max_over_p100``, ``info``), as DuckDB statements that write them to ``out`` as Parquet, from
    docs/analyses/data-quality.md (not from gpuclust's code).

    instance_usage's counts in one scan, each window LEFT JOINed to its instance's final terminal
    event (the instance's last event in time order, ties: the later row in the dataset's row order,
    when it is EVICT .. LOST at a finite time): the sentinels, window lengths against ``short_window_s``, NULL, partly
    NULL and non-monotone percentile vectors (NaN is NULL; NULL levels skipped: a level below the
    largest known lower one), p100 against max, the first rule of ``cpi``'s default plausibility
    filter a window with CPI and MAI fails (CPU time, CPI in (0, 100], MAI in [0, 1]), windows of
    instances without events, at or after the final terminal event (and 300 s after), running past
    it, NULLs (and NaNs) per column; its instances (with the per-instance counts) and ``max_cpu /
    cpu_p100`` (windows with both and ``cpu_p100 > 0``) in 20 bins per decade from 10^-4 to 10^4
    (quantiles: the lower edge of the bin holding the inverted-CDF quantile) in two narrow scans.  Each events table (instance, collection, machine): per instance (collection,
    machine) in time order (ties: row order) the ties and the events the v3 state diagram
    (machines: ADD / REMOVE / UPDATE) does not allow after the one before them (an event of a type
    outside 0..10, or after one, is not flagged), with ``row_order`` the events earlier than the
    previous row of their instance, the sentinels, NULL capacities, instances without usage; NULLs
    per column and rows per code (-1 NULL, -2 outside 0..10).  A table without rows gets no rows
    in ``checks``, ``columns`` and ``codes``.  tests/bench/test_cpu_vs_duckdb.py checks it against
    gpuclust's tables."""
    import pyarrow as pa

    from gpuclust.schema import (
        CPU_PERCENTILE_COLUMNS_SORTED,
        SCHEMAS,
        EventType,
        MachineEventType,
        MissingDataReason,
        MissingType,
    )

    after = "9223372036854775807"
    short_us = int(short_window_s) * 1_000_000
    # table -> (the one-row table of its counts, its key, the key's unit, its code columns and their enums)
    tables: dict[str, tuple[str, str, str, tuple[tuple[str, Any], ...]]] = {
        "instance_usage": ("us", "collection_id, instance_index", "instances", ()),
        "instance_events": (
            "ie",
            "collection_id, instance_index",
            "instances",
            (("type", EventType), ("missing_type", MissingType)),
        ),
        "collection_events": (
            "ce",
            "collection_id",
            "collections",
            (("type", EventType), ("missing_type", MissingType)),
        ),
        "machine_events": (
            "me",
            "machine_id",
            "machines",
            (("type", MachineEventType), ("missing_data_reason", MissingDataReason)),
        ),
    }

    def nan(x: str) -> str:  # isnan(x), but DuckDB 2.0 folds isnan() to false from Parquet min/max (they skip NaN)
        return f"(NOT isfinite({x}) AND NOT isinf({x}))"

    def n_if(cond: str) -> str:  # count_if, not COUNT(*) FILTER: a filter copies the aggregate's wide input
        return f"COALESCE(count_if({cond}), 0)"

    def nulls(table: str, where: dict[str, str] | None = None) -> str:
        """NULLs per column (a float's NaN is NULL too), as n_<column>; NaNs are looked for only
        where ``where`` (column -> condition) says they may be."""

        def nans(c: str) -> str:
            return " + " + n_if(f"{where[c]} AND {nan(c)}" if where and c in where else nan(c))

        return ", ".join(
            f"COUNT(*) - COUNT({f.name})" + (nans(f.name) if pa.types.is_floating(f.type) else "") + f" AS n_{f.name}"
            for f in SCHEMAS[table]
        )

    def code(c: str) -> str:
        return f"CASE WHEN {c} IS NULL THEN -1 WHEN {c} BETWEEN 0 AND 10 THEN {c} ELSE -2 END"

    # -- instance_usage: one scan of its 38 columns for the counts, each window joined to its ---
    # instance's final terminal event; the instances (3 columns) and the max / p100 bins (2) in
    # scans of their own: cheaper, at 1e6 windows, than grouping the 38-column pass by instance
    # or by bin, or a histogram() aggregate in it
    usage = table_scan(ds, "instance_usage")
    raw = list(CPU_PERCENTILE_COLUMNS_SORTED)  # the levels, ascending
    allf = " AND ".join(f"isfinite({c})" for c in raw)  # the usual window: every level known and finite
    missing = " + ".join(f"CAST(COALESCE({nan(c)}, true) AS INT)" for c in raw)
    known = [f"(CASE WHEN NOT {nan(c)} THEN {c} END)" for c in raw]  # NaN is NULL
    # some level below the last known lower one (a descent of the known values, NULLs skipped);
    # with every level finite, the plain comparison chain
    chain = " AND ".join(f"{a} <= {b}" for a, b in zip(raw, raw[1:], strict=False))
    skip = " OR ".join(f"{q} < coalesce({', '.join(reversed(known[:j]))})" for j, q in enumerate(known) if j > 0)
    finite = f"start_time <> {after} AND end_time <> {after}"
    length = "end_time - start_time"
    cpu_ok = f"(NOT {nan('cpu_s')} AND cpu_s > 0 AND cpu_s >= 0.01)"
    usage_checks = [  # (check, condition, denominator)
        ("start_zero", "start_time = 0", "rows"),
        ("start_after_trace", f"start_time = {after}", "rows"),
        ("end_zero", "end_time = 0", "rows"),
        ("end_after_trace", f"end_time = {after}", "rows"),
        ("machine_zero", "machine_id = 0", "rows"),
        ("machine_dedicated", "machine_id = -1", "rows"),
        ("end_before_start", f"{finite} AND end_time < start_time", "rows"),
        ("zero_length", f"{finite} AND end_time = start_time", "rows"),
        ("short_windows", f"{finite} AND {length} >= 0 AND {length} < {short_us}", "rows"),
        ("long_windows", f"{finite} AND {length} > {short_us}", "rows"),
        ("percentiles_null", f"nmiss = {len(raw)}", "rows"),
        ("percentiles_partly_null", f"nmiss > 0 AND nmiss < {len(raw)}", "rows"),
        ("percentiles_non_monotone", "nonmono", "rows"),
        ("p100_and_max", "pm", "rows"),
        ("p100_below_max", "pm AND cpu_p100 < max_cpu", "p100_and_max"),
        ("p100_above_max", "pm AND cpu_p100 > max_cpu", "p100_and_max"),
        ("cpi_mai_present", "cf IS NOT NULL", "rows"),
        ("cpi_mai_low_cpu_time", "cf = 1", "rows"),
        ("cpi_out_of_range", "cf = 2", "rows"),
        ("mai_out_of_range", "cf = 3", "rows"),
        ("no_events_rows", "no_ev", "rows"),
        ("no_events_instances", None, "instances"),
        ("after_end_rows", "start_time >= tt", "rows"),
        ("after_end_300s_rows", "start_time - tt >= 300000000", "rows"),
        ("after_end_instances", None, "instances"),
        ("past_end_rows", "start_time < tt AND end_time > tt", "rows"),
    ]
    usage_stmt = f"""
    CREATE TEMP TABLE us AS
      WITH x AS (SELECT u.*, ei.c IS NULL AS no_ev, ei.tt, COALESCE({allf}, false) AS allf,
                        CASE WHEN {finite} THEN CAST(avg_cpu AS DOUBLE) * CAST({length} AS DOUBLE) / 1e6 END AS cpu_s,
                        COALESCE(NOT {nan("cpu_p100")} AND NOT {nan("max_cpu")}, false) AS pm
                 FROM {usage} u LEFT JOIN ei ON u.collection_id = ei.c AND u.instance_index = ei.i),
           y AS (SELECT *, CASE WHEN allf THEN 0 ELSE {missing} END AS nmiss,
                        CASE WHEN allf THEN NOT ({chain}) ELSE {skip} END AS nonmono,
                        CASE WHEN COALESCE(isfinite(cpi) AND isfinite(mai), false) THEN
                             CASE WHEN NOT COALESCE({cpu_ok}, false) THEN 1 WHEN NOT (cpi > 0 AND cpi <= 100) THEN 2
                                  WHEN NOT (mai >= 0 AND mai <= 1) THEN 3 ELSE 0 END END AS cf
                 FROM x)
      SELECT COUNT(*) AS rows, {", ".join(f"{n_if(w)} AS {c}" for c, w, _ in usage_checks if w)},
             {nulls("instance_usage", dict.fromkeys(raw, "NOT allf"))}
      FROM y"""
    # bin b >= 1 holds [10^((b-81)/20), 10^((b-80)/20)), bin 0 what is below 10^-4, bin 161 from 10^4 on
    edge = "pow(10.0, ({} - 81) / 20.0)"
    guess = "CAST(LEAST(GREATEST(floor(20 * log10(ratio)) + 81, 0), 161) AS INT)"
    instances_stmt = f"""
    CREATE TEMP TABLE ui AS
      SELECT COUNT(*) AS instances, {n_if("no_ev")} AS no_events_instances, {n_if("ae")} AS after_end_instances,
             {n_if("ded")} AS matched_dedicated
      FROM (SELECT bool_or(ei.c IS NULL) AS no_ev, bool_or(start_time >= ei.tt) AS ae, bool_or(ei.ded) AS ded
            FROM (SELECT collection_id, instance_index, start_time FROM {usage}) u
            LEFT JOIN ei ON u.collection_id = ei.c AND u.instance_index = ei.i
            GROUP BY u.collection_id, u.instance_index);
    CREATE TEMP TABLE hist AS
      WITH x AS (SELECT CASE WHEN cpu_p100 > 0 AND NOT {nan("cpu_p100")} AND NOT {nan("max_cpu")}
                             THEN CAST(max_cpu AS DOUBLE) / CAST(cpu_p100 AS DOUBLE) END AS ratio
                 FROM (SELECT max_cpu, cpu_p100 FROM {usage})),
           y AS (SELECT ratio, CASE WHEN ratio > 0 THEN {guess} WHEN ratio IS NOT NULL THEN 0 END AS g FROM x)
      SELECT CAST(CASE WHEN g > 0 AND ratio < {edge.format("g")} THEN g - 1
                       WHEN g < 161 AND ratio >= {edge.format("g + 1")} THEN g + 1 ELSE g END AS BIGINT) AS bin,
             COUNT(*) AS windows
      FROM y WHERE g IS NOT NULL GROUP BY bin"""

    # -- the events tables: each key's events in time order (ties: row order) --------------------
    stmts = []
    ev_checks: dict[str, list[tuple[str, str]]] = {}  # table -> [(check, unit)], in gpuclust's order
    for table in ("instance_events", "collection_events", "machine_events"):
        n, key, unit, codes = tables[table]
        if table == "machine_events":
            bad = "(pe IN (1, 3) AND e = 1) OR (pe = 2 AND e IN (2, 3))"
        else:  # the v3 state diagram: pending -> ...; running -> ...; dead -> SUBMIT
            bad = (
                "pe BETWEEN 0 AND 10 AND e BETWEEN 0 AND 10 AND NOT CASE WHEN pe IN (0, 1, 2, 9) "
                "THEN e IN (1, 2, 3, 9, 5, 7, 8) WHEN pe IN (3, 10) THEN e IN (10, 4, 5, 6, 7, 8) ELSE e = 0 END"
            )
        per_row = [("time_zero", "t = 0"), ("time_after_trace", f"t = {after}")]
        if table != "collection_events":
            per_row += [("machine_zero", "machine_id = 0"), ("machine_dedicated", "machine_id = -1")]
        per_row += [("time_ties", "t = pt"), ("out_of_order", bad)]
        if table == "machine_events":
            per_row.append(("null_capacity_rows", "nc"))
        if row_order:
            per_row.append(("time_backwards", "t < rt"))
        stmts.append(f"""
    CREATE TEMP TABLE {n}_k AS
      WITH s AS (SELECT {key}, time AS t, type AS e, {"machine_id, " if table == "instance_events" else ""}
                        {f"COALESCE({nan('cap_cpu')} OR {nan('cap_mem')}, true) AS nc, " if table == "machine_events" else ""}
                        LAG(time) OVER w AS pt, LAG(type) OVER w AS pe, LEAD(r) OVER w IS NULL AS last
                        {f", LAG(time) OVER (PARTITION BY {key} ORDER BY r) AS rt" if row_order else ""}
                 FROM {table_scan(ds, table)} WINDOW w AS (PARTITION BY {key} ORDER BY time, r))
      SELECT {key}, COUNT(*) AS rows, {", ".join(f"{n_if(w)} AS {c}" for c, w in per_row)}
             {f", MAX(t) FILTER (WHERE last AND e BETWEEN 4 AND 8 AND t <> {after}) AS tt" if n == "ie" else ""}
      FROM s GROUP BY ALL""")
        per_key = [("out_of_order", f"out_of_order_{unit}", "out_of_order > 0")]
        if table == "machine_events":
            per_key += [
                ("null_capacity_rows", "null_capacity_machines", "null_capacity_rows > 0"),
                ("null_capacity_rows", "never_capacity_machines", "null_capacity_rows = rows"),
            ]
        if row_order:
            per_key.append(("time_backwards", f"time_backwards_{unit}", "time_backwards > 0"))
        stmts.append(f"""
    CREATE TEMP TABLE {n}_s AS
      SELECT COUNT(*) AS {unit}, {", ".join(f"COALESCE(SUM({c}), 0) AS {c}" for c, _ in per_row)},
             {", ".join(f"{n_if(w)} AS {c}" for _, c, w in per_key)}
      FROM {n}_k""")
        # each instance (collection, machine) count right after the row count it is about
        ev_checks[table] = [x for c, _ in per_row for x in [(c, "rows"), *((k, unit) for b, k, _ in per_key if b == c)]]
        stmts.append(f"""
    CREATE TEMP TABLE {n}_n AS
      SELECT COUNT(*) AS rows, {nulls(table)}, {", ".join(f"histogram({code(c)}) AS h_{c}" for c, _ in codes)}
      FROM {table_scan(ds, table)}""")
    # the instances' final terminal events, then the usage scan that joins them
    # (ded: an event on a dedicated machine, -1, where the trace has no usage)
    stmts.append(
        "CREATE TEMP TABLE ei AS SELECT collection_id AS c, instance_index AS i, tt, machine_dedicated > 0 AS ded FROM ie_k"
    )
    stmts.append("CREATE TEMP TABLE ed AS SELECT COUNT(*) FILTER (WHERE ded) AS dedicated FROM ei")
    stmts += [instances_stmt, usage_stmt]

    # -- checks ----------------------------------------------------------------------------------
    def u(c: str) -> str:  # a usage count: the instance counts come from ui
        return f"ui.{c}" if c.endswith("instances") else f"us.{c}"

    entries = [
        ("instance_usage", "rows", "us.rows", "rows", "us.rows", "us.rows > 0"),
        ("instance_usage", "instances", "ui.instances", "instances", "ui.instances", "us.rows > 0"),
    ]
    entries += [
        ("instance_usage", c, u(c), "instances" if of == "instances" else "rows", u(of), "us.rows > 0")
        for c, _, of in usage_checks
    ]
    for table in ("instance_events", "collection_events", "machine_events"):
        n, _, unit, _ = tables[table]
        keep = f"{n}_n.rows > 0"
        entries += [
            (table, "rows", f"{n}_n.rows", "rows", f"{n}_n.rows", keep),
            (table, unit, f"{n}_s.{unit}", unit, f"{n}_s.{unit}", keep),
        ]
        entries += [
            (table, c, f"{n}_s.{c}", cu, f"{n}_s.{unit}" if cu == unit else f"{n}_n.rows", keep)
            for c, cu in ev_checks[table]
        ]
        if table == "instance_events":  # instances with events less those the windows matched; with usage only
            entries.append(
                (
                    table,
                    "instances_without_usage",
                    "ie_s.instances - ed.dedicated - (ui.instances - ui.no_events_instances - ui.matched_dedicated)",
                    "instances",
                    "ie_s.instances - ed.dedicated",
                    "ie_n.rows > 0 AND us.rows > 0",
                )
            )
            entries.append(
                (
                    table,
                    "dedicated_instances_without_usage",
                    "ed.dedicated - ui.matched_dedicated",
                    "instances",
                    "ed.dedicated",
                    "ie_n.rows > 0 AND us.rows > 0",
                )
            )
    structs = ", ".join(
        f"{{'o': {k}, 't': '{t}', 'c': '{c}', 'n': CAST({cnt} AS BIGINT), 'u': '{cu}', "
        f"'of': CAST({of} AS BIGINT), 'keep': {keep}}}"
        for k, (t, c, cnt, cu, of, keep) in enumerate(entries)
    )
    one_row = "us, ui, ed, ie_s, ie_n, ce_s, ce_n, me_s, me_n"
    stmts.append(f"""
    COPY (SELECT e.t AS "table", e.c AS "check", e.n AS count, e.u AS unit, e.of AS of,
                 CASE WHEN e.of = 0 THEN 'NaN'::DOUBLE ELSE e.n / e.of END AS share
          FROM (SELECT UNNEST([{structs}]) AS e FROM {one_row}) WHERE e.keep ORDER BY e.o)
      TO '{out}/checks.parquet' (FORMAT parquet)""")

    # -- columns ---------------------------------------------------------------------------------
    cols = []
    for table, (n, _, _, _) in tables.items():
        src = "us" if table == "instance_usage" else f"{n}_n"
        cols += [(table, f.name, f"{src}.rows", f"{src}.n_{f.name}") for f in SCHEMAS[table]]
    structs = ", ".join(
        f"{{'o': {k}, 't': '{t}', 'c': '{c}', 'rows': CAST({r} AS BIGINT), 'nulls': CAST({x} AS BIGINT)}}"
        for k, (t, c, r, x) in enumerate(cols)
    )
    stmts.append(f"""
    COPY (SELECT e.t AS "table", e.c AS "column", e.rows AS rows, e.nulls AS nulls
          FROM (SELECT UNNEST([{structs}]) AS e FROM {one_row}) WHERE e.rows > 0 ORDER BY e.o)
      TO '{out}/columns.parquet' (FORMAT parquet)""")

    # -- codes -----------------------------------------------------------------------------------
    parts = []
    k = 0
    for table, (n, _, _, codes) in tables.items():
        for col, enum in codes:
            name = (
                "CASE code WHEN -1 THEN 'NULL' WHEN -2 THEN 'other' "
                + " ".join(f"WHEN {int(v)} THEN '{v.name}'" for v in enum)
                + " ELSE 'unknown' END"
            )
            parts.append(
                f"SELECT {k} AS o, '{table}' AS \"table\", '{col}' AS \"column\", code, {name} AS name, rows FROM "
                f"(SELECT CAST(UNNEST(map_keys(h_{col})) AS BIGINT) AS code, "
                f"CAST(UNNEST(map_values(h_{col})) AS BIGINT) AS rows FROM {n}_n)"
            )
            k += 1
    stmts.append(f"""
    COPY (SELECT "table", "column", code, name, rows FROM ({" UNION ALL ".join(parts)})
          ORDER BY o, code < 0, code) TO '{out}/codes.parquet' (FORMAT parquet)""")

    # -- max_over_p100 and info ------------------------------------------------------------------
    lo = f"CASE WHEN bin = 0 THEN 0.0 ELSE {edge.format('bin')} END"
    stmts.append(f"""
    COPY (SELECT bin, {lo} AS lo_ratio, CASE WHEN bin = 161 THEN 'inf'::DOUBLE ELSE {edge.format("bin + 1")} END AS hi_ratio,
                 windows FROM hist ORDER BY bin) TO '{out}/max_over_p100.parquet' (FORMAT parquet)""")
    quant = ", ".join(
        f"(SELECT {lo} FROM (SELECT MIN(bin) FILTER (WHERE cum >= CEIL({p} * n / 100)) AS bin FROM c)) "
        f"AS max_over_p100_p{p}"
        for p in (50, 90, 99)
    )
    stmts.append(f"""
    COPY (WITH c AS (SELECT bin, SUM(windows) OVER (ORDER BY bin) AS cum, SUM(windows) OVER () AS n FROM hist)
          SELECT 'data-quality' AS analysis, CAST({int(short_window_s)} AS BIGINT) AS short_window_s,
                 {
        ", ".join(
            f"(SELECT CAST(rows AS BIGINT) FROM {'us' if t == 'instance_usage' else n + '_n'}) AS {t}_rows"
            for t, (n, _, _, _) in tables.items()
        )
    }, {quant})
      TO '{out}/info.parquet' (FORMAT parquet)""")
    return ";\n".join(stmts)
