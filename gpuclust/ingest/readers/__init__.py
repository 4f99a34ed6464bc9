"""Source readers, one module per format, looked up lazily by format name.

Each reader module exposes ``read(src: SourceFile, opts: ReadOptions) -> Iterator[Chunk]``
(see :mod:`gpuclust.ingest.base` for the rules every reader follows).  Modules are imported only
when their format is used, so a broken or slow-to-import reader never affects the others.
"""

from __future__ import annotations

import importlib

from gpuclust.ingest.base import FORMATS, Reader

#: Format name -> module that implements it.
READERS: dict[str, str] = {
    "v3-json": "gpuclust.ingest.readers.v3_json",
    "v3-parquet": "gpuclust.ingest.readers.v3_parquet",
    "v2-csv": "gpuclust.ingest.readers.v2_csv",
    "kaggle-csv": "gpuclust.ingest.readers.kaggle_csv",
}
assert set(READERS) == set(FORMATS)


def get_reader(format: str) -> Reader:
    """The ``read`` function of the reader for ``format``.

    Examples
    --------
    >>> from gpuclust.ingest.readers import get_reader
    >>> read = get_reader("v3-json")
    """
    try:
        mod = READERS[format]
    except KeyError:
        raise ValueError(f"unknown format {format!r}; formats are {list(READERS)}") from None
    return importlib.import_module(mod).read  # type: ignore[no-any-return,unused-ignore]
