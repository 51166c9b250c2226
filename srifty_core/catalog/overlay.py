"""Price overlays: newer price observations merged over the shipped catalog.

An overlay is a CSV with the columns of ``OVERLAY_COLUMNS``, one observation a row. Providers
(for example EC2's spot price history) write overlays into ``<data dir>/prices/``; the
shipped files are never edited. When merged, an observation replaces the catalog's price
for the same (instance type, region, market, zone) only if it is at least as recent.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date
from pathlib import Path

from srifty_core.atomic import write_text_atomic
from srifty_core.catalog.types import Market, Price
from srifty_core.errors import ConfigError

OVERLAY_COLUMNS = (
    "instance_type",
    "region",
    "market",
    "zone",
    "usd_per_hour",
    "observed_on",
    "source",
)


@dataclass(frozen=True, slots=True)
class PriceObservation:
    """One observed price. ``zone`` is an AZ ID for spot, ``None`` for on-demand."""

    instance_type: str
    region: str
    market: Market
    zone: str | None
    price: Price

    def __post_init__(self) -> None:
        if self.market is Market.SPOT and not self.zone:
            raise ConfigError(f"spot observation for {self.instance_type} needs a zone")


def read_overlay(path: Path) -> list[PriceObservation]:
    """Read one overlay CSV; a bad row raises ``ConfigError`` naming file, line and column."""
    out: list[PriceObservation] = []
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in OVERLAY_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"{path}: missing column(s) {', '.join(missing)}")
        for line, row in enumerate(reader, start=2):
            column = "market"
            try:
                market = Market.parse(row["market"])
                column = "usd_per_hour"
                usd = float(row["usd_per_hour"])
                column = "observed_on"
                observed = date.fromisoformat(row["observed_on"])
                column = "usd_per_hour"
                price = Price(usd, observed, row["source"] or path.name)
            except (ValueError, LookupError) as exc:
                raise ConfigError(f"{path}:{line}: bad {column}: {exc}") from exc
            out.append(
                PriceObservation(
                    instance_type=row["instance_type"],
                    region=row["region"],
                    market=market,
                    zone=row["zone"] or None,
                    price=price,
                )
            )
    return out


def read_overlay_dir(folder: Path) -> list[PriceObservation]:
    """Every ``*.csv`` overlay in ``folder`` (sorted by name); none if it does not exist."""
    if not folder.is_dir():
        return []
    out: list[PriceObservation] = []
    for path in sorted(folder.glob("*.csv")):
        out.extend(read_overlay(path))
    return out


def write_overlay(path: Path, observations: Iterable[PriceObservation]) -> Path:
    """Write an overlay CSV atomically (temporary file in the same folder, then rename)."""
    buf = io.StringIO(newline="")
    writer = csv.writer(buf)
    writer.writerow(OVERLAY_COLUMNS)
    for o in observations:
        writer.writerow(
            [
                o.instance_type,
                o.region,
                o.market.value,
                o.zone or "",
                repr(o.price.usd_per_hour),
                o.price.observed_on.isoformat(),
                o.price.source,
            ]
        )
    return write_text_atomic(path, buf.getvalue())
