"""How a model trains, as far as its step time depends on it: precision, optimizer,
``torch.compile``, the channels-last memory format and TF32 matrix products.

A profile is taken with one setting (``srifty profile --precision bf16 --optimizer adamw``)
and records it; a request and a training plan name the setting they train with, and the
planner reads the profile taken with that setting (the profile store keeps one file per
setting: ``<device>.json`` for the defaults, ``<device>@adamw+bf16.json`` otherwise). AdamW's
step reads and writes three states per parameter where SGD with momentum touches one, so
the same network's optimizer step costs more, and the simulator sees it through the
profile's measured ``optimizer_step_s``. No torch here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from srifty_core.errors import ConfigError

PRECISIONS = ("fp32", "fp16", "bf16", "bf16-true")
"""``fp32``; ``fp16`` (autocast and a gradient scaler); ``bf16`` (autocast: float32
parameters, gradients and optimizer states) on GPUs; ``bf16-true`` (Lightning's name):
the model cast to bf16 (``model.to(torch.bfloat16)``), so parameters, gradients,
optimizer states and activations are all 2-byte, with no autocast and no float32 copy.
CPU workers compute in the plan's dtype whatever the precision (``worker.placement``). The
one list: a train plan's and a profile's."""
AUTOCAST = ("fp16", "bf16")
"""The precisions run under autocast: float32 parameters, gradients and optimizer states,
2-byte outputs where autocast lowers an operator."""
BF16 = ("bf16", "bf16-true")
"""The precisions that need bf16 on every GPU of a group (else all fall back to fp16)."""
STATE_BYTES = {"fp32": 4, "fp16": 4, "bf16": 4, "bf16-true": 2}
"""Per precision, the bytes of a parameter, its gradient and each optimizer state
element: float32 under autocast, bf16 where the model is cast."""
OPTIMIZER_STATES = {"sgd": 1, "adamw": 2, "adamw_fused": 2}
"""Per optimizer, its float32 states per parameter: SGD's momentum buffer; AdamW's two
moments."""
OPTIMIZERS = tuple(OPTIMIZER_STATES)
"""``sgd`` (with the plan's momentum); ``adamw`` (torch's, weight decay 0.01, its default
multi-tensor kernels on GPUs); ``adamw_fused`` (the same update with ``fused=True``: one
kernel per step for all parameters, as Hugging Face's ``adamw_torch_fused`` runs it)."""


@dataclass(frozen=True, slots=True)
class TrainingSettings:
    """The step-time-relevant training settings (module doc). Defaults: fp32, SGD, eager,
    contiguous."""

    precision: str = "fp32"
    optimizer: str = "sgd"
    compile: bool = False
    """``torch.compile`` the module before training (and before profiling)."""
    channels_last: bool = False
    """Module and 4-D inputs in ``torch.channels_last`` memory format (vision models)."""
    tf32: bool = False
    """Matrix products and convolutions in TF32 on the tensor cores of GPUs that have them
    (Ampere and later: ``torch.backends.cuda.matmul.allow_tf32`` and
    ``torch.backends.cudnn.allow_tf32``), as NVIDIA's containers run; off, PyTorch's
    defaults: convolutions in TF32, matrix products in FP32 on the vector units."""

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"precision: must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
            )
        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(
                f"optimizer: must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}"
            )
        for name in ("compile", "channels_last", "tf32"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}: must be true or false, got {getattr(self, name)!r}")

    @property
    def is_default(self) -> bool:
        return self == DEFAULT_SETTINGS

    @property
    def suffix(self) -> str:
        """``""`` for the defaults, else ``@`` and what differs (``@adamw+bf16+compile``):
        the profile store's file name is the device type and this."""
        parts = []
        if self.optimizer != "sgd":
            parts.append(self.optimizer)
        if self.precision != "fp32":
            parts.append(self.precision)
        if self.compile:
            parts.append("compile")
        if self.channels_last:
            parts.append("channels_last")
        if self.tf32:
            parts.append("tf32")
        return "@" + "+".join(parts) if parts else ""

    def label(self) -> str:
        """For people: ``fp32, sgd`` and what else is on."""
        extra = [n for n in ("compile", "channels_last", "tf32") if getattr(self, n)]
        return ", ".join([self.precision, self.optimizer, *extra])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> TrainingSettings:
        """From a mapping with any of the five keys (others are ignored: a request or a
        plan holds these among its fields); missing keys take the defaults."""
        if not d:
            return DEFAULT_SETTINGS
        return cls(
            precision=d.get("precision", "fp32"),
            optimizer=d.get("optimizer", "sgd"),
            compile=d.get("compile", False),
            channels_last=d.get("channels_last", False),
            tf32=d.get("tf32", False),
        )


DEFAULT_SETTINGS = TrainingSettings()
