"""What the monitor reads from the cloud each step: per allocation, the instances the
provider took back and the workers' exit codes (``CloudView``).

``observe`` asks the provider (synchronous: the local provider's process table, or boto3).
``observe_async`` is what the Airflow trigger awaits in the triggerer's event loop: for EC2
it reads the instances and their spot requests through the Amazon provider's async hook
(``EC2Hook.get_async_conn``: aiobotocore), two API calls a step for every allocation
together, so a slow or throttled EC2 API never blocks the triggerer's loop; for any other
provider it runs ``observe`` in a worker thread (``asyncio.to_thread``). Both give the same
view of the same state (the EC2 rules are ``EC2Provider``'s: an instance that ended
without the ``srifty:released`` tag, or whose spot request says it is being taken back,
was interrupted; a rank's exit code is unknown while its instance runs, -1 once it ended).

Light: no torch; Airflow and aiobotocore are imported only when an EC2 view is read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from srifty_core.cloud.base import Allocation, Interruption, Provider

if TYPE_CHECKING:
    from srifty_core.cloud.ec2 import EC2Provider


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
    """``observe`` for an event loop; keeps the EC2 hook (its connection) between steps."""

    def __init__(self, provider: Provider) -> None:
        self.provider = provider
        self._hook: Any = None

    async def __call__(self, allocations: Sequence[Allocation]) -> CloudView:
        from srifty_core.cloud.ec2 import EC2Provider

        if isinstance(self.provider, EC2Provider):
            return await self._ec2(self.provider, allocations)
        return await asyncio.to_thread(observe, self.provider, allocations)

    def _ec2_hook(self, provider: EC2Provider) -> Any:
        if self._hook is None:
            from airflow.providers.amazon.aws.hooks.ec2 import EC2Hook
            from botocore.config import Config

            from srifty_core.cloud.ec2 import EC2_MAX_ATTEMPTS

            self._hook = EC2Hook(
                aws_conn_id=provider.aws_conn_id,
                region_name=provider.region,
                api_type="client_type",
                config=Config(retries={"mode": "adaptive", "max_attempts": EC2_MAX_ATTEMPTS}),
            )
        return self._hook

    async def _ec2(self, provider: EC2Provider, allocations: Sequence[Allocation]) -> CloudView:
        ids = [i for a in allocations for i in a.instance_ids]
        raws: dict[str, dict[str, Any]] = {}
        requests: list[dict[str, Any]] = []
        if ids:
            async with await self._ec2_hook(provider).get_async_conn() as client:
                pages = client.get_paginator("describe_instances").paginate(InstanceIds=ids)
                async for page in pages:
                    for r in page["Reservations"]:
                        raws.update({i["InstanceId"]: i for i in r["Instances"]})
                spot = [
                    r["SpotInstanceRequestId"]
                    for r in raws.values()
                    if r.get("SpotInstanceRequestId")
                ]
                if spot:
                    resp = await client.describe_spot_instance_requests(SpotInstanceRequestIds=spot)
                    requests = list(resp.get("SpotInstanceRequests", []))
        return ec2_view(provider, allocations, raws, requests)


def ec2_view(
    provider: EC2Provider,
    allocations: Sequence[Allocation],
    raws: Mapping[str, Mapping[str, Any]],
    spot_requests: Sequence[Mapping[str, Any]],
) -> CloudView:
    """``EC2Provider.interruptions`` and ``exit_codes`` of every allocation, from the
    ``describe_instances`` records (by instance id) and ``describe_spot_instance_requests``
    records already read (``EC2Provider.interruptions_from``, ``exit_codes_from``: the
    provider's own rule)."""
    interruptions = {a.id: provider.interruptions_from(a, raws, spot_requests) for a in allocations}
    exit_codes = {a.id: provider.exit_codes_from(a, raws) for a in allocations}
    return CloudView(interruptions, exit_codes)
