"""bench/results/ keeps one current result per benchmark (history lives in git): at most 40 files
outside the device runs' folders, each cited by the docs or the README."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
#: A device run's folder: the accelerator and the day (``h200-2026-11-28``), kept whole.
DEVICE_RUN = re.compile(r"[a-z]+\d+-\d{4}-\d{2}-\d{2}")


def kept_results() -> list[str]:
    """The files of bench/results/ outside device runs' folders, relative to it: those git tracks
    (``bench/results/tmp/`` is ignored scratch), or, outside a git checkout, those on disk but
    ``tmp/``."""
    git = shutil.which("git")
    out = subprocess.run([git, "ls-files", "bench/results"], cwd=ROOT, capture_output=True, text=True) if git else None
    if out is not None and out.returncode == 0 and out.stdout.strip():
        files = [Path(line).relative_to("bench/results") for line in out.stdout.splitlines()]
    else:
        files = [p.relative_to(RESULTS) for p in RESULTS.rglob("*") if p.is_file()]
        files = [f for f in files if f.parts[0] != "tmp"]
    return sorted(str(f) for f in files if not (len(f.parts) > 1 and DEVICE_RUN.fullmatch(f.parts[0])))


def cited(text: str, name: str) -> bool:
    """``bench/results/<name>`` in ``text`` as a path of the tree (not ``git show REV:bench/...``,
    which cites history)."""
    return re.search(rf"(?<![:\w])bench/results/{re.escape(name)}(?![\w.-])", text) is not None


def test_results_folder_is_small_and_every_file_is_cited():
    """At most 40 kept files; each cited by README.md or a page under docs/, a JSON also through
    its Markdown, which the benchmark renders from it."""
    docs = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))])
    files = kept_results()
    assert 0 < len(files) <= 40, files
    uncited = [
        f
        for f in files
        if not cited(docs, f)
        and not (f.endswith(".json") and f[: -len(".json")] + ".md" in files and cited(docs, f[:-5] + ".md"))
    ]
    assert not uncited, f"not cited by README.md or docs/: {uncited}"
    assert not [f for f in files if "/" in f], "results outside a device run's folder lie at the top of bench/results/"


def test_cited_helper():
    assert cited("see `bench/results/scale.md`.", "scale.md")
    assert cited("[x](../../bench/results/scale.md)", "scale.md")
    assert not cited("`git show 74d5fa5:bench/results/scale.md`", "scale.md")
    assert not cited("bench/results/scale.md.bak", "scale.md")
    assert not cited("bench/results/scale_data_quality.md", "scale")
