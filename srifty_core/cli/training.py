"""The ``srifty`` commands that run and judge training: ``train`` (a plan file on local
worker processes, or a whole job with the plan-and-train DAG's steps) and ``monitor`` (a
run's progress log judged as the DAG's monitor does); with the checked readers of what
they read (``read_train_plan``, ``read_progress_checked``: a bad file is a ``ConfigError``
naming it).

Each ``cmd_*`` takes the parsed arguments and returns the exit code; the runtime is
imported inside it, so ``srifty --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from srifty_core.errors import ConfigError

if TYPE_CHECKING:
    from srifty_core.jobs.outcome import Outcome
    from srifty_core.planner.schema.train_plan import TrainPlan
    from srifty_core.runs.progress import ProgressRecord


MAX_PLAN_BYTES = 1 << 20
CLI_POLL_S = 1.0
"""How often ``srifty train PLAN.json`` steps its monitor and redraws the progress bar."""


def read_train_plan(path: Path) -> TrainPlan:
    """The train plan in ``path``; anything that is not one is a ``ConfigError`` naming the
    file (unreadable, not JSON, not an object) or the field (``TrainPlan.parse``), before
    any worker starts."""
    import json

    from srifty_core.planner.schema.train_plan import TrainPlan
    from srifty_core.workloads.references import check_sequence

    try:
        if path.stat().st_size > MAX_PLAN_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_PLAN_BYTES} bytes; not a train plan")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"train plan file not found: {path}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; a train plan is a JSON object") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the train plan ({exc.strerror})") from None
    try:
        d = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply; not a train plan") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{path}: a train plan is a JSON object, got {type(d).__name__}")
    plan = TrainPlan.parse(d)
    check_sequence(plan.model)  # what every rank's build would refuse, before they start
    return plan


def _train_job(args: argparse.Namespace) -> int:
    """``srifty train --job JOB.yaml``: the whole job with the DAG's steps
    (``jobs.job_run``). The same job run again after its driver died (killed, Ctrl-C,
    an error) resumes its unfinished run in the same folder; ``--restart`` starts a new
    one (``job_run.run_job(resume_unfinished=...)``)."""
    from pathlib import Path

    from srifty_core.console import StageProgress
    from srifty_core.jobs.job_run import read_job_file, run_job
    from srifty_core.jobs.outcome import Outcome

    conf = read_job_file(Path(args.job))
    if args.command:
        conf["entrypoint"] = list(args.command)
    if args.provider is not None:
        conf["provider"] = args.provider
    from srifty_core.cloud import find_provider_class

    provider = None
    asked = find_provider_class(conf.get("provider"), aliases=True)
    emulated = asked is not None and asked.simulated  # lives in this process
    if args.preempt and not emulated:
        raise ConfigError("--preempt: only on the emulated EC2 (--provider ec2-emulated)")
    if emulated:
        from srifty_core.jobs import emulated_job

        provider = emulated_job.make_provider(conf, args.preempt)
    with StageProgress(f"job {Path(args.job).name}", disable=args.no_progress) as show:
        run = run_job(
            conf,
            provider=provider,
            poll_s=emulated_job.POLL_S if emulated else 1.0,
            on_poll=lambda r: show(
                f"{r.config_id}: {r.status}", r.iterations_done, int(conf["iterations"])
            ),
            track=not args.no_mlflow,
            resume_unfinished=not args.restart,
            say=print,
        )
    for c in run.configurations:
        print(
            f"{c.config_id}: {', '.join(c.launches)}, local batches {list(c.local_batches)}: "
            f"{c.status} ({c.reason})"
        )
    _print_outcome(Outcome.from_dict(run.outcome))
    if provider is not None:
        print(emulated_job.summary(provider))
    return 0


def _print_outcome(out: Outcome) -> None:
    """Rank 0's last lines (a script's own output), then the run folder's ``outcome.json``
    as lines: the same numbers."""
    for line in (*out.output_lines(), *out.lines()):
        print(line)


def cmd_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from srifty_core.cloud.local import LocalProvider
    from srifty_core.jobs.local_run import train_local
    from srifty_core.runs import store as run_store
    from srifty_core.runs.progress import read_progress

    if (args.plan is None) == (args.job is None):
        raise ConfigError("train: give a plan file or --job JOB.yaml (one of them)")
    if args.job is not None:
        if args.force:
            raise ConfigError("--force: only with a plan file (a --job is planned for here)")
        return _train_job(args)
    from srifty_core.cloud import shares_host

    if not (args.provider is None or shares_host(args.provider)) or args.preempt:
        raise ConfigError(
            "--provider: a plan file trains on local processes; for ec2 or ec2-emulated give "
            "a whole job (--job JOB.yaml)"
        )
    plan = read_train_plan(Path(args.plan))
    command = list(getattr(args, "command", []))
    if command:
        plan = plan.replace(entrypoint=tuple(command))
    if not run_store.is_remote(plan.run_dir):  # a damaged local log is named before a start
        read_progress_checked(plan.progress_path)
    from srifty_core.jobs.preflight import PlanDoesNotFit, check_plan_fits

    try:  # a plan made for other machines (GPU VMs, more cores or memory) is refused
        check_plan_fits(plan, args.plan)
    except PlanDoesNotFit as exc:
        if not args.force:
            raise
        print(
            f"srifty: warning: {exc.path}: {'; '.join(exc.problems)}; running it anyway (--force)",
            file=sys.stderr,
        )
    from srifty_core.console import StageProgress
    from srifty_core.jobs.outcome import rank_logs

    logs = rank_logs(plan.run_dir, plan.config_id)
    where = f"; the ranks' output: {logs}/rank-*.log" if logs else ""
    print(f"run folder: {plan.run_dir}{where}")
    bar = StageProgress(f"train {plan.model}", disable=args.no_progress)
    bar(f"{plan.config_id}: starting {plan.world_size} rank(s)", 0, plan.iterations)

    def show(_alloc: object) -> None:
        recs = read_progress(plan.progress_path)
        if recs:
            last = recs[-1]
            loss = f", loss {last.loss:.4g}" if last.loss is not None else ""
            bar(f"{last.config_id}: training{loss}", last.iteration, plan.iterations)

    with bar:  # "done" only when it is: not on Ctrl-C or an error (main says which)
        # One monitor step a second: each appends a line to decisions.jsonl and may
        # recalibrate, so a faster poll would fill the log and take cores from the ranks.
        report = train_local(
            plan, LocalProvider(), on_poll=show, poll_s=CLI_POLL_S, restart=args.restart,
            track=not args.no_mlflow,
        )  # fmt: skip
    for seg in report.segments:
        print(
            f"{seg.config_id}: local batches {list(seg.local_batches)}, iterations "
            f"{seg.start_iteration}..{seg.end_iteration}, {seg.outcome}"
        )
    if report.outcome is not None:
        _print_outcome(report.outcome)
    from srifty_core.worker.checkpoint import latest, sharded_paths

    found = latest(plan.checkpoint_path)  # a sharded plan's: the summary naming its shards
    sharded = found is not None and found[0] == "sharded"
    print(
        f"checkpoint: {sharded_paths(plan.checkpoint_path)[0] if sharded else plan.checkpoint_path}"
    )
    return 0


def read_progress_checked(log: Path | str) -> list[ProgressRecord]:
    """``progress.read_progress(log)``, with a record of the wrong shape (a string
    iteration, a null field, a NaN time) a ``ConfigError`` naming the log, not a
    ``ValueError`` traceback or a NaN throughput."""
    import math

    from srifty_core.runs.progress import read_progress

    try:
        records = read_progress(log)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ConfigError(f"{log}: a progress record with missing or bad fields ({exc})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{log}: cannot read the progress log ({exc})") from None
    for r in records:
        if not (math.isfinite(r.wall_time) and math.isfinite(r.step_s) and r.step_s >= 0):
            raise ConfigError(
                f"{log}: the record of iteration {r.iteration} has a wall_time or step_s that "
                f"is not a finite time ({r.wall_time}, {r.step_s})"
            )
    return records


def cmd_monitor(args: argparse.Namespace) -> int:
    import json
    import math
    import time
    from pathlib import Path

    from srifty_core.jobs.monitor import Limits, decide
    from srifty_core.runs.progress import PROGRESS_FILE

    if args.iterations < 1:
        raise ConfigError(f"--iterations: must be at least 1, got {args.iterations}")
    for name in ("time_limit", "budget", "window"):
        v = getattr(args, name)
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise ConfigError(f"--{name.replace('_', '-')}: must be a positive number, got {v}")
    for name in ("usd_per_hour", "now"):
        v = getattr(args, name)
        if v is not None and not (v >= 0 and math.isfinite(v)):
            raise ConfigError(f"--{name.replace('_', '-')}: must be a number >= 0, got {v}")
    run = Path(args.run)
    log = run / PROGRESS_FILE if run.is_dir() else run
    records = read_progress_checked(log)
    if not records:
        print(f"srifty: error: no progress records in {log}", file=sys.stderr)
        return 2
    limits = Limits(
        iterations=args.iterations,
        global_batch=records[-1].samples,
        time_limit_s=args.time_limit if args.time_limit is not None else math.inf,
        budget_usd=args.budget if args.budget is not None else math.inf,
        usd_per_hour=args.usd_per_hour,
    )
    started = records[0].wall_time - records[0].step_s
    now = args.now
    if now is None:
        # a finished run is judged when its last step ended, not counted up to today
        finished = max(r.iteration for r in records) >= args.iterations
        now = max(r.wall_time for r in records) if finished else time.time()
    d = decide(records, limits, now=now, started_at=started, window_s=args.window * 60.0)
    if args.json:
        print(json.dumps({
            "action": d.action, "reason": d.reason, "iterations_done": d.iterations_done,
            "elapsed_s": d.elapsed_s, "spent_usd": d.spent_usd,
            "throughput": d.window.throughput if d.window else None,
            "std": d.window.std if d.window else None,
            "optimistic_throughput": d.optimistic_throughput,
            "projected_time_s": d.projected_time_s, "projected_cost_usd": d.projected_cost_usd,
        }, indent=1))  # fmt: skip
    else:
        print(f"{d.action}: {d.reason}")
        print(f"iterations {d.iterations_done}/{args.iterations}, elapsed {d.elapsed_s:.0f} s")
        if d.window is not None:
            print(
                f"throughput {d.window.throughput:.1f} +- {d.window.std:.1f} samples/s over "
                f"{d.window.steps} steps in the last {args.window:g} min"
            )
    return 0 if d.action == "continue" else 1
