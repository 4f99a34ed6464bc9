"""The simulation's tables as v3 JSON export lines.

The event tables (machine_events, machine_attributes, collection_events, instance_events) from a
run :class:`gpuclust.synth.model.Model`, and the instance_usage rows of a block of usage windows
(vectorised, :func:`format_usage`).
"""

from __future__ import annotations

import numpy as np

from gpuclust.synth import model as _model
from gpuclust.synth import usage as _usage
from gpuclust.synth.export import F, LineBuilder, _value, fmt_float, json_line

# ---------------------------------------------------------------------------------------------
# event tables
# ---------------------------------------------------------------------------------------------


def _res(c: int, m: int) -> dict:
    return {"cpus": F(c / _model.UNIT, 6), "memory": F(m / _model.UNIT, 6)}


def _machine_lines(md: _model.Model) -> list[str]:
    lines = []
    for t, m, typ, cc, cm in sorted(md.machine_events, key=lambda e: e[0]):
        lines.append(
            json_line(
                {
                    "time": t,
                    "machine_id": int(md.m_id[m]),
                    "type": int(typ),
                    "switch_id": md.switch_ids[md.m_switch[m]],
                    "capacity": None if md.m_null_cap[m] else _res(cc, cm),
                    "platform_id": md.platform_ids[md.m_platform[m]],
                }
            )
        )
    return lines


def _attr_lines(md: _model.Model) -> list[str]:
    return [
        json_line({"time": t, "machine_id": int(md.m_id[m]), "name": name, "value": value, "deleted": deleted})
        for t, m, name, value, deleted in sorted(md.machine_attrs, key=lambda e: e[0])
    ]


def _coll_lines(md: _model.Model) -> list[str]:
    colls = md.colls
    lines = []
    for t, typ, ci, missing in sorted(md.coll_events, key=lambda e: e[0]):
        c = colls[ci]
        lines.append(
            json_line(
                {
                    "time": t,
                    "type": int(typ),
                    "collection_id": c.cid,
                    "scheduling_class": c.sclass,
                    "missing_type": missing or None,
                    "collection_type": c.ctype,
                    "priority": c.prio,
                    "alloc_collection_id": colls[c.alloc_set].cid if c.alloc_set >= 0 else None,
                    "user": c.user,
                    "collection_name": c.name,
                    "collection_logical_name": c.lname,
                    "parent_collection_id": colls[c.parent].cid if c.parent >= 0 else None,
                    "start_after_collection_ids": [colls[x].cid for x in c.start_after] or None,
                    "max_per_machine": c.max_pm or None,
                    "max_per_switch": c.max_ps or None,
                    "vertical_scaling": c.vscale,
                    "scheduler": c.scheduler,
                }
            )
        )
    return lines


def _inst_lines(md: _model.Model) -> list[str]:
    """instance_events lines; same encoding as :func:`json_line`, with per-collection pieces cached."""
    colls = md.colls
    cons = []
    for spec, _mask in md.constraint_kinds:
        cons.append(_value([{"name": n, "value": v, "relation": r} for n, v, r in spec]))
    head: dict[int, tuple[str, str, str]] = {}
    fl: dict[int, str] = {}

    def f6(v: int) -> str:
        x = fl.get(v)
        if x is None:
            x = fl[v] = fmt_float(v / _model.UNIT, 6)
        return x

    mids = [str(int(x)) for x in md.m_id]
    lines = []
    for t, typ, ci, index, machine, rc, rm, ai, missing in sorted(md.inst_events, key=lambda e: e[0]):
        h = head.get(ci)
        if h is None:
            c = colls[ci]
            alloc = f',"alloc_collection_id":"{colls[c.alloc_set].cid}"' if c.alloc_set >= 0 else ""
            h = head[ci] = (
                f'","collection_id":"{c.cid}","scheduling_class":"{c.sclass}"',
                f',"collection_type":"{c.ctype}","priority":"{c.prio}"{alloc},"instance_index":"',
                f',"constraint":{cons[c.constraint]}}}\n' if c.constraint >= 0 else "}\n",
            )
        mt = f',"missing_type":"{missing}"' if missing else ""
        mach = f',"machine_id":"{mids[machine]}"' if machine >= 0 else ""
        aidx = f',"alloc_instance_index":"{ai}"' if ai >= 0 else ""
        lines.append(
            f'{{"time":"{t}","type":"{int(typ)}{h[0]}{mt}{h[1]}{index}"{mach}{aidx},'
            f'"resource_request":{{"cpus":{f6(rc)},"memory":{f6(rm)}}}{h[2]}'
        )
    return lines


# ---------------------------------------------------------------------------------------------
# usage rows -> JSON lines (vectorised)
# ---------------------------------------------------------------------------------------------


def format_usage(cols: dict[str, np.ndarray], sl: slice) -> tuple[bytes, np.ndarray]:
    """instance_usage JSON lines for rows ``sl`` of a block."""
    g = {k: (v[sl] if isinstance(v, np.ndarray) and v.ndim >= 1 else v) for k, v in cols.items()}
    n = g["start_time"].size
    b = LineBuilder(n)
    d = _usage.DEC_USAGE
    b.raw("{")
    b.field_int("start_time", g["start_time"], first=True)
    b.field_int("end_time", g["end_time"])
    b.field_int("collection_id", g["collection_id"])
    b.field_int("instance_index", g["instance_index"])
    b.field_int("machine_id", g["machine_id"])
    b.field_int("alloc_collection_id", g["alloc_collection_id"])
    ia = g["in_alloc"]
    b.field_int("alloc_instance_index", np.where(ia, g["alloc_instance_index"], 0), mask=ia)
    b.field_int("collection_type", g["collection_type"])
    b.raw(',"average_usage":{"cpus":')
    b.floats(g["avg_cpu"], d)
    b.raw(',"memory":')
    b.floats(g["avg_mem"], d)
    b.raw("}")
    has_max = ~g["max_missing"]
    b.raw(',"maximum_usage":{"cpus":', mask=has_max)
    b.floats(g["max_cpu"], d, mask=has_max)
    b.raw(',"memory":', mask=has_max)
    b.floats(g["max_mem"], d, mask=has_max)
    b.raw("}", mask=has_max)
    b.raw(',"random_sample_usage":{"cpus":')
    b.floats(g["sample_cpu"], d)
    b.raw("}")
    b.field_float("assigned_memory", g["assigned_mem"], d)
    b.field_float("page_cache_memory", g["page_cache_mem"], d)
    hc = g["has_cpi"]
    b.field_float("cycles_per_instruction", np.where(hc, g["cpi"], 0.0), _usage.DEC_CPI, mask=hc)
    b.field_float("memory_accesses_per_instruction", np.where(hc, g["mai"], 0.0), d, mask=hc)
    b.field_float("sample_rate", g["sample_rate"], _usage.DEC_RATE)
    pct = g["pct"]
    b.float_list("cpu_usage_distribution", pct[:, :11], d)
    b.float_list("tail_cpu_usage_distribution", pct[:, 11:], d)
    b.raw("}\n")
    return b.build()
