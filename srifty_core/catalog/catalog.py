"""``Catalog``: pure, immutable look-ups over instance types and their prices."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import date
from functools import cache
from pathlib import Path

from srifty_core import paths
from srifty_core.catalog.loader import load_instance_types
from srifty_core.catalog.overlay import PriceObservation, read_overlay_dir
from srifty_core.catalog.types import InstanceType, Market, Price
from srifty_core.errors import ConfigError, SriftyError, UnknownNameError


class MissingPriceError(SriftyError, LookupError):
    """The catalog has no price for this (type, market, region, zone). Never read as 0."""

    def __str__(self) -> str:
        return str(self.args[0])


class Catalog:
    """Instance types by (name, region), with price look-ups.

    Immutable: ``with_prices`` returns a new catalog. Build one with ``Catalog.load()``
    (the shipped files plus any overlays under the data folder) or from ``InstanceType``
    values directly (tests).
    """

    __slots__ = ("_by_key", "_types")

    def __init__(self, types: Iterable[InstanceType]) -> None:
        ordered = sorted(types, key=lambda t: (t.family, t.gpus_per_vm, t.vcpus, t.name, t.region))
        by_key: dict[tuple[str, str], InstanceType] = {}
        for t in ordered:
            if (t.name, t.region) in by_key:
                raise ValueError(f"duplicate instance type {t.name} in {t.region}")
            by_key[(t.name, t.region)] = t
        self._types: tuple[InstanceType, ...] = tuple(ordered)
        self._by_key = by_key

    # ---------------------------------------------------------------- construction
    @classmethod
    def load(
        cls,
        catalog_dir: Path | None = None,
        overlay_dir: Path | None = None,
        *,
        use_overlays: bool = True,
    ) -> Catalog:
        """The shipped catalog, with the overlays in ``overlay_dir`` merged in.

        ``overlay_dir`` defaults to ``<data dir>/prices``; pass ``use_overlays=False`` for
        the shipped prices alone.
        """
        catalog = _shipped(catalog_dir or paths.CATALOG_DIR)
        if use_overlays:
            observations = read_overlay_dir(overlay_dir or paths.price_overlay_dir())
            if observations:
                catalog = catalog.with_prices(observations)
        return catalog

    def with_prices(self, observations: Iterable[PriceObservation]) -> Catalog:
        """A new catalog where each observation replaces an older price it matches."""
        updated = dict(self._by_key)
        for obs in observations:
            t = updated.get((obs.instance_type, obs.region)) or self.get(
                obs.instance_type, obs.region
            )
            if obs.market is Market.ON_DEMAND:
                if t.ondemand is None or obs.price.observed_on >= t.ondemand.observed_on:
                    t = dataclasses.replace(t, ondemand=obs.price)
            else:
                if obs.zone is None:
                    raise ConfigError(f"spot observation for {obs.instance_type} has no zone")
                zones = dict(t.spot_zones)
                old = zones.get(obs.zone)
                if old is None or obs.price.observed_on >= old.observed_on:
                    zones[obs.zone] = obs.price
                    t = dataclasses.replace(t, spot_zones=tuple(sorted(zones.items())))
            updated[(t.name, t.region)] = t
        return Catalog(updated.values())

    # ---------------------------------------------------------------- look-ups
    def __len__(self) -> int:
        return len(self._types)

    def __iter__(self) -> Iterable[InstanceType]:
        return iter(self._types)

    @property
    def types(self) -> tuple[InstanceType, ...]:
        return self._types

    def names(self) -> list[str]:
        return sorted({t.name for t in self._types})

    def regions(self) -> list[str]:
        return sorted({t.region for t in self._types})

    def families(self) -> list[str]:
        return sorted({t.family for t in self._types})

    def check_region(self, region: str) -> str:
        if region not in self.regions():
            raise UnknownNameError("region", region, self.regions())
        return region

    def check_family(self, family: str) -> str:
        if family not in self.families():
            raise UnknownNameError("instance family", family, self.families())
        return family

    def get(self, name: str, region: str) -> InstanceType:
        """The type ``name`` in ``region``; unknown names raise with the closest names."""
        t = self._by_key.get((name, region))
        if t is not None:
            return t
        if name not in self.names():
            raise UnknownNameError("instance type", name, self.names())
        self.check_region(region)
        offered = sorted(r for (n, r) in self._by_key if n == name)
        raise UnknownNameError("region", region, offered, context=f"for {name}")

    def select(self, family: str | None = None, region: str | None = None) -> list[InstanceType]:
        """Types filtered by family and/or region (each checked against known names)."""
        if family is not None:
            self.check_family(family)
        if region is not None:
            self.check_region(region)
        return [
            t
            for t in self._types
            if (family is None or t.family == family) and (region is None or t.region == region)
        ]

    def by_family(self, family: str, region: str | None = None) -> list[InstanceType]:
        return self.select(family=family, region=region)

    def by_region(self, region: str) -> list[InstanceType]:
        return self.select(region=region)

    # ---------------------------------------------------------------- prices
    def price(self, name: str, market: Market | str, region: str, zone: str | None = None) -> Price:
        """The hourly price of ``name`` in ``region`` on ``market``.

        On-demand prices are regional (``zone`` is ignored). Spot prices are per zone, so
        ``zone`` is required for spot; use ``cheapest_spot`` to pick one.
        """
        t = self.get(name, region)
        m = Market.parse(market)
        if m is Market.ON_DEMAND:
            if t.ondemand is None:
                raise MissingPriceError(f"no on-demand price for {name} in {region}")
            return t.ondemand
        zones = t.spot_by_zone
        if not zones:
            raise MissingPriceError(
                f"no spot price for {name} in {region} in any zone (the shipped sources have "
                f"none; add an overlay in {paths.price_overlay_dir()})"
            )
        if zone is None:
            raise MissingPriceError(
                f"spot prices are per zone: pass a zone for {name} in {region} "
                f"({', '.join(zones)}) or use cheapest_spot()"
            )
        if zone not in zones:
            raise UnknownNameError("zone", zone, zones, context=f"with a spot price for {name}")
        return zones[zone]

    def cheapest_spot(self, name: str, region: str) -> tuple[str, Price]:
        """(zone, price) of the cheapest spot zone; ties go to the lowest zone ID."""
        summary = self.get(name, region).spot_summary
        if summary is None:
            raise MissingPriceError(f"no spot price for {name} in {region} in any zone")
        return summary.cheapest_zone, self.price(name, Market.SPOT, region, summary.cheapest_zone)

    def price_dates(self) -> tuple[date, date]:
        """(oldest, newest) observation date over every price in the catalog."""
        days = [p.observed_on for t in self._types for p in t.prices()]
        if not days:
            raise MissingPriceError("the catalog holds no prices")
        return min(days), max(days)

    def price_age_days(self, today: date | None = None) -> tuple[int, int]:
        """Age in days of the (newest, oldest) price; prices are dated by upper bounds."""
        today = today or date.today()
        oldest, newest = self.price_dates()
        return (today - newest).days, (today - oldest).days


@cache
def _shipped(catalog_dir: Path) -> Catalog:
    """The shipped catalog, parsed once per process (it is immutable)."""
    return Catalog(load_instance_types(catalog_dir))
