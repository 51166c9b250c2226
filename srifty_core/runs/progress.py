"""The progress log: one JSON line per finished training step, appended by rank 0, and the
state file: rank 0's latest step in one small JSON object, replaced atomically each step.

Each line is written, flushed and ``fsync``-ed before the next step starts, so the log is
readable while the job runs and survives a killed worker (at worst the last line is cut
short; readers skip a partial last line). At a remote URI (``s3://...``) the log is a
folder of segments and the state file one object (``run_store``). The monitor reads the
log incrementally (``ProgressTail``: only the bytes added since its last look) and the
state file for the iteration the last checkpoint holds, so it never loads the checkpoint.
Light: no torch import.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from srifty_core.atomic import open_for_append
from srifty_core.errors import ConfigError
from srifty_core.runs import store as run_store

PROGRESS_FILE = "progress.jsonl"
STATE_FILE = "state.json"


@dataclass(frozen=True, slots=True)
class ProgressRecord:
    """One finished step."""

    iteration: int
    """Iterations done after this step (1 for the first step of the job)."""
    wall_time: float
    """Unix time when the step finished."""
    step_s: float
    """How long the step took: from the end of the step before (when the ranks last met)
    to the end of this one, so forward, backward, allreduce, optimizer and the job's own
    writes in between (``upkeep_s``). Rank 0's period: another rank's starts when that rank
    left the last all-gather, which can be a few ms earlier or later under CPU contention,
    so in one step a rank's ``compute_s`` can exceed the step by that skew (over steps the
    periods agree)."""
    samples: int
    """Samples processed in this step (the global batch)."""
    config_id: str
    """Which configuration ran it (changes at every re-plan)."""
    compute_s: tuple[float, ...] | None = None
    """Per rank (plan order): seconds from the forward pass's start to the last gradient
    bucket ready (forward + backward, DDP's bucket copies included, the exchange's tail
    wait not); ``None`` where not measured (older logs, CUDA ranks)."""
    exchange_s: float | None = None
    """Seconds the gradient exchange kept the links busy in this step (the least over the
    ranks: a rank that was early also waited for its peers); ``None`` where not measured."""
    upkeep_s: float | None = None
    """Seconds of ``step_s`` that rank 0 spent on the job's own writes after the step before
    (this log's line, a checkpoint, the state file): job time, but not the training step
    the simulator predicts (``train_s``); ``None`` where not measured (older logs)."""
    loss: float | None = None
    """The global batch's mean loss at this step, where the writer knows it (a training
    script's ``worker.user.report``; the built-in worker logs rank 0's share)."""

    @property
    def train_s(self) -> float:
        """The training step: ``step_s`` less the job's own writes (``upkeep_s``)."""
        return max(self.step_s - (self.upkeep_s or 0.0), 0.0)

    def to_dict(self) -> dict[str, Any]:
        """The record as a log line holds it (the optional fields only when measured)."""
        d = asdict(self)
        for k in ("compute_s", "exchange_s", "upkeep_s", "loss"):
            if d[k] is None:
                del d[k]
        if self.compute_s is not None:
            d["compute_s"] = list(self.compute_s)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProgressRecord:
        """A record read back; ``ConfigError`` naming the field when one is missing or of
        the wrong kind (a string or fractional iteration, a NaN or negative time), so a
        damaged log is an error the monitor reports, never a record it computes with."""
        if not isinstance(d, dict):
            raise ConfigError(f"progress record: a JSON object expected, got {_show(d)}")
        for name in ("iteration", "wall_time", "step_s", "samples", "config_id"):
            if name not in d:
                raise ConfigError(f"progress record: field {name!r} missing")
        compute = d.get("compute_s")
        exchange = d.get("exchange_s")
        upkeep = d.get("upkeep_s")
        loss = d.get("loss")
        if loss is not None and (isinstance(loss, bool) or not isinstance(loss, int | float)):
            raise ConfigError(f"progress record: loss must be a number, got {_show(loss)}")
        if compute is not None and not isinstance(compute, list):
            raise ConfigError(f"progress record: compute_s must be a list, got {_show(compute)}")
        if not isinstance(d["config_id"], str):
            bad = _show(d["config_id"])
            raise ConfigError(f"progress record: config_id must be text, got {bad}")
        return cls(
            iteration=_whole("iteration", d["iteration"]),
            wall_time=_time("wall_time", d["wall_time"]),
            step_s=_time("step_s", d["step_s"]),
            samples=_whole("samples", d["samples"]),
            config_id=d["config_id"],
            compute_s=None if compute is None else tuple(_time("compute_s", x) for x in compute),
            exchange_s=None if exchange is None else _time("exchange_s", exchange),
            upkeep_s=None if upkeep is None else _time("upkeep_s", upkeep),
            loss=None if loss is None else float(loss),
        )


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _whole(name: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int | float) or v != int(v) or v < 0:
        raise ConfigError(f"progress record: {name} must be a whole number >= 0, got {_show(v)}")
    return int(v)


def _time(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
        raise ConfigError(f"progress record: {name} must be a finite time >= 0, got {_show(v)}")
    return float(v)


class ProgressLog:
    """Append-only, durable JSONL writer (use as a context manager or call ``close``).

    At a local path each record is a line of the file, flushed and ``fsync``-ed at once.
    At a remote URI (``run_store``) the log is a folder of segments, one stream per
    configuration and ``rank`` (``<config>-<rank>``): records are buffered and written as
    one object per ``flush_s`` window, and at ``flush`` and ``close`` (a killed writer
    loses at most its last window; the checkpoint, not the log, is what a run resumes
    from)."""

    def __init__(
        self, path: Path | str, *, rank: int = 0, flush_s: float = run_store.FLUSH_S
    ) -> None:
        self.remote = run_store.is_remote(path)
        self.path: Path | str = str(path) if self.remote else Path(path)
        self.rank = rank
        self.flush_s = flush_s
        self._closed = False
        self._fh: IO[str] | None = None
        self._streams: dict[str, run_store.SegmentWriter] = {}
        if not self.remote:
            local = Path(path)
            local.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open_for_append(local)

    def append(self, record: ProgressRecord) -> None:
        if self._closed:
            raise ConfigError(f"progress log {self.path} is closed")
        line = json.dumps(record.to_dict(), separators=(",", ":"))
        if self._fh is None:
            writer = self._streams.get(record.config_id)
            if writer is None:
                stream = run_store.stream_name(record.config_id, self.rank)
                writer = run_store.SegmentWriter(str(self.path), stream, flush_s=self.flush_s)
                self._streams[record.config_id] = writer
            writer.write_line(line)
            return
        self._fh.write(line + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def flush(self) -> None:
        """Write what a remote log buffers now (a local log is always written)."""
        for w in self._streams.values():
            w.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        for w in self._streams.values():
            w.close()

    def __enter__(self) -> ProgressLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_progress(path: Path | str) -> Iterator[ProgressRecord]:
    """Records in file order; a missing file is empty; a cut-short last line is skipped; a
    record of the wrong shape is a ``ConfigError`` naming the log and the record."""
    for k, d in enumerate(iter_jsonl(path)):
        try:
            yield ProgressRecord.from_dict(d)
        except ConfigError as exc:
            raise ConfigError(f"{path}: record {k + 1}: {exc}") from None


def iter_jsonl(path: Path | str) -> Iterator[dict[str, Any]]:
    """The objects of an append-only JSON-lines log, in order: a missing file is empty, a
    cut-short last line (being written, or cut by a kill) is skipped, any other line that
    is not JSON raises ``ConfigError``. A remote log's segments are merged by time
    (``run_store.read_log``)."""
    if run_store.is_remote(path):
        yield from run_store.read_log(str(path))
        return
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return
    lines = text.split("\n")
    for k, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            if k == len(lines) - 1:
                return  # being written or cut by a kill
            raise ConfigError(f"{path}: line {k + 1} is not JSON") from None
        yield d


def read_progress(path: Path | str) -> list[ProgressRecord]:
    return list(iter_progress(path))


def rewind(path: Path | str, iteration: int) -> int:
    """Cut the records after ``iteration`` off the end of the progress log ``path``: what
    an attempt that died between two checkpoints logged after the checkpoint a rerun
    resumes from (``iteration``), which the rerun logs again. Without this the log holds
    those iterations twice, and the monitor's windows mix the two attempts. The records
    cut keep their bytes in ``progress.jsonl.after-<iteration>.<unix time>.old`` beside
    it (written before the log is cut); a torn last line goes with them. Returns how many
    records were cut. Call it before anything tails the log (``ProgressTail`` reads on
    from an offset). A remote log (segments) is left as it is."""
    if run_store.is_remote(path):
        return 0
    log = Path(path)
    try:
        data = log.read_bytes()
    except FileNotFoundError:
        return 0
    keep, cut = len(data), 0
    lines = data.split(b"\n")
    end = len(data)
    for k in range(len(lines) - 1, -1, -1):  # from the end while records are past it
        line = lines[k]
        start = end - len(line)
        if line.strip():
            try:
                later = _whole("iteration", json.loads(line)["iteration"]) > iteration
                record = True
            except (ValueError, KeyError, TypeError):  # ConfigError too
                later, record = k == len(lines) - 1, False  # a torn last line goes
            if not later:
                break
            keep = start
            cut += record
        end = start - 1  # the newline before this line
    if keep >= len(data):
        return 0
    aside = log.with_name(f"{log.name}.after-{iteration}.{int(time.time())}.old")
    with open(aside, "ab") as fh:
        fh.write(data[keep:])
        fh.flush()
        os.fsync(fh.fileno())
    os.truncate(log, keep)
    return cut


WARMUP_STEPS = 3
"""A configuration's first steps, left out of what it measures: fresh worker processes
fault their heap in, fill caches and initialise lazily. In the demo's runs (ResNet-18 on
local CPU workers) steps 1-3 of each configuration took 2.2x, 1.4x and 1.1-1.2x the steady
step, and the fourth was steady; the profiler and ``profiling.ddp_check`` warm up likewise."""


def steady_steps(records: Iterable[ProgressRecord], config_id: str) -> list[ProgressRecord]:
    """The steps of configuration ``config_id`` after its ``WARMUP_STEPS``; with too few
    for that to leave two, after its first only."""
    mine = [r for r in records if r.config_id == config_id]
    skip = WARMUP_STEPS if len(mine) >= WARMUP_STEPS + 2 else 1
    return mine[skip:]


def median_step_s(records: Iterable[ProgressRecord], config_id: str) -> float | None:
    """The measured iteration time of configuration ``config_id``: the median training
    step (``train_s``) of its ``steady_steps``; ``None`` with fewer than 3 steps."""
    steady = steady_steps(records, config_id)
    return statistics.median(r.train_s for r in steady) if len(steady) >= 2 else None


@dataclass(frozen=True, slots=True)
class TrainState:
    """Rank 0's latest step (the state file)."""

    iteration: int
    wall_time: float
    config_id: str
    checkpoint_iteration: int
    """The iteration the checkpoint on disk holds (written before this state)."""
    loss: float | None = None
    """The global batch's mean loss at this step."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainState:
        loss = d.get("loss")
        return cls(
            int(d["iteration"]), float(d["wall_time"]), str(d["config_id"]),
            int(d["checkpoint_iteration"]), None if loss is None else float(loss),
        )  # fmt: skip


def write_state(path: Path | str, state: TrainState) -> None:
    """Replace the state file atomically (a reader sees the old or the new one, whole)."""
    run_store.write_text(path, json.dumps(asdict(state), separators=(",", ":")))


def read_state(path: Path | str) -> TrainState | None:
    """The state file, or ``None`` while the workers have written none."""
    text = run_store.read_text(path)
    if text is None:
        return None
    try:
        return TrainState.from_dict(json.loads(text))
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a training state ({exc})") from exc


REFUSED_PREFIX = "refused-"
"""``refused-<config>.txt``: why the runtime refused what a training script reported
(``worker.user``: an iteration out of order, a non-finite loss, the last iteration never
reached or never checkpointed), written by rank 0 before its rank stops; the monitor fails
the job with it (``refused_report``)."""


def refused_path(run_dir: Path | str, config_id: str) -> Path | str:
    return run_store.join(run_dir, f"{REFUSED_PREFIX}{config_id}.txt")


def refuse_report(run_dir: Path | str, config_id: str, reason: str) -> None:
    """Record why a script's report was refused (one line) for the monitor."""
    run_store.write_text(refused_path(run_dir, config_id), reason.strip() + "\n")


def refused_report(run_dir: Path | str, config_id: str, since: float) -> str | None:
    """Why this configuration's script was stopped for what it reported, if it was, since
    the Unix time ``since`` (an older note is an earlier run's on the same folder)."""
    where = refused_path(run_dir, config_id)
    try:
        if run_store.modified(where) < since - 1.0:  # S3 keeps the time to the second
            return None
    except FileNotFoundError:
        return None
    text = run_store.read_text(where)
    return None if text is None else text.strip()


class ProgressTail:
    """Reads a growing progress log incrementally: each ``read`` parses only the complete
    lines added since the last one (a line being written waits for the next read). A
    remote log reads only the segments added or grown since (``run_store.LogTail``)."""

    def __init__(self, path: Path | str) -> None:
        self.remote = run_store.is_remote(path)
        self.path: Path | str = str(path) if self.remote else Path(path)
        self.offset = 0
        self._tail = run_store.LogTail(str(path)) if self.remote else None

    def read(self) -> list[ProgressRecord]:
        if self._tail is not None:
            return [ProgressRecord.from_dict(d) for d in self._tail.read()]
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        if end == 0:
            return []
        self.offset += end
        out = []
        for line in data[:end].decode("utf-8").splitlines():
            if not line.strip():
                continue
            try:
                out.append(ProgressRecord.from_dict(json.loads(line)))
            except json.JSONDecodeError:
                raise ConfigError(f"{self.path}: a line is not JSON") from None
        return out
