"""The main job end to end: `gpuclust demo` through the real CLI, checked against the raw shards."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest


def _demo(out: Path) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "gpuclust",
        "demo",
        "--out",
        str(out),
        "--machines",
        "25",
        "--hours",
        "2",
        "--seed",
        "5",
        "--quiet",
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("demo")
    return out, _demo(out)


def test_demo_writes_every_analysis(demo_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, proc = demo_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    from gpuclust.analyses.registry import names

    for name in names():
        files = list((out / "results" / name).glob("*.parquet"))
        assert files, f"no results for {name}"
    assert (out / "results" / "summary.txt").read_text().strip()
    assert str(out / "results") in proc.stdout
    page = out / "report.html"  # the report page, one self-contained file (tests/test_report_html.py opens one)
    assert f"report page          : {page}" in proc.stdout and page.stat().st_size > 50_000
    text = page.read_text()
    assert all(f'id="a-{name}"' in text for name in names())
    man = json.loads((out / "dataset" / "manifest.json").read_text())
    assert man["complete"] is True and "synthetic" in man


def test_demo_machine_shapes_match_raw_json(demo_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    """Independent reference: group the raw JSON export lines by capacity with plain Python."""
    out, proc = demo_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    shapes: dict[tuple[float | None, float | None], set[int]] = {}
    for shard in sorted((out / "raw").glob("machine_events-*.json.gz")):
        with gzip.open(shard, "rt") as f:
            for line in f:
                rec = json.loads(line)
                cap = rec.get("capacity") or {}
                key = (cap.get("cpus"), cap.get("memory"))
                shapes.setdefault(key, set()).add(int(rec["machine_id"]))
    got = pq.read_table(next((out / "results" / "machine-shapes").glob("shapes*.parquet"))).to_pandas()
    cols = {c.lower(): c for c in got.columns}
    cpu_c = next(c for k, c in cols.items() if "cpu" in k)
    mem_c = next(c for k, c in cols.items() if "mem" in k)
    cnt_c = next(c for k, c in cols.items() if "machine" in k or "count" in k)
    table = {}
    for _, r in got.iterrows():
        key = tuple(None if v != v else round(float(v), 6) for v in (r[cpu_c], r[mem_c]))
        table[key] = int(r[cnt_c])
    want = {tuple(None if v is None else round(float(v), 6) for v in k): len(ids) for k, ids in shapes.items()}
    assert table == want


def test_demo_rerun_is_identical(demo_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, proc = demo_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    before = {p.relative_to(out): pq.read_table(p) for p in sorted((out / "results").rglob("*.parquet"))}
    again = _demo(out)
    assert again.returncode == 0, again.stderr[-3000:]
    after = {p.relative_to(out): pq.read_table(p) for p in sorted((out / "results").rglob("*.parquet"))}
    assert before.keys() == after.keys()
    for k in before:
        assert before[k].equals(after[k]), k
