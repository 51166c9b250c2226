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
from datetime import UTC, date, datetime, timedelta
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


def read_overlay(path: Path, today: date | None = None) -> list[PriceObservation]:
    """Read one overlay CSV; a bad row raises ``ConfigError`` naming file, line and column.
    An observation dated after ``today`` (default: today, UTC) plus a day is a bad row."""
    try:
        return _read_overlay(path, today or datetime.now(UTC).date())
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; a price overlay is a CSV file") from None
    except csv.Error as exc:
        raise ConfigError(f"{path}: not a CSV file ({exc})") from None


def _read_overlay(path: Path, today: date) -> list[PriceObservation]:
    out: list[PriceObservation] = []
    with path.open(newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in OVERLAY_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"{path}: missing column(s) {', '.join(missing)}")
        for line, row in enumerate(reader, start=2):
            column = "market"
            try:
                if None in row.values() or None in row:
                    column = "columns"
                    given = sum(v is not None for k, v in row.items() if k is not None)
                    given += len(row.get(None) or [])
                    raise ValueError(f"{given} fields, want {len(OVERLAY_COLUMNS)}")
                market = Market.parse(row["market"])
                column = "usd_per_hour"
                usd = float(row["usd_per_hour"])
                column = "observed_on"
                observed = date.fromisoformat(row["observed_on"])
                if observed > today + timedelta(days=1):
                    # an observation "from the future" would win over every real one
                    raise ValueError(f"{observed} is in the future (today is {today})")
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
