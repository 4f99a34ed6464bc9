"""`_run.json`'s phases (gpuclust.engine.timing): where a run's wall time went, each phase >= 0,
the main thread's adding up to at most the wall time, a slow phase planted in one place found
there (and under its analysis), nested phases counted once, docs listing every phase."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from strategies import random_cell, write_dataset

import gpuclust.report.analyze as report_analyze
from gpuclust.engine import timing
from gpuclust.engine.timing import PHASES, phase

NAMES = ("machine-shapes", "cell-usage", "data-quality", "overcommit")
#: phases every run of NAMES with plots goes through
RUN_PHASES = set(PHASES)
SLOW = 0.5


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return write_dataset(
        tmp_path_factory.mktemp("phases_ds"), random_cell(7, n_machines=8, n_instances=40, n_windows=600), files=2
    )


def run_json(ds, out, **kw):
    t = time.perf_counter()
    report_analyze.analyze(ds, list(NAMES), out=out, partitions=2, workers=1, **kw)
    wall = time.perf_counter() - t
    return json.loads((Path(out) / "_run.json").read_text()), wall


def test_phases_present_nonnegative_within_wall(ds, tmp_path):
    run, wall = run_json(ds, tmp_path / "r")
    ph = run["phases"]
    assert set(ph) == RUN_PHASES, set(ph) ^ RUN_PHASES
    assert all(v >= 0 for v in ph.values())
    assert sum(ph.values()) <= run["seconds"] + 0.01 <= wall + 0.02  # rounded to the millisecond each
    labels = {a["label"] for a in run["analyses"]}
    by = run["phases_by_analysis"]
    assert labels <= set(by)
    for label in labels:
        assert {"contexts", "partials", "finalize", "tables", "summary"} <= set(by[label]), label
        assert all(v >= 0 for v in by[label].values())
    assert "phases_other_threads" not in run  # one engine thread: every phase on the main thread


def test_a_planted_slow_phase_shows_where_it_is(ds, tmp_path, monkeypatch):
    from gpuclust.analyses.machine_shapes import MachineShapes
    from gpuclust.engine import reading

    finalize, read = MachineShapes.finalize, reading.read_partition

    def slow_finalize(self, *a, **k):
        time.sleep(SLOW)
        return finalize(self, *a, **k)

    def slow_read(*a, **k):
        time.sleep(SLOW / 4)
        return read(*a, **k)

    monkeypatch.setattr(MachineShapes, "finalize", slow_finalize)
    monkeypatch.setattr(reading, "read_partition", slow_read)
    run, wall = run_json(ds, tmp_path / "r", plots=False)
    ph, by = run["phases"], run["phases_by_analysis"]
    assert "plots" not in ph and sum(ph.values()) <= run["seconds"] + 0.01 <= wall + 0.02
    assert by["machine-shapes"]["finalize"] >= SLOW
    assert ph["finalize"] >= SLOW and ph["read"] >= SLOW  # 4 partitions or more read (two tables, and passes)
    ms = by["machine-shapes"]  # the planted analysis' other phases stay small
    assert max(ms["contexts"], ms["partials"], ms["tables"], ms["summary"]) < SLOW / 2


def test_nested_phases_count_once_other_threads_apart():
    with timing.clock() as c:
        with phase("contexts", "a"):
            time.sleep(0.05)
            with phase("read"):
                time.sleep(0.1)
        t = threading.Thread(target=_in_phase, args=("partials", 0.05))
        t.start()
        t.join()
        seen = []
        t = threading.Thread(target=lambda: seen.append(_run_on_another_thread()))
        t.start()
        t.join()
        assert seen == [None] and timing.current() is c  # a run on another thread meanwhile records none
        rec = c.record()
    assert timing.current() is None
    ph = rec["phases"]
    assert 0.05 <= ph["contexts"] < 0.1 and ph["read"] >= 0.1
    assert sum(ph.values()) <= rec["seconds"] + 0.002
    assert rec["phases_other_threads"]["partials"] >= 0.05 and "partials" not in ph
    assert rec["phases_by_analysis"]["a"]["contexts"] == ph["contexts"]
    assert rec["phases_by_analysis"]["a"]["partials"] >= 0.05
    with pytest.raises(ValueError, match="unknown phase"), timing.clock(), phase("loading"):
        pass


def _run_on_another_thread():
    with timing.clock():
        return timing.current()


def _in_phase(name, seconds):
    with phase(name, "a"):
        time.sleep(seconds)


def test_without_a_clock_nothing_is_recorded():
    assert timing.current() is None
    with phase("read"):
        pass
    assert timing.current() is None


def test_docs_list_every_phase():
    doc = (Path(__file__).parents[2] / "docs" / "analyses" / "README.md").read_text()
    missing = [p for p in PHASES if f"`{p}`" not in doc]
    assert not missing, missing
