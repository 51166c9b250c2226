"""The demo's preemption watcher: it reclaims a worker of the job the demo runs, never
because of an earlier run's log in the same data folder."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from srifty_core.cloud.base import LaunchRequest, Market
from srifty_core.cloud.local import LocalProvider
from srifty_core.demo import PREEMPT_AT, _preempt_when_running
from srifty_core.runtime.progress import PROGRESS_FILE, ProgressLog, ProgressRecord


def _log(run: Path, steps: int) -> None:
    run.mkdir(parents=True)
    log = ProgressLog(run / PROGRESS_FILE)
    for i in range(1, steps + 1):
        log.append(ProgressRecord(i, 1000.0 + i, 0.1, 8, "c0"))
    log.close()


def test_the_watcher_waits_for_this_jobs_log_not_an_earlier_one(data_dir: Path) -> None:
    _log(data_dir / "runs" / "earlier", 40)  # a finished run of a previous demo
    p = LocalProvider()
    a = p.launch(LaunchRequest("local.cpu", count=2, market=Market.SPOT))
    p.run(a, [sys.executable, "-c", "import time; time.sleep(120)"])
    stop = threading.Event()
    try:
        taken = _preempt_when_running(data_dir, stop)
        time.sleep(1.0)  # 20 polls
        assert taken == []
        _log(data_dir / "runs" / "this-job", PREEMPT_AT)
        deadline = time.monotonic() + 20
        while not taken and time.monotonic() < deadline:
            time.sleep(0.05)
        assert taken == [a.instance_ids[1]]
    finally:
        stop.set()
        p.release(a)
