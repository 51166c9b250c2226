"""How long does `srifty profile` take with its defaults on this CPU, and what does the
step-time bound on B_max change in the profile?

Runs the command as a user would (`srifty profile --model M --device cpu --no-mlflow`,
a fresh data folder, stderr captured) for each model, with the defaults (B_max bounded by
a 2 s step) and, with `--baseline`, with `--max-step-s 0` (the memory cap alone: the
default before), alternating so that the host's drift falls on both. Records the wall
time, the stage lines the command printed off a terminal, B_max and what bounded it, and
t(B) at batch sizes both profiles cover (how much the bound moves the fit there).

Run:  .venv/bin/python benchmarks/profile_time.py [--baseline] [--models resnet18,...]
Writes benchmarks/results/profile_time.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from srifty_core.atomic import write_text_atomic
from srifty_core.profiling.profile import ComputeProfile

OUT = Path(__file__).parent / "results"


def run(model: str, extra: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "p.json"
        argv = [
            sys.executable, "-m", "srifty_core.cli", "--data-dir", tmp, "profile",
            "--model", model, "--device", "cpu", "--no-mlflow", "--out", str(out), *extra,
        ]  # fmt: skip
        t0 = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr}")
        p = ComputeProfile.from_json(out.read_text())
    return {
        "args": extra,
        "wall_s": round(wall, 1),
        "stage_lines": proc.stderr.splitlines(),
        "b_max": p.b_max,
        "b_max_limit": p.b_max_limit,
        "noisy": list(p.noisy),
        "profile": p.to_dict(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="resnet18", help="comma list (default resnet18)")
    ap.add_argument(
        "--baseline", action="store_true", help="also run with --max-step-s 0 (10+ minutes)"
    )
    args = ap.parse_args()
    rows = []
    for model in args.models.split(","):
        row: dict[str, Any] = {"model": model, "default": run(model, [])}
        print(f"{model}: default {row['default']['wall_s']} s, B_max {row['default']['b_max']}")
        if args.baseline:
            row["memory_only"] = run(model, ["--max-step-s", "0"])
            row["speedup"] = round(row["memory_only"]["wall_s"] / row["default"]["wall_s"], 1)
            a = ComputeProfile.from_dict(row["default"]["profile"])
            b = ComputeProfile.from_dict(row["memory_only"]["profile"])
            both = [x for x in (1, 8, 32, 128, 512) if x <= a.b_max]
            row["t_iter_ratio"] = {
                x: round(float(a.t_fw(x) + a.t_bw(x)) / float(b.t_fw(x) + b.t_bw(x)), 3)
                for x in both
            }
            print(
                f"{model}: memory only {row['memory_only']['wall_s']} s, B_max "
                f"{row['memory_only']['b_max']}; {row['speedup']}x; t(B) default/memory-only "
                f"{row['t_iter_ratio']}"
            )
        rows.append(row)
    result = {"host": f"{platform.node()} {platform.machine()}", "rows": rows}
    OUT.mkdir(exist_ok=True)
    write_text_atomic(OUT / "profile_time.json", json.dumps(result, indent=1) + "\n")
    print(f"wrote {OUT / 'profile_time.json'}")


if __name__ == "__main__":
    main()
