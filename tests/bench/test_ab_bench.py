"""bench/ab_bench.py runs end to end (a tiny dataset, one round, this tree against HEAD) and writes
what it reports; its git worktree of the base commit is gone afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def _worktrees() -> list[str]:
    out = subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=ROOT, capture_output=True, text=True)
    return [ln for ln in out.stdout.splitlines() if ln.startswith("worktree ")]


def test_ab_bench_tiny(tmp_path, monkeypatch):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no base commit to compare with")
    monkeypatch.syspath_prepend(str(BENCH))
    import _harness
    from gen_canonical import make_dataset

    monkeypatch.setattr(_harness, "RESULTS", tmp_path)
    ds = make_dataset(tmp_path / "ds", 20_000, seed=1)
    before = _worktrees()
    try:
        import ab_bench

        monkeypatch.setattr(ab_bench, "bench_dataset", lambda size: ds)
        assert (
            ab_bench.main(
                [
                    "--base",
                    "HEAD",
                    "--analyses",
                    "machine-shapes,cell-usage",
                    "--sizes",
                    "2e4",
                    "--rounds",
                    "1",
                    "--name",
                    "ab",
                ]
            )
            == 0
        )
    finally:
        sys.modules.pop("ab_bench", None)
    assert _worktrees() == before
    res = json.loads((tmp_path / "ab.json").read_text())
    assert [(r["size"], r["analysis"]) for r in res["rows"]] == [(20_000, "machine-shapes"), (20_000, "cell-usage")]
    for r in res["rows"]:
        assert r["base_wall_s"] > 0 and r["this_wall_s"] > 0 and r["this_rss_mib"] > 0
        assert r["ratio_wall_s"] == pytest.approx(r["this_wall_s"] / r["base_wall_s"])
    assert all(len(v) == 1 for v in res["runs"].values()) and len(res["runs"]) == 4
    assert "| 2e+04 | machine-shapes |" in (tmp_path / "ab.md").read_text()
