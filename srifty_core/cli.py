"""The ``srifty`` command.

Each subcommand is a thin shell over a library call; heavy libraries are imported inside
the subcommand that needs them, so ``srifty --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from srifty_core import __version__, paths
from srifty_core.errors import SriftyError


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


def _cmd_probe(args: argparse.Namespace) -> int:
    from datetime import date

    from srifty_core.cloud import get_provider
    from srifty_core.probing.config import SweepConfig, parse_int_list, parse_sizes
    from srifty_core.probing.store import read_partition_table
    from srifty_core.probing.summary import format_summary, summarize
    from srifty_core.probing.sweep import probe_sweep

    config = SweepConfig(
        sizes=parse_sizes(args.sizes, points_per_decade=args.points_per_decade, steps=args.steps),
        world_sizes=parse_int_list(args.world_sizes, "world_sizes"),
        concurrency=parse_int_list(args.concurrency, "concurrency"),
        repeats=args.repeats,
        warmup=args.warmup,
        backend=args.backend,
        allocations=args.allocations,
    )
    provider = get_provider(args.provider)
    day = date.fromisoformat(args.day) if args.day else None
    bar = None
    if not args.no_progress:
        from tqdm import tqdm  # type: ignore[import-untyped]

        bar = tqdm(unit="point", desc=f"probe {args.instance_type}", file=sys.stderr)

    def progress(done: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.update(done - bar.n)

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
    finally:
        if bar is not None:
            bar.close()
    print(
        f"{result.measured} point(s) measured, {result.skipped} already stored, "
        f"{len(result.failed)} failed, in {result.wall_s:.1f}s on "
        f"{len(result.allocation_ids)} allocation(s); {result.rows} rows in {result.partition}"
    )
    if result.partition.exists():
        print(format_summary(summarize(read_partition_table(result.partition).to_pandas())))
    for f in result.failed[:5]:
        print(f"failed: {f.point}: {f.reason}", file=sys.stderr)
    if result.failed:
        print("rerun the same command to measure only the missing points", file=sys.stderr)
    return 0 if result.ok else 1


def _cmd_demo(args: argparse.Namespace) -> int:
    from srifty_core.demo import run_demo

    return run_demo()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    probe.add_argument("--warmup", type=int, default=2, help="untimed rounds per point")
    probe.add_argument("--backend", default="gloo", help="gloo (CPU) or nccl (CUDA)")
    probe.add_argument("--allocations", type=int, default=1, help="fresh allocations to repeat on")
    probe.add_argument("--day", help="partition day YYYY-MM-DD (default: today, UTC)")
    probe.add_argument("--fresh", action="store_true", help="re-measure, replacing the day's data")
    probe.add_argument("--no-progress", action="store_true", help="no progress bar")
    probe.set_defaults(func=_cmd_probe)

    demo = sub.add_parser(
        "demo",
        help="run the main job through Airflow on embedded defaults (SQLite, local files)",
    )
    demo.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.data_dir:
        # One place decides where data lives: paths.data_dir() reads this variable, and
        # child processes (Airflow tasks, workers) inherit it.
        os.environ[paths.ENV_VAR] = str(paths.data_dir(args.data_dir))
    try:
        code: int = args.func(args)
    except SriftyError as exc:
        print(f"srifty: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `srifty catalog | head`
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
