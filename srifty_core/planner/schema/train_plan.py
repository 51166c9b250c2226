"""``TrainPlan``: what every worker of one configuration runs (the PLAN.json file), one
strict pydantic document (``strict.Strict``) like the request and the job conf: a bad field
is one ``FieldError`` naming it, from a file (``TrainPlan.parse``, ``load``) or from code
(``TrainPlan(...)``). No torch: the DAG, the monitor and the planner read and write plans;
``worker.worker`` and ``worker.user`` run them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError, model_validator

from srifty_core.errors import ConfigError
from srifty_core.planner.schema.field_errors import PathError, field_error
from srifty_core.planner.schema.fields import (
    MAX_BATCH,
    Flag,
    GlobalBatch,
    Iterations,
    LongText,
    OptimizerName,
    PositiveSeconds,
    PrecisionName,
    Rule,
    Seconds,
    Seed,
    SizeName,
)
from srifty_core.planner.schema.strict import Strict
from srifty_core.runs import store as run_store
from srifty_core.runs.progress import PROGRESS_FILE
from srifty_core.sharding.memory import Layout, Strategy, parse_strategy
from srifty_core.training_settings import TrainingSettings
from srifty_core.workloads import ModelRefError, parse_model

DtypeName = Literal["float32", "float64"]
DTYPES: tuple[str, ...] = get_args(DtypeName)
"""A plan's ``dtype``: the parameters' (and, on the CPU, the computation's) dtype."""
DeviceName = Literal["auto", "cpu", "cuda"]
DEVICES: tuple[str, ...] = get_args(DeviceName)
"""A plan's ``device``: ``auto`` (GPUs when this host has one per rank, else the CPU),
``cpu``, or ``cuda`` (an error without one GPU per rank): ``worker.placement``."""
CHECKPOINT_FILE = "checkpoint.pt"
"""The checkpoint's name in a run folder (``worker.checkpoint``)."""
IDENTIFIER = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
"""A ``config_id``: safe in a file name (``plan-<config_id>.json`` in the run folder)."""


def _as_tuple(value: Any) -> Any:
    """A JSON list as the tuple the field holds (anything else unchanged, and refused)."""
    return tuple(value) if isinstance(value, list) else value


def _model_ref(value: str) -> str:
    try:
        parse_model(value)
    except ModelRefError as exc:
        raise PathError("", str(exc).removeprefix("model: ")) from None
    return value


def _no_dots(value: str) -> str:
    if ".." in value:
        raise ValueError(value)
    return value


ModelRef = Annotated[
    str,
    Field(strict=True, min_length=1, max_length=4096),
    AfterValidator(_model_ref),
    Rule("a model reference"),
]
Identifier = Annotated[
    str,
    Field(strict=True, pattern=IDENTIFIER),
    BeforeValidator(lambda v: _no_dots(v) if isinstance(v, str) else v),
    Rule("letters, digits, '_', '.' or '-' (starting with a letter or digit, at most 64, no '..')"),
]
LocalBatches = Annotated[
    tuple[Annotated[int, Field(strict=True, ge=1, le=MAX_BATCH), Rule("a whole number >= 1")], ...],
    BeforeValidator(_as_tuple),
    Field(min_length=1),
    Rule("a list of whole numbers >= 1, one per rank"),
]
Command = Annotated[
    tuple[Annotated[str, Field(strict=True, max_length=4096)], ...],
    BeforeValidator(_as_tuple),
    Field(max_length=256),
    Rule("a list of strings (a command)"),
]
Count = Annotated[int, Field(strict=True, ge=1, le=10**9), Rule("a whole number >= 1")]
LearningRate = Annotated[
    float, Field(strict=True, gt=0, allow_inf_nan=False), Rule("a finite number > 0")
]
Momentum = Annotated[
    float, Field(strict=True, ge=0, lt=1, allow_inf_nan=False), Rule("a finite number in [0, 1)")
]
RanksPerVm = Annotated[
    int, Field(strict=True, ge=0, le=10**6), Rule("a whole number >= 0 (0: every rank, one VM)")
]
PlanStrategy = Annotated[Strategy, Rule("one of ddp, fsdp, hsdp")]


class TrainPlan(Strict):
    """What every worker of one configuration runs (the PLAN.json file)."""

    kind = "train plan"
    rule = "a JSON object of train plan fields (model, size, global_batch, ...)"

    model: ModelRef
    size: SizeName
    global_batch: GlobalBatch
    iterations: Iterations
    local_batches: LocalBatches
    run_dir: LongText
    """Holds the checkpoint and the progress log (shared by every configuration of a run)."""
    config_id: Identifier = "c0"
    seed: Seed = 0
    lr: LearningRate = 0.01
    momentum: Momentum = 0.9
    dtype: Annotated[DtypeName, Rule("'float32' or 'float64'")] = "float32"
    checkpoint_every: Count = 10
    reweight: Flag = True
    """Scale each rank's loss so that every sample counts equally (turn off only to show
    why it is needed)."""
    threads: Count = 1
    step_sleep_s: Seconds = 0.0
    """Extra seconds per step (to slow a test job down so that it can be interrupted)."""
    timeout_s: PositiveSeconds = 60.0
    """Collective timeout: how long a rank waits for a dead peer before failing."""
    device: Annotated[DeviceName, Rule("'auto', 'cpu' or 'cuda'")] = "auto"
    """``auto``, ``cpu`` or ``cuda`` (``DEVICES``; see ``worker.placement.choose_device``)."""
    precision: PrecisionName = "fp32"
    """``fp32``, ``fp16`` (autocast and a GradScaler) or ``bf16`` (autocast) on GPUs."""
    optimizer: OptimizerName = "sgd"
    """``sgd`` (with ``momentum``), ``adamw`` or ``adamw_fused``
    (``training_settings.OPTIMIZERS``)."""
    compile: Flag = False
    """``torch.compile`` the module's forward (``workloads.prepare``: checkpoints keep their
    keys)."""
    channels_last: Flag = False
    """Module and 4-D inputs in channels-last memory format."""
    tf32: Flag = False
    """Matrix products and convolutions in TF32 on GPUs that have it
    (``training_settings.TrainingSettings.tf32``)."""
    entrypoint: Command = ()
    """Your training script's command, run on every rank (``worker.launch``; the script
    uses ``worker.user``); empty: the built-in worker trains the plan's model."""
    strategy: PlanStrategy = "ddp"
    """How the ranks hold the model (``sharding.memory.Strategy``): ``ddp`` replicas,
    ``fsdp`` sharded over every rank, ``hsdp`` sharded over the ranks of one VM and
    replicated across VMs. A plan file without it is ``ddp``."""
    ranks_per_vm: RanksPerVm = 0
    """The ranks of one VM, the shard group of ``hsdp`` (0: every rank, one VM). The
    world size must be a multiple of it."""
    micro_batches: Count = 1
    """Gradient accumulation: each rank's local batch runs as this many micro-batches (as
    equal as possible, ``batches.micro_split``), the gradients exchanged once,
    after the last (or after each: ``sync_each_micro_batch``), then one optimizer step:
    the same step as on the whole local batch, in less memory. At most the smallest local
    batch; a plan file without it is 1."""
    sync_each_micro_batch: Flag = False
    """fsdp/hsdp with micro-batches: every micro-batch reduce-scatters its gradients into
    the sharded ones (no rank keeps an unsharded gradient between micro-batches: the mode a
    model too large for that takes) instead of once, with the last. The planner sets it
    where it is the faster mode that fits (``simulator.accumulation``)."""
    extra: Annotated[dict[str, Any], Rule("a mapping")] = Field(default_factory=dict)

    def __init__(self, **data: Any) -> None:
        """Keyword construction from code checks as ``parse`` does: a bad field is a
        ``FieldError`` naming it."""
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise field_error(exc, type(self)) from None

    # Only keyword construction comes here: ``model_validate`` (``parse``, ``load``) keeps
    # validating without it, as it does for pydantic's own ``RootModel.__init__``.
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @model_validator(mode="after")
    def _consistent(self) -> TrainPlan:
        if self.entrypoint and not self.entrypoint[0].strip():
            raise PathError("entrypoint", "the command's first word is empty")
        if sum(self.local_batches) != self.global_batch:
            raise PathError(
                "local_batches",
                f"{list(self.local_batches)} sum to {sum(self.local_batches)}, not the "
                f"global batch {self.global_batch}",
            )
        world = self.world_size
        if self.ranks_per_vm > world or (self.ranks_per_vm and world % self.ranks_per_vm):
            raise PathError(
                "ranks_per_vm",
                f"must divide the world size {world} (0: every rank on one VM), got "
                f"{self.ranks_per_vm}",
            )
        if self.micro_batches > min(self.local_batches):
            raise PathError(
                "micro_batches",
                f"must be between 1 and the smallest local batch {min(self.local_batches)}, "
                f"got {self.micro_batches}",
            )
        if self.sync_each_micro_batch and self.strategy == "ddp":
            raise PathError(
                "sync_each_micro_batch",
                "ddp replicas keep whole gradients: only fsdp and hsdp shard them",
            )
        if self.precision != "fp32" and self.dtype != "float32":
            raise PathError(
                "precision",
                f"{self.precision} mixed precision keeps float32 parameters; the plan's "
                f"dtype is {self.dtype}",
            )
        return self

    @property
    def settings(self) -> TrainingSettings:
        """The step-time-relevant settings (what the plan's profiles must match)."""
        return TrainingSettings(
            self.precision, self.optimizer, self.compile, self.channels_last, self.tf32
        )

    @property
    def world_size(self) -> int:
        return len(self.local_batches)

    @property
    def layout(self) -> Layout:
        """The ranks' arrangement ``sharding.wrap`` shards over."""
        per_vm = self.ranks_per_vm or self.world_size
        return Layout(parse_strategy(self.strategy, "strategy"), self.world_size, per_vm)

    @property
    def sharded(self) -> bool:
        """Whether the ranks hold shards (``fsdp``/``hsdp``): DCP checkpoints."""
        return self.strategy != "ddp"

    @property
    def checkpoint_path(self) -> Path | str:
        """A ``Path``, or a URI when ``run_dir`` is one (``run_store``)."""
        return run_store.join(self.run_dir, CHECKPOINT_FILE)

    @property
    def progress_path(self) -> Path | str:
        return run_store.join(self.run_dir, PROGRESS_FILE)

    def replace(self, **changes: Any) -> TrainPlan:
        """This plan with ``changes``, checked again (a field error names the field)."""
        return TrainPlan.parse({**self.to_dict(), **changes})

    def to_dict(self) -> dict[str, Any]:
        """The JSON document: lists for ``local_batches`` and ``entrypoint``."""
        d = self.model_dump()
        d["local_batches"] = list(self.local_batches)
        d["entrypoint"] = list(self.entrypoint)
        return d

    @classmethod
    def from_dict(cls, d: Any) -> TrainPlan:
        return cls.parse(d)

    def save(self, path: Path | str) -> Path | str:
        return run_store.write_text(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: Path | str) -> TrainPlan:
        """The plan at ``path`` (a file or a URI); a bad one is a ``ConfigError`` naming the
        file and the field."""
        text = run_store.read_text(path)
        if text is None:
            raise FileNotFoundError(f"no such plan: {path}")
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc.msg})") from None
        return cls.parse(d)
