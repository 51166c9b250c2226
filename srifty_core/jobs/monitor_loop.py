"""The monitor loop: a configuration's ``Monitor`` stepped until it is no longer running.

Every way a job is watched steps the same ``monitor_step.Monitor`` (the throughput rule,
online recalibration, the decisions log, live metrics) under the same rules:

* ``srifty train PLAN.json`` (``local_run.train_local``) and ``srifty train --job``
  (``job_run.run_job``) through ``watch``, this module's loop;
* the Airflow sensor's trigger (``plugins/srifty_monitor.py``; the demo runs it through the
  plan-and-train DAG), whose waits are awaited in the triggerer's event loop: it steps the
  same ``Monitor`` and retries a failed step by the same ``Retry``.

A step that fails with a transient error is retried with exponential backoff (``Retry``);
a deterministic one (the workers died, a bad plan: ``is_deterministic``) or
``max_failures`` failures in a row end the loop with that error. Light: no torch.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from srifty_core.errors import ConfigError, SriftyError
from srifty_core.jobs.decisions import PollResult
from srifty_core.jobs.job import RUNNING, TrainingFailed

MAX_BACKOFF_S = 300.0
"""The longest wait before retrying a failed step."""


class MonitorTimeout(SriftyError):
    """The job was still running when the loop's time ran out."""


def is_deterministic(exc: BaseException) -> bool:
    """Errors a retry would meet again: the workers failed, or the job's files are wrong."""
    return isinstance(exc, (TrainingFailed, ConfigError, KeyError, TypeError, ValueError))


@dataclass(slots=True)
class Retry:
    """When to retry a failed step, and after how long (see the module's doc)."""

    poll_s: float
    max_failures: int = 1
    max_backoff_s: float = MAX_BACKOFF_S
    failures: int = 0
    """Failed steps in a row."""

    def succeeded(self) -> None:
        self.failures = 0

    def failed(self, exc: BaseException) -> float | None:
        """Count a failed step: the seconds to wait before the next one, or ``None`` when
        the loop gives up (a deterministic error, or ``max_failures`` in a row)."""
        self.failures += 1
        if is_deterministic(exc) or self.failures >= self.max_failures:
            return None
        return min(self.poll_s * 2.0**self.failures, self.max_backoff_s)

    def describe(self, exc: BaseException) -> str:
        """The error that ended the loop, with the failures in a row that led to it."""
        error = f"{type(exc).__name__}: {exc}"
        return error + (
            f" (after {self.failures} failed steps in a row)" if self.failures > 1 else ""
        )


def watch(
    step: Callable[[], PollResult],
    *,
    poll_s: float,
    wait: Callable[[float], None] = time.sleep,
    on_poll: Callable[[PollResult], None] | None = None,
    timeout_s: float = math.inf,
    max_failures: int = 1,
    on_retry: Callable[[BaseException, float], None] | None = None,
) -> PollResult:
    """Step (``Monitor.step``) every ``poll_s`` (``wait``: the provider's clock, or wall
    time) until the job is no longer ``running``; returns that step's result.
    ``on_poll`` sees every ``running`` step; past ``timeout_s`` of wall time the loop
    raises ``MonitorTimeout``; a failed step is retried as ``Retry`` says, else raised."""
    retry = Retry(poll_s, max_failures)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = step()
        except Exception as exc:
            delay = retry.failed(exc)
            if delay is None:
                raise
            if on_retry is not None:
                on_retry(exc, delay)
            wait(delay)
            continue
        retry.succeeded()
        if result.status != RUNNING:
            return result
        if on_poll is not None:
            on_poll(result)
        if time.monotonic() > deadline:
            raise MonitorTimeout(f"the job did not finish within {timeout_s:.0f} s")
        wait(poll_s)
