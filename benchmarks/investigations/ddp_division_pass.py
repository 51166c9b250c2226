"""Does dividing the gradients by the world size cost DDP a pass over them? Measured, then
re-scored on the recorded local-DDP runs.

PyTorch's DDP divides each gradient while it copies it into its bucket
(``Reducer::copy_grad_to_bucket``: one ``mul_out``) when no communication hook is set; with
a hook it copies plainly, and a hook that divides each bucket makes one more pass. The
simulator used to add that pass to the profile's measured DDP overhead (taken with a no-op
hook) for every job.

(a) In one process (a process group of one, gloo, the CPU; one thread, the allocator the
    workers run with), each model's forward + backward at ``--batch`` wrapped in DDP three
    ways: the built-in path (no hook; a world-1 allreduce), a no-op hook (what the profile
    measures), and a hook that divides each bucket (the separate pass). Interleaved rounds
    of ``--repeats`` steps each, medians; beside them one copy pass over the gradients at
    the copy bandwidth measured in the same process (``ComputeProfile.ddp_copy_s``).
(b) The recorded ``benchmarks/simulator_reality.py`` runs (``--runs``, JSON files) scored
    with and without the pass: the prediction with it is the recorded one for runs made
    before the change (``--after`` names the others) and the recorded one plus the pass for
    runs made after it. Runs since the change record the pass (``t_division_pass``: one
    copy pass at the profile's copy bandwidth, slowed as the ranks' passes are); for older
    runs the recorded copy out of the buckets plus the optimizer's slowdown
    (``t_after - t_opt``) stands in, and their figures are marked approximate.

    .venv/bin/python benchmarks/investigations/ddp_division_pass.py [--models dlrm,resnet18,alexnet]

Writes ``benchmarks/results/ddp_division_pass.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent / "results"
RUNS = [
    RESULTS / "simulator_reality_runs" / "2026-12-01_first.json",
    RESULTS / "simulator_reality_runs" / "2026-12-01_second.json",
    RESULTS / "simulator_reality_runs" / "2026-12-01_third.json",
    RESULTS / "simulator_reality_runs" / "2026-12-01_fourth.json",
    RESULTS / "simulator_reality_runs" / "2026-12-01_fifth.json",
    RESULTS / "simulator_reality.json",
]
AFTER = ["2026-12-01_fifth.json", "simulator_reality.json"]


def measure(models: list[str], batch: int, rounds: int, repeats: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from srifty_core import host_allocator
    from srifty_core.profiling.buckets import skip_allreduce, trainable
    from srifty_core.profiling.config import ProfilerConfig
    from srifty_core.profiling.memory import tensor_bytes
    from srifty_core.profiling.timing import copy_bandwidth, step_seconds
    from srifty_core.workloads.zoo import build

    host_allocator.steady()
    torch.set_num_threads(1)
    cpu = torch.device("cpu")

    def divide(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads hook annotations
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(bucket.buffer().div_(2))
        return fut

    config = ProfilerConfig(repeats=repeats, warmup=1)  # a round's first step warms up

    def steps(workload: Any, data: Any) -> float:
        return statistics.median(step_seconds(workload, data, config, lambda: None))

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
    out: dict[str, Any] = {}
    try:
        for name in models:
            w = build(name, "small")
            data = w.make_batch(batch, cpu, seed=0)
            ways: dict[str, Any] = {}
            for way, hook in (
                ("built_in", None),
                ("no_op_hook", skip_allreduce),
                ("dividing_hook", divide),
            ):
                ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(w.module))
                if hook is not None:
                    ddp.register_comm_hook(None, hook)
                ways[way] = dataclasses.replace(w, module=ddp)
            medians: dict[str, list[float]] = {way: [] for way in ways}
            order = list(ways)
            for r in range(rounds):  # the order rotates from round to round
                for way in order[r % 3 :] + order[: r % 3]:
                    medians[way].append(steps(ways[way], data))
            grad = tensor_bytes(trainable(w.module))
            copy_s = grad / copy_bandwidth(grad, cpu, lambda: None)
            res: dict[str, Any] = {way: statistics.median(v) for way, v in medians.items()}
            res["rounds"] = {way: v for way, v in medians.items()}
            # paired within each round: the host's drift falls on both sides
            for diff, (a, b) in {
                "dividing_minus_no_op": ("dividing_hook", "no_op_hook"),
                "built_in_minus_no_op": ("built_in", "no_op_hook"),
            }.items():
                d = [x - y for x, y in zip(medians[a], medians[b], strict=True)]
                res[diff] = {"median": statistics.median(d), "min": min(d), "max": max(d)}
            res["copy_pass_s"] = copy_s
            res["gradient_bytes"] = grad
            out[name] = res
            div, blt = res["dividing_minus_no_op"], res["built_in_minus_no_op"]
            print(
                f"{name:10s} built-in {res['built_in'] * 1e3:6.2f} ms | no-op hook "
                f"{res['no_op_hook'] * 1e3:6.2f} | dividing hook {res['dividing_hook'] * 1e3:6.2f} "
                f"| per round: dividing - no-op {div['median'] * 1e3:+5.2f} "
                f"({div['min'] * 1e3:+.1f}..{div['max'] * 1e3:+.1f}), built-in - no-op "
                f"{blt['median'] * 1e3:+5.2f} ({blt['min'] * 1e3:+.1f}..{blt['max'] * 1e3:+.1f})"
                f" | one copy pass {copy_s * 1e3:5.2f} ms ({grad / 1e6:.1f} MB)",
                flush=True,
            )
    finally:
        dist.destroy_process_group()
    return out


def rescore(paths: list[Path], after: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    signed: dict[str, list[float]] = {"with": [], "without": []}
    per_model: dict[str, dict[str, list[float]]] = {}
    for path in paths:
        cases = json.loads(path.read_text())["cases"]
        made_after = path.name in after
        run: dict[str, Any] = {}
        exact = all("t_division_pass" in c["srifty_parts"] for c in cases)
        for label in ("with", "without"):
            errs = []
            for c in cases:
                parts = c["srifty_parts"]
                # recorded since the change; before it, the copy out of the buckets (and the
                # optimizer's slowdown) stands in: at least the pass, where the measured DDP
                # overhead exceeds a copy pass (the runs' figures are then approximate)
                one_pass = parts.get("t_division_pass", parts["t_after"] - parts["t_opt"])
                base = c["srifty_s"] - (0.0 if made_after else one_pass)
                pred = base + (one_pass if label == "with" else 0.0)
                e = (pred - c["measured_s"]) / c["measured_s"]
                errs.append(e)
                per_model.setdefault(c["model"], {"with": [], "without": []})[label].append(e)
            signed[label] += errs
            run[label] = {
                "mape": 100 * statistics.fmean(abs(e) for e in errs),
                "too_fast": sum(e < 0 for e in errs),
                "cases": len(errs),
            }
        run["pass_recorded"] = exact
        run["noise_floor_mape"] = 100 * statistics.fmean(
            abs(c["measured_again_s"] - c["measured_s"]) / c["measured_s"] for c in cases
        )
        out[str(path.relative_to(RESULTS.parent.parent))] = run
        print(
            f"{path.name:32s} with the pass: MAPE {run['with']['mape']:4.1f}%, too fast "
            f"{run['with']['too_fast']:2d}/{run['with']['cases']} | without: MAPE "
            f"{run['without']['mape']:4.1f}%, too fast {run['without']['too_fast']:2d}/"
            f"{run['without']['cases']} | noise floor {run['noise_floor_mape']:.1f}%"
            + ("" if exact else " (pass not recorded: approximate)")
        )
    summary = {
        label: {
            "mean_signed_pct": 100 * statistics.fmean(v),
            "too_fast": sum(e < 0 for e in v),
            "cases": len(v),
        }
        for label, v in signed.items()
    }
    models = {
        m: {label: 100 * statistics.fmean(v[label]) for label in ("with", "without")}
        for m, v in per_model.items()
    }
    for label, s in summary.items():
        print(
            f"all runs, {label} the pass: mean signed error {s['mean_signed_pct']:+.1f}%, too "
            f"fast {s['too_fast']}/{s['cases']}"
        )
    for m, v in models.items():
        print(f"  {m:14s} mean signed error {v['with']:+5.1f}% with, {v['without']:+5.1f}% without")
    return {"runs": out, "all": summary, "by_model_mean_signed_pct": models}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--models", type=lambda v: v.split(","), default=["dlrm", "resnet18", "alexnet"]
    )
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=12)
    ap.add_argument("--runs", type=Path, nargs="*", default=RUNS, help="simulator_reality JSONs")
    ap.add_argument("--after", nargs="*", default=AFTER, help="runs made after the change")
    ap.add_argument("--out", type=Path, default=RESULTS / "ddp_division_pass.json")
    args = ap.parse_args()
    for flag in ("batch", "rounds", "repeats"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag}: must be >= 1, got {getattr(args, flag)}")
    missing = [str(p) for p in args.runs if not p.is_file()]
    if missing:
        ap.error(f"--runs: no such file {missing}")
    from srifty_core.atomic import write_text_atomic

    print("(a) one process, DDP three ways, forward + backward (ms, medians of rounds)")
    measured = measure(args.models, args.batch, args.rounds, args.repeats)
    print("(b) the recorded local-DDP runs, Srifty's estimate with and without the pass")
    scored = rescore(args.runs, args.after)
    doc = {"batch": args.batch, "rounds": args.rounds, "repeats": args.repeats}
    doc.update({"measured": measured, "rescored": scored})
    write_text_atomic(args.out, json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
