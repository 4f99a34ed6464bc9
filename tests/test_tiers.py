"""gpuclust.tiers: the one place that resolves an analysis' tier map, maps priorities to tier codes
(on NumPy and CuPy alike) and names the tiers (tests/test_code_rules.py keeps copies out)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from gpuclust.schema import TIER_MAPS, tier_map
from gpuclust.tiers import TierNames, resolve_tier_map, tier_codes, tier_names

#: (tier map, priority, tier name; None: unknown) at and beside every bound of the named maps
CASES = [
    ("notebook", -1, None),
    ("notebook", 0, "free"),
    ("notebook", 99, "free"),
    ("notebook", 100, "beb"),
    ("notebook", 115, "beb"),
    ("notebook", 116, "mid"),
    ("notebook", 119, "mid"),
    ("notebook", 120, "prod"),
    ("notebook", 450, "prod"),
    ("v3-doc", 99, "free"),
    ("v3-doc", 100, "mid"),
    ("v3-doc", 119, "mid"),
    ("v3-doc", 120, "prod"),
    ("v3-doc", 200, "prod"),
    ("v3-doc", 201, "monitoring"),
    ("seed-002", 115, "beb"),
    ("seed-002", 359, "prod"),
    ("seed-002", 360, "monitoring"),
    ("v2", -3, None),
    ("v2", 0, "free"),
    ("v2", 1, "free"),
    ("v2", 2, "middle"),
    ("v2", 8, "middle"),
    ("v2", 9, "prod"),
    ("v2", 11, "prod"),
]


def _names(tm_name: str, codes: np.ndarray) -> list[str | None]:
    names = TIER_MAPS[tm_name].names
    return [names[c] if c != 99 else None for c in codes.tolist()]


@pytest.mark.parametrize("tm_name", sorted(TIER_MAPS))
def test_tier_codes_of_integer_and_float_priorities(tm_name: str) -> None:
    cases = [(p, want) for name, p, want in CASES if name == tm_name]
    tm = tier_map(tm_name)
    prio = np.array([p for p, _ in cases], np.int64)
    want = [w for _, w in cases]
    got = tier_codes(np, tm, prio, unknown=99)
    assert got.dtype == np.int64
    assert _names(tm_name, got) == want
    # float priorities (NULL read as NaN): the same codes, NaN unknown, a fraction truncated
    fp = np.concatenate([prio.astype(np.float64), [np.nan, prio.max() + 0.75]])
    got = tier_codes(np, tm, fp, unknown=99)
    assert _names(tm_name, got) == [*want, None, want[int(np.argmax(prio))]]


def test_tier_codes_default_unknown_is_minus_one() -> None:
    assert tier_codes(np, tier_map("notebook"), np.array([-5, 0, 120])).tolist() == [-1, 0, 3]
    assert tier_codes(np, tier_map("notebook"), np.zeros(0)).shape == (0,)


def test_tier_codes_on_the_gpu_match_numpy(gpu_backend) -> None:  # type: ignore[no-untyped-def]
    xp = gpu_backend.xp
    rng = np.random.default_rng(0)
    prio = rng.integers(-2, 460, 5000).astype(np.float64)
    prio[rng.random(5000) < 0.1] = np.nan
    for tm in TIER_MAPS.values():
        want = tier_codes(np, tm, prio, unknown=len(tm.names))
        got = tier_codes(xp, tm, xp.asarray(prio), unknown=len(tm.names))
        assert np.array_equal(gpu_backend.to_host(got), want), tm.name


def test_resolve_tier_map_option_then_manifest_then_trace_version() -> None:
    both = SimpleNamespace(tier_map_name="seed-002", trace_version="v2")
    assert resolve_tier_map("v3-doc", both).name == "v3-doc"
    assert resolve_tier_map(None, both).name == "seed-002"
    assert resolve_tier_map(None, SimpleNamespace(tier_map_name=None, trace_version="v2")).name == "v2"
    assert resolve_tier_map(None, SimpleNamespace(tier_map_name=None, trace_version="v3")).name == "notebook"
    assert resolve_tier_map(None, object()).name == "notebook"  # a source that knows neither
    with pytest.raises(ValueError, match="unknown tier map"):
        resolve_tier_map("nope", both)


def test_tier_names_end_with_unknown() -> None:
    nb = tier_map("notebook")
    assert tier_names(nb) == ("free", "beb", "mid", "prod", "unknown")
    assert tier_names(nb, unknown=False) == nb.names
    assert tier_names(None) == ("unknown",)

    class Ctx(TierNames):
        def __init__(self, tm: object, unknown: bool = True) -> None:
            self.tier_map = tm  # type: ignore[assignment]
            self.unknown = unknown

        def has_unknown_tier(self) -> bool:
            return self.unknown

    assert Ctx(nb).tier_names == tier_names(nb)
    assert Ctx(nb, unknown=False).tier_names == nb.names
    assert Ctx(None).tier_names == ("unknown",)


def test_check_tier_slots_passes_a_map_that_fits_and_names_the_analysis_otherwise() -> None:
    from gpuclust.schema import TierMap
    from gpuclust.tiers import TIER_SLOTS, check_tier_slots

    tm = tier_map("notebook")
    assert check_tier_slots("x", tm) is tm
    most = TierMap("most", tuple(f"t{k}" for k in range(TIER_SLOTS - 1)), tuple(range(TIER_SLOTS - 1)), "")
    assert check_tier_slots("x", most) is most
    over = TierMap("over", (*most.names, "extra"), (*most.bounds, 99), "")
    with pytest.raises(ValueError, match=f"^lifecycle: tier map 'over' has more than {TIER_SLOTS - 1} tiers$"):
        check_tier_slots("lifecycle", over)
    with pytest.raises(ValueError, match="^cell-usage: tier map 'notebook' has more than 3 tiers$"):
        check_tier_slots("cell-usage", tm, 4)
