"""How is the gradient exchange of one multi-GPU VM priced on a fresh install? (issue 47)

On a fresh install the planner prices bus bandwidth with the model fitted on the shipped
public nccl-tests tables (``planner.job.public_bandwidth``). For each multi-GPU type below
and ResNet-50 (its shipped reference profile, emulated on the type's GPU), this script
asks the simulator what the exchange of one VM and of two VMs costs
(``Simulator.breakdown``: the seconds per iteration the buckets keep the links busy) and
turns it into the bus bandwidth it priced (bus bytes / busy time), against:

- the rated link the ring crosses (``predictors.prior.hardware_of``: NVLink or PCIe per
  GPU and direction inside one VM, the NIC between VMs);
- the public tables' single-VM rows where the tables have the type on one VM (the largest
  bus bandwidth of a buffer of 64 MiB or more);
- the emulated EC2: the same configuration trained there (``EmulatedProvider.train``, 30
  iterations), its mean measured exchange over the predicted one.

It also prints the bandwidth model's curve at 100 MiB and its cap for each shape. Seeded:
the same code gives the same figures. Results: ``benchmarks/results/intra_vm_exchange.json``.

    .venv/bin/python benchmarks/investigations/intra_vm_exchange.py
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
RESULT = HERE.parent / "results" / "intra_vm_exchange.json"
TYPES = (
    "p3.8xlarge",
    "p3.16xlarge",
    "g4dn.12xlarge",
    "g5.12xlarge",
    "p4d.24xlarge",
    "p5.48xlarge",
)
MODEL = "resnet50"
BATCH_PER_GPU = 64
REGION = "us-east-1"


def table_single_vm(rows: Any) -> dict[str, float]:
    """The largest bus bandwidth (bytes/s) of a buffer >= 64 MiB in the public tables'
    rows on one VM, per instance type."""
    from srifty_core.predictors.prior import hardware_columns

    hw = hardware_columns(rows)
    one = hw[(hw["vms"] == 1) & (hw["buffer_bytes"] >= 64 << 20)]
    return {str(t): float(v) for t, v in one.groupby("instance_type")["busbw"].max().items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULT)
    args = parser.parse_args(argv)

    from srifty_core import case_studies as cs
    from srifty_core.atomic import write_text_atomic
    from srifty_core.catalog import Catalog
    from srifty_core.cloud.base import LaunchRequest
    from srifty_core.cloud.emulated.measurements import emulated_profiles
    from srifty_core.cloud.emulated.provider import EmulatedProvider
    from srifty_core.planner.job import public_bandwidth
    from srifty_core.predictors.nccl_tests import nccl_tests_frame
    from srifty_core.predictors.prior import hardware_of
    from srifty_core.profiling.store import load_reference_profile
    from srifty_core.simulator.estimator import Simulator
    from srifty_core.simulator.exchange import bus_bytes
    from srifty_core.simulator.types import ClusterConfig, Group, SimInstance, Workload

    t0 = time.perf_counter()
    catalog = Catalog.load()
    model, _ = public_bandwidth()
    tables = table_single_vm(nccl_tests_frame())
    ref, _ = load_reference_profile(MODEL)
    profiles = emulated_profiles(
        TYPES, ref, seed=0, catalog=catalog, reference_rate=cs.one_core(), region=REGION
    )
    sim = Simulator(model)
    out: dict[str, Any] = {}
    for name in TYPES:
        t = catalog.get(name, REGION)
        inst = SimInstance.from_catalog(t)
        hw = hardware_of(name)
        assert hw is not None
        workload = Workload(MODEL, {t.gpu_model: profiles[t.gpu_model]})
        sizes = [b.size_bytes for b in profiles[t.gpu_model].buckets]
        row: dict[str, Any] = {
            "gpus_per_vm": t.gpus_per_vm,
            "intra_link": hw.intra_class,
            "intra_rated_GBps": hw.intra_gbs,
            "nic_rated_GBps": hw.nic_gbs,
            "gradient_MB": sum(sizes) / 1e6,
            "table_single_vm_GBps": (tables[name] / 1e9) if name in tables else None,
        }
        for vms in (1, 2):
            world = vms * t.gpus_per_vm
            config = ClusterConfig((Group(inst, vms, BATCH_PER_GPU * t.gpus_per_vm),))
            _, busy = sim.breakdown(workload, config)
            moved = sum(bus_bytes(s, world) for s in sizes)
            curve = model.predict(
                __import__("pandas").DataFrame(
                    [{**inst.features, "world_size": world, "buffer_bytes": 100 << 20,
                      "concurrent": 1}]
                )
            )  # fmt: skip
            shape: dict[str, Any] = {
                "world_size": world,
                "predicted_exchange_ms": 1e3 * busy,
                "priced_busbw_GBps": moved / busy / 1e9,
                "curve_100MiB_GBps": float(curve[0]) / 1e9,
                "cap_GBps": model.bandwidth_cap(name, world) / 1e9,
            }
            link = hw.intra_gbs if vms == 1 else hw.nic_gbs
            shape["priced_over_rated_link"] = shape["priced_busbw_GBps"] / link if link else None
            cloud = EmulatedProvider(seed=7, catalog=catalog, region=REGION)
            alloc = cloud.launch(LaunchRequest(name, count=vms))
            run = cloud.train(
                [alloc],
                ref,
                {name: BATCH_PER_GPU * t.gpus_per_vm},
                30,
                reference=cs.one_core(),
            )
            measured = float(np.mean(run.exchange_s))
            shape["emulated_exchange_ms"] = 1e3 * measured
            shape["predicted_over_emulated"] = busy / measured
            row[f"{vms}vm"] = shape
        out[name] = row
        one, two = row["1vm"], row["2vm"]
        print(
            f"{name:14s} 1 VM: {one['predicted_exchange_ms']:8.2f} ms priced at "
            f"{one['priced_busbw_GBps']:7.2f} GB/s ({one['priced_over_rated_link']:.2f} of "
            f"its {hw.intra_class} {hw.intra_gbs} GB/s; emulated {one['emulated_exchange_ms']:.2f}"
            f" ms, predicted/emulated {one['predicted_over_emulated']:.2f}); 2 VMs: "
            f"{two['priced_busbw_GBps']:.2f} GB/s ({two['priced_over_rated_link']:.2f} of the "
            f"NIC; predicted/emulated {two['predicted_over_emulated']:.2f})"
        )
    result = {"model": MODEL, "batch_per_gpu": BATCH_PER_GPU, "types": out,
              "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
    write_text_atomic(args.out, json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
