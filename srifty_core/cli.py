"""The ``srifty`` command.

Each subcommand is a thin shell over a library call; heavy libraries are imported inside
the subcommand that needs them, so ``srifty --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from srifty_core import __version__, paths
from srifty_core.errors import ConfigError, SriftyError
from srifty_core.probing.config import MIN_ALLOCATIONS

if TYPE_CHECKING:
    from srifty_core.outputs import Output
    from srifty_core.runs.progress import ProgressRecord
    from srifty_core.runtime.outcome import Outcome
    from srifty_core.runtime.train_plan import TrainPlan


def _cmd_catalog(args: argparse.Namespace) -> int:
    from srifty_core.catalog import Catalog
    from srifty_core.catalog.refresh import refresh_catalog_report
    from srifty_core.catalog.report import catalog_json, format_table, price_age_line

    if args.validate:
        summary = refresh_catalog_report(regions=[args.region] if args.region else [])
        print(
            f"{summary['rows']} rows: {summary['errors']} errors, {summary['warnings']} warnings"
            f"; report: {summary['report_dir']}/report.md"
        )
        return 1 if summary["errors"] else 0
    catalog = Catalog.load(use_overlays=not args.no_overlays)
    types = catalog.select(family=args.family, region=args.region)
    if args.json:
        print(catalog_json(types))
    else:
        print(format_table(types))
        print(f"\n{len(types)} rows; {price_age_line(catalog)}")
    return 0


def parse_bytes(text: str) -> int:
    """``4GiB``, ``512MB``, ``1048576`` -> bytes (powers of 1024)."""
    from srifty_core.probing.config import parse_size

    try:
        return parse_size(text, "size")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from exc


def _cmd_profile_cloud(args: argparse.Namespace) -> int:
    """``srifty profile --provider ec2-emulated|ec2 --instance-type T ...``: one VM per type
    (``jobs.profile_vms.profile_in_cloud``, the profiling DAG's steps)."""
    import json

    from srifty_core.jobs.cloud_request import CloudProfileRequest
    from srifty_core.jobs.profile_summary import format_summary
    from srifty_core.jobs.profile_vms import profile_in_cloud
    from srifty_core.training_settings import TrainingSettings

    if args.out is not None or args.plot is not None or args.dense or args.batch_sizes:
        raise ConfigError("--provider: profiles go to the profile store (no --out, --plot, "
                          "--dense or --batch-sizes)")  # fmt: skip
    try:
        ec2 = json.loads(args.ec2) if args.ec2 else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--ec2: not JSON ({exc})") from None
    if not isinstance(ec2, dict):
        raise ConfigError(f'--ec2: a JSON object like {{"image_id": "ami-..."}}, got {args.ec2}')
    request = CloudProfileRequest(
        args.model,
        args.size,
        TrainingSettings(args.precision, args.optimizer, args.compile, args.channels_last),
        probes=args.probes,
        repeats=args.repeats,
        refine=args.refine,
        max_batch=args.max_batch,
    )
    summary = profile_in_cloud(
        args.provider, args.instance_type or [], request, market=args.market,
        region=args.region, ec2=ec2,
        make_reference=not args.no_reference, seed=args.seed,
        timeout_s=args.collect_timeout_s,
    )  # fmt: skip
    print(format_summary(summary))
    for name, error in summary["errors"].items():
        print(f"{name}: {error}", file=sys.stderr)
    return 1 if summary["failed"] else 0


def _on_this_host(provider: object) -> bool:
    """Does ``provider`` name the provider of this host's worker processes
    (``Provider.shares_host``)? An unknown name does not (its own command refuses it)."""
    from srifty_core.cloud import shares_host

    return shares_host(provider)


def _writable_folder(folder: Path) -> None:
    """Make ``folder`` (and its parents) and check this process may write in it; an
    ``OSError`` naming it otherwise (``main`` prints it as one line)."""
    folder.mkdir(parents=True, exist_ok=True)
    if not os.access(folder, os.W_OK):
        raise PermissionError(13, "Read-only file system or no permission to write", str(folder))


def _cmd_profile(args: argparse.Namespace) -> int:
    if not _on_this_host(args.provider):
        return _cmd_profile_cloud(args)

    from srifty_core.profiling.budget import KNOBS
    from srifty_core.profiling.config import ProfilerConfig
    from srifty_core.profiling.job import run_profile_job
    from srifty_core.profiling.report import summary_text
    from srifty_core.training_settings import TrainingSettings

    budget = {name: getattr(args, name) for name, knob in KNOBS.items() if knob.flag != ""}
    config = ProfilerConfig(
        **{**budget, "probes": None if args.dense else args.probes},
        device=args.device,
        settings=TrainingSettings(
            precision=args.precision,
            optimizer=args.optimizer,
            compile=args.compile,
            channels_last=args.channels_last,
        ),
    )
    from srifty_core.console import StageProgress
    from srifty_core.outputs import answer_stream, output
    from srifty_core.workloads import parse_model

    parse_model(args.model)  # a bad reference is one line before anything starts
    out, plot = output(args.out, "--out"), output(args.plot, "--plot")
    report = answer_stream(out, plot)
    if out is None:  # a store it cannot write is one line now, not after minutes of profiling
        _writable_folder(paths.profiles_dir())
    with StageProgress(f"profile {args.model}") as progress:
        result = run_profile_job(
            args.model,
            args.size,
            config,
            out=out,
            log_to_mlflow=not args.no_mlflow,
            progress=progress,
        )
    print(summary_text(result.profile), file=report)
    print(f"\nprofile: {out if out is not None else result.path}", file=report)
    if plot is not None:
        from srifty_core.profiling.report import plot_profile

        where = plot.write_with(lambda p: plot_profile(result.profile, p))
        print(f"plot: {where}", file=report)
    if result.mlflow_run_id:
        print(
            f"MLflow run: {result.mlflow_run_id} (experiment srifty-compute-profiles)",
            file=report,
        )
    return 0


def _cmd_probe(args: argparse.Namespace) -> int:
    from datetime import date

    from srifty_core.cloud import get_provider
    from srifty_core.measure.sweep import probe_sweep
    from srifty_core.probing.config import (
        SWEEP_TIMEOUT_S,
        SweepConfig,
        parse_int_list,
        parse_sizes,
    )
    from srifty_core.probing.store import read_partition_table
    from srifty_core.probing.summary import format_summary, noisy_points, summarize

    config = SweepConfig(
        sizes=parse_sizes(args.sizes, points_per_decade=args.points_per_decade, steps=args.steps),
        world_sizes=parse_int_list(args.world_sizes, "world_sizes"),
        concurrency=parse_int_list(args.concurrency, "concurrency"),
        repeats=args.repeats,
        warmup=args.warmup,
        backend=args.backend,
        allocations=args.allocations,
        sustained_s=args.sustained_s,
        sweep_timeout_s=SWEEP_TIMEOUT_S + args.sustained_s,
    )
    provider = get_provider(args.provider)
    try:
        day = date.fromisoformat(args.day) if args.day else None
    except ValueError as exc:
        raise ConfigError(f"--day: {args.day!r} is not a date YYYY-MM-DD ({exc})") from None
    from srifty_core.console import StageProgress

    bar = StageProgress(f"probe {args.instance_type}", disable=args.no_progress)

    def progress(done: int, total: int) -> None:
        bar("allreduce sweep: points", done, total)

    ok = False  # "done" only when every point was measured (an error or a failed point: no)
    try:
        result = probe_sweep(
            config,
            instance_type=args.instance_type,
            provider=provider,
            day=day,
            instances=args.instances,
            fresh=args.fresh,
            on_progress=progress,
        )
        ok = result.ok
    finally:
        bar.close(ok=ok)
    print(
        f"{result.measured} point(s) measured, {result.skipped} already stored, "
        f"{len(result.failed)} failed, in {result.wall_s:.1f}s on "
        f"{len(result.allocation_ids)} allocation(s); {result.rows} rows in {result.partition}"
    )
    if result.partition.exists():
        stored = read_partition_table(result.partition).to_pandas()
        print(format_summary(summarize(stored)))
        for line in noisy_points(stored):
            print(line)
    for f in result.failed[:5]:
        print(f"failed: {f.point}: {f.reason}", file=sys.stderr)
    if result.failed:
        print("rerun the same command to measure only the missing points", file=sys.stderr)
    return 0 if result.ok else 1


def _import_xgboost_without_sklearn() -> None:
    """Import XGBoost without its scikit-learn wrapper when neither is loaded yet.

    ``import xgboost`` imports scikit-learn whenever it is installed (for ``XGBRegressor``
    and friends), and scikit-learn imports ``scipy.stats``: about 0.7 s of a 1-2 s ``srifty
    plan``. Srifty uses XGBoost's own API only (``DMatrix``, ``train``, ``Booster``), which
    does not need scikit-learn, so ``plan`` imports XGBoost with scikit-learn hidden for
    that moment. In this process XGBoost's scikit-learn wrapper then says scikit-learn is
    missing; nothing in ``srifty plan`` uses it. Only the ``plan`` command run as a program
    does this (``main()`` without ``argv``), never a caller of ``main([...])`` in its own
    process.
    """
    if "xgboost" in sys.modules or "sklearn" in sys.modules:
        return
    sys.modules["sklearn"] = None  # type: ignore[assignment]  # "import sklearn" fails
    try:
        import xgboost  # noqa: F401
    except ImportError:  # XGBoost missing: the model's own load says so
        pass
    finally:
        del sys.modules["sklearn"]


def _cmd_plan(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from srifty_core.planner.job import (
        load_bandwidth_with_source,
        load_request,
        read_request_file,
        render,
    )
    from srifty_core.planner.search import plan

    outs = _PlanOutputs(args)  # a bad output path is named before any work
    report = outs.report
    data = read_request_file(Path(args.request))
    request = load_request(data)
    bandwidth: dict[str, object] | None = None
    calibration = None  # factors earlier runs of this model measured (simulator.calibration)
    if args.estimator == "apm":
        from srifty_core.simulator.apm import ApmEstimator

        estimator: object = ApmEstimator()
    else:
        from srifty_core.simulator.estimator import Simulator

        if args.bandwidth == "champion" and args.as_program:
            _import_xgboost_without_sklearn()
        model, bandwidth = load_bandwidth_with_source(
            args.bandwidth, refresh_model=args.refresh_model, public_fallback=True
        )
        if not args.no_calibration:
            from srifty_core.simulator.calibration import for_request

            calibration = for_request(request, model)
        estimator = Simulator(model, seed=args.seed, calibration=calibration)
    if args.what_if or args.one_more_vm:
        return _what_if(args, estimator, bandwidth, data, outs)
    result = plan(request, estimator, method=args.method)  # type: ignore[arg-type]
    if args.json:
        out = result.to_dict()
        if bandwidth is not None:
            out["bandwidth_model"] = bandwidth
        out["calibration"] = None if calibration is None else calibration.to_dict()
        print(json.dumps(out, indent=1), file=report)
    else:
        print(render(result, None if bandwidth is None else str(bandwidth["text"])), file=report)
        if calibration is not None:
            print(
                f"Calibrated by earlier runs of {request.workload.model} "
                "(--no-calibration to ignore): " + "; ".join(calibration.describe()),
                file=report,
            )
    _write_plan_outputs(args, data, result, outs)
    return 0 if result.feasible else 1


class _PlanOutputs:
    """``srifty plan``'s ``--write-plan`` and ``--frontier`` (``outputs``), checked before
    the plan is made; ``report``: where the answer goes (standard error where standard
    output carries one of them, ``-``)."""

    def __init__(self, args: argparse.Namespace) -> None:
        from srifty_core.outputs import answer_stream, output

        self.plan = output(args.write_plan, "--write-plan")
        self.frontier = output(args.frontier, "--frontier")
        self.report = answer_stream(self.plan, self.frontier)


def _write_plan_outputs(
    args: argparse.Namespace, data: Any, result: Any, outs: _PlanOutputs
) -> None:
    """The frontier plot and the training plan of ``result`` (the base plan of a
    ``--what-if``), where asked for."""
    if outs.frontier is not None:
        from srifty_core.planner.plot import plot_frontier

        where = outs.frontier.write_with(lambda p: plot_frontier(result, p))
        if not args.json:
            print(f"frontier plot: {where}", file=outs.report)
    if outs.plan is not None and result.best is not None:
        written = write_train_plan(data, result.request, result.best, args, outs.plan)
        if not args.json and not outs.plan.to_stdout:
            print(f"training plan: {written} (run it: srifty train {written})", file=outs.report)
    elif outs.plan is not None:
        print("no training plan written: nothing meets the limits", file=sys.stderr)


def write_train_plan(
    data: Any, request: Any, best: Any, args: argparse.Namespace, out: Output
) -> str:
    """``srifty plan --write-plan``: the best configuration as the plan ``srifty train``
    runs (one rank per GPU in launch order, the request's model, size and settings), the
    launches and the prediction kept in its ``extra``; written atomically to ``out``.
    Returns where it went."""
    import dataclasses
    import json

    from srifty_core.planner.schema.request_spec import RequestSpec
    from srifty_core.runtime.planning import launches_for, train_plan_for
    from srifty_core.training_settings import TrainingSettings
    from srifty_core.workloads import model_key

    spec = RequestSpec.parse(data)
    launches = launches_for(request, best.choice)
    run_dir = args.run_dir or str(paths.data_dir() / "runs" / model_key(spec.model))
    plan = train_plan_for(
        launches,
        model=spec.model,
        size=spec.size,
        global_batch=spec.global_batch,
        iterations=spec.iterations,
        run_dir=run_dir,
        checkpoint_every=spec.checkpoint_every,
        settings=TrainingSettings.from_dict(spec.model_dump()),
        extra={
            "launches": [dataclasses.asdict(x) for x in launches],
            "predicted": best.to_dict(request),
            "request": str(args.request),
        },
    )
    return out.write(json.dumps(plan.to_dict(), indent=1, default=str) + "\n")


def _what_if(
    args: argparse.Namespace, estimator: object, bandwidth: object, data: Any, outs: _PlanOutputs
) -> int:
    """``srifty plan --what-if ... --one-more-vm``: the base plan and each scenario's
    (``planner.whatif``), simulations shared; ``--write-plan`` and ``--frontier`` are the
    base plan's."""
    import json
    from pathlib import Path

    from srifty_core.catalog import Catalog
    from srifty_core.planner import whatif
    from srifty_core.planner.job import read_request_file, store_requests
    from srifty_core.profiling.store import ProfileStore

    build = store_requests(Catalog.load(), ProfileStore())
    scenarios = [whatif.parse_scenario(t) for t in args.what_if]  # bad input fails first
    what = whatif.WhatIf(
        read_request_file(Path(args.request)),
        estimator,  # type: ignore[arg-type]
        build,
        {"method": args.method},
    )
    answers = [what.ask(s) for s in scenarios]
    marginal = what.marginal_values() if args.one_more_vm else []
    report = outs.report
    if args.json:
        out = whatif.to_dict(what, answers, marginal)
        if bandwidth is not None:
            out["bandwidth_model"] = bandwidth
        print(json.dumps(out, indent=1), file=report)
    else:
        print(whatif.render(what, answers, marginal), file=report)
        print(
            f"simulations: {what.memo.misses} run, {what.memo.hits} reused from earlier searches",
            file=report,
        )
    _write_plan_outputs(args, data, what.base, outs)
    return 0 if what.base.feasible else 1


def _cmd_fit_bandwidth(args: argparse.Namespace) -> int:
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from srifty_core.predictors.refresh.config import RefreshConfig, parse_duration
    from srifty_core.predictors.refresh.pipeline import refresh_bandwidth_model
    from srifty_core.predictors.refresh.report import format_report
    from srifty_core.predictors.tuning import DEFAULT_TRIALS

    if args.budget is not None:
        raise ConfigError(
            "--budget was removed: tuning runs a fixed number of seeded trials per size class "
            "(--trials N), not until a time budget is spent, so the same command gives the "
            "same model"
        )
    config = RefreshConfig(
        since=None if args.since == "all" else parse_duration(args.since, "since"),
        half_life=None if args.half_life == "none" else parse_duration(args.half_life, "half-life"),
        providers=tuple(args.provider) if args.provider else None,
        instance_types=tuple(args.instance_type) if args.instance_type else None,
        n_trials=DEFAULT_TRIALS if args.trials is None else args.trials,
        tune_rows=_tune_rows(args.tune_rows),
        mtu=args.mtu,
        seed=args.seed,
    )
    outcome = refresh_bandwidth_model(config, tracking_uri=args.tracking_uri)
    print(format_report(outcome))
    return 0


def _tune_rows(text: str | None) -> int | None:
    """``--tune-rows``: a row count, ``all`` (None), or the default when not given."""
    from srifty_core.predictors.refresh.config import TUNE_ROWS

    if text is None:
        return TUNE_ROWS
    if text == "all":
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--tune-rows: a number of rows or 'all', got {text!r}") from None


MAX_PLAN_BYTES = 1 << 20
CLI_POLL_S = 1.0
"""How often ``srifty train PLAN.json`` steps its monitor and redraws the progress bar."""


def read_train_plan(path: Path) -> TrainPlan:
    """The train plan in ``path``; anything that is not one is a ``ConfigError`` naming the
    file, or the field (``TrainPlan`` checks the values; this checks the file, the keys
    and the names a worker would only trip on later)."""
    import dataclasses
    import json

    from srifty_core.runtime.train_plan import TrainPlan
    from srifty_core.workloads import SIZES, parse_model

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
    fields = {f.name: f for f in dataclasses.fields(TrainPlan)}
    for key in d:
        if key not in fields:
            raise ConfigError(f"{key}: unknown train plan field; valid: {', '.join(fields)}")
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in d:
            raise ConfigError(f"{name}: missing from the train plan {path}")
    for name in ("model", "size", "run_dir", "config_id", "dtype", "device", "precision"):
        if name in d and (not isinstance(d[name], str) or not d[name].strip()):
            raise ConfigError(f"{name}: must be a non-empty string, got {d[name]!r}")
    parse_model(d["model"])
    if d["size"] not in SIZES:
        raise ConfigError(f"size: must be one of {', '.join(SIZES)}, got {d['size']!r}")
    if "extra" in d and not isinstance(d["extra"], dict):
        raise ConfigError(f"extra: must be a mapping, got {d['extra']!r}")
    return TrainPlan.from_dict(d)


def _train_job(args: argparse.Namespace) -> int:
    """``srifty train --job JOB.yaml``: the whole job with the DAG's steps
    (``runtime.job_run``). The same job run again after its driver died (killed, Ctrl-C,
    an error) resumes its unfinished run in the same folder; ``--restart`` starts a new
    one (``job_run.run_job(resume_unfinished=...)``)."""
    from pathlib import Path

    from srifty_core.console import StageProgress
    from srifty_core.runtime.job_run import read_job_file, run_job
    from srifty_core.runtime.outcome import Outcome

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
        from srifty_core.runtime import emulated_job

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


def _cmd_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from srifty_core.cloud.local import LocalProvider
    from srifty_core.runs import store as run_store
    from srifty_core.runs.progress import read_progress
    from srifty_core.runtime.local_run import train_local

    if (args.plan is None) == (args.job is None):
        raise ConfigError("train: give a plan file or --job JOB.yaml (one of them)")
    if args.job is not None:
        if args.force:
            raise ConfigError("--force: only with a plan file (a --job is planned for here)")
        return _train_job(args)
    if not (args.provider is None or _on_this_host(args.provider)) or args.preempt:
        raise ConfigError(
            "--provider: a plan file trains on local processes; for ec2 or ec2-emulated give "
            "a whole job (--job JOB.yaml)"
        )
    plan = read_train_plan(Path(args.plan))
    command = list(getattr(args, "command", []))
    if command:
        import dataclasses

        plan = dataclasses.replace(plan, entrypoint=tuple(command))
    if not run_store.is_remote(plan.run_dir):  # a damaged local log is named before a start
        read_progress_checked(plan.progress_path)
    from srifty_core.runtime.preflight import PlanDoesNotFit, check_plan_fits

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
    from srifty_core.runtime.outcome import rank_logs

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
    print(f"checkpoint: {plan.checkpoint_path}")
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


def _cmd_monitor(args: argparse.Namespace) -> int:
    import json
    import math
    import time
    from pathlib import Path

    from srifty_core.runs.progress import PROGRESS_FILE
    from srifty_core.runtime.monitor import Limits, decide

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


def _cmd_ui(args: argparse.Namespace) -> int:
    from srifty_core.ui import run_ui

    return run_ui(
        airflow_port=args.airflow_port,
        mlflow_port=args.mlflow_port,
        password=args.password,
        once=args.once,
    )


def _cmd_airflow(args: argparse.Namespace) -> int:
    from srifty_core.airflow_env import airflow_cli

    return airflow_cli(paths.data_dir(), list(args.airflow_args))


def _cmd_demo(args: argparse.Namespace) -> int:
    from srifty_core.demo import run_demo

    return run_demo()


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line, like every other ``srifty`` error:
    ``srifty plan: error: argument --seed: invalid int value: 'x' (srifty plan --help)``,
    exit 2 (argparse prints the whole usage first)."""

    def error(self, message: str) -> NoReturn:
        text = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {text} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="srifty",
        description="Plan, run and re-plan distributed training on cloud VMs.",
    )
    parser.add_argument("--version", action="version", version=f"srifty {__version__}")
    parser.add_argument(
        "--data-dir",
        metavar="DIR",
        help=f"where Srifty keeps its data (default: ${paths.ENV_VAR}, else the repo's data/)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    cat = sub.add_parser(
        "catalog",
        help="list EC2 GPU instance types with prices",
        description="Print the instance catalog (shipped prices plus overlays in DATA/prices/).",
    )
    cat.add_argument("--family", help="only this family, e.g. g4dn")
    cat.add_argument("--region", help="only this region, e.g. us-east-1")
    cat.add_argument("--json", action="store_true", help="machine-readable output")
    cat.add_argument("--no-overlays", action="store_true", help="shipped prices only")
    cat.add_argument(
        "--validate",
        action="store_true",
        help="check the catalog and write a report under DATA/reports/catalog/ (exit 1 on errors)",
    )
    cat.set_defaults(func=_cmd_catalog)

    from srifty_core.profiling.budget import DEFAULT_DEVICE, DEFAULT_SIZE, add_budget_flags
    from srifty_core.training_settings import DEFAULT_SETTINGS, OPTIMIZERS, PRECISIONS
    from srifty_core.workloads import MODEL_NAMES, SIZES, shipped_hf_configs

    prof = sub.add_parser(
        "profile",
        help="profile a model's compute latency, memory and gradient schedule",
        description="Profile one model on the device this runs on; writes the compute profile "
        "to DATA/profiles/ (or --out) and logs it to MLflow.",
    )
    prof.add_argument(
        "--model",
        required=True,
        help=f"a zoo model ({', '.join(MODEL_NAMES)}), package.module:factory, "
        "path/to/file.py:factory, or hf:NAME (a shipped config: "
        f"{', '.join(shipped_hf_configs())}; or a config.json)",
    )
    prof.add_argument(
        "--size", default=DEFAULT_SIZE, help=f"one of {', '.join(SIZES)} (default {DEFAULT_SIZE})"
    )
    for name, choices in (("precision", PRECISIONS), ("optimizer", OPTIMIZERS)):
        default = getattr(DEFAULT_SETTINGS, name)
        prof.add_argument(
            f"--{name}", default=default, choices=choices, help=f"as you train (default {default})"
        )
    prof.add_argument("--compile", action="store_true", help="torch.compile the model first")
    prof.add_argument(
        "--channels-last", action="store_true", help="channels-last memory format (vision)"
    )
    prof.add_argument(
        "--device", default=DEFAULT_DEVICE, help=f"cpu, cuda or cuda:N (default {DEFAULT_DEVICE})"
    )
    add_budget_flags(prof, {"batch_sizes": _int_list, "memory_cap_bytes": parse_bytes})
    prof.add_argument("--dense", action="store_true", help="measure every power of two instead")
    prof.add_argument("--out", help="write the profile here instead of the profile store")
    prof.add_argument("--plot", help="also write the latency plot (PNG) here")
    prof.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    from srifty_core.cloud import PROVIDERS

    prof.add_argument(
        "--provider",
        default="local",
        choices=PROVIDERS,
        help="local (default): this machine's --device; ec2-emulated or ec2: one VM per "
        "--instance-type, its profile into the store, the VMs' seconds and cost",
    )
    prof.add_argument(
        "--instance-type", action="append", help="a catalog GPU type (repeatable; --provider)"
    )
    prof.add_argument("--market", default="on-demand", choices=("on-demand", "spot"))
    prof.add_argument("--region", default="us-east-1", help="catalog region (--provider)")
    prof.add_argument("--ec2", help='ec2 launch settings as JSON: {"image_id": "ami-..."}')
    prof.add_argument(
        "--collect-timeout-s",
        type=float,
        default=3600.0,
        help="ec2: how long to wait for a VM's profile (default 3600)",
    )
    prof.add_argument("--seed", type=int, default=0, help="ec2-emulated: the seed (default 0)")
    prof.add_argument(
        "--no-reference",
        action="store_true",
        help="ec2-emulated: fail when no stored profile of the model can be emulated from, "
        "instead of profiling it on this CPU first",
    )
    prof.set_defaults(func=_cmd_profile)
    probe = sub.add_parser(
        "probe",
        help="measure allreduce bus bandwidth (a probe sweep) into the probe store",
        description="Run an allreduce sweep on a provider's instances and write the day's "
        "partition of DATA/probes/. A rerun on the same day measures only missing points.",
    )
    probe.add_argument("--provider", default="local", help="where to run (default: local)")
    probe.add_argument(
        "--instance-type", default="local.cpu", help="local.cpu, or a catalog type as a label"
    )
    probe.add_argument(
        "--instances",
        type=int,
        help="instances per allocation (default: enough for the largest world size)",
    )
    probe.add_argument("--world-sizes", default="2", help="comma list, e.g. 2,4 (default 2)")
    probe.add_argument(
        "--sizes", default="4B:64MB", help="LO:HI geometric range or a comma list (4B..512MB)"
    )
    spacing = probe.add_mutually_exclusive_group()
    spacing.add_argument("--points-per-decade", type=float, help="range spacing (default 3)")
    spacing.add_argument("--steps", type=int, help="number of sizes in the range")
    probe.add_argument("--concurrency", default="1,2,4", help="allreduces in flight (1,2,4)")
    probe.add_argument("--repeats", type=int, default=5, help="timed samples per point")
    probe.add_argument(
        "--sustained-s",
        type=float,
        default=0.0,
        help="sustained-transfer probe at the largest world size: up to this many seconds of "
        "back-to-back "
        "allreduces before its samples (EC2 'up to' types: 3900; default 0: none)",
    )
    probe.add_argument("--warmup", type=int, default=2, help="untimed rounds per point")
    probe.add_argument("--backend", default="gloo", help="gloo (CPU) or nccl (CUDA)")
    probe.add_argument(
        "--allocations",
        type=int,
        default=MIN_ALLOCATIONS,
        help=f"fresh allocations to repeat on (default {MIN_ALLOCATIONS}: what `srifty "
        "fit-bandwidth` needs)",
    )
    probe.add_argument("--day", help="partition day YYYY-MM-DD (default: today, UTC)")
    probe.add_argument("--fresh", action="store_true", help="re-measure, replacing the day's data")
    probe.add_argument("--no-progress", action="store_true", help="no progress bar")
    probe.set_defaults(func=_cmd_probe)

    pl = sub.add_parser(
        "plan",
        help="choose VMs and local batches for a training job (exit 1 if nothing fits)",
        description="Plan REQUEST (YAML or JSON: model, global_batch, iterations, offers, "
        "time_limit_s, budget_usd, objective; see the README).",
    )
    pl.add_argument("request", help="request file (.yaml or .json)")
    pl.add_argument("--json", action="store_true", help="machine-readable answer")
    pl.add_argument("--frontier", metavar="PNG", help="also draw the cost/time frontier")
    pl.add_argument(
        "--write-plan",
        metavar="PLAN.json",
        help="also write the best configuration as the training plan `srifty train` runs",
    )
    pl.add_argument(
        "--run-dir",
        help="the written plan's run folder (default: DATA/runs/<model key>)",
    )
    pl.add_argument(
        "--what-if",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="also plan with this change to the request and show the difference, e.g. "
        "'quota[g4dn.xlarge]=16', 'budget_usd=20', 'offers[1].market=spot'; "
        "'a=1; b=2' changes both; repeat for more scenarios",
    )
    pl.add_argument(
        "--one-more-vm",
        action="store_true",
        help="also show, per offered type, what one VM more than its quota would change",
    )
    pl.add_argument(
        "--method",
        default="auto",
        choices=("auto", "exact", "approx", "exhaustive", "ilp"),
        help="search: auto (exact branch and bound up to 20,000 configurations, else the "
        "communication-aware approximation), or one of them; exhaustive and ilp are the "
        "method's plain searches",
    )
    pl.add_argument(
        "--estimator",
        default="srifty",
        choices=("srifty", "apm"),
        help="the Srifty simulator (default) or the APM baseline",
    )
    pl.add_argument(
        "--bandwidth",
        default="champion",
        choices=("champion", "probes", "public"),
        help="bus bandwidth from the MLflow champion model (default; while there is none, "
        "the public one), the probe table, or a model fitted on the shipped public "
        "nccl-tests tables (public)",
    )
    pl.add_argument(
        "--refresh-model",
        action="store_true",
        help="ask the MLflow store which version is champion now and copy it again, "
        "instead of the local copy (trusted while the local store still names it champion, "
        "or for $SRIFTY_CHAMPION_MAX_AGE, default 10m, with a tracking server)",
    )
    pl.add_argument("--seed", type=int, default=0, help="simulator seed (default 0)")
    pl.add_argument(
        "--no-calibration",
        action="store_true",
        help="ignore the correction factors earlier runs of this model measured "
        "(DATA/calibration/MODEL.json)",
    )
    pl.set_defaults(func=_cmd_plan)

    fitbw = sub.add_parser(
        "fit-bandwidth",
        help="tune, fit and register the allreduce bus-bandwidth model from the probe store",
        description="Train the bus-bandwidth model (two XGBoost regressors split at the MTU) on "
        "DATA/probes/, print MAPE vs the noise floor, register it in MLflow as 'challenger' "
        "and promote it to 'champion' if it is no worse on the held-out allocations.",
    )
    fitbw.add_argument("--since", default="30d", help="probes this recent (30d, 12h; 'all')")
    fitbw.add_argument(
        "--trials",
        "--max-trials",
        type=int,
        metavar="N",
        help="tuning trials per size class (default 30); seeded, so reruns agree",
    )
    fitbw.add_argument(
        "--tune-rows",
        metavar="N",
        help="tune on a sample of at most N rows per size class, the same share of every "
        "allocation ('all': every row; default 10000); the final fit uses every row",
    )
    fitbw.add_argument("--budget", help=argparse.SUPPRESS)  # removed; _cmd_fit_bandwidth says so
    fitbw.add_argument(
        "--half-life", default="14d", help="sample weight halves every ... ('none': equal)"
    )
    fitbw.add_argument("--provider", action="append", help="only this provider (repeatable)")
    fitbw.add_argument("--instance-type", action="append", help="only this type (repeatable)")
    fitbw.add_argument("--mtu", type=int, default=9001, help="size-class split, bytes (9001)")
    fitbw.add_argument("--seed", type=int, default=0, help="tuning seed (default 0)")
    fitbw.add_argument("--tracking-uri", help="MLflow store (default: SQLite under DATA/mlflow)")
    fitbw.set_defaults(func=_cmd_fit_bandwidth)

    tr = sub.add_parser(
        "train",
        help="train a plan on worker processes, re-planning on preemption",
        usage="srifty train PLAN [options] [-- COMMAND ...]",
        description="Run PLAN (JSON: model, size, global_batch, iterations, local_batches, "
        "run_dir, ...) with one DDP worker per local batch; resumes from run_dir's checkpoint. "
        "After '--', your own training script runs on every rank instead of the built-in "
        "worker (e.g. '-- python train.py --lr 0.1'; it uses srifty_core.runtime.user); "
        "default: the plan's entrypoint, else the built-in worker.",
    )
    tr.add_argument("plan", nargs="?", help="plan file (.json)")
    tr.add_argument(
        "--job",
        metavar="JOB.yaml",
        help="instead of a plan: a whole job (the srifty_plan_and_train DAG's conf: model, "
        "global_batch, iterations, offers, limits, provider local, ec2 or ec2-emulated), "
        "planned, provisioned, trained, monitored, re-planned and released with the DAG's "
        "own steps",
    )
    tr.add_argument(
        "--provider",
        choices=("local", "ec2", "ec2-emulated", "emulated"),
        help="where the ranks run (default: the job file's provider, which defaults to the "
        "one its offers imply: local, processes on this machine, when every offer is "
        "local.cpu, else ec2); ec2 and ec2-emulated (the emulated EC2 on a simulated clock, "
        "alias emulated) take a whole job (--job)",
    )
    tr.add_argument(
        "--preempt",
        action="append",
        default=[],
        metavar="TYPE@SECONDS",
        help="emulated EC2: the first VM of TYPE is taken back SECONDS of simulated time "
        "into its training (repeatable, one per type; default: none)",
    )
    tr.add_argument("--no-progress", action="store_true", help="no progress bar")
    tr.add_argument(
        "--no-mlflow",
        action="store_true",
        help="do not record the job in MLflow (default: experiment srifty-jobs, as the DAG's "
        "runs; a tracking store that fails is a warning, never a failed job)",
    )
    tr.add_argument(
        "--restart",
        action="store_true",
        help="start from scratch where the run folder has progress but no usable checkpoint "
        "(the old log and checkpoint are moved aside); with --job: start the job in a new "
        "run folder instead of resuming its unfinished run",
    )
    tr.add_argument(
        "--force",
        action="store_true",
        help="run a plan file here even if it does not fit this machine (made for GPU VMs, "
        "more ranks than the cores take, more memory than is available)",
    )
    tr.set_defaults(func=_cmd_train)

    mon = sub.add_parser(
        "monitor",
        help="read a run's progress log and say continue or replan (exit 1: replan)",
        description="Judge a run from its progress log as the plan-and-train DAG's monitor "
        "does: the windowed throughput, its 95% optimistic bound against what the limits "
        "need, and the loss; prints continue or replan (exit 0 or 1).",
    )
    mon.add_argument("run", help="run folder (with progress.jsonl) or the log itself")
    mon.add_argument("--iterations", type=int, required=True, help="the job's N")
    mon.add_argument(
        "--time-limit", type=float, help="seconds since the first step started (default: none)"
    )
    mon.add_argument("--budget", type=float, help="US dollars (default: none)")
    mon.add_argument(
        "--usd-per-hour", type=float, default=0.0, help="the configuration's rate (default 0)"
    )
    mon.add_argument("--window", type=float, default=5.0, help="minutes (default 5)")
    mon.add_argument(
        "--now",
        type=float,
        help="Unix time to judge at (default: now; for a finished run, its last record's)",
    )
    mon.add_argument("--json", action="store_true", help="machine-readable answer")
    mon.set_defaults(func=_cmd_monitor)

    ui = sub.add_parser(
        "ui",
        help="start the Airflow and MLflow UIs on the data folder (Ctrl-C stops them)",
        description="Start the Airflow UI (user admin) and the MLflow UI on the data "
        "folder's metadata database and tracking store, on loopback; Ctrl-C stops both.",
    )
    ui.add_argument("--airflow-port", type=int, default=8080, help="(default 8080)")
    ui.add_argument("--mlflow-port", type=int, default=5001, help="(default 5001)")
    ui.add_argument(
        "--password", default="srifty-admin", help="Airflow admin password (default srifty-admin)"
    )
    ui.add_argument("--once", action="store_true", help="stop as soon as both answer")
    ui.set_defaults(func=_cmd_ui)

    af = sub.add_parser(
        "airflow",
        help="the airflow CLI on the data folder (e.g. srifty airflow dags trigger ...)",
        description="Run the `airflow` command of this environment on the data folder's "
        "Airflow home: the metadata DB `srifty ui` and the demo use (created or upgraded "
        "first), the repository's DAGs and plugins. Everything after `airflow` goes to it "
        "as is: `srifty airflow dags trigger srifty_what_if --conf '{...}'`, `srifty "
        "airflow dags list-runs srifty_what_if`, `srifty airflow --help`.",
        add_help=False,
    )
    af.add_argument("airflow_args", nargs="*", metavar="ARGS", help="airflow's arguments")
    af.set_defaults(func=_cmd_airflow)

    demo = sub.add_parser(
        "demo",
        help="run the main job through Airflow on embedded defaults (SQLite, local files)",
        description="Run the whole loop for real through Airflow on this machine (probe "
        "sweep, model refresh, profiling, plan-and-train with a preemption and its "
        "re-plan, the case studies), keeping everything under the data folder; about "
        "two minutes.",
    )
    demo.set_defaults(func=_cmd_demo)
    return parser


def _airflow_args(words: list[str]) -> list[str] | None:
    """The words after ``airflow`` when it is the command (``srifty [--data-dir D]
    airflow ...``), or None: they go to airflow untouched (its own options included)."""
    k = 0
    while k < len(words) and words[k].startswith("--data-dir"):
        k += 1 if "=" in words[k] else 2
    return words[k + 1 :] if k < len(words) and words[k] == "airflow" else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    passthrough = _airflow_args(words)
    if passthrough is not None:  # `srifty airflow ARGS`: ARGS are airflow's, as given
        words = words[: len(words) - len(passthrough)]
    elif "train" in words and "--" in words[words.index("train") :]:
        cut = words.index("--", words.index("train"))
        words, command = words[:cut], words[cut + 1 :]
    args = parser.parse_args(words)
    if passthrough is not None:
        args.airflow_args = passthrough
    args.command = command  # `srifty train PLAN -- COMMAND`: the script every rank runs
    args.as_program = argv is None  # the `srifty` command, not a caller in its own process
    if args.as_program:
        # MLflow's INFO lines ("Creating initial MLflow database tables...") on stderr would
        # make a one-line error three; its warnings still show. Only the command does this.
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    if args.data_dir:
        # One place decides where data lives: paths.data_dir() reads this variable, and
        # child processes (Airflow tasks, workers) inherit it.
        os.environ[paths.ENV_VAR] = str(paths.data_dir(args.data_dir))
    try:
        code: int = args.func(args)
    except SriftyError as exc:
        # A bad setting or field is one line (its message starts with the field's path).
        text = " ".join(str(exc).split()) if isinstance(exc, ConfigError) else str(exc)
        print(f"srifty: error: {text}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `srifty catalog | head`
        return 0
    except KeyboardInterrupt:
        # Ctrl-C (a model factory that hangs, a long search): one line, the shell's 130
        if not args.as_program:
            raise
        print("srifty: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        # The machine refused a file: a read-only or full data folder, a file where a folder
        # should be, no permission. One line naming the path, not a traceback; an OSError
        # without a path is no such case and stays a traceback.
        if exc.filename is None or exc.strerror is None:
            raise
        where = f"{exc.filename}" + (f" -> {exc.filename2}" if exc.filename2 else "")
        print(f"srifty: error: {where}: {exc.strerror}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
