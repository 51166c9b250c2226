"""Workers end with the command that waits for them, and only then: whatever they are
doing (a rank stuck in a long step, a script that ignores SIGTERM), however the command
ends (SIGKILL, SIGTERM), and a rerun on the run folder stops what a killed job left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from srifty_core.cloud.local import LocalProvider, pid_alive
from srifty_core.jobs.local_run import TrainingError, train_local
from srifty_core.planner.schema.train_plan import TrainPlan

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


STUCK = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path

    rank = os.environ["SRIFTY_PLAN_RANK"]
    if rank == "0":  # notes SIGTERM and stays in its step, as a rank in a long step does
        signal.signal(signal.SIGTERM, lambda *_: None)
    else:  # a script that ignores SIGTERM
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    tmp = Path(sys.argv[1], f".rank-{rank}.tmp")  # renamed whole: a reader never sees it empty
    tmp.write_text(str(os.getpid()))
    tmp.rename(Path(sys.argv[1], f"rank-{rank}.pid"))
    time.sleep(3600)  # one long step
    """
)


def _wait(what: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not what():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _instance_states(data_dir: Path) -> list[str]:
    return [
        s for f in (data_dir / "cloud" / "local").glob("*.json")
        for s in json.loads(f.read_text())["instances"].values()
    ]  # fmt: skip


@pytest.fixture
def stuck_job(tmp_path: Path, data_dir: Path) -> Iterator[tuple[TrainPlan, Path, list[int]]]:
    """A plan whose two ranks get stuck in a long step (SIGTERM noted, or ignored); their
    pids are filled in by ``_start_stuck``. Whatever is left is SIGKILLed at the end."""
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    pids_dir = tmp_path / "pids"
    pids_dir.mkdir()
    plan = TrainPlan(
        model="dlrm", size="tiny", global_batch=2, iterations=10, local_batches=(1, 1),
        run_dir=str(tmp_path / "run"), entrypoint=(sys.executable, str(script), str(pids_dir)),
    )  # fmt: skip
    pids: list[int] = []
    yield plan, pids_dir, pids
    for pid in pids:
        if pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


SECRET = "postgresql://srifty:hunter2-in-the-env@db/srifty"


def _start_stuck(
    plan: TrainPlan, pids_dir: Path, pids: list[int], tmp_path: Path
) -> subprocess.Popen[bytes]:
    """`srifty train PLAN` in a process of its own, once both ranks are in their step."""
    path = plan.save(tmp_path / "plan.json")
    driver = subprocess.Popen(
        [sys.executable, "-m", "srifty_core.cli", "train", str(path), "--no-progress",
         "--no-mlflow"],  # its ranks are the subject, not its tracking
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "DATABASE_URL": SECRET},  # what no worker or guard may see
    )  # fmt: skip
    try:
        assert _wait(lambda: len(list(pids_dir.glob("rank-*.pid"))) == 2, 120), "no ranks"
    except BaseException:
        driver.kill()
        raise
    pids += [int(p.read_text()) for p in sorted(pids_dir.glob("rank-*.pid"))]
    return driver


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the test reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_stopping_train_stops_ranks_stuck_in_a_long_step(
    sig: signal.Signals,
    stuck_job: tuple[TrainPlan, Path, list[int]],
    tmp_path: Path,
    data_dir: Path,
) -> None:
    """Issue 47: after `srifty train` was killed its ranks ran on as orphans. The rank that
    notes SIGTERM and the one that ignores it both end within seconds (SIGTERM, then
    SIGKILL after the grace period), and the allocation is terminated in its state file."""
    plan, pids_dir, pids = stuck_job
    driver = _start_stuck(plan, pids_dir, pids, tmp_path)
    assert all(pid_alive(p) for p in pids)
    driver.send_signal(sig)
    driver.wait(timeout=60)
    assert _wait(lambda: not any(pid_alive(p) for p in pids), 60), "ranks outlived train"
    assert _wait(lambda: set(_instance_states(data_dir)) == {"terminated"}, 30)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the test reads /proc")
def test_a_rerun_on_the_run_folder_stops_what_a_killed_job_left(
    stuck_job: tuple[TrainPlan, Path, list[int]],
    tmp_path: Path,
    data_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 48: a killed driver left ranks training beside the rerun. Even with the
    allocation's guard killed too (nothing of the first job runs its cleanup), the next
    job on the run folder releases what the killed one left before its own ranks start."""
    plan, pids_dir, pids = stuck_job
    driver = _start_stuck(plan, pids_dir, pids, tmp_path)
    guards = [
        int(d.name) for d in Path("/proc").iterdir()
        if d.name.isdigit() and _cmdline(d).count("srifty_core.cloud.local_guard")
        and str(data_dir) in _cmdline(d)
    ]  # fmt: skip
    assert len(guards) == 1
    # the guard gets a worker's allow-listed environment, not the driver's secrets
    assert SECRET.encode() not in Path(f"/proc/{guards[0]}/environ").read_bytes()
    os.kill(guards[0], signal.SIGKILL)
    driver.kill()
    driver.wait(timeout=60)
    time.sleep(1.0)
    assert all(pid_alive(p) for p in pids)  # orphans: what the rerun has to deal with
    assert "running" in _instance_states(data_dir)
    rerun = plan.replace(entrypoint=(sys.executable, "-c", "pass"))
    with pytest.raises(TrainingError, match="workers exited with 0 at iteration"):  # no report
        train_local(rerun, LocalProvider(data_dir / "cloud" / "local"), poll_s=0.2)
    assert not any(pid_alive(p) for p in pids)
    assert set(_instance_states(data_dir)) == {"terminated"}
    assert "left launched by a killed job" in capsys.readouterr().err


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


JOB_PARENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from srifty_core.cloud.base import LaunchRequest
    from srifty_core.cloud.local import LocalProvider
    from srifty_core.jobs.provisioning import start_training

    job_path, state_dir = sys.argv[1], Path(sys.argv[2])
    p = LocalProvider(state_dir)
    a = p.launch(LaunchRequest("local.cpu", count=2))
    start_training(job_path, [a.id], p, tie=True)  # as `srifty train --job` (run_job) does
    time.sleep(600)
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the test reads /proc")
def test_killing_train_job_stops_its_local_ranks(
    stuck_job: tuple[TrainPlan, Path, list[int]], tmp_path: Path, data_dir: Path
) -> None:
    """Issue 48: killing `srifty train --job` orphaned its workers and left the allocation
    launched. Its local ranks are tied to it as `srifty train PLAN`'s are."""
    from srifty_core.jobs.local_run import plan_file_job
    from srifty_core.jobs.monitor import Limits

    plan, pids_dir, pids = stuck_job
    plan_path = plan.save(tmp_path / "plan-c0.json")
    _, job = plan_file_job(plan, plan_path, Limits(plan.iterations, plan.global_batch))
    job_path = job.save(tmp_path / "job-c0.json")
    state_dir = data_dir / "cloud" / "local"
    driver = subprocess.Popen([sys.executable, "-c", JOB_PARENT, str(job_path), str(state_dir)])
    try:
        assert _wait(lambda: len(list(pids_dir.glob("rank-*.pid"))) == 2, 120), "no ranks"
        pids += [int(p.read_text()) for p in sorted(pids_dir.glob("rank-*.pid"))]
    finally:
        driver.kill()
        driver.wait(timeout=60)
    assert _wait(lambda: not any(pid_alive(p) for p in pids), 60), "ranks outlived the job"
    assert _wait(lambda: set(_instance_states(data_dir)) == {"terminated"}, 30)
