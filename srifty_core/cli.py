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


_UNITS = {
    "": 1,
    "b": 1,
    "k": 2**10,
    "kib": 2**10,
    "m": 2**20,
    "mib": 2**20,
    "g": 2**30,
    "gib": 2**30,
}


def parse_bytes(text: str) -> int:
    """``4GiB``, ``512MiB``, ``1048576`` -> bytes."""
    import re

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4GiB, 512MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from exc


def _cmd_profile(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tqdm import tqdm

    from srifty_core.profiling.job import run_profile_job
    from srifty_core.profiling.profiler import ProfilerConfig
    from srifty_core.profiling.report import summary_text

    config = ProfilerConfig(
        device=args.device,
        probes=None if args.dense else args.probes,
        batch_sizes=args.batch_sizes,
        repeats=args.repeats,
        warmup=args.warmup,
        memory_cap_bytes=args.memory_cap,
        max_batch=args.max_batch,
        threads=args.threads,
    )
    bar = tqdm(total=0, unit="step", desc=f"profiling {args.model}", leave=False)

    def progress(stage: str, done: int, total: int) -> None:
        bar.set_description(f"{args.model}: {stage}")
        if total:
            bar.total = total
            bar.n = done
        bar.refresh()

    try:
        result = run_profile_job(
            args.model,
            args.size,
            config,
            out=Path(args.out) if args.out else None,
            log_to_mlflow=not args.no_mlflow,
            progress=progress,
        )
    finally:
        bar.close()
    print(summary_text(result.profile))
    print(f"\nprofile: {result.path}")
    if args.plot:
        from srifty_core.profiling.report import plot_profile

        print(f"plot: {plot_profile(result.profile, Path(args.plot))}")
    if result.mlflow_run_id:
        print(f"MLflow run: {result.mlflow_run_id} (experiment srifty-compute-profiles)")
    return 0


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

    from srifty_core.profiling import MODEL_NAMES, SIZES

    prof = sub.add_parser(
        "profile",
        help="profile a zoo model's compute latency, memory and gradient schedule",
        description="Profile one model on the device this runs on; writes the compute profile "
        "to DATA/profiles/ (or --out) and logs it to MLflow.",
    )
    prof.add_argument("--model", required=True, help=f"one of: {', '.join(MODEL_NAMES)}")
    prof.add_argument("--size", default="small", help=f"one of {', '.join(SIZES)} (default small)")
    prof.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    prof.add_argument("--probes", type=int, default=4, help="batch sizes to measure (default 4)")
    prof.add_argument("--dense", action="store_true", help="measure every power of two instead")
    prof.add_argument("--batch-sizes", type=_int_list, help="explicit sizes, e.g. 1,8,32,64")
    prof.add_argument("--repeats", type=int, default=5, help="timed steps per size (default 5)")
    prof.add_argument("--warmup", type=int, default=2, help="untimed steps first (default 2)")
    prof.add_argument("--max-batch", type=int, default=1024, help="B_max search bound")
    prof.add_argument(
        "--memory-cap", type=parse_bytes, help="CPU memory budget, e.g. 4GiB (default 4GiB)"
    )
    prof.add_argument("--threads", type=int, help="CPU threads (default: torch's)")
    prof.add_argument("--out", help="write the profile here instead of the profile store")
    prof.add_argument("--plot", help="also write the latency plot (PNG) here")
    prof.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    prof.set_defaults(func=_cmd_profile)

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
