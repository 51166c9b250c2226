"""Simulator speed: estimates per second on a 64-VM heterogeneous ResNet50 configuration,
beside a straightforward implementation of the same method measured in the same run.

The straightforward version draws every VM's latency per iteration in a Python loop, asks
the bandwidth predictor once per bucket (a one-row frame each) and caches nothing; the
Srifty ``Simulator`` draws per-type maxima by inversion from one block of common random
numbers, batches predictor queries and caches them per (types, world size, buckets).

Two workloads: the same configuration again and again (the cache's best case), and a
planner-like sweep of 200 distinct configurations (counts and batches vary, so world sizes
and predictor queries change). Reported as ratios: the machine is shared and noisy.
Run:  .venv/bin/python benchmarks/simulator_speed.py
"""

from __future__ import annotations

import math
import random
import statistics
import time
from typing import Any

import numpy as np
import pandas as pd

from srifty_core.predictors.compute import fit_piecewise
from srifty_core.predictors.table import ProbeTableBandwidth
from srifty_core.profiling.profile import ComputeProfile, GradientBucket, PassStats
from srifty_core.simulator.estimator import Simulator
from srifty_core.simulator.exchange import bus_bytes, simulate_exchange
from srifty_core.simulator.types import ClusterConfig, Group, SimInstance, Workload

# ResNet50: 25.6 M parameters = 102 MB of gradients; DDP's buckets (1 MiB first, 25 MiB cap)
BUCKETS = (1.0, 24.8, 25.0, 25.1, 26.4)  # MiB, in reduction order
READY = (0.08, 0.35, 0.62, 0.86, 0.995)
TYPES = {  # instance type -> (GPU, relative speed, network Gbps)
    "g4dn.xlarge": ("T4", 1.0, 5.0),
    "g3.4xlarge": ("M60", 0.45, 5.0),
    "p3.2xlarge": ("V100", 1.9, 2.5),
}


def profile(gpu: str, speed: float) -> ComputeProfile:
    sizes = (1, 8, 32, 128)
    fw = tuple((0.008 + 0.0009 * b) / speed for b in sizes)
    bw = tuple(2.1 * f for f in fw)
    return ComputeProfile(
        model="resnet50",
        size="full",
        device_type=gpu,
        device_name=gpu,
        fw=PassStats(sizes, fw, tuple(0.04 * f for f in fw), 5),
        bw=PassStats(sizes, bw, tuple(0.05 * f for f in bw), 5),
        fw_fit=fit_piecewise(sizes, fw),
        bw_fit=fit_piecewise(sizes, bw),
        b_max=128,
        memory_per_sample_bytes=1e8,
        memory_fixed_bytes=1e9,
        memory_cap_bytes=16 * 2**30,
        n_parameters=25_557_032,
        gradient_bytes=102_228_128,
        buckets=tuple(
            GradientBucket(i, int(m * 2**20), 10, r)
            for i, (m, r) in enumerate(zip(BUCKETS, READY, strict=True))
        ),
        bucket_cap_bytes=25 * 2**20,
        first_bucket_cap_bytes=2**20,
        schedule_batch_size=32,
        probe_mode="budget:4",
        threads=0,
        torch_version="-",
        created_at="-",
    )


def predictor() -> ProbeTableBandwidth:
    rows = []
    for t, (_, _, gbps) in TYPES.items():
        for n in (2, 4, 8, 16, 32, 64, 128):
            for s in np.geomspace(4, 512 * 2**20, 20).astype(int):
                for c in (1, 2, 4):
                    peak = gbps * 1e9 / 8 * (1 - 0.3 * math.log2(n) / 7)
                    t_s = 30e-6 * math.log2(n) + s / peak
                    rows.append(
                        {
                            "instance_type": t,
                            "world_size": n,
                            "concurrent": c,
                            "buffer_bytes": s,
                            "busbw": 2 * s * (n - 1) / (n * t_s) / c,
                            "status": "ok",
                        }
                    )
    return ProbeTableBandwidth().fit(pd.DataFrame(rows))


def naive_estimate(
    workload: Workload, config: ClusterConfig, bw: ProbeTableBandwidth, iters: int, seed: int
) -> float:
    """The method, written the obvious way: per-VM draws in Python, no caches."""
    rng = random.Random(seed)
    vms = []
    for g in config.groups:
        p = workload.profile(g.instance.device_type)
        b = g.batch_per_rank
        vms += [
            (float(p.t_fw(b)), float(p.std_fw(b)), float(p.t_bw(b)), float(p.std_bw(b)))
        ] * g.count
    fws, bws = [], []
    for _ in range(iters):
        fws.append(max(rng.gauss(m, s) for m, s, _, _ in vms))
        bws.append(max(rng.gauss(m, s) for _, _, m, s in vms))
    t_bw = statistics.fmean(bws)
    n = config.world_size
    slow = max(
        config.groups, key=lambda g: workload.profile(g.instance.device_type).t_bw(g.batch_per_rank)
    )
    buckets = workload.profile(slow.instance.device_type).buckets
    busbw = []
    for bk in buckets:
        per_type = []
        for g in config.groups:
            q = pd.DataFrame(
                [
                    {
                        **g.instance.features,
                        "world_size": n,
                        "buffer_bytes": bk.size_bytes,
                        "concurrent": 1,
                    }
                ]
            )
            per_type.append(float(bw.predict(q)[0]))
        busbw.append(min(per_type))
    cap = min(bw.bandwidth_cap(g.instance.name, n) for g in config.groups)
    t_pe = simulate_exchange(
        [bk.ready_fraction * t_bw for bk in buckets],
        [bus_bytes(bk.size_bytes, n) for bk in buckets],
        busbw,
        cap,
    ).t_pe
    return statistics.fmean(f + max(b, t_pe) for f, b in zip(fws, bws, strict=True))


def rate(fn: Any, calls: list[Any], min_s: float = 1.0) -> float:
    done, t0 = 0, time.perf_counter()
    while True:
        for c in calls:
            fn(c)
        done += len(calls)
        if time.perf_counter() - t0 >= min_s:
            return done / (time.perf_counter() - t0)


def main() -> None:
    inst = {
        t: SimInstance(t, gpu, 1, {"instance_type": t, "gpu_model": gpu})
        for t, (gpu, _, _) in TYPES.items()
    }
    workload = Workload("resnet50", {gpu: profile(gpu, sp) for gpu, sp, _ in TYPES.values()})
    bw = predictor()
    big = ClusterConfig(
        (
            Group(inst["g4dn.xlarge"], 24, 32),
            Group(inst["g3.4xlarge"], 24, 16),
            Group(inst["p3.2xlarge"], 16, 64),
        )
    )
    rng = np.random.default_rng(0)
    sweep = [
        ClusterConfig(
            tuple(
                Group(inst[t], int(rng.integers(1, 33)), int(2 ** rng.integers(3, 8)))
                for t in TYPES
            )
        )
        for _ in range(200)
    ]
    iters = 256
    sim = Simulator(bw, iters=iters)
    fast = sim.estimate(workload, big).t_iter
    slow = naive_estimate(workload, big, bw, iters, 0)
    print(
        f"64 VMs ({big.label()}): t_iter {fast * 1e3:.2f} ms (simulator) "
        f"vs {slow * 1e3:.2f} ms (straightforward)"
    )
    results = {}
    for label, calls in (
        ("same 64-VM configuration", [big]),
        ("200 distinct configurations", sweep),
    ):
        ratios = []
        for _ in range(3):
            sim = Simulator(bw, iters=iters)  # fresh caches each round
            r_fast = rate(lambda c, s=sim: s.estimate(workload, c), calls)
            r_naive = rate(lambda c: naive_estimate(workload, c, bw, iters, 0), calls, min_s=1.0)
            ratios.append((r_fast, r_naive))
        f = statistics.median(r for r, _ in ratios)
        n = statistics.median(r for _, r in ratios)
        spread = [a / b for a, b in ratios]
        results[label] = (f, n)
        print(
            f"{label:28s}: simulator {f:9.0f} est/s, straightforward {n:7.1f} est/s, "
            f"speed-up x{f / n:.0f} (rounds: {', '.join(f'x{s:.0f}' for s in spread)})"
        )


if __name__ == "__main__":
    main()
