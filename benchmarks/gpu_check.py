"""GPU check: the profiler, the training runtime and the FSDP2 wrapper on CUDA.

    OUT=<folder> bash benchmarks/gpu_check.sh          # on a machine with an NVIDIA GPU
    python3 benchmarks/gpu_check.py --device cpu --models resnet18 --size tiny \\
        --max-batch 16 --precisions fp32 --train-model resnet18 --train-batch 8 \\
        --train-iterations 6 --fsdp-model hf:gpt2 --fsdp-size tiny --out <folder>
                                                      # the same code on a CPU (gloo)

Per model and precision (default: the ``full`` ResNet-50 and ``hf:gpt2``, fp32 and bf16):

1. **budgeted profile**: ``profile_model`` with 4 probes, as ``srifty profile --probes 4``
   makes it (B_max by doubling and bisection, a batch that raises out-of-memory does not fit;
   forward/backward latency between device synchronisations, 2 warm-up + 5 timed steps;
   gradient-ready times from CUDA events; DDP buckets; copy bandwidth and the SGD-momentum
   optimizer step; bf16 under autocast, as training runs it). Its JSON is written as
   ``<device>_<model>_<precision>.json``.
2. **dense sweep**: a second ``profile_model`` with explicit batch sizes, powers of two and
   their midpoints (1, 2, 3, 4, 6, 8, 12, ...) up to the budgeted profile's B_max, trimmed so
   that the predicted time fits the time budget. It repeats the B_max search and the
   per-step terms too, which gives a second reading of each.
3. **MAPE** of the budgeted fit t(B) against the dense means, for t_fw, t_bw and
   t_iter = t_fw + t_bw: at the dense sizes the 4 probes did not measure (``held_out``), at
   every dense size (``all``), and at the held-out powers of two (``pow2``, the method's
   protocol). The noise floor: the same sizes measured twice (the probes, once in each
   profile) differ by ``repeat_spread``.
4. on CUDA in fp32, a cross-check of the host timer against CUDA events at two batches.

Then, side by side: the training runs of ``gpu_check_train`` (the worker and the digits
script, fp32 and bf16, each preempted and resumed) and the FSDP2 check of
``gpu_check_fsdp``. Writes ``gpu_check.json`` (after every step) and ``summary.txt`` into
``--out``; catches each step's failure so the others still run. The estimate from specs
against these profiles is ``benchmarks/gpu_check_estimate.py``, run afterwards anywhere.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import gpu_check_fsdp  # beside this file
import gpu_check_train
import numpy as np
import torch

from srifty_core.profiling.config import ProfilerConfig
from srifty_core.profiling.device import device_type_of, resolve_device
from srifty_core.profiling.memory import BatchDoesNotFitError
from srifty_core.profiling.profile import ComputeProfile, mape
from srifty_core.profiling.profiler import profile_model
from srifty_core.training_settings import TrainingSettings
from srifty_core.workloads import build

T_START = time.perf_counter()


def finite(x: Any) -> Any:
    """``x`` with every NaN or infinity replaced by None (strict JSON)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [finite(v) for v in x]
    return x


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T_START:7.1f}s] {msg}", flush=True)


def dense_sizes(b_max: int) -> list[int]:
    """Powers of two and their midpoints (3 * 2^k) up to ``b_max``, plus ``b_max``."""
    out = {b_max}
    b = 1
    while b <= b_max:
        out.add(b)
        if 3 * b // 2 <= b_max and b >= 2:
            out.add(3 * b // 2)
        b *= 2
    return sorted(out)


def predicted_seconds(profile: ComputeProfile, sizes: list[int], steps: int) -> float:
    """What a dense profile at ``sizes`` should take, from the budgeted fit: ``steps`` steps at
    each size, a B_max search (about two steps at B_max), margin for batch making."""
    t = profile.fw_fit(np.asarray(sizes, float)) + profile.bw_fit(np.asarray(sizes, float))
    t_max = float(profile.fw_fit.at(max(sizes)) + profile.bw_fit.at(max(sizes)))
    return 1.3 * (steps * float(np.sum(t)) + 3 * t_max) + 2.0


def trim_to_budget(
    profile: ComputeProfile, sizes: list[int], steps: int, budget_s: float
) -> tuple[list[int], list[int]]:
    """Drop midpoints (largest first), then powers of two (largest below B_max first), until
    the predicted time fits ``budget_s``; the smallest size and B_max stay."""
    keep = list(sizes)
    dropped: list[int] = []
    pow2 = {b for b in sizes if b & (b - 1) == 0}
    order = [b for b in reversed(sizes) if b not in pow2 and b != sizes[-1]]
    order += [b for b in reversed(sizes) if b in pow2 and b not in (sizes[0], sizes[-1])]
    for b in order:
        if predicted_seconds(profile, keep, steps) <= budget_s or len(keep) <= 4:
            break
        keep.remove(b)
        dropped.append(b)
    return keep, dropped


def event_crosscheck(
    name: str, size: str, device: torch.device, sizes: list[int], repeats: int, warmup: int
) -> list[dict[str, Any]]:
    """Forward/backward seconds by the host timer between synchronisations (the profiler's
    way) and by CUDA events around the same work, in the same steps."""
    w = build(name, size, seed=0).to(device)
    w.module.train()
    out = []
    for b in sizes:
        batch = w.make_batch(b, device)
        host_fw, host_bw, ev_fw, ev_bw = [], [], [], []
        for i in range(warmup + repeats):
            w.module.zero_grad(set_to_none=True)
            e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            e0.record()
            loss = w.loss(batch)
            e1.record()
            torch.cuda.synchronize(device)
            t1 = time.perf_counter()
            loss.backward()
            e2.record()
            torch.cuda.synchronize(device)
            t2 = time.perf_counter()
            if i >= warmup:
                host_fw.append(t1 - t0)
                host_bw.append(t2 - t1)
                ev_fw.append(e0.elapsed_time(e1) / 1e3)
                ev_bw.append(e1.elapsed_time(e2) / 1e3)
        out.append(
            {
                "batch": b,
                "host_fw_s": statistics.fmean(host_fw),
                "event_fw_s": statistics.fmean(ev_fw),
                "host_bw_s": statistics.fmean(host_bw),
                "event_bw_s": statistics.fmean(ev_bw),
            }
        )
    del w
    return out


def region_mape(
    sizes: np.ndarray, measured: np.ndarray, predicted: np.ndarray, probed: np.ndarray
) -> dict[str, Any]:
    """Held-out MAPE (%) of t_iter in the launch-bound region (dense t_iter below twice its
    value at the smallest batch: the step is mostly fixed, per-kernel launch cost) and in the
    throughput-bound region (the rest)."""
    low = measured < 2 * measured[0]
    out: dict[str, Any] = {"launch_bound_sizes": [int(b) for b in sizes[low]]}
    for name, region in (("launch_bound", low), ("throughput_bound", ~low)):
        test = region & ~probed
        out[f"mape_iter_held_out_{name}"] = mape(predicted[test], measured[test])
        out[f"n_held_out_{name}"] = int(test.sum())
    return out


def evaluate(probe: ComputeProfile, dense: ComputeProfile) -> dict[str, Any]:
    """MAPE (%) of the budgeted fit against the dense means; see the module doc."""
    sizes = np.asarray(dense.fw.batch_sizes, dtype=float)
    y = {"fw": np.asarray(dense.fw.mean_s), "bw": np.asarray(dense.bw.mean_s)}
    y["iter"] = y["fw"] + y["bw"]
    p = {"fw": probe.fw_fit(sizes), "bw": probe.bw_fit(sizes)}
    p["iter"] = p["fw"] + p["bw"]
    d = {"fw": dense.fw_fit(sizes), "bw": dense.bw_fit(sizes)}
    d["iter"] = d["fw"] + d["bw"]
    probed = np.isin(sizes, probe.fw.batch_sizes)
    ints = sizes.astype(int)
    pow2 = (ints & (ints - 1)) == 0
    out: dict[str, Any] = {"probed_sizes": list(probe.fw.batch_sizes)}
    for k in ("fw", "bw", "iter"):
        out[f"mape_{k}_held_out"] = mape(p[k][~probed], y[k][~probed])
        out[f"mape_{k}_all"] = mape(p[k], y[k])
        out[f"mape_{k}_pow2"] = mape(p[k][~probed & pow2], y[k][~probed & pow2])
        out[f"mape_{k}_dense_fit_in_sample"] = mape(d[k], y[k])
        out[f"max_err_{k}_held_out_pct"] = (
            float(100 * np.max(np.abs(p[k][~probed] - y[k][~probed]) / y[k][~probed]))
            if (~probed).any()
            else math.nan
        )
    out["regions"] = region_mape(sizes, y["iter"], p["iter"], probed)
    out["iter_error_pct_by_size"] = [float(v) for v in 100 * (p["iter"] - y["iter"]) / y["iter"]]
    # the same batch sizes measured in both profiles: run-to-run noise
    both = [b for b in probe.fw.batch_sizes if b in dense.fw.batch_sizes]
    spread: dict[str, float] = {}
    for k in ("fw", "bw"):
        a = dict(zip(getattr(probe, k).batch_sizes, getattr(probe, k).mean_s, strict=True))
        c = dict(zip(getattr(dense, k).batch_sizes, getattr(dense, k).mean_s, strict=True))
        spread[f"{k}_mean_abs_pct"] = (
            float(100 * statistics.fmean(abs(a[b] - c[b]) / c[b] for b in both))
            if both
            else math.nan
        )
    out["repeat_spread"] = {"sizes": both, **spread}
    out["cv_within_repeats_pct"] = {
        "fw_median": float(100 * np.median(dense.fw.cv)),
        "bw_median": float(100 * np.median(dense.bw.cv)),
        "fw_max": float(100 * np.max(dense.fw.cv)),
        "bw_max": float(100 * np.max(dense.bw.cv)),
    }
    out["fit_pieces"] = {
        "probe_fw_breakpoints": list(probe.fw_fit.breakpoints),
        "probe_bw_breakpoints": list(probe.bw_fit.breakpoints),
        "dense_fw_breakpoints": list(dense.fw_fit.breakpoints),
        "dense_bw_breakpoints": list(dense.bw_fit.breakpoints),
    }
    return out


def per_step(p: ComputeProfile) -> dict[str, float]:
    return {
        "optimizer_step_s": p.optimizer_step_s,
        "copy_bytes_per_s": p.copy_bytes_per_s,
        "ddp_copy_pass_s": p.ddp_copy_s(),
    }


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "torch": str(torch.__version__),
        "python": platform.python_version(),
        "host": f"{platform.machine()} {os.cpu_count()} CPUs",
        "dtype": str(torch.get_default_dtype()).replace("torch.", ""),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cuda_matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env |= {
            "device_name": torch.cuda.get_device_name(device),
            "device_memory_bytes": int(props.total_memory),
            "multiprocessors": int(props.multi_processor_count),
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
        }
    else:
        env["device_name"] = device_type_of(device)[1]
    return env


def file_name(text: str) -> str:
    """``text`` as a file name of letters, digits, ``.``, ``_`` and ``-``."""
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in text)


def run_model(
    name: str,
    precision: str,
    args: argparse.Namespace,
    device: torch.device,
    budget_s: float,
    out: Path,
) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "model": name, "precision": precision, "size": args.size, "status": "started"
    }  # fmt: skip
    marks: dict[str, float] = {}
    settings = TrainingSettings(precision=precision)

    def progress(stage: str, done: int, total: int) -> None:
        log(f"  {name} {precision} {stage} {done}/{total or '?'}")

    t0 = time.perf_counter()
    cfg = ProfilerConfig(
        device=args.device,
        probes=args.probes,
        repeats=args.repeats,
        warmup=args.warmup,
        max_batch=args.max_batch,
        settings=settings,
    )
    probe = profile_model(name, args.size, cfg, progress=progress)
    marks["probe_profile_s"] = time.perf_counter() - t0
    fname = file_name(f"{probe.device_type.lower()}_{name}_{precision}") + ".json"
    (out / fname).write_text(probe.to_json() + "\n")
    rec |= {
        "status": "probed",
        "profile_file": fname,
        "device_type": probe.device_type,
        "b_max": probe.b_max,
        "b_max_capped": probe.b_max >= args.max_batch,
        "n_parameters": probe.n_parameters,
        "gradient_bytes": probe.gradient_bytes,
        "buckets": len(probe.buckets),
        "memory_per_sample_bytes": probe.memory_per_sample_bytes,
        "memory_fixed_bytes": probe.memory_fixed_bytes,
        "probe": {
            "sizes": list(probe.fw.batch_sizes),
            "fw_mean_s": list(probe.fw.mean_s),
            "bw_mean_s": list(probe.bw.mean_s),
            "fw_fit": probe.fw_fit.to_dict(),
            "bw_fit": probe.bw_fit.to_dict(),
            **per_step(probe),
        },
    }
    log(
        f"{name}: budgeted profile in {marks['probe_profile_s']:.1f} s: B_max {probe.b_max}, "
        f"probes {list(probe.fw.batch_sizes)}, t_iter(B_max) "
        f"{probe.fw.mean_s[-1] + probe.bw.mean_s[-1]:.4f} s, optimizer step "
        f"{probe.optimizer_step_s * 1e3:.3f} ms, copy {probe.copy_bytes_per_s / 1e9:.1f} GB/s"
    )

    steps = args.warmup + args.repeats
    want = dense_sizes(probe.b_max)
    sizes, dropped = trim_to_budget(probe, want, steps, budget_s)
    rec["dense_dropped_for_time"] = dropped
    rec["dense_predicted_s"] = predicted_seconds(probe, sizes, steps)
    log(
        f"{name}: dense sweep at {len(sizes)} sizes {sizes} (predicted "
        f"{rec['dense_predicted_s']:.0f} s, budget {budget_s:.0f} s"
        + (f", dropped {dropped}" if dropped else "")
        + ")"
    )
    t1 = time.perf_counter()
    dense_cfg = ProfilerConfig(
        device=args.device,
        batch_sizes=tuple(sizes),
        repeats=args.repeats,
        warmup=args.warmup,
        max_batch=probe.b_max,
        settings=settings,
    )
    try:
        dense = profile_model(name, args.size, dense_cfg, progress=progress)
    except BatchDoesNotFitError as exc:  # the second B_max search found a smaller B_max
        log(f"{name}: dense sweep: {exc}; retrying without B_max {probe.b_max}")
        rec["dense_retry"] = str(exc)
        sizes = [b for b in sizes if b < probe.b_max]
        dense_cfg = dataclasses.replace(dense_cfg, batch_sizes=tuple(sizes))
        dense = profile_model(name, args.size, dense_cfg, progress=progress)
    marks["dense_profile_s"] = time.perf_counter() - t1
    rec |= {
        "status": "dense",
        "b_max_second_search": dense.b_max,
        "dense": {
            "sizes": list(dense.fw.batch_sizes),
            "fw_mean_s": list(dense.fw.mean_s),
            "fw_std_s": list(dense.fw.std_s),
            "bw_mean_s": list(dense.bw.mean_s),
            "bw_std_s": list(dense.bw.std_s),
            "fw_fit": dense.fw_fit.to_dict(),
            "bw_fit": dense.bw_fit.to_dict(),
            **per_step(dense),
        },
        "eval": evaluate(probe, dense),
    }
    ev = rec["eval"]
    log(
        f"{name}: dense sweep in {marks['dense_profile_s']:.1f} s; 4-probe MAPE held-out "
        f"fw {ev['mape_fw_held_out']:.2f}% bw {ev['mape_bw_held_out']:.2f}% iter "
        f"{ev['mape_iter_held_out']:.2f}% (all sizes: iter {ev['mape_iter_all']:.2f}%; "
        f"repeat spread fw {ev['repeat_spread']['fw_mean_abs_pct']:.2f}% "
        f"bw {ev['repeat_spread']['bw_mean_abs_pct']:.2f}%)"
    )

    if device.type == "cuda" and not args.no_event_check and precision == "fp32":
        t2 = time.perf_counter()
        try:
            rec["event_crosscheck"] = event_crosscheck(
                name,
                args.size,
                device,
                [b for b in (1, 32) if b <= probe.b_max],
                args.repeats,
                args.warmup,
            )
            for r in rec["event_crosscheck"]:
                log(
                    f"{name}: B={r['batch']}: host fw {r['host_fw_s'] * 1e3:.3f} ms vs "
                    f"events {r['event_fw_s'] * 1e3:.3f} ms; host bw "
                    f"{r['host_bw_s'] * 1e3:.3f} ms vs events {r['event_bw_s'] * 1e3:.3f} ms"
                )
        except Exception as exc:  # a side check: keep the model's results
            rec["event_crosscheck_error"] = f"{type(exc).__name__}: {exc}"
            log(f"{name}: event cross-check failed: {rec['event_crosscheck_error']}")
        marks["event_check_s"] = time.perf_counter() - t2
    rec["status"] = "ok"
    rec["seconds"] = {**marks, "total_s": time.perf_counter() - t0}
    return rec


def summary(result: dict[str, Any]) -> str:
    env = result["environment"]
    lines = [
        f"GPU check on {env.get('device_name')} ({result['device']}), torch {env['torch']}, "
        f"dtype {env['dtype']} (cudnn TF32 {env['cudnn_allow_tf32']}, matmul TF32 "
        f"{env['cuda_matmul_allow_tf32']}), {result['args']['probes']} probes, "
        f"{result['args']['warmup']} warm-up + {result['args']['repeats']} timed steps, "
        f"B_max search capped at {result['args']['max_batch']}; "
        f"wall {result.get('wall_s', 0):.0f} s",
        "",
        "MAPE (%) of the 4-probe t(B) at the dense sizes it did not probe "
        "(fw / bw / iter), all dense sizes (iter), the repeat spread (fw / bw)",
    ]
    for r in result["models"]:
        if r.get("status") != "ok":
            lines.append(
                f"{r['model']} {r.get('precision')}: FAILED at {r.get('status')}: {r.get('error')}"
            )
            continue
        e = r["eval"]
        d = r["dense"]
        lines.append(
            f"{r['model']} {r['precision']}: B_max {r['b_max']}"
            f"{' (cap)' if r['b_max_capped'] else ''} "
            f"(again: {r['b_max_second_search']}), probes {r['probe']['sizes']}, "
            f"{len(d['sizes'])} dense sizes; MAPE held-out {e['mape_fw_held_out']:.2f} / "
            f"{e['mape_bw_held_out']:.2f} / {e['mape_iter_held_out']:.2f}, "
            f"all {e['mape_iter_all']:.2f}, pow2 {e['mape_iter_pow2']:.2f}; iter held-out "
            f"launch-bound {e['regions']['mape_iter_held_out_launch_bound']:.2f} "
            f"(B in {e['regions']['launch_bound_sizes']}), throughput-bound "
            f"{e['regions']['mape_iter_held_out_throughput_bound']:.2f}; "
            f"repeat spread {e['repeat_spread']['fw_mean_abs_pct']:.2f} / "
            f"{e['repeat_spread']['bw_mean_abs_pct']:.2f}"
        )
        lines.append(
            f"    {r['n_parameters']:,} parameters, {r['gradient_bytes'] / 2**20:.1f} MiB of "
            f"gradients, {r['buckets']} buckets; optimizer step "
            f"{r['probe']['optimizer_step_s'] * 1e3:.3f} / {d['optimizer_step_s'] * 1e3:.3f} ms, "
            f"copy {r['probe']['copy_bytes_per_s'] / 1e9:.1f} / "
            f"{d['copy_bytes_per_s'] / 1e9:.1f} GB/s (budgeted / dense profile); "
            f"seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in r["seconds"].items())
        )
        sizes = d["sizes"]
        lines.append(
            "    B:      " + " ".join(f"{b:>8d}" for b in sizes) + "\n"
            "    t_fw ms " + " ".join(f"{t * 1e3:8.3f}" for t in d["fw_mean_s"]) + "\n"
            "    t_bw ms " + " ".join(f"{t * 1e3:8.3f}" for t in d["bw_mean_s"])
        )
        for c in r.get("event_crosscheck", []):
            lines.append(
                f"    B={c['batch']}: host/event fw {c['host_fw_s'] * 1e3:.3f}/"
                f"{c['event_fw_s'] * 1e3:.3f} ms, bw {c['host_bw_s'] * 1e3:.3f}/"
                f"{c['event_bw_s'] * 1e3:.3f} ms"
            )
    if "train" in result:
        lines += gpu_check_train.summary_lines(result["train"])
    if "fsdp" in result:
        lines += gpu_check_fsdp.summary_lines(result["fsdp"])
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the JSON files and the summary")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", default="resnet50,hf:gpt2")
    ap.add_argument("--size", default="full", choices=("tiny", "small", "full"))
    ap.add_argument("--probes", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--max-batch", type=int, default=1024, help="upper end of the B_max search")
    ap.add_argument(
        "--budget-s", type=float, default=240, help="time for all models; trims the dense sweep"
    )
    ap.add_argument("--no-event-check", action="store_true")
    ap.add_argument(
        "--precisions", default="fp32,bf16", help="each model is profiled in each of these"
    )
    ap.add_argument("--train-model", default="resnet50", help="the built-in worker's model")
    ap.add_argument("--train-batch", type=int, default=128)
    ap.add_argument("--train-iterations", type=int, default=60)
    ap.add_argument(
        "--train-precisions", default="fp32,bf16", help="each training run in each of these"
    )
    ap.add_argument("--train-timeout-s", type=float, default=300)
    ap.add_argument("--no-train", action="store_true", help="skip the training runs")
    ap.add_argument("--fsdp-model", default="hf:gpt2")
    ap.add_argument("--fsdp-size", default="full")
    ap.add_argument("--fsdp-batches", type=int, nargs=2, default=(4, 16))
    ap.add_argument("--no-fsdp", action="store_true", help="skip the FSDP2 check")
    ap.add_argument(
        "--workdir", default=None, help="run folders of the training runs (default: a temp dir)"
    )
    args = ap.parse_args()

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(args.device)
    models = [m for m in args.models.split(",") if m]
    result: dict[str, Any] = {
        "benchmark": "gpu_check",
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": args.device,
        "args": vars(args) | {"out": None},
        "environment": environment(device),
        "models": [],
    }
    log(f"environment: {json.dumps(result['environment'])}")
    heavy = {"mlflow", "xgboost", "pydantic", "pulp", "airflow"}

    def write() -> None:
        result["heavy_modules_imported"] = sorted(heavy & {m.split(".")[0] for m in sys.modules})
        result["wall_s"] = time.perf_counter() - T_START
        (out / "gpu_check.json").write_text(
            json.dumps(finite(result), indent=1, allow_nan=False) + "\n"
        )
        (out / "summary.txt").write_text(summary(result))

    write()
    runs = [(m, p) for m in models for p in args.precisions.split(",") if p]
    for i, (name, precision) in enumerate(runs):
        remaining = args.budget_s - (time.perf_counter() - T_START)
        # the budgeted profile takes about a third of a model's time: leave the dense sweep
        # its share of what is left
        budget = max(10.0, remaining / (len(runs) - i) * 0.6)
        log(f"=== {name} {precision} ({args.size}) on {args.device}; dense budget {budget:.0f} s")
        try:
            rec = run_model(name, precision, args, device, budget, out)
        except Exception as exc:
            traceback.print_exc()
            rec = {
                "model": name, "precision": precision, "status": "failed",
                "error": f"{type(exc).__name__}: {exc}",
            }  # fmt: skip
            log(f"{name} {precision}: FAILED: {rec['error']}")
        result["models"].append(rec)
        gc.collect()
        if device.type == "cuda":
            rec["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated(device))
            torch.cuda.reset_peak_memory_stats(device)
            torch.cuda.empty_cache()
        write()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp, ThreadPoolExecutor(2) as pool:
        workdir = Path(args.workdir or tmp)
        kind = "cuda" if device.type == "cuda" else "cpu"
        train = fsdp = None
        if not args.no_train:
            log(f"=== training runs ({args.train_precisions}): worker and digits script")
            train = pool.submit(
                gpu_check_train.run_all,
                workdir,
                device="auto" if kind == "cuda" else "cpu",
                precisions=[p for p in args.train_precisions.split(",") if p],
                model=args.train_model,
                size=args.size,
                batch=args.train_batch,
                iterations=args.train_iterations,
                timeout_s=args.train_timeout_s,
                log=log,
            )
        if not args.no_fsdp:
            log(f"=== FSDP2 check: {args.fsdp_model} ({args.fsdp_size}) on {kind}")
            fsdp = pool.submit(
                gpu_check_fsdp.run,
                args.fsdp_model,
                args.fsdp_size,
                kind,
                tuple(args.fsdp_batches),
                log=log,
            )
        for key, job in (("train", train), ("fsdp", fsdp)):
            if job is None:
                continue
            try:
                result[key] = job.result()
            except Exception as exc:
                traceback.print_exc()
                result[key] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
            write()
    write()
    print(summary(result), flush=True)
    log("done")
    train = result.get("train", [])
    checks = [*result["models"], *(train if isinstance(train, list) else [train])]
    checks += [result["fsdp"]] if "fsdp" in result else []
    return 0 if all(r.get("status") == "ok" for r in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
