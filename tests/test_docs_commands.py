"""Every command README.md and docs/**/*.md tell a user to run, run as written.

Each fenced ``bash`` / ``python`` block of a document is run, in document order, in a folder laid
out as a fresh checkout (``../shared`` beside it, where the real trace files live).  The README
runs first, in an empty folder, with nothing prepared: its tour must work as printed.  Every
other document then runs where a new user would run it, in a copy of the folder the README's
tour left (:func:`toured`): so its commands must not collide with the tour's folders, and the
analysis pages read the tour's cell ``cell/ds``.  Two kinds of block are not run here, each marked
in the document itself by an HTML comment on the line before the block, with the reason shown as
the skip reason:

* ``<!-- not-run: REASON -->``: set-up commands that this test is itself run by (the README's two
  commands: CI runs the test command; its main job's ``gpuclust demo`` is the tour's last
  command, run here as printed, and tests/test_demo.py checks its results) and device-tool
  sessions.

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
from run_once import once_per_run

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]

#: Size edits (applied to every block, bash and python): the documented sizes take minutes.
SMALLER = [
    (re.compile(r"--machines 200 --hours 6"), "--machines 20 --hours 1.5"),
    (re.compile(r"machines=200, hours=6"), "machines=20, hours=1.5"),
]

#: What a document's commands expect to find before its first block, standing in for a download
#: the document shows as a not-run ``gsutil`` block (commands run in the sandbox after the tour;
#: ``cell/raw`` is the tour's synthetic raw export folder).  The README has none: it runs as printed.
SETUP = {
    "docs/user/ingest.md": [
        "cp -r ../shared/data/real/2019-cell-a cell-a",
        "ln -s ../shared/data/real/2011 2011",
        "cp cell/raw/instance_events-*.json.gz odd-name.bin",
        # what `gsutil ls -l gs://clusterdata_2019_a/` prints, for the files copied above
        "for f in cell-a/*; do printf '%10d  2019-06-01T00:00:00Z  gs://clusterdata_2019_a/%s\\n' "
        '$(stat -c %s "$f") "$(basename "$f")"; done > cell-a.listing',
    ],
}
#: The README's main job (the block after ``<!-- main-command -->``) ends with this command, which its
#: tour runs as printed (``gpuclust demo`` writes ``gpuclust-demo`` unless told otherwise).
MAIN_DEMO = "gpuclust demo --out gpuclust-demo"
#: The tour's commands from this one on run in the README's own test (the demo takes most of the
#: README's time, and writes only its own folder); the other documents start from the folder the
#: commands before it left.
TOUR_END = re.compile(r"^gpuclust demo\b")

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
                out.append((lang, "\n".join(lines[start + 1 : j]), nr.group(1) if nr else None, start + 1))
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


def steps(doc: str) -> list[tuple[str, str, int]]:
    """``(language, command or python block, line)`` of every block of ``doc`` that runs, in order,
    with the :data:`SMALLER` edits."""
    out: list[tuple[str, str, int]] = []
    for lang, text, reason, line in blocks(doc):
        if reason is None:
            text = _smaller(text)
            out += [(lang, text, line)] if lang == "python" else [(lang, c, line) for c in commands(text)]
    return out


def _tour_split() -> int:
    """How many of the README's steps run before :data:`TOUR_END`."""
    s = steps("README.md")
    return next((i for i, (lang, text, _) in enumerate(s) if lang != "python" and TOUR_END.match(text)), len(s))


def _run(doc: str, lang: str, text: str, line: int, sandbox: Path, env: dict[str, str], gpu: bool) -> None:
    """Run one step of ``doc`` in ``sandbox``; fail with what it printed unless it succeeded (or,
    asked for ``--backend gpu`` on a machine without one, failed with one clear line)."""
    if lang == "python":
        code = text if gpu else text.replace('backend="gpu"', 'backend="cpu"')
        r = subprocess.run(
            [sys.executable, "-c", code], cwd=sandbox, env=env, capture_output=True, text=True, timeout=600
        )
        assert r.returncode == 0, f"{doc}:{line}: python block failed\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
        return
    r = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", text], cwd=sandbox, env=env, capture_output=True, text=True, timeout=600
    )
    where = f"{doc}:{line}: {text}"
    if "--backend gpu" in text and not gpu:
        assert r.returncode != 0 and "backend 'gpu'" in r.stderr and "Traceback" not in r.stderr, (
            f"{where}: without a GPU this must fail with one clear line\n{r.stderr[-2000:]}"
        )
        return
    assert r.returncode == 0, f"{where}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}"
    assert "Traceback" not in r.stderr, f"{where}\n{r.stderr[-3000:]}"


def _checkout(base: Path) -> Path:
    """``base/checkout``, with ``base/shared`` the real ``../shared``."""
    if not (SHARED / "data" / "real").is_dir():
        pytest.skip(f"real trace files not found under {SHARED / 'data' / 'real'}")
    (base / "shared").symlink_to(SHARED)
    return base / "checkout"


@pytest.fixture(scope="module")
def toured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder a new user has after the README's tour: an empty checkout folder in which the
    README's steps ran as printed, in order, up to :data:`TOUR_END` (which the README's test runs
    next, in a copy).

    The tour runs once per pytest run, whatever the number of xdist workers
    (:func:`run_once.once_per_run`): a worker that comes later uses the folder the first one left
    (tests only copy it); a tour that failed is run again, from an empty folder, and fails the
    same way."""

    def tour(base: Path) -> Path:
        sandbox = _checkout(base)
        sandbox.mkdir()
        env, gpu = _env(sandbox), _gpu()
        for lang, text, line in steps("README.md")[: _tour_split()]:
            _run("README.md", lang, text, line, sandbox, env, gpu)
        return sandbox

    return once_per_run(tmp_path_factory, "docs-tour", tour)


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
def test_documented_commands_run(doc: str, tmp_path: Path, toured: Path) -> None:
    """README.md: the rest of its steps after :func:`toured`'s, in a copy of that folder (so the
    whole README ran as printed from an empty folder).  Any other document: every step, after its
    :data:`SETUP`, in a copy of the folder the tour left."""
    if not blocks(doc):
        pytest.skip(f"{doc} has no bash/python blocks")
    sandbox = _checkout(tmp_path)
    shutil.copytree(toured, sandbox, symlinks=True)
    env, gpu = _env(sandbox), _gpu()
    todo = steps(doc)[_tour_split() :] if doc == "README.md" else steps(doc)
    for cmd in SETUP.get(doc, []):
        subprocess.run(cmd, shell=True, cwd=sandbox, env=env, check=True)
    for lang, text, line in todo:
        _run(doc, lang, text, line, sandbox, env, gpu)


def test_readme_runs_as_printed() -> None:
    """Nothing is prepared for the README (its tour reads only what a checkout and ``../shared``
    hold), its main job's command is the tour's last command, and the other documents start
    after the tour's commands, not instead of them."""
    assert "README.md" not in SETUP
    text = (ROOT / "README.md").read_text()
    main = text[text.index("<!-- main-command -->") :]
    main = main[main.index("```bash") + 7 : main.index("```", main.index("```bash") + 7)].strip()
    assert main.split("&&")[-1].strip() == ".venv/bin/gpuclust demo", main
    from gpuclust.cli import build_parser

    demo = build_parser("demo").parse_args(["demo"])
    assert MAIN_DEMO == f"gpuclust demo --out {demo.out}"
    tour = [t for lang, t, _ in steps("README.md") if lang == "bash"]
    assert any(t.split("#")[0].strip() == MAIN_DEMO for t in tour), tour
    assert 0 < _tour_split() < len(steps("README.md"))


def test_every_block_is_run_or_says_why() -> None:
    """A bash/python block is either run by the test above or marked not-run with a reason."""
    for doc in DOCS:
        for _lang, _, reason, line in blocks(doc):
            assert reason is None or reason.strip(), f"{doc}:{line}: a not-run marker needs a reason"


def _extras() -> tuple[set[str], dict[str, set[str]]]:
    """pyproject's dependencies and its extras' (distribution names, lower case, no versions)."""
    import tomllib

    def names(reqs: list[str]) -> set[str]:
        return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].strip().lower() for r in reqs}

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return names(project["dependencies"]), {k: names(v) for k, v in project["optional-dependencies"].items()}


def test_a_python_block_says_how_to_install_what_the_readme_does_not() -> None:
    """A python block that imports a package the README's ``pip install -e .`` does not install
    (DuckDB: only in the ``test`` / ``bench`` extras) is preceded, since the previous block, by
    the ``pip install`` that gets it: a user who followed the README runs it as printed."""
    import ast
    from importlib.metadata import packages_distributions

    core, extras = _extras()
    dist_of = packages_distributions()
    for doc in DOCS:
        lines = (ROOT / doc).read_text().splitlines()
        prev_end = 0
        for lang, text, reason, line in blocks(doc):
            before = "\n".join(lines[prev_end : line - 1])
            prev_end = line + len(text.splitlines()) + 1
            if lang != "python" or reason is not None:
                continue
            mods = {
                (n.module if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
                for n in ast.walk(ast.parse(text))
                if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in (n.names if isinstance(n, ast.Import) else [n])
                if getattr(n, "level", 0) == 0
            }
            for mod in sorted(mods - set(sys.stdlib_module_names) - {"gpuclust"}):
                dists = {d.lower() for d in dist_of.get(mod, [mod])}
                if dists & core:
                    continue
                ways = [f"pip install {d}" for d in dists] + [f".[{k}]" for k, v in extras.items() if dists & v]
                assert any(w in before for w in ways), (
                    f"{doc}:{line}: the block imports {mod}, which `pip install -e .` does not install; say how "
                    f"to get it before the block (one of {ways})"
                )
