"""The local engine's merge of keyed partials: dask's tree against a running fold.

    python bench/merge_tree_bench.py                          # 64, 256 and 1,024 partitions
    python bench/merge_tree_bench.py --partitions 64,256 --keys 1280000 --name merge_tree

A whole-cell run over a bucketed layout has thousands of partitions, and partials keyed by what
their bucket holds (job-usage's collections, machine-utilization's and cpi's machines): each
partition's keys are new to the merge.  A running fold (``acc = merge(acc, p)`` per partition,
the local path before 2026-11-27) moves the whole accumulator at every partition, O(keys x
partitions); :class:`gpuclust.engine.tasks.MergeTree` (the dask path's tree, fan-in 8) moves
each key about log8(partitions) times.  Each row here: ``--keys`` distinct collection keys spread
over the partitions, job-usage's ``kinds.merge`` (its partial fields), both ways in one process (the
best of ``--repeat`` runs, after a first, untimed run of each that measures its working memory);
the two results are checked equal.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _harness import publish, working_set  # noqa: E402


def partials(n_parts: int, keys: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """``n_parts`` job-usage partials over disjoint random collection ids, ``keys`` in all."""
    from gpuclust.analyses.job_usage import JobUsage

    rng = np.random.default_rng(seed)
    ids = rng.choice(1 << 40, keys, replace=False).astype(np.int64)
    out = []
    for chunk in np.array_split(ids, n_parts):
        m = chunk.shape[0]
        p = JobUsage().empty()
        p.update(
            key=np.sort(chunk),
            cpu=rng.random(m),
            mem=rng.random(m),
            windows=np.ones(m, np.int64),
            prio=rng.integers(0, 400, m).astype(np.int64),
        )
        out.append(p)
    return out


def measure(n_parts: int, keys: int, repeat: int) -> dict[str, Any]:
    from gpuclust.analyses.job_usage import JobUsage
    from gpuclust.engine.tasks import MergeTree

    a = JobUsage()
    parts = partials(n_parts, keys)

    def fold() -> dict[str, np.ndarray]:
        acc = parts[0]
        for p in parts[1:]:
            acc = a.kinds.merge(acc, p)
        return acc

    def tree() -> dict[str, np.ndarray]:
        t = MergeTree(a.kinds.merge, 8)
        for p in parts:
            t.add(p)
        return t.result()

    best: dict[str, float] = {}
    got: dict[str, dict[str, np.ndarray]] = {}
    work = {name: working_set(fn)[1] for name, fn in (("fold", fold), ("tree", tree))}  # first calls, untimed
    for _ in range(repeat):
        for name, fn in (("fold", fold), ("tree", tree)):
            t0 = time.perf_counter()
            got[name] = fn()
            best[name] = min(best.get(name, np.inf), time.perf_counter() - t0)
    f, t = got["fold"], got["tree"]
    if not (
        np.array_equal(f["key"], t["key"])
        and np.allclose(f["cpu"], t["cpu"], rtol=1e-12)
        and np.array_equal(f["windows"], t["windows"])
        and np.array_equal(f["prio"], t["prio"])
    ):
        raise AssertionError("the tree and the fold disagree")
    return {
        "partitions": n_parts,
        "keys": keys,
        "fold_s": round(best["fold"], 4),
        "tree_s": round(best["tree"], 4),
        "fold_over_tree": round(best["fold"] / best["tree"], 2),
        "fold_work_mib": round(work["fold"], 1),
        "tree_work_mib": round(work["tree"], 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", default="64,256,1024", help="comma-separated partition counts")
    ap.add_argument("--keys", type=int, default=1_280_000, help="distinct keys over all partitions")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--name", default="merge_tree")
    args = ap.parse_args(argv)
    rows = [measure(int(p), args.keys, args.repeat) for p in args.partitions.split(",")]
    md = [
        "# Merging keyed partials: a running fold against the tree of 8",
        "",
        f"`python bench/merge_tree_bench.py --partitions {args.partitions} --keys {args.keys}`: job-usage partials, "
        f"best of {args.repeat} wall seconds; work MiB = how far the process's RSS rose above the partials' during a "
        "first, untimed merge (`bench/_harness.working_set`).",
        "",
        "| partitions | keys | running fold s | tree of 8 s | fold / tree | fold work MiB | tree work MiB |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    md += [
        f"| {r['partitions']:,} | {r['keys']:,} | {r['fold_s']:.3f} | {r['tree_s']:.3f} | {r['fold_over_tree']:.1f} | "
        f"{r['fold_work_mib']:,.0f} | {r['tree_work_mib']:,.0f} |"
        for r in rows
    ]
    publish(args.name, {"rows": rows}, md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
