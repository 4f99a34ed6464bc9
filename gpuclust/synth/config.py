"""The knobs and the result of ``gpuclust synth``: :class:`SynthConfig`, :class:`SynthResult`, the
tables written and the kinds of planted malformed lines.  See ``docs/user/synth.md``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

#: Tables written, in order.
USAGE_TABLES = ("machine_events", "machine_attributes", "collection_events", "instance_events", "instance_usage")
#: Kinds of planted malformed lines.
MALFORMED_KINDS = ("bad_json", "wrong_list_length", "quoted_non_number_id", "missing_required_key")
#: Tables that may receive malformed lines (machine tables are left intact).
MALFORMED_TABLES = ("collection_events", "instance_events", "instance_usage")

TRUTH_FILE = "synth_truth.json"
TRUTH_VERSION = 1


@dataclass(frozen=True)
class SynthConfig:
    """Every knob of the synthetic cell (defaults make a small cell fast).  See ``docs/user/synth.md``."""

    machines: int = 200
    hours: float = 6.0
    seed: int = 0
    # placement
    overcommit_cpu: float = 1.25
    overcommit_mem: float = 1.0
    request_fill: float = 0.75
    preemption: bool = True
    pass_interval_s: int = 30
    pass_max_tries: int = 400
    # machines
    null_capacity_fraction: float = 0.01
    late_add_fraction: float = 0.03
    remove_fraction: float = 0.04
    update_fraction: float = 0.03
    big_id_fraction: float = 0.05
    # workload
    constraint_fraction: float = 0.08
    update_pending_fraction: float = 0.03
    update_running_fraction: float = 0.05
    service_fail_rate_per_hour: float = 0.01
    batch_fail_fraction: float = 0.04
    kill_fraction: float = 0.05
    lost_fraction: float = 0.003
    max_retries: int = 3
    # planted truths (docs/user/synth.md "Planted laws"): job sizes, usage / request, usage change, scheduling delay
    job_size_alpha: float = 1.2
    usage_ratio_free: float = 0.6
    usage_ratio_beb: float = 0.55
    usage_ratio_mid: float = 0.45
    usage_ratio_prod: float = 0.35
    usage_ratio_sigma: float = 0.6
    usage_window_sigma: float = 0.12
    sched_delay_free_s: float = 60.0
    sched_delay_beb_s: float = 20.0
    sched_delay_mid_s: float = 8.0
    sched_delay_prod_s: float = 3.0
    # usage
    diurnal_amplitude: float = 0.15
    machine_load_sigma: float = 0.4
    machine_cell_load_sigma: float = 0.35
    max_machine_utilisation: float = 0.95
    low_sample_rate_fraction: float = 0.03
    max_usage_missing_fraction: float = 0.005
    # CPI / MAI
    cpi_per_task: float = 0.003
    cpi_per_util: float = 0.2
    cpi_noise: float = 0.1
    mai_noise: float = 0.15
    cpi_outlier_fraction: float = 0.001
    # output
    malformed_rate: float = 0.0
    shard_rows: int = 1_500_000
    compresslevel: int = 1
    block_cells: int = 12
    workers: int = 1

    def __post_init__(self) -> None:
        if self.machines < 1:
            raise ValueError("machines must be >= 1")
        if not self.hours > 0:
            raise ValueError("hours must be > 0")
        if not 0 <= self.malformed_rate < 1:
            raise ValueError("malformed_rate must be in [0, 1)")
        if self.overcommit_cpu < 1 or self.overcommit_mem < 1:
            raise ValueError("overcommit factors must be >= 1")
        if not self.max_machine_utilisation > 0:
            raise ValueError("max_machine_utilisation must be > 0 (inf: no limit)")
        if self.job_size_alpha < 0:
            raise ValueError("job_size_alpha must be >= 0 (0: sizes not planted)")
        for t in ("free", "beb", "mid", "prod"):
            if not getattr(self, f"usage_ratio_{t}") > 0:
                raise ValueError(f"usage_ratio_{t} must be > 0")
            if not getattr(self, f"sched_delay_{t}_s") >= 0:
                raise ValueError(f"sched_delay_{t}_s must be >= 0")
        if self.usage_ratio_sigma < 0 or self.usage_window_sigma < 0:
            raise ValueError("usage_ratio_sigma and usage_window_sigma must be >= 0")


@dataclass
class SynthResult:
    out: Path
    truth: dict
    shards: dict[str, list[Path]]
    seconds: float
    ingest_report: object | None = None
    #: window-level arrays (only with ``keep_windows=True``): k, u, cpi, cpi_base, avg_cpu, dur, ...
    windows: dict[str, np.ndarray] | None = field(default=None, repr=False)
