"""A training plan (the PLAN.json file every worker of one configuration runs) and the
arithmetic of unequal local batches. Importing it loads no torch: the DAG, the monitor and
the planner read and write plans without it; ``runtime.worker`` runs them."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from srifty_core.errors import ConfigError
from srifty_core.runs import store as run_store
from srifty_core.runs.progress import PROGRESS_FILE
from srifty_core.runtime.placement import DEVICES as DEVICES
from srifty_core.sharding.memory import Layout, parse_strategy
from srifty_core.training_settings import PRECISIONS as PRECISIONS
from srifty_core.training_settings import TrainingSettings
from srifty_core.workloads import parse_model

DTYPES = ("float32", "float64")
"""A plan's ``dtype``: the parameters' (and, on the CPU, the computation's) dtype."""
CHECKPOINT_FILE = "checkpoint.pt"
"""The checkpoint's name in a run folder (``runtime.checkpoint``)."""


@dataclass(frozen=True)
class TrainPlan:
    """What every worker of one configuration runs (the PLAN.json file)."""

    model: str
    size: str
    global_batch: int
    iterations: int
    local_batches: tuple[int, ...]
    run_dir: str
    """Holds the checkpoint and the progress log (shared by every configuration of a run)."""
    config_id: str = "c0"
    seed: int = 0
    lr: float = 0.01
    momentum: float = 0.9
    dtype: str = "float32"
    checkpoint_every: int = 10
    reweight: bool = True
    """Scale each rank's loss so that every sample counts equally (turn off only to show
    why it is needed)."""
    threads: int = 1
    step_sleep_s: float = 0.0
    """Extra seconds per step (to slow a test job down so that it can be interrupted)."""
    timeout_s: float = 60.0
    """Collective timeout: how long a rank waits for a dead peer before failing."""
    device: str = "auto"
    """``auto``, ``cpu`` or ``cuda`` (``DEVICES``; see ``choose_device``)."""
    precision: str = "fp32"
    """``fp32``, ``fp16`` (autocast and a GradScaler) or ``bf16`` (autocast) on GPUs."""
    optimizer: str = "sgd"
    """``sgd`` (with ``momentum``) or ``adamw`` (``training_settings.OPTIMIZERS``)."""
    compile: bool = False
    """``torch.compile`` the module's forward (``workloads.prepare``: checkpoints keep their
    keys)."""
    channels_last: bool = False
    """Module and 4-D inputs in channels-last memory format."""
    entrypoint: tuple[str, ...] = ()
    """Your training script's command, run on every rank (``runtime.launch``; the script
    uses ``runtime.user``); empty: the built-in worker trains the plan's model."""
    strategy: str = "ddp"
    """How the ranks hold the model (``sharding.memory.Strategy``): ``ddp`` replicas,
    ``fsdp`` sharded over every rank, ``hsdp`` sharded over the ranks of one VM and
    replicated across VMs. A plan file without it is ``ddp``."""
    ranks_per_vm: int = 0
    """The ranks of one VM, the shard group of ``hsdp`` (0: every rank, one VM). The
    world size must be a multiple of it."""
    micro_batches: int = 1
    """Gradient accumulation: each rank's local batch runs as this many micro-batches (as
    equal as possible, ``micro_split``), the gradients exchanged once, after the last, then
    one optimizer step: the same step as on the whole local batch, in less memory. At most
    the smallest local batch; a plan file without it is 1."""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.local_batches, (str, bytes)) or not hasattr(
            self.local_batches, "__iter__"
        ):
            raise ConfigError(f"local_batches: a list of integers, got {self.local_batches!r}")
        batches = tuple(_whole("local_batches", b) for b in self.local_batches)
        object.__setattr__(self, "local_batches", batches)
        if (
            isinstance(self.entrypoint, (str, bytes))
            or not isinstance(self.entrypoint, (list, tuple))
            or not all(isinstance(a, str) for a in self.entrypoint)
        ):
            raise ConfigError(f"entrypoint: a list of strings (a command), got {self.entrypoint!r}")
        object.__setattr__(self, "entrypoint", tuple(self.entrypoint))
        if self.entrypoint and not self.entrypoint[0].strip():
            raise ConfigError("entrypoint: the command's first word is empty")
        check_identifier("config_id", self.config_id)
        for name in ("global_batch", "iterations", "seed", "checkpoint_every", "threads"):
            object.__setattr__(self, name, _whole(name, getattr(self, name)))
        for name, lo, hi in (
            ("lr", 0.0, math.inf),
            ("momentum", 0.0, 1.0),
            ("timeout_s", 0.0, math.inf),
        ):
            v = _finite(name, getattr(self, name))
            if not lo < v < hi and not (name == "momentum" and v == 0.0):
                raise ConfigError(f"{name}: must be in ({lo:g}, {hi:g}), got {v!r}")
        if _finite("step_sleep_s", self.step_sleep_s) < 0:
            raise ConfigError(f"step_sleep_s: must be >= 0, got {self.step_sleep_s!r}")
        if self.threads < 1:
            raise ConfigError(f"threads: must be >= 1, got {self.threads}")
        if not isinstance(self.reweight, bool):
            raise ConfigError(f"reweight: must be true or false, got {self.reweight!r}")
        if not self.local_batches or any(b < 1 for b in self.local_batches):
            raise ConfigError("local_batches: need one batch >= 1 per rank")
        if sum(self.local_batches) != self.global_batch:
            raise ConfigError(
                f"local_batches: {list(self.local_batches)} sum to "
                f"{sum(self.local_batches)}, not the global batch {self.global_batch}"
            )
        if self.iterations < 1:
            raise ConfigError("iterations: must be >= 1")
        if self.checkpoint_every < 1:
            raise ConfigError("checkpoint_every: must be >= 1")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype: must be one of {sorted(DTYPES)}")
        if self.device not in DEVICES:
            raise ConfigError(f"device: must be one of {list(DEVICES)}, got {self.device!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"precision: must be one of {list(PRECISIONS)}, got {self.precision!r}"
            )

        parse_strategy(self.strategy, "strategy")
        object.__setattr__(self, "ranks_per_vm", _whole("ranks_per_vm", self.ranks_per_vm))
        if (
            self.ranks_per_vm < 0
            or self.ranks_per_vm > self.world_size
            or (self.ranks_per_vm and self.world_size % self.ranks_per_vm)
        ):
            raise ConfigError(
                f"ranks_per_vm: must divide the world size {self.world_size} (0: every "
                f"rank on one VM), got {self.ranks_per_vm}"
            )
        object.__setattr__(self, "micro_batches", _whole("micro_batches", self.micro_batches))
        if not 1 <= self.micro_batches <= min(self.local_batches):
            raise ConfigError(
                f"micro_batches: must be between 1 and the smallest local batch "
                f"{min(self.local_batches)}, got {self.micro_batches}"
            )
        parse_model(self.model)
        self.settings  # noqa: B018 - builds TrainingSettings, which checks the four fields
        if self.precision != "fp32" and self.dtype != "float32":
            raise ConfigError(
                f"precision: {self.precision} mixed precision keeps float32 parameters; "
                f"the plan's dtype is {self.dtype}"
            )

    @property
    def settings(self) -> TrainingSettings:
        """The step-time-relevant settings (what the plan's profiles must match)."""
        return TrainingSettings(self.precision, self.optimizer, self.compile, self.channels_last)

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

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["local_batches"] = list(self.local_batches)
        d["entrypoint"] = list(self.entrypoint)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainPlan:
        return cls(**d)

    def save(self, path: Path | str) -> Path | str:
        return run_store.write_text(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: Path | str) -> TrainPlan:
        text = run_store.read_text(path)
        if text is None:
            raise FileNotFoundError(f"no such plan: {path}")
        try:
            return cls.from_dict(json.loads(text))
        except TypeError as exc:
            raise ConfigError(f"{path}: {exc}") from exc


_IDENTIFIER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_identifier(name: str, value: Any) -> str:
    """``value`` when it is safe in a file name (``plan-<config_id>.json`` in the run
    folder): letters, digits, ``_``, ``.`` and ``-``, starting with a letter or digit, at
    most 64 characters, no ``..``; else a ``ConfigError`` naming ``name`` (a ``../`` would
    write outside the run folder)."""
    if not isinstance(value, str) or not _IDENTIFIER.match(value) or ".." in value:
        raise ConfigError(
            f"{name}: must be letters, digits, '_', '.' or '-' (starting with a letter or "
            f"digit, at most 64, no '..'), got {value!r}"
        )
    return value


def _whole(name: str, v: Any) -> int:
    """``v`` as an int when it is a whole number (not a bool, not 8.9), else a
    ``ConfigError`` naming ``name``."""
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or (isinstance(v, float) and (not math.isfinite(v) or not v.is_integer()))
    ):
        raise ConfigError(f"{name}: must be a whole number, got {v!r}")
    return int(v)


def _finite(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ConfigError(f"{name}: must be a finite number, got {v!r}")
    return float(v)


def split_batch(global_batch: int, ranks: int) -> tuple[int, ...]:
    """``global_batch`` split as evenly as possible over ``ranks`` (larger ones first)."""
    if ranks < 1 or ranks > global_batch:
        raise ConfigError(f"cannot split a batch of {global_batch} over {ranks} ranks")
    q, r = divmod(global_batch, ranks)
    return tuple(q + (1 if k < r else 0) for k in range(ranks))


def micro_split(local_batch: int, micro_batches: int) -> tuple[int, ...]:
    """A local batch's micro-batch sizes (``split_batch``: as equal as possible, larger
    first). Micro-batch ``j`` of ``m_j`` samples scales its mean loss by ``m_j / b``
    besides the rank's ``loss_scale``: the accumulated gradient is then the one of the whole
    local batch."""
    if micro_batches < 1 or micro_batches > local_batch:
        raise ConfigError(
            f"micro_batches: must be between 1 and the local batch {local_batch}, "
            f"got {micro_batches}"
        )
    return split_batch(local_batch, micro_batches)


def micro_batches_for(
    local_batches: Sequence[int], micro_batches: int, new_batches: Sequence[int]
) -> int:
    """The micro-batches that keep a plan's largest micro-batch (what its GPUs were planned
    to hold) when its ranks take ``new_batches`` instead (survivors of a preemption
    taking the global batch over): ``ceil(max(new) / ceil(max(old) / k))``, at most the
    smallest new local batch, at least 1. A plan without micro-batches (k = 1) keeps
    none: nothing here knows what its GPUs hold beyond what it planned."""
    if micro_batches <= 1:
        return 1
    size = -(-max(local_batches) // micro_batches)
    return max(1, min(-(-max(new_batches) // size), min(new_batches)))


def loss_scale(local_batches: Sequence[int], rank: int) -> float:
    """``world_size * b_rank / B_global``: the factor that makes DDP's average of the ranks'
    mean losses the mean over every sample of the global batch."""
    return len(local_batches) * local_batches[rank] / sum(local_batches)
