"""Synthetic probe records for store tests."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

DAY = date(2026, 3, 1)
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def make_rows(
    n: int = 4,
    *,
    day: date = DAY,
    provider: str = "local",
    instance_type: str = "local.cpu",
    start: datetime = T0,
    step: timedelta = timedelta(minutes=1),
    allocation_id: str = "alloc-a",
) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        size, world, t = 1024 * (i + 1), 2, 0.001 * (i + 1)
        rows.append(
            {
                "date": day,
                "provider": provider,
                "cloud": "local",
                "region": "local",
                "zone": "local-a",
                "instance_type": instance_type,
                "gpu_model": "cpu",
                "gpus_per_vm": 0,
                "vcpus": 2,
                "network_gbps": None,
                "placement_group": False,
                "allocation_id": allocation_id,
                "allocation_slot": 0,
                "world_size": world,
                "buffer_bytes": size,
                "concurrent": 1,
                "backend": "gloo",
                "repeat": 0,
                "time_s": t,
                "busbw": 2 * size * (world - 1) / (world * t),
                "status": "ok",
                "error": None,
                "probed_at": start + i * step,
            }
        )
    return rows
