"""Run a probe sweep on a provider and commit it to the probe store.

``probe_sweep`` does the whole job for one instance type on one day: check the config
against the allocation before anything starts, skip the points the day's partition
already holds, launch one allocation per ``allocation_slot`` that still has missing
points, run the worker on every rank, release the allocation whatever happens, and
commit. ``sweep_on_allocation`` is the middle step alone, for callers that own the
allocation (the Airflow DAG launches and releases in separate tasks).

The steps live beside it: ``measure.checks`` (the config against the provider and the
allocation), ``measure.runner`` (one allocation's points on its workers) and
``measure.partials`` (the results on disk). This module drives them, and owns the
allocations it launches: an owner lock per allocation lets the next run release what a
killed sweep left running (``release_orphans``).

Durability: rank 0 appends each completed point to a per-allocation partial file
(``_partial/.../<allocation id>.jsonl`` under the store) and fsyncs it. Commit merges the
partition and every partial file of that partition, writes the partition atomically, and
only then deletes the partial files. So a dead worker loses nothing measured, a dead
driver's partial files are committed by the next run, and a rerun measures only the
points still missing (a point is complete once it holds ``repeats`` ok rows).

Mixed-type rings (``probing.mix``) are swept by ``measure.mix_sweep``, with these pieces.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Protocol

from filelock import FileLock, Timeout

from srifty_core.catalog.types import Market
from srifty_core.cloud.base import Allocation, LaunchRequest, Provider, release_all
from srifty_core.cloud.local import LocalProvider
from srifty_core.errors import SriftyError
from srifty_core.measure.checks import (
    check_backend,
    check_fits,
    check_starts_after_launch,
    checked_size,
)
from srifty_core.measure.partials import Partition, complete_points, slots_missing_sustained
from srifty_core.measure.runner import FailedPoint, format_point, run_points
from srifty_core.probing.config import Point, SweepConfig
from srifty_core.probing.schema import STATUS_OK


def owner_lock(partials: Path, allocation_id: str) -> Path:
    """The lock ``probe_sweep`` holds from launching an allocation until it released it:
    free while the file is there means its sweep was killed in between."""
    return partials / f".{allocation_id}{OWNER_SUFFIX}"


OWNER_SUFFIX = ".owner.lock"


@contextlib.contextmanager
def owning(partials: Path, allocation_id: str) -> Iterator[None]:
    """Hold ``owner_lock`` while the body runs; remove it once the body (which releases the
    allocation) has returned. If it raised, the file stays (unlocked): the next run
    releases the allocation again (releases are idempotent) and removes it."""
    partials.mkdir(parents=True, exist_ok=True)
    path = owner_lock(partials, allocation_id)
    lock = FileLock(str(path))
    lock.acquire()
    try:
        yield
        path.unlink(missing_ok=True)
    finally:
        lock.release()


def release_orphans(partials: Path, provider: Provider) -> list[str]:
    """Release the allocations a killed ``probe_sweep`` launched into this partition and
    never released (a SIGKILL runs no cleanup: on EC2 its VMs would run on); their ids.

    An orphan is an ``owner_lock`` no live process holds. Allocations launched by others
    (the DAG's tasks, which launch and release apart) have no owner lock and are never
    touched. A release that fails is reported on stderr and tried again by the next run.
    """
    released: list[str] = []
    if not partials.is_dir():
        return released
    for path in sorted(partials.glob(f".*{OWNER_SUFFIX}")):
        allocation_id = path.name[1 : -len(OWNER_SUFFIX)]
        lock = FileLock(str(path))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            continue  # its sweep is alive
        try:
            if not path.exists():  # released and removed between the glob and the lock
                continue
            try:
                provider.release(allocation_id)
            except Exception as exc:
                print(
                    f"probe sweep: could not release {allocation_id} left by a killed sweep "
                    f"({exc}); the next run tries again",
                    file=sys.stderr,
                )
                continue
            path.unlink(missing_ok=True)
            released.append(allocation_id)
            print(f"probe sweep: released {allocation_id}, left by a killed sweep", file=sys.stderr)
        finally:
            lock.release()
    return released


ProgressFn = Callable[[int, int], None]
"""``on_progress(points_done, points_to_do)`` after each completed point."""


@dataclass(frozen=True)
class SlotWork:
    """One allocation slot's work: the ring's launch requests (one per member type, in
    its rank order), the points it still misses, the sustained probe's slot if it misses
    that, and where the rows go (``day``'s partition of ``label`` under ``root``)."""

    config: SweepConfig
    label: str
    requests: tuple[LaunchRequest, ...]
    slot: int
    points: tuple[Point, ...]
    sustained_slot: int | None
    day: date
    root: Path | None


class RingRunner(Protocol):
    """How a sweep starts one slot's ring and measures it: ``launch`` (the sweep then owns
    what it returns and releases it, whatever happens), then ``measure`` (the failed
    points; the rows are in the slot's partial file). ``LaunchThenRun`` where workers start
    after launch (the local provider); ``jobs.probe_vms.StartAtLaunch`` where VMs start
    them from their launch (EC2: the points travel in the user data)."""

    def launch(self, provider: Provider, work: SlotWork) -> Sequence[Allocation]: ...

    def measure(
        self,
        provider: Provider,
        ring: Sequence[Allocation],
        work: SlotWork,
        on_point: Callable[[], None] | None,
    ) -> list[FailedPoint]: ...


def launch_requests(
    provider: Provider, requests: Sequence[LaunchRequest]
) -> tuple[Allocation, ...]:
    """One allocation per request, in order; if one launch fails, those already launched
    are released before the error goes on."""
    launched: list[Allocation] = []
    try:
        for r in requests:
            launched.append(provider.launch(r))
    except BaseException:
        release_all(provider, launched)
        raise
    return tuple(launched)


class LaunchThenRun:
    """Launch the slot's allocations, then start the probe worker on every rank
    (``measure.runner.run_points``)."""

    def launch(self, provider: Provider, work: SlotWork) -> Sequence[Allocation]:
        check_starts_after_launch(provider)
        return launch_requests(provider, work.requests)

    def measure(
        self,
        provider: Provider,
        ring: Sequence[Allocation],
        work: SlotWork,
        on_point: Callable[[], None] | None,
    ) -> list[FailedPoint]:
        _, failed = run_points(
            provider, ring, work.config, list(work.points), day=work.day, root=work.root,
            on_point=on_point, sustained_slot=work.sustained_slot,
        )  # fmt: skip
        return failed


class ProbeFailedError(SriftyError):
    """Some points could not be measured; what was measured is committed."""

    def __init__(self, result: SweepResult) -> None:
        self.result = result
        lines = [f"  {format_point(f.point)}: {f.reason}" for f in result.failed[:5]]
        more = f"\n  ... and {len(result.failed) - 5} more" if len(result.failed) > 5 else ""
        super().__init__(
            f"{len(result.failed)} probe point(s) failed on allocation(s) "
            f"{', '.join(result.allocation_ids) or '-'}; the {result.rows} rows measured are "
            f"in {result.partition}; rerun to measure only the missing points:\n"
            + "\n".join(lines)
            + more
        )


@dataclass(frozen=True, slots=True)
class SweepResult:
    partition: Path
    rows: int
    """Rows with status ok in the partition after the commit."""
    measured: int
    """Points measured by this call."""
    skipped: int
    """Points the partition already held."""
    failed: tuple[FailedPoint, ...]
    """Points still missing because they failed."""
    allocation_ids: tuple[str, ...]
    wall_s: float

    @property
    def ok(self) -> bool:
        return not self.failed

    def raise_for_failures(self) -> SweepResult:
        if self.failed:
            raise ProbeFailedError(self)
        return self


def sweep_on_allocation(
    config: SweepConfig,
    provider: Provider,
    allocation: Allocation,
    *,
    day: date | None = None,
    root: Path | None = None,
    slot: int = 0,
    fresh: bool = False,
    on_progress: ProgressFn | None = None,
) -> SweepResult:
    """Measure what the partition still misses of ``slot`` on an allocation the caller
    launched (and will release), then commit."""
    check_fits(config, allocation.ranks, f"{allocation.count} x {allocation.spec.name}")
    check_backend(config, allocation.ranks)
    return sweep_slot(
        config, provider, (allocation,), allocation.spec.name,
        day=day, root=root, slot=slot, fresh=fresh, on_progress=on_progress,
    )  # fmt: skip


def sweep_slot(
    config: SweepConfig,
    provider: Provider,
    ring: Sequence[Allocation],
    label: str,
    *,
    day: date | None = None,
    root: Path | None = None,
    slot: int = 0,
    fresh: bool = False,
    on_progress: ProgressFn | None = None,
) -> SweepResult:
    """``sweep_on_allocation`` on one allocation or a mixed ring (``measure.mix_sweep``),
    whose partition is ``label``'s; ``config`` already checked against them."""
    t0 = time.perf_counter()
    day = day or datetime.now(UTC).date()
    part = Partition(day, provider.name, label, root, fresh)
    records = part.all_records()
    todo, sustained = missing_in_slot(records, config, slot)
    failures: list[FailedPoint] = []
    if todo or sustained is not None:
        progress = _Progress(len(todo), on_progress)
        _, failures = run_points(
            provider,
            ring,
            config,
            todo,
            day=day,
            root=root,
            on_point=progress.tick,
            sustained_slot=sustained,
        )
    ran = todo or sustained is not None
    return slot_result(config, part, slot, todo, failures, [a.id for a in ring] if ran else [], t0)


def missing_in_slot(
    records: Sequence[dict[str, object]], config: SweepConfig, slot: int
) -> tuple[list[Point], int | None]:
    """The points of ``slot`` that ``records`` (a partition's) lack, and ``slot`` when its
    sustained probe is missing too."""
    done = complete_points(records, config.repeats)
    todo = [p for p in config.points(slot) if p.key not in done]
    return todo, slot if slot in slots_missing_sustained(records, config) else None


def slot_result(
    config: SweepConfig,
    part: Partition,
    slot: int,
    todo: Sequence[Point],
    failures: Sequence[FailedPoint],
    allocation_ids: Sequence[str],
    t0: float,
) -> SweepResult:
    """Commit ``part`` and say what one slot's sweep did."""
    path, merged = part.commit(config.repeats)
    return SweepResult(
        partition=path,
        rows=sum(1 for r in merged if r["status"] == STATUS_OK),
        measured=len(todo) - len(failures),
        skipped=len(config.points(slot)) - len(todo),
        failed=tuple(failures),
        allocation_ids=tuple(allocation_ids),
        wall_s=time.perf_counter() - t0,
    )


class _Progress:
    def __init__(self, total: int, fn: ProgressFn | None) -> None:
        self.total, self.done, self.fn = total, 0, fn

    def tick(self) -> None:
        self.done += 1
        if self.fn is not None:
            self.fn(self.done, self.total)


def launch_for_sweep(
    config: SweepConfig,
    provider: Provider,
    instance_type: str,
    *,
    instances: int | None = None,
    market: Market = Market.ON_DEMAND,
    placement_group: bool = False,
) -> Allocation:
    """Launch an allocation big enough for ``config``'s largest world size, after checking
    the config (so bad input fails before anything starts)."""
    _, count = checked_size(config, provider, instance_type, instances)
    return provider.launch(
        LaunchRequest(instance_type, count, market=market, placement_group=placement_group)
    )


def probe_sweep(
    config: SweepConfig,
    *,
    instance_type: str = "local.cpu",
    provider: Provider | None = None,
    day: date | None = None,
    root: Path | None = None,
    instances: int | None = None,
    market: Market = Market.ON_DEMAND,
    placement_group: bool = False,
    fresh: bool = False,
    on_progress: ProgressFn | None = None,
    runner: RingRunner | None = None,
) -> SweepResult:
    """The whole sweep for one instance type on one day (see the module doc).

    ``instances`` defaults to as many as the largest world size needs. Every allocation
    is released before this returns, whatever happens. Failed points do not raise: look
    at ``result.failed`` or call ``result.raise_for_failures()``.
    """
    provider = provider or LocalProvider()
    spec, count = checked_size(config, provider, instance_type, instances)
    request = LaunchRequest(instance_type, count, market=market, placement_group=placement_group)
    return sweep_slots(
        config, provider, spec.name, (request,), runner or LaunchThenRun(),
        day=day, root=root, fresh=fresh, on_progress=on_progress,
    )  # fmt: skip


def sweep_slots(
    config: SweepConfig,
    provider: Provider,
    label: str,
    requests: Sequence[LaunchRequest],
    runner: RingRunner,
    *,
    day: date | None = None,
    root: Path | None = None,
    fresh: bool = False,
    on_progress: ProgressFn | None = None,
) -> SweepResult:
    """``probe_sweep``'s loop for one allocation or a mixed ring (``measure.mix_sweep``):
    the partition of ``label``, each slot that misses points on what ``runner`` launches
    of ``requests`` (released, whatever happens, before the next); ``config`` already
    checked."""
    t0 = time.perf_counter()
    day = day or datetime.now(UTC).date()
    part = Partition(day, provider.name, label, root, fresh)
    records = part.all_records()
    done = complete_points(records, config.repeats)
    todo = [p for p in config.all_points() if p.key not in done]
    sustained = slots_missing_sustained(records, config)
    progress = _Progress(len(todo), on_progress)
    if on_progress is not None:
        on_progress(0, len(todo))
    failures: list[FailedPoint] = []
    alloc_ids: list[str] = []
    release_orphans(part.partials, provider)  # what a killed sweep left running
    path, merged = part.commit(config.repeats)  # commits partials a crashed run left
    for slot in sorted({p.allocation_slot for p in todo} | sustained):
        work = SlotWork(
            config, label, tuple(requests), slot,
            tuple(p for p in todo if p.allocation_slot == slot),
            slot if slot in sustained else None, day, root,
        )  # fmt: skip
        ring = runner.launch(provider, work)
        alloc_ids.extend(a.id for a in ring)
        with contextlib.ExitStack() as stack:
            for a in ring:
                stack.enter_context(owning(part.partials, a.id))
            stack.callback(release_all, provider, ring)  # first: before the owner locks go
            failures.extend(runner.measure(provider, ring, work, progress.tick))
        path, merged = part.commit(config.repeats)
    return SweepResult(
        partition=path,
        rows=sum(1 for r in merged if r["status"] == STATUS_OK),
        measured=len(todo) - len(failures),
        skipped=len(config.all_points()) - len(todo),
        failed=tuple(failures),
        allocation_ids=tuple(alloc_ids),
        wall_s=time.perf_counter() - t0,
    )
