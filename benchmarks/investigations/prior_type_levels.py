"""Would per-type levels in the physics prior help the bus-bandwidth model? (issue 37, item 4)

The prior (``srifty_core.predictors.prior.LinkPrior``) learns one efficiency and one latency
per link class (``efa`` for p3dn, p4d, p4de and p5 alike). ``LinkPrior(type_levels=True)``
adds, for each instance type seen over several VMs, a NIC level and a latency factor
relative to its class (averaging zero over the class's types). This script measures, on
the shipped public nccl-tests tables and in one run, the model with and without them:

- (b) held out by table, default XGBoost parameters, with NCCL's tree in the prior and
  with the ring alone, per size class (<= / > the MTU), and the single-VM rows;
- (c) the five p5.48xlarge tables at 2-32 VMs scored by a model fitted on the other 21;
- with ``--nested``: the model as the refresh makes it (30 seeded trials tuned on the
  other tables of each held-out table's size class, 3 grouped folds), about 2.5 minutes a
  variant here;
- the prior's fit time on the 24-type emulated sweep the refresh benchmark uses (102,384
  rows).

The regressor builds its prior with ``LinkPrior``'s defaults, so each variant sets the
default for the run (the investigation patches ``LinkPrior.__init__``; nothing else
changes). Results: ``benchmarks/results/prior_type_levels.json``.

    .venv/bin/python benchmarks/investigations/prior_type_levels.py [--nested]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the maintained benchmarks' helpers

import bandwidth_model as bm  # noqa: E402
import refresh_time  # noqa: E402

from srifty_core.atomic import write_text_atomic  # noqa: E402
from srifty_core.predictors import prior as prior_module  # noqa: E402
from srifty_core.predictors.nccl_tests import nccl_tests_frame  # noqa: E402
from srifty_core.predictors.regressor import BusBandwidthRegressor, with_hardware  # noqa: E402
from srifty_core.predictors.tuning import DEFAULT_PARAMS, cross_val_predict  # noqa: E402

RESULT = HERE.parent / "results" / "prior_type_levels.json"
_INIT = prior_module.LinkPrior.__init__


def use_levels(on: bool) -> None:
    """Make ``LinkPrior()`` fit type levels (or not) for everything that follows."""

    def init(self: prior_module.LinkPrior, *, tree: bool = True, type_levels: bool = on) -> None:
        _INIT(self, tree=tree, type_levels=type_levels)

    prior_module.LinkPrior.__init__ = init  # type: ignore[method-assign]


def held_out(df: Any, nested: bool) -> dict[str, Any]:
    groups = df["table_id"].astype(str).to_numpy()
    n = len(set(groups))
    out: dict[str, Any] = {}
    for cls, mask in bm.size_masks(df, bm.DEFAULT_MTU).items():
        part = df[mask].reset_index(drop=True)
        g = groups[mask]
        y = part["busbw"].to_numpy(float)
        one = part["vms"].to_numpy() == 1
        row: dict[str, Any] = {"rows": len(part), "single_vm_rows": int(one.sum())}
        row["prior"] = bm.mape(bm.prior_predict(part, g, n), y)
        for label, tree in (("tree", True), ("ring", False)):
            oof = cross_val_predict(
                {**DEFAULT_PARAMS, "prior_tree": tree}, part, groups=g, n_splits=n
            )
            row[label] = bm.mape(oof, y)
            row[f"{label}_single_vm"] = bm.mape(oof[one], y[one])
        if nested:
            oof = bm.nested_predict(part, g, "table_id", 30, 0, n, label=cls)
            row["nested"] = bm.mape(oof, y)
            row["nested_single_vm"] = bm.mape(oof[one], y[one])
        out[cls] = row
    return out


def later(df: Any) -> dict[str, float]:
    """(c): the p5 tables at 2-32 VMs, fitted on the others (above the MTU)."""
    rows = df[df["buffer_bytes"] > bm.DEFAULT_MTU].reset_index(drop=True)
    held = rows["table_id"].astype(str).str.contains("crazyguitar", regex=False).to_numpy()
    y = rows["busbw"].to_numpy(float)[held]
    out = {}
    for label, tree in (("tree", True), ("ring", False)):
        reg = BusBandwidthRegressor(**{**DEFAULT_PARAMS, "prior_tree": tree})
        reg.fit(rows[~held], rows["busbw"].to_numpy(float)[~held])
        out[label] = bm.mape(reg.predict(rows[held]), y)
    return out


def fit_seconds() -> dict[str, float]:
    from srifty_core.cloud.emulated.measurements import emulated_probe_sweep

    sweep = emulated_probe_sweep(list(refresh_time.TYPES), allocations=3, repeats=3, seed=0)
    frame = with_hardware(sweep.to_pandas())
    y = frame["busbw"].to_numpy(float)
    out = {"rows": float(len(frame))}
    for on in (False, True):
        t0 = time.perf_counter()
        prior_module.LinkPrior(type_levels=on).fit(frame, y)
        out["levels" if on else "classes"] = time.perf_counter() - t0
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nested", action="store_true", help="also the refresh's nested tuning")
    args = ap.parse_args()
    df = with_hardware(nccl_tests_frame(None))
    results: dict[str, Any] = {}
    for on in (False, True):
        use_levels(on)
        name = "levels" if on else "classes"
        results[name] = {"held_out": held_out(df, args.nested), "later_p5": later(df)}
        for cls, r in results[name]["held_out"].items():
            nested = f", nested {r['nested']:.1f}%" if "nested" in r else ""
            print(
                f"{name:7} {cls:5}: prior {r['prior']:.1f}%, tree {r['tree']:.1f}% (single VM "
                f"{r['tree_single_vm']:.1f}%), ring {r['ring']:.1f}% (single VM "
                f"{r['ring_single_vm']:.1f}%){nested}",
                flush=True,
            )
        c = results[name]["later_p5"]
        print(f"{name:7} (c) p5 at 2-32 VMs: tree {c['tree']:.1f}%, ring {c['ring']:.1f}%")
    use_levels(False)
    results["fit_seconds"] = fit_seconds()
    f = results["fit_seconds"]
    print(
        f"prior fit on {int(f['rows'])} emulated rows (24 types): classes {f['classes']:.1f} s, "
        f"levels {f['levels']:.1f} s"
    )
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(RESULT, json.dumps(results, indent=1, default=float) + "\n")
    print(f"results: {RESULT.relative_to(HERE.parent.parent)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
