"""What one rank holds while training, per strategy, and the largest local batch that fits.

Contract: ``rank_memory(model, settings, layout, batch)`` is the peak bytes of one rank,
split by what holds them; ``b_max`` the largest batch whose peak stays within a device's
memory. Bytes per parameter follow from the dtypes PyTorch keeps (fp32 parameters and
gradients under autocast, bf16 under ``bf16-true``, one state for SGD with momentum, two
for AdamW); what a model's activations take per sample comes from a measurement (a
profile's B_max search, or the census's saved tensors) and is an input here. No torch.
Derivation and the check against measured memory: docs/design/sharding.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from srifty_core.errors import ConfigError
from srifty_core.training_settings import OPTIMIZER_STATES, STATE_BYTES, TrainingSettings

Strategy = Literal["ddp", "fsdp", "hsdp"]
STRATEGIES: tuple[Strategy, ...] = get_args(Strategy)
"""``ddp``: every rank holds the whole model. ``fsdp``: parameters, gradients and optimizer
states sharded over every rank. ``hsdp``: sharded over the ranks of one VM, replicated across
VMs."""

FP32 = 4
"""Bytes of a float32: parameters, gradients and optimizer states are float32 under every
precision but ``bf16-true`` (autocast computes in bf16/fp16, the parameters stay float32;
``training_settings.STATE_BYTES``)."""
USABLE = 0.9
"""The share of a device's memory a step may fill (the rest: the framework's own
allocations and fragmentation)."""


def parse_strategy(value: object, field: str = "strategy") -> Strategy:
    """``value`` as a strategy, or a one-line error naming ``field``."""
    if value not in STRATEGIES:
        raise ConfigError(f"{field}: must be one of {', '.join(STRATEGIES)}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Layout:
    """How the ranks of a configuration are arranged: ``world`` ranks in all,
    ``ranks_per_vm`` on each VM, and the strategy."""

    strategy: Strategy
    world: int
    ranks_per_vm: int = 1

    def __post_init__(self) -> None:
        parse_strategy(self.strategy)
        if self.world < 1:
            raise ConfigError(f"world: must be at least 1, got {self.world}")
        if not 1 <= self.ranks_per_vm <= self.world:
            raise ConfigError(
                f"ranks_per_vm: must be between 1 and world ({self.world}), got {self.ranks_per_vm}"
            )

    @property
    def shard_degree(self) -> int:
        """Over how many ranks each parameter's state is split."""
        if self.strategy == "fsdp":
            return self.world
        if self.strategy == "hsdp":
            return self.ranks_per_vm
        return 1


@dataclass(frozen=True, slots=True)
class ModelMemory:
    """What a model needs, independent of the strategy.

    ``unit_parameters``: the trainable parameters of each unit FSDP shards and gathers as
    one (``sharding.units``), the root's own (those in no unit) first; their sum is the
    model's trainable parameters. ``activation_bytes_per_sample`` and
    ``activation_bytes_fixed``: what one step holds beyond the training state, per sample of
    the local batch and fixed (measured)."""

    unit_parameters: tuple[int, ...]
    activation_bytes_per_sample: float
    activation_bytes_fixed: float = 0.0

    def __post_init__(self) -> None:
        if not self.unit_parameters or any(n < 0 for n in self.unit_parameters):
            raise ConfigError("unit_parameters: a non-empty list of counts >= 0")
        if self.activation_bytes_per_sample < 0 or self.activation_bytes_fixed < 0:
            raise ConfigError("activation bytes: must be >= 0")

    @property
    def parameters(self) -> int:
        return sum(self.unit_parameters)

    @property
    def root_parameters(self) -> int:
        return self.unit_parameters[0]

    @property
    def largest_unit(self) -> int:
        """The largest sharded unit (the root's own parameters are not one)."""
        return max(self.unit_parameters[1:], default=0)


@dataclass(frozen=True, slots=True)
class RankMemory:
    """The peak bytes of one rank, by what holds them."""

    parameters: float
    gradients: float
    optimizer: float
    communication: float
    """DDP: its gradient buckets (a flat copy of every gradient). FSDP/HSDP: the unsharded
    root, and the gathered units at the peak (the one computing and the one prefetched,
    their parameters and, in the backward pass, its unsharded gradients)."""
    activations: float

    @property
    def total(self) -> float:
        return (
            self.parameters + self.gradients + self.optimizer + self.communication
            + self.activations
        )  # fmt: skip

    @property
    def state(self) -> float:
        """Everything but the activations: what does not grow with the batch."""
        return self.total - self.activations


def compute_bytes(settings: TrainingSettings) -> int:
    """Bytes per element of a gathered parameter: FSDP2 gathers in the compute dtype under
    mixed precision (its ``MixedPrecisionPolicy(param_dtype=...)``) and where the model is
    bf16 (``bf16-true``), float32 otherwise."""
    return FP32 if settings.precision == "fp32" else 2


def reduce_bytes(settings: TrainingSettings) -> int:
    """Bytes per element of a gradient FSDP2 reduce-scatters (and hsdp all-reduces): the
    gradient's own width, float32 under mixed precision (``reduce_dtype=torch.float32``,
    ``sharding.wrap``) and in fp32, bf16 where the model is (``bf16-true``)."""
    return STATE_BYTES[settings.precision]


def rank_memory(
    model: ModelMemory,
    settings: TrainingSettings,
    layout: Layout,
    batch: int,
    *,
    accumulating: bool = False,
) -> RankMemory:
    """The peak bytes of one rank training ``model`` at local ``batch``; ``accumulating``:
    in micro-batches with the exchange held back until the last (gradient accumulation),
    when FSDP2 keeps every unit's unsharded gradients between micro-batches
    (``set_requires_gradient_sync(False)``), so a sharded rank holds the whole model's
    gradients, counted in float32 (ddp holds them whole anyway)."""
    if batch < 0:
        raise ConfigError(f"batch: must be >= 0, got {batch}")
    d = layout.shard_degree
    p = model.parameters
    states = OPTIMIZER_STATES[settings.optimizer]
    width = STATE_BYTES[settings.precision]  # a parameter, gradient or state element
    sharded = math.ceil(p / d)
    if layout.strategy == "ddp":
        # a replica and its gradients; DDP's buckets copy the gradients once more
        communication = float(p * width) if layout.world > 1 else 0.0
    else:
        # the root's parameters stay gathered through the step; at the peak one unit is
        # gathered for compute, the next one prefetched, and the computing one's unsharded
        # gradients wait for their reduce-scatter
        gathered = compute_bytes(settings)
        communication = float(
            model.root_parameters * (gathered + width) + model.largest_unit * (2 * gathered + width)
        )
    held = p if accumulating and layout.strategy != "ddp" else sharded
    return RankMemory(
        parameters=float(sharded * width),
        gradients=float(held * width),
        optimizer=float(sharded * width * states),
        communication=communication,
        activations=model.activation_bytes_fixed + model.activation_bytes_per_sample * batch,
    )


def b_max(
    model: ModelMemory,
    settings: TrainingSettings,
    layout: Layout,
    capacity_bytes: float,
    *,
    usable: float = USABLE,
    ceiling: int = 1 << 20,
    accumulating: bool = False,
) -> int:
    """The largest local batch whose peak stays within ``usable`` of ``capacity_bytes``
    (the rest: the framework's own allocations and fragmentation); 0 when even the state
    does not fit. ``ceiling`` bounds a model whose activations take nothing per sample;
    ``accumulating`` as ``rank_memory``'s."""
    if capacity_bytes <= 0:
        raise ConfigError(f"capacity_bytes: must be > 0, got {capacity_bytes}")
    if not 0 < usable <= 1:
        raise ConfigError(f"usable: must be in (0, 1], got {usable}")
    state = rank_memory(model, settings, layout, 0, accumulating=accumulating).total
    room = capacity_bytes * usable - state
    if room < model.activation_bytes_per_sample or room < 0:
        return 0
    if model.activation_bytes_per_sample == 0:
        return ceiling
    return min(ceiling, int(room // model.activation_bytes_per_sample))


def measured_model(
    unit_parameters: tuple[int, ...],
    per_sample_bytes: float,
    fixed_bytes: float,
    settings: TrainingSettings,
) -> ModelMemory:
    """The ``ModelMemory`` of a profile's measured footprint: ``per_sample_bytes`` of
    activations per sample, and of its ``fixed_bytes`` what one ddp rank alone holds
    beyond its training state (parameters, gradients, optimizer states)."""
    bare = ModelMemory(unit_parameters, 0.0, 0.0)
    state = rank_memory(bare, settings, Layout("ddp", 1), 0).total
    return ModelMemory(unit_parameters, max(0.0, per_sample_bytes), max(0.0, fixed_bytes - state))
