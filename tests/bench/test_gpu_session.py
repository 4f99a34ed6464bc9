"""bench/gpu_session.sh: the device calls docs/user/gpu.md gives fit their timeouts and the session's
device time, and an unknown step is refused (no GPU needed: ``--plan`` runs nothing)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_session.sh"
SESSION_DEVICE_S = 15 * 60  # device time of a session, the machine's start included
START_S = 120  # a machine's start, at the upper end seen
COMMAND_S = 600  # one command's limit
LAST_CALL_MIN_S = 180  # device time left, at the least, for a session's last call


def plan(*steps: str) -> tuple[int, str]:
    r = subprocess.run(["bash", str(SCRIPT), "--plan", *steps], capture_output=True, text=True, timeout=30)
    return r.returncode, r.stdout


def documented_calls() -> list[tuple[list[str], int]]:
    text = (ROOT / "docs" / "user" / "gpu.md").read_text()
    calls = re.findall(r"^(?:\S+=\S+ )*bash bench/gpu_session\.sh ([\w -]+?)\s+# call \d+: timeout_s (\d+)", text, re.M)
    return [(steps.split(), int(t)) for steps, t in calls]


def test_documented_calls_fit_their_timeouts_and_the_session() -> None:
    """Each call's timeout covers its steps' limits and one command's limit; the calls come in order
    of priority, and all but the last fit the session with a start at its slowest and leave the last
    at least LAST_CALL_MIN_S (the device tool cuts a call at the session's end, and a step's log
    comes back as far as it got)."""
    calls = documented_calls()
    assert len(calls) >= 2, "docs/user/gpu.md lists the calls of a device session"
    for steps, timeout_s in calls:
        rc, out = plan(*steps)
        assert rc == 0, out
        planned = int(re.search(r"^total (\d+)$", out, re.M).group(1))
        assert planned == sum(int(line.split()[1]) for line in out.splitlines()[:-1])
        assert planned <= timeout_s <= COMMAND_S, (steps, planned, timeout_s)
    before_last = START_S + sum(t for _, t in calls[:-1])
    assert before_last + LAST_CALL_MIN_S <= SESSION_DEVICE_S, f"the calls before the last take up to {before_last} s"
    # correctness first: the GPU tests (and the sanitizers) are in the first call
    assert "tests-all" in calls[0][0] or "tests" in calls[0][0]


@pytest.mark.parametrize(
    "step", ["env", "tests", "tests-all", "sanitize", "kernels", "study", "mixture", "moments", "profile", "analyses"]
)
def test_every_step_has_a_limit_under_a_command(step: str) -> None:
    rc, out = plan(step)
    assert rc == 0 and 0 < int(out.split()[1]) <= COMMAND_S - 30


def test_unknown_step_is_refused() -> None:
    rc, out = plan("env", "nonsense")
    assert rc == 2 and "unknown step nonsense" in out
