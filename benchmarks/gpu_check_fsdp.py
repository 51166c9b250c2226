"""GPU check, sharding (issue 53 item 4; issue 50 item 2): FSDP2 steps on CUDA through the
project's own wrapper (``sharding.wrap``, one GPU, NCCL), read with
``measure.sharded_memory.rank_peaks`` and set against ``sharding.memory``.

1. **Same training, DDP or FSDP2**: fp32 AdamW steps on the same data under both; the
   losses must agree (a group of one: the sharded step is the whole step).
2. **Memory on CUDA**: bf16 (FSDP's mixed-precision policy, autocast for DDP) at two local
   batches under each strategy: the allocator's peak and what is held after the step,
   against the memory model with activations per sample measured from the DDP pair (as
   ``benchmarks/sharded_memory.py`` does on the CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from srifty_core.measure.sharded_memory import RankReading, rank_peaks
from srifty_core.sharding.memory import Layout, ModelMemory, rank_memory
from srifty_core.sharding.units import unit_parameters
from srifty_core.training_settings import TrainingSettings
from srifty_core.workloads import build

MIB = 2**20


def run(
    model: str,
    size: str,
    device: str,
    batches: tuple[int, int],
    steps: int = 3,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    one = Layout("ddp", 1)
    fsdp = Layout("fsdp", 1)
    fp32 = TrainingSettings(optimizer="adamw")
    b1, b2 = batches

    def read(layout: Layout, settings: TrainingSettings, batch: int) -> RankReading:
        r = rank_peaks(model, size, layout, batch, settings=settings, steps=steps, device=device)
        log(
            f"fsdp check: {layout.strategy} {settings.precision} batch {batch}: peak "
            f"{r[0].peak / MIB:.0f} MiB, held {r[0].held / MIB:.0f} MiB, losses "
            + ", ".join(f"{v:.6f}" for v in r[0].losses)
        )
        return r[0]

    out: dict[str, Any] = {"model": model, "size": size, "device": device, "steps": steps}
    ddp32, fsdp32 = read(one, fp32, b1), read(fsdp, fp32, b1)
    worst = max(
        abs(a - b) / max(abs(a), 1e-12) for a, b in zip(ddp32.losses, fsdp32.losses, strict=True)
    )
    out["same_training"] = {
        "ddp_losses": list(ddp32.losses),
        "fsdp_losses": list(fsdp32.losses),
        "max_relative_difference": worst,
        "ok": worst < 1e-4,
    }
    settings = TrainingSettings(precision="bf16", optimizer="adamw")
    ddp = [read(one, settings, b) for b in batches]
    per_sample = (ddp[1].peak - ddp[0].peak) / (b2 - b1)
    memory = ModelMemory(unit_parameters(build(model, size).module), max(0.0, per_sample))
    rows = []
    for layout, readings in (
        (one, ddp),
        (fsdp, [read(fsdp, settings, b) for b in batches]),
    ):
        for b, m in zip(batches, readings, strict=True):
            r = rank_memory(memory, settings, layout, b)
            held = r.parameters + r.gradients + r.optimizer
            rows.append(
                {
                    "strategy": layout.strategy,
                    "batch": b,
                    "measured_peak_mib": round(m.peak / MIB, 1),
                    "predicted_peak_mib": round(r.total / MIB, 1),
                    "peak_error": round(r.total / m.peak - 1, 3),
                    "measured_held_mib": round(m.held / MIB, 1),
                    "predicted_held_mib": round(held / MIB, 1),
                    "held_error": round(held / m.held - 1, 3),
                    "losses": list(m.losses),
                }
            )
    out |= {
        "per_sample_mib": round(per_sample / MIB, 2),
        "parameters": memory.parameters,
        "rows": rows,
        "status": "ok" if out["same_training"]["ok"] else "failed",
    }
    return out


def summary_lines(rec: dict[str, Any]) -> list[str]:
    if "rows" not in rec:
        return [f"fsdp check: FAILED {rec.get('error')}"]
    same = rec["same_training"]
    lines = [
        f"fsdp check ({rec['model']} {rec['size']}, {rec['parameters']:,} parameters, AdamW, "
        f"one rank on {rec['device']}): fp32 losses DDP vs FSDP2 max relative difference "
        f"{same['max_relative_difference']:.2e} ({'ok' if same['ok'] else 'DIFFER'}); "
        f"bf16 activations {rec['per_sample_mib']} MiB a sample"
    ]
    for r in rec["rows"]:
        lines.append(
            f"    {r['strategy']} bf16 batch {r['batch']}: peak {r['measured_peak_mib']} MiB "
            f"(model {r['predicted_peak_mib']}, {r['peak_error']:+.1%}), held "
            f"{r['measured_held_mib']} MiB (model {r['predicted_held_mib']}, "
            f"{r['held_error']:+.1%})"
        )
    return lines
