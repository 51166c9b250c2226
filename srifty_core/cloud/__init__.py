"""Cloud providers behind one interface (``cloud.base.Provider``).

``cloud.local.LocalProvider`` runs instances as local processes; ``cloud.emulated`` is a
seeded EC2 on a simulated clock (``EmulatedProvider``, ``emulated_probe_sweep``,
``emulate_training``); ``cloud.ec2.EC2Provider`` is EC2 itself through the Airflow Amazon
provider. Importing this package stays light (each provider is imported when asked for).
"""

from srifty_core.cloud.base import (
    Allocation,
    Instance,
    InstanceSpec,
    InstanceState,
    Interruption,
    LaunchRequest,
    Provider,
    ProviderError,
)

__all__ = [
    "Allocation",
    "Instance",
    "InstanceSpec",
    "InstanceState",
    "Interruption",
    "LaunchRequest",
    "Provider",
    "ProviderError",
    "find_provider_class",
    "get_provider",
    "provider_class",
]

PROVIDERS = ("local", "ec2-emulated", "ec2")


def provider_class(name: str) -> type[Provider]:
    """The class of the provider called ``name`` (what it answers without an instance:
    ``launch_s``, ``detach_s``, ``reruns_workers``, ``shares_host``...)."""
    from srifty_core.errors import UnknownNameError

    if name == "local":
        from srifty_core.cloud.local import LocalProvider

        return LocalProvider
    if name == "ec2-emulated":
        from srifty_core.cloud.emulated import EmulatedProvider

        return EmulatedProvider
    if name == "ec2":
        from srifty_core.cloud.ec2 import EC2Provider

        return EC2Provider
    raise UnknownNameError("provider", name, PROVIDERS)


def find_provider_class(name: object) -> type[Provider] | None:
    """The class of the provider called exactly ``name`` (one of ``PROVIDERS``), else
    ``None``: for a name that may be a label only (a request's ``provider`` feature)."""
    return provider_class(name) if isinstance(name, str) and name in PROVIDERS else None


def get_provider(name: str) -> Provider:
    """The provider called ``name`` with its default settings."""
    return provider_class(name)()
