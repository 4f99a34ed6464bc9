"""Results as CSV files, for spreadsheet users: ``<analysis>/<table>.csv`` per result table (a
parted table streamed part by part into one file), with the results folder's ``_run.json``
beside them saying what wrote them.  The folder is written as a whole (see
:class:`gpuclust.report.folder.ResultsFolder`): a previous CSV export there is replaced.
"""

from __future__ import annotations

import shutil
from pathlib import Path

__all__ = ["write_csv"]


def write_csv(results_dir: str | Path, out: str | Path, *, keys: list[str] | None = None) -> list[Path]:
    """Write the tables of the results folder ``results_dir`` as CSV into the folder ``out``;
    returns the CSV files (as they will be after the swap).  NULL is an empty cell."""
    from gpuclust.parted import frames
    from gpuclust.report.folder import RUN_FILE, OutputError, ResultsFolder
    from gpuclust.report.provenance import load_results, read_run_file

    run = read_run_file(results_dir)
    if run is None:
        raise OutputError(out, f"{results_dir} is not a gpuclust results folder (no readable _run.json)")
    results = load_results(results_dir, run)
    folder = ResultsFolder(out).open()
    assert folder.tmp is not None
    written: list[Path] = []
    try:
        for key, tables in results.items():
            if keys is not None and key not in keys:
                continue
            for name, table in tables.items():
                rel = Path(key) / f"{name}.csv"
                (folder.tmp / key).mkdir(parents=True, exist_ok=True)
                with open(folder.tmp / rel, "w", newline="", encoding="utf-8") as f:
                    first = True
                    for part in frames(table):
                        part.to_csv(f, index=False, header=first)
                        first = False
                written.append(folder.path / rel)
        shutil.copyfile(Path(results_dir) / RUN_FILE, folder.tmp / RUN_FILE)
        folder.commit()
    except OSError as e:
        raise OutputError(out, e) from None
    finally:
        folder.abort()
    return written
