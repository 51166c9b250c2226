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
