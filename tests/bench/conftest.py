"""Shared fixture of the benchmark tests: a bench script's ``main`` run on a tiny canonical dataset."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def tiny_bench(tmp_path, monkeypatch):
    """``run(script, args)``: ``bench/<script>.py``'s ``main(args + ["--name", "out"])`` with every
    size on a 20,000-window canonical dataset and the results in ``tmp_path``; returns the JSON
    it wrote and its Markdown."""
    monkeypatch.syspath_prepend(str(BENCH))
    import _harness
    from gen_canonical import make_dataset

    monkeypatch.setattr(_harness, "RESULTS", tmp_path)
    ds = make_dataset(tmp_path / "ds", 20_000, seed=1)

    def run(script: str, args: list[str], **data: Any) -> tuple[dict[str, Any], str]:
        """(``data``: the dataset's ``machines`` / ``days``, where not the default's)"""
        own = make_dataset(tmp_path / "ds-own", 20_000, seed=1, **data) if data else ds
        try:
            mod = __import__(script)
            monkeypatch.setattr(mod, "bench_dataset", lambda size: own)
            assert mod.main([*args, "--name", "out"]) == 0
        finally:
            sys.modules.pop(script, None)
        return json.loads((tmp_path / "out.json").read_text()), (tmp_path / "out.md").read_text()

    return run
