# ruff: noqa: E501
"""The emulator's allreduce curves against the public nccl-tests tables it was calibrated on.

    .venv/bin/python benchmarks/emulator_calibration.py      # a few seconds

For every table in srifty_core/shipped/reference/nccl_tests_public.csv, the emulated busbw at each size is
the median over 30 allocations x 5 samples (allocation levels and sample noise included),
with the table's ranks per node. The reference busbw is recomputed from the table's time
(2 s (n-1) / (n t)), since its printed busbw rounds small values to 0.00. Prints Markdown
(selected sizes, then the error per table over all sizes) and writes
benchmarks/results/emulator_calibration.png.
"""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np

from srifty_core import paths
from srifty_core.catalog import Catalog
from srifty_core.cloud import emulator_truth as truth

SHOW = {1024, 65536, 1048576, 16777216, 268435456, 1073741824}
OUT = Path(__file__).parent / "results" / "emulator_calibration.png"


def emulated_busbw(spec: truth.NetSpec, size: int, n: int, per_vm: int, rng) -> float:  # type: ignore[no-untyped-def]
    s = np.full(5, float(size))
    out = []
    for _ in range(30):
        lv = truth.draw_allocation_level(rng)
        t = truth.allreduce_time(
            spec, s, n, level_small=lv.small, level_large=lv.large, ranks_per_vm=per_vm
        ) * truth.sample_noise(rng, s)
        out.extend(2 * s * (n - 1) / (n * t))
    return float(np.median(out))


def main() -> None:
    catalog = Catalog.load()
    rng = np.random.default_rng(0)
    with open(paths.REFERENCE_DIR / "nccl_tests_public.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    by_table: dict[str, list[tuple[int, float, float]]] = defaultdict(list)
    meta: dict[str, tuple[str, int, int]] = {}
    for r in rows:
        size = int(r["size_bytes"])
        if size < 4:
            continue
        t = catalog.get(r["instance_type"], "us-east-1")
        n, per_vm = int(r["world_size"]), int(r["gpus_per_node"])
        ref = 2 * size * (n - 1) / (n * float(r["time_us"]) * 1e-6)
        emu = emulated_busbw(truth.NetSpec.of(t), size, n, per_vm, rng)
        by_table[r["table_id"]].append((size, ref, emu))
        meta[r["table_id"]] = (r["instance_type"], int(r["num_nodes"]), per_vm)
    print("| table | type | nodes x GPUs | size | nccl-tests busbw | emulated median | ratio |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for tid, pts in by_table.items():
        typ, nodes, g = meta[tid]
        for size, ref, emu in pts:
            if size in SHOW:
                print(
                    f"| {tid.split('/', 1)[1]} | {typ} | {nodes}x{g} "
                    f"| {_fmt(size)} | {ref / 1e9:.3g} GB/s | {emu / 1e9:.3g} GB/s | {emu / ref:.2f} |"
                )
    print()
    print("| table | type | nodes x GPUs | sizes | MAPE | median abs. error | max ratio off |")
    print("|---|---|---:|---:|---:|---:|---:|")
    allerr = []
    for tid, pts in by_table.items():
        typ, nodes, g = meta[tid]
        ratio = np.array([e / r for _, r, e in pts])
        err = np.abs(ratio - 1)
        allerr.extend(err)
        worst = float(np.max(np.maximum(ratio, 1 / ratio)))
        print(
            f"| {tid.split('/', 1)[1]} | {typ} | {nodes}x{g} | {len(pts)} | {100 * err.mean():.0f}% "
            f"| {100 * np.median(err):.0f}% | {worst:.1f}x |"
        )
    print(
        f"\nall {len(allerr)} rows: MAPE {100 * np.mean(allerr):.0f}%, median {100 * np.median(allerr):.0f}%"
    )
    _plot(by_table, meta)


def _fmt(n: int) -> str:
    for unit, scale in (("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if n >= scale:
            return f"{n // scale}{unit}"
    return f"{n}B"


def _plot(by_table, meta) -> None:  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    for i, (tid, pts) in enumerate(by_table.items()):
        typ, nodes, g = meta[tid]
        s = [p[0] for p in pts]
        color = f"C{i}"
        label = f"{typ} {nodes}x{g} @{tid.split('@')[-1]}"
        ax.loglog(s, [p[1] / 1e9 for p in pts], "o", ms=3, color=color, label=label)
        ax.loglog(s, [p[2] / 1e9 for p in pts], "-", color=color)
    ax.set_xlabel("buffer size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title("nccl-tests (dots) vs emulated median (lines)")
    ax.legend(fontsize=7)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(OUT, dpi=110)
    print(f"\nplot: {OUT.relative_to(Path.cwd()) if OUT.is_relative_to(Path.cwd()) else OUT.name}")


if __name__ == "__main__":
    main()
