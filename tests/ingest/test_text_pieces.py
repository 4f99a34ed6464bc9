"""Line-aligned pieces of plain text read by memory map (the compiled InstanceUsage reader's
path) against the same pieces read into buffers; and the kernel's shared library
(``readers/_fast_usage_native``): where it is looked for, when it is (not) used, its build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuclust.ingest import content_hash
from gpuclust.ingest.base import SourceError
from gpuclust.ingest.detect import detect
from gpuclust.ingest.readers import _fast_usage, _fast_usage_native, text_pieces

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


# --------------------------------------------------------------------------------------------
# The kernel's shared library
# --------------------------------------------------------------------------------------------
needs_native = pytest.mark.skipif(
    _fast_usage_native.library_path() is None or shutil.which("cc") is None or not _fast_usage.wanted(),
    reason="no native kernel here (not Linux, no C compiler, or no numba to build it)",
)


def test_library_name_follows_the_kernel_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCLUST_KERNEL_DIR", str(tmp_path))
    a = _fast_usage_native.library_path()
    if a is None:
        pytest.skip("CPU not known here")
    assert a.parent == tmp_path
    src = tmp_path / "kernel.py"
    src.write_bytes(_fast_usage_native._KERNEL_SRC.read_bytes() + b"\n# edited\n")
    monkeypatch.setattr(_fast_usage_native, "_KERNEL_SRC", src)
    assert _fast_usage_native.library_path() != a


def test_bad_library_is_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCLUST_KERNEL_DIR", str(tmp_path))
    path = _fast_usage_native.library_path()
    if path is None:
        pytest.skip("CPU not known here")
    assert _fast_usage_native.load() is None  # none built
    path.write_bytes(b"not a shared library")
    assert _fast_usage_native.load() is None


@needs_native
def test_background_build_then_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that finds no library starts one detached build (a second call while it builds
    starts none); the next load uses it; GPUCLUST_NATIVE_KERNEL=0 turns it off."""
    monkeypatch.setenv("GPUCLUST_KERNEL_DIR", str(tmp_path))
    path = _fast_usage_native.library_path()
    assert path is not None
    assert _fast_usage_native.build_in_background()
    assert not _fast_usage_native.build_in_background()  # building already (the lock)
    deadline = time.monotonic() + 120
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert path.exists(), list(tmp_path.iterdir())
    while path.with_name(path.name + ".lock").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no lock, temp or note left
    k = _fast_usage_native.load()
    assert k is not None
    _fast_usage_native.check(k)
    assert not _fast_usage_native.build_in_background()  # built
    monkeypatch.setenv("GPUCLUST_NATIVE_KERNEL", "0")
    assert _fast_usage_native.load() is None and not _fast_usage_native.build_in_background()


@needs_native
def test_a_background_build_outlives_its_process_without_a_warning(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The build is started by a launcher that exits at once, so it is not the ingest process'
    child: that process may exit while the build runs without CPython's "subprocess is still
    running" ResourceWarning (shown under ``-X dev``; it ended every test run before), and the
    build still finishes."""
    monkeypatch.setenv("GPUCLUST_KERNEL_DIR", str(tmp_path))
    path = _fast_usage_native.library_path()
    assert path is not None
    code = "from gpuclust.ingest.readers import _fast_usage_native as n\nassert n.build_in_background()\n"
    p = subprocess.run([sys.executable, "-X", "dev", "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "still running" not in p.stderr, p.stderr
    deadline = time.monotonic() + 120
    while (not path.exists() or path.with_name(path.name + ".lock").exists()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert path.exists() and _fast_usage_native.load() is not None


@needs_native
def test_failed_build_is_not_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCLUST_KERNEL_DIR", str(tmp_path))
    path = _fast_usage_native.library_path()
    assert path is not None
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    assert not _fast_usage_native.build_in_background()  # no compiler: nothing started
    monkeypatch.setenv("CC", "false")  # a compiler that always fails
    assert _fast_usage_native._main([str(path)]) == 1
    assert path.with_name(path.name + ".failed").exists() and not path.exists()
    monkeypatch.delenv("CC")
    assert not _fast_usage_native.build_in_background()  # noted as failed: not again
    os.unlink(path.with_name(path.name + ".failed"))
