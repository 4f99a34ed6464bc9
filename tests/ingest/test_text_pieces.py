"""Line-aligned pieces of plain text read by memory map (the compiled InstanceUsage reader's
path) against the same pieces read into buffers."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuclust.ingest import content_hash
from gpuclust.ingest.base import SourceError
from gpuclust.ingest.detect import detect
from gpuclust.ingest.readers import _fast_usage, text_pieces

LINE = b'{"start_time":"1","end_time":"2","collection_id":"3","instance_index":"1","machine_id":"4"}'


def _pieces(path: Path, chunk: int, mapped: bool, monkeypatch: pytest.MonkeyPatch,
            digest: content_hash.StreamHash | None = None) -> list[tuple[bytes, int, int, bool]]:  # fmt: skip
    monkeypatch.setenv("GPUCLUST_MMAP", "1" if mapped else "0")
    out = []
    for p in text_pieces.pieces(detect(path), chunk, _fast_usage.count_newlines, digest=digest):
        out.append((p.tobytes(), p.first_line, p.newlines, isinstance(p.buf, text_pieces.mmap.mmap)))
    return out


CASES = {
    "plain": b"".join(LINE + b"\n" for _ in range(200)),
    "no trailing newline": b"\n".join(LINE for _ in range(50)),
    "byte-order mark": b"\xef\xbb\xbf" + b"".join(LINE + b"\n" for _ in range(30)),
    "crlf and blank lines": b"".join(LINE + b"\r\n" + (b"\n" if i % 7 == 0 else b"") for i in range(60)),
    "long lines": b"".join(LINE * (1 + i % 9) + b"\n" for i in range(40)),
    "one line": LINE,
    "newline only": b"\n",
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("chunk", [64, 500, 4096, 1 << 20])
def test_mapped_pieces_equal_read_pieces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str,
                                         chunk: int) -> None:  # fmt: skip
    f = tmp_path / "instance_usage-000000000000.json"
    f.write_bytes(CASES[case])
    read = _pieces(f, chunk, False, monkeypatch)
    mapped = _pieces(f, chunk, True, monkeypatch)
    assert [p[:3] for p in mapped] == [p[:3] for p in read]
    assert all(p[3] for p in mapped) and not any(p[3] for p in read)


def test_mapped_pieces_hash_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "instance_usage-000000000000.json"
    f.write_bytes(CASES["byte-order mark"] + b"{" * 10)  # a partial last line too
    for algo in content_hash.ALGORITHMS:
        d = content_hash.StreamHash(f, algo)
        _pieces(f, 300, True, monkeypatch, digest=d)
        assert d._done == f.stat().st_size  # fed in order by the pieces: nothing left to read
        assert d.finish() == content_hash.file_hash(f, algo)


def test_mapped_overlong_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A line longer than MAX_LINE stops the file with the buffered path's error, after the
    complete lines before it."""
    monkeypatch.setattr(text_pieces, "MAX_LINE", 1000)
    f = tmp_path / "instance_usage-000000000000.json"
    f.write_bytes(LINE + b"\n" + b"[" + b'{"time":"1"},' * 200)
    for mapped in (False, True):
        monkeypatch.setenv("GPUCLUST_MMAP", "1" if mapped else "0")
        got = []
        with pytest.raises(SourceError, match="line 2 is longer than") as ei:
            for p in text_pieces.pieces(detect(f), 64, _fast_usage.count_newlines):
                got.append(p.tobytes())
        assert got == [LINE + b"\n"] and ei.value.line == 2


def test_released_piece_stays_readable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "instance_usage-000000000000.json"
    f.write_bytes(CASES["long lines"] * 50)
    monkeypatch.setenv("GPUCLUST_MMAP", "1")
    for p in text_pieces.pieces(detect(f), 10_000, _fast_usage.count_newlines):
        before = p.tobytes()
        text_pieces.release(p)
        assert p.tobytes() == before


def test_gzip_and_other_readers_are_not_mapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gzip

    monkeypatch.setenv("GPUCLUST_MMAP", "1")
    g = tmp_path / "instance_usage-000000000000.json.gz"
    g.write_bytes(gzip.compress(CASES["plain"]))
    assert not any(isinstance(p.buf, text_pieces.mmap.mmap)
                   for p in text_pieces.pieces(detect(g), 500, _fast_usage.count_newlines))  # fmt: skip
    f = tmp_path / "instance_usage-000000000001.json"
    f.write_bytes(CASES["plain"])
    assert not any(isinstance(p.buf, text_pieces.mmap.mmap) for p in text_pieces.pieces(detect(f), 500))
