"""EC2's spot prices into the catalog: the newest Linux spot price per (instance type,
zone) from ``describe_spot_price_history``, written as an overlay CSV under the price
overlay folder (``catalog.overlay``), where the catalog merges it with the shipped
snapshot by date. The provider itself prices from the catalog (``EC2Provider.price``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from srifty_core import paths
from srifty_core.catalog.overlay import PriceObservation, write_overlay
from srifty_core.catalog.types import Market, Price
from srifty_core.cloud.ec2.provider import EC2Provider


def refresh_spot_prices(
    provider: EC2Provider,
    instance_types: Sequence[str],
    *,
    hours: float = 24.0,
    root: Path | None = None,
) -> Path:
    """Newest Linux spot price per (type, zone) in ``provider``'s region over the last
    ``hours``, written as ``ec2-spot-<region>.csv`` under the price overlay folder (or
    ``root``); returns the file."""
    for name in instance_types:
        provider.instance_type(name)
    client = provider.client()
    start = datetime.now(UTC) - timedelta(hours=hours)
    newest: dict[tuple[str, str], tuple[datetime, float]] = {}
    pages = client.get_paginator("describe_spot_price_history").paginate(
        InstanceTypes=list(instance_types),
        ProductDescriptions=["Linux/UNIX"],
        StartTime=start,
    )
    zone_ids = provider.zone_ids()
    for page in pages:
        for rec in page["SpotPriceHistory"]:
            zone = zone_ids.get(rec["AvailabilityZone"], rec["AvailabilityZone"])
            key = (rec["InstanceType"], zone)
            ts = rec["Timestamp"]
            if key not in newest or ts > newest[key][0]:
                newest[key] = (ts, float(rec["SpotPrice"]))
    obs = [
        PriceObservation(
            instance_type=name,
            region=provider.region,
            market=Market.SPOT,
            zone=zone,
            price=Price(usd, ts.date(), "ec2:describe_spot_price_history"),
        )
        for (name, zone), (ts, usd) in sorted(newest.items())
        if usd > 0
    ]
    target = (root or paths.price_overlay_dir()) / f"ec2-spot-{provider.region}.csv"
    return write_overlay(target, obs)
