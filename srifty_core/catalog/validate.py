"""Consistency checks over a catalog: what a planner would trip on, found before it runs."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from enum import StrEnum

from srifty_core.catalog.catalog import Catalog

# AZ IDs start with a region code: use1-az1 is in us-east-1, usw2-az3 in us-west-2.
_REGION_CODES = {"us-east-1": "use1", "us-east-2": "use2", "us-west-1": "usw1", "us-west-2": "usw2"}

STALE_AFTER_DAYS = 365
"""A price older than this (by its upper-bound date) is reported as stale."""


class Severity(StrEnum):
    ERROR = "error"
    """The planner would give a wrong answer with this entry."""
    WARNING = "warning"
    """Usable, but the user should know (a missing spot price, a stale price)."""


@dataclass(frozen=True, slots=True)
class Finding:
    severity: Severity
    instance_type: str
    region: str
    check: str
    message: str


def validate(catalog: Catalog, today: date | None = None) -> list[Finding]:
    """Every finding over ``catalog``, errors first, then by type and region."""
    today = today or date.today()
    out: list[Finding] = []

    def add(sev: Severity, t_name: str, region: str, check: str, msg: str) -> None:
        out.append(Finding(sev, t_name, region, check, msg))

    for t in catalog.types:
        if t.gpu is None:
            add(Severity.ERROR, t.name, t.region, "gpu_spec", f"no GPU spec for family {t.family}")
        elif t.gpu.model != t.gpu_model:
            add(
                Severity.ERROR,
                t.name,
                t.region,
                "gpu_spec",
                f"GPU spec is {t.gpu.model} but the type says {t.gpu_model}",
            )
        if t.gpus_per_vm < 1 or t.vcpus < 1 or t.memory_gib <= 0 or t.gpu_memory_gib <= 0:
            add(Severity.ERROR, t.name, t.region, "shape", "non-positive GPU, vCPU or memory count")
        if t.network_gbps <= 0:
            add(Severity.ERROR, t.name, t.region, "network", "rated network is not positive")
        if t.ondemand is None:
            add(Severity.ERROR, t.name, t.region, "ondemand_price", "no on-demand price")
        if not t.spot_zones:
            add(Severity.WARNING, t.name, t.region, "spot_price", "no zone-level spot price")
        code = _REGION_CODES.get(t.region)
        for zone, price in t.spot_zones:
            if code is not None and not zone.startswith(code + "-"):
                add(
                    Severity.ERROR,
                    t.name,
                    t.region,
                    "zone",
                    f"zone {zone} is not in region {t.region}",
                )
            if t.ondemand is not None and price.usd_per_hour > t.ondemand.usd_per_hour:
                add(
                    Severity.WARNING,
                    t.name,
                    t.region,
                    "spot_above_ondemand",
                    f"spot {price.usd_per_hour:.4f} $/h in {zone} exceeds on-demand "
                    f"{t.ondemand.usd_per_hour:.4f} $/h",
                )
        stale = [p for p in t.prices() if p.age_days(today) > STALE_AFTER_DAYS]
        if stale:
            oldest = min(p.observed_on for p in stale)
            add(
                Severity.WARNING,
                t.name,
                t.region,
                "stale_price",
                f"{len(stale)} price(s) older than {STALE_AFTER_DAYS} days (oldest {oldest})",
            )
    out.sort(key=lambda f: (f.severity is not Severity.ERROR, f.instance_type, f.region, f.check))
    return out
