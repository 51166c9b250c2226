# ruff: noqa: E501
"""Emulated probe sweep at the method's scale (about 40K rows), written to a probe store.

    .venv/bin/python benchmarks/emulated_probe_sweep.py      # a few seconds

Six EC2 types (g3.4xlarge, g4dn.xlarge, g4dn.12xlarge, p3.2xlarge, p3.8xlarge,
p3.16xlarge), sizes 4 B..512 MB (3 points a decade), world sizes 2..64, concurrency 1/2/4,
3 allocations a type, 5 repeats; times the sweep and the store write (temporary folder),
3 runs, and prints Markdown for BENCHMARKS.md.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from datetime import date
from pathlib import Path

from srifty_core.cloud.emulated.measurements import emulated_probe_sweep, write_emulated_probes
from srifty_core.probing.store import read_probes

TYPES = ["g3.4xlarge", "g4dn.xlarge", "g4dn.12xlarge", "p3.2xlarge", "p3.8xlarge", "p3.16xlarge"]


def main() -> None:
    sweep_s, write_s, rows = [], [], 0
    for run in range(3):
        t0 = time.perf_counter()
        table = emulated_probe_sweep(TYPES, seed=run, day=date(2026, 1, 5))
        t1 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            write_emulated_probes(table, root=Path(tmp))
            t2 = time.perf_counter()
            rows = len(read_probes(Path(tmp)))
        sweep_s.append(t1 - t0)
        write_s.append(t2 - t1)
    n = table.num_rows
    assert rows == n
    med, lo, hi = statistics.median(sweep_s), min(sweep_s), max(sweep_s)
    wmed = statistics.median(write_s)
    print(f"rows: {n:,} ({len(TYPES)} types, {len(TYPES) * 3} allocations)")
    print(
        f"sweep: median {med:.2f} s (min {lo:.2f}, max {hi:.2f}) over 3 runs -> {n / med:,.0f} rows/s"
    )
    print(f"store write ({len(TYPES)} partitions): median {wmed:.2f} s -> {n / wmed:,.0f} rows/s")
    print(f"end to end: {n / (med + wmed):,.0f} rows/s")


if __name__ == "__main__":
    main()
