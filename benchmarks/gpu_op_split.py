"""Where a training step's time goes, by operator class, measured beside the roofline's split
of the same step (issue 51): the evidence that can tell the memory-bound operators'
efficiency from the matrix products', which whole published steps cannot.

    PYTHONPATH=. python3 benchmarks/gpu_op_split.py --out <folder>          # on a GPU
    PYTHONPATH=. python3 benchmarks/gpu_op_split.py --device cpu --models \\
        tests/workload_fixtures/factories.py:sized --size small --batch 8 --out <folder>

For each model (default: the three programs of Raschka's training-speed chapter in
``bf16-true`` with fused AdamW at batch 8, whose published steps are held out of every fit,
and ResNet-50 in fp32 and bf16 autocast at 64), the step runs as the profiler runs it
(``workloads.prepare``), a few warm-up steps, then ``--steps`` steps under
``torch.profiler``: each ATen operator's self time (the kernels it launched on CUDA, its
CPU time on the CPU) goes to the class the census gives it (``census_count.op_class_of``:
conv, matmul, other, norm), per step. Beside it, the roofline fitted on the shipped
evidence prices the census of the same step on this GPU's sheet, class by class (on the CPU
there is no sheet: measured only). The step's wall time, measured without the profiler,
says how much of the step the kernels cover.

Writes ``<out>/op_split.json`` (one record per model and setting; a failure is recorded
with its error and the rest go on) and prints one line per class. Nothing here is fitted:
a later fit may learn from these splits, and then they are evidence, not a held-out check.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

from srifty_core.atomic import write_text_atomic
from srifty_core.errors import ConfigError
from srifty_core.training_settings import TrainingSettings

REF = "srifty_core.profiling.reference_models:"
DEFAULT_RUNS = (
    (REF + "gpt2_from_scratch", "bf16-true", "adamw_fused", 8),
    (REF + "gpt2_torch_layers", "bf16-true", "adamw_fused", 8),
    (REF + "gpt2_sdpa", "bf16-true", "adamw_fused", 8),
    ("resnet50", "fp32", "sgd", 64),
    ("resnet50", "bf16", "sgd", 64),
)
"""(model, precision, optimizer, batch) measured by default."""


def measured_split(
    model: str,
    size: str,
    settings: TrainingSettings,
    batch: int,
    device: Any,
    steps: int,
    warmup: int,
) -> dict[str, Any]:
    """Per class, the self time (ms a step) and operators a step of ``model`` under the
    profiler, and the step's wall time without it."""
    from torch.profiler import ProfilerActivity, profile

    from srifty_core.profiling.census_count import CLASSES, op_class_of
    from srifty_core.profiling.device import sync_fn
    from srifty_core.workloads import build, make_optimizer, prepare

    w = build(model, size, seed=0)
    w.module.to(device)
    w.module.train()
    runs_in = prepare(w, settings, autocast=True)
    opt = make_optimizer(settings, [p for p in w.module.parameters() if p.requires_grad], 1e-3)
    data = w.make_batch(batch, device, seed=0)
    sync = sync_fn(device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        w.loss(data).backward()
        opt.step()

    for _ in range(warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    wall = (time.perf_counter() - t0) / steps
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync()
    ms = dict.fromkeys(CLASSES, 0.0)
    ops = dict.fromkeys(CLASSES, 0)
    for evt in prof.key_averages():
        if not evt.key.startswith("aten::"):
            continue
        cls = CLASSES[op_class_of(evt.key.removeprefix("aten::"))]
        us = evt.self_device_time_total if cuda else evt.self_cpu_time_total
        ms[cls] += us / 1e3 / steps
        ops[cls] += round(evt.count / steps)
    return {
        "runs_in": runs_in,
        "step_ms_wall": wall * 1e3,
        "measured_ms": ms,
        "measured_ops": ops,
    }


@functools.cache
def _sheet_and_fit(device_type: str) -> tuple[Any, Any] | None:
    """``device_type``'s sheet and the roofline fitted on the shipped evidence (fitted once
    for all the runs: a device's time is scarce); None where the catalog has no sheet."""
    from srifty_core.catalog import Catalog
    from srifty_core.profiling import estimate

    catalog = Catalog.load()
    spec = estimate.device_spec(catalog, device_type)
    return None if spec is None else (spec, estimate.roofline_for(catalog, None)[0])


def predicted_split(
    model: str, size: str, settings: TrainingSettings, batch: int, device_type: str
) -> dict[str, float] | None:
    """Per class, the roofline's ms a step on ``device_type``'s sheet (None: no sheet)."""
    import numpy as np

    from srifty_core.predictors import roofline as rl
    from srifty_core.profiling import estimate
    from srifty_core.profiling.census import load_census
    from srifty_core.profiling.census_count import CLASSES

    found = _sheet_and_fit(device_type)
    if found is None:
        return None
    spec, fitted = found
    census = load_census(model, size, estimate.census_settings(settings))
    mode = rl.mode_of(settings.precision, settings.tf32)
    phase, cls = np.asarray(census.phase), np.asarray(census.op_class)
    out = dict.fromkeys(CLASSES, 0.0)
    for ph in range(3):
        times = rl.op_times(census, spec, mode, fitted.efficiencies, batch, ph)
        for k, name in enumerate(CLASSES):
            out[name] += float(times[cls[phase == ph] == k].sum()) * 1e3
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/gpu_op_split.py", description=__doc__)
    ap.add_argument("--out", type=Path, required=True, help="folder for op_split.json")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument(
        "--models",
        help="comma-separated model references (default: the module doc's runs); each "
        "with --precision, --optimizer and --batch",
    )
    ap.add_argument("--size", default="full")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--optimizer", default="sgd")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    import torch

    from srifty_core.profiling.device import device_type_of

    if args.batch < 1 or args.steps < 1 or args.warmup < 0:
        ap.exit(2, f"{ap.prog}: error: --batch and --steps must be >= 1, --warmup >= 0\n")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.exit(2, f"{ap.prog}: error: --device cuda: no CUDA device here (try --device cpu)\n")
    device = torch.device(args.device)
    runs = (
        [(m, args.precision, args.optimizer, args.batch) for m in args.models.split(",") if m]
        if args.models
        else list(DEFAULT_RUNS)
    )
    try:
        for _, precision, optimizer, _ in runs:
            TrainingSettings(precision=precision, optimizer=optimizer)
    except ConfigError as exc:
        ap.exit(2, f"{ap.prog}: error: {exc}\n")
    device_type, device_name = device_type_of(device)
    records = []
    for model, precision, optimizer, batch in runs:
        settings = TrainingSettings(precision=precision, optimizer=optimizer)
        size = args.size if args.models else "full"
        rec: dict[str, Any] = {
            "model": model,
            "size": size,
            "settings": settings.to_dict(),
            "batch": batch,
            "device_type": device_type,
            "device_name": device_name,
        }
        try:
            rec |= measured_split(model, size, settings, batch, device, args.steps, args.warmup)
            rec["predicted_ms"] = predicted_split(model, size, settings, batch, device_type)
            rec["status"] = "ok"
        except Exception as exc:  # recorded; the other runs go on
            rec |= {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        records.append(rec)
        print(f"{model} {settings.label()} at {batch} on {device_name}: {rec['status']}")
        if rec["status"] == "ok":
            kernels = sum(rec["measured_ms"].values())
            print(f"  step {rec['step_ms_wall']:.1f} ms wall, {kernels:.1f} ms in operators")
            for cls, got in rec["measured_ms"].items():
                pred = (rec["predicted_ms"] or {}).get(cls)
                said = f", roofline {pred:.1f} ms" if pred is not None else ""
                print(f"  {cls:7s} {got:8.1f} ms ({rec['measured_ops'][cls]} operators){said}")
        else:
            print(f"  {rec['error']}")
        args.out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.out / "op_split.json", json.dumps(records, indent=1))
    return 0 if all(r["status"] == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
