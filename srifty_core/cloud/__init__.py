"""Cloud providers behind one interface (``cloud.base.Provider``).

``cloud.local.LocalProvider`` runs instances as local processes; ``cloud.emulated`` is a
seeded EC2 on a simulated clock (``provider.EmulatedProvider``; ``measurements``:
``emulated_probe_sweep``, ``emulate_training``); ``cloud.ec2.EC2Provider`` is EC2 itself
through the Airflow Amazon provider (its hooks and boto3 load when it first calls AWS).
The emulated provider is imported when asked for: it loads numpy.
"""

from typing import Any

from srifty_core.cloud.base import (
    Allocation,
    Instance,
    InstanceSpec,
    InstanceState,
    Interruption,
    LaunchRequest,
    Provider,
    ProviderError,
    Workers,
)
from srifty_core.cloud.ec2 import EC2Provider
from srifty_core.cloud.local import LocalProvider
from srifty_core.errors import UnknownNameError

__all__ = [
    "Allocation",
    "Instance",
    "InstanceSpec",
    "InstanceState",
    "Interruption",
    "LaunchRequest",
    "Provider",
    "ProviderError",
    "Workers",
    "find_provider_class",
    "get_provider",
    "provider_class",
    "shares_host",
]

PROVIDERS = ("local", "ec2-emulated", "ec2")
ALIASES = {"emulated": "ec2-emulated"}
"""Other names a job file may give (``planner.schema.fields.ShellJobProvider``)."""


def provider_class(name: str) -> type[Provider]:
    """The class of the provider called ``name`` (what it answers without an instance:
    ``launch_s``, ``detach_s``, ``reruns_workers``, ``shares_host``...)."""
    if name == "local":
        return LocalProvider
    if name == "ec2-emulated":
        from srifty_core.cloud.emulated.provider import EmulatedProvider  # numpy

        return EmulatedProvider
    if name == "ec2":
        return EC2Provider
    raise UnknownNameError("provider", name, PROVIDERS)


def find_provider_class(name: object, *, aliases: bool = False) -> type[Provider] | None:
    """The class of the provider called exactly ``name`` (one of ``PROVIDERS``, or with
    ``aliases`` of ``ALIASES``), else ``None``: for a name that may be a label only (a
    request's ``provider`` feature) or not checked yet (a job file's, before its schema)."""
    if not isinstance(name, str):
        return None
    if aliases:
        name = ALIASES.get(name, name)
    return provider_class(name) if name in PROVIDERS else None


def shares_host(name: object) -> bool:
    """Does ``name`` name a provider whose ranks share this host's cores
    (``Provider.shares_host``)? A name that is no provider's (a label) does not."""
    cls = find_provider_class(name)
    return cls is not None and cls.shares_host


def get_provider(name: str, **conf: Any) -> Provider:
    """The provider called ``name``, from a job's conf (``Provider.from_conf``: ``ec2``,
    ``region`` and what its class takes); with none, its default settings."""
    return provider_class(name).from_conf(**conf)
