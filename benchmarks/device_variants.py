"""GPU variants as device types: do estimates answer the published runs on each variant?

    .venv/bin/python benchmarks/device_variants.py  # 10 s; writes results/device_variants.json

Every published single-GPU training row (``shipped/reference/public_training_throughput.csv``)
on a GPU the catalog sells, asked of the public entry a new user meets
(``ProfileStore.load_or_estimate``, on an empty store: the shipped H200 profiles are all
it has measured) in two ways:

* **variant**: the row's exact device type (``A100-80GB`` for an A100 SXM4 80GB), as the
  planner now asks for a p4de;
* **model only**: the bare GPU model (``A100``), the smallest variant's sheet, which is what
  every type of that model was planned on before variants were told apart.

Per row: whether the published batch fits the estimate's ``B_max`` (a batch that ran and
is refused is a false "does not fit": a plan could never choose it), and the step-time error
(predicted - published) / published at that batch. The predicted step is the estimate's
passes and optimizer step plus the benchmark loop's host time a published step holds (the
roofline's ``host_s`` a sample, learned from the published steps; an estimate itself is of
the passes srifty's profiler times). The rows are evidence the roofline is
also fitted on (the in-sample figure; BENCHMARKS.md has the held-out ones): what this
measures is the variant's sheet, memory and bandwidth, not the fit.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from srifty_core.atomic import write_text_atomic
from srifty_core.catalog import Catalog
from srifty_core.profiling.estimate import (
    PUBLIC_THROUGHPUT,
    PUBLIC_VARIANTS,
    SQUAD,
    device_specs,
    roofline_for,
)
from srifty_core.profiling.store import ProfileStore
from srifty_core.training_settings import TrainingSettings

OUT = Path(__file__).parent / "results" / "device_variants.json"
SETTINGS = {"fp32": {}, "tf32": {"tf32": True}, "amp": {"precision": "fp16"}}
"""A published precision as a training setting (Lambda's and NVIDIA's amp is fp16)."""


def rows(catalog: Catalog) -> list[dict[str, str]]:
    """The published single-GPU rows on a variant the catalog sells, with its device type."""
    specs = device_specs(catalog)
    out = []
    with PUBLIC_THROUGHPUT.open(newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            ours = PUBLIC_VARIANTS.get(r["gpu_variant"])
            if ours is None or ours not in specs or not r["zoo_model"] or r["gpus"] != "1":
                continue
            if r["zoo_model"] == "bert_base" and r["input"] != "seq384":
                continue
            out.append({**r, "device_type": specs[ours].name, "chip": specs[ours].chip})
    return out


def ask(
    store: ProfileStore, catalog: Catalog, r: dict[str, str], device: str, host_s: float
) -> dict[str, object]:
    bert = r["zoo_model"] == "bert_base"
    settings = TrainingSettings(optimizer="adamw" if bert else "sgd", **SETTINGS[r["precision"]])
    p = store.load_or_estimate(
        SQUAD if bert else r["zoo_model"], "full", device, settings, catalog=catalog
    )
    b = int(r["batch_per_gpu"])
    step = float(p.fw_fit.at(b)) + float(p.bw_fit.at(b)) + p.optimizer_step_s + host_s * b
    published = b / float(r["throughput_per_s"])
    return {"b_max": p.b_max, "fits": b <= p.b_max, "error": step / published - 1}


def main() -> int:
    t0 = time.perf_counter()
    catalog = Catalog.load()
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        store = ProfileStore(Path(tmp))
        host_s = roofline_for(catalog, store)[0].efficiencies.host_s  # fitted once
        for r in rows(catalog):
            out.append(
                {
                    "source": r["source_id"],
                    "model": r["zoo_model"],
                    "published_variant": r["gpu_variant"],
                    "precision": r["precision"],
                    "batch": int(r["batch_per_gpu"]),
                    "device_type": r["device_type"],
                    "variant": ask(store, catalog, r, r["device_type"], host_s),
                    "model_only": ask(store, catalog, r, r["chip"], host_s),
                }
            )
    summary = {}
    for way in ("variant", "model_only"):
        several = [o for o in out if o["device_type"] != o["device_type"].split("-")[0]]
        summary[way] = {
            "rows": len(out),
            "answered": sum(bool(o[way]["fits"]) for o in out),  # type: ignore[index]
            "rows_on_variants": len(several),
            "answered_on_variants": sum(bool(o[way]["fits"]) for o in several),  # type: ignore[index]
            "median_abs_error_on_variants": statistics.median(
                abs(float(o[way]["error"]))
                for o in several  # type: ignore[index]
            ),
        }
    result = {"rows": out, "summary": summary, "seconds": time.perf_counter() - t0}
    write_text_atomic(OUT, json.dumps(result, indent=1))
    print(f"{'variant':26s} {'prec':4s} {'model':9s} {'batch':>5s}  B_max variant / model only")
    for o in out:
        v, m = o["variant"], o["model_only"]
        flag = "" if v["fits"] == m["fits"] else "  <- answered now" if v["fits"] else "  <- lost"  # type: ignore[index]
        print(
            f"{o['published_variant']:26s} {o['precision']:4s} {o['model']:9s} {o['batch']:5d}  "
            f"{v['b_max']:5d} / {m['b_max']:5d}  error {float(v['error']):+6.1%} / "  # type: ignore[index]
            f"{float(m['error']):+6.1%}{flag}"  # type: ignore[index]
        )
    for way, s in summary.items():
        print(
            f"{way}: {s['answered']}/{s['rows']} rows answered; on the GPUs sold in variants "
            f"{s['answered_on_variants']}/{s['rows_on_variants']}, median |error| "
            f"{s['median_abs_error_on_variants']:.1%}"
        )
    print(f"{time.perf_counter() - t0:.0f} s; {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
