"""Every command README.md and docs/*.md tell a user to run, run as written.

Each fenced ``bash`` / ``python`` block of a document is run, in document order, in a fresh
folder laid out as a checkout (``../shared`` beside it, where the real trace files live).  Two
kinds of block are not run here, each marked in the document itself by an HTML comment on the
line before the block, with the reason shown as the skip reason:

* ``<!-- not-run: REASON -->``: set-up commands that this test is itself run by (the README's two
  commands: CI runs the test command, tests/test_demo.py the main job) and device-tool sessions.

The only edits made to a command are the ones in :data:`SMALLER` (sizes, so that the whole file
runs in a minute or two).  On a machine without a GPU, a command that asks for ``--backend gpu``
must fail with the one-line "backend 'gpu' ..." error and no traceback; a Python block's
``backend="gpu"`` runs on the cpu.  A document that drifts from the code fails here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]

#: Size edits (applied to every block, bash and python): the documented sizes take minutes.
SMALLER = [
    (re.compile(r"--machines 200 --hours 6"), "--machines 20 --hours 1.5"),
    (re.compile(r"machines=200, hours=6"), "machines=20, hours=1.5"),
]

#: What a document's commands expect to find before its first block (commands run in the sandbox;
#: ``{raw}`` is the synthetic cell's raw export folder).
KAGGLE = "cp ../shared/data/real/kaggle-2019-sample/small_slice3.csv borg_traces_data.csv"
SETUP = {
    "README.md": [KAGGLE],
    "docs/formats-v2-kaggle.md": [KAGGLE],
    "docs/ingest.md": ["cp -r ../shared/data/real/2019-cell-a cell-a",
                       "ln -s ../shared/data/real/2011 2011",
                       "cp {raw}/instance_events-*.json.gz odd-name.bin",
                       # what `gsutil ls -l gs://clusterdata_2019_a/` prints, for the files copied above
                       "for f in cell-a/*; do printf '%10d  2019-06-01T00:00:00Z  gs://clusterdata_2019_a/%s\\n' "
                       "$(stat -c %s \"$f\") \"$(basename \"$f\")\"; done > cell-a.listing"],
}
#: Documents whose blocks read the synthetic dataset ``cell/ds`` without creating it.
NEEDS_CELL = {"docs/analyses.md", "docs/analysis-cpi.md", "docs/analysis-overcommit.md", "docs/analysis-usage-change.md", "docs/analysis-job-usage.md", "docs/analysis-usage-vs-request.md",
              "docs/analysis-machine-utilization.md", "docs/analysis-data-quality.md", "docs/analysis-peak-prediction.md",
              "docs/analysis-usage-distribution.md", "docs/gpu.md", "docs/dataset.md", "docs/engine.md",
              "docs/scale.md", "docs/report.md"}

FENCE = re.compile(r"^```(\w*)\s*$")
NOT_RUN = re.compile(r"<!--\s*not-run:\s*(.*?)\s*-->")


def blocks(doc: str) -> list[tuple[str, str, str | None, int]]:
    """``(language, text, not-run reason or None, line)`` of every bash/sh/python block."""
    out, lines = [], (ROOT / doc).read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m and m.group(1):
            lang, start = m.group(1), i
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            prev = next((lines[k] for k in range(start - 1, -1, -1) if lines[k].strip()), "")
            nr = NOT_RUN.search(prev)
            if lang in ("bash", "sh", "python"):
                out.append((lang, "\n".join(lines[start + 1:j]), nr.group(1) if nr else None, start + 1))
            i = j + 1
            continue
        i += 1
    return out


def commands(text: str) -> list[str]:
    """Logical shell commands of a block: comments and blank lines dropped, ``\\`` joined."""
    cmds, cur = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cmds.append(cur + line)
        cur = ""
    return cmds


def _gpu() -> bool:
    from gpuclust.backends import gpu_available

    return gpu_available()


def _smaller(text: str) -> str:
    for pat, rep in SMALLER:
        text = pat.sub(rep, text)
    return text


@pytest.fixture(scope="module")
def cell(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic cell, ingested: what the analysis docs read as ``cell/ds``."""
    d = tmp_path_factory.mktemp("cell")
    env = _env(d)
    for cmd in ("gpuclust synth --out cell/raw --machines 20 --hours 1.5 --seed 1",
                "gpuclust ingest cell/raw --out cell/ds"):
        r = subprocess.run(cmd, shell=True, cwd=d, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, (cmd, r.stdout[-2000:], r.stderr[-2000:])
    return d / "cell" / "ds"


def _env(sandbox: Path) -> dict[str, str]:
    bin_ = sandbox / ".bin"
    bin_.mkdir(exist_ok=True)
    shim = bin_ / "gpuclust"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m gpuclust "$@"\n')
    shim.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env.pop("GPUCLUST_REQUIRE_GPU", None)
    return env


@pytest.mark.slow
@pytest.mark.parametrize("doc", DOCS)
def test_documented_commands_run(doc: str, tmp_path: Path, cell: Path) -> None:
    found = blocks(doc)
    runnable = [b for b in found if b[2] is None]
    if not found:
        pytest.skip(f"{doc} has no bash/python blocks")
    if not (SHARED / "data" / "real").is_dir():
        pytest.skip(f"real trace files not found under {SHARED / 'data' / 'real'}")
    sandbox = tmp_path / "checkout"
    sandbox.mkdir()
    (tmp_path / "shared").symlink_to(SHARED)
    env = _env(sandbox)
    if doc in NEEDS_CELL:
        (sandbox / "cell").mkdir()
        shutil.copytree(cell, sandbox / "cell" / "ds")
    gpu = _gpu()
    for cmd in SETUP.get(doc, []):
        subprocess.run(cmd.format(raw=cell.parent / "raw"), shell=True, cwd=sandbox, env=env, check=True)
    for lang, text, _, line in runnable:
        text = _smaller(text)
        if lang == "python":
            code = text if gpu else text.replace('backend="gpu"', 'backend="cpu"')
            r = subprocess.run([sys.executable, "-c", code], cwd=sandbox, env=env, capture_output=True, text=True,
                               timeout=600)
            assert r.returncode == 0, f"{doc}:{line}: python block failed\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
            continue
        for cmd in commands(text):
            r = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=sandbox, env=env, capture_output=True,
                               text=True, timeout=600)
            where = f"{doc}:{line}: {cmd}"
            if "--backend gpu" in cmd and not gpu:
                assert r.returncode != 0 and "backend 'gpu'" in r.stderr and "Traceback" not in r.stderr, (
                    f"{where}: without a GPU this must fail with one clear line\n{r.stderr[-2000:]}")
                continue
            assert r.returncode == 0, f"{where}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
            assert "Traceback" not in r.stderr, f"{where}\n{r.stderr[-3000:]}"


def test_every_block_is_run_or_says_why() -> None:
    """A bash/python block is either run by the test above or marked not-run with a reason."""
    for doc in DOCS:
        for _lang, _, reason, line in blocks(doc):
            assert reason is None or reason.strip(), f"{doc}:{line}: a not-run marker needs a reason"
