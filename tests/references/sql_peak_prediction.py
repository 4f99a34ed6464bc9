"""peak-prediction's DuckDB SQL reference (docs/analyses/peak-prediction.md): the columns of its
``machine`` table that SQL computes."""

from __future__ import annotations

from pathlib import Path

from references._sql import table_scan


def peak_prediction_sql(ds: Path | str, out: Path | str, oracle: bool = True) -> str:
    """The SQL-expressible part of gpuclust's peak-prediction with its default options, as DuckDB
    statements that write gpuclust's ``machine`` table (parted in gpuclust's folder, as one
    ``machine.parquet`` here) to ``out``, from docs/analyses/peak-prediction.md (not from gpuclust's
    code): ``machine_id``, ``bucket``, ``bucket_start_us``, ``instances``, ``limit``,
    ``total_usage``, ``borg_default`` and (``oracle``) ``oracle``.

    Samples: usage windows of top-level instances (``alloc_collection_id`` NULL or 0) on machines in
    ``machine_events``, starting at a trace time (not 2^63-1), with a ``cpu_p90`` (NULL and NaN
    are no sample), ASOF-joined to their instance's latest event at or before their start whose
    ``req_cpu`` and ``req_mem`` are both positive (ties at one microsecond: the later row in the
    files' order); that event's ``req_cpu`` is the limit, its priority in 0..400 and scheduling class
    in 2..3 (NULL: out).  Per (machine, instance, 5-minute step) the maximum usage and limit; per
    machine and step the instances, the sum of limits, the sum of usage capped at the limit, and
    ``borg_default`` = 0.9 x the sum of limits.  ``oracle``: for a step t whose 24 h horizon ends
    at or before the last step of any usage window start (else NULL: censored), the maximum over
    the machine's snapshots s in (t, t + 288] of the sum, over the instances present at t and s, of
    their usage at s capped at their limit at t (0 for a snapshot sharing none); the limit at t
    where the machine has no snapshot in the horizon.  A self-join of each sample with its
    instance's samples up to 288 steps later (samples x horizon steps: the cost gpuclust's
    difference array avoids).  The stateful predictors (``n_sigma``, ``instance_percentile``,
    ``machine_percentile``, ``max_of``, ``avg_of``: warm-up runs, the forget rule, ratio series over
    the last 24 / 120 snapshots and their percentiles) are left out.
    tests/bench/test_cpu_vs_duckdb.py checks it against gpuclust's ``machine`` table."""
    usage = f"read_parquet('{ds}/instance_usage/**/*.parquet', hive_partitioning=false)"
    mevents = f"read_parquet('{ds}/machine_events/**/*.parquet', hive_partitioning=false)"
    never, b_us, horizon = "9223372036854775807", 300_000_000, 86400 // 300

    def positive(x: str) -> str:  # > 0 and not NaN (DuckDB orders NaN above every number; isnan() is folded)
        return f"({x} > 0 AND (isfinite({x}) OR isinf({x})))"

    oracle_sql = f"""
    CREATE TEMP TABLE last AS SELECT MAX(start_time // {b_us}) AS lb FROM {usage} WHERE start_time <> {never};
    CREATE TEMP TABLE fut AS
      SELECT m, b, COUNT(*) OVER (PARTITION BY m ORDER BY b RANGE BETWEEN 1 FOLLOWING AND {horizon} FOLLOWING) AS nf
      FROM mb;
    CREATE TEMP TABLE pair AS
      SELECT m, t, COUNT(*) AS np, MAX(su) AS mx
      FROM (SELECT a.m, a.b AS t, f.b AS s, SUM(LEAST(f.u, a.l)) AS su
            FROM smp a JOIN smp f ON f.m = a.m AND f.c = a.c AND f.i = a.i AND f.b > a.b AND f.b <= a.b + {horizon}
            WHERE a.b + {horizon} <= (SELECT lb FROM last) GROUP BY ALL)
      GROUP BY ALL;
    CREATE TEMP TABLE orc AS
      SELECT fut.m, fut.b, CASE WHEN fut.b + {horizon} > (SELECT lb FROM last) THEN NULL WHEN nf = 0 THEN mb.lim
                                WHEN COALESCE(np, 0) < nf THEN GREATEST(COALESCE(mx, 0), 0) ELSE mx END AS oracle
      FROM fut JOIN mb USING (m, b) LEFT JOIN pair ON pair.m = fut.m AND pair.t = fut.b;"""
    return f"""
    CREATE TEMP TABLE ev AS
      SELECT collection_id AS c, instance_index AS i, time, CAST(req_cpu AS DOUBLE) AS l, priority, scheduling_class
      FROM {table_scan(ds, "instance_events")} WHERE {positive("req_cpu")} AND {positive("req_mem")}
      QUALIFY ROW_NUMBER() OVER (PARTITION BY collection_id, instance_index, time ORDER BY r DESC) = 1;
    CREATE TEMP TABLE smp AS
      SELECT u.machine_id AS m, u.collection_id AS c, u.instance_index AS i, u.start_time // {b_us} AS b,
             MAX(CAST(u.cpu_p90 AS DOUBLE)) AS u, MAX(ev.l) AS l
      FROM {usage} u ASOF JOIN ev ON u.collection_id = ev.c AND u.instance_index = ev.i AND u.start_time >= ev.time
      WHERE (u.alloc_collection_id IS NULL OR u.alloc_collection_id = 0) AND u.start_time <> {never}
        AND (isfinite(u.cpu_p90) OR isinf(u.cpu_p90))
        AND u.machine_id IN (SELECT machine_id FROM {mevents})
        AND ev.priority BETWEEN 0 AND 400 AND ev.scheduling_class BETWEEN 2 AND 3
      GROUP BY ALL;
    CREATE TEMP TABLE mb AS SELECT m, b, COUNT(*) AS n, SUM(l) AS lim, SUM(LEAST(u, l)) AS tu FROM smp GROUP BY ALL;
    {oracle_sql if oracle else ""}
    COPY (SELECT mb.m AS machine_id, mb.b AS bucket, mb.b * {b_us} AS bucket_start_us, n AS instances, lim AS "limit",
                 tu AS total_usage, {"oracle, " if oracle else ""}0.9 * lim AS borg_default
          FROM mb {"LEFT JOIN orc USING (m, b)" if oracle else ""} ORDER BY machine_id, bucket)
      TO '{out}/machine.parquet' (FORMAT parquet)"""
