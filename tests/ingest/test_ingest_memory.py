"""TRACE_NOTES: an InstanceUsage shard is ~0.5 GB compressed, ~3 GB of JSON, so ingest reads it in
bounded memory (docs/user/ingest.md: "bounded memory whatever the file size").  Checked here on
the reader and writer (``--layout flat``; the layout step's memory is one bucket's:
bench/results/optimize.md): the same command on a shard 4x larger peaks at about the same RSS.

The peak is the ingest process's own (``ru_maxrss`` of the children of a small parent process that
runs only it: the command may leave by ``os._exit``, so it cannot report its own).  The pieces are
1 MiB (``--chunk-mb 1``), so the small shard already holds many pieces and the peak has reached the
level the pieces in flight set; were the reader to hold the file (or the rows it parsed), the
large shard's 72 MB more of JSON, or their rows' Arrow buffers, would show.  Measured (this VM):
110-113 MiB from 16 to 256 MB of JSON; with 4 MiB pieces the peak still rises to ~150 MiB up to
~128 MB, then stays there (151-163 MiB up to 1 GB).  On real-size shards with the default 64 MiB
pieces: bench/results/ingest.md's peak RSS column.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import bq_json_line, records

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in KiB (Linux)"),
]

#: Bytes of JSON of the small shard; the large one is 4x.
SMALL_BYTES = 24 << 20
GROWTH_MIB = 16
CHUNK_MB = 1

PARENT = r"""
import json, resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True, text=True)
print(json.dumps({"rc": r.returncode, "err": r.stderr[-2000:],
                  "peak_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def _shard(folder: Path, nbytes: int) -> tuple[Path, int]:
    """A plain JSON InstanceUsage shard of about ``nbytes`` in ``folder``: 2,000 random records
    repeated; its path and rows."""
    folder.mkdir()
    path = folder / "instance_usage-000000000000.json"
    block = "".join(bq_json_line(r) + "\n" for r in records("instance_usage", 2_000, seed=4))
    k = max(1, round(nbytes / len(block)))
    with open(path, "w") as f:
        for _ in range(k):
            f.write(block)
    return path, 2_000 * k


def _peak_mib(shard: Path, out: Path, chunk_mb: int = CHUNK_MB) -> float:
    cmd = [sys.executable, "-m", "gpuclust", "ingest", str(shard), "--out", str(out)]
    cmd += ["--layout", "flat", "--chunk-mb", str(chunk_mb), "--workers", "1", "--no-progress"]
    r = subprocess.run([sys.executable, "-c", PARENT, *cmd], capture_output=True, text=True, check=True)
    got = json.loads(r.stdout)
    assert got["rc"] == 0, got["err"]
    return got["peak_kib"] / 1024


def test_peak_memory_does_not_grow_with_the_shard(tmp_path: Path) -> None:
    from gpuclust.dataset import Dataset

    small, small_rows = _shard(tmp_path / "small", SMALL_BYTES)
    large, large_rows = _shard(tmp_path / "large", 4 * SMALL_BYTES)
    peak_small = _peak_mib(small, tmp_path / "ds-small")
    peak_large = _peak_mib(large, tmp_path / "ds-large")
    # every row is in (so the large run did read 4x the rows), and its peak is the small run's
    assert Dataset(tmp_path / "ds-small").num_rows("instance_usage") == small_rows
    assert Dataset(tmp_path / "ds-large").num_rows("instance_usage") == large_rows
    assert peak_large - peak_small < GROWTH_MIB, (peak_small, peak_large)
