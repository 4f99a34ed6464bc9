"""lifecycle's DuckDB SQL references (docs/analyses/lifecycle.md): ``lifecycle_sql``, its
SQL-expressible subset, and ``lifecycle_full_sql``, which writes its tables but ``survival``."""

from __future__ import annotations

from pathlib import Path

from references._sql import tier_case


def lifecycle_sql(ds: Path | str) -> str:
    """lifecycle's SQL-expressible subset: per instance its tier (notebook map, of its highest
    priority) and, with LAG over the instance's events in time order, the count of events and of
    transitions by (previous event, event, tier)."""
    sql = f"""
    WITH e AS (SELECT time, type, collection_id, instance_index, priority
               FROM read_parquet('{ds}/instance_events/**/*.parquet', hive_partitioning=false)),
         t AS (SELECT collection_id, instance_index, MAX(priority) AS p FROM e GROUP BY ALL),
         s AS (SELECT e.type, LAG(e.type) OVER (PARTITION BY e.collection_id, e.instance_index ORDER BY e.time) AS prev,
                      CASE WHEN p IS NULL OR p < 0 THEN 'unknown' WHEN p < 100 THEN 'free' WHEN p < 116 THEN 'beb'
                           WHEN p < 120 THEN 'mid' ELSE 'prod' END AS tier
               FROM e JOIN t USING (collection_id, instance_index))
    SELECT tier, prev, type, COUNT(*) FROM s GROUP BY ALL"""
    return sql


#: v3 event type names by code (v3 document, "Event types"): what lifecycle_full_sql names them.
_V3_EVENTS = (
    "SUBMIT",
    "QUEUE",
    "ENABLE",
    "SCHEDULE",
    "EVICT",
    "FAIL",
    "FINISH",
    "KILL",
    "LOST",
    "UPDATE_PENDING",
    "UPDATE_RUNNING",
)


def lifecycle_full_sql(ds: Path | str, out: Path | str, bucket_s: int = 3600) -> str:
    """gpuclust lifecycle's tables of every kind together (``events``, ``transitions``, ``series``,
    ``delays``, ``delay_hist``) and ``info``, as DuckDB statements that write them to ``out`` as
    Parquet, from docs/analyses/lifecycle.md (not from gpuclust's code): each instance's events in
    time order (ties in the files' row order), the state after each event by its type (pending:
    SUBMIT, QUEUE, ENABLE, UPDATE_PENDING; running: SCHEDULE, UPDATE_RUNNING; dead: the rest) and
    the pending sub-state (queued after a QUEUE, eligible after an ENABLE, until the next SUBMIT,
    QUEUE, ENABLE or the end of the stay), the instance's tier from its highest priority, present
    at the trace start when its first event is at time 0; ``events``, ``transitions``
    (``expected`` from the v3 state diagram), ``series`` (per bucket of ``bucket_s`` and tier with
    events: submissions, new ones (an instance's first SUBMIT, unless it is present at the start),
    resubmissions, the instances present at the start, schedules, deaths by kind, and the instances
    pending, running, queued and eligible at the bucket's end, every bucket from the first to the
    last), ``delays`` and ``delay_hist`` (scheduling, ENABLE-to-SCHEDULE, execution and queued
    episodes with their outcomes, censored ones measured to the last finite event time, events the
    trace synthesised (``missing_type`` set, not NONE; where the column is present) replayed but
    timing no duration, durations in the log bins ``ceil(10^(k/50))`` µs), and ``info`` (the
    counters of the replay; not the tier map, kinds or collections).  Not ``survival``,
    ``events_by_kind`` or ``delays_by_kind``: the per-kind tables and the Kaplan-Meier estimate are
    out of scope for this SQL peer.  tests/bench/test_cpu_vs_duckdb.py checks it against
    gpuclust's tables."""
    import math

    import pyarrow.parquet as pq

    events = f"read_parquet('{ds}/instance_events/**/*.parquet', hive_partitioning=false, file_row_number=true)"
    files = sorted(Path(ds, "instance_events").rglob("*.parquet"))
    synth = (
        "COALESCE(missing_type > 0, false)" if files and "missing_type" in pq.read_schema(files[0]).names else "false"
    )
    edges = sorted({math.ceil(10.0 ** (k / 50)) for k in range(651)})  # the bins' lower edges, µs
    names = "[" + ", ".join(f"'{n}'" for n in _V3_EVENTS) + "]"
    after = "9223372036854775807"
    width = int(bucket_s) * 1_000_000

    def state(e: str) -> str:  # 1 pending, 2 running, 3 dead, 0 none (no event)
        return f"CASE WHEN {e} IN (0, 1, 2, 9) THEN 1 WHEN {e} IN (3, 10) THEN 2 WHEN {e} IS NULL THEN 0 ELSE 3 END"

    def last(cond: str, v: str) -> str:  # v at the instance's last row so far where cond holds
        return f"LAST_VALUE(CASE WHEN {cond} THEN {v} END IGNORE NULLS) OVER {upto}"

    def lag(*cols: str) -> str:
        return ", ".join(f"LAG({c}) OVER ({inst}) AS p{c}" for c in cols)

    inst = "PARTITION BY c, i ORDER BY r"
    upto = f"({inst} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)"
    died = f"lower({names}[e + 1])"
    series_counts = (
        "submissions",
        "new_submissions",
        "resubmissions",
        "present_at_start",
        "schedules",
        "evictions",
        "failures",
        "finishes",
        "kills",
        "losses",
    )
    levels = ("pending", "running", "queued", "eligible")
    return f"""
    CREATE TEMP TABLE raw AS SELECT time AS t, type AS e, collection_id AS c, instance_index AS i, priority,
        {synth} AS sy, ROW_NUMBER() OVER (ORDER BY file_index, file_row_number) AS r FROM {events};
    CREATE TEMP TABLE x AS
      WITH v AS (SELECT *, MAX(priority) OVER (PARTITION BY c, i) AS p, MIN(t) OVER (PARTITION BY c, i) = 0 AS pas,
                        LAG(e) OVER ({inst}) AS pe,
                        SUM(CASE WHEN e = 0 THEN 1 ELSE 0 END) OVER {upto} AS nsub,
                        ROW_NUMBER() OVER (PARTITION BY c, i ORDER BY r DESC) = 1 AS last
                 FROM (SELECT t, e, c, i, priority, sy, ROW_NUMBER() OVER (ORDER BY t, r) AS r FROM raw
                       WHERE e BETWEEN 0 AND 10)),
           w AS (SELECT *, {tier_case(ds)} AS tier, {state("e")} AS st, {state("pe")} AS pst FROM v),
           z AS (SELECT *, st = 1 AND (pst <> 1 OR e = 0) AS pentry, st = 2 AND (pst <> 2 OR e = 3) AS rentry,
                        {last("e IN (0, 1, 2) OR st <> 1", "e")} AS sub_e FROM w),
           q AS (SELECT *, COALESCE(st = 1 AND sub_e = 1, false) AS queued,
                        COALESCE(st = 1 AND sub_e = 2, false) AS eligible FROM z),
           u AS (SELECT *, COALESCE(LAG(queued) OVER ({inst}), false) AS was_q,
                        COALESCE(LAG(eligible) OVER ({inst}), false) AS was_el FROM q)
      SELECT *,
             CASE pst WHEN 1 THEN e IN (1, 2, 3, 9, 5, 7, 8) WHEN 2 THEN e IN (10, 4, 5, 6, 7, 8) ELSE e = 0 END AS expected,
             {last("pentry", "t")} AS ps_t, {last("pentry", "e")} AS ps_e, {last("pentry", "sy")} AS ps_sy,
             {last("pentry", "r")} AS ps_r,
             {last("rentry", "t")} AS rs_t, {last("rentry", "e")} AS rs_e, {last("rentry", "sy")} AS rs_sy,
             {last("e = 2", "r")} AS en_r, {last("e = 2", "t")} AS en_t, {last("e = 2", "sy")} AS en_sy,
             {last("queued AND NOT was_q", "t")} AS qs_t, {last("queued AND NOT was_q", "sy")} AS qs_sy
      FROM u;
    CREATE TEMP TABLE ep AS
      WITH y AS (SELECT *, {
        lag("ps_t", "ps_e", "ps_sy", "ps_r", "rs_t", "rs_e", "rs_sy", "en_r", "en_t", "en_sy", "qs_t", "qs_sy")
    } FROM x),
           dend AS (SELECT MAX(t) FILTER (WHERE t < {after}) AS d FROM raw),
           eps AS (
      SELECT tier, 'scheduling' AS measure,
             CASE WHEN e = 0 THEN 'resubmitted' WHEN e = 3 THEN 'scheduled' WHEN e BETWEEN 4 AND 8
                  THEN {died} ELSE 'other' END AS outcome,
             t - pps_t AS dur, pps_e = 0 AND pps_t <> 0 AND t <> {after} AS timed, NOT pps_sy AND NOT sy AS real
        FROM y WHERE pst = 1 AND (st <> 1 OR e = 0)
      UNION ALL
      SELECT tier, 'enable_to_schedule', 'scheduled', t - pen_t, true, true
        FROM y WHERE pst = 1 AND e = 3 AND pen_r > pps_r AND pps_e = 0 AND pps_t <> 0 AND t <> {after}
                     AND NOT pps_sy AND NOT sy AND NOT pen_sy
      UNION ALL
      SELECT tier, 'execution', CASE WHEN e BETWEEN 4 AND 8 THEN {died} ELSE 'interrupted' END,
             t - prs_t, prs_e = 3 AND prs_t <> 0 AND t <> {after}, NOT prs_sy AND NOT sy
        FROM y WHERE pst = 2 AND (st <> 2 OR e = 3)
      UNION ALL
      SELECT tier, 'queued',
             CASE WHEN e = 2 THEN 'enabled' WHEN e = 3 THEN 'scheduled' WHEN e = 0 THEN 'resubmitted'
                  WHEN e BETWEEN 4 AND 8 THEN 'died' ELSE 'other' END,
             t - pqs_t, pqs_t <> 0 AND t <> {after}, NOT pqs_sy AND NOT sy
        FROM y WHERE was_q AND NOT queued
      UNION ALL
      SELECT tier, CASE WHEN st = 1 THEN 'scheduling' ELSE 'execution' END, 'censored',
             (SELECT d FROM dend) - CASE WHEN st = 1 THEN ps_t ELSE rs_t END,
             COALESCE(CASE WHEN st = 1 THEN ps_e = 0 AND ps_t <> 0 AND ps_t <= (SELECT d FROM dend)
                           ELSE rs_e = 3 AND rs_t <> 0 AND rs_t <= (SELECT d FROM dend) END, false),
             NOT CASE WHEN st = 1 THEN ps_sy ELSE rs_sy END
        FROM y WHERE last AND st IN (1, 2)
      UNION ALL
      SELECT tier, 'queued', 'censored', (SELECT d FROM dend) - qs_t,
             COALESCE(qs_t <> 0 AND qs_t <= (SELECT d FROM dend), false), NOT qs_sy
        FROM y WHERE last AND queued)
      SELECT tier, measure, outcome, dur, timed AND real AS known, timed AND NOT real AS synth_lost FROM eps;
    CREATE TEMP TABLE edges AS SELECT UNNEST(range(1, {len(edges) + 1})) AS b, UNNEST({edges}::BIGINT[]) AS lo;
    CREATE TEMP TABLE hist AS
      SELECT tier, measure, outcome, COALESCE(edges.b, 0) AS bin, COUNT(*) AS episodes
      FROM (SELECT * FROM ep WHERE known) k ASOF LEFT JOIN edges ON k.dur >= edges.lo GROUP BY ALL;
    COPY (SELECT tier, {names}[e + 1] AS event, COUNT(*) AS count FROM x GROUP BY tier, e)
      TO '{out}/events.parquet' (FORMAT parquet);
    COPY (SELECT tier, {names}[pe + 1] AS from_event, {names}[e + 1] AS to_event, COUNT(*) AS count, expected
          FROM x WHERE pe IS NOT NULL GROUP BY tier, pe, e, expected) TO '{out}/transitions.parquet' (FORMAT parquet);
    COPY (WITH live AS (SELECT *, t // {width} AS bucket FROM x WHERE t <> {after}),
               g AS (SELECT bucket, tier, COUNT(*) FILTER (WHERE e = 0) AS submissions,
                            COUNT(*) FILTER (WHERE e = 0 AND nsub = 1 AND NOT pas) AS new_submissions,
                            COUNT(*) FILTER (WHERE e = 0 AND (nsub > 1 OR (pas AND t <> 0))) AS resubmissions,
                            COUNT(*) FILTER (WHERE pe IS NULL AND pas) AS present_at_start,
                            COUNT(*) FILTER (WHERE e = 3) AS schedules, COUNT(*) FILTER (WHERE e = 4) AS evictions,
                            COUNT(*) FILTER (WHERE e = 5) AS failures, COUNT(*) FILTER (WHERE e = 6) AS finishes,
                            COUNT(*) FILTER (WHERE e = 7) AS kills, COUNT(*) FILTER (WHERE e = 8) AS losses,
                            SUM(CAST(st = 1 AS INT) - CAST(pst = 1 AS INT)) AS d_pending,
                            SUM(CAST(st = 2 AS INT) - CAST(pst = 2 AS INT)) AS d_running,
                            SUM(CAST(queued AS INT) - CAST(was_q AS INT)) AS d_queued,
                            SUM(CAST(eligible AS INT) - CAST(was_el AS INT)) AS d_eligible
                     FROM live GROUP BY ALL),
               grid AS (SELECT bucket, tier FROM range((SELECT MIN(bucket) FROM live), (SELECT MAX(bucket) FROM live) + 1)
                        t(bucket) CROSS JOIN (SELECT DISTINCT tier FROM live))
          SELECT bucket, bucket * {width} AS bucket_start_us, tier,
                 {", ".join(f"COALESCE({f}, 0) AS {f}" for f in series_counts)},
                 {
        ", ".join(
            f"CAST(SUM(COALESCE(d_{f}, 0)) OVER (PARTITION BY tier ORDER BY bucket) AS BIGINT) AS {f}" for f in levels
        )
    }
          FROM grid LEFT JOIN g USING (bucket, tier)) TO '{out}/series.parquet' (FORMAT parquet);
    COPY (WITH s AS (SELECT tier, measure, outcome, COUNT(*) AS episodes, COUNT(*) FILTER (WHERE known) AS with_duration,
                            AVG(dur) FILTER (WHERE known) / 1e6 AS mean_s, MIN(dur) FILTER (WHERE known) / 1e6 AS min_s,
                            MAX(dur) FILTER (WHERE known) / 1e6 AS max_s FROM ep GROUP BY ALL),
               c AS (SELECT *, SUM(episodes) OVER (PARTITION BY tier, measure, outcome ORDER BY bin) AS cum,
                            SUM(episodes) OVER (PARTITION BY tier, measure, outcome) AS n FROM hist),
               q AS (SELECT tier, measure, outcome,
                            MIN(bin) FILTER (WHERE cum >= CEIL(50 * n / 100)) AS b50,
                            MIN(bin) FILTER (WHERE cum >= CEIL(90 * n / 100)) AS b90,
                            MIN(bin) FILTER (WHERE cum >= CEIL(99 * n / 100)) AS b99 FROM c GROUP BY ALL)
          SELECT s.*, {
        ", ".join(
            f"CASE WHEN q.b{p} IS NOT NULL THEN GREATEST(COALESCE((SELECT lo FROM edges "
            f"WHERE edges.b = q.b{p}), 0) / 1e6, min_s) END AS p{p}_s"
            for p in (50, 90, 99)
        )
    }
          FROM s LEFT JOIN q USING (tier, measure, outcome)) TO '{out}/delays.parquet' (FORMAT parquet);
    COPY (SELECT tier, measure, outcome, bin, COALESCE((SELECT lo FROM edges WHERE edges.b = bin), 0) / 1e6 AS lo_s,
                 CASE WHEN bin = 0 THEN 0 ELSE COALESCE((SELECT lo FROM edges WHERE edges.b = bin + 1) / 1e6,
                                                        'inf'::DOUBLE) END AS hi_s, episodes
          FROM hist) TO '{out}/delay_hist.parquet' (FORMAT parquet);
    COPY (SELECT (SELECT COUNT(*) FROM raw) AS rows,
                 (SELECT COUNT(*) FROM raw WHERE e IS NULL OR NOT e BETWEEN 0 AND 10) AS invalid_type_rows,
                 (SELECT COUNT(*) FROM x WHERE last) AS instances,
                 (SELECT COUNT(*) FROM x WHERE pe IS NULL AND e <> 0) AS first_not_submit,
                 (SELECT COUNT(*) FROM x WHERE last AND (p IS NULL OR p < 0)) AS unknown_priority_instances,
                 (SELECT COUNT(*) FROM x WHERE t = 0) AS time_zero_events,
                 (SELECT COUNT(*) FROM x WHERE t = {after}) AS after_trace_events,
                 (SELECT COUNT(*) FROM x WHERE last AND pas) AS present_at_start,
                 (SELECT COUNT(*) FROM x WHERE sy) AS synthesized_events,
                 (SELECT COUNT(*) FROM ep WHERE synth_lost) AS synthesized_duration_episodes,
                 (SELECT COUNT(*) FROM x WHERE pe IS NOT NULL) AS transitions,
                 (SELECT COUNT(*) FROM x WHERE pe IS NOT NULL AND NOT expected) AS unexpected_transitions,
                 (SELECT MAX(t) FILTER (WHERE t < {after}) FROM raw) AS data_end_us
          ) TO '{out}/info.parquet' (FORMAT parquet)"""
