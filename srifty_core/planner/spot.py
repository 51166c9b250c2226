"""Spot interruptions priced into a plan: a hazard per VM-hour, and what it adds to a job's
expected time and cost and to their quantile.

Contract: ``monthly_share`` reads a Spot Instance Advisor band, ``hazard_per_hour`` turns a
monthly share into interruptions per VM-hour, and ``interruption_risk(rate_per_hour, ...)``
returns a ``SpotRisk`` (expected interruptions, the count at the risk quantile, the time
they add on average and at the quantile; infinite where the configuration is interrupted
faster than it recovers; ``NONE`` without spot VMs). Pure functions.

Imports nothing of srifty_core (standard library only).

How and why (hazard, cost of an interruption, job time): docs/design/planner.md#spot
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BAND_MONTHLY: dict[str, float] = {
    "<5%": 0.025,
    "5-10%": 0.075,
    "10-15%": 0.125,
    "15-20%": 0.175,
    ">20%": 0.25,
}
"""Spot Instance Advisor's frequency-of-interruption bands, as the share of VMs interrupted
per month that the planner uses (midpoints; the open top band at 25%)."""
HOURS_PER_MONTH = 730.0
FIXED_POINT_ROUNDS = 8


def monthly_share(band: str | None) -> float | None:
    """The share per month a catalog band stands for (None for an unknown or empty band)."""
    if not band:
        return None
    return BAND_MONTHLY.get(band.strip().replace(" ", ""))


def hazard_per_hour(share_per_month: float) -> float:
    """Interruptions per VM-hour of a constant hazard that interrupts ``share_per_month``
    of VMs within a 730-hour month."""
    if not 0.0 <= share_per_month < 1.0:
        raise ValueError(f"share per month must be in [0, 1), got {share_per_month}")
    return -math.log1p(-share_per_month) / HOURS_PER_MONTH


def poisson_quantile(q: float, mean: float) -> int:
    """The smallest ``k`` with ``P(N <= k) >= q`` for ``N ~ Poisson(mean)``."""
    if mean <= 0.0:
        return 0
    k, term = 0, math.exp(-mean)
    total = term
    while total < q and k < 100_000:
        k += 1
        term *= mean / k
        total += term
    return k


@dataclass(frozen=True, slots=True)
class SpotRisk:
    """What interruptions add to one configuration's job."""

    rate_per_hour: float
    """Expected interruptions per hour over the configuration's spot VMs."""
    expected: float
    """Expected interruptions over the job."""
    at_quantile: int
    """Interruptions at the request's risk quantile."""
    extra_s: float
    """Expected time they add."""
    extra_q_s: float
    """Time they add at the quantile."""

    @property
    def finite(self) -> bool:
        return math.isfinite(self.extra_s) and math.isfinite(self.extra_q_s)


NONE = SpotRisk(0.0, 0.0, 0, 0.0, 0.0)


def interruption_risk(
    rate_per_hour: float,
    *,
    time_s: float,
    time_q_s: float,
    checkpoint_s: float,
    restart_s: float,
    quantile: float,
) -> SpotRisk:
    """``SpotRisk`` of a job that takes ``time_s`` (``time_q_s`` at ``quantile``) without
    interruptions (rules: module docstring)."""
    if rate_per_hour <= 0.0:
        return NONE
    mean_loss = restart_s + checkpoint_s / 2.0
    busy = rate_per_hour * mean_loss / 3600.0
    if busy >= 1.0:
        return SpotRisk(rate_per_hour, math.inf, 0, math.inf, math.inf)
    total = time_s / (1.0 - busy)
    worst_loss = restart_s + checkpoint_s
    total_q = time_q_s
    k = 0
    for _ in range(FIXED_POINT_ROUNDS):
        k = poisson_quantile(quantile, rate_per_hour * total_q / 3600.0)
        nxt = time_q_s + k * worst_loss
        if nxt == total_q:
            break
        total_q = nxt
    return SpotRisk(
        rate_per_hour=rate_per_hour,
        expected=rate_per_hour * total / 3600.0,
        at_quantile=k,
        extra_s=total - time_s,
        extra_q_s=total_q - time_q_s,
    )
