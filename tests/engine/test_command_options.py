"""`gpuclust analyze -O NAME=VALUE`: options typed by the analyses' option fields, applied per analysis."""

from __future__ import annotations

import pytest

from gpuclust.engine.command import build_analyses


def test_options_are_typed_and_applied_where_declared() -> None:
    cu, oc = build_analyses(["cell-usage", "overcommit"], ["bucket_s=3600", "tier_map=v3-doc"], mode="exact")
    assert cu.mode == "exact" and cu.tier_map == "v3-doc"
    assert oc.bucket_s == 3600 and isinstance(oc.bucket_s, int) and oc.tier_map == "v3-doc"


def test_float_option() -> None:
    (cpi,) = build_analyses(["cpi"], ["cpi_max=50", "by=machine"])
    assert cpi.cpi_max == 50.0 and isinstance(cpi.cpi_max, float) and cpi.by == "machine"


@pytest.mark.parametrize(
    "opts, match",
    [
        (["bogus=1"], "no named analysis has option"),
        (["bucket_s"], "NAME=VALUE"),
        (["bucket_s=abc"], "option bucket_s"),
    ],
)
def test_bad_options_are_clear_errors(opts: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        build_analyses(["overcommit"], opts)
