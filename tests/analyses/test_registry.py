from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuclust.analyses import REGISTRY, capability_table, create, names
from gpuclust.analyses.cell_usage import CellUsage

DOCS = Path(__file__).resolve().parents[2] / "docs" / "analyses" / "README.md"


def test_docs_capability_table_is_generated():
    text = DOCS.read_text()
    m = re.search(r"<!-- capability-table:start -->\n(.*?)<!-- capability-table:end -->", text, re.S)
    assert m, "docs/analyses/README.md lacks the capability-table markers"
    assert m.group(1) == capability_table(), (
        "regenerate: python -c 'from gpuclust.analyses import capability_table as c; print(c())'"
    )


def test_create_and_options():
    assert names() == sorted(REGISTRY)
    assert create("cell-usage", mode="exact", tier_map="v3-doc") == CellUsage(mode="exact", tier_map="v3-doc")
    assert create("cell-usage", mode=None) == CellUsage()
    with pytest.raises(ValueError, match="unknown analysis"):
        create("nope")
    with pytest.raises(ValueError, match="no option"):
        create("machine-shapes", mode="exact")
    with pytest.raises(ValueError, match="cell-usage: option mode: expected one of notebook / exact, got 'fast'"):
        create("cell-usage", mode="fast")
    with pytest.raises(ValueError, match="cell-usage: option tier_map: expected one of notebook / "):
        create("cell-usage", tier_map="nope")


def test_analyses_are_frozen_and_hashable():
    a = CellUsage()
    with pytest.raises(AttributeError):
        a.mode = "exact"  # type: ignore[misc]
    assert hash(a) == hash(CellUsage())


def test_every_table_an_analysis_reads_is_declared():
    """The side inputs of every analysis, under each choice of each option, are among the tables
    it declares (``table``, ``requires``, ``optional_tables``): the capability table's "reads"
    column and ``gpuclust analyze``'s notes about absent tables come from those."""
    for name, entry in REGISTRY.items():
        declared = {entry.cls.table, *entry.cls.requires, *entry.cls.optional_tables}
        variants = [create(name)] + [
            create(name, **{o.name: c}) for o in entry.options for c in (o.choices or ()) if o.name != "tier_map"
        ]
        for a in variants:
            assert set(a.side_inputs) <= declared, (a.label, set(a.side_inputs) - declared)
