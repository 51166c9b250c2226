"""Run a probe sweep on a provider and commit it to the probe store.

``probe_sweep`` does the whole job for one instance type on one day: check the config
against the allocation before anything starts, skip the points the day's partition
already holds, launch one allocation per ``allocation_slot`` that still has missing
points, run the worker on every rank, release the allocation whatever happens, and
commit. ``sweep_on_allocation`` is the middle step alone, for callers that own the
allocation (the Airflow DAG launches and releases in separate tasks).

Durability: rank 0 appends each completed point to a per-allocation partial file
(``_partial/.../<allocation id>.jsonl`` under the store) and fsyncs it. Commit merges the
partition and every partial file of that partition, writes the partition atomically, and
only then deletes the partial files. So a dead worker loses nothing measured, a dead
driver's partial files are committed by the next run, and a rerun measures only the
points still missing (a point is complete once it holds ``repeats`` ok rows).

Mixed-type rings (``probing.mix``) are not swept here: the worker runs one process group
per allocation, and a ring over the VMs of several allocations needs a rendezvous across
them (issue 19). Asking for a mix label raises ``ConfigError``; the emulated EC2 probes
mixes (``cloud.emulated.measurements.emulated_probe_sweep(mixes=...)``).
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from srifty_core import paths
from srifty_core.atomic import write_text_atomic
from srifty_core.catalog.types import Market
from srifty_core.cloud.base import Allocation, InstanceSpec, LaunchRequest, Provider
from srifty_core.cloud.local import LocalProvider
from srifty_core.errors import ConfigError, SriftyError
from srifty_core.lifetime import caller_env
from srifty_core.probing.config import Point, SweepConfig, format_size
from srifty_core.probing.mix import is_mix
from srifty_core.probing.schema import (
    COLUMNS,
    NULLABLE_SINCE,
    PHASE_BURST,
    PHASE_SUSTAINED,
    STATUS_FAILED,
    STATUS_OK,
)
from srifty_core.probing.store import (
    PARTITION_FILE,
    partition_dir,
    read_partition_table,
    records_to_table,
    write_partition,
)

PARTIAL_DIR = "_partial"
COMMIT_LOCK = ".commit.lock"


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


def writer_lock(partial: Path) -> str:
    """The lock a run holds on its partial file while its workers append to it."""
    return str(partial) + ".lock"


FAILURE_GRACE_S = 10.0
"""After one rank fails, how long the others get to notice and report before being killed."""
POLL_S = 0.1

ProgressFn = Callable[[int, int], None]
"""``on_progress(points_done, points_to_do)`` after each completed point."""


class ProbeFailedError(SriftyError):
    """Some points could not be measured; what was measured is committed."""

    def __init__(self, result: SweepResult) -> None:
        self.result = result
        lines = [f"  {_fmt_point(f.point)}: {f.reason}" for f in result.failed[:5]]
        more = f"\n  ... and {len(result.failed) - 5} more" if len(result.failed) > 5 else ""
        super().__init__(
            f"{len(result.failed)} probe point(s) failed on allocation(s) "
            f"{', '.join(result.allocation_ids) or '-'}; the {result.rows} rows measured are "
            f"in {result.partition}; rerun to measure only the missing points:\n"
            + "\n".join(lines)
            + more
        )


@dataclass(frozen=True, slots=True)
class FailedPoint:
    point: Point
    reason: str


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


def check_fits(config: SweepConfig, ranks: int, what: str) -> None:
    """``ConfigError`` naming ``world_sizes`` when the allocation is too small."""
    too_big = [n for n in config.world_sizes if n > ranks]
    if too_big:
        raise ConfigError(
            f"world_sizes: {too_big} exceed the {ranks} rank(s) of the allocation ({what}); "
            f"launch more instances or probe smaller world sizes"
        )


def check_single_type(instance_type: str, provider: Provider) -> None:
    """``ConfigError`` naming ``instance_type`` when it names a mixed-type ring, which this
    sweep cannot run (module docstring)."""
    if is_mix(instance_type):
        raise ConfigError(
            f"instance_type: {instance_type!r} is a ring over several instance types; the "
            f"probe sweep on the {provider.name} provider runs one process group per "
            "allocation and cannot yet join allocations into one ring (multi-VM rendezvous, "
            "issue 19). Probe mixes on the emulated EC2: "
            "cloud.emulated.measurements.emulated_probe_sweep(..., mixes=[{type: VMs, ...}])"
        )


def check_backend(config: SweepConfig, ranks: int) -> None:
    """``ConfigError`` naming ``backend`` when this machine cannot run it."""
    if config.backend == "nccl":
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus == 0:
            raise ConfigError("backend: nccl needs CUDA GPUs and this machine has none; use gloo")


def partial_dir(day: date, provider: str, instance_type: str, root: Path | None = None) -> Path:
    base = root or paths.probe_store_dir()
    part = partition_dir(day, provider, instance_type, base)
    return base / PARTIAL_DIR / part.relative_to(base)


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


# ---------------------------------------------------------------------- the partition state
def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The probe rows of a partial file; lines that are not a probe row (torn by a crash
    mid-write, or garbage) are left out."""
    return [r for r in _parse_lines(path) if r is not None]


def _parse_lines(path: Path) -> list[dict[str, Any] | None]:
    """Each line's row, or None where a whole line is not one; a last line without its
    newline that is not a row (torn by a crash mid-write) is left out without a None."""
    out: list[dict[str, Any] | None] = []
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    for k, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            d: Any = json.loads(line)
        except json.JSONDecodeError:
            d = None
        if not _is_row(d):
            d = None
        if d is not None or k < len(lines) - 1:
            out.append(d)
    return out


_ROW_FIELDS = frozenset(COLUMNS) - {"phase", "time_s", "busbw", "error", *NULLABLE_SINCE}


def _is_row(d: Any) -> bool:
    """A dict with every column a probe row needs, its point fields integers and its
    status known."""
    if not isinstance(d, dict) or not d.keys() >= _ROW_FIELDS:
        return False
    try:
        for k in ("allocation_slot", "world_size", "buffer_bytes", "concurrent", "repeat"):
            int(d[k])
    except (TypeError, ValueError):
        return False
    return d["status"] in (STATUS_OK, STATUS_FAILED)


def _norm(r: dict[str, Any]) -> dict[str, Any]:
    r = dict(r)
    if isinstance(r.get("probed_at"), str):
        r["probed_at"] = datetime.fromisoformat(r["probed_at"])
    if isinstance(r.get("date"), str):
        r["date"] = date.fromisoformat(r["date"])
    return r


def _key(r: dict[str, Any]) -> tuple[int, int, int, int]:
    return (
        int(r["allocation_slot"]),
        int(r["world_size"]),
        int(r["buffer_bytes"]),
        int(r["concurrent"]),
    )


def merge_records(records: Iterable[dict[str, Any]], repeats: int) -> list[dict[str, Any]]:
    """Rows of the partition after merging: ok rows deduplicated (by allocation, point and
    repeat; the last wins), failed rows kept only for points that are still incomplete."""
    ok: dict[tuple[Any, ...], dict[str, Any]] = {}
    failed: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in map(_norm, records):
        if r["status"] == STATUS_OK:
            ok[(r["allocation_id"], *_key(r), int(r["repeat"]), _phase(r))] = r
        else:
            failed[(r["allocation_id"], *_key(r))] = r
    ok = _one_complete_set(ok, repeats)
    counts: dict[tuple[int, int, int, int], int] = {}
    for r in ok.values():
        if _phase(r) == PHASE_BURST:
            counts[_key(r)] = counts.get(_key(r), 0) + 1
    complete = {k for k, n in counts.items() if n >= repeats}
    kept_failed = [r for r in failed.values() if _key(r) not in complete]
    return sorted(
        [*ok.values(), *kept_failed],
        key=lambda r: (_phase(r), _key(r), str(r["allocation_id"]), int(r["repeat"]), r["status"]),
    )


def _one_complete_set(
    ok: dict[tuple[Any, ...], dict[str, Any]], repeats: int
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Where one allocation measured a grid point completely (``repeats`` samples), keep
    that allocation's samples only (the earliest such, by its first sample): two runs of
    the same sweep started together measure the same points, and the partition would
    hold every point twice. Points no allocation completed keep every sample (a rerun
    after a crash adds to them)."""
    per: dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]] = {}
    for r in ok.values():
        if _phase(r) == PHASE_BURST:
            per.setdefault(_key(r), {}).setdefault(str(r["allocation_id"]), []).append(r)
    drop: set[tuple[Any, ...]] = set()
    for key, by_alloc in per.items():
        full = [rows for rows in by_alloc.values() if len(rows) >= repeats]
        if len(by_alloc) < 2 or not full:
            continue
        keep = min(full, key=lambda rows: min(str(r["probed_at"]) for r in rows))
        keep_id = str(keep[0]["allocation_id"])
        drop |= {(a, *key) for a in by_alloc if a != keep_id}
    return {
        k: r
        for k, r in ok.items()
        if _phase(r) != PHASE_BURST or (str(r["allocation_id"]), *_key(r)) not in drop
    }


def _phase(r: dict[str, Any]) -> str:
    return str(r.get("phase") or PHASE_BURST)


def complete_points(records: Iterable[dict[str, Any]], repeats: int) -> set[tuple[int, ...]]:
    """Grid points with ``repeats`` good samples (sustained-probe rows are not grid
    points, even at a grid point's size)."""
    counts: dict[tuple[int, int, int, int], int] = {}
    for r in records:
        if r["status"] == STATUS_OK and _phase(r) == PHASE_BURST:
            counts[_key(r)] = counts.get(_key(r), 0) + 1
    return {k for k, n in counts.items() if n >= repeats}


def slots_missing_sustained(records: Iterable[dict[str, Any]], config: SweepConfig) -> set[int]:
    """Allocation slots whose sustained-transfer probe (``config.sustained_s`` > 0) has
    fewer than ``repeats`` good rows: a killed run's, or one never made. A rerun measures
    it again, alone if every grid point is stored."""
    if config.sustained_s <= 0:
        return set()
    counts: dict[int, int] = {}
    for r in records:
        if r["status"] == STATUS_OK and _phase(r) == PHASE_SUSTAINED:
            slot = int(r["allocation_slot"])
            counts[slot] = counts.get(slot, 0) + 1
    return {s for s in range(config.allocations) if counts.get(s, 0) < config.repeats}


class _Partition:
    """The committed rows of one partition plus its uncommitted partial files."""

    def __init__(
        self, day: date, provider: str, instance_type: str, root: Path | None, fresh: bool
    ) -> None:
        self.day, self.provider, self.instance_type, self.root = day, provider, instance_type, root
        self.folder = partition_dir(day, provider, instance_type, root)
        self.partials = partial_dir(day, provider, instance_type, root)
        if fresh:
            for f in self.partials.glob("*.jsonl"):
                f.unlink()
        file = self.folder / PARTITION_FILE
        self.committed: list[dict[str, Any]] = (
            read_partition_table(file).to_pylist() if file.exists() and not fresh else []
        )
        self.fresh = fresh

    def all_records(self) -> list[dict[str, Any]]:
        rows = list(self.committed)
        for f in sorted(self.partials.glob("*.jsonl")):
            rows.extend(_read_jsonl(f))
        return rows

    def _read_committed(self) -> list[dict[str, Any]]:
        file = self.folder / PARTITION_FILE
        if self.fresh or not file.exists():
            return list(self.committed) if self.fresh else []
        rows: list[dict[str, Any]] = read_partition_table(file).to_pylist()
        return rows

    def commit(self, repeats: int) -> tuple[Path, list[dict[str, Any]]]:
        """Merge the partition as it is on disk now with every partial file no live run
        is writing, write it, then delete those files; one commit at a time per partition
        (a lock beside its partial files). Another run's partition rows are never lost
        (they are re-read under the lock) and its partial file is never deleted under it
        (each run holds its file's writer lock while it measures)."""
        if not any(self.partials.glob("*.jsonl")):  # nothing new (the folder may not exist)
            self.committed = self._read_committed()
            return self.folder / PARTITION_FILE, self.committed
        with FileLock(self.partials / COMMIT_LOCK), contextlib.ExitStack() as held:
            files = []
            for f in sorted(self.partials.glob("*.jsonl")):
                lock = FileLock(writer_lock(f))
                try:
                    lock.acquire(timeout=0)
                except Timeout:
                    continue  # a live run still writes it: its own commit takes it
                held.callback(lock.release)
                files.append(f)
            self.committed = self._read_committed()
            if not files:  # nothing new: leave the partition as it is
                return self.folder / PARTITION_FILE, self.committed
            parsed = {f: _parse_lines(f) for f in files}
            rows = [*self.committed, *(r for lines in parsed.values() for r in lines if r)]
            merged = merge_records(rows, repeats)
            path = write_partition(
                records_to_table(merged),
                day=self.day,
                provider=self.provider,
                instance_type=self.instance_type,
                root=self.root,
            )
            for f in files:  # only once the partition holds their rows
                bad = sum(r is None for r in parsed[f])
                if bad:  # kept for a look, out of every later run's way
                    f.replace(f.with_name(f.name + ".bad"))
                    print(
                        f"probe store: {bad} line(s) of {f} were not probe rows; "
                        f"kept as {f.name}.bad",
                        file=sys.stderr,
                    )
                else:
                    f.unlink()
            self.committed = merged
            self.fresh = False
            return path, merged


# ---------------------------------------------------------------------- running
@contextlib.contextmanager
def _released(provider: Provider, allocation: Allocation) -> Iterator[None]:
    try:
        yield
    finally:
        provider.release(allocation)


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
    log_dir = getattr(provider, "log_dir", None)
    folder = log_dir(allocation) if callable(log_dir) else None
    if folder is None:
        return ""
    path = Path(folder) / f"rank-{rank}.log"
    if not path.exists():
        return ""
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:500] if lines else ""


def run_points(
    provider: Provider,
    allocation: Allocation,
    config: SweepConfig,
    points: list[Point],
    *,
    day: date,
    root: Path | None = None,
    on_point: Callable[[], None] | None = None,
    sustained_slot: int | None = None,
) -> tuple[list[dict[str, Any]], list[FailedPoint]]:
    """Measure ``points`` on ``allocation`` (and, with ``sustained_slot``, the
    sustained-transfer probe for that slot at the largest world size); return the rows
    rank 0 wrote (ok and failed) and the points that failed. The partial file stays until
    the caller commits it."""
    check_fits(config, allocation.ranks, f"{allocation.count} x {allocation.spec.name}")
    folder = partial_dir(day, allocation.provider, allocation.spec.name, root)
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{allocation.id}.jsonl"
    plan_path = folder / f".{allocation.id}.plan.json"
    plan = {
        "config": config.to_dict(),
        "points": [list(p.key) for p in points],
        "sustained": None if sustained_slot is None else [sustained_slot, config.max_world_size],
        "labels": labels(allocation, day),
        "out": str(out),
    }
    plan_path.write_text(json.dumps(plan))
    with FileLock(writer_lock(out)):  # this run owns the partial file while it measures
        provider.run(  # this call waits for them: they end with it
            allocation,
            [sys.executable, "-m", "srifty_core.measure.probe_worker", str(plan_path)],
            caller_env(),
        )
        deadline = time.monotonic() + config.sweep_timeout_s
        first_failure: float | None = None
        timed_out = False
        seen = 0
        while True:
            codes = provider.exit_codes(allocation)
            if on_point is not None and out.exists():
                done = len(complete_points(_read_jsonl(out), config.repeats))
                for _ in range(done - seen):
                    on_point()
                seen = max(seen, done)
            if all(c is not None for c in codes.values()):
                break
            if first_failure is None and any(c not in (None, 0) for c in codes.values()):
                first_failure = time.monotonic()
            if first_failure is not None and time.monotonic() - first_failure > FAILURE_GRACE_S:
                break
            if time.monotonic() > deadline:
                timed_out = True
                break
            time.sleep(POLL_S)
        codes = provider.exit_codes(allocation)
        if any(c is None for c in codes.values()):
            provider.stop(allocation)
            codes = provider.exit_codes(allocation)
        plan_path.unlink(missing_ok=True)
        rows = _read_jsonl(out) if out.exists() else []
    failed_ok = all(c == 0 for c in codes.values()) and not timed_out
    complete = complete_points(rows, config.repeats)
    missing = [p for p in points if p.key not in complete]
    if sustained_slot is not None and sustained_slot in slots_missing_sustained(rows, config):
        missing.append(Point(sustained_slot, config.max_world_size, config.sustained_bytes, 1))
    failures: list[FailedPoint] = []
    if missing:
        summary = _exit_summary(codes, timed_out, config.sweep_timeout_s)
        if failed_ok:
            summary = "workers exited 0 without measuring it"
        reported = {_key(r): r for r in rows if r["status"] == STATUS_FAILED}
        first = missing[0]
        if first.key in reported:
            reported[first.key]["error"] = f"{reported[first.key]['error']} ({summary})"
        else:
            tail = _log_tail(provider, allocation, 0)
            row = {**labels(allocation, day), "allocation_slot": first.allocation_slot}
            row.update(
                world_size=first.world_size,
                buffer_bytes=first.buffer_bytes,
                concurrent=first.concurrent,
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
        _rewrite_jsonl(out, rows)
        failures = [FailedPoint(first, str(reported[first.key]["error"]))]
        failures += [
            FailedPoint(p, f"not measured: the run stopped at {_fmt_point(first)}")
            for p in missing[1:]
        ]
    return rows, failures


def _rewrite_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    write_text_atomic(path, "".join(json.dumps(r, default=str) + "\n" for r in rows))


def _fmt_point(p: Point) -> str:
    return (
        f"slot {p.allocation_slot}, world size {p.world_size}, "
        f"{format_size(p.buffer_bytes)} x {p.concurrent}"
    )


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
    t0 = time.perf_counter()
    day = day or datetime.now(UTC).date()
    check_fits(config, allocation.ranks, f"{allocation.count} x {allocation.spec.name}")
    check_backend(config, allocation.ranks)
    part = _Partition(day, allocation.provider, allocation.spec.name, root, fresh)
    records = part.all_records()
    done = complete_points(records, config.repeats)
    todo = [p for p in config.points(slot) if p.key not in done]
    sustained = slot if slot in slots_missing_sustained(records, config) else None
    failures: list[FailedPoint] = []
    if todo or sustained is not None:
        progress = _Progress(len(todo), on_progress)
        _, failures = run_points(
            provider,
            allocation,
            config,
            todo,
            day=day,
            root=root,
            on_point=progress.tick,
            sustained_slot=sustained,
        )
    path, merged = part.commit(config.repeats)
    return SweepResult(
        partition=path,
        rows=sum(1 for r in merged if r["status"] == STATUS_OK),
        measured=len(todo) - len(failures),
        skipped=len(config.points(slot)) - len(todo),
        failed=tuple(failures),
        allocation_ids=(allocation.id,) if todo or sustained is not None else (),
        wall_s=time.perf_counter() - t0,
    )


class _Progress:
    def __init__(self, total: int, fn: ProgressFn | None) -> None:
        self.total, self.done, self.fn = total, 0, fn

    def tick(self) -> None:
        self.done += 1
        if self.fn is not None:
            self.fn(self.done, self.total)


def checked_size(
    config: SweepConfig, provider: Provider, instance_type: str, instances: int | None
) -> tuple[InstanceSpec, int]:
    """(the type's spec, how many instances) for a sweep of ``config``, after checking
    them: one instance type, ``instances`` (default: as many as the largest world size
    needs) at least 1, the world sizes fit, the backend runs here."""
    check_single_type(instance_type, provider)
    spec = provider.instance_type(instance_type)
    count = (
        instances
        if instances is not None
        else math.ceil(config.max_world_size / spec.ranks_per_instance)
    )
    if count < 1:
        raise ConfigError(f"instances: must be at least 1, got {count}")
    check_fits(config, count * spec.ranks_per_instance, f"{count} x {instance_type}")
    check_backend(config, count * spec.ranks_per_instance)
    return spec, count


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
) -> SweepResult:
    """The whole sweep for one instance type on one day (see the module doc).

    ``instances`` defaults to as many as the largest world size needs. Every allocation
    is released before this returns, whatever happens. Failed points do not raise: look
    at ``result.failed`` or call ``result.raise_for_failures()``.
    """
    t0 = time.perf_counter()
    if provider is None:
        provider = LocalProvider()
    spec, count = checked_size(config, provider, instance_type, instances)
    day = day or datetime.now(UTC).date()
    part = _Partition(day, provider.name, spec.name, root, fresh)
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
        points = [p for p in todo if p.allocation_slot == slot]
        alloc = provider.launch(
            LaunchRequest(instance_type, count, market=market, placement_group=placement_group)
        )
        alloc_ids.append(alloc.id)
        with owning(part.partials, alloc.id), _released(provider, alloc):
            _, failed = run_points(
                provider,
                alloc,
                config,
                points,
                day=day,
                root=root,
                on_point=progress.tick,
                sustained_slot=slot if slot in sustained else None,
            )
            failures.extend(failed)
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
