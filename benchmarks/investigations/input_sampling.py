"""How far do Srifty's inputs alone move an estimate? The configurations whose plans the
prediction-accuracy benchmark loses (one multi-GPU VM, exchange-heavy), predicted from
profiles taken on many VMs and probe sweeps of many allocations, each sweep drawn with
another seed, against the truth's mean over many allocations.

If the estimate is right on average, the ratio predicted / truth spreads around 1 from
one sweep to the next by what a median of that many allocation levels carries; if it is
biased, every sweep errs the same way.

Run:  .venv/bin/python benchmarks/investigations/input_sampling.py [--sweeps 6] [--allocations 12]
Writes benchmarks/results/input_sampling.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "results"
CASES = (
    ("vgg16", "p3.8xlarge", 1, 64),
    ("alexnet", "g4dn.12xlarge", 1, 64),
    ("alexnet", "g3.8xlarge", 1, 64),
    ("bert_base", "g5.xlarge", 4, 128),
    ("resnet50", "p3.2xlarge", 2, 128),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweeps", type=int, default=6, help="sweeps, each of its own seed")
    parser.add_argument("--allocations", type=int, default=12, help="allocations per sweep")
    parser.add_argument("--profile-vms", type=int, default=40)
    parser.add_argument("--truth-allocations", type=int, default=20)
    parser.add_argument("--out", type=Path, default=OUT / "input_sampling.json")
    args = parser.parse_args()
    for flag, least in (("sweeps", 1), ("allocations", 1), ("profile_vms", 1),
                        ("truth_allocations", 1)):  # fmt: skip
        if getattr(args, flag) < least:
            parser.error(f"--{flag.replace('_', '-')}: must be at least {least}")

    from srifty_core.atomic import write_text_atomic
    from srifty_core.case_studies import one_core
    from srifty_core.catalog import Catalog
    from srifty_core.cloud.emulated.measurements import (
        emulate_training,
        emulated_probe_sweep,
        emulated_profiles,
    )
    from srifty_core.predictors.table import ProbeTableBandwidth
    from srifty_core.profiling.store import load_reference_profile
    from srifty_core.simulator.estimator import Simulator
    from srifty_core.simulator.types import ClusterConfig, Group, SimInstance, Workload

    catalog = Catalog.load()
    rows = []
    for model, itype, vms, batch in CASES:
        ref = load_reference_profile(model)[0]
        t = catalog.get(itype, "us-east-1")
        profiles = emulated_profiles(
            [itype], ref, seed=11, catalog=catalog, reference_rate=one_core(),
            vms=args.profile_vms,
        )  # fmt: skip
        truth = np.asarray(
            [
                emulate_training(
                    {itype: vms}, {itype: batch}, ref, 30, seed=5000 + k,
                    reference=one_core(), warm_s=3600,
                ).mean_s
                for k in range(args.truth_allocations)
            ]
        )  # fmt: skip
        config = ClusterConfig((Group(SimInstance.from_catalog(t), vms, batch),))
        ws = tuple(sorted({2, 4, 8, 16, max(2, t.gpus_per_vm)}))
        ratios = []
        for s in range(args.sweeps):
            sweep = emulated_probe_sweep(
                [itype], world_sizes=ws, seed=400 + s, allocations=args.allocations
            ).to_pandas()
            est = Simulator(ProbeTableBandwidth().fit(sweep)).estimate(
                Workload(model, profiles), config
            )
            ratios.append(est.t_iter / float(truth.mean()))
        row = {
            "config": f"{model} {vms}x{itype}@{batch}",
            "truth_mean_s": float(truth.mean()),
            "ratios": [round(r, 4) for r in ratios],
            "mean_ratio": round(statistics.fmean(ratios), 4),
            "sd_ratio": round(statistics.stdev(ratios), 4) if len(ratios) > 1 else 0.0,
        }
        rows.append(row)
        print(
            f"{row['config']:<32} predicted/truth mean {row['mean_ratio']:.3f} "
            f"sd {row['sd_ratio']:.3f} over {args.sweeps} sweeps "
            f"(min {min(ratios):.3f}, max {max(ratios):.3f})",
            flush=True,
        )
    report = {
        "sweeps": args.sweeps,
        "allocations": args.allocations,
        "profile_vms": args.profile_vms,
        "truth_allocations": args.truth_allocations,
        "rows": rows,
    }
    write_text_atomic(args.out, json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
