"""A probe sweep's results on disk: the partial files its workers append to, and their
commit into the probe store's partition.

Rank 0 appends each completed point to a per-allocation partial file
(``_partial/.../<allocation id>.jsonl`` under the store) and fsyncs it; a run holds the
file's writer lock (``writer_lock``) while its workers append. ``Partition.commit`` merges
the partition and every partial file no live run is writing (``merge_records``: ok rows
deduplicated, one complete set per grid point, failed rows only for points still
incomplete), writes the partition atomically, and only then deletes those files; one
commit at a time per partition. ``complete_points`` and ``slots_missing_sustained`` say
what a rerun still has to measure.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterable
from datetime import date, datetime
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from srifty_core import paths
from srifty_core.atomic import write_text_atomic
from srifty_core.probing.config import ALL_REDUCE, SweepConfig
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


def writer_lock(partial: Path) -> str:
    """The lock a run holds on its partial file while its workers append to it."""
    return str(partial) + ".lock"


def partial_dir(day: date, provider: str, instance_type: str, root: Path | None = None) -> Path:
    base = root or paths.probe_store_dir()
    part = partition_dir(day, provider, instance_type, base)
    return base / PARTIAL_DIR / part.relative_to(base)


def read_partial(path: Path) -> list[dict[str, Any]]:
    """The probe rows of a partial file; lines that are not a probe row (torn by a crash
    mid-write, or garbage) are left out."""
    return [r for r in _parse_lines(path) if r is not None]


def parse_partial_text(text: str, labels: dict[str, Any]) -> list[dict[str, Any]]:
    """``read_partial`` of a partial file's text whose rows still lack ``labels`` (a
    ring's rows read from run storage: its allocations were launched after its plan was
    written)."""
    return [r for r in _parse_text(text, labels) if r is not None]


def _parse_lines(path: Path) -> list[dict[str, Any] | None]:
    return _parse_text(path.read_text(encoding="utf-8", errors="replace"))


def _parse_text(text: str, labels: dict[str, Any] | None = None) -> list[dict[str, Any] | None]:
    """Each line's row, or None where a whole line is not one; a last line without its
    newline that is not a row (torn by a crash mid-write) is left out without a None."""
    out: list[dict[str, Any] | None] = []
    lines = text.split("\n")
    for k, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            d: Any = json.loads(line)
        except json.JSONDecodeError:
            d = None
        if labels and isinstance(d, dict):
            d = {**d, **labels}
        if not _is_row(d):
            d = None
        if d is not None or k < len(lines) - 1:
            out.append(d)
    return out


_ROW_FIELDS = frozenset(COLUMNS) - {
    "phase",
    "collective",
    "time_s",
    "busbw",
    "error",
    *NULLABLE_SINCE,
}


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


PointKey = tuple[int, int, int, int, str]


def point_key(r: dict[str, Any]) -> PointKey:
    """A row's grid point (``Point.key``); a row without ``collective`` is an allreduce's."""
    return (
        int(r["allocation_slot"]),
        int(r["world_size"]),
        int(r["buffer_bytes"]),
        int(r["concurrent"]),
        str(r.get("collective") or ALL_REDUCE),
    )


def merge_records(records: Iterable[dict[str, Any]], repeats: int) -> list[dict[str, Any]]:
    """Rows of the partition after merging: ok rows deduplicated (by allocation, point and
    repeat; the last wins), failed rows kept only for points that are still incomplete."""
    ok: dict[tuple[Any, ...], dict[str, Any]] = {}
    failed: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in map(_norm, records):
        if r["status"] == STATUS_OK:
            ok[(r["allocation_id"], *point_key(r), int(r["repeat"]), _phase(r))] = r
        else:
            failed[(r["allocation_id"], *point_key(r))] = r
    ok = _one_complete_set(ok, repeats)
    counts: dict[PointKey, int] = {}
    for r in ok.values():
        if _phase(r) == PHASE_BURST:
            counts[point_key(r)] = counts.get(point_key(r), 0) + 1
    complete = {k for k, n in counts.items() if n >= repeats}
    kept_failed = [r for r in failed.values() if point_key(r) not in complete]
    return sorted(
        [*ok.values(), *kept_failed],
        key=lambda r: (
            _phase(r),
            point_key(r),
            str(r["allocation_id"]),
            int(r["repeat"]),
            r["status"],
        ),
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
            per.setdefault(point_key(r), {}).setdefault(str(r["allocation_id"]), []).append(r)
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
        if _phase(r) != PHASE_BURST or (str(r["allocation_id"]), *point_key(r)) not in drop
    }


def _phase(r: dict[str, Any]) -> str:
    return str(r.get("phase") or PHASE_BURST)


def complete_points(records: Iterable[dict[str, Any]], repeats: int) -> set[PointKey]:
    """Grid points with ``repeats`` good samples (sustained-probe rows are not grid
    points, even at a grid point's size)."""
    counts: dict[PointKey, int] = {}
    for r in records:
        if r["status"] == STATUS_OK and _phase(r) == PHASE_BURST:
            counts[point_key(r)] = counts.get(point_key(r), 0) + 1
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


class Partition:
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
            rows.extend(read_partial(f))
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


def rewrite_partial(path: Path, rows: list[dict[str, Any]]) -> None:
    """Replace the partial file ``path`` with ``rows`` (atomically)."""
    write_text_atomic(path, "".join(json.dumps(r, default=str) + "\n" for r in rows))
