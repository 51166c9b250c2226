"""Bus-bandwidth model per collective (all_reduce, all_gather, reduce_scatter): held-out MAPE
beside the noise floor.

Data: a probe store (``--probe-store DIR``), an emulated EC2 sweep of the three collectives
(``--emulated``: its all_gather and reduce_scatter by nccl-tests' published ring relations,
``cloud.emulator_truth.collective_time``), or a fresh local gloo sweep of the three
collectives (``--sweep``: ``--allocations`` fresh 2-process groups on this host, sizes
``--sizes``, concurrency 1 and 2, 5 repeats; the sweep's wall time per collective is
reported, the cost of adding the collectives to a nightly sweep), and/or nccl-tests tables
(``--table CSV``, the columns of ``srifty_core/shipped/reference/nccl_tests_public.csv`` with
a ``collective`` column), and/or the shipped public tables (``--public``: each all_gather
table left out in turn; SOURCES.md section 4b, no reduce_scatter table of an EC2 type found).

Held out: one group at a time (``allocation_id`` in a probe store, ``table_id`` in tables:
leave-one-table-out), the default ``BandwidthModel`` fitted on every other group. Per
collective and size class (<= / > MTU): MAPE of the collective model, of an allreduce-only
model (fitted on the other groups' allreduce rows alone and asked about the collective: what
a model saved before the feature answers, nccl-tests' busbw being shared by the ring
algorithms), and the noise floor (the best constant per configuration learned from the other
groups, ``predictors.metrics.noise_floor_predictions``) with the model's MAPE on the rows it
covers.

    .venv/bin/python benchmarks/collective_model.py --public --sweep --emulated [--allocations 4]

Writes ``benchmarks/results/collective_model.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from srifty_core.atomic import write_text_atomic
from srifty_core.predictors.bandwidth import BandwidthModel
from srifty_core.predictors.base import FEATURE_COLUMNS, with_collective
from srifty_core.predictors.features import DEFAULT_MTU, size_masks
from srifty_core.predictors.metrics import mape, noise_floor_predictions
from srifty_core.probing.config import ALL_REDUCE, COLLECTIVES

RESULTS = Path(__file__).resolve().parent / "results"


def held_out(df: pd.DataFrame, group: str, mtu: int, only: set[str] | None = None) -> pd.DataFrame:
    """Per row: the collective model's and the allreduce-only model's prediction when its
    group was held out (``only``: these groups alone; the others' rows stay NaN), and the
    noise floor's."""
    df = with_collective(df).reset_index(drop=True)
    coll = np.full(len(df), np.nan)
    only_ar = np.full(len(df), np.nan)
    for g in df[group].astype(str).unique():
        if only is not None and g not in only:
            continue
        test = (df[group].astype(str) == g).to_numpy()
        train = df[~test]
        if train[group].nunique() < 1 or train.empty:
            continue
        model = BandwidthModel(mtu=mtu).fit(train, group=group)
        coll[test] = model.predict(df[test])
        ar_train = train[train["collective"] == ALL_REDUCE]
        if len(ar_train) and ar_train[group].nunique() >= 1:
            ar_model = BandwidthModel(mtu=mtu).fit(ar_train.drop(columns="collective"), group=group)
            only_ar[test] = ar_model.predict(df[test])
    floor = noise_floor_predictions(df, group=group, config=list(FEATURE_COLUMNS))
    return df.assign(pred=coll, pred_allreduce_only=only_ar, floor=floor)


def summarize(res: pd.DataFrame, mtu: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    res = res[np.isfinite(res["pred"].to_numpy(float))]
    y_all = res["busbw"].to_numpy(float)
    for name in COLLECTIVES:
        is_c = (res["collective"] == name).to_numpy()
        if not is_c.any():
            continue
        per: dict[str, Any] = {}
        for cls, mask in size_masks(res, mtu).items():
            m = is_c & mask
            if not m.any():
                continue
            y = y_all[m]
            pred = res["pred"].to_numpy()[m]
            ar = res["pred_allreduce_only"].to_numpy()[m]
            floor = res["floor"].to_numpy()[m]
            covered = np.isfinite(floor)
            per[cls] = {
                "rows": int(m.sum()),
                "mape_model": mape(pred, y),
                "mape_allreduce_only": mape(ar, y) if np.isfinite(ar).all() else None,
                "noise_floor": mape(floor[covered], y[covered]) if covered.any() else None,
                "mape_model_covered": mape(pred[covered], y[covered]) if covered.any() else None,
                "floor_coverage": float(covered.mean()),
            }
        out[name] = per
    return out


def public_tables(mtu: int) -> dict[str, Any]:
    """Leave-one-table-out over the shipped all_gather/reduce_scatter tables (module doc),
    with two references per held-out row: the same run's in-place measurement (the noise of
    one run, a lower bound on the floor), and the allreduce table of the same source at the
    same VM count and size (nccl-tests' busbw promised equal across the ring collectives)."""
    from srifty_core.predictors.nccl_tests import collectives_path, default_path, nccl_tests_frame

    frames, raws = [], []
    for path in (default_path(), collectives_path()):
        frames.append(nccl_tests_frame(path))
        raw_one = pd.read_csv(path)
        size = pd.to_numeric(raw_one["size_bytes"], errors="coerce")
        took = pd.to_numeric(raw_one["time_us"], errors="coerce")
        raws.append(raw_one[~(size <= 0) & ~(took <= 0)])  # the rows nccl_tests_frame keeps
    df = pd.concat(frames, ignore_index=True)
    raw = pd.concat(raws, ignore_index=True)
    targets = set(df.loc[df["collective"] != ALL_REDUCE, "table_id"].astype(str))
    res = held_out(df, "table_id", mtu, only=targets)
    res = res.assign(floor=np.nan)
    # one run's in-place against its out-of-place busbw
    n = raw["world_size"].astype(float)
    factor = (
        raw["collective"]
        .fillna(ALL_REDUCE)
        .map({c: 2.0 if c == ALL_REDUCE else 1.0 for c in COLLECTIVES})
    )
    inplace = factor * raw["size_bytes"] * (n - 1) / (n * raw["inplace_time_us"] * 1e-6)
    res["floor"] = inplace.to_numpy(float)
    # the same source's allreduce at the same VM count and size
    ar = res[res["collective"] == ALL_REDUCE]
    key = ["instance_type", "num_nodes", "world_size", "buffer_bytes"]
    same = (
        ar.assign(_src=ar["table_id"].str.split(":").str[0])
        .groupby(["_src", *key], dropna=False)["busbw"]
        .median()
    )
    src = res["table_id"].str.split(":").str[0]
    idx = pd.MultiIndex.from_arrays([src, *(res[k] for k in key)])
    res["same_source_allreduce"] = same.reindex(idx).to_numpy(float)
    out: dict[str, Any] = {"tables": sorted(targets), "by_collective": {}}
    held = res[res["table_id"].astype(str).isin(targets)]
    held = held.assign(emulated=emulated_busbw(held))
    print("public nccl-tests tables, one all_gather/reduce_scatter table left out at a time")
    print(
        "| collective | table | rows | model | allreduce-only model | same run in-place "
        "| same source's allreduce busbw | emulated EC2 (noise-free) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (name, tid), g in held.groupby(["collective", "table_id"], sort=True):
        y = g["busbw"].to_numpy(float)
        same_src = g["same_source_allreduce"].to_numpy(float)
        have = np.isfinite(same_src)
        r = {
            "rows": len(g),
            "mape_model": mape(g["pred"].to_numpy(float), y),
            "mape_allreduce_only": mape(g["pred_allreduce_only"].to_numpy(float), y),
            "mape_inplace_vs_out": mape(g["floor"].to_numpy(float), y),
            "mape_same_source_allreduce": mape(same_src[have], y[have]) if have.any() else None,
            "same_source_rows": int(have.sum()),
            "mape_emulated": mape(g["emulated"].to_numpy(float), y),
        }
        out["by_collective"].setdefault(name, {})[tid] = r
        print(
            f"| {name} | {tid.split('#')[-1]} | {r['rows']} | {r['mape_model']:.1f}% | "
            f"{r['mape_allreduce_only']:.1f}% | {r['mape_inplace_vs_out']:.1f}% | "
            + (
                "-"
                if r["mape_same_source_allreduce"] is None
                else f"{r['mape_same_source_allreduce']:.1f}%"
            )
            + f" | {r['mape_emulated']:.1f}% |"
        )
    all_rows = held
    y = all_rows["busbw"].to_numpy(float)
    out["all"] = {
        "rows": len(all_rows),
        "mape_model": mape(all_rows["pred"].to_numpy(float), y),
        "mape_allreduce_only": mape(all_rows["pred_allreduce_only"].to_numpy(float), y),
        "mape_inplace_vs_out": mape(all_rows["floor"].to_numpy(float), y),
        "mape_emulated": mape(all_rows["emulated"].to_numpy(float), y),
    }
    print(f"all held-out rows: {out['all']}")
    return out


def emulated_busbw(rows: pd.DataFrame) -> NDArray[np.float64]:
    """The emulated EC2's noise-free bus bandwidth of each row's collective, type, world size
    and size (``cloud.emulator_truth.collective_time``, one rank per GPU, mean levels)."""
    from srifty_core.catalog import Catalog
    from srifty_core.cloud import emulator_truth as truth
    from srifty_core.probing.config import BUSBW_FACTOR

    catalog = Catalog.load()
    out = np.empty(len(rows))
    for i, (name, itype, n, s) in enumerate(
        zip(
            rows["collective"],
            rows["instance_type"],
            rows["world_size"],
            rows["buffer_bytes"],
            strict=True,
        )
    ):
        net = truth.NetSpec.of(catalog.get(str(itype), "us-east-1"))
        t = float(truth.collective_time(str(name), net, float(s), int(n))[0])
        out[i] = BUSBW_FACTOR[str(name)] * float(s) * (int(n) - 1) / (int(n) * t)
    return out


def local_sweep(allocations: int, sizes: str) -> tuple[pd.DataFrame, dict[str, float]]:
    """A real gloo sweep of the three collectives on this host, in a temporary store; its
    rows and the wall time of each collective's sweep alone."""
    from datetime import date

    from srifty_core.cloud.local import LocalProvider
    from srifty_core.measure.sweep import probe_sweep
    from srifty_core.probing.config import SweepConfig, parse_sizes
    from srifty_core.probing.store import read_probes

    root = Path(tempfile.mkdtemp(prefix="srifty-collective-probes-"))
    wall: dict[str, float] = {}
    for name in COLLECTIVES:  # one collective at a time: its own wall time
        cfg = SweepConfig(
            sizes=parse_sizes(sizes, points_per_decade=2),
            world_sizes=(2,),
            concurrency=(1, 2),
            repeats=5,
            warmup=2,
            allocations=allocations,
            collectives=(name,),
        )
        t0 = time.perf_counter()
        probe_sweep(cfg, provider=LocalProvider(), day=date(2026, 1, 5), root=root)
        wall[name] = time.perf_counter() - t0
        print(f"sweep {name}: {wall[name]:.1f} s for {len(cfg.all_points())} points")
    return read_probes(root), wall


def table(title: str, summary: dict[str, Any]) -> str:
    def pct(v: Any) -> str:
        return "-" if v is None else f"{v:.1f}%"

    lines = [
        title,
        "| collective | size class | rows | model | allreduce-only model | noise floor "
        "(coverage) | model on covered rows |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, per in summary.items():
        for cls, r in per.items():
            lines.append(
                f"| {name} | {cls} | {r['rows']} | {pct(r['mape_model'])} | "
                f"{pct(r['mape_allreduce_only'])} | {pct(r['noise_floor'])} "
                f"({r['floor_coverage']:.0%}) | {pct(r['mape_model_covered'])} |"
            )
    return "\n".join(lines)


def main() -> None:
    from srifty_core.predictors.nccl_tests import nccl_tests_frame
    from srifty_core.probing.store import read_probes

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--probe-store", type=Path, help="probe store folder")
    ap.add_argument("--sweep", action="store_true", help="a fresh local gloo sweep")
    ap.add_argument(
        "--emulated",
        action="store_true",
        help="an emulated EC2 sweep of the three collectives (3 types x 3 allocations each)",
    )
    ap.add_argument("--allocations", type=int, default=4)
    ap.add_argument("--sizes", default="4B:16MB")
    ap.add_argument("--table", type=Path, help="nccl-tests CSV with a collective column")
    ap.add_argument(
        "--public",
        action="store_true",
        help="the shipped tables: each all_gather/reduce_scatter table left out in turn, the "
        "model fitted on every other shipped table (all_reduce ones included)",
    )
    ap.add_argument("--mtu", type=int, default=DEFAULT_MTU)
    ap.add_argument("--out", type=Path, default=RESULTS / "collective_model.json")
    args = ap.parse_args()
    if not (args.probe_store or args.sweep or args.table or args.emulated or args.public):
        ap.error("give --probe-store, --sweep, --emulated, --public or --table")
    results: dict[str, Any] = {"mtu": args.mtu}
    if args.emulated:
        from srifty_core.cloud.emulated.measurements import emulated_probe_sweep

        types = ["g4dn.xlarge", "g4dn.12xlarge", "p3.8xlarge"]
        em = emulated_probe_sweep(
            types,
            world_sizes=(2, 4, 8),
            concurrency=(1, 2),
            allocations=3,
            sustained=False,
            collectives=COLLECTIVES,
        ).to_pandas()
        res = summarize(held_out(em, "allocation_id", args.mtu), args.mtu)
        results["emulated"] = {"rows": len(em), "types": types, "by_collective": res}
        print(table("emulated EC2, one allocation held out at a time", res))
    if args.sweep or args.probe_store:
        if args.sweep:
            df, wall = local_sweep(args.allocations, args.sizes)
            results["sweep_wall_s"] = wall
        else:
            df = read_probes(args.probe_store)
        res = summarize(held_out(df, "allocation_id", args.mtu), args.mtu)
        results["probe_store"] = {"rows": len(df), "groups": int(df["allocation_id"].nunique())}
        results["probe_store"]["by_collective"] = res
        print(table("probes, one allocation held out at a time", res))
    if args.public:
        results["public"] = public_tables(args.mtu)
    if args.table:
        df = nccl_tests_frame(args.table)
        res = summarize(held_out(df, "table_id", args.mtu), args.mtu)
        results["tables"] = {"rows": len(df), "tables": int(df["table_id"].nunique())}
        results["tables"]["by_collective"] = res
        print(table("nccl-tests tables, one table left out at a time", res))
    write_text_atomic(args.out, json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
