"""What a file is by its name and by its first bytes, before any reader sees it.

* :func:`non_table_reason`: files found next to trace tables that are not tables (documentation,
  checksum lists, job markers such as ``_SUCCESS``, ``synth_truth.json``, dotfiles).  Ingest
  skips them with a one-line note.
* :func:`content_kind`: ``parquet``, ``json``, ``csv``, ``binary``, ``text`` or ``nothing`` (no
  bytes after decompression), from the head of the (decompressed) content.
* :func:`mismatch`: the one-line reason why a file cannot be what its name (or ``--format``)
  says, e.g. ``holds CSV (13 fields: v2 task_events?), not newline-delimited JSON``.
"""

from __future__ import annotations

import re
from pathlib import Path

#: Exact names (lower case) of files that are never trace tables, and why.
_NAMES = {
    "synth_truth.json": "the ground truth of a synthetic cell (gpuclust synth)",
    "manifest.json": "a manifest",
    "schema.csv": "the v2 trace's column map",
}
_CHECKSUM_SUFFIXES = (".md5", ".sha1", ".sha256", ".sha512", ".md5sum", ".sha1sum", ".sha256sum", ".sha512sum", ".crc")
_CHECKSUM_PREFIXES = ("sha256sums", "sha1sums", "sha512sums", "md5sums", "checksums", "md5sum", "sha256sum")
_DOC_PREFIXES = ("readme", "license", "licence", "copying", "notice", "changelog")
_DOC_SUFFIXES = (".md", ".txt", ".html", ".pdf", ".rst", ".py", ".ipynb", ".sh", ".log")


#: Temporary names of downloads in progress (gsutil / gcloud storage, curl / wget, browsers).
_PARTIAL_SUFFIXES = (".gstmp", ".part", ".partial", ".crdownload", ".download", ".tmp")


def non_table_reason(path: Path) -> str | None:
    """Why ``path`` is not a trace table (a one-line reason), or None when it may be one."""
    n = path.name.lower()
    if n.startswith("."):
        return "hidden file"
    if n in _NAMES:
        return _NAMES[n]
    if n.startswith("_"):
        return "a job marker or metadata file (leading underscore, e.g. _SUCCESS)"
    if n.endswith(_PARTIAL_SUFFIXES):
        return "an unfinished download (the downloader's temporary file); it is read once complete"
    if n.endswith(_CHECKSUM_SUFFIXES) or n.startswith(_CHECKSUM_PREFIXES):
        return "a checksum list"
    if n.startswith(_DOC_PREFIXES) or n.endswith(_DOC_SUFFIXES):
        return "documentation or code"
    return None


#: How many lines of the head are looked at for a JSON object (a damaged first line is no reason
#: to call a shard something else).
_LOOK_LINES = 20


def content_kind(head: bytes) -> str:
    """``parquet``, ``json``, ``csv``, ``binary``, ``text`` or ``nothing`` from a (decompressed) head."""
    if head[:4] == b"PAR1":
        return "parquet"
    body = head[3:] if head.startswith(b"\xef\xbb\xbf") else head
    if not body.strip():
        return "nothing"
    sample = body[: 8 << 10]
    if b"\x00" in sample:
        return "binary"
    text = sample.decode("utf-8", "replace")
    if len(sample) >= 4 and text[:-2].count("\ufffd") * 8 > len(text):  # mostly not UTF-8
        return "binary"
    ctrl = sum(1 for c in text if ord(c) < 32 and c not in "\t\r\n")
    if ctrl * 20 > len(text):
        return "binary"
    lines = [ln.strip() for ln in body.split(b"\n")[:_LOOK_LINES]]
    first = next((ln for ln in lines if ln), b"")
    # A JSON shard: its first line is an object, or (first line damaged) a later one is an object
    # with a quoted key.  Kaggle cells hold Python dicts ("{'cpus': ...}"), never '{"'.
    if first.startswith(b"{") or any(re.match(rb'\{\s*"', ln) for ln in lines):
        return "json"
    if first.count(b",") >= 3 and first[:1] not in (b'"', b"["):  # v2 tables have 5 fields or more
        return "csv"
    return "text"


#: The first columns of a Kaggle ``borg_traces_data.csv`` header (after an optional index column).
KAGGLE_HEADER = ("time", "instance_events_type", "collection_id")


def _csv_guess(head: bytes) -> str:
    first = head.lstrip(b"\xef\xbb\xbf").split(b"\n", 1)[0].decode("utf-8", "replace").strip()
    cells = [c.strip().strip('"') for c in first.split(",")]
    if any(tuple(cells[i : i + len(KAGGLE_HEADER)]) == KAGGLE_HEADER for i in (0, 1)):
        return "the Kaggle borg_traces_data layout?"
    from gpuclust.ingest.readers.v2_csv import V2_FIELDS

    n = len(cells)
    tables = [t for t, f in V2_FIELDS.items() if len(f) == n]
    if tables:
        return f"{n} fields: v2 {' or '.join(tables)}?"
    return f"{n} fields"


FORMAT_KIND = {"v3-json": "json", "v3-parquet": "parquet", "v2-csv": "csv", "kaggle-csv": "csv"}
_FORMAT_WORDS = {
    "v3-json": "newline-delimited JSON",
    "v3-parquet": "Parquet",
    "v2-csv": "v2 CSV",
    "kaggle-csv": "the Kaggle CSV layout",
}


def describe(kind: str, head: bytes) -> str:
    """Words for a content kind, e.g. ``CSV (13 fields: v2 task_events?)``."""
    if kind == "csv":
        return f"CSV ({_csv_guess(head)})"
    if kind == "json":
        return "JSON lines (a v3 export?)"
    if kind == "parquet":
        return "Parquet"
    if kind == "binary":
        return "binary data (damaged, encrypted or another format)"
    first = head.split(b"\n", 1)[0][:60].decode("utf-8", "replace")
    return f"text that is neither JSON nor CSV (first line {first!r})"


def mismatch(fmt: str, kind: str, head: bytes) -> str | None:
    """Why content of ``kind`` cannot be read as ``fmt``; None when it can.

    ``nothing`` (an empty stream inside a valid gzip file) is acceptable for every format: a
    shard may hold no rows.  JSON and CSV formats also accept ``text``: damaged lines are
    rejects, not a different format (what is refused is CSV, JSON, Parquet or binary data where
    another format belongs).
    """
    want = FORMAT_KIND[fmt]
    if kind in ("nothing", want) or (kind == "text" and want != "parquet"):
        return None
    return f"holds {describe(kind, head)}, not {_FORMAT_WORDS[fmt]}"


_EXT = re.compile(r"(\.(nd)?jsonl?|\.parquet|\.csv)?(\.gz|\.gzip)?$", re.IGNORECASE)


def shard_stem(name: str) -> str:
    """A file name without its format and compression suffixes (``machine_events-000000000000``)."""
    return _EXT.sub("", name)


def kind_from_name(name: str) -> str | None:
    """``json``, ``parquet`` or ``csv`` when the file name's suffix says so, else None."""
    low = name.lower()
    if re.search(r"\.(nd)?jsonl?(\.gz)?$", low):
        return "json"
    if re.search(r"\.parquet(\.gz)?$", low):
        return "parquet"
    if re.search(r"\.csv(\.gz)?$", low):
        return "csv"
    return None
