"""Allreduce probe sweep on the local provider (gloo on loopback), and probe-store speed.

    .venv/bin/python benchmarks/probe_sweep.py            # about 1-3 minutes

Runs ``probe_sweep`` for ``local.cpu`` with world sizes 2 and 4, sizes 4B..64MB (1 point
per decade), concurrency 1 and 4, 5 repeats, on 3 fresh allocations, into a temporary data
folder; prints the median bus bandwidth per point with its spread across repeats and
across allocations, the sweep's wall time, and the store's write/read speed (rows/s) on a
100k-row partition. Prints Markdown for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from datetime import UTC, date, datetime
from pathlib import Path

import pandas as pd
import pyarrow as pa


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-sizes", default="2,4")
    ap.add_argument("--sizes", default="4B:64MB")
    ap.add_argument("--points-per-decade", type=float, default=1)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--allocations", type=int, default=3)
    ap.add_argument("--store-rows", type=int, default=100_000)
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="srifty-bench-"))
    os.environ["SRIFTY_DATA_DIR"] = str(root)
    from srifty_core.measure.sweep import probe_sweep
    from srifty_core.probing.config import SweepConfig, format_size, parse_int_list, parse_sizes
    from srifty_core.probing.store import read_probes, write_partition
    from srifty_core.probing.summary import format_rate

    config = SweepConfig(
        sizes=parse_sizes(args.sizes, points_per_decade=args.points_per_decade),
        world_sizes=parse_int_list(args.world_sizes, "world_sizes"),
        concurrency=parse_int_list(args.concurrency, "concurrency"),
        repeats=args.repeats,
        warmup=2,
        allocations=args.allocations,
    )
    day = date(2026, 1, 1)
    t0 = time.perf_counter()
    result = probe_sweep(config, day=day)
    wall = time.perf_counter() - t0
    result.raise_for_failures()
    df = read_probes()

    print("## Allreduce probe sweep (local, gloo)\n")
    print(
        f"Machine: {os.cpu_count()} cores, gloo over loopback, one rank per process "
        f"(`torch.set_num_threads(1)`); world size 4 oversubscribes "
        f"{os.cpu_count()} cores. Sweep: sizes {args.sizes} ({len(config.sizes)} sizes), "
        f"world sizes {args.world_sizes}, concurrency {args.concurrency}, "
        f"{args.repeats} repeats after 2 warm-up rounds, {args.allocations} allocations "
        f"(fresh worker processes each).\n"
    )
    print(
        f"Sweep wall time: **{wall:.1f} s** for {len(config.all_points())} points, "
        f"{len(df)} rows ({len(df) / wall:.1f} rows/s end to end, process start-up "
        f"included).\n"
    )
    print(
        "busbw = 2s(n-1)/(n t) of one transfer (with c in flight, the aggregate is c x busbw); "
        "median over all samples; *rep. spread* = median over allocations of "
        "(p90 - p10) / median across repeats; *alloc. spread* = (max - min) / median of "
        "the per-allocation medians.\n"
    )
    print("| size | n | c | busbw median | time median | rep. spread | alloc. spread |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    keys = ["buffer_bytes", "world_size", "concurrent"]
    for (s, n, c), g in df.groupby(keys):
        per_alloc = g.groupby("allocation_id")["busbw"]
        rep = ((per_alloc.quantile(0.9) - per_alloc.quantile(0.1)) / per_alloc.median()).median()
        med = per_alloc.median()
        alloc = (med.max() - med.min()) / med.median()
        print(
            f"| {format_size(int(s))} | {n} | {c} | {format_rate(g['busbw'].median())} | "
            f"{g['time_s'].median() * 1e3:.3f} ms | {rep:.0%} | {alloc:.0%} |"
        )

    # Store speed: one partition of store_rows rows built from the measured ones.
    reps = -(-args.store_rows // len(df))
    big = pd.concat([df] * reps, ignore_index=True).iloc[: args.store_rows].copy()
    big["repeat"] = range(len(big))
    big["instance_type"] = "bench.store"
    big["probed_at"] = datetime.now(UTC)
    table = pa.Table.from_pandas(big, preserve_index=False)
    t0 = time.perf_counter()
    write_partition(table, day=day, provider="local", instance_type="bench.store")
    w = time.perf_counter() - t0
    t0 = time.perf_counter()
    back = read_probes(instance_types=["bench.store"])
    r = time.perf_counter() - t0
    assert len(back) == len(big)
    print(
        f"\nProbe store, one partition of {len(big):,} rows (schema and value checks "
        f"included): write {len(big) / w:,.0f} rows/s ({w:.2f} s), read {len(big) / r:,.0f} "
        f"rows/s ({r:.2f} s).\n"
    )
    print(f"Data folder of this run: {root} (temporary).")


if __name__ == "__main__":
    main()
