"""Synthetic probe records (``PROBE_SCHEMA``) with a known bus-bandwidth curve and
allocation-to-allocation noise, for the bandwidth model's tests."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

DAY = date(2026, 3, 1)
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TYPES: dict[str, dict[str, Any]] = {
    "g4dn.xlarge": {"gpu_model": "T4", "gpus_per_vm": 1, "vcpus": 4, "network_gbps": 5.0},
    "g4dn.12xlarge": {"gpu_model": "T4", "gpus_per_vm": 4, "vcpus": 48, "network_gbps": 50.0},
}
LOCAL: dict[str, dict[str, Any]] = {
    # worker processes on one host over gloo: no rated network; the curve peaks near 1 GB/s
    "local.cpu": {
        "gpu_model": "cpu",
        "gpus_per_vm": 0,
        "vcpus": 2,
        "network_gbps": None,
        "curve_gbps": 8.0,
    },
}
ALL_TYPES = {**TYPES, **LOCAL}
SIZES = (8, 256, 2048, 8192, 65536, 1 << 20, 16 << 20, 64 << 20)


def true_busbw(itype: str, size: int, world: int, concurrent: int) -> float:
    """The curve: latency-bound below, rated-bandwidth-bound above, shared by concurrency."""
    spec = ALL_TYPES[itype]
    peak = (spec.get("curve_gbps") or spec["network_gbps"]) * 1e9 / 8 * 0.8
    latency = 50e-6 * (1 + 0.2 * world)
    t = latency + 2 * size * (world - 1) / (world * peak) * concurrent
    return 2 * size * (world - 1) / (world * t)


def make_probes(
    *,
    allocations: int = 3,
    types: tuple[str, ...] = tuple(TYPES),
    worlds: tuple[int, ...] = (2, 4),
    concurrency: tuple[int, ...] = (1, 2),
    repeats: int = 2,
    alloc_sigma: float = 0.1,
    repeat_sigma: float = 0.02,
    seed: int = 0,
    start: datetime = T0,
    provider: str = "ec2-emulated",
) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for itype in types:
        spec = ALL_TYPES[itype]
        local = itype in LOCAL
        for slot in range(allocations):
            alloc = f"{itype}-alloc-{slot}"
            factor = float(np.exp(rng.normal(0, alloc_sigma)))
            for world in worlds:
                for size in SIZES:
                    for c in concurrency:
                        for r in range(repeats):
                            bw = true_busbw(itype, size, world, c) * factor
                            bw *= float(np.exp(rng.normal(0, repeat_sigma)))
                            t = 2 * size * (world - 1) / (world * bw)
                            rows.append(
                                {
                                    "date": DAY,
                                    "provider": "local" if local else provider,
                                    "cloud": "local" if local else "aws",
                                    "region": "local" if local else "us-east-1",
                                    "zone": "local" if local else "use1-az1",
                                    "instance_type": itype,
                                    "gpu_model": spec["gpu_model"],
                                    "gpus_per_vm": spec["gpus_per_vm"],
                                    "vcpus": spec["vcpus"],
                                    "network_gbps": spec["network_gbps"],
                                    "placement_group": False,
                                    "allocation_id": alloc,
                                    "allocation_slot": slot,
                                    "world_size": world,
                                    "buffer_bytes": size,
                                    "concurrent": c,
                                    "backend": "gloo" if local else "nccl",
                                    "repeat": r,
                                    "time_s": t,
                                    "busbw": 2 * size * (world - 1) / (world * t),
                                    "status": "ok",
                                    "error": None,
                                    "probed_at": start + timedelta(seconds=len(rows)),
                                }
                            )
    df = pd.DataFrame(rows)
    for c in ("gpus_per_vm", "vcpus", "allocation_slot", "world_size", "concurrent", "repeat"):
        df[c] = df[c].astype("int32")
    df["buffer_bytes"] = df["buffer_bytes"].astype("int64")
    df["probed_at"] = pd.to_datetime(df["probed_at"], utc=True)
    return df


def write_store(root: Path | None = None, **kwargs: Any) -> pd.DataFrame:
    """Write ``make_probes(**kwargs)`` into the probe store, one partition per type."""
    from srifty_core.probing.store import write_partition

    df = make_probes(**kwargs)
    for itype, part in df.groupby("instance_type"):
        write_partition(
            part.reset_index(drop=True),
            day=DAY,
            provider=str(part["provider"].iloc[0]),
            instance_type=str(itype),
            root=root,
        )
    return df
