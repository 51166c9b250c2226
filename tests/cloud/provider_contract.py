"""The provider contract: one suite every ``Provider`` passes (local, emulated, EC2).

Subclass ``ProviderContract`` in a test module and define the ``provider`` fixture plus the
class attributes below; pytest collects the inherited tests for each subclass.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from srifty_core.catalog import MissingPriceError
from srifty_core.catalog.types import Market
from srifty_core.cloud import InstanceState, LaunchRequest, Provider
from srifty_core.cloud.base import BILLING_MINIMUM_S
from srifty_core.errors import UnknownNameError


class ProviderContract:
    instance_type: str = "g4dn.xlarge"
    """A type with on-demand and spot prices."""
    unpriced_type: str | None = None
    """A type the provider knows but cannot price (``None``: every known type is priced)."""
    unpriced_market: str = "spot"

    def interrupt(self, provider: Provider, instance_id: str) -> None:
        """Make the cloud take ``instance_id`` back (each provider has its own way)."""
        raise NotImplementedError

    def test_launch_state_release_idempotent(self, provider: Provider) -> None:
        a = provider.launch(LaunchRequest(self.instance_type, count=2))
        assert a.count == 2 and a.spec.name == self.instance_type
        assert provider.get_allocation(a.id).id == a.id
        inst = provider.describe(a)
        assert [i.state for i in inst] == [InstanceState.RUNNING] * 2
        assert {i.allocation_id for i in inst} == {a.id}
        assert all(i.launched_at is not None and i.ended_at is None for i in inst)
        provider.release(a)
        after = provider.describe(a)
        assert [i.state for i in after] == [InstanceState.TERMINATED] * 2
        assert all(i.ended_at is not None for i in after)
        provider.release(a)  # idempotent
        provider.release(a.id)
        assert [i.state for i in provider.describe(a)] == [InstanceState.TERMINATED] * 2
        assert provider.interruptions(a) == ()

    def test_interruptions_are_reported(self, provider: Provider) -> None:
        a = provider.launch(LaunchRequest(self.instance_type, count=2, market=Market.SPOT))
        try:
            self.interrupt(provider, a.instance_ids[1])
            states = [i.state for i in provider.describe(a)]
            assert states == [InstanceState.RUNNING, InstanceState.INTERRUPTED]
            (x,) = provider.interruptions(a)
            assert x.instance_id == a.instance_ids[1] and x.reason
        finally:
            provider.release(a)
        assert [i.state for i in provider.describe(a)] == [
            InstanceState.TERMINATED,
            InstanceState.INTERRUPTED,
        ]

    def test_pricing_never_zero(self, provider: Provider) -> None:
        od = provider.price(self.instance_type, "on-demand")
        spot = provider.price(self.instance_type, Market.SPOT)
        assert od.usd_per_hour > 0 and spot.usd_per_hour > 0
        with pytest.raises(UnknownNameError):
            provider.price("g4dn.xlarg", "on-demand")
        if self.unpriced_type is not None:
            with pytest.raises(MissingPriceError):
                provider.price(self.unpriced_type, self.unpriced_market)

    def test_cost_is_per_second_since_launch(self, provider: Provider) -> None:
        a = provider.launch(LaunchRequest(self.instance_type, count=2))
        try:
            usd_h = provider.price(self.instance_type, a.market, None).usd_per_hour
            # each instance bills from its own launch: one launch call can straddle a
            # second boundary of the cloud's clock (moto's did, in a CI run)
            starts = [i.launched_at for i in provider.describe(a)]
            assert None not in starts and len(starts) == 2
            start = min(s for s in starts if s is not None)

            def billed(until: Any) -> float:
                out = 0.0
                for t in starts:
                    assert t is not None
                    up = (until - t).total_seconds()
                    out += usd_h * max(BILLING_MINIMUM_S, up) / 3600 if up > 0 else 0.0
                return out

            for after in (timedelta(hours=1), timedelta(seconds=1800.5), timedelta(seconds=10)):
                until = start + after
                assert provider.cost(a, until=until) == pytest.approx(billed(until), rel=1e-9)
            assert provider.cost(a, until=start + timedelta(hours=1)) == pytest.approx(
                2 * usd_h, rel=1e-3
            )
            assert provider.cost(a, until=start) == 0.0
        finally:
            provider.release(a)
        ended = max(i.ended_at for i in provider.describe(a) if i.ended_at is not None)
        frozen = provider.cost(a, until=ended + timedelta(days=3))
        assert frozen == pytest.approx(provider.cost(a, until=ended), rel=1e-12)
        assert frozen > 0

    def test_cost_without_price_raises(self, provider: Provider) -> None:
        if self.unpriced_type is None:
            pytest.skip("every type this provider knows has a price")
        try:
            a = provider.launch(
                LaunchRequest(
                    self.unpriced_type, count=1, market=Market.parse(self.unpriced_market)
                )
            )
        except MissingPriceError:
            return  # refusing to launch what it cannot bill is the other correct answer
        try:
            with pytest.raises(MissingPriceError):
                provider.cost(a)
        finally:
            provider.release(a)
