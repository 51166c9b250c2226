"""GPU check, training (issue 53 item 1): 1-GPU plans run as every launcher runs a rank
(``python -m srifty_core.worker.launch PLAN.json`` with torchrun's variables), through the
built-in worker and through the digits example's own script (``examples/digits/train.py``,
``worker.user``), each in fp32 and bf16, each stopped by SIGTERM part-way (a preemption)
and started again from its checkpoint.

Checked per run: the stopped attempt exits with ``EXIT_STOPPED`` after its checkpoint; the
second resumes there and exits 0; the progress log holds iterations 1..N exactly once; the
checkpoint ends at N; the worker's log names the device and the precision that ran. The
digits script also writes its accuracy on the whole data set. On a CPU the same code runs
over gloo (``tests/test_gpu_check.py``).

The four runs share the machine at once (they are checks of behaviour, not timings): the
steady iteration time each reports is with the others running beside it.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from srifty_core.lifetime import free_port
from srifty_core.planner.schema.train_plan import TrainPlan
from srifty_core.runs.progress import read_progress
from srifty_core.worker.checkpoint import checkpoint_iteration
from srifty_core.worker.user import EXIT_STOPPED

REPO = Path(__file__).resolve().parent.parent
DIGITS = "examples/digits/model.py:build"


def rank_env() -> dict[str, str]:
    """A group of one rank, as torchrun sets it up."""
    return os.environ | {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
    }


def _logged(plan: TrainPlan) -> int:
    try:
        return len(read_progress(plan.progress_path))
    except (FileNotFoundError, ValueError):
        return 0


def _attempt(
    plan_path: Path, plan: TrainPlan, stop_at: int | None, timeout_s: float
) -> dict[str, Any]:
    """One launch of the plan; with ``stop_at``, SIGTERM once the log holds that many."""
    cmd = [sys.executable, "-m", "srifty_core.worker.launch", str(plan_path)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    stopped_at = None
    if stop_at is not None:
        while proc.poll() is None and time.perf_counter() - t0 < timeout_s:
            n = _logged(plan)
            if n >= stop_at:
                proc.send_signal(signal.SIGTERM)
                stopped_at = n
                break
            time.sleep(0.02)
    try:
        out, _ = proc.communicate(timeout=max(1.0, timeout_s - (time.perf_counter() - t0)))
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return {
        "exit_code": proc.returncode,
        "signalled_at_records": stopped_at,
        "checkpoint_iteration": checkpoint_iteration(plan.checkpoint_path),
        "wall_s": round(time.perf_counter() - t0, 2),
        "log_tail": out[-1500:],
    }


def preempted_run(name: str, plan: TrainPlan, workdir: Path, timeout_s: float) -> dict[str, Any]:
    """``plan`` run to a third of its iterations, stopped by SIGTERM, and run again to the
    end (module doc)."""
    plan_path = plan.save(workdir / f"{name}.json")
    stop_at = max(1, plan.iterations // 3)
    first = _attempt(plan_path, plan, stop_at, timeout_s)
    second = _attempt(plan_path, plan, None, timeout_s)
    records = read_progress(plan.progress_path) if Path(plan.progress_path).exists() else []
    iterations = [r.iteration for r in records]
    half = records[len(records) // 2 :]
    rec: dict[str, Any] = {
        "name": name,
        "model": plan.model,
        "size": plan.size,
        "precision_asked": plan.precision,
        "global_batch": plan.global_batch,
        "iterations": plan.iterations,
        "stopped": first,
        "resumed": second,
        "records": len(records),
        "each_iteration_once": iterations == list(range(1, plan.iterations + 1)),
        "steady_iteration_s": statistics.median(r.step_s for r in half) if half else None,
    }
    if plan.entrypoint:
        result = Path(plan.run_dir, "result.json")
        rec["result"] = json.loads(result.read_text()) if result.exists() else None
    stop_ok = first["exit_code"] == EXIT_STOPPED and first["signalled_at_records"] is not None
    stop_ok = stop_ok and (first["checkpoint_iteration"] or 0) >= stop_at
    rec["status"] = (
        "ok"
        if stop_ok
        and second["exit_code"] == 0
        and rec["each_iteration_once"]
        and second["checkpoint_iteration"] == plan.iterations
        and (not plan.entrypoint or rec.get("result") is not None)
        else "failed"
    )
    return rec


def plans(
    workdir: Path,
    device: str,
    precisions: list[str],
    model: str,
    size: str,
    batch: int,
    iterations: int,
) -> dict[str, TrainPlan]:
    """The runs: the built-in worker on ``model`` and the digits script, per precision."""
    out = {}
    for precision in precisions:
        out[f"worker_{precision}"] = TrainPlan(
            model=model,
            size=size,
            global_batch=batch,
            iterations=iterations,
            local_batches=(batch,),
            run_dir=str(workdir / f"worker_{precision}"),
            checkpoint_every=max(1, iterations // 4),
            step_sleep_s=0.02,  # time enough to stop it a third of the way in
            device=device,
            precision=precision,
            timeout_s=300.0,
        )
        out[f"digits_{precision}"] = TrainPlan(
            model=DIGITS,
            size="small",
            global_batch=64,
            iterations=300,
            local_batches=(64,),
            run_dir=str(workdir / f"digits_{precision}"),
            checkpoint_every=50,
            step_sleep_s=0.01,
            device=device,
            precision=precision,
            timeout_s=300.0,
            entrypoint=("python", "examples/digits/train.py", "--lr", "0.1"),
        )
    return out


def run_all(
    workdir: Path,
    *,
    device: str,
    precisions: list[str],
    model: str,
    size: str,
    batch: int,
    iterations: int,
    timeout_s: float = 300.0,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Every run of ``plans`` at once (module doc); one record each."""
    workdir.mkdir(parents=True, exist_ok=True)
    todo = plans(workdir, device, precisions, model, size, batch, iterations)

    def one(name: str) -> dict[str, Any]:
        try:
            rec = preempted_run(name, todo[name], workdir, timeout_s)
        except Exception as exc:  # one run's failure must not hide the others'
            rec = {"name": name, "status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        log(
            f"train {name}: {rec['status']}"
            + (
                f" (stop exit {rec['stopped']['exit_code']} at checkpoint "
                f"{rec['stopped']['checkpoint_iteration']}, resume exit "
                f"{rec['resumed']['exit_code']}, {rec['records']} records, checkpoint "
                f"{rec['resumed']['checkpoint_iteration']})"
                if "stopped" in rec
                else f": {rec.get('error')}"
            )
        )
        return rec

    with ThreadPoolExecutor(len(todo)) as pool:
        return list(pool.map(one, todo))


def summary_lines(runs: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in runs:
        if "stopped" not in r:
            lines.append(f"train {r['name']}: FAILED {r.get('error')}")
            continue
        acc = r.get("result") or {}
        lines.append(
            f"train {r['name']} ({r['model']}, batch {r['global_batch']}, "
            f"{r['iterations']} iterations, {r['precision_asked']}): {r['status'].upper()}; "
            f"SIGTERM at {r['stopped']['signalled_at_records']} logged -> exit "
            f"{r['stopped']['exit_code']}, checkpoint {r['stopped']['checkpoint_iteration']}; "
            f"resume exit {r['resumed']['exit_code']}, checkpoint "
            f"{r['resumed']['checkpoint_iteration']}, each iteration once "
            f"{r['each_iteration_once']}; steady step "
            + (f"{r['steady_iteration_s'] * 1e3:.2f} ms" if r.get("steady_iteration_s") else "n/a")
            + (f"; accuracy {acc['accuracy']:.3f}" if "accuracy" in acc else "")
        )
    return lines
