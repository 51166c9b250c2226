"""The monitor's cloud reads in the trigger's event loop: EC2 through the Amazon provider's
async hook (aiobotocore) gives the same view as the provider's own boto3 calls, and never
touches boto3's synchronous client. AWS is a moto server here (the only stand-in)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from srifty_core.catalog.types import Market
from srifty_core.cloud.base import LaunchRequest
from srifty_core.cloud.ec2 import EC2Provider
from srifty_core.cloud.local import LocalProvider
from srifty_core.jobs.cloud_watch import AsyncObserver, CloudView, observe
from tests.cloud.moto_aws import AMI

pytestmark = pytest.mark.airflow


def _async_view(observer: AsyncObserver, allocations: list[Any]) -> CloudView:
    return asyncio.run(asyncio.wait_for(observer(allocations), timeout=60))


def _taken(view: CloudView) -> dict[str, list[tuple[str, str]]]:
    return {a: [(i.instance_id, i.reason) for i in x] for a, x in view.interruptions.items()}


def test_ec2_state_through_the_async_hook_matches_the_providers(
    aws: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider = EC2Provider(image_id=AMI, poll_s=0.05, wait_timeout_s=20)
    spot = provider.launch(LaunchRequest("g4dn.12xlarge", count=2, market=Market.SPOT))
    on_demand = provider.launch(LaunchRequest("g4dn.xlarge", count=1))
    allocations = [spot, on_demand]
    observer = AsyncObserver(provider)
    try:
        running = observe(provider, allocations)
        assert running.interruptions == {spot.id: (), on_demand.id: ()}
        assert set(running.exit_codes[spot.id].values()) == {None}  # 8 ranks, all running

        # EC2 takes a spot VM back (terminated without Srifty's released tag).
        aws.terminate_instances(InstanceIds=[spot.instance_ids[1]])
        expected = observe(provider, allocations)
        (gone,) = expected.interruptions[spot.id]
        assert gone.instance_id == spot.instance_ids[1]
        assert sorted(expected.exit_codes[spot.id].values(), key=str) == [-1] * 4 + [None] * 4

        # The async read may not use the provider's synchronous boto3 client at all.
        def no_sync_client(self: EC2Provider) -> Any:
            raise AssertionError("boto3 called from the event loop")

        monkeypatch.setattr(EC2Provider, "client", no_sync_client)
        got = _async_view(observer, allocations)
        assert got.exit_codes == expected.exit_codes
        # moto gives no end time in the state reason, so both stamp "now": compare the rest
        assert (
            _taken(got)
            == _taken(expected)
            == {spot.id: [(gone.instance_id, gone.reason)], on_demand.id: []}
        )
        assert _async_view(observer, []) == CloudView({}, {})
    finally:
        monkeypatch.undo()
        provider.release(spot)
        provider.release(on_demand)


def test_the_local_provider_is_read_in_a_thread(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "cloud")
    alloc = provider.launch(LaunchRequest("local.cpu", count=1))
    try:
        view = _async_view(AsyncObserver(provider), [alloc])
        assert view == observe(provider, [alloc])
        assert view.interruptions == {alloc.id: ()}
    finally:
        provider.release(alloc)
