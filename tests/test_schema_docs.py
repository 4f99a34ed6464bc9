"""docs/user/dataset.md must document every canonical column and code, as `gpuclust.schema` defines them."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from gpuclust import schema
from gpuclust.tiers import tier_codes

DOC = (Path(__file__).resolve().parents[1] / "docs" / "user" / "dataset.md").read_text()


def _section(table: str) -> str:
    m = re.search(rf"^### `{table}`\n(.*?)(?=^### |\Z)", DOC, re.S | re.M)
    assert m, f"docs/user/dataset.md has no section for {table}"
    return m.group(1)


@pytest.mark.parametrize("table", schema.TABLES)
def test_every_column_documented_with_its_type(table: str) -> None:
    sec = _section(table)
    rows = {
        m.group(1): m.group(2) for m in re.finditer(r"^\| `([a-z_0-9]+)`(?: … `[a-z_0-9]+`)? \| ([^|]+) \|", sec, re.M)
    }
    for field in schema.SCHEMAS[table]:
        name = field.name
        if name.startswith("cpu_p"):
            assert name in sec, f"{table}.{name} not mentioned"
            continue
        assert name in rows, f"{table}.{name} has no row in docs/user/dataset.md"
        doc_type = rows[name].strip()
        arrow = {"float": "float32"}.get(str(field.type), str(field.type)).replace("list<item: int64>", "list<int64>")
        assert doc_type == arrow, f"{table}.{name}: docs say {doc_type}, schema says {arrow}"


def test_documented_columns_exist() -> None:
    for table in schema.TABLES:
        sec = _section(table)
        names = re.findall(r"^\| `([a-z_0-9]+)`", sec, re.M)
        assert set(names) <= set(schema.SCHEMAS[table].names), f"{table}: docs list unknown columns"


def test_code_tables_match_enums() -> None:
    for code, name in [(e.value, e.name) for e in schema.EventType]:
        assert f"| {code} | {name} |" in DOC
    for v2, v3 in enumerate(schema.V2_EVENT_TYPE_TO_V3):
        assert re.search(rf"^\| {int(v3)} \| {schema.EventType(v3).name} \| {v2} \|$", DOC, re.M)
    for v2, v3 in enumerate(schema.V2_MACHINE_EVENT_TO_V3):
        assert re.search(rf"^\| {int(v3)} \| {schema.MachineEventType(v3).name} \| {v2} \|$", DOC, re.M)
    for v2, v3 in enumerate(schema.V2_MISSING_TYPE_TO_V3):
        assert re.search(rf"^\| {int(v3)} \| {schema.MissingType(v3).name} \| {v2} \|$", DOC, re.M)


def test_tier_maps_documented_and_consistent() -> None:
    for tm in schema.TIER_MAPS.values():
        tiers = ", ".join(f"{n} {b}" for n, b in zip(tm.names, tm.bounds, strict=True))
        assert f"| `{tm.name}` | {tiers} |" in DOC
    nb = schema.tier_map("notebook")
    codes = tier_codes(np, nb, np.array([0, 99, 100, 115, 116, 119, 120, 359, 360, 450]))
    assert [nb.names[c] for c in codes] == ["free", "free", "beb", "beb", "mid", "mid", "prod", "prod", "prod", "prod"]
    with pytest.raises(ValueError, match="unknown tier map"):
        schema.tier_map("nope")


def test_percentile_column_order() -> None:
    assert schema.CPU_PERCENTILE_COLUMNS[:11] == tuple(f"cpu_p{p}" for p in range(0, 101, 10))
    assert schema.CPU_PERCENTILE_COLUMNS[11:] == tuple(f"cpu_p{p}" for p in range(91, 100))
    assert list(schema.CPU_PERCENTILE_LEVELS_SORTED) == sorted(schema.CPU_PERCENTILE_LEVELS_SORTED)
    assert len(set(schema.CPU_PERCENTILE_LEVELS_SORTED)) == 20
