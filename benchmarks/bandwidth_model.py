"""Bus-bandwidth model accuracy: MAPE vs the noise floor, per size class (<= / > MTU).

(a) a probe store (``--probe-store DIR``: the folder holding ``date=...`` partitions), held
    out by allocation: folds of ``group_kfold`` (scikit-learn's ``GroupKFold``) on
    ``allocation_id``;
(b) the public nccl-tests tables in ``srifty_core/shipped/reference/nccl_tests_public.csv``
    (or ``--table``), loaded by ``predictors.nccl_tests``, held out by table (``table_id``),
    features from the catalog (vCPUs, GPUs, rated network).

For each size class, out-of-fold MAPE of: the physics prior alone (``predictors.prior``,
fitted on the training folds), XGBoost on the features without the prior (the model before
the prior), the default model (prior x learned residual), the same with a ring-only prior
(``prior_tree=False``: before NCCL's tree was modelled), and the best of ``--trials``
seeded tuning trials (Optuna TPE, grouped CV; the same command gives the same numbers; it
includes the selection, so it is slightly optimistic); beside them *nearest*: the other
groups' measurement of the same instance type, VM count, ranks per VM, buffer size and
concurrency (and probe phase; a weighted median; rows with no such twin are not covered),
and the noise floor is the MAPE of the best constant per configuration learned from the
other groups (rows whose configuration no other group measured have no floor:
``coverage``), with the model's MAPE on those same covered rows beside it.

    .venv/bin/python benchmarks/bandwidth_model.py [--probe-store DIR | --emulated] [--trials 30]

``--later TEXT`` adds (c): the public tables whose ``table_id`` contains ``TEXT`` scored by
the default model fitted on all the others, per VM count (a model asked about tables
published after the ones it learned from: ``--later crazyguitar`` for the 2-32-VM p5 tables
added last), and draws them (``bandwidth_later_tables.png`` beside the results file).

``--nested`` adds to (b) the model as the refresh makes it: tuned (``--trials`` trials) on
the training tables of each held-out table alone, so that the held-out table plays no part
in choosing the parameters (the *tuned* column includes that choice and is optimistic).

Writes ``benchmarks/results/bandwidth_model.json`` (``bandwidth_model_nested.json`` with
``--nested``; or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from srifty_core.atomic import write_text_atomic
from srifty_core.predictors.features import DEFAULT_MTU, LARGE, SMALL, size_masks
from srifty_core.predictors.metrics import group_kfold, mape, noise_floor_predictions
from srifty_core.predictors.nccl_tests import nccl_tests_frame
from srifty_core.predictors.refresh.config import RefreshConfig
from srifty_core.predictors.regressor import BusBandwidthRegressor, with_hardware
from srifty_core.predictors.tuning import DEFAULT_PARAMS, DEFAULT_TRIALS, cross_val_predict, tune

RESULTS = Path(__file__).resolve().parent / "results"


def evaluate(
    df: pd.DataFrame,
    group: str,
    n_trials: int,
    mtu: int,
    seed: int,
    config: list[str],
    n_splits: int = 5,
    nested: bool = False,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "rows": len(df),
        "groups": int(df[group].nunique()),
        "group_column": group,
    }
    df = with_hardware(df)
    groups = df[group].astype(str).to_numpy()
    for cls, mask in size_masks(df, mtu).items():
        part = df[mask].reset_index(drop=True)
        g = groups[mask]
        y = part["busbw"].to_numpy(float)
        t0 = time.monotonic()
        prior_oof = prior_predict(part, g, n_splits)
        plain_oof = cross_val_predict(
            {**DEFAULT_PARAMS, "prior": False}, part, groups=g, n_splits=n_splits
        )
        default_oof = cross_val_predict(DEFAULT_PARAMS, part, groups=g, n_splits=n_splits)
        ring_oof = cross_val_predict(
            {**DEFAULT_PARAMS, "prior_tree": False}, part, groups=g, n_splits=n_splits
        )
        tuned = tune(part, n_trials=n_trials, group=group, n_splits=n_splits, seed=seed)
        floor = noise_floor_predictions(part, group=group, config=config)
        covered = np.isfinite(floor)
        twin = noise_floor_predictions(
            part,
            group=group,
            config=[
                "instance_type",
                "vms",
                "ranks_per_vm",
                "buffer_bytes",
                "concurrent",
                *(["phase"] if "phase" in part.columns else []),
            ],
        )
        has_twin = np.isfinite(twin)
        one_vm = part["vms"].to_numpy() == 1
        nested_oof = (
            nested_predict(part, g, group, n_trials, seed, n_splits, label=cls)
            if nested
            else np.full(len(part), np.nan)
        )
        out[cls] = {
            "rows": len(part),
            "groups": len(set(g)),
            "mape_prior": mape(prior_oof, y),
            "mape_no_prior": mape(plain_oof, y),
            "mape_default": mape(default_oof, y),
            "mape_default_ring_prior": mape(ring_oof, y),
            "mape_ring_prior_single_vm": mape(ring_oof[one_vm], y[one_vm]),
            "mape_tuned": tuned.best_mape,
            "mape_tuned_covered": mape(tuned.oof[covered], y[covered]),
            "mape_nearest": mape(twin[has_twin], y[has_twin]),
            "mape_default_nearest_rows": mape(default_oof[has_twin], y[has_twin]),
            "nearest_coverage": float(has_twin.mean()),
            "single_vm_rows": int(one_vm.sum()),
            "mape_default_single_vm": mape(default_oof[one_vm], y[one_vm]),
            "mape_prior_single_vm": mape(prior_oof[one_vm], y[one_vm]),
            "noise_floor": mape(floor[covered], y[covered]),
            "floor_coverage": float(covered.mean()),
            "mape_nested": mape(nested_oof, y) if nested else None,
            "mape_nested_single_vm": mape(nested_oof[one_vm], y[one_vm]) if nested else None,
            "trials": len(tuned.trials),
            "best_params": tuned.best_params,
            "seconds": time.monotonic() - t0,
        }
        ratio = out[cls]["mape_tuned_covered"] / out[cls]["noise_floor"]
        out[cls]["ratio_to_floor"] = ratio if math.isfinite(ratio) else None
    return out


def prior_predict(part: pd.DataFrame, groups: np.ndarray, n_splits: int) -> np.ndarray:
    """Out-of-fold predictions of the physics prior alone (fitted on the training folds)."""
    y = part["busbw"].to_numpy(float)
    oof = np.full(len(part), np.nan)
    for train, test in group_kfold(groups, n_splits):
        reg = BusBandwidthRegressor(**DEFAULT_PARAMS).fit(part.iloc[train], y[train])
        oof[test] = reg.prior_only(part.iloc[test])
    return oof


INNER_SPLITS = RefreshConfig().n_splits
"""Grouped folds of the tuning nested inside each held-out group (``--nested``), as the
refresh tunes on its training allocations."""


def nested_predict(
    part: pd.DataFrame,
    groups: np.ndarray,
    group: str,
    n_trials: int,
    seed: int,
    n_splits: int,
    label: str = "",
) -> np.ndarray:
    """Out-of-fold predictions of the model as the refresh makes it: for each outer fold,
    ``n_trials`` seeded trials tuned on the training groups alone (``INNER_SPLITS`` grouped
    folds), then the best parameters fitted on all of them. Unlike the *tuned* column, the
    held-out group plays no part in choosing the parameters."""
    y = part["busbw"].to_numpy(float)
    oof = np.full(len(part), np.nan)
    folds = list(group_kfold(groups, n_splits))
    for i, (train, test) in enumerate(folds, 1):
        fit_on = part.iloc[train].reset_index(drop=True)
        best = tune(fit_on, n_trials=n_trials, group=group, n_splits=INNER_SPLITS, seed=seed)
        reg = BusBandwidthRegressor(**{**best.best_params, "n_jobs": 1, "random_state": seed})
        oof[test] = reg.fit(fit_on, y[train]).predict(part.iloc[test])
        print(f"  nested {label}: fold {i}/{len(folds)}", flush=True)
    return oof


def later_rows(df: pd.DataFrame, match: str) -> np.ndarray:
    """Which rows belong to a table whose ``table_id`` contains ``match``; a one-line error
    naming ``--later`` when that is none or all of them (nothing to fit or nothing to score)."""
    later = df["table_id"].astype(str).str.contains(match, regex=False).to_numpy()
    if not later.any() or later.all():
        raise SystemExit(
            f"--later {match!r}: matches {int(later.sum())} of {len(df)} rows "
            "(it must match some tables, not all)"
        )
    return later


def later_tables(
    df: pd.DataFrame, match: str, mtu: int, plot: Path | None = None
) -> dict[str, Any]:
    """The tables whose ``table_id`` contains ``match`` scored by the default model (prior x
    residual, and the prior alone), and by the same with a ring-only prior, fitted on every
    other table, per size class and VM count; ``plot``: a figure of measured and predicted
    bus bandwidth against buffer size, one panel per VM count."""
    df = with_hardware(df)
    later = later_rows(df, match)
    out: dict[str, Any] = {"match": match, "tables": int(df[later]["table_id"].nunique())}
    scored: list[pd.DataFrame] = []
    for cls, mask in size_masks(df, mtu).items():
        train, test = df[mask & ~later], df[mask & later]
        if test.empty:
            continue
        reg = BusBandwidthRegressor(**DEFAULT_PARAMS).fit(train, train["busbw"].to_numpy(float))
        ring = BusBandwidthRegressor(**{**DEFAULT_PARAMS, "prior_tree": False}).fit(
            train, train["busbw"].to_numpy(float)
        )
        y = test["busbw"].to_numpy(float)
        model, prior = reg.predict(test), reg.prior_only(test)
        ring_model = ring.predict(test)
        vms = test["vms"].to_numpy()
        scored.append(
            pd.DataFrame(
                {
                    "vms": vms,
                    "size": test["buffer_bytes"].to_numpy(float),
                    "measured": y,
                    "model": model,
                    "ring": ring_model,
                    "prior": prior,
                }
            )
        )
        out[cls] = {
            "rows": len(test),
            "mape_default": mape(model, y),
            "mape_prior": mape(prior, y),
            "mape_default_ring_prior": mape(ring_model, y),
            "by_vms": {
                str(int(v)): {
                    "rows": int((vms == v).sum()),
                    "mape_default": mape(model[vms == v], y[vms == v]),
                    "mape_prior": mape(prior[vms == v], y[vms == v]),
                    "mape_default_ring_prior": mape(ring_model[vms == v], y[vms == v]),
                }
                for v in sorted(set(vms.tolist()))
            },
        }
    if plot is not None and scored:
        plot_later(pd.concat(scored, ignore_index=True), match, plot)
    return out


def plot_later(rows: pd.DataFrame, match: str, path: Path) -> None:
    """Measured bus bandwidth of the later tables against buffer size, one panel per VM
    count, with what the default model, the same with a ring-only prior, and the prior
    alone predicted without having seen them."""
    from srifty_core.plotting import pyplot, save_figure

    plt = pyplot()
    counts = sorted(set(rows["vms"].tolist()))
    fig, axes = plt.subplots(1, len(counts), figsize=(3.2 * len(counts), 3.4), sharey=True)
    for ax, v in zip(np.atleast_1d(axes), counts, strict=True):
        part = rows[rows["vms"] == v].sort_values("size")
        x = part["size"] / 2**20
        ax.plot(x, part["measured"] / 1e9, "ko-", label="measured")
        ax.plot(x, part["model"] / 1e9, "C0s--", label="model (ring or tree prior)")
        ax.plot(x, part["ring"] / 1e9, "C3^:", label="model (ring-only prior)")
        ax.plot(x, part["prior"] / 1e9, "C2-", alpha=0.6, label="prior alone")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{int(v)} VMs")
        ax.set_xlabel("buffer (MiB)")
    np.atleast_1d(axes)[0].set_ylabel("bus bandwidth (GB/s)")
    np.atleast_1d(axes)[-1].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Tables matching {match!r}, predicted by models fitted on the others")
    save_figure(fig, path)  # atomic: a killed run leaves the previous picture whole


def table(name: str, res: dict[str, Any]) -> str:
    def pct(v: float) -> str:
        return "-" if v is None or not math.isfinite(v) else f"{v:.1f}%"

    lines = [
        f"{name}: {res['rows']} rows, {res['groups']} groups ({res['group_column']})",
        "| size class | rows | prior alone | no prior | prior x residual "
        "| with a ring-only prior | tuned "
        "| nearest (its rows: model) | nearest coverage | single VM: rows, model, prior "
        "| tuned, covered rows | noise floor | ratio | floor coverage | trials "
        "| nested tuning (single VM) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for cls, label in ((SMALL, "<= MTU"), (LARGE, "> MTU")):
        r = res[cls]
        ratio = "-" if r["ratio_to_floor"] is None else f"{r['ratio_to_floor']:.2f}"
        lines.append(
            f"| {label} | {r['rows']} | {pct(r['mape_prior'])} | {pct(r['mape_no_prior'])} | "
            f"{pct(r['mape_default'])} | {pct(r['mape_default_ring_prior'])} "
            f"(single VM {pct(r['mape_ring_prior_single_vm'])}) | {pct(r['mape_tuned'])} | "
            f"{pct(r['mape_nearest'])} ({pct(r['mape_default_nearest_rows'])}) | "
            f"{r['nearest_coverage']:.0%} | {r['single_vm_rows']}, "
            f"{pct(r['mape_default_single_vm'])}, {pct(r['mape_prior_single_vm'])} | "
            f"{pct(r['mape_tuned_covered'])} | {pct(r['noise_floor'])} | {ratio} | "
            f"{r['floor_coverage']:.0%} | {r['trials']} | "
            + (
                "- |"
                if r.get("mape_nested") is None
                else f"{pct(r['mape_nested'])} ({pct(r['mape_nested_single_vm'])}) |"
            )
        )
    return "\n".join(lines)


def main() -> None:
    from srifty_core.predictors.base import FEATURE_COLUMNS
    from srifty_core.probing.store import read_probes

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--probe-store", type=Path, help="probe store folder for part (a)")
    ap.add_argument("--label", default="probe store", help="what the probe store holds")
    ap.add_argument(
        "--trials",
        type=int,
        default=DEFAULT_TRIALS,
        help=f"tuning trials per size class (default {DEFAULT_TRIALS})",
    )
    ap.add_argument("--budget", help=argparse.SUPPRESS)  # removed: a clear error below
    ap.add_argument(
        "--table", type=Path, help="nccl-tests table for part (b) (default: the shipped one)"
    )
    ap.add_argument("--mtu", type=int, default=DEFAULT_MTU)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-public", action="store_true", help="only part (a)")
    ap.add_argument(
        "--later",
        metavar="TEXT",
        help="(c): score the public tables whose table_id contains TEXT with a model fitted "
        "on the others",
    )
    ap.add_argument(
        "--nested",
        action="store_true",
        help="(b): also tune inside each held-out table's training tables (--trials trials "
        "per fold: about 26x the tuning time), the model as the refresh makes it; results "
        "default to benchmarks/results/bandwidth_model_nested.json",
    )
    ap.add_argument(
        "--out",
        type=Path,
        help="results file (default benchmarks/results/bandwidth_model.json); the --later "
        "figure goes beside it",
    )
    ap.add_argument(
        "--emulated",
        action="store_true",
        help="part (a) on a fresh emulated EC2 sweep (6 types, 4 allocations each)",
    )
    args = ap.parse_args()
    if args.budget is not None:
        ap.error(
            "--budget was removed: tuning runs a fixed number of trials (--trials N), so the "
            "same command gives the same numbers"
        )
    if args.trials < 1:
        ap.error(f"--trials: must be >= 1, got {args.trials}")
    if args.skip_public and not (args.probe_store or args.emulated):
        ap.error("--skip-public without --probe-store or --emulated: nothing to measure")
    if args.skip_public and args.nested:
        ap.error("--nested tunes on the public tables: it cannot go with --skip-public")
    if args.out is None:
        name = "bandwidth_model_nested.json" if args.nested else "bandwidth_model.json"
        args.out = RESULTS / name
    if args.nested and (args.probe_store or args.emulated):
        print("note: --nested applies to (b), the public tables; (a) is measured as without it")
    if args.skip_public and args.later is not None:
        ap.error("--later scores public tables: it cannot go with --skip-public")
    if args.emulated:
        import tempfile

        from srifty_core.cloud.emulated.measurements import (
            emulated_probe_sweep,
            write_emulated_probes,
        )

        args.probe_store = Path(tempfile.mkdtemp(prefix="srifty-emulated-probes-"))
        args.label = "emulated EC2 (6 types x 4 allocations)"
        types = [
            "g4dn.xlarge",
            "g4dn.12xlarge",
            "g5.xlarge",
            "g3.4xlarge",
            "p3.2xlarge",
            "p3.8xlarge",
        ]
        table_ = emulated_probe_sweep(types, allocations=4, seed=args.seed)
        write_emulated_probes(table_, root=args.probe_store)
        print(f"emulated sweep: {table_.num_rows} rows in {args.probe_store}")
    results: dict[str, Any] = {"trials_per_class": args.trials, "mtu": args.mtu, "seed": args.seed}
    if args.probe_store:
        df = read_probes(args.probe_store)
        res = evaluate(df, "allocation_id", args.trials, args.mtu, args.seed, list(FEATURE_COLUMNS))
        res["label"] = args.label
        results["probe_store"] = res
        print(table(f"(a) {args.label}, held out by allocation", res))
    if not args.skip_public:
        df = nccl_tests_frame(args.table)
        if args.later is not None:
            later_rows(df, args.later)  # before the long part: a match of none fails now
        config = [*FEATURE_COLUMNS, "num_nodes"]
        # one fold per table: leave-one-table-out
        n_tables = int(df["table_id"].nunique())
        res = evaluate(
            df, "table_id", args.trials, args.mtu, args.seed, config, n_tables, args.nested
        )
        results["nccl_tests_public"] = res
        print(table("(b) public nccl-tests tables, held out by table", res))
        if args.later is not None:
            figure = args.out.parent / "bandwidth_later_tables.png"
            later = later_tables(df, args.later, args.mtu, figure)
            results["later_tables"] = later
            print(f"(c) the {later['tables']} tables matching {args.later!r}, fitted on the rest")
            for cls in (SMALL, LARGE):
                if cls in later:
                    r = later[cls]
                    per = ", ".join(
                        f"{v} VMs {b['mape_default']:.1f}% (ring-only "
                        f"{b['mape_default_ring_prior']:.1f}%, prior {b['mape_prior']:.1f}%)"
                        for v, b in r["by_vms"].items()
                    )
                    print(
                        f"  {cls}: {r['rows']} rows, default {r['mape_default']:.1f}% "
                        f"(ring-only prior {r['mape_default_ring_prior']:.1f}%), "
                        f"prior alone {r['mape_prior']:.1f}%; {per}"
                    )
    write_text_atomic(args.out, json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
