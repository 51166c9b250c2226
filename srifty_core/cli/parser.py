"""The ``srifty`` argument parser: every subcommand with its options, defaults and help
texts, each bound (``func``) to its command in ``cli.inputs``, ``cli.planning``,
``cli.training`` or ``cli.apps``; and the option types (``parse_bytes``, ``_int_list``)
whose errors argparse prints as one line.
"""

from __future__ import annotations

import argparse
from typing import NoReturn

from srifty_core import __version__, paths
from srifty_core.cli.apps import cmd_airflow, cmd_demo, cmd_ui
from srifty_core.cli.inputs import cmd_catalog, cmd_fit_bandwidth, cmd_probe, cmd_profile
from srifty_core.cli.planning import cmd_plan
from srifty_core.cli.training import cmd_monitor, cmd_train
from srifty_core.errors import ConfigError
from srifty_core.probing.config import MIN_ALLOCATIONS


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
    cat.set_defaults(func=cmd_catalog)

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
        f"{', '.join(shipped_hf_configs())}; or a config.json); all but a zoo model may "
        "end ',seq=N' (tokens per sample) and ',vocab=N'",
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
        "--tf32", action="store_true", help="matrix products and convolutions in TF32 (GPUs)"
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
    prof.set_defaults(func=cmd_profile)
    probe = sub.add_parser(
        "probe",
        help="measure allreduce bus bandwidth (a probe sweep) into the probe store",
        description="Run an allreduce sweep on a provider's instances and write the day's "
        "partition of DATA/probes/. A rerun on the same day measures only missing points.",
    )
    probe.add_argument(
        "--provider",
        default="local",
        help="where to run (default: local); ec2: the VMs start the probe workers from their "
        "user data and write their rows to the run storage (SRIFTY_RUN_STORAGE)",
    )
    probe.add_argument("--region", default="us-east-1", help="ec2: the region (us-east-1)")
    probe.add_argument("--ec2", help='ec2 launch settings as JSON: {"image_id": "ami-..."}')
    what = probe.add_mutually_exclusive_group()
    what.add_argument("--instance-type", help="local.cpu (default), or a catalog type as a label")
    what.add_argument(
        "--mix",
        help="a mixed-type ring, TYPE:VMS,TYPE:VMS (e.g. g4dn.12xlarge:1,g4dn.xlarge:3): one "
        "allocation per type, probed as one process group at its full world size and stored "
        "under the mix's label",
    )
    probe.add_argument(
        "--instances",
        type=int,
        help="instances per allocation (default: enough for the largest world size)",
    )
    probe.add_argument("--world-sizes", help="comma list, e.g. 2,4 (default 2)")
    probe.add_argument(
        "--sizes", default="4B:64MB", help="LO:HI geometric range or a comma list (4B..512MB)"
    )
    spacing = probe.add_mutually_exclusive_group()
    spacing.add_argument("--points-per-decade", type=float, help="range spacing (default 3)")
    spacing.add_argument("--steps", type=int, help="number of sizes in the range")
    probe.add_argument("--concurrency", default="1,2,4", help="collectives in flight (1,2,4)")
    probe.add_argument(
        "--collectives",
        default="all_reduce,all_gather,reduce_scatter",
        help="comma list of all_reduce, all_gather, reduce_scatter (default: all three)",
    )
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
    probe.set_defaults(func=cmd_probe)

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
    pl.set_defaults(func=cmd_plan)

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
    fitbw.add_argument("--budget", help=argparse.SUPPRESS)  # removed; cmd_fit_bandwidth says so
    fitbw.add_argument(
        "--half-life", default="14d", help="sample weight halves every ... ('none': equal)"
    )
    fitbw.add_argument("--provider", action="append", help="only this provider (repeatable)")
    fitbw.add_argument("--instance-type", action="append", help="only this type (repeatable)")
    fitbw.add_argument("--mtu", type=int, default=9001, help="size-class split, bytes (9001)")
    fitbw.add_argument("--seed", type=int, default=0, help="tuning seed (default 0)")
    fitbw.add_argument("--tracking-uri", help="MLflow store (default: SQLite under DATA/mlflow)")
    fitbw.set_defaults(func=cmd_fit_bandwidth)

    tr = sub.add_parser(
        "train",
        help="train a plan on worker processes, re-planning on preemption",
        usage="srifty train PLAN [options] [-- COMMAND ...]",
        description="Run PLAN (JSON: model, size, global_batch, iterations, local_batches, "
        "run_dir, ...) with one DDP worker per local batch; resumes from run_dir's checkpoint. "
        "After '--', your own training script runs on every rank instead of the built-in "
        "worker (e.g. '-- python train.py --lr 0.1'; it uses srifty_core.worker.user); "
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
    tr.set_defaults(func=cmd_train)

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
    mon.set_defaults(func=cmd_monitor)

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
    ui.set_defaults(func=cmd_ui)

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
    af.set_defaults(func=cmd_airflow)

    demo = sub.add_parser(
        "demo",
        help="run the main job through Airflow on embedded defaults (SQLite, local files)",
        description="Run the whole loop for real through Airflow on this machine (probe "
        "sweep, model refresh, profiling, plan-and-train with a preemption and its "
        "re-plan, the case studies), keeping everything under the data folder; about "
        "two minutes.",
    )
    demo.set_defaults(func=cmd_demo)
    return parser
