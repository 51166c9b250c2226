"""A module made ready to train under a strategy, in a started process group: DDP's
replica, or FSDP2's ``fully_shard`` on each unit (``sharding.units``) and then on the root,
over a one-dimensional mesh (``fsdp``) or a (replicate, shard) mesh whose shard groups
are the ranks of one VM (``hsdp``).

Contract: ``wrap(module, layout, settings, device)`` returns the module to call and step;
the trainer, the memory check and the sharded profile use it, so all three shard alike.
Under bf16/fp16 on a GPU, FSDP gathers parameters in that dtype and reduces gradients in
float32 (``MixedPrecisionPolicy``); under bf16-true the module is bf16 already and stays so;
on the CPU everything stays float32.
``gradient_sync(module, False)`` keeps the backward passes inside it from exchanging
gradients (DDP's ``no_sync``, FSDP2's ``set_requires_gradient_sync`` on the root): the
micro-batches of gradient accumulation but the last; a module wrapped with
``sync_each_micro_batch`` (fsdp/hsdp) exchanges on every one, each reduce-scattered
gradient summed into the sharded ones (``TrainPlan.sync_each_micro_batch``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from srifty_core.errors import ConfigError
from srifty_core.sharding.memory import Layout
from srifty_core.sharding.units import shard_units
from srifty_core.training_settings import AUTOCAST, TrainingSettings

SYNC_EACH = "_srifty_sync_each_micro_batch"
"""The attribute ``wrap`` sets on a module it shards with ``sync_each_micro_batch``."""


def wrap(
    module: nn.Module,
    layout: Layout,
    settings: TrainingSettings,
    device: torch.device,
    sync_each_micro_batch: bool = False,
) -> nn.Module:
    """``module`` (already on ``device``) wrapped for ``layout`` (module doc)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise ConfigError("sharding.wrap: start the process group first")
    if dist.get_world_size() != layout.world:
        raise ConfigError(
            f"world: the layout has {layout.world} ranks, the process group {dist.get_world_size()}"
        )
    if layout.strategy == "ddp":
        if sync_each_micro_batch:
            raise ConfigError("sync_each_micro_batch: only fsdp and hsdp shard gradients")
        ids = [device.index] if device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(module, device_ids=ids)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if layout.strategy == "hsdp":
        if layout.world % layout.ranks_per_vm:
            raise ConfigError(
                f"ranks_per_vm: hsdp needs every VM to hold as many ranks "
                f"({layout.world} ranks is not a multiple of {layout.ranks_per_vm})"
            )
        shape: tuple[int, ...] = (layout.world // layout.ranks_per_vm, layout.ranks_per_vm)
        mesh = init_device_mesh(device.type, shape, mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(device.type, (layout.world,))
    policy = MixedPrecisionPolicy()  # bf16-true: the cast module's own dtype throughout
    if device.type == "cuda" and settings.precision in AUTOCAST:
        dtype = torch.bfloat16 if settings.precision == "bf16" else torch.float16
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    for unit in shard_units(module):
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(module, mesh=mesh, mp_policy=policy)
    setattr(module, SYNC_EACH, sync_each_micro_batch)
    return module


@contextmanager
def gradient_sync(module: nn.Module, enabled: bool) -> Iterator[None]:
    """The backward passes inside exchange gradients (``enabled``, as always) or keep them
    on this rank, accumulating into the local (for FSDP2: unsharded) gradients until a
    backward pass with it on exchanges the sum: DDP's ``no_sync()``, FSDP2's
    ``set_requires_gradient_sync(False)`` on the root module (then ``True`` again; for
    hsdp it holds back the replicas' allreduce too). A module of neither kind exchanges
    nothing."""
    if enabled or getattr(module, SYNC_EACH, False):
        yield
        return
    if isinstance(module, nn.parallel.DistributedDataParallel):
        with module.no_sync():
            yield
        return
    from torch.distributed.fsdp import FSDPModule

    if isinstance(module, FSDPModule):
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)
        return
    yield
