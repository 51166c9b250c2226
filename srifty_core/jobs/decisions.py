"""The monitor's decisions: what one look at a running configuration found
(``PollResult``) and the run folder's ``decisions.jsonl`` that keeps every look
(``DecisionLog``, ``read_decisions``; at a run-storage URI a segment stream).

Light: no torch import.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from srifty_core.atomic import open_for_append
from srifty_core.jobs.job import RUNNING
from srifty_core.runs import store as run_store
from srifty_core.runs.progress import iter_jsonl

DECISIONS_FILE = "decisions.jsonl"


@dataclass(frozen=True, slots=True)
class PollResult:
    status: str
    """``running``, ``finished`` or ``replan``."""
    reason: str
    iterations_done: int
    elapsed_s: float
    """Since the job's start (earlier configurations included)."""
    spent_usd: float
    depleted: tuple[str, ...] = ()
    interrupted: tuple[str, ...] = ()
    """Instance ids the provider took back."""
    lost: Mapping[str, int] = field(default_factory=dict)
    """Instances taken back per offer (``type/market``)."""
    optimistic_throughput: float | None = None
    projected_time_s: float | None = None
    config_id: str = ""
    at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["depleted"], d["interrupted"], d["lost"] = (
            list(self.depleted), list(self.interrupted), dict(self.lost),
        )  # fmt: skip
        return d


class DecisionLog:
    """The run folder's ``decisions.jsonl``, appended by one configuration's monitor. A
    local file gets each decision at once. On run storage (``run_store``) the decisions
    are a segment stream ``<config>-monitor``, and each decision is written at once too
    (one PUT per poll: cheap at a poll every few seconds, and nothing is left buffered
    when ``poll`` drops its fresh ``Monitor`` or a trigger is cancelled). A failed PUT
    keeps the decision for the next one (``SegmentWriter``); a decision that ends the
    watch (not ``running``) is retried until it is written or the writer gives up."""

    def __init__(self, run_dir: Path | str, config_id: str) -> None:
        self.run_dir = run_dir
        self._writer: run_store.SegmentWriter | None = None
        if run_store.is_remote(run_dir):
            log = str(run_store.join(run_dir, DECISIONS_FILE))
            stream = run_store.stream_name(config_id, "monitor")
            self._writer = run_store.SegmentWriter(log, stream, flush_s=0.0)

    def append(self, result: PollResult) -> None:
        if self._writer is None:
            append_decision(self.run_dir, result)
            return
        self._writer.write_line(json.dumps(result.to_dict(), default=str))
        if result.status != RUNNING:
            self._writer.close()


def append_decision(run_dir: Path | str, result: PollResult) -> None:
    """Append one decision now (on run storage: a segment of its own)."""
    line = json.dumps(result.to_dict(), default=str)
    if run_store.is_remote(run_dir):
        log = str(run_store.join(run_dir, DECISIONS_FILE))
        stream = run_store.stream_name(result.config_id, "monitor")
        writer = run_store.SegmentWriter(log, stream, flush_s=float("inf"))
        writer.write_line(line)
        writer.close()  # written, or retried until the writer gives up (and raises)
        return
    with open_for_append(Path(run_dir) / DECISIONS_FILE) as f:
        f.write(line + "\n")


def read_decisions(run_dir: Path | str, config_id: str | None = None) -> list[dict[str, Any]]:
    records = iter_jsonl(run_store.join(run_dir, DECISIONS_FILE))
    return [d for d in records if config_id is None or d.get("config_id") == config_id]
