"""Synthetic probe records (``PROBE_SCHEMA``) with a known bus-bandwidth curve and
allocation-to-allocation noise, for the bandwidth model's tests."""

from __future__ import annotations

from collections.abc import Callable
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
    return _typed(pd.DataFrame(rows))


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


MIX = {"g4dn.12xlarge": 1, "g4dn.xlarge": 3}


def make_mix_rows(
    busbw_of: Callable[[str, int, int], float],
    ratio: float,
    *,
    mix: dict[str, int] = MIX,
    sizes: tuple[int, ...] = SIZES,
    allocations: int = 2,
    repeats: int = 2,
    phase: str = "burst",
    start: datetime = T0,
) -> pd.DataFrame:
    """Rows of a ring over ``mix`` measured at ``ratio`` times what its member types
    compose to: ``busbw_of(type, world, size)`` of each type at the world size of a ring of
    all the mix's VMs of that type, the minimum over types."""
    from srifty_core.probing.mix import mix_label

    vms = sum(mix.values())
    ranks = {t: max(1, int(TYPES[t]["gpus_per_vm"])) for t in mix}
    world = sum(n * ranks[t] for t, n in mix.items())
    rows = []
    for slot in range(allocations):
        for size in sizes:
            composed = min(busbw_of(t, max(2, vms * ranks[t]), size) for t in mix)
            for r in range(repeats):
                bw = ratio * composed
                rows.append(
                    {
                        "date": DAY,
                        "provider": "ec2-emulated",
                        "cloud": "aws",
                        "region": "us-east-1",
                        "zone": "use1-az1",
                        "instance_type": mix_label(mix),
                        "gpu_model": "mixed",
                        "gpus_per_vm": min(ranks.values()),
                        "vcpus": min(int(TYPES[t]["vcpus"]) for t in mix),
                        "network_gbps": min(float(TYPES[t]["network_gbps"]) for t in mix),
                        "placement_group": False,
                        "allocation_id": f"mix-{phase}-{slot}-a+mix-{phase}-{slot}-b",
                        "allocation_slot": slot,
                        "world_size": world,
                        "buffer_bytes": size,
                        "concurrent": 1,
                        "backend": "nccl",
                        "repeat": r,
                        "time_s": 2 * size * (world - 1) / (world * bw),
                        "busbw": bw,
                        "status": "ok",
                        "error": None,
                        "probed_at": start + timedelta(seconds=len(rows)),
                        "phase": phase,
                    }
                )
    return _typed(pd.DataFrame(rows))


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    """The store's column widths on a frame of probe rows."""
    for c in ("gpus_per_vm", "vcpus", "allocation_slot", "world_size", "concurrent", "repeat"):
        df[c] = df[c].astype("int32")
    df["buffer_bytes"] = df["buffer_bytes"].astype("int64")
    df["probed_at"] = pd.to_datetime(df["probed_at"], utc=True)
    return df
