"""tests/run_once.py: work shared by the workers of a pytest run is built once, rebuilt after a
failed build, and made read-only when asked."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from run_once import once_per_run, run_folder


def test_built_once_rebuilt_after_a_failure_and_read_only(tmp_path_factory: pytest.TempPathFactory) -> None:
    built: list[Path] = []

    def fails(d: Path) -> Path:
        (d / "half").write_text("left by a failed build")
        os.chmod(d, 0o555)  # even a read-only leftover is cleared before the next build
        raise RuntimeError("build failed")

    def builds(d: Path) -> Path:
        assert not list(d.iterdir()), "a failed build's files are removed first"
        built.append(d)
        (d / "out" / "sub").mkdir(parents=True)
        (d / "out" / "sub" / "f").write_text("x")
        return d / "out"

    with pytest.raises(RuntimeError, match="build failed"):
        once_per_run(tmp_path_factory, "run-once-test", fails)
    out = once_per_run(tmp_path_factory, "run-once-test", builds, read_only=True)
    again = once_per_run(tmp_path_factory, "run-once-test", lambda d: pytest.fail("built a second time"))
    assert (
        again == out and built == [out.parent] and out.parent.parent == run_folder(tmp_path_factory) / "run-once-test"
    )
    for p in (out, out / "sub", out / "sub" / "f"):
        assert stat.S_IMODE(p.stat().st_mode) & 0o222 == 0, p
    assert (out / "sub" / "f").read_text() == "x"
