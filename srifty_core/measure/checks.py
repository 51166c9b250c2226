"""Checks of a probe sweep before anything starts: the config against the provider, the
instance type and the allocation's size, and the backend against this machine.

Each raises ``ConfigError`` naming the field at fault; ``checked_size`` runs them all for
a sweep about to launch and says how many instances it launches.
"""

from __future__ import annotations

import math

from srifty_core.cloud.base import InstanceSpec, Provider
from srifty_core.errors import ConfigError
from srifty_core.probing.config import SweepConfig
from srifty_core.probing.mix import is_mix


def check_fits(config: SweepConfig, ranks: int, what: str) -> None:
    """``ConfigError`` naming ``world_sizes`` when the allocation is too small."""
    too_big = [n for n in config.world_sizes if n > ranks]
    if too_big:
        raise ConfigError(
            f"world_sizes: {too_big} exceed the {ranks} rank(s) of the allocation ({what}); "
            f"launch more instances or probe smaller world sizes"
        )


def check_single_type(instance_type: str, provider: Provider) -> None:
    """``ConfigError`` naming ``instance_type`` when it names a mixed-type ring, which a
    single type's sweep does not launch (``measure.mix_sweep`` does)."""
    if is_mix(instance_type):
        raise ConfigError(
            f"instance_type: {instance_type!r} is a ring over several instance types; probe "
            f"it as a mix (srifty probe --mix TYPE:VMS,TYPE:VMS, or "
            f"measure.mix_sweep.probe_mix_sweep), which launches one allocation per type on "
            f"the {provider.name} provider"
        )


def check_backend(config: SweepConfig, ranks: int) -> None:
    """``ConfigError`` naming ``backend`` when this machine cannot run it."""
    if config.backend == "nccl":
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus == 0:
            raise ConfigError("backend: nccl needs CUDA GPUs and this machine has none; use gloo")


def checked_size(
    config: SweepConfig, provider: Provider, instance_type: str, instances: int | None
) -> tuple[InstanceSpec, int]:
    """(the type's spec, how many instances) for a sweep of ``config``, after checking
    them: one instance type, ``instances`` (default: as many as the largest world size
    needs) at least 1, the world sizes fit, the backend runs here."""
    check_single_type(instance_type, provider)
    spec = provider.instance_type(instance_type)
    count = (
        instances
        if instances is not None
        else math.ceil(config.max_world_size / spec.ranks_per_instance)
    )
    if count < 1:
        raise ConfigError(f"instances: must be at least 1, got {count}")
    check_fits(config, count * spec.ranks_per_instance, f"{count} x {instance_type}")
    check_backend(config, count * spec.ranks_per_instance)
    return spec, count


def check_starts_after_launch(provider: Provider) -> None:
    """The sweep's own launch-then-run needs workers it can start on launched VMs; VMs
    that start them from their launch (EC2's user data) are swept by
    ``jobs.probe_vms`` (the points travel in the launch)."""
    if provider.starts_workers_at_launch:
        raise ConfigError(
            f"provider: the {provider.name} provider's VMs start their workers at launch; "
            "sweep it with jobs.probe_vms (srifty probe and the sweep DAG do)"
        )
