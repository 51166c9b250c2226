"""Is the simulator right about real training? Predict, then run, DDP on this machine.

1. Probe allreduce on local workers (gloo, world size 2, 4 B..64 MB, concurrency 1/2/4) into
   a probe store; fit the probe-table bandwidth predictor on it.
2. Profile each model on the CPU (1 thread, as each DDP rank runs; 4 budgeted probes).
3. For each case (model, local batches of the two ranks, equal or not), predict the
   iteration with the Srifty simulator and with the APM baseline, from those profiles and
   probes only; then run real DDP (2 gloo processes) and measure it.

Reports MAPE and how often each estimator was too optimistic (predicted < measured; the
measured value is each case's mean iteration, what a job's time is made of, with the
median's figures beside them), for
the simulator as it runs by default (on CPU workers: the exchange after the backward pass,
since gloo's reductions need the same cores, and DDP's passes over the gradients at the
profiled copy bandwidth), the same simulator with ``overlap=1`` (each bucket starts when it
is ready: the method's assumption on GPUs), the same with the method's concurrent exchange
(``schedule="concurrent"``: ready buckets share the cap at once, instead of DDP's one at a
time), and APM. Each case is also run with DDP's
allreduce replaced by a no-op hook, which splits the measured iteration into compute (with
DDP's bookkeeping) and exposed communication, and, after all cases, measured a second time:
how far two measurements of the same case differ (the noise floor) bounds what any
estimator can reach on this machine.
Run:  .venv/bin/python benchmarks/simulator_reality.py [--quick] [--data-dir DIR] [--threads N]
Writes benchmarks/results/simulator_reality.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from srifty_core.atomic import write_text_atomic

OUT = Path(__file__).parent / "results"
CASES: dict[str, list[tuple[int, int]]] = {
    "resnet18": [(8, 8), (32, 32), (16, 48), (8, 56)],
    "shufflenet_v2": [(16, 16), (48, 48), (16, 80)],
    "alexnet": [(8, 8), (32, 32), (8, 40)],
    "dlrm": [(16, 16), (64, 64), (32, 96)],
    "bert_base": [(4, 4), (8, 16)],
}
QUICK = {"resnet18": [(8, 8), (16, 48)], "dlrm": [(16, 16), (32, 96)], "alexnet": [(8, 40)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--data-dir", type=Path, help="reuse probes/profiles kept here")
    parser.add_argument(
        "--iterations", type=int, default=30, help="measured DDP iterations per case (median)"
    )
    parser.add_argument(
        "--profile-repeats", type=int, default=10, help="repeats per profiled batch size"
    )
    parser.add_argument(
        "--colocated", type=int, default=1, help="profile with this many workers on the host"
    )
    parser.add_argument(
        "--share-host",
        type=int,
        default=2,
        help="profiles measure the slowdown of up to this many workers sharing the host "
        "(default 2, the cases' ranks; 1: not measured)",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="CPU threads per rank (profiles and DDP alike)"
    )
    parser.add_argument("--models", type=lambda v: v.split(","), help="e.g. alexnet,dlrm")
    parser.add_argument("--out", type=Path, default=OUT / "simulator_reality.json")
    parser.add_argument(
        "--rescore",
        type=Path,
        metavar="RUN.json",
        help="measure nothing: re-estimate a recorded run from the probes and profiles it "
        "kept in --data-dir, with and without the mean-time factor (writes RUN.rescored.json)",
    )
    args = parser.parse_args()
    if args.rescore is not None:
        if args.data_dir is None or not (args.data_dir / "probes").is_dir():
            parser.error("--rescore: needs --data-dir, the run's folder with probes/ and profiles/")
        if not args.rescore.is_file():
            parser.error(f"--rescore: no such run file {args.rescore}")
        scores = rescore(args.rescore, args.data_dir)
        for key, v in scores.items():
            if key != "run":
                print(
                    f"{key:28s} MAPE {v['mape_pct']:5.1f}%  mean error "
                    f"{v['mean_signed_pct']:+5.1f}%  too fast in {v['too_fast']}"
                )
        write_text_atomic(
            args.rescore.with_suffix(".rescored.json"), json.dumps(scores, indent=1) + "\n"
        )
        return
    cases = QUICK if args.quick else CASES
    if args.models:
        unknown = set(args.models) - set(CASES)
        if unknown:
            parser.error(f"--models: unknown {sorted(unknown)}; choose from {sorted(CASES)}")
        cases = {m: CASES[m] for m in args.models}
    root = args.data_dir or Path(tempfile.mkdtemp(prefix="srifty-reality-"))
    t_start = time.perf_counter()

    import torch

    from srifty_core.measure.sweep import probe_sweep
    from srifty_core.predictors.table import ProbeTableBandwidth
    from srifty_core.probing.config import SweepConfig, parse_sizes
    from srifty_core.probing.store import read_probes
    from srifty_core.profiling.config import ProfilerConfig
    from srifty_core.profiling.ddp_check import measure_ddp_cases
    from srifty_core.profiling.profiler import profile_model
    from srifty_core.profiling.store import ProfileNotFoundError, ProfileStore
    from srifty_core.simulator.apm import ApmEstimator
    from srifty_core.simulator.estimator import Simulator
    from srifty_core.simulator.types import SimInstance, Workload

    store_dir = root / "probes"
    if not list(store_dir.glob("**/*.parquet")):
        print("probing allreduce (gloo, world size 2) ...", flush=True)
        sweep = SweepConfig(
            sizes=parse_sizes("4B:64MB", points_per_decade=4),
            world_sizes=(2,),
            concurrency=(1, 2, 4),
            repeats=5,
            allocations=2,
        )
        probe_sweep(sweep, root=store_dir).raise_for_failures()
    probes = read_probes(root=store_dir)
    bandwidth = ProbeTableBandwidth().fit(probes)
    print(f"{len(probes)} probe rows; cap {bandwidth.bandwidth_cap('local.cpu', 2) / 1e9:.2f} GB/s")

    profiles = ProfileStore(root / "profiles")
    instance = SimInstance.local_cpu()  # this host's cores, as probed
    sim = Simulator(bandwidth, iters=512, seed=0)
    overlapped = Simulator(bandwidth, iters=512, seed=0, overlap=1.0)
    concurrent = Simulator(bandwidth, iters=512, seed=0, schedule="concurrent")
    apm = ApmEstimator()

    def measure(name: str, batches: list[tuple[int, int]], **how: bool) -> list[Any]:
        return measure_ddp_cases(
            name, "small", batches, iterations=args.iterations, warmup=3, threads=args.threads,
            **how,
        )  # fmt: skip

    rows: list[dict[str, Any]] = []
    for name, batches in cases.items():
        try:
            profile = profiles.load(name, "small", "cpu")
        except ProfileNotFoundError:
            b_max = max(max(b) for b in batches)
            print(
                f"profiling {name} ({args.threads} thread(s), 4 probes, B_max {b_max}, "
                f"{args.colocated} co-located) ...",
                flush=True,
            )
            # --colocated 2 profiles with the other worker of the host running
            profile = profile_model(
                name,
                "small",
                ProfilerConfig(
                    max_batch=b_max,
                    threads=args.threads,
                    repeats=args.profile_repeats,
                    colocated=args.colocated,
                    share_host=1 if args.colocated > 1 else args.share_host,
                ),
            )
            profiles.save(profile)
        workload = Workload(name, {"cpu": profile})
        runs = measure(name, batches, alone=True)
        for (a, b), meas in zip(batches, runs, strict=True):
            config = case_config(instance, a, b)
            est = sim.estimate(workload, config)
            ovl = overlapped.estimate(workload, config)
            conc = concurrent.estimate(workload, config)
            base = apm.estimate(workload, config)
            # after the exchange, as the no-comm run has it too: DDP's copy out of the
            # buckets and the optimizer step, both ranks at once on this host
            after = profile.ddp_passes_s(2)[1] + profile.optimizer_step_s * (
                profile.pass_slowdown(2)
            )
            real = statistics.median(meas.iteration_s)
            mean = statistics.fmean(meas.iteration_s)
            compute = statistics.median(meas.no_comm_s)
            alone = statistics.median(meas.alone_s)
            row = {
                "model": name,
                "batches": [a, b],
                "measured_s": real,
                # what the job's time is made of (the estimate's t_iter is a mean)
                "measured_mean_s": mean,
                "measured_p90_s": sorted(meas.iteration_s)[int(0.9 * (len(meas.iteration_s) - 1))],
                "measured_no_comm_s": compute,
                # the exchange: exposed in the iteration, its buckets' allreduce by
                # themselves in the same processes, and what the simulator predicts
                "exchange": {
                    "measured_exposed_s": real - compute,
                    "measured_alone_s": alone,
                    "predicted_s": est.t_pe - est.t_bw,
                },
                "srifty_s": est.t_iter,
                "srifty_parts": {
                    "t_fw": est.t_fw,
                    "t_bw": est.t_bw,
                    "t_pe": est.t_pe,
                    "t_opt": profile.optimizer_step_s,
                    "t_after": after,
                    # one pass over the gradients at the profile's copy bandwidth, slowed as
                    # the two ranks' passes are: what the estimate counted for DDP's
                    # division by the world size before it learned the division rides on
                    # the copy into the buckets
                    # (benchmarks/investigations/ddp_division_pass.py)
                    "t_division_pass": profile.ddp_copy_s() * profile.pass_slowdown(2),
                },
                "srifty_overlapped_s": ovl.t_iter,
                "srifty_concurrent_s": conc.t_iter,
                "srifty_p90_s": est.t_iter_p90,
                "apm_s": base.t_iter,
            }
            rows.append(row)

            def err(x: float, real: float = real) -> str:
                return f"{x * 1e3:7.1f} ({100 * (x - real) / real:+5.1f}%)"

            # compute as the no-comm run measures it: forward, backward (with DDP's work
            # on the backward thread), DDP's copy out and the optimizer step
            predicted_compute = est.t_fw + est.t_bw + after
            print(
                f"{name:14s} {a:3d}+{b:<3d} measured {real * 1e3:7.1f} ms (no-comm "
                f"{compute * 1e3:6.1f}; predicted compute {predicted_compute * 1e3:6.1f}; "
                f"exchange exposed {(real - compute) * 1e3:5.1f}, alone {alone * 1e3:5.1f}, "
                f"predicted {(est.t_pe - est.t_bw) * 1e3:5.1f}) | "
                f"srifty {err(est.t_iter)} | concurrent {err(conc.t_iter)} | overlapped "
                f"{err(ovl.t_iter)} | APM {err(base.t_iter)}",
                flush=True,
            )

    print("measuring every case again (the noise floor) ...", flush=True)
    for name, batches in cases.items():
        again = measure(name, batches, split=False)
        for r, m in zip([r for r in rows if r["model"] == name], again, strict=True):
            r["measured_again_s"] = statistics.median(m.iteration_s)
            r["measured_again_mean_s"] = statistics.fmean(m.iteration_s)

    def summary(key: str, truth: str = "measured_mean_s") -> dict[str, float]:
        errs = [(r[key] - r[truth]) / r[truth] for r in rows]
        return {
            "mape_pct": 100 * statistics.fmean(abs(e) for e in errs),
            "under_share_pct": 100 * sum(e < 0 for e in errs) / len(errs),
            "worst_under_pct": 100 * min(min(errs), 0.0),
        }

    # against each case's mean iteration (a job's time is iterations x the mean, and the
    # estimate is a mean); the median's figures beside them, as earlier runs reported
    result = {
        "srifty": summary("srifty_s"),
        "srifty_overlapped": summary("srifty_overlapped_s"),
        "srifty_concurrent": summary("srifty_concurrent_s"),
        "apm": summary("apm_s"),
        "noise_floor": summary("measured_again_mean_s"),
    }
    by_median = {
        "srifty": summary("srifty_s", "measured_s"),
        "apm": summary("apm_s", "measured_s"),
        "noise_floor": summary("measured_again_s", "measured_s"),
    }
    comm_share = [1 - r["measured_no_comm_s"] / r["measured_s"] for r in rows]
    print(
        f"exposed communication in the measured iterations: "
        f"{100 * statistics.fmean(comm_share):.0f}% on average"
    )
    for title, table in (("against the mean iteration", result), ("against the median", by_median)):
        print(title)
        for k, v in table.items():
            print(
                f"{k:18s} MAPE {v['mape_pct']:5.1f}%  too optimistic in "
                f"{v['under_share_pct']:.0f}% of cases (worst {v['worst_under_pct']:+.1f}%)"
            )
    kept = f"; data in {root}" if args.data_dir is None else ""
    print(f"{len(rows)} cases, {time.perf_counter() - t_start:.0f}s{kept}")
    host = {
        "cpus": os.cpu_count(),
        "threads_per_rank": args.threads,
        "torch": torch.__version__,
        "platform": platform.platform(),
        "processor": _cpu_model(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"host": host, "summary": result, "summary_by_median": by_median, "cases": rows}
    write_text_atomic(args.out, json.dumps(report, indent=1))


def case_config(instance: Any, a: int, b: int) -> Any:
    """The configuration of a case: two ranks of this host, local batches ``a`` and ``b``
    (one group when equal, one type in two groups when not)."""
    from srifty_core.simulator.types import ClusterConfig, Group

    if a == b:
        return ClusterConfig((Group(instance, 2, a),))
    return ClusterConfig((Group(instance, 1, a), Group(instance, 1, b)))


def rescore(run: Path, root: Path) -> dict[str, Any]:
    """Today's Srifty estimate of every case of a recorded run, from the probes and
    profiles it kept in ``root``, with and without the mean-time factor
    (``predictors.network``): the same measurements scored both ways, so the host's drift
    between runs stays out of the comparison. Against each case's mean iteration where
    the run recorded it, and its median."""
    import numpy as np

    from srifty_core.predictors.table import ProbeTableBandwidth
    from srifty_core.probing.store import read_probes
    from srifty_core.profiling.store import ProfileStore
    from srifty_core.simulator.estimator import Simulator
    from srifty_core.simulator.types import SimInstance, Workload

    class TypicalTransfers(ProbeTableBandwidth):
        """The table without its mean-time factor: each bucket at the probes' median."""

        def mean_time_factors(self, instance_type: str, buffer_bytes: Any) -> Any:
            return np.ones(np.shape(buffer_bytes))

    cases = json.loads(run.read_text())["cases"]
    probes = read_probes(root=root / "probes")
    profiles = ProfileStore(root / "profiles")
    instance = SimInstance.local_cpu()
    workloads = {
        m: Workload(m, {"cpu": profiles.load(m, "small", "cpu")})
        for m in {c["model"] for c in cases}
    }
    configs = [case_config(instance, *c["batches"]) for c in cases]
    out: dict[str, Any] = {"run": run.name}
    for label, table in (("mean_time", ProbeTableBandwidth()), ("typical", TypicalTransfers())):
        sim = Simulator(table.fit(probes), iters=512, seed=0)
        est = [
            sim.estimate(workloads[c["model"]], config).t_iter
            for c, config in zip(cases, configs, strict=True)
        ]
        for truth in ("measured_mean_s", "measured_s"):
            if truth in cases[0]:
                errs = [(e - c[truth]) / c[truth] for e, c in zip(est, cases, strict=True)]
                out[f"{label} vs {truth}"] = {
                    "mape_pct": 100 * statistics.fmean(abs(e) for e in errs),
                    "mean_signed_pct": 100 * statistics.fmean(errs),
                    "too_fast": f"{sum(e < 0 for e in errs)} of {len(errs)}",
                }
    return out


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
