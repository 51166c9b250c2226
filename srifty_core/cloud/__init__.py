"""Cloud providers behind one interface (``cloud.base.Provider``).

``cloud.local.LocalProvider`` runs instances as local processes; an emulated EC2 and EC2
itself come later. Importing this package stays light.
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
    "get_provider",
]

PROVIDERS = ("local",)


def get_provider(name: str) -> Provider:
    """The provider called ``name`` with its default settings."""
    from srifty_core.errors import UnknownNameError

    if name == "local":
        from srifty_core.cloud.local import LocalProvider

        return LocalProvider()
    raise UnknownNameError("provider", name, PROVIDERS)
