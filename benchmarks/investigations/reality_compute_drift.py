"""Is the compute side of the local-DDP estimates biased, or does it drift? Reads the
recorded ``simulator_reality`` runs and, per run and model, prints the predicted compute
(forward + backward + what follows the exchange, ``srifty_parts``) against the measured
iteration without the exchange (DDP with a no-op comm hook), as the median over the
model's cases, in percent (negative: too fast).

A bias shows as one sign for a model in every run; drift of a shared host as signs that
change from run to run.

Run:  .venv/bin/python benchmarks/investigations/reality_compute_drift.py [RUN.json ...]
(default: every ``benchmarks/results/simulator_reality_runs/*.json`` with per-case parts)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

RUNS = Path(__file__).resolve().parent.parent / "results" / "simulator_reality_runs"


def compute_errors(run: dict[str, object]) -> dict[str, float]:
    """``{model: median % error of the predicted compute}`` over the run's cases."""
    by: dict[str, list[float]] = {}
    for c in run.get("cases", []):  # type: ignore[attr-defined]
        parts = c.get("srifty_parts") or {}
        measured = c.get("measured_no_comm_s")
        if not parts or not measured:
            continue
        predicted = parts["t_fw"] + parts["t_bw"] + parts.get("t_after", 0.0)
        by.setdefault(c["model"], []).append(100.0 * (predicted / measured - 1.0))
    return {m: statistics.median(v) for m, v in by.items()}


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:]] or sorted(
        p for p in RUNS.glob("*.json") if not p.name.endswith(".rescored.json")
    )
    rows = [(p.stem, compute_errors(json.loads(p.read_text()))) for p in paths]
    rows = [(name, e) for name, e in rows if e]
    models = sorted({m for _, e in rows for m in e})
    print(f"{'run':<36}" + "".join(f"{m[:13]:>14}" for m in models))
    for name, e in rows:
        cells = "".join(f"{e[m]:>+13.0f}%" if m in e else f"{'':>14}" for m in models)
        print(f"{name:<36}{cells}")
    for m in models:
        v = [e[m] for _, e in rows if m in e]
        fast = sum(x < 0 for x in v)
        print(f"{m}: median {statistics.median(v):+.0f}%, too fast in {fast} of {len(v)} runs")


if __name__ == "__main__":
    main()
