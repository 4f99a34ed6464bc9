"""Shared fixtures: the ``backend`` fixture runs a test on ``cpu`` and (marked ``gpu``) on ``gpu``.

The gpu case is skipped when CuPy or a CUDA device is missing, unless ``GPUCLUST_REQUIRE_GPU=1``,
which turns a missing GPU into a failure (set it on GPU CI machines so GPU tests cannot silently
skip).  ``real_2011`` is the real 2011 parts, ingested once per pytest run and read-only.

Hypothesis runs under one of three profiles, chosen by ``GPUCLUST_HYPOTHESIS_PROFILE`` (or
pytest's ``--hypothesis-profile``), and printed in the pytest header: ``ci`` (the default, so
the README's test command and CI use it), ``dev`` (the counts written at each test) and
``thorough`` (five times those, for nightly or hand runs).  A test asks for its count through
:func:`strategies.examples`, which scales it by the profile.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `import strategies`

from run_once import once_per_run  # noqa: E402 (needs the path above)
from strategies import EXAMPLES_AT, PROFILE_ENV  # noqa: E402 (needs the path above)

#: The real trace files (``../shared/data/real``, beside the checkout).
REAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real"

#: Each profile's ``max_examples`` is its scale: :func:`strategies.examples` multiplies a test's
#: own count by ``max_examples / EXAMPLES_AT`` (the ``dev`` profile's, which keeps every count).
#: ``ci``: half of each count (at least 20, or the count itself when smaller), no deadline (a
#: shared 2-core machine's timing is noise) and the failing example's blob printed, to replay it.
settings.register_profile("ci", max_examples=EXAMPLES_AT // 2, deadline=None, print_blob=True)
settings.register_profile("dev", max_examples=EXAMPLES_AT)
settings.register_profile("thorough", max_examples=EXAMPLES_AT * 5, deadline=None, print_blob=True)
settings.load_profile(os.environ.get(PROFILE_ENV, "ci"))


def pytest_configure(config: pytest.Config) -> None:
    """Byte-compile gpuclust once, in the controlling process before any worker starts, as an
    installed package is: an editable install under ``PYTHONDONTWRITEBYTECODE`` (CI's
    environment) has no ``.pyc``, so each of the suite's few hundred ``python -m gpuclust``
    subprocesses (the documents' commands, the benches, the device-check rehearsal) compiled
    the modules it imports again (0.15-0.3 s each, 0.4 s for all of gpuclust).  The benches'
    modules (which their child processes import) and the tests' references, likewise."""
    if not hasattr(config, "workerinput"):
        import compileall

        root = Path(__file__).resolve().parents[1]
        compileall.compile_dir(str(root / "gpuclust"), quiet=1)
        compileall.compile_dir(str(root / "bench"), maxlevels=0, quiet=1)
        compileall.compile_dir(str(root / "tests" / "references"), quiet=1)


def pytest_report_header(config: pytest.Config) -> str:
    from strategies import examples

    name = config.getoption("hypothesis_profile", None) or os.environ.get(PROFILE_ENV, "ci")
    return (
        f"hypothesis profile: {name} (ci, dev or thorough: {PROFILE_ENV}); a test's 100 examples run as {examples(100)}"
    )


def _require_gpu() -> bool:
    return os.environ.get("GPUCLUST_REQUIRE_GPU", "") == "1"


#: Why the gpu backend is unavailable in this process, once a try found it: the ~400 gpu cases of a
#: run without a device skip on it instead of each trying again (~20 ms: the installed
#: distributions are read again each time).  A backend found is never remembered here.
_GPU_MISSING: list[str] = []


def gpu_backend_or_skip():  # type: ignore[no-untyped-def]
    from gpuclust.backends import BackendUnavailable, get_backend

    if not _GPU_MISSING:
        try:
            return get_backend("gpu")
        except BackendUnavailable as e:  # the real cause (import error, warning, no device) is in e
            _GPU_MISSING.append(f"gpu backend unavailable: {e}")
    msg = _GPU_MISSING[0]
    if _require_gpu():
        pytest.fail(msg + " (GPUCLUST_REQUIRE_GPU=1)")
    pytest.skip(msg)


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def backend(request):  # type: ignore[no-untyped-def]
    """A :class:`gpuclust.backends.Backend`: cpu, then gpu (skipped without a device)."""
    from gpuclust.backends import get_backend

    if request.param == "gpu":
        return gpu_backend_or_skip()
    return get_backend("cpu")


@pytest.fixture
def gpu_backend():  # type: ignore[no-untyped-def]
    """The gpu backend (skipped without a device, or failing under GPUCLUST_REQUIRE_GPU=1)."""
    return gpu_backend_or_skip()


@pytest.fixture(scope="session")
def real_2011(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real 2011 parts (machine, task and job events) through the public ingest, once per
    pytest run (:func:`run_once.once_per_run`): the dataset's folder, read-only (copy it to change
    it).  Skipped where the real trace files are missing."""
    if not (REAL / "2011").is_dir():
        pytest.skip(f"real trace files not found at {REAL}")

    def build(folder: Path) -> Path:
        from gpuclust.ingest import ingest

        rep = ingest(
            [REAL / "2011" / t for t in ("machine_events", "task_events", "job_events")], folder / "ds", progress=False
        )
        assert rep.exit_status == 0, rep.summary()
        return folder / "ds"

    return once_per_run(tmp_path_factory, "real-2011", build, read_only=True)


@pytest.fixture(scope="session")
def synth_cell_40(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``gpuclust synth`` of a small cell (40 machines x 3 h, seed 5), once per pytest run
    (:func:`run_once.once_per_run`): a folder with its raw v3 shards (``raw``) and their ingest
    (``ds``; what it planted in its manifest's ``synthetic``).  Read it; copy it to change it."""

    def build(folder: Path) -> Path:
        from gpuclust.synth import SynthConfig, synthesize

        synthesize(SynthConfig(machines=40, hours=3, seed=5), folder / "raw", dataset=folder / "ds", progress=None)
        return folder

    return once_per_run(tmp_path_factory, "synth-cell-40", build)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests marked ``slow`` first, then the rest, each in collection order: with ``--dist
    worksteal`` a run ends on short tests, not with one worker idle while the other finishes a long
    one (2-core VM, whole suite, two pairs of runs: 464 s against 480, 501 against 516).  Moving
    whole modules with a slow test instead measured no better (490 s)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
