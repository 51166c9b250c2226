"""One job's outcome: ``outcome.json`` in its run folder, the lines ``srifty train`` prints
and the ``outcome_*`` metrics of its MLflow run, from one ``Outcome``, so every place that
reports a job's time and cost reports the same numbers.

Time and cost come in two kinds each, named by what they include:

* ``training_s``: the time the monitor counted against the job's time limit, each
  configuration from the start of its workers to its end, summed (``PollResult.elapsed_s``
  of the last look). A plan file's monitor counts from the job's start, so there it is
  close to the wall time; a planned job's leaves out planning, launches and the switches
  between configurations.
* ``wall_s``: from the job's start to its end with everything in it (planning, launches,
  re-plans, restarts), on the provider's clock (simulated on the emulated EC2); None where
  no single process saw the whole job (a DAG run, whose steps are separate tasks).
* ``training_usd``: each configuration's hourly rate times its training time, summed:
  what the monitor counted against the budget.
* ``billed_usd``: what the provider billed for every VM the job launched, per second
  from launch to release (EC2's rule: ``Provider.cost``); None where nothing is billed
  (local workers) or nobody could say (``billed`` says which).

Also the run folder, the iterations, the configurations and where the ranks' output went
(``logs``: local ranks write into the run folder, ``rank_logs``). Light: no torch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from srifty_core.cloud import provider_class
from srifty_core.jobs.job import JobPlan
from srifty_core.runs import store as run_store
from srifty_core.runs.progress import read_progress

OUTCOME_FILE = "outcome.json"
LOGS_DIR = "logs"
NOT_BILLED_LOCAL = "not billed: local workers"


def rank_logs(run_dir: Path | str, config_id: str) -> Path | None:
    """Where a configuration's local ranks write their output (``rank-<r>.log``):
    ``<run>/logs/<config>``; None for a run folder on run storage (a URI)."""
    local = run_store.local_path(run_dir)
    return None if local is None else local / LOGS_DIR / config_id


@dataclass(frozen=True)
class Outcome:
    """A finished job's totals (see the module's doc)."""

    run_dir: str
    provider: str
    iterations: int
    target_iterations: int
    configurations: tuple[str, ...]
    training_s: float
    training_usd: float
    wall_s: float | None = None
    billed_usd: float | None = None
    billed: str = ""
    """What ``billed_usd`` covers, or why there is none."""
    logs: tuple[str, ...] = ()
    """Folders of the ranks' output, oldest configuration first."""
    status: str = "finished"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["configurations"], d["logs"] = list(self.configurations), list(self.logs)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Outcome:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["configurations"] = tuple(kw.get("configurations", ()))
        kw["logs"] = tuple(kw.get("logs", ()))
        return cls(**kw)

    @property
    def path(self) -> Path | str:
        return run_store.join(self.run_dir, OUTCOME_FILE)

    def save(self) -> Path | str:
        """Write ``outcome.json`` whole (a reader sees the old file or the new one)."""
        return run_store.write_text(self.path, json.dumps(self.to_dict(), indent=1) + "\n")

    def metrics(self) -> dict[str, float]:
        """The numbers, for the job's MLflow run (``outcome_<name>``; None left out)."""
        values: dict[str, float | None] = {
            "iterations": float(self.iterations),
            "target_iterations": float(self.target_iterations),
            "configurations": float(len(self.configurations)),
            "training_s": self.training_s,
            "training_usd": self.training_usd,
            "wall_s": self.wall_s,
            "billed_usd": self.billed_usd,
        }
        return {f"outcome_{k}": float(v) for k, v in values.items() if v is not None}

    def lines(self) -> list[str]:
        """What ``srifty train`` prints at the end: the same numbers as ``outcome.json``."""
        n = len(self.configurations)
        time = f"time: {self.training_s:.0f} s training (counted against the time limit)"
        if self.wall_s is not None:
            time += f", {self.wall_s:.0f} s wall (start to end: launches and re-plans included)"
        cost = f"cost: ${self.training_usd:.2f} training (counted against the budget)"
        if self.billed_usd is not None:
            cost += f", ${self.billed_usd:.2f} billed ({self.billed})"
        elif self.billed:
            cost += f"; {self.billed}"
        files = [OUTCOME_FILE, "progress.jsonl", "decisions.jsonl"]
        if self.logs:
            files.append(f"{LOGS_DIR}/")
        return [
            f"done: {self.iterations} iterations of {self.target_iterations}, {n} "
            f"configuration{'s' if n != 1 else ''} ({', '.join(self.configurations)})",
            time,
            cost,
            f"run folder: {self.run_dir} ({', '.join(files)})",
        ]

    def output_lines(self, n: int = 10) -> list[str]:
        """The last ``n`` lines rank 0 of the last configuration wrote (a script's own
        output: what it printed), with the log's path; none where no log is at hand."""
        if not self.logs:
            return []
        log = Path(self.logs[-1]) / "rank-0.log"
        lines = tail(log, n)
        if not lines:
            return [f"the ranks' output: {self.logs[-1]}/rank-*.log (rank 0 printed nothing)"]
        return [f"rank 0's output (the last lines of {log}):", *(f"  {x}" for x in lines)]


def of_result(job: JobPlan, result: Mapping[str, Any]) -> Outcome:
    """The outcome of the job whose last configuration is ``job`` and whose monitor's last
    look was ``result`` (``PollResult.to_dict``: the training time and cost); iterations
    and configurations from the run folder's progress log. No wall time or bill: the
    caller that saw the whole job adds them (``with_totals``)."""
    facts = job.facts
    records = read_progress(facts.progress_path)
    configs = tuple(dict.fromkeys(r.config_id for r in records)) or (job.config_id,)
    return Outcome(
        run_dir=str(facts.run_dir),
        provider=job.provider,
        iterations=max((r.iteration for r in records), default=0),
        target_iterations=facts.iterations,
        configurations=configs,
        training_s=float(result.get("elapsed_s", 0.0)),
        training_usd=float(result.get("spent_usd", 0.0)),
        billed="" if provider_class(job.provider).billed else NOT_BILLED_LOCAL,
        logs=_logs(facts.run_dir, configs),
    )


def _logs(run_dir: str, configs: Sequence[str]) -> tuple[str, ...]:
    out = []
    for c in configs:
        d = rank_logs(run_dir, c)
        if d is not None and d.is_dir():
            out.append(str(d))
    return tuple(out)


def with_totals(
    outcome: Outcome,
    wall_s: float,
    billed_usd: float | None = None,
    billed: str | None = None,
) -> Outcome:
    """``outcome`` with the whole job's wall time and bill (``billed``: what the bill
    covers, or why there is none; default: the outcome's)."""
    return replace(
        outcome,
        wall_s=float(wall_s),
        billed_usd=billed_usd,
        billed=outcome.billed if billed is None else billed,
    )


def bill(provider: Any, allocation_ids: Sequence[str]) -> tuple[float | None, str]:
    """What ``provider`` billed for the allocations (``Provider.cost``: per second from
    launch to release), and what that covers; ``(None, why)`` where it cannot say."""
    ids = list(dict.fromkeys(allocation_ids))
    if provider is None or not ids:
        return None, "not measured"
    try:
        total = sum(float(provider.cost(provider.get_allocation(a))) for a in ids)
    except Exception as exc:  # a provider that cannot price or find them: no bill, said
        return None, f"not known: {exc}"
    n = len(ids)
    return total, f"{n} allocation{'s' if n != 1 else ''}, each VM from launch to release"


def read(run_dir: Path | str) -> Outcome | None:
    """The run folder's outcome, or None when the job has not finished."""
    text = run_store.read_text(run_store.join(run_dir, OUTCOME_FILE))
    return None if text is None else Outcome.from_dict(json.loads(text))


def tail(path: Path, n: int = 10) -> list[str]:
    """The last ``n`` lines of a rank's log (none when it is missing)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(size - 64 * 1024, 0))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return text.splitlines()[-n:]
