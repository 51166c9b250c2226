"""Can one local-DDP run tell whether Srifty is too fast more often than not? Reads the
recorded ``simulator_reality`` runs and sets, run by run, Srifty's estimate beside the
run's noise floor (each case measured again after all cases, scored as if it were a
prediction of the first measurement): MAPE and the share of cases too fast (predicted, or
measured again, under the measured mean iteration), then pools the runs.

The floor knows every case exactly up to the host's drift between two measurements a few
minutes apart. Where its own too-fast share swings from run to run as far as Srifty's, one
run's share (15 cases that drift together) is a draw of the host's drift, not a reading of
the estimator's bias; the pooled share, with an interval that resamples whole runs, is
what can be read.

Run:  .venv/bin/python benchmarks/reality_runs.py [RUN.json ...]
(default: every ``benchmarks/results/simulator_reality_runs/*.json`` and
``benchmarks/results/simulator_reality.json`` when it is not one of them; writes
``benchmarks/results/reality_runs.json``)
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).parent / "results"
RUNS = RESULTS / "simulator_reality_runs"
BOOTSTRAP = 20_000


ORDINALS = (
    "first",
    "second",
    "third",
    "fourth",
    "fifth",
    "sixth",
    "seventh",
    "eighth",
    "ninth",
    "tenth",
    "eleventh",
    "twelfth",
)


def run_order(path: Path) -> tuple[str, int, str]:
    """Recorded runs in the order they ran: by date, then by the ordinal in their name
    (``2026-12-01_ninth`` before ``2026-12-01_tenth``), then by name."""
    date, _, rest = path.stem.partition("_")
    word = rest.split("_")[0]
    return date, ORDINALS.index(word) + 1 if word in ORDINALS else 0, path.stem


def signed_errors(run: Mapping[str, Any]) -> dict[str, list[float]]:
    """Per case, signed errors in percent of the measured mean iteration (negative: too
    fast): Srifty's (``srifty``), the floor's (``floor``), and Srifty's split where the run
    kept its parts (``compute``: forward, backward and what follows the exchange against
    the iteration with a no-op hook; ``exchange``: the rest of the estimate against the
    rest of the iteration, the exposed exchange). Runs recorded before the mean was kept
    use the median, as they were scored then."""
    out: dict[str, list[float]] = {"srifty": [], "floor": [], "compute": [], "exchange": []}
    for c in run.get("cases", []):
        measured = c.get("measured_mean_s") or c["measured_s"]
        again = c.get("measured_again_mean_s") or c.get("measured_again_s")
        if again is None:
            continue
        out["srifty"].append(100.0 * (c["srifty_s"] / measured - 1.0))
        out["floor"].append(100.0 * (again / measured - 1.0))
        parts, no_comm = c.get("srifty_parts"), c.get("measured_no_comm_s")
        if parts and no_comm:
            compute = parts["t_fw"] + parts["t_bw"] + parts.get("t_after", 0.0)
            out["compute"].append(100.0 * (compute - no_comm) / measured)
            exposed = (c["srifty_s"] - compute) - (measured - no_comm)
            out["exchange"].append(100.0 * exposed / measured)
    return out


def run_row(name: str, errors: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    row: dict[str, Any] = {"run": name, "cases": len(errors["srifty"])}
    for who, e in errors.items():
        if len(e) != row["cases"]:  # a run without the parts: no split
            continue
        v = np.asarray(e)
        row[f"{who}_mape"] = round(float(np.abs(v).mean()), 1)
        row[f"{who}_too_fast"] = int((v < 0).sum())
        row[f"{who}_mean_signed"] = round(float(v.mean()), 1)
    return row


def pooled(rows: Sequence[Mapping[str, Any]], seed: int = 0) -> dict[str, Any]:
    """Pooled too-fast shares and MAPEs, with 90% intervals from resampling whole runs
    (cases of one run share its profiles and its drift, so they are not independent)."""
    cases = np.asarray([r["cases"] for r in rows], dtype=float)
    out: dict[str, Any] = {"runs": len(rows), "cases": int(cases.sum())}
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(rows), size=(BOOTSTRAP, len(rows)))
    for who in ("srifty", "floor", "compute", "exchange"):
        if any(f"{who}_too_fast" not in r for r in rows):
            continue
        fast = np.asarray([r[f"{who}_too_fast"] for r in rows], dtype=float)
        mape = np.asarray([r[f"{who}_mape"] for r in rows], dtype=float)
        signed = np.asarray([r[f"{who}_mean_signed"] for r in rows], dtype=float)
        share = 100.0 * fast[pick].sum(axis=1) / cases[pick].sum(axis=1)
        lo, hi = np.percentile(share, [5, 95])
        mean_signed = (signed * cases)[pick].sum(axis=1) / cases[pick].sum(axis=1)
        out[who] = {
            "mean_signed_pct": round(float((signed * cases).sum() / cases.sum()), 1),
            "mean_signed_pct_90": [round(float(x), 1) for x in np.percentile(mean_signed, [5, 95])],
            "too_fast_pct": round(100.0 * fast.sum() / cases.sum(), 1),
            "too_fast_pct_90": [round(float(lo), 1), round(float(hi), 1)],
            "runs_over_half": int((fast > cases / 2).sum()),
            "too_fast_range_pct": [
                round(float(100 * (fast / cases).min()), 1),
                round(float(100 * (fast / cases).max()), 1),
            ],
            "mape_mean": round(float(mape.mean()), 1),
        }
    excess = np.asarray([r["srifty_mape"] - r["floor_mape"] for r in rows])
    boot = excess[pick].mean(axis=1)
    out["mape_over_floor"] = {
        "mean": round(float(excess.mean()), 1),
        "mean_90": [round(float(x), 1) for x in np.percentile(boot, [5, 95])],
        "runs_at_or_under_floor": int((excess <= 0).sum()),
    }
    return out


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:]]
    if not paths:
        paths = sorted((p for p in RUNS.glob("*.json") if ".rescored" not in p.name), key=run_order)
        paths.append(RESULTS / "simulator_reality.json")  # the latest, unless kept above
    rows, seen = [], set()
    for p in paths:
        try:
            text = p.read_text()
            if text in seen:  # simulator_reality.json is a copy of a kept run
                continue
            seen.add(text)
            errors = signed_errors(json.loads(text))
        except OSError as e:
            raise SystemExit(f"{p}: cannot read the run ({e.strerror})") from None
        except (KeyError, ValueError, TypeError, AttributeError) as e:
            raise SystemExit(f"{p}: not a simulator_reality run ({e!r})") from None
        if errors["srifty"]:  # runs without a noise floor measured are left out
            rows.append(run_row(p.stem, errors))
    if len(rows) < 2:
        raise SystemExit("need at least two recorded runs with a noise floor")
    total = pooled(rows)
    print(f"{'run':<36} {'n':>3} {'Srifty MAPE':>11} {'too fast':>8} {'floor':>7} {'too fast':>8}")
    for r in rows:
        print(
            f"{r['run']:<36} {r['cases']:>3} {r['srifty_mape']:>10}% "
            f"{r['srifty_too_fast']:>5}/{r['cases']:<2} {r['floor_mape']:>6}% "
            f"{r['floor_too_fast']:>5}/{r['cases']:<2}"
        )
    for who in ("srifty", "floor", "compute", "exchange"):
        if who not in total:
            continue
        t = total[who]
        print(
            f"{who}: too fast in {t['too_fast_pct']}% of {total['cases']} case-runs "
            f"(90% over runs {t['too_fast_pct_90'][0]}-{t['too_fast_pct_90'][1]}%), "
            f"over half in {t['runs_over_half']} of {total['runs']} runs "
            f"(one run: {t['too_fast_range_pct'][0]}-{t['too_fast_range_pct'][1]}%), "
            f"mean signed {t['mean_signed_pct']:+}% ({t['mean_signed_pct_90'][0]:+}.."
            f"{t['mean_signed_pct_90'][1]:+}), mean MAPE {t['mape_mean']}%"
        )
    m = total["mape_over_floor"]
    print(
        f"Srifty's MAPE over the run's floor: mean {m['mean']} points "
        f"(90% over runs {m['mean_90'][0]}..{m['mean_90'][1]}), at or under it in "
        f"{m['runs_at_or_under_floor']} of {total['runs']} runs"
    )
    from srifty_core.atomic import write_text_atomic

    write_text_atomic(
        RESULTS / "reality_runs.json", json.dumps({"runs": rows, "pooled": total}, indent=1)
    )
    print(f"figure: {draw(rows, total, RESULTS / 'reality_runs.png')}")


def draw(rows: Sequence[Mapping[str, Any]], total: Mapping[str, Any], path: Path) -> Path:
    """Per run, MAPE and the share of cases too fast, Srifty beside its run's floor, with
    the pooled shares and their intervals over runs as bands."""
    from srifty_core.plotting import pyplot, save_figure

    plt = pyplot()
    x = np.arange(len(rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    left.bar(x - 0.2, [r["srifty_mape"] for r in rows], 0.4, label="Srifty")
    left.bar(x + 0.2, [r["floor_mape"] for r in rows], 0.4, label="noise floor", color="0.6")
    left.set_ylabel("MAPE against the mean iteration (%)")
    left.set_title("error per run")
    for who, color, mark in (("srifty", "C0", "o"), ("floor", "0.4", "x")):
        share = [100 * r[f"{who}_too_fast"] / r["cases"] for r in rows]
        lo, hi = total[who]["too_fast_pct_90"]
        right.axhspan(lo, hi, color=color, alpha=0.15)
        right.plot(
            x, share, mark, color=color, label=f"{who}: pooled {total[who]['too_fast_pct']}%"
        )
    right.axhline(50, color="k", lw=0.8, ls="--")
    right.set_ylim(0, 100)
    right.set_ylabel("cases too fast (%)")
    right.set_title("too fast per run; bands: pooled, 90% over runs")
    for ax in (left, right):
        ax.set_xticks(x, [str(r["run"]).replace("2026-", "") for r in rows], rotation=60,
                      ha="right", fontsize=7)  # fmt: skip
        ax.legend(fontsize=8)
    return save_figure(fig, path)


if __name__ == "__main__":
    main()
