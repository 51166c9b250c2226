"""What the monitor reads from the cloud each step: per allocation, the instances the
provider took back and the workers' exit codes (``CloudView``).

``observe`` asks the provider (synchronous: the local provider's process table, or boto3).
``AsyncObserver`` is what the Airflow trigger awaits in the triggerer's event loop: the
provider's ``observe_async`` (EC2: the instances and their spot requests through the
Amazon provider's async hook, two API calls a step for every allocation together, so a
slow or throttled EC2 API never blocks the triggerer's loop; any other provider: its
synchronous calls in a worker thread). Both give the same view of the same state.

Light: no torch; Airflow and aiobotocore are imported only when an EC2 view is read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from srifty_core.cloud.base import Allocation, Interruption, Provider


@dataclass(frozen=True)
class CloudView:
    """One look at the allocations: what was taken back and the exit codes, by allocation id."""

    interruptions: Mapping[str, tuple[Interruption, ...]]
    exit_codes: Mapping[str, Mapping[int, int | None]]


def observe(provider: Provider, allocations: Sequence[Allocation]) -> CloudView:
    """The view through the provider's own (synchronous) calls."""
    return CloudView(
        {a.id: provider.interruptions(a) for a in allocations},
        {a.id: provider.exit_codes(a) for a in allocations},
    )


class AsyncObserver:
    """``observe`` for an event loop (``Provider.observe_async``: EC2 reads through its
    async hook, which it keeps between steps; another provider, in a worker thread)."""

    def __init__(self, provider: Provider) -> None:
        self.provider = provider

    async def __call__(self, allocations: Sequence[Allocation]) -> CloudView:
        interruptions, exit_codes = await self.provider.observe_async(allocations)
        return CloudView(interruptions, exit_codes)
