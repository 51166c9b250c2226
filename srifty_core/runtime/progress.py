"""The progress log: one JSON line per finished training step, appended by rank 0.

Each line is written, flushed and ``fsync``-ed before the next step starts, so the log is
readable while the job runs and survives a killed worker (at worst the last line is cut
short; readers skip a partial last line). Light: no torch import.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from srifty_core.atomic import open_for_append
from srifty_core.errors import ConfigError

PROGRESS_FILE = "progress.jsonl"


@dataclass(frozen=True, slots=True)
class ProgressRecord:
    """One finished step."""

    iteration: int
    """Iterations done after this step (1 for the first step of the job)."""
    wall_time: float
    """Unix time when the step finished."""
    step_s: float
    """How long the step took (forward, backward, allreduce, optimizer)."""
    samples: int
    """Samples processed in this step (the global batch)."""
    config_id: str
    """Which configuration ran it (changes at every re-plan)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ProgressRecord:
        try:
            return cls(
                iteration=int(d["iteration"]),
                wall_time=float(d["wall_time"]),
                step_s=float(d["step_s"]),
                samples=int(d["samples"]),
                config_id=str(d["config_id"]),
            )
        except KeyError as exc:
            raise ConfigError(f"progress record: field {exc.args[0]!r} missing") from exc


class ProgressLog:
    """Append-only, durable JSONL writer (use as a context manager or call ``close``)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] | None = open_for_append(self.path)

    def append(self, record: ProgressRecord) -> None:
        if self._fh is None:
            raise ConfigError(f"progress log {self.path} is closed")
        self._fh.write(json.dumps(asdict(record), separators=(",", ":")) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> ProgressLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_progress(path: Path | str) -> Iterator[ProgressRecord]:
    """Records in file order; a missing file is empty; a cut-short last line is skipped."""
    for d in iter_jsonl(path):
        yield ProgressRecord.from_dict(d)


def iter_jsonl(path: Path | str) -> Iterator[dict[str, Any]]:
    """The objects of an append-only JSON-lines log, in order: a missing file is empty, a
    cut-short last line (being written, or cut by a kill) is skipped, any other line that
    is not JSON raises ``ConfigError``."""
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


def median_step_s(records: Iterable[ProgressRecord], config_id: str) -> float | None:
    """The measured iteration time of configuration ``config_id``: the median step after
    its first (which warms up); ``None`` with fewer than 3 steps."""
    steps = [r.step_s for r in records if r.config_id == config_id]
    return statistics.median(steps[1:]) if len(steps) > 2 else None
