"""Training settings applied to a built model, as training runs it: channels-last,
``torch.compile``, the precision a rank computes in (``choose_precision``) and the
optimizer (``make_optimizer``). The worker and the profiler both call these, so a profile
times what training runs. Light to import: torch is imported when a function runs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from srifty_core.errors import ConfigError
from srifty_core.training_settings import AUTOCAST, BF16, PRECISIONS

if TYPE_CHECKING:
    from srifty_core.training_settings import TrainingSettings
    from srifty_core.workloads.zoo import Workload

__all__ = ["cast_to_bf16", "choose_precision", "make_optimizer", "prepare", "set_tf32"]


def choose_precision(precision: str, device_type: str, bf16_everywhere: bool) -> str:
    """The precision a rank computes in: ``fp32`` on the CPU and when the plan says so;
    on CUDA ``fp16``, or ``bf16``/``bf16-true`` when every rank's GPU supports bf16 (else
    ``fp16``: autocast with a gradient scaler). ``bf16_everywhere`` must be the same on
    every rank (``train`` agrees on it with an allreduce), so that all ranks scale their
    gradients alike."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision: must be one of {list(PRECISIONS)}, got {precision!r}")
    if precision == "fp32" or device_type != "cuda":
        return "fp32"
    if precision in BF16 and not bf16_everywhere:
        return "fp16"
    return precision


def cast_to_bf16(workload: Workload) -> None:
    """``bf16-true``: the module's floating parameters and buffers, and the floating
    tensors of every batch it is given, in bf16 (integer inputs such as token ids are
    left as they are), in place."""
    import torch

    workload.module.to(torch.bfloat16)
    inner_make = workload._make_batch

    def make(b: int, dev: torch.device, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        return tuple(
            t.to(torch.bfloat16) if t.is_floating_point() else t for t in inner_make(b, dev, gen)
        )

    workload._make_batch = make


def set_tf32(on: bool, device_type: str) -> None:
    """Matrix products in TF32 (``on``) or FP32 on CUDA, process-wide; convolutions keep
    cuDNN's default (TF32). Nothing on the CPU, whose float32 stays exact."""
    import torch

    if device_type == "cuda":
        torch.set_float32_matmul_precision("high" if on else "highest")


def prepare(
    workload: Workload,
    settings: TrainingSettings,
    autocast: bool = False,
    precision: str | None = None,
) -> str:
    """Apply ``settings`` to a built workload in place, on the device its module is on, as
    training runs it: TF32 matrix products (``set_tf32``), the model and its floating
    inputs cast to bf16 where ``bf16-true`` runs (``cast_to_bf16``), channels-last module
    and 4-D inputs, ``torch.compile`` of its forward (the state dict keeps its keys), and
    with ``autocast`` (the profiler: the worker's step has its own) the loss under
    ``torch.autocast`` of the precision that runs there. ``precision``: the one the ranks
    agreed on (``worker.agreed_precision``), else this GPU's ``choose_precision``.
    Returns that precision (fp32 on a CPU)."""
    import torch

    params = list(workload.module.parameters())
    device = params[0].device if params else torch.device("cpu")
    if precision is None:
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        precision = choose_precision(settings.precision, device.type, bf16)
    set_tf32(settings.tf32, device.type)
    if precision == "bf16-true":
        cast_to_bf16(workload)
    if settings.channels_last:
        workload.module.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        inner_make = workload._make_batch

        def make(b: int, dev: torch.device, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
            return tuple(
                t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t
                for t in inner_make(b, dev, gen)
            )

        workload._make_batch = make
    if settings.compile:
        # the instance's forward, compiled: the state dict keeps its keys (a checkpoint
        # loads compiled or not). nn.Module.compile() left this torch build's calls eager.
        module = workload.module
        module.forward = torch.compile(module.forward)
    if autocast and precision in AUTOCAST:
        inner_loss = workload._loss
        dtype = torch.bfloat16 if precision == "bf16" else torch.float16

        def loss(m: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
            with torch.autocast(device_type=device.type, dtype=dtype):
                return inner_loss(m, batch)

        workload._loss = loss
    return precision


def make_optimizer(
    settings: TrainingSettings, params: Any, lr: float, momentum: float = 0.9
) -> Any:
    """The optimizer ``settings`` name over ``params``: SGD with ``momentum``, or AdamW
    (betas 0.9/0.999, weight decay 0.01; ``adamw_fused``: torch's fused kernel, on the CPU
    too). The worker trains with it and the profiler times its step."""
    import torch

    if settings.optimizer in ("adamw", "adamw_fused"):
        fused = settings.optimizer == "adamw_fused" or None
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.01, fused=fused)
    return torch.optim.SGD(params, lr=lr, momentum=momentum)
