"""Workers end with the command that waits for them, and only then."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from srifty_core.cloud.local import pid_alive

PARENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from srifty_core.cloud.base import LaunchRequest
    from srifty_core.cloud.local import LocalProvider
    from srifty_core.lifetime import caller_env

    tie = sys.argv[2] == "tie"
    p = LocalProvider(Path(sys.argv[1]))
    a = p.launch(LaunchRequest("local.cpu", count=2))
    child = ("from srifty_core.lifetime import die_with_caller; die_with_caller(); "
             "import time; time.sleep(120)")
    p.run(a, [sys.executable, "-c", child], caller_env() if tie else None)
    print(" ".join(str(x) for x in p.worker_pids(a)), flush=True)
    time.sleep(120)
    """
)


def _start(tmp_path: Path, mode: str) -> tuple[subprocess.Popen[str], list[int]]:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / mode), mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    pids = [int(x) for x in parent.stdout.readline().split()]
    assert len(pids) == 2
    return parent, pids


def _alive(pids: list[int]) -> list[int]:
    return [p for p in pids if pid_alive(p)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux-only")
def test_workers_of_a_killed_caller_stop_and_untied_ones_do_not(tmp_path: Path) -> None:
    parent, pids = _start(tmp_path, "tie")
    time.sleep(1.0)  # the workers arm their signal first thing
    assert _alive(pids) == pids
    parent.kill()  # SIGKILL: no cleanup code of the caller runs
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _alive(pids) == []
    # without the variable (plan-and-train: one task starts, another watches) they stay
    parent, pids = _start(tmp_path, "free")
    parent.kill()
    parent.wait()
    time.sleep(1.0)
    try:
        assert _alive(pids) == pids
    finally:
        for p in pids:
            os.kill(p, signal.SIGKILL)
