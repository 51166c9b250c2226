"""Re-planning: the original request shrunk to what is left, then the planner again.

The remaining iterations, time and budget are ``N - n``, ``T - t`` and ``$ - c``; the
depleted (preempted) instance types are dropped from the offers; the overheads of
switching (launching the new VMs, detaching the checkpoint volume) are set on the request
so that the planner charges them. The original request is never modified.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from srifty_core.errors import ConfigError
from srifty_core.planner.request import Offer, Overheads, PlanRequest
from srifty_core.planner.result import PlanResult

SWITCH_OVERHEADS = Overheads(launch_s=150.0, detach_s=5.0)
"""EC2's launch time and EBS's detach time, the method's defaults."""


def remaining_request(
    request: PlanRequest,
    *,
    iterations_done: int,
    elapsed_s: float,
    spent_usd: float,
    depleted: Iterable[str] = (),
    overheads: Overheads = SWITCH_OVERHEADS,
) -> PlanRequest:
    """The request for the rest of the job (a new object)."""
    left = request.iterations - iterations_done
    if left < 1:
        raise ConfigError(f"iterations_done: {iterations_done} leaves nothing to plan")
    time_left = request.time_limit_s - elapsed_s
    budget_left = request.budget_usd - spent_usd
    if time_left <= 0 or budget_left <= 0:
        which = "time limit" if time_left <= 0 else "budget"
        raise ConfigError(f"the {which} is already spent; nothing can be planned for the rest")
    gone = set(depleted)
    offers = without_depleted(request.offers, gone)
    if not offers:
        raise ConfigError(f"every offered instance type is depleted ({', '.join(sorted(gone))})")
    return dataclasses.replace(
        request,
        iterations=left,
        time_limit_s=time_left if math.isfinite(time_left) else math.inf,
        budget_usd=budget_left if math.isfinite(budget_left) else math.inf,
        offers=offers,
        overheads=overheads,
    )


def without_depleted(offers: Iterable[Offer], depleted: Iterable[str]) -> tuple[Offer, ...]:
    """The offers whose type (``g4dn.xlarge``) or offer key (``g4dn.xlarge/spot``) is not
    depleted."""
    gone = set(depleted)
    return tuple(o for o in offers if o.instance.name not in gone and o.key not in gone)


def replan(
    request: PlanRequest,
    estimator: Any,
    *,
    iterations_done: int,
    elapsed_s: float,
    spent_usd: float,
    depleted: Iterable[str] = (),
    overheads: Overheads = SWITCH_OVERHEADS,
    **plan_kwargs: Any,
) -> PlanResult:
    """Plan the rest of the job (see ``remaining_request``) with the original objective."""
    from srifty_core.planner.search import plan

    rest = remaining_request(
        request,
        iterations_done=iterations_done,
        elapsed_s=elapsed_s,
        spent_usd=spent_usd,
        depleted=depleted,
        overheads=overheads,
    )
    return plan(rest, estimator, **plan_kwargs)
