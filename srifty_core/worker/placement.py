"""Where a training rank runs: its device and process-group backend from the launcher's
environment and what CUDA reports (``choose_device``), and its rank in the plan's order
under torchrun's rendezvous (``plan_rank``); its precision is
``workloads.prepare.choose_precision``. Pure functions of their inputs; torch is imported
only for ``Placement.torch_device``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from srifty_core.errors import ConfigError
from srifty_core.planner.schema.train_plan import DEVICES
from srifty_core.worker.rendezvous import RANK_OFFSET_ENV

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Placement:
    """Where one rank runs (``choose_device``)."""

    rank: int
    world_size: int
    local_rank: int
    """This rank's index on its host (its GPU, on CUDA)."""
    local_world_size: int
    """Ranks on this host."""
    device: str
    """``cpu`` or ``cuda:<local rank>``."""
    backend: str
    """``gloo`` (CPU) or ``nccl`` (CUDA)."""
    note: str = ""
    """Why ``auto`` fell back to the CPU on a host with GPUs (empty otherwise)."""

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def torch_device(self) -> torch.device:
        import torch

        return torch.device(self.device)


def _env_int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ConfigError(f"environment variable {name} is not set")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}: a whole number, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"environment variable {name}: must be >= 0, got {value}")
    return value


def choose_device(
    env: Mapping[str, str],
    want: str = "auto",
    *,
    cuda_available: bool,
    cuda_devices: int,
) -> Placement:
    """Where this rank runs, from the launcher's environment and what CUDA reports.

    ``RANK`` and ``WORLD_SIZE`` are required. ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``
    (torchrun sets both) place the rank on its host; when either is missing (a plain
    launcher: the local provider, ``run_spawned``) every rank is on this host, so the
    local rank is ``RANK`` and ``WORLD_SIZE`` ranks share it.

    ``want`` is the plan's ``device``: ``cuda`` needs one GPU per rank on this host (else a
    ``ConfigError``) and gives ``cuda:<local rank>`` with NCCL; ``cpu`` gives the CPU with
    gloo; ``auto`` is ``cuda`` when CUDA is available with at least one GPU per local
    rank, else ``cpu`` (every rank of a host decides alike, so a host never mixes
    backends; a job whose hosts differ should say ``cpu`` or ``cuda``)."""
    if want not in DEVICES:
        raise ConfigError(f"device: must be one of {list(DEVICES)}, got {want!r}")
    rank = _env_int(env, "RANK")
    world = _env_int(env, "WORLD_SIZE")
    if world < 1 or rank >= world:
        raise ConfigError(f"RANK {rank} is not in a world of WORLD_SIZE {world}")
    if env.get("LOCAL_RANK", "") != "" and env.get("LOCAL_WORLD_SIZE", "") != "":
        local_rank = _env_int(env, "LOCAL_RANK")
        local_world = _env_int(env, "LOCAL_WORLD_SIZE")
    else:
        local_rank, local_world = rank, world
    if local_world < 1 or local_rank >= local_world or local_world > world:
        raise ConfigError(
            f"LOCAL_RANK {local_rank} of LOCAL_WORLD_SIZE {local_world} does not fit a "
            f"world of {world}"
        )
    gpus = cuda_devices if cuda_available else 0
    fits = gpus >= local_world
    note = ""
    if want == "cuda" and not fits:
        raise ConfigError(
            f"device: cuda needs one GPU per rank: {local_world} rank(s) on this host, "
            f"{gpus} GPU(s) available"
        )
    if want == "auto" and gpus > 0 and not fits:
        note = (
            f"{local_world} ranks on this host but {gpus} GPU(s): running on the CPU "
            "(one rank per GPU; set the plan's device to cuda to make this an error)"
        )
    if want != "cpu" and fits:
        return Placement(rank, world, local_rank, local_world, f"cuda:{local_rank}", "nccl")
    return Placement(rank, world, local_rank, local_world, "cpu", "gloo", note)


def plan_rank(env: Mapping[str, str]) -> int:
    """This process's rank in the plan's order: ``RANK``, except on a VM started by
    ``rendezvous.start_script``, where torchrun's c10d rendezvous numbers the VMs in its own
    order and ``SRIFTY_RANK_OFFSET`` (the plan's first rank on this VM) plus ``LOCAL_RANK``
    is the rank whose local batch this process trains."""
    world = _env_int(env, "WORLD_SIZE")
    if env.get(RANK_OFFSET_ENV, "") == "":
        return _env_int(env, "RANK")
    offset = _env_int(env, RANK_OFFSET_ENV)
    local = _env_int(env, "LOCAL_RANK")
    local_world = _env_int(env, "LOCAL_WORLD_SIZE")
    if local >= local_world or offset + local_world > world:
        raise ConfigError(
            f"{RANK_OFFSET_ENV} {offset} with LOCAL_RANK {local} of LOCAL_WORLD_SIZE "
            f"{local_world} does not fit a world of {world}"
        )
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        # joining MASTER_ADDR:MASTER_PORT with a rank other than torchrun's works only as
        # a client of the agent's store (rendezvous: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=0)
        raise ConfigError(
            f"{RANK_OFFSET_ENV} needs torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE="
            f"True), got {env.get('TORCHELASTIC_USE_AGENT_STORE')!r}"
        )
    return offset + local
