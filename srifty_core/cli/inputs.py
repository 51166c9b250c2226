"""The ``srifty`` commands that make the planner's inputs: ``catalog`` (instance types and
prices), ``profile`` (a model's compute profile, here or on one VM per type), ``probe``
(an allreduce sweep into the probe store) and ``fit-bandwidth`` (the bus-bandwidth model).

Each ``cmd_*`` takes the parsed arguments and returns the exit code; the libraries it
calls are imported inside it, so ``srifty --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import date
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srifty_core import paths
from srifty_core.errors import ConfigError

if TYPE_CHECKING:
    from srifty_core.cloud.base import Provider
    from srifty_core.probing.config import SweepConfig


def cmd_catalog(args: argparse.Namespace) -> int:
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


def _cmd_profile_cloud(args: argparse.Namespace) -> int:
    """``srifty profile --provider ec2-emulated|ec2 --instance-type T ...``: one VM per type
    (``jobs.profile_vms.profile_in_cloud``, the profiling DAG's steps)."""

    from srifty_core.jobs.cloud_request import CloudProfileRequest
    from srifty_core.jobs.profile_summary import format_summary
    from srifty_core.jobs.profile_vms import profile_in_cloud
    from srifty_core.training_settings import TrainingSettings

    if args.out is not None or args.plot is not None or args.dense or args.batch_sizes:
        raise ConfigError("--provider: profiles go to the profile store (no --out, --plot, "
                          "--dense or --batch-sizes)")  # fmt: skip
    ec2 = _ec2_json(args.ec2)
    request = CloudProfileRequest(
        args.model,
        args.size,
        TrainingSettings(
            args.precision, args.optimizer, args.compile, args.channels_last, args.tf32
        ),
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


def _ec2_json(text: str | None) -> dict[str, Any]:
    """``--ec2``'s JSON object (``{}`` when not given); a one-line error otherwise."""
    try:
        ec2 = json.loads(text) if text else {}
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--ec2: not JSON ({exc})") from None
    if not isinstance(ec2, dict):
        raise ConfigError(f'--ec2: a JSON object like {{"image_id": "ami-..."}}, got {text}')
    return ec2


def _writable_folder(folder: Path) -> None:
    """Make ``folder`` (and its parents) and check this process may write in it; an
    ``OSError`` naming it otherwise (``main`` prints it as one line)."""
    folder.mkdir(parents=True, exist_ok=True)
    if not os.access(folder, os.W_OK):
        raise PermissionError(13, "Read-only file system or no permission to write", str(folder))


def cmd_profile(args: argparse.Namespace) -> int:
    from srifty_core.cloud import shares_host

    if not shares_host(args.provider):  # ec2-emulated or ec2: one VM per --instance-type
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
            tf32=args.tf32,
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


def cmd_probe(args: argparse.Namespace) -> int:
    from srifty_core.jobs.probe_vms import probe_provider
    from srifty_core.measure.mix_sweep import probe_mix_sweep
    from srifty_core.measure.sweep import probe_sweep
    from srifty_core.probing.config import (
        SWEEP_TIMEOUT_S,
        SweepConfig,
        check_collectives,
        parse_int_list,
        parse_sizes,
    )
    from srifty_core.probing.mix import mix_label, parse_mix_spec
    from srifty_core.probing.store import read_partition_table
    from srifty_core.probing.summary import format_summary, noisy_points, summarize

    mix = parse_mix_spec(args.mix) if args.mix is not None else None
    if mix is not None:
        for flag, value in (("--world-sizes", args.world_sizes), ("--instances", args.instances)):
            if value is not None:
                raise ConfigError(
                    f"{flag}: a mix is probed at its ring's full world size on the VMs "
                    "--mix names; leave it out"
                )
    instance_type = args.instance_type or "local.cpu"
    config = SweepConfig(
        sizes=parse_sizes(args.sizes, points_per_decade=args.points_per_decade, steps=args.steps),
        world_sizes=parse_int_list(args.world_sizes or "2", "world_sizes"),
        concurrency=parse_int_list(args.concurrency, "concurrency"),
        repeats=args.repeats,
        warmup=args.warmup,
        backend=args.backend,
        allocations=args.allocations,
        sustained_s=args.sustained_s,
        sweep_timeout_s=SWEEP_TIMEOUT_S + args.sustained_s,
        collectives=check_collectives(
            c.strip() for c in str(args.collectives).split(",") if c.strip()
        ),
    )
    provider, runner = probe_provider(args.provider, ec2=_ec2_json(args.ec2), region=args.region)
    try:
        day = date.fromisoformat(args.day) if args.day else None
    except ValueError as exc:
        raise ConfigError(f"--day: {args.day!r} is not a date YYYY-MM-DD ({exc})") from None
    from srifty_core.console import StageProgress

    label = instance_type if mix is None else mix_label(mix, field="--mix")
    if provider.simulated:  # no workers to run: the emulator's own sweep makes the rows
        return _emulated_probe(config, provider, instance_type, mix, day)
    bar = StageProgress(f"probe {label}", disable=args.no_progress)

    def progress(done: int, total: int) -> None:
        bar("allreduce sweep: points", done, total)

    ok = False  # "done" only when every point was measured (an error or a failed point: no)
    try:
        if mix is None:
            result = probe_sweep(
                config,
                instance_type=instance_type,
                provider=provider,
                day=day,
                instances=args.instances,
                fresh=args.fresh,
                on_progress=progress,
                runner=runner,
            )
        else:
            result = probe_mix_sweep(
                config, mix, provider=provider, day=day, fresh=args.fresh,
                on_progress=progress, runner=runner,
            )  # fmt: skip
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


def _emulated_probe(
    config: SweepConfig,
    provider: Provider,
    instance_type: str,
    mix: dict[str, int] | None,
    day: date | None,
) -> int:
    """``srifty probe`` on the emulated EC2: its sweep (``emulated_probe_sweep``, seeded by
    the day, on the config's grid) instead of probe workers, whose rows replace the day's
    partition of the type or the mix."""
    from datetime import UTC, datetime

    from srifty_core.cloud.emulated.measurements import emulated_probe_sweep, write_emulated_probes
    from srifty_core.probing.store import read_partition_table
    from srifty_core.probing.summary import format_summary, summarize

    day = day or datetime.now(UTC).date()
    types = [provider.instance_type(instance_type).name] if mix is None else []
    table = emulated_probe_sweep(
        types,
        sizes=config.sizes,
        world_sizes=config.world_sizes,
        concurrency=config.concurrency,
        allocations=config.allocations,
        repeats=config.repeats,
        seed=day.toordinal(),
        day=day,
        sustained=config.sustained_s > 0,
        mixes=[mix] if mix is not None else (),
        collectives=config.collectives,
    )
    for path in write_emulated_probes(table):
        stored = read_partition_table(path).to_pandas()
        print(f"{len(stored)} emulated rows in {path}")
        print(format_summary(summarize(stored)))
    return 0


def cmd_fit_bandwidth(args: argparse.Namespace) -> int:
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
