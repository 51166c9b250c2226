"""`srifty plan` from the shell with the champion bandwidth model: wall time of the whole
command (interpreter start, imports, loading the model, planning, printing), as a user
sees it.

Set-up (once per data folder, about a minute): emulated compute profiles of resnet50 on
g4dn.xlarge and g4dn.12xlarge, an emulated probe sweep of both types (3 allocations, world
sizes 2-8) in the probe store, and a champion fitted on it (`fit-bandwidth`, 1 trial).
Then each variant runs ``--runs`` times, interleaved (variant A, B, A, B, ...) so a busy
spell on a shared machine hits both:

- ``champion``: ``srifty plan request.yaml`` (the default model: the champion);
- ``refresh``: ``srifty plan request.yaml --refresh-model`` (the champion asked of the
  MLflow store, not the local copy: what a first run or a changed champion costs);
- ``probes``: ``srifty plan request.yaml --bandwidth probes`` (no MLflow at all, the probe
  table fitted on the spot; for reference);
- ``help``: ``srifty --help`` (interpreter start and the CLI's own imports).

Run:  .venv/bin/python benchmarks/cli_start.py [--runs 5] [--data-dir DIR] [--variants ...]
Writes benchmarks/results/cli_start.json (per variant: every run, median, min, max).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "results"
TYPES = ("g4dn.xlarge", "g4dn.12xlarge")
MODEL = "resnet50"
REQUEST = {
    "model": MODEL,
    "size": "full",
    "region": "us-east-1",
    "global_batch": 256,
    "iterations": 1000,
    "time_limit_s": 36000,
    "budget_usd": 100,
    "objective": "cost",
    "offers": [
        {"type": "g4dn.xlarge", "market": "on-demand", "quota": 8},
        {"type": "g4dn.12xlarge", "market": "on-demand", "quota": 2},
    ],
}
VARIANTS: dict[str, list[str]] = {
    "champion": ["plan", "{request}"],
    "refresh": ["plan", "{request}", "--refresh-model"],
    "probes": ["plan", "{request}", "--bandwidth", "probes"],
    "help": ["--help"],
}


def prepare(root: Path) -> Path:
    """The profiles, probes and champion model ``srifty plan`` needs, in ``root`` (made
    once: a folder that has them is used as it is). Returns the request file."""
    request = root / "request.json"
    if request.is_file():
        return request
    os.environ["SRIFTY_DATA_DIR"] = str(root)
    os.environ["MLFLOW_TRACKING_URI"] = ""
    from srifty_core.case_studies import one_core
    from srifty_core.cloud.emulated.measurements import emulated_probe_sweep, emulated_profiles
    from srifty_core.predictors.refresh.config import RefreshConfig
    from srifty_core.predictors.refresh.pipeline import refresh_bandwidth_model
    from srifty_core.probing.store import write_partition
    from srifty_core.profiling.store import ProfileStore, load_reference_profile

    reference = load_reference_profile(MODEL)[0]
    store = ProfileStore()
    for profile in emulated_profiles(list(TYPES), reference, reference_rate=one_core()).values():
        store.save(dataclasses.replace(profile, size="full"))  # the request's size
    day = date(2026, 3, 1)
    frame = emulated_probe_sweep(
        list(TYPES), world_sizes=(2, 4, 8), allocations=3, seed=0, day=day
    ).to_pandas()
    for itype, part in frame.groupby("instance_type"):
        write_partition(part, day=day, provider="ec2-emulated", instance_type=str(itype))
    outcome = refresh_bandwidth_model(RefreshConfig(since=None, half_life=None, n_trials=1))
    print(f"champion: v{outcome.promotion['champion']}", file=sys.stderr)
    request.write_text(json.dumps(REQUEST, indent=1))
    return request


def run_once(argv: list[str], root: Path) -> float:
    """Seconds for one ``srifty`` command in a fresh interpreter (exit 0 required)."""
    env = {**os.environ, "SRIFTY_DATA_DIR": str(root), "MLFLOW_TRACKING_URI": ""}
    t = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "srifty_core.cli", *argv], capture_output=True, text=True, env=env
    )
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"srifty {' '.join(argv)} failed ({done.returncode}):\n{done.stderr}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--data-dir", type=Path, help="keep the set-up here (default: temp)")
    parser.add_argument(
        "--variants", default="champion,refresh,probes,help", help="comma list of: "
        + ", ".join(VARIANTS)
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=OUT / "cli_start.json")
    args = parser.parse_args()
    names = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variant(s) {unknown}")

    with tempfile.TemporaryDirectory(prefix="srifty-cli-start-") as tmp:
        root = (args.data_dir or Path(tmp)).resolve()
        root.mkdir(parents=True, exist_ok=True)
        request = prepare(root)
        asked = json.loads(request.read_text())
        argvs = {n: [a.format(request=request) for a in VARIANTS[n]] for n in names}
        run_once(argvs.get("champion", ["--help"]), root)  # warm up
        times: dict[str, list[float]] = {n: [] for n in names}
        for _ in range(args.runs):
            for n in names:
                times[n].append(run_once(argvs[n], root))
    report: dict[str, Any] = {
        "runs": args.runs,
        "request": asked,
        "variants": {},
    }
    for n in names:
        t = times[n]
        report["variants"][n] = {
            "argv": VARIANTS[n],
            "median_s": statistics.median(t),
            "min_s": min(t),
            "max_s": max(t),
            "runs_s": t,
        }
        shown = " ".join(VARIANTS[n]).format(request="request.json")
        print(
            f"srifty {shown:40s} median {statistics.median(t):.2f} s "
            f"(min {min(t):.2f}, max {max(t):.2f}; {len(t)} runs)"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
