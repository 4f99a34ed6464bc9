"""One in-memory DuckDB connection per test process for checks that read a dataset's files as
they are at the moment of the query (crash and re-run tests): no cache of file contents, so a
part rewritten or removed since the last query is read again.  Opening a connection costs ~50 ms;
the crash tests query after every kill."""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def connection() -> Any:
    """The process's connection (``duckdb`` must be importable: callers skip without it)."""
    import duckdb

    return duckdb.connect(config={"enable_external_file_cache": False})
