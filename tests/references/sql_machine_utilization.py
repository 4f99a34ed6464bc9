"""machine-utilization's DuckDB SQL references (docs/analyses/machine-utilization.md):
``machine_utilization_sql``, the notebook's query whole, and ``machine_utilization_full_sql``, which
writes every table in either mode."""

from __future__ import annotations

from pathlib import Path


def machine_utilization_sql(ds: Path | str) -> str:
    """machine-utilization (mode notebook) whole: Google's notebook query, with the exact
    quantile_cont in place of APPROX_QUANTILES(x, 100)."""
    qs = ", ".join(str(k / 100) for k in range(101))
    sql = f"""
    WITH cap AS (SELECT machine_id, MAX(cap_cpu) AS c, MAX(cap_mem) AS m
                 FROM read_parquet('{ds}/machine_events/**/*.parquet', hive_partitioning=false) GROUP BY 1),
         u AS (SELECT CAST(FLOOR(start_time / 3e8) AS BIGINT) AS bucket, machine_id, avg_cpu, avg_mem
               FROM read_parquet('{ds}/instance_usage/**/*.parquet', hive_partitioning=false)
               WHERE (alloc_collection_id IS NULL OR alloc_collection_id = 0) AND end_time - start_time >= 300000000),
         mb AS (SELECT machine_id, bucket, SUM(avg_cpu) AS cu, SUM(avg_mem) AS mu, MAX(c) AS c, MAX(m) AS m
                FROM u JOIN cap USING (machine_id) GROUP BY 1, 2)
    SELECT COUNT(*), QUANTILE_CONT(CASE WHEN c > 0 THEN IF(cu > c, 1.0, cu / c) END, [{qs}]),
           QUANTILE_CONT(CASE WHEN m > 0 THEN IF(mu > m, 1.0, mu / m) END, [{qs}])
    FROM mb"""
    return sql


def machine_utilization_full_sql(ds: Path | str, out: Path | str, mode: str = "notebook") -> str:
    """Every table gpuclust's machine-utilization writes (``machine``, ``quantiles``, ``summary``,
    ``series``, ``info``), as DuckDB statements that write them to ``out`` as Parquet (``machine``,
    parted in gpuclust's folder, as one file here), from docs/analyses/machine-utilization.md (not
    from gpuclust's code), in either ``mode``.

    Top-level usage rows (``alloc_collection_id`` NULL or 0) on machines present in
    ``machine_events``; 5-minute buckets ``[k · 300 s, (k + 1) · 300 s)``.  ``notebook``: windows
    lasting at least 300 s, each in the bucket of its start, usage ``SUM(avg)``, capacity
    ``MAX(cap_cpu)`` / ``MAX(cap_mem)`` over all the machine's rows (NULLs ignored), ``util`` capped
    at 1, a row per machine-bucket with a window; ``time-weighted``: a row per machine-bucket in
    which the machine is up (ADD to REMOVE, capacity of the latest ADD / UPDATE, event times
    clipped to the usage's window: its earliest start to its latest known time), windows with a
    known end after their start in every bucket they overlap with ``avg × overlap``, ``util`` =
    usage-seconds / capacity-seconds (an up piece with a NULL capacity: unknown), not capped.
    NaN usage is NULL (skipped by the sums); a NULL
    sum, a NULL or non-positive capacity: ``util`` NULL (unknown).  ``over_capacity``: usage above
    a known capacity, before the cap; ``share_over_capacity`` of the known; quantiles 0, 0.01, ..,
    1 by ``quantile_cont`` (NumPy's linear interpolation) over the known; ``series``: buckets with a
    known CPU or memory ratio.  ``info``: a row is counted in the first of alloc, short (notebook:
    under 300 s) or unbounded (time-weighted: end at 2^63-1 or not after the start), unplaced
    (start at 2^63-1: as no such window lasts 300 s or ends after its start, always 0 here; NULL
    and negative starts, which gpuclust also counts as unplaced, are not handled), unknown
    machine, used.  tests/bench/test_cpu_vs_duckdb.py checks it against gpuclust's tables."""
    if mode not in ("notebook", "time-weighted"):
        raise ValueError(f"mode: {mode!r}")
    usage = f"read_parquet('{ds}/instance_usage/**/*.parquet', hive_partitioning=false)"
    mevents = f"read_parquet('{ds}/machine_events/**/*.parquet', hive_partitioning=false)"
    after = "9223372036854775807"
    b_us = 300_000_000
    qs = "[" + ", ".join(repr(k / 100) for k in range(101)) + "]::DOUBLE[]"
    notebook = mode == "notebook"
    # each row's fate: -1 alloc, -2 short (notebook) / unbounded (time-weighted), -3 unplaced, else
    # its (first) bucket
    dropped = f"end_time - start_time < {b_us}" if notebook else f"end_time = {after} OR end_time <= start_time"
    kind = (
        f"CASE WHEN NOT (alloc_collection_id IS NULL OR alloc_collection_id = 0) THEN -1 WHEN {dropped} THEN -2 "
        f"WHEN start_time = {after} THEN -3 ELSE start_time // {b_us} END"
    )

    def val(x: str) -> str:  # NaN is NULL (not isnan(): DuckDB 2.0 folds it to false from Parquet min/max)
        return f"CASE WHEN isfinite({x}) OR isinf({x}) THEN CAST({x} AS DOUBLE) END"

    def util(u: str, c: str) -> str:
        ratio = f"CASE WHEN {u} > {c} THEN 1.0 ELSE {u} / {c} END" if notebook else f"{u} / {c}"
        return f"CASE WHEN {c} > 0 AND {u} IS NOT NULL THEN {ratio} END"

    # g: per machine and bucket (or fate), the windows counted there, ``rows`` (the windows whose
    # first bucket or fate it is: what info counts) and the usage sums; one scan of the usage
    if notebook:
        grouped = f"""
      SELECT machine_id, {kind} AS bucket, COUNT(*) AS windows, COUNT(*) AS rows, SUM({val("avg_cpu")}) AS cu,
             SUM({val("avg_mem")}) AS mu
      FROM {usage} GROUP BY ALL"""
    else:

        def part(x: str, overlap: str) -> str:  # x times the window's overlap with the bucket over 300 s
            return f"{val(x)} * CAST({overlap} AS DOUBLE) / {b_us}"

        # a window within one bucket (all of them on the 5-minute grid) overlaps it by its length;
        # only the others are unnested into their buckets (unnesting every window: 1.1x the wall
        # and CPU time of the whole process at 1e6 windows)
        cut = f"LEAST(e, (b + 1) * {b_us}) - GREATEST(s, b * {b_us})"
        grouped = f"""
      WITH k AS (SELECT machine_id, start_time AS s, end_time AS e, {kind} AS k, (end_time - 1) // {b_us} AS kl,
                        avg_cpu, avg_mem FROM {usage})
      SELECT machine_id, bucket, COUNT(*) AS windows, COUNT(*) FILTER (WHERE first) AS rows, SUM(cu) AS cu,
             SUM(mu) AS mu
      FROM (SELECT machine_id, k AS bucket, true AS first, CASE WHEN k >= 0 THEN {part("avg_cpu", "e - s")} END AS cu,
                   CASE WHEN k >= 0 THEN {part("avg_mem", "e - s")} END AS mu FROM k WHERE k < 0 OR kl = k
            UNION ALL
            SELECT machine_id, b, b = k, {part("avg_cpu", cut)}, {part("avg_mem", cut)}
            FROM (SELECT *, UNNEST(range(k, kl + 1)) AS b FROM k WHERE k >= 0 AND kl > k))
      GROUP BY ALL"""
    both = "(SELECT 'cpu' AS resource, qc AS q FROM q UNION ALL SELECT 'mem', qm FROM q)"
    if notebook:
        machine_buckets = f"""
    CREATE TEMP TABLE mb AS
      SELECT machine_id, bucket, windows, rows, cu, mu, c, m, {util("cu", "c")} AS cpu_util, {util("mu", "m")} AS mem_util,
             cu > c AND c > 0 AS cpu_over, mu > m AND m > 0 AS mem_over
      FROM g JOIN cap USING (machine_id) WHERE bucket >= 0;
    COPY (SELECT machine_id, bucket, bucket * {b_us} AS bucket_start_us, windows, cu AS cpu_usage, mu AS mem_usage,
                 c AS cap_cpu, m AS cap_mem, cpu_util, mem_util FROM mb ORDER BY machine_id, bucket)
      TO '{out}/machine.parquet' (FORMAT parquet);"""
        extra_info = ""
    else:
        me_rows = f"read_parquet('{ds}/machine_events/**/*.parquet', hive_partitioning=false, file_row_number=true)"
        order = "(PARTITION BY machine_id ORDER BY t, file_index, file_row_number)"
        # up pieces: each event row (type ADD 1 / REMOVE 2 / UPDATE 3) opens [t, next t) when the
        # latest ADD / REMOVE at or before it is an ADD; the capacity of the latest ADD / UPDATE
        # (a struct, so that a NULL capacity is kept, not skipped); per bucket the up µs and the
        # capacity µs (NULL when an up piece there has none); usage µs = cu x 300 s
        machine_buckets = f"""
    CREATE TEMP TABLE w AS
      SELECT MIN(start_time) FILTER (WHERE start_time >= 0 AND start_time < {after}) AS w0,
             GREATEST(MAX(start_time) FILTER (WHERE start_time < {after}),
                      MAX(end_time) FILTER (WHERE end_time < {after})) AS last FROM {usage};
    CREATE TEMP TABLE pieces AS
      SELECT machine_id, t, LEAD(t, 1, w1) OVER {order} AS e,
             LAST_VALUE(CASE WHEN type IN (1, 2) THEN type END IGNORE NULLS) OVER {order} = 1 AS up,
             LAST_VALUE(CASE WHEN type IN (1, 3) THEN {{'c': {val("cap_cpu")}, 'm': {val("cap_mem")}}} END
                        IGNORE NULLS) OVER {order} AS cap
      FROM (SELECT machine_id, type, cap_cpu, cap_mem, file_index, file_row_number, w1,
                   LEAST(GREATEST(COALESCE(time, -9223372036854775808), w0), w1) AS t
            FROM {me_rows}, (SELECT w0, GREATEST(w0, last) AS w1 FROM w WHERE w0 IS NOT NULL)
            WHERE type IN (1, 2, 3) AND machine_id IS NOT NULL);
    CREATE TEMP TABLE upb AS
      SELECT machine_id, b AS bucket, SUM(ov) AS up_us,
             CASE WHEN COUNT(*) FILTER (WHERE cap.c IS NULL) = 0 THEN SUM(cap.c * ov) END AS c_us,
             CASE WHEN COUNT(*) FILTER (WHERE cap.m IS NULL) = 0 THEN SUM(cap.m * ov) END AS m_us
      FROM (SELECT machine_id, cap, b, CAST(LEAST(e, (b + 1) * {b_us}) - GREATEST(t, b * {b_us}) AS DOUBLE) AS ov
            FROM (SELECT *, UNNEST(range(t // {b_us}, (e - 1) // {b_us} + 1)) AS b FROM pieces WHERE up AND e > t))
      GROUP BY ALL HAVING SUM(ov) > 0;
    CREATE TEMP TABLE gk AS SELECT g.* FROM g JOIN cap USING (machine_id) WHERE bucket >= 0;
    CREATE TEMP TABLE mb AS
      SELECT machine_id, bucket, up_us, COALESCE(windows, 0) AS windows, rows,
             CASE WHEN windows IS NULL THEN 0.0 ELSE cu * {b_us} END AS cu_us,
             CASE WHEN windows IS NULL THEN 0.0 ELSE mu * {b_us} END AS mu_us, c_us, m_us
      FROM upb LEFT JOIN gk USING (machine_id, bucket);
    CREATE OR REPLACE TEMP TABLE mb AS
      SELECT *, {util("cu_us", "c_us")} AS cpu_util, {util("mu_us", "m_us")} AS mem_util,
             {util("cu_us", "c_us")} > 1 AS cpu_over, {util("mu_us", "m_us")} > 1 AS mem_over FROM mb;
    COPY (SELECT machine_id, bucket, bucket * {b_us} AS bucket_start_us, up_us / 1e6 AS up_s, windows,
                 cu_us / up_us AS cpu_usage, mu_us / up_us AS mem_usage, c_us / up_us AS cap_cpu,
                 m_us / up_us AS cap_mem, cpu_util, mem_util FROM mb ORDER BY machine_id, bucket)
      TO '{out}/machine.parquet' (FORMAT parquet);"""
        extra_info = f""",
                 (SELECT COALESCE(w0, 0) FROM w) AS window_start_us,
                 (SELECT COALESCE(GREATEST(w0, last), 0) FROM w) AS window_end_us,
                 (SELECT COUNT(*) FILTER (WHERE windows = 0) FROM mb) AS idle_machine_buckets,
                 (SELECT COUNT(*) FILTER (WHERE up_us < {b_us}) FROM mb) AS partial_machine_buckets,
                 (SELECT COUNT(*) FROM gk ANTI JOIN mb USING (machine_id, bucket)) AS usage_buckets_not_up"""
    return f"""
    CREATE TEMP TABLE cap AS SELECT machine_id, CAST(MAX(cap_cpu) AS DOUBLE) AS c, CAST(MAX(cap_mem) AS DOUBLE) AS m
      FROM {mevents} GROUP BY machine_id;
    CREATE TEMP TABLE g AS {grouped};
    {machine_buckets}
    CREATE TEMP TABLE q AS SELECT quantile_cont(cpu_util, {qs}) AS qc, quantile_cont(mem_util, {qs}) AS qm FROM mb;
    COPY (SELECT r.resource, qq.quantile, r.q[qq.k] AS util
          FROM {both} r, (SELECT UNNEST(range(1, 102)) AS k, UNNEST({qs}) AS quantile) qq
          ORDER BY r.resource, qq.k) TO '{out}/quantiles.parquet' (FORMAT parquet);
    COPY (SELECT r.resource, machine_buckets, known, machine_buckets - known AS unknown, mean_util, over_capacity,
                 over_capacity / known AS share_over_capacity, q[51] AS p50, q[91] AS p90, q[100] AS p99, q[101] AS max
          FROM (SELECT 'cpu' AS resource, COUNT(*) AS machine_buckets, COUNT(cpu_util) AS known, AVG(cpu_util) AS mean_util,
                       COUNT(*) FILTER (WHERE cpu_over) AS over_capacity FROM mb
                UNION ALL
                SELECT 'mem', COUNT(*), COUNT(mem_util), AVG(mem_util), COUNT(*) FILTER (WHERE mem_over) FROM mb) r
          JOIN {both} USING (resource) ORDER BY r.resource) TO '{out}/summary.parquet' (FORMAT parquet);
    COPY (SELECT bucket, bucket * {b_us} AS bucket_start_us, COUNT(cpu_util) AS cpu_machines,
                 AVG(cpu_util) AS cpu_mean_util, COUNT(mem_util) AS mem_machines, AVG(mem_util) AS mem_mean_util
          FROM mb GROUP BY bucket HAVING COUNT(cpu_util) + COUNT(mem_util) > 0 ORDER BY bucket)
      TO '{out}/series.parquet' (FORMAT parquet);
    COPY (WITH n AS (SELECT {
        ", ".join(
            f"CAST(COALESCE(SUM(rows) FILTER (WHERE {w}), 0) AS BIGINT) AS {c}"
            for c, w in (
                ("rows", "true"),
                ("alloc_rows", "bucket = -1"),
                ("dropped", "bucket = -2"),
                ("unplaced_rows", "bucket = -3"),
                ("placed", "bucket >= 0"),
            )
        )
    } FROM g),
               used AS (SELECT (SELECT COUNT(*) FROM mb) AS machine_rows, CAST(COALESCE(SUM(rows), 0) AS BIGINT) AS used_rows
                        FROM g JOIN cap USING (machine_id) WHERE bucket >= 0)
          SELECT 'machine-utilization' AS analysis, '{mode}' AS mode, (SELECT COUNT(*) FROM cap) AS machines,
                 (SELECT COUNT(*) FROM cap WHERE c > 0) AS machines_known_cpu_capacity, machine_rows, rows, alloc_rows,
                 {"dropped" if notebook else "0::BIGINT"} AS short_rows,
                 {"0::BIGINT" if notebook else "dropped"} AS unbounded_rows, unplaced_rows,
                 placed - used_rows AS unknown_machine_rows, used_rows{extra_info}
          FROM n, used) TO '{out}/info.parquet' (FORMAT parquet)"""
