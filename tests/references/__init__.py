"""References: independent statements of what an analysis computes, written from its document
(docs/analyses/), never from gpuclust's code.

* ``sql_<analysis>``: DuckDB SQL over the dataset's Parquet files.  A ``*_sql`` function returns a
  query of the analysis' SQL-expressible part; a ``*_full_sql`` function returns DuckDB statements
  that write every table the analysis writes (``peak_prediction_sql``: the columns of its
  ``machine`` table SQL computes) as Parquet into a folder.  The tests (``tests/bench/
  test_cpu_vs_duckdb.py``) use them as the oracle, table for table; the benchmarks
  (``bench/cpu_vs_duckdb.py``, ``bench/analyses_bench.py``, ``bench/study_bench.py``) time them as
  the peer, listed by analysis in :data:`references.sql_peers.DUCKDB_SQL`.
* ``data_quality``, ``lifecycle``, ``peak_prediction``, ``usage_change``: slow, obvious pure-Python
  replays the analyses' tests compare with, row by row (overcommit's and machine-utilization's lie
  beside their tests, ``tests/analyses/*_reference.py``; the mixture's in ``tests/mixture/``).

``tests/conftest.py`` puts ``tests/`` on ``sys.path`` (``from references.sql_job_usage import
job_usage_full_sql``); the benchmarks add it the same way.
"""
