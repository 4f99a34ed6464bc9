"""`gpuclust analyze --out`: checked before computing, every OS error one line, the folder written
as a whole per run (temp sibling + rename) with `_run.json`, files created with the umask."""

from __future__ import annotations

import errno
import json
import os
import stat

import pytest
from strategies import random_cell, write_dataset

import gpuclust.report.analyze as report_analyze
from gpuclust.cli import main


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return write_dataset(tmp_path_factory.mktemp("out_ds"), random_cell(5, n_machines=8, n_instances=40, n_windows=300))


def analyze(ds, out, *names, extra=()):
    return main(["analyze", str(ds), *(names or ("machine-shapes",)), "--out", str(out), "--quiet", *extra])


def one_line_error(capsys, *needles):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpuclust analyze: error: cannot write results to "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in err, err
    return err


@pytest.fixture
def no_compute(monkeypatch):
    """Fail the test if anything is computed (the output must be checked first)."""

    def boom(*a, **k):
        raise AssertionError("computed before the output path was checked")

    monkeypatch.setattr(report_analyze, "run", boom)


def no_temp_siblings(out):
    return not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.gpuclust-")]


def test_out_is_a_file(ds, tmp_path, capsys, no_compute):
    f = tmp_path / "file"
    f.write_text("x")
    assert analyze(ds, f) == 2
    one_line_error(capsys, str(f), "exists and is not a folder")
    assert analyze(ds, f / "sub") == 2
    one_line_error(capsys, str(f / "sub"), f"{f} is not a folder")


def test_read_only_folder(ds, tmp_path, capsys, monkeypatch, no_compute):
    real_mkdir = os.mkdir

    def ro(path, *a, **k):
        if ".gpuclust-tmp-" in str(path):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_mkdir(path, *a, **k)

    monkeypatch.setattr(os, "mkdir", ro)
    assert analyze(ds, tmp_path / "r") == 2
    one_line_error(capsys, str(tmp_path / "r"), "Read-only file system")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_folder_for_real(ds, tmp_path, capsys, no_compute):
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o555)
    try:
        assert analyze(ds, d / "r") == 2
        one_line_error(capsys, "Permission denied")
    finally:
        d.chmod(0o755)


def test_not_a_results_folder_is_refused(ds, tmp_path, capsys, no_compute):
    (tmp_path / "notes.txt").write_text("mine")
    assert analyze(ds, tmp_path) == 2
    one_line_error(capsys, "not gpuclust results")
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert analyze(ds, ds) == 2  # the dataset itself
    one_line_error(capsys, "not gpuclust results")


def test_disk_full_leaves_previous_results(ds, tmp_path, capsys, monkeypatch):
    out = tmp_path / "r"
    assert analyze(ds, out) == 0
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    capsys.readouterr()
    from gpuclust.report import rendering

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(rendering.pq, "write_table", full)
    assert analyze(ds, out, "machine-shapes", "cell-usage") == 2
    one_line_error(capsys, str(out), "No space left on device")
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert no_temp_siblings(out)


def test_killed_run_leaves_previous_results(ds, tmp_path, monkeypatch):
    out = tmp_path / "r"
    assert analyze(ds, out, "machine-shapes", "cell-usage") == 0
    run1 = json.loads((out / "_run.json").read_text())
    import gpuclust.report.plots as plots

    def killed(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(plots, "plot_result", killed)  # after the Parquet files, before the plots / summary
    with pytest.raises(KeyboardInterrupt):
        analyze(ds, out, "cell-usage", extra=("--mode", "exact"))
    assert json.loads((out / "_run.json").read_text()) == run1 and no_temp_siblings(out)


def test_each_run_replaces_the_folder(ds, tmp_path):
    out = tmp_path / "r"
    assert analyze(ds, out, "cell-usage", "machine-shapes") == 0
    (out / "cell-usage" / "stale.png").write_bytes(b"old")
    assert analyze(ds, out, "machine-shapes", extra=("--no-plots",)) == 0
    run = json.loads((out / "_run.json").read_text())
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == run["files"] == ["_run.json", "machine-shapes/shapes.parquet", "summary.txt"]
    assert run["dataset"] == str(ds) and run["backend"] == "cpu" and run["backend_requested"] == "cpu"
    assert [a["key"] for a in run["analyses"]] == ["machine-shapes"] and run["gpuclust_version"]
    assert run["started"] <= run["finished"]
    assert no_temp_siblings(out)


def test_dead_runs_temp_folders_are_swept(ds, tmp_path):
    out = tmp_path / "r"
    dead = tmp_path / ".r.gpuclust-tmp-999999999-abcd"  # no such pid
    dead.mkdir()
    (dead / "summary.txt").write_text("half")
    assert analyze(ds, out) == 0
    assert not dead.exists()


def test_files_get_the_umask(ds, tmp_path):
    old = os.umask(0o022)
    try:
        assert analyze(ds, tmp_path / "r", "machine-shapes", "cell-usage") == 0
    finally:
        os.umask(old)
    out = tmp_path / "r"
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    for p in out.rglob("*"):
        assert stat.S_IMODE(p.stat().st_mode) == (0o755 if p.is_dir() else 0o644), p
    assert (out / "cell-usage" / "cell-usage.png").is_file()


def test_python_api_writes_the_same_folder(ds, tmp_path):
    out = tmp_path / "api"
    report_analyze.analyze(ds, ["machine-shapes"], out=out)
    assert json.loads((out / "_run.json").read_text())["analyses"][0]["name"] == "machine-shapes"
    from gpuclust.report import OutputError

    with pytest.raises(OutputError, match="exists and is not a folder"):
        report_analyze.analyze(ds, ["machine-shapes"], out=out / "_run.json")


def test_link_to_a_results_folder_stays_a_link(ds, tmp_path):
    target = tmp_path / "big" / "results"
    assert analyze(ds, target, "cell-usage") == 0
    link = tmp_path / "results"
    link.symlink_to(target)
    assert analyze(ds, link) == 0
    assert link.is_symlink() and not (target / "cell-usage").exists()
    assert json.loads((link / "_run.json").read_text())["analyses"][0]["name"] == "machine-shapes"
