"""One live job per run folder: a second `srifty train` on a folder a live job holds fails
at once naming the holder; a killed holder leaves no stale lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from srifty_core.jobs.local_run import RUN_OWNER, TrainingError, run_folder_lock

HOLDER = (
    "import sys, time; from pathlib import Path; "
    "from srifty_core.jobs.local_run import run_folder_lock\n"
    "with run_folder_lock(Path(sys.argv[1])):\n"
    "    print('held', flush=True); time.sleep(120)\n"
)


def test_a_second_job_on_a_held_run_folder_fails_naming_the_holder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with (
            pytest.raises(TrainingError, match=rf"in use by pid {holder.pid} since"),
            run_folder_lock(run),
        ):
            pass
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # killed: no chance to clean up
        holder.wait()
    end = time.monotonic() + 10
    while True:  # the OS released the lock with the process
        try:
            with run_folder_lock(run):
                assert f"pid {os.getpid()}" in (run / RUN_OWNER).read_text()
            break
        except TrainingError:
            assert time.monotonic() < end
            time.sleep(0.1)


def test_the_same_process_can_take_the_folder_again_after_releasing_it(tmp_path: Path) -> None:
    with run_folder_lock(tmp_path / "run"):
        pass
    with run_folder_lock(tmp_path / "run"):
        pass
