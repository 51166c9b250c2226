"""A killed `srifty probe` leaves its allocation launched; the next run releases it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from filelock import FileLock

from srifty_core.cloud.base import LaunchRequest
from srifty_core.cloud.local import LocalProvider
from srifty_core.measure.sweep import owner_lock, owning, release_orphans


def _states(data_dir: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for f in (data_dir / "cloud" / "local").glob("*.json"):
        out |= json.loads(f.read_text())["instances"]
    return out


def test_an_unheld_owner_lock_is_an_orphan_and_a_held_one_is_not(
    data_dir: Path, tmp_path: Path
) -> None:
    provider = LocalProvider()
    dead = provider.launch(LaunchRequest("local.cpu", count=1))
    live = provider.launch(LaunchRequest("local.cpu", count=1))
    partials = tmp_path / "partials"
    partials.mkdir()
    owner_lock(partials, dead.id).touch()  # its sweep was killed: nobody holds it
    with FileLock(str(owner_lock(partials, live.id))):  # a live sweep holds this one
        assert release_orphans(partials, provider) == [dead.id]
    states = _states(data_dir)
    assert states[f"{dead.id}-i0"] == "terminated" and states[f"{live.id}-i0"] == "running"
    assert not owner_lock(partials, dead.id).exists()
    assert release_orphans(partials, provider) == [live.id]  # its holder is gone now
    assert release_orphans(partials, provider) == []


def test_the_owner_lock_stays_when_the_release_raised(tmp_path: Path) -> None:
    try:
        with owning(tmp_path, "a-1"):
            raise RuntimeError("release failed")
    except RuntimeError:
        pass
    assert owner_lock(tmp_path, "a-1").exists()  # the next run tries again
    with owning(tmp_path, "a-2"):
        pass
    assert not owner_lock(tmp_path, "a-2").exists()


def test_a_killed_probe_command_leaves_nothing_running_after_a_rerun(data_dir: Path) -> None:
    args = [sys.executable, "-m", "srifty_core.cli", "probe", "--no-progress", "--sizes",
            "4B:1KB", "--steps", "2", "--concurrency", "1", "--warmup", "1",
            "--day", "2026-01-02", "--allocations", "1"]  # fmt: skip
    env = os.environ | {"SRIFTY_DATA_DIR": str(data_dir)}
    proc = subprocess.Popen([*args, "--repeats", "400"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while not any((data_dir / "cloud" / "local").glob("*/logs/rank-*.log")):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGKILL)  # no cleanup code runs
    proc.wait()
    # the allocation's guard may have released it already (its workers were tied to the
    # killed command); if not, the rerun does: either way nothing is left running
    rerun = subprocess.run([*args, "--repeats", "2"], env=env, capture_output=True, text=True,
                           check=False, timeout=300)  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr
    assert "left by a killed sweep" in rerun.stderr
    assert set(_states(data_dir).values()) == {"terminated"}
    assert not list((data_dir / "probes").rglob("*.owner.lock"))
