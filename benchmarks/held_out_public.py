"""The compute roofline on published rows no fit has seen: BERT-large and ResNeXt-101.

    .venv/bin/python benchmarks/held_out_public.py  # 5 s; writes results/held_out_public.json

``shipped/reference/public_training_throughput.csv`` carries single-GPU rows of BERT-large
SQuAD fine-tuning (sequence 384; NVIDIA DeepLearningExamples' READMEs and Lambda's tables:
A10, A100 40/80 GB, H100, H200, V100; TF32/FP32 and AMP) and of ResNeXt101-32x4d (NVIDIA;
A100 80 GB, V100 16/32 GB), and a GPT-2-shaped decoder's eager FP32/TF32 and pure-bf16
(``bf16-true``) steps (Raschka's *LLMs from scratch*, one A100 of unstated memory; the bf16
ones also with torch's LayerNorm and GELU, then with scaled-dot-product attention), with
the memory the allocator reserved where the source prints it. Their networks have no zoo name, so
``profiling.estimate`` never learns from them: they are held out of every fit and every
choice. Here their networks are
counted (``workloads/reference_models.py``; the censuses ship) and each row is predicted
by the roofline fitted on all the evidence the estimate learns from:

* **specs**: the row's step time from its GPU's sheet (NVIDIA's BERT as the program it is:
  ``Observation.fused``, the factor learned from the BERT-base rows);
* **scaled**: from each row of the same program (source, network, precision) on another GPU,
  through ``roofline.scale`` with the fitted ``carry`` (a user who measured one GPU);
* **fits**: whether the published batch fits the estimate's ``B_max`` (the eager program's
  memory, as an estimate plans it);
* **p90 covers**: whether the published step is at most the p90 a plan checks for it: the
  specs prediction times ``exp(z90 * sd)``, ``sd`` the estimate's own spread
  (``estimate_cv``, the roofline's held-out ``specs_cv``) alone, and in quadrature with
  the simulator's prior floor for a VM's speed (``calibration.PRIOR_FLOOR``: what a plan
  adds where no VM spread was measured on that GPU); for the scaled path, whether each
  pair's prediction times ``exp(z90 * scaled_cv)`` covers the published step.

The error is (predicted - published) / published of the step time (batch over samples/s).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from statistics import NormalDist

from srifty_core.atomic import write_text_atomic
from srifty_core.catalog import Catalog
from srifty_core.predictors import roofline as rl
from srifty_core.profiling import estimate
from srifty_core.profiling.census import load_census
from srifty_core.profiling.roofline_profile import estimate_profile, memory_lines
from srifty_core.simulator.calibration import PRIOR_FLOOR
from srifty_core.training_settings import OPTIMIZER_STATES, TrainingSettings

OUT = Path(__file__).parent / "results" / "held_out_public.json"
REF = "srifty_core.profiling.reference_models:"
HELD_OUT = {
    # published name: (reference, optimizer, family, NVIDIA's fused program)
    "bert_large_squad": (REF + "bert_large_squad", "adamw", "transformer encoder", True),
    "resnext101-32x4d": (REF + "resnext101_32x4d", "sgd", "CNN", False),
    "gpt2_from_scratch": (REF + "gpt2_from_scratch", "adamw", "transformer decoder", False),
    "gpt2_from_scratch+fused_adamw": (
        REF + "gpt2_from_scratch", "adamw_fused", "transformer decoder", False,
    ),
    "gpt2_torch_layers+fused_adamw": (
        REF + "gpt2_torch_layers", "adamw_fused", "transformer decoder", False,
    ),
    "gpt2_sdpa+fused_adamw": (REF + "gpt2_sdpa", "adamw_fused", "transformer decoder", False),
}  # fmt: skip
UNSTATED = {"A100 (memory not stated)": ("A100 SXM4 40GB (DGX A100)", "A100 SXM4 80GB")}
"""A row whose source does not say which variant: scored on the first sheet, and on the
second for the record (``alt_specs_error``)."""
SETTINGS = {
    "fp32": {},
    "tf32": {"tf32": True},
    "amp": {"precision": "fp16"},
    "bf16-true": {"precision": "bf16-true", "tf32": True},
}
"""A published precision as the training settings that ran it."""
RESERVED = re.compile(r"'Reserved memory: ([0-9.]+) GB'")
"""A row whose note quotes the memory PyTorch's allocator reserved (Raschka's rows; printed
as "GB" for ``torch.cuda.memory_reserved() / 1024**3``, so GiB): an upper bound of the
step's peak, which the estimate's memory is compared with."""


def settings_of(r: dict[str, str]) -> TrainingSettings:
    return TrainingSettings(optimizer=HELD_OUT[r["model"]][1], **SETTINGS[r["precision"]])


def held_out_rows(specs: dict[str, rl.DeviceSpec]) -> list[tuple[dict[str, str], rl.Observation]]:
    out = []
    with estimate.PUBLIC_THROUGHPUT.open(newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            spec = specs.get(UNSTATED.get(r["gpu_variant"], (r["gpu_variant"],))[0])
            if r["model"] not in HELD_OUT or spec is None or r["gpus"] != "1" or r["zoo_model"]:
                continue
            ref, _, _, fused = HELD_OUT[r["model"]]
            settings = settings_of(r)
            counted = estimate.census_settings(settings)
            if counted.precision == "bf16":  # NVIDIA's BERT ran attention as separate
                counted = TrainingSettings(optimizer=settings.optimizer)  # kernels: the math path
            census = load_census(ref, "full", counted, count=False)
            b = int(r["batch_per_gpu"])
            seconds = b / float(r["throughput_per_s"])
            mode = rl.mode_of(settings.precision, settings.tf32)
            obs = rl.Observation(
                census, spec, mode, b, seconds, "step", r["source_id"], spec.chip, fused
            )
            out.append((r, obs))
    return out


def generations(catalog: Catalog) -> dict[str, str]:
    """Per GPU model the catalog sells, its architecture without the die (``Hopper``)."""
    return {
        t.gpu.model: t.gpu.architecture.split(" (")[0] for t in catalog.types if t.gpu is not None
    }


def generation(chip: str, known: dict[str, str]) -> str:
    """A chip's architecture: the catalog's, else that of the catalog model its name starts
    (``H100 PCIe``: ``H100``) or that starts with it (``A10``: ``A10G``, the same die)."""
    for model, arch in sorted(known.items(), key=lambda kv: -len(kv[0])):
        if chip == model or chip.startswith(model + " ") or model.startswith(chip):
            return arch
    return chip


def _median_abs(errs: list[float]) -> float:
    return statistics.median(abs(e) for e in errs) if errs else float("nan")


def main() -> int:
    t0 = time.perf_counter()
    catalog = Catalog.load()
    evidence, _ = estimate.evidence(catalog, store=None)
    fitted = rl.learn(evidence)
    specs = estimate.evidence_specs(catalog)
    rows = held_out_rows(specs)
    archs = generations(catalog)
    assert not {id(o.census) for _, o in rows} & {id(o.census) for o in evidence}
    pred = {id(o): rl.predict(o, fitted.efficiencies) for _, o in rows}
    z90 = NormalDist().inv_cdf(0.9)
    out = []
    for r, o in rows:
        scaled = [
            rl.scale(s.seconds, pred[id(s)], pred[id(o)], fitted.carry) / o.seconds - 1.0
            for _, s in rows
            if s.device.chip != o.device.chip and o.same_program(s)
        ]
        family = HELD_OUT[r["model"]][2]
        settings = settings_of(r)
        alt = None
        if r["gpu_variant"] in UNSTATED:
            other = dataclasses.replace(o, device=specs[UNSTATED[r["gpu_variant"]][1]])
            alt = rl.predict(other, fitted.efficiencies) / o.seconds - 1.0
        profile = estimate_profile(
            dataclasses.replace(o.census, settings=settings), o.device, fitted
        )
        sds = (profile.estimate_cv, math.hypot(PRIOR_FLOOR, profile.estimate_cv))
        covers = [pred[id(o)] * math.exp(z90 * sd) >= o.seconds for sd in sds]
        spread = math.exp(z90 * profile.estimate_cv)  # the p10-p90 band holds it?
        inside = pred[id(o)] / spread <= o.seconds <= pred[id(o)] * spread
        band = math.exp(z90 * fitted.scaled_cv)  # a scaled estimate's own p90
        reserved = RESERVED.search(r["notes"])
        states = OPTIMIZER_STATES[settings.optimizer]
        saved_line, *moments = memory_lines(o.census, states, settings.precision)
        saved_at = saved_line[0] + saved_line[1] * o.batch
        peak_at = max((a + b * o.batch for a, b in moments), default=None)
        scaled_covers = [(1.0 + e) * band >= 1.0 for e in scaled]
        out.append(
            {
                "source": r["source_id"],
                "model": r["model"],
                "family": family,
                "published_variant": r["gpu_variant"],
                "chip": o.device.chip,
                "generation": generation(o.device.chip, archs),
                "precision": r["precision"],
                "batch": o.batch,
                "published_s": o.seconds,
                "specs_error": pred[id(o)] / o.seconds - 1.0,
                "alt_specs_error": alt,
                "scaled_errors": scaled,
                "b_max": profile.b_max,
                "fits": o.batch <= profile.b_max,
                "estimate_cv": profile.estimate_cv,
                "p90_covers": covers[0],
                "p90_covers_with_prior": covers[1],
                "scaled_p90_covers": scaled_covers,
                "inside_p10_p90": inside,
                # what B_max checks: the larger of the two below (``batch_limit``)
                "memory_gib": max(saved_at, peak_at or 0.0) / 2**30,
                # the saved tensors, the weights, their gradients and the optimizer's state
                "saved_gib": saved_at / 2**30,
                # the most the passes hold at once, plus the weights and optimizer states
                "peak_gib": peak_at / 2**30 if peak_at is not None else None,
                "reserved_gib": float(reserved.group(1)) if reserved else None,
            }
        )
    groups: dict[str, list[dict[str, object]]] = defaultdict(list)
    for x in out:
        for key in (
            f"{x['model']} on {x['chip']}",
            f"{x['model']} {x['precision']}",
            f"{x['family']} {x['precision']}",
            f"{x['family']} on {x['generation']}",
            f"{x['family']}",
            "all",
        ):
            groups[key].append(x)
    summary = {
        k: {
            "rows": len(v),
            "specs": _median_abs([float(x["specs_error"]) for x in v]),  # type: ignore[arg-type]
            "specs_signed": statistics.median(float(x["specs_error"]) for x in v),  # type: ignore[arg-type]
            "scaled": _median_abs([e for x in v for e in x["scaled_errors"]]),  # type: ignore[attr-defined]
            "scaled_pairs": sum(len(x["scaled_errors"]) for x in v),  # type: ignore[arg-type]
            "fits": sum(bool(x["fits"]) for x in v),
            "p90_covers": sum(bool(x["p90_covers"]) for x in v),
            "p90_covers_with_prior": sum(bool(x["p90_covers_with_prior"]) for x in v),
            "scaled_p90_covers": sum(sum(x["scaled_p90_covers"]) for x in v),  # type: ignore[arg-type]
            "inside_p10_p90": sum(bool(x["inside_p10_p90"]) for x in v),
        }
        for k, v in sorted(groups.items())
    }
    in_sample = [rl.predict(o, fitted.efficiencies) / o.seconds - 1.0 for o in evidence]
    result = {
        "rows": out,
        "summary": summary,
        "in_sample_median_abs": _median_abs(in_sample),
        "evidence_observations": len(evidence),
        "seconds": time.perf_counter() - t0,
    }
    write_text_atomic(OUT, json.dumps(result, indent=1))
    head = ("held out", "rows", "specs", "signed", "scaled", "pairs")
    print("{:34s} {:>4s} {:>7s} {:>7s} {:>7s} {:>5s} fits  p90 covers (+prior)".format(*head))
    for k, s in summary.items():
        print(
            f"{k:34s} {s['rows']:4d} {s['specs']:7.1%} {s['specs_signed']:+7.1%} "
            f"{s['scaled']:7.1%} {s['scaled_pairs']:5d} {s['fits']:2d}/{s['rows']:<2d}  "
            f"{s['p90_covers']:2d} ({s['p90_covers_with_prior']})"
        )
    total = summary["all"]
    print(
        f"the estimates' spreads (held out in-sample): by GPU specs_cv {fitted.specs_cv:.3f}, "
        f"by network model_cv {fitted.model_cv:.3f} (these networks carry both: "
        f"{fitted.spec_cv(''):.3f}), scaled_cv {fitted.scaled_cv:.3f}; the scaled p90 covers "
        f"{total['scaled_p90_covers']} of {total['scaled_pairs']} held-out pairs; "
        f"{total['inside_p10_p90']} of {total['rows']} rows inside the specs' p10-p90 (80% "
        "if the spread were right and unbiased)"
    )
    for x in out:
        if x["reserved_gib"] is not None:
            print(
                f"memory, {x['model']} {x['precision']} at {x['batch']}: the estimate's "
                f"{x['memory_gib']:.2f} GiB against {x['reserved_gib']:.2f} GiB reserved by "
                f"the allocator ({float(x['memory_gib']) / float(x['reserved_gib']) - 1:+.0%};"  # type: ignore[arg-type]
                f" the saved tensors and state {x['saved_gib']:.2f} GiB"
                + (f", the passes' peak and state {x['peak_gib']:.2f} GiB" if x["peak_gib"] else "")
                + ")"
            )
    print(
        f"in-sample (the {len(evidence)} observations fitted on): median |error| "
        f"{result['in_sample_median_abs']:.1%}; {time.perf_counter() - t0:.0f} s; {OUT}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
