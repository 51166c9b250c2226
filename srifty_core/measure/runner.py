"""Run a probe sweep's points on one allocation, or on a mixed ring of several (one per
instance type, ``probing.mix``): start the probe worker on every rank (``provider.run``;
a ring's ranks as one process group over its allocations, ``provider.start_workers``),
wait for them (the sweep's timeout; after one rank fails the others
get ``FAILURE_GRACE_S`` to report), and read back what rank 0 wrote to the allocation's
partial file. A point still missing gets one failed row saying why the run stopped (the
ranks' exit codes, a timeout, rank 0's last log line); the partial file stays until the
caller commits it (``measure.partials``).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from filelock import FileLock

from srifty_core.cloud.base import Allocation, Provider, Workers
from srifty_core.errors import ConfigError
from srifty_core.lifetime import caller_env
from srifty_core.measure.checks import check_fits, check_starts_after_launch
from srifty_core.measure.partials import (
    complete_points,
    partial_dir,
    point_key,
    read_partial,
    rewrite_partial,
    slots_missing_sustained,
    writer_lock,
)
from srifty_core.probing.config import Point, SweepConfig, format_size
from srifty_core.probing.mix import ring_columns
from srifty_core.probing.schema import STATUS_FAILED

FAILURE_GRACE_S = 10.0
"""After one rank fails, how long the others get to notice and report before being killed."""
POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class FailedPoint:
    point: Point
    reason: str


def labels(allocation: Allocation, day: date) -> dict[str, Any]:
    """The features every row of this allocation carries."""
    s = allocation.spec
    return {
        "date": day.isoformat(),
        "provider": allocation.provider,
        "cloud": allocation.cloud,
        "region": allocation.region,
        "zone": allocation.zone,
        "instance_type": s.name,
        "gpu_model": s.gpu_model,
        "gpus_per_vm": s.gpus_per_vm,
        "vcpus": s.vcpus,
        "network_gbps": s.network_gbps,
        "placement_group": allocation.placement_group,
        "allocation_id": allocation.id,
    }


def ring_labels(allocations: Sequence[Allocation], day: date) -> dict[str, Any]:
    """The features every row of a mixed ring carries (``probing.mix``'s rule): one
    allocation per member type, in the ring's rank order."""
    first = allocations[0]
    counts = {a.spec.name: a.count for a in allocations}
    if len(counts) != len(allocations):
        raise ConfigError(
            f"allocations: one per instance type in a mix, got {[a.spec.name for a in allocations]}"
        )
    return {
        **labels(first, day),
        **ring_columns(counts, [a.spec for a in allocations], [a.zone for a in allocations]),
        "placement_group": all(a.placement_group for a in allocations),
        "allocation_id": ring_id(allocations),
    }


def ring_id(allocations: Sequence[Allocation]) -> str:
    """One name for the allocations that probe together: their ids joined by ``+``."""
    return "+".join(a.id for a in allocations)


def ring_ranks(allocations: Sequence[Allocation]) -> int:
    return sum(a.ranks for a in allocations)


def _what(allocations: Sequence[Allocation]) -> str:
    return " + ".join(f"{a.count} x {a.spec.name}" for a in allocations)


def _exit_summary(codes: dict[int, int | None], timed_out: bool, timeout_s: float) -> str:
    parts = []
    for rank, code in sorted(codes.items()):
        if code is None:
            continue
        if code < 0:
            parts.append(f"rank {rank} killed by signal {-code}")
        elif code:
            parts.append(f"rank {rank} exited with code {code}")
    if timed_out:
        parts.append(f"timed out after {timeout_s:.0f}s")
    return "; ".join(parts) or "workers stopped"


def _log_tail(provider: Provider, allocation: Allocation, rank: int) -> str:
    folder = provider.log_dir(allocation)
    if folder is None:
        return ""
    path = Path(folder) / f"rank-{rank}.log"
    if not path.exists():
        return ""
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:500] if lines else ""


class Wait:
    """When to stop waiting for a ring's workers: once all have ended,
    ``FAILURE_GRACE_S`` after the first failed (for the others to report), or after
    ``timeout_s`` (``timed_out``)."""

    def __init__(self, timeout_s: float) -> None:
        self.deadline = time.monotonic() + timeout_s
        self.first_failure: float | None = None
        self.timed_out = False

    def over(self, ended: bool, failed: bool) -> bool:
        now = time.monotonic()
        if ended:
            return True
        if failed and self.first_failure is None:
            self.first_failure = now
        if self.first_failure is not None and now - self.first_failure > FAILURE_GRACE_S:
            return True
        self.timed_out = now > self.deadline
        return self.timed_out


def probe_plan(
    config: SweepConfig,
    points: Sequence[Point],
    sustained_slot: int | None,
    row_labels: dict[str, Any],
    out: str,
) -> dict[str, Any]:
    """What the probe worker reads (``measure.probe_worker``): the config, the points, the
    sustained probe's slot and world size, the labels every row carries, and ``out``, the
    partial file (or run-storage object) rank 0 writes the rows to."""
    return {
        "config": config.to_dict(),
        "points": [list(p.key) for p in points],
        "sustained": None if sustained_slot is None else [sustained_slot, config.max_world_size],
        "labels": row_labels,
        "out": out,
    }


def run_points(
    provider: Provider,
    allocation: Allocation | Sequence[Allocation],
    config: SweepConfig,
    points: list[Point],
    *,
    day: date,
    root: Path | None = None,
    on_point: Callable[[], None] | None = None,
    sustained_slot: int | None = None,
) -> tuple[list[dict[str, Any]], list[FailedPoint]]:
    """Measure ``points`` on ``allocation`` (or on the mixed ring of several: one per
    member type, in rank order) and, with ``sustained_slot``, the sustained-transfer probe
    for that slot at the largest world size; return the rows rank 0 wrote (ok and failed)
    and the points that failed. The partial file stays until the caller commits it."""
    ring = (allocation,) if isinstance(allocation, Allocation) else tuple(allocation)
    check_starts_after_launch(provider)
    check_fits(config, ring_ranks(ring), _what(ring))
    row_labels = labels(ring[0], day) if len(ring) == 1 else ring_labels(ring, day)
    name = str(row_labels["instance_type"])
    folder = partial_dir(day, ring[0].provider, name, root)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{ring_id(ring)}.jsonl"
    plan_path = folder / f".{ring_id(ring)}.plan.json"
    plan = probe_plan(config, points, sustained_slot, row_labels, str(out))
    plan_path.write_text(json.dumps(plan))
    argv = [sys.executable, "-m", "srifty_core.measure.probe_worker", str(plan_path)]

    def exit_codes() -> dict[int, int | None]:
        return {r: c for a in ring for r, c in provider.exit_codes(a).items()}

    with FileLock(writer_lock(out)):  # this run owns the partial file while it measures
        if len(ring) == 1:  # these calls wait for them: they end with it
            provider.run(ring[0], argv, caller_env())
        else:
            provider.start_workers(ring, Workers(argv, caller_env()))
        wait = Wait(config.sweep_timeout_s)
        seen = 0
        while True:
            codes = exit_codes()
            if on_point is not None and out.exists():
                done = len(complete_points(read_partial(out), config.repeats))
                for _ in range(done - seen):
                    on_point()
                seen = max(seen, done)
            ended = all(c is not None for c in codes.values())
            if wait.over(ended, any(c not in (None, 0) for c in codes.values())):
                break
            time.sleep(POLL_S)
        codes = exit_codes()
        if any(c is None for c in codes.values()):
            for a in ring:
                provider.stop(a)
            codes = exit_codes()
        plan_path.unlink(missing_ok=True)
        rows = read_partial(out) if out.exists() else []
    failures = settle(
        out, rows, points, config, row_labels,
        codes=codes, timed_out=wait.timed_out, sustained_slot=sustained_slot,
        log_tail=lambda: _log_tail(provider, ring[0], 0),
    )  # fmt: skip
    return rows, failures


def settle(
    out: Path,
    rows: list[dict[str, Any]],
    points: Sequence[Point],
    config: SweepConfig,
    row_labels: dict[str, Any],
    *,
    codes: dict[int, int | None],
    timed_out: bool,
    sustained_slot: int | None,
    log_tail: Callable[[], str] | None = None,
) -> list[FailedPoint]:
    """The points of ``points`` (and the sustained probe of ``sustained_slot``) that
    ``rows`` lacks, as failures: the first with the reason the run stopped (the ranks' or
    VMs' exit ``codes``, a timeout, rank 0's last log line), also written as a failed row
    into the partial file ``out`` when rank 0 wrote none (``log_tail``: read only then);
    the rest as not measured."""
    failed_ok = all(c == 0 for c in codes.values()) and not timed_out
    complete = complete_points(rows, config.repeats)
    missing = [p for p in points if p.key not in complete]
    if sustained_slot is not None and sustained_slot in slots_missing_sustained(rows, config):
        missing.append(Point(sustained_slot, config.max_world_size, config.sustained_bytes, 1))
    if not missing:
        return []
    summary = _exit_summary(codes, timed_out, config.sweep_timeout_s)
    if failed_ok:
        summary = "workers exited 0 without measuring it"
    reported = {point_key(r): r for r in rows if r["status"] == STATUS_FAILED}
    first = missing[0]
    if first.key in reported:
        reported[first.key]["error"] = f"{reported[first.key]['error']} ({summary})"
    else:
        tail = log_tail() if log_tail is not None else ""
        row = {**row_labels, "allocation_slot": first.allocation_slot}
        row.update(
            world_size=first.world_size,
            buffer_bytes=first.buffer_bytes,
            concurrent=first.concurrent,
            collective=first.collective,
            backend=config.backend,
            repeat=0,
            time_s=None,
            busbw=None,
            status=STATUS_FAILED,
            error=summary + (f"; rank 0: {tail}" if tail else ""),
            probed_at=datetime.now(UTC).isoformat(),
        )
        rows.append(row)
        reported[first.key] = row
    rewrite_partial(out, rows)
    return [FailedPoint(first, str(reported[first.key]["error"]))] + [
        FailedPoint(p, f"not measured: the run stopped at {format_point(first)}")
        for p in missing[1:]
    ]


def format_point(p: Point) -> str:
    """A grid point as a failure message names it."""
    return (
        f"slot {p.allocation_slot}, world size {p.world_size}, "
        f"{format_size(p.buffer_bytes)} x {p.concurrent}"
    )
