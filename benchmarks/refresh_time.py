"""How long the nightly bandwidth-model refresh takes against the number of probe rows, and
what it does to the held-out error: the whole ``refresh_bandwidth_model`` (snapshot,
tuning of both size classes, final fit, evaluation on the held-out allocations, MLflow
registration and promotion) on emulated probe stores of 2, 9 and 24 instance types, the
code of this tree against a baseline commit's, in the same run.

    .venv/bin/python benchmarks/refresh_time.py                  # about 30 minutes
    .venv/bin/python benchmarks/refresh_time.py --types 2 --baseline-trials 30
    .venv/bin/python benchmarks/refresh_time.py --types 24 --mixes 12 --no-baseline

Data: one emulated probe sweep (``cloud.emulated.measurements.emulated_probe_sweep``, seeded: 3
allocations, 3 repeats, sustained probes) of the first ``--types`` counts of ``TYPES``
(8,532, 38,394 and 102,384 rows), and with ``--mixes N`` N mixed-type rings of those types
(``probing.mix_choice``'s design; a store keeps the mixes whose members it holds). Each
refresh runs in a process of its own on a fresh data
folder (probe store and MLflow store), with ``since`` and ``half_life`` off and the
default 30 trials per size class. The baseline (``--baseline``, a commit; default the one
before the refresh was sped up) runs from its ``srifty_core`` exported by ``git archive``
into a temporary folder, with ``--baseline-trials`` trials where the store is larger than
``--baseline-full-rows`` (its 30 trials there take longer than this benchmark should),
and the tree's code is then also run with those trials so that both are compared on the
same work. Reported per run: rows, wall and CPU seconds of the refresh call, wall seconds
of its tuning, the cross-validated MAPE of the best trial per size class and the
challenger's held-out MAPE. Results: ``results/refresh_time.json``. Wall times on a shared
2-core host move with what else runs there; the refresh runs on one thread, so its CPU
seconds are close to what it takes on an idle host: compare runs made here together.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "refresh_time.json"
ROOT = Path(__file__).resolve().parent.parent
BASELINE = "13eafe1"
"""The last commit before the refresh's speed-ups (the prior already fitted once per fold)."""
TYPES = (
    "g4dn.xlarge", "g4dn.12xlarge", "p3.8xlarge", "g5.xlarge",
    "g5.12xlarge", "p3.2xlarge", "g4dn.2xlarge", "g6.xlarge",
    "p4d.24xlarge", "g6.12xlarge", "p3dn.24xlarge", "g5.48xlarge",
    "p5.48xlarge", "g4dn.metal", "p3.16xlarge", "g6.48xlarge",
    "g5.2xlarge", "g6.2xlarge", "g5.24xlarge", "p4de.24xlarge",
    "g6.24xlarge", "g4dn.8xlarge", "g3.16xlarge", "p5en.48xlarge",
)  # fmt: skip
SIZES = (2, 9, 24)


def one_refresh(probes: Path, n_trials: int) -> dict[str, Any]:
    """One refresh on a fresh data folder holding the sweep ``probes`` (Parquet); run in a
    process whose ``srifty_core`` is the code measured."""
    import pyarrow.parquet as pq

    from srifty_core.cloud.emulated.measurements import write_emulated_probes
    from srifty_core.predictors.refresh.config import RefreshConfig
    from srifty_core.predictors.refresh.pipeline import refresh_bandwidth_model

    table = pq.read_table(probes)
    write_emulated_probes(table)
    t0, cpu0 = time.perf_counter(), time.process_time()
    out = refresh_bandwidth_model(RefreshConfig(since=None, half_life=None, n_trials=n_trials))
    seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    tuning = out.fit["tuning"]
    return {
        "rows": table.num_rows,
        "trials": n_trials,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "tune_and_fit_s": out.fit["seconds"],
        "tuning_s": sum(t["seconds"] for t in tuning.values()),
        "xgboost_threads": out.fit.get("n_jobs", 1),
        "cv_mape": {k: t["cv_mape"] for k, t in tuning.items()},
        "holdout_mape": out.evaluation["challenger"],
        "best_params": {k: t["best_params"] for k, t in tuning.items()},
    }


def _mixes(types: tuple[str, ...], n: int) -> list[dict[str, int]]:
    """``n`` mixes of ``types`` as the sweep DAG's design picks them (no recent plans)."""
    from srifty_core.cloud.emulated.provider import EmulatedProvider
    from srifty_core.probing.mix_choice import choose_mixes

    provider = EmulatedProvider(seed=0)
    return choose_mixes([], [provider.instance_type(t) for t in types], [], n) if n else []


def run(code: Path, probes: Path, n_trials: int) -> dict[str, Any]:
    """``one_refresh`` in a child process importing ``srifty_core`` from ``code``."""
    with tempfile.TemporaryDirectory(prefix="srifty-refresh-time-") as data:
        env = {
            **os.environ,
            "PYTHONPATH": str(code),
            "SRIFTY_DATA_DIR": data,
            "MLFLOW_TRACKING_URI": "",
            "MLFLOW_DISABLE_TELEMETRY": "true",
        }
        proc = subprocess.run(
            [sys.executable, __file__, "--one", str(probes), "--trials", str(n_trials)],
            env=env,
            cwd=data,
            capture_output=True,
            text=True,
            check=False,
        )
    if proc.returncode != 0:
        raise SystemExit(f"refresh with {code} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", type=int, nargs="+", default=list(SIZES), help="type counts")
    ap.add_argument("--trials", type=int, default=30, help="trials per size class (30)")
    ap.add_argument("--baseline", default=BASELINE, help="commit to compare with")
    ap.add_argument("--no-baseline", action="store_true", help="only this tree's code")
    ap.add_argument("--baseline-trials", type=int, default=3)
    ap.add_argument("--baseline-full-rows", type=int, default=20_000)
    ap.add_argument(
        "--mixes",
        type=int,
        default=0,
        help="mixed-type rings swept too (probing.mix_choice's design over the types; 0)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # the child's part
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one_refresh(args.one, args.trials)))
        return 0
    if any(not 1 <= n <= len(TYPES) for n in args.types) or args.trials < 1:
        ap.error(f"--types: 1-{len(TYPES)} each; --trials >= 1")
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from srifty_core.cloud.emulated.measurements import emulated_probe_sweep
    from srifty_core.probing.mix import mix_label

    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="srifty-refresh-bench-") as tmp:
        old = Path(tmp) / "baseline"
        if not args.no_baseline:
            old.mkdir()
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", args.baseline, "srifty_core"],
                capture_output=True,
                check=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        mixes = _mixes(TYPES[: max(args.types)], args.mixes)
        sweep = emulated_probe_sweep(
            list(TYPES[: max(args.types)]), allocations=3, repeats=3, seed=0, mixes=mixes
        )
        for n in sorted(args.types):
            probes = Path(tmp) / f"probes-{n}.parquet"
            held = [*TYPES[:n], *(mix_label(m) for m in mixes if set(m) <= set(TYPES[:n]))]
            part = sweep.filter(pc.is_in(sweep["instance_type"], value_set=pa.array(held)))
            pq.write_table(part, probes)
            runs = [("new", ROOT, args.trials)]
            if not args.no_baseline:
                full = part.num_rows <= args.baseline_full_rows
                trials = args.trials if full else args.baseline_trials
                runs.append(("baseline", old, trials))
                if not full:
                    runs.append(("new", ROOT, trials))
            for label, code, trials in runs:
                r = {"code": label, "types": n, "mixes": len(held) - n, **run(code, probes, trials)}
                results.append(r)
                print(
                    f"{r['rows']:>7} rows ({r['mixes']} mixes), {label:<8} {trials:>2} trials, "
                    f"{r['xgboost_threads']} thread(s): {r['seconds']:7.1f} s "
                    f"wall, {r['cpu_seconds']:7.1f} s CPU (tuning {r['tuning_s']:6.1f} s wall); "
                    "CV MAPE <=MTU "
                    f"{r['cv_mape']['small']:.2f}% >MTU {r['cv_mape']['large']:.2f}%; "
                    f"held-out {r['holdout_mape']['all']:.2f}%",
                    flush=True,
                )
    out = {
        "command": "benchmarks/refresh_time.py",
        "baseline": None if args.no_baseline else args.baseline,
        "load_average": os.getloadavg(),
        "results": results,
    }
    from srifty_core.atomic import write_text_atomic

    write_text_atomic(args.out, json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
