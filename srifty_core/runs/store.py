"""Run-folder storage: read, write and list a run folder's objects at a local path or at an
fsspec URI (``s3://bucket/prefix/runs/<run>`` through s3fs), with the same durable
semantics on both.

- **Whole objects** (the state file, plans, decisions' snapshots): on a local disk a
  temporary file in the same folder renamed over the target (``atomic.write_text_atomic``);
  on an object store one PUT, which readers see whole or not at all.
- **Checkpoints** (``publish``): on a local disk written to a temporary file, ``fsync``-ed,
  then renamed over the target; on an object store written to a temporary key, then moved
  (a server-side copy) over the target, so the published key only ever holds a checkpoint
  that was written completely; the temporary key is removed whatever happens.
- **Append-only logs** (the progress log, the monitor's decisions): a local file is
  appended line by line (``atomic.open_for_append``). An object store cannot append, so
  there a log ``<folder>/progress.jsonl`` is a folder of SEGMENTS ``<folder>/progress/
  <stream>-<seq>.jsonl``: one stream per writer (``<config>-<rank>``), one object per flush
  window (``SegmentWriter``), written create-only, never rewritten. Readers (``read_log``,
  ``LogTail``) merge the streams by time, each stream in sequence order, and skip a torn
  last line (a backend that is not atomic, or a writer killed mid-write), as they do
  locally. A GET that fails is never skipped over: ``read_log`` raises, ``LogTail`` tries
  that segment (and its stream's later ones) again at its next read.

Object stores list and read with strong consistency (S3 since 2020), so a reader sees every
object whose write returned. Listings are never served from fsspec's cache here.
Light: no torch import.
"""

from __future__ import annotations

import contextlib
import heapq
import json
import logging
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from srifty_core import paths
from srifty_core.atomic import write_text_atomic
from srifty_core.errors import ConfigError

Location = Path | str
"""A local path, or a URI (``s3://bucket/key``, ``memory://...``, ``file://...``)."""
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
FLUSH_S = 5.0
"""A segment writer's flush window (seconds): what a reader may lag behind the writer."""
MAX_PUT_FAILURES = 5
"""Failed segment PUTs in a row that a writer tolerates (keeping its lines) before raising."""
READ_RETRIES = 5
"""Reads in a row in which a ``LogTail`` may fail to fetch the same segment before raising."""
_log = logging.getLogger(__name__)


def is_remote(location: Location) -> bool:
    """Whether ``location`` is a URI other than ``file://`` (a local path is not)."""
    s = str(location)
    return bool(_SCHEME.match(s)) and not s.startswith("file://")


def local_path(location: Location) -> Path | None:
    """The local path of ``location`` (``file://`` stripped), or ``None`` for a URI."""
    s = str(location)
    if s.startswith("file://"):
        return Path(s[len("file://") :])
    return None if is_remote(s) else Path(s)


def join(root: Location, *names: str) -> Path | str:
    """``root / name / ...``: a ``Path`` for a local root, a URI string for a remote one
    (``Path`` would fold a URI's ``//``)."""
    local = local_path(root)
    if local is not None:
        return local.joinpath(*names)
    return "/".join([str(root).rstrip("/"), *(n.strip("/") for n in names)])


def parent(location: Location) -> Path | str:
    local = local_path(location)
    if local is not None:
        return local.parent
    return str(location).rstrip("/").rsplit("/", 1)[0]


def name(location: Location) -> str:
    return str(location).rstrip("/").rsplit("/", 1)[-1]


def filesystem(uri: str) -> tuple[Any, str]:
    """The fsspec filesystem and the path inside it, for a remote ``uri``. The endpoint
    and credentials come from the environment (``AWS_ENDPOINT_URL_S3``, an instance
    profile, ...), never from a trigger conf."""
    import fsspec

    try:
        fs, where = fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"run storage {uri!r}: {exc}") from exc
    return fs, where


def read_bytes(location: Location) -> bytes | None:
    """The object's bytes, or ``None`` when there is none."""
    local = local_path(location)
    try:
        if local is not None:
            return local.read_bytes()
        fs, where = filesystem(str(location))
        data: bytes = fs.cat_file(where)
        return data
    except FileNotFoundError:
        return None


def read_text(location: Location) -> str | None:
    data = read_bytes(location)
    return None if data is None else data.decode("utf-8")


def exists(location: Location) -> bool:
    local = local_path(location)
    if local is not None:
        return local.exists()
    fs, where = filesystem(str(location))
    fs.invalidate_cache()
    return bool(fs.exists(where))


def modified(location: Location) -> float:
    """When the object was last written (unix seconds; on S3 to the second);
    ``FileNotFoundError`` when there is none."""
    local = local_path(location)
    if local is not None:
        return local.stat().st_mtime
    fs, where = filesystem(str(location))
    fs.invalidate_cache(where)
    when = fs.modified(where)
    return float(when.timestamp())


def write_text(location: Location, text: str) -> Path | str:
    """Replace a small object whole: a reader sees the old one or the new one."""
    local = local_path(location)
    if local is not None:
        return write_text_atomic(local, text)
    fs, where = filesystem(str(location))
    fs.pipe_file(where, text.encode("utf-8"))  # one PUT: whole or not at all
    return str(location)


def publish(location: Location, data: bytes) -> Path | str:
    """Write ``data`` as the object at ``location`` and make it visible only once it is
    complete (see the module's doc); returns its location."""
    local = local_path(location)
    if local is not None:
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, local)
        finally:
            tmp.unlink(missing_ok=True)
        return local
    fs, where = filesystem(str(location))
    head, _, base = where.rpartition("/")
    tmp_key = f"{head}/.{base}.{uuid.uuid4().hex}.tmp"
    try:
        fs.pipe_file(tmp_key, data)
        fs.copy(tmp_key, where)  # server-side: the target appears whole, once
    finally:
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(tmp_key)
    return str(location)


def move_aside(location: Location, suffix: str) -> None:
    """Rename ``location`` (an object, or a log's segment folder) to ``<name>.<suffix>``;
    nothing when it does not exist."""
    local = local_path(location)
    if local is not None:
        if local.exists():
            os.replace(local, local.with_name(f"{local.name}.{suffix}"))
        return
    fs, where = filesystem(str(location))
    fs.invalidate_cache()
    if fs.isfile(where):
        fs.mv(where, f"{where}.{suffix}")
    folder = segment_folder(where)
    if fs.isdir(folder):
        for src in fs.find(folder):
            fs.mv(src, f"{folder}.{suffix}/{src.rsplit('/', 1)[-1]}")


def names(folder: Location, pattern: str) -> list[str]:
    """The names of the objects directly in ``folder`` that match the glob ``pattern``."""
    import fnmatch

    local = local_path(folder)
    if local is not None:
        return sorted(p.name for p in local.glob(pattern))
    fs, where = filesystem(str(folder))
    fs.invalidate_cache(where)
    try:
        found = fs.ls(where, detail=False)
    except FileNotFoundError:
        return []
    base = (str(f).rsplit("/", 1)[-1] for f in found)
    return sorted(n for n in base if fnmatch.fnmatch(n, pattern))


def runs_dir(root: Path | None = None) -> Path:
    """Run folders of orchestrated jobs (checkpoint, progress log, plans) in the data folder."""
    return (root or paths.data_dir()) / "runs"


def runs_root() -> Path | str:
    """Where run folders live: ``<run storage>/runs`` when the deployment sets one
    (``paths.run_storage``), else the data folder's ``runs/``."""
    storage = paths.run_storage()
    return join(storage, "runs") if storage else runs_dir()


def confined_run_dir(location: str, filename: str) -> str:
    """The run folder of ``location`` (``<runs root>/<run>/<filename>``) when the runs root
    is run storage; a ``ConfigError`` for anything else (another bucket or prefix, a
    nested or relative key, a local path): a trigger conf may only point into a run
    folder of the configured storage."""
    root = str(runs_root()).rstrip("/")
    rest = location[len(root) + 1 :] if location.startswith(root + "/") else ""
    parts = rest.split("/")
    ok = (
        is_remote(root) and len(parts) == 2 and parts[1] == filename
        and parts[0] not in ("", ".", "..") and re.fullmatch(r"[A-Za-z0-9._-]+", parts[0])
    )  # fmt: skip
    if not ok:
        raise ConfigError(
            f"resume.checkpoint: must be in a run folder under {root} (<run>/{filename}), "
            f"got {location}"
        )
    return f"{root}/{parts[0]}"


# -- append-only logs as segments on object storage ------------------------------------


def segment_folder(log: str) -> str:
    """The folder of a remote log's segments: ``.../progress.jsonl`` -> ``.../progress``."""
    return log[: -len(".jsonl")] if log.endswith(".jsonl") else f"{log}.d"


def stream_name(*parts: object) -> str:
    """A segment stream's name (``<config>-<rank>``): characters outside ``[A-Za-z0-9._]``
    become ``_``, so that the ``-`` between parts and before the sequence number is
    unambiguous."""
    return "-".join(re.sub(r"[^A-Za-z0-9._]", "_", str(p)) or "_" for p in parts)


_SEGMENT = re.compile(r"^(?P<stream>.+)-(?P<seq>\d+)\.jsonl$")


@dataclass(frozen=True, slots=True, order=True)
class Segment:
    stream: str
    seq: int
    path: str = field(compare=False)
    size: int = field(default=0, compare=False)


def list_segments(fs: Any, folder: str) -> list[Segment]:
    """The segments in ``folder``, by stream then sequence number (a fresh listing)."""
    fs.invalidate_cache(folder)
    try:
        entries = fs.ls(folder, detail=True)
    except FileNotFoundError:
        return []
    out = []
    for e in entries:
        if e.get("type") != "file":
            continue
        m = _SEGMENT.match(str(e["name"]).rsplit("/", 1)[-1])
        if m:
            out.append(Segment(m["stream"], int(m["seq"]), str(e["name"]), int(e.get("size") or 0)))
    return sorted(out)


class SegmentWriter:
    """One stream of a remote log: lines are buffered and written as one new segment
    object per flush window (``flush_s``; 0 writes each line at once), and at ``flush``
    and ``close``.

    Segments are written create-only (``pipe_file(mode="create")``: S3's ``If-None-Match:
    *``; an exists check first on a filesystem without it): a sequence number another
    writer took meanwhile (a restarted writer, two writers on one stream, a trigger run
    twice after a failover) is never overwritten; the writer lists the stream again and
    moves past it. A failed PUT (throttling, an expired token, a network error) keeps the
    lines buffered for the next flush (a PUT that failed yet was stored is recognised then,
    not written twice); only ``max_failures`` failures in a row raise, naming the object
    (``close`` retries with a short backoff first)."""

    def __init__(
        self, log: str, stream: str, *, flush_s: float = FLUSH_S,
        clock: Callable[[], float] = time.monotonic, max_failures: int = MAX_PUT_FAILURES,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:  # fmt: skip
        self.fs, where = filesystem(log)
        self.folder = segment_folder(where)
        self.stream = stream
        self.flush_s = flush_s
        self.max_failures = max_failures
        self._clock = clock
        self._sleep = sleep
        self.seq = self._next_seq()
        self._lines: list[str] = []
        self._since = clock()
        self.failures = 0
        """PUTs failed in a row (reset by one that succeeds)."""

    def _next_seq(self) -> int:
        mine = [s.seq for s in list_segments(self.fs, self.folder) if s.stream == self.stream]
        return max(mine, default=-1) + 1

    def write_line(self, line: str) -> None:
        if "\n" in line:
            raise ValueError("a log line holds no newline")
        self._lines.append(line)
        if self._clock() - self._since >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        """Write the buffered lines as the stream's next segment (one PUT). On failure the
        lines stay buffered; the ``max_failures``-th failure in a row raises ``OSError``."""
        self._since = self._clock()
        if not self._lines:
            return
        data = "".join(f"{x}\n" for x in self._lines).encode("utf-8")
        try:
            self._put(data)
        except Exception as exc:
            self.failures += 1
            target = f"{self.folder}/{self.stream}-{self.seq:08d}.jsonl"
            if self.failures >= self.max_failures:
                raise OSError(
                    f"log segment {target}: {self.failures} writes failed in a row, "
                    f"{len(self._lines)} line(s) not written ({type(exc).__name__}: {exc})"
                ) from exc
            _log.warning(
                "log segment %s not written (%s: %s); %d line(s) kept for the next flush",
                target, type(exc).__name__, exc, len(self._lines),
            )  # fmt: skip
            return
        self.failures = 0
        self._lines.clear()

    def _put(self, data: bytes) -> None:
        """Create the stream's next segment; past sequence numbers another writer took."""
        for _ in range(100):
            target = f"{self.folder}/{self.stream}-{self.seq:08d}.jsonl"
            try:
                _create(self.fs, target, data)
                break
            except FileExistsError:
                stored = self._own_earlier(target, data)
                self.seq = self.seq + 1 if stored else max(self.seq + 1, self._next_seq())
                data = data[stored:]
                if not data:
                    return
        else:
            raise FileExistsError(f"{self.folder}/{self.stream}-*: no free sequence number")
        self.seq += 1

    def _own_earlier(self, target: str, data: bytes) -> int:
        """After a failed PUT: the bytes of ``data`` that ``target`` already holds, when it
        is this writer's earlier PUT (reported failed, a timeout, but stored after all):
        complete lines that begin ``data``. 0 otherwise."""
        if not self.failures:
            return 0
        try:
            stored: bytes = self.fs.cat_file(target)
        except FileNotFoundError:
            return 0
        return len(stored) if stored.endswith(b"\n") and data.startswith(stored) else 0

    def close(self) -> None:
        """Flush, retrying a failed PUT with a short backoff until ``max_failures``."""
        delay = 0.2
        while True:
            self.flush()
            if not self._lines:
                return
            self._sleep(delay)
            delay = min(delay * 2, 5.0)


def _create(fs: Any, path: str, data: bytes) -> None:
    """Write ``data`` at ``path`` only if there is no object there (``FileExistsError``)."""
    try:
        fs.pipe_file(path, data, mode="create")
    except TypeError:  # an fsspec filesystem without create-only writes: check, then write
        fs.invalidate_cache(path)
        if fs.exists(path):
            raise FileExistsError(path) from None
        fs.pipe_file(path, data)


def _time_key(d: Mapping[str, Any]) -> float:
    v = d.get("wall_time", d.get("at", 0.0))
    return float(v) if isinstance(v, (int, float)) else 0.0


def parse_lines(data: bytes, where: str) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects of the complete lines of ``data`` and the bytes they span. A last
    line without its newline is left out (torn, or being written); any other line that
    is not JSON raises ``ConfigError``."""
    end = data.rfind(b"\n") + 1
    out = []
    for k, line in enumerate(data[:end].decode("utf-8").split("\n")):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            raise ConfigError(f"{where}: line {k + 1} is not JSON") from None
    tail = data[end:]
    if tail.strip():
        try:  # a whole record that lost only its newline
            out.append(json.loads(tail))
            end = len(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            pass
    return out, end


def _merge(
    streams: Mapping[str, list[dict[str, Any]]], key: Callable[[Mapping[str, Any]], float]
) -> Iterator[dict[str, Any]]:
    """Merge streams by ``key`` (each stream's own order kept; ties by stream name)."""
    return heapq.merge(*(streams[s] for s in sorted(streams)), key=key)


def _fetch(fs: Any, paths: list[str]) -> dict[str, bytes | BaseException]:
    """Each object's bytes, or the exception its GET raised (one batch of GETs)."""
    got: dict[str, Any] = fs.cat(paths, on_error="return")
    return got


def read_log(
    log: str, key: Callable[[Mapping[str, Any]], float] = _time_key
) -> Iterator[dict[str, Any]]:
    """Every record of a remote segmented log, the streams merged by ``key`` (the
    record's ``wall_time`` or ``at``): a missing log is empty. A segment removed since the
    listing is skipped; any other failed GET raises (never a log with a hole)."""
    fs, where = filesystem(log)
    segments = list_segments(fs, segment_folder(where))
    if not segments:
        return iter(())
    blobs = _fetch(fs, [s.path for s in segments])
    streams: dict[str, list[dict[str, Any]]] = {}
    for s in segments:  # by stream, then sequence
        blob = blobs.get(s.path, FileNotFoundError(s.path))
        if isinstance(blob, FileNotFoundError):
            continue  # removed since the listing (moved aside)
        if isinstance(blob, BaseException):
            raise OSError(f"log segment {s.path} cannot be read: {blob!r}") from blob
        records, _ = parse_lines(blob, s.path)
        streams.setdefault(s.stream, []).extend(records)
    return _merge(streams, key)


class LogTail:
    """Reads a growing remote segmented log incrementally: each ``read`` lists the
    segments and fetches only those that are new or grew since the last one.

    A segment whose GET fails (throttling, a transient 403) ends its stream for this read:
    it and the stream's later segments are fetched again at the next one, so a stream's
    records are returned in order, never one segment ahead of a missing one. A segment
    that fails ``READ_RETRIES`` reads in a row raises."""

    def __init__(self, log: str, key: Callable[[Mapping[str, Any]], float] = _time_key) -> None:
        self.fs, where = filesystem(log)
        self.folder = segment_folder(where)
        self.key = key
        self._done: dict[str, int] = {}
        """Bytes of each segment already parsed (its complete lines)."""
        self._failed: dict[str, int] = {}
        """Reads in a row in which a segment's GET failed."""

    def read(self) -> list[dict[str, Any]]:
        listed = list_segments(self.fs, self.folder)
        fresh = [s for s in listed if s.size > self._done.get(s.path, 0)]
        if not fresh:
            return []
        blobs = _fetch(self.fs, [s.path for s in fresh])
        streams: dict[str, list[dict[str, Any]]] = {}
        stopped: set[str] = set()
        for s in fresh:  # by stream, then sequence
            if s.stream in stopped:
                continue
            blob = blobs.get(s.path, FileNotFoundError(s.path))
            if isinstance(blob, FileNotFoundError):
                continue  # removed since the listing (moved aside)
            if isinstance(blob, BaseException):
                n = self._failed[s.path] = self._failed.get(s.path, 0) + 1
                if n >= READ_RETRIES:
                    raise OSError(
                        f"log segment {s.path} cannot be read ({n} tries): {blob!r}"
                    ) from blob
                _log.warning("log segment %s not read (%r); trying again", s.path, blob)
                stopped.add(s.stream)
                continue
            self._failed.pop(s.path, None)
            start = self._done.get(s.path, 0)
            records, used = parse_lines(blob[start:], s.path)
            self._done[s.path] = start + used
            streams.setdefault(s.stream, []).extend(records)
        return list(_merge(streams, self.key))
