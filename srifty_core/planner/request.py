"""A planning request: what the user asks, validated field by field."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from srifty_core.catalog.types import Market
from srifty_core.errors import ConfigError
from srifty_core.simulator.types import SimInstance, Workload


class Objective(StrEnum):
    TIME = "time"
    """Finish as soon as possible within the budget."""
    COST = "cost"
    """Spend as little as possible within the time limit."""

    @classmethod
    def parse(cls, value: str | Objective) -> Objective:
        if isinstance(value, Objective):
            return value
        key = str(value).strip().lower().removeprefix("min_").removeprefix("minimize_")
        for o in cls:
            if o.value == key:
                return o
        raise ConfigError(f"objective: {value!r} is not one of time, cost")


@dataclass(frozen=True, slots=True)
class Offer:
    """Up to ``quota`` VMs of ``instance`` on ``market`` at ``usd_per_hour`` each."""

    instance: SimInstance
    market: Market
    quota: int
    usd_per_hour: float
    zone: str | None = None
    min_batch: int | None = None
    """Smallest local batch per GPU worth running (saturation threshold); default: the
    profile's first breakpoint, where training turns throughput-bound."""

    def __post_init__(self) -> None:
        name = f"offers[{self.instance.name}/{self.market.value}]"
        if not isinstance(self.quota, int) or self.quota < 0:
            raise ConfigError(f"{name}.quota: must be a whole number >= 0, got {self.quota!r}")
        if not _positive_number(self.usd_per_hour):
            raise ConfigError(f"{name}.usd_per_hour: must be a positive number")
        if self.min_batch is not None and self.min_batch < 1:
            raise ConfigError(f"{name}.min_batch: must be >= 1")

    @property
    def key(self) -> str:
        return offer_key(self.instance.name, self.market)


def offer_key(instance_type: str, market: Market | str) -> str:
    """``type/market`` (``g4dn.xlarge/spot``): how offers, depleted types and lost VMs are
    named across a job's plans."""
    return f"{instance_type}/{Market.parse(market).value}"


@dataclass(frozen=True, slots=True)
class Overheads:
    """Fixed costs of starting (or switching) a configuration, added to time and cost."""

    launch_s: float = 150.0
    """From the request to running VMs (EC2 is about 150 s)."""
    detach_s: float = 0.0
    """Moving a checkpoint volume (EBS detach is about 5 s), when re-planning."""
    solve_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.launch_s + self.detach_s + self.solve_s


DEFAULT_RISK_QUANTILE = 0.9
"""Limits are checked against the 90th percentile of predicted job time and cost."""


@dataclass(frozen=True)
class PlanRequest:
    """Train ``workload`` for ``iterations`` iterations of ``global_batch`` samples on VMs
    chosen from ``offers``, within ``time_limit_s`` and ``budget_usd``, optimizing
    ``objective``."""

    workload: Workload
    global_batch: int
    iterations: int
    offers: tuple[Offer, ...]
    time_limit_s: float = math.inf
    budget_usd: float = math.inf
    objective: Objective = Objective.TIME
    overheads: Overheads = field(default_factory=Overheads)
    batch_granularity: str = "pow2"
    """``pow2``: local batches per GPU are powers of two (the method's pruning); ``any``:
    every integer (exhaustive only; for small problems and tests)."""
    risk_quantile: float = DEFAULT_RISK_QUANTILE
    """The limits hold for this quantile of the predicted job time and cost over the
    allocations the job may land on (``IterationEstimate.t_iter_quantile``); 0.5 checks the
    typical allocation. Configurations are still ranked by their typical time and cost."""

    def __post_init__(self) -> None:
        if not isinstance(self.global_batch, int) or self.global_batch < 1:
            raise ConfigError(
                f"global_batch: must be a whole number >= 1, got {self.global_batch!r}"
            )
        if not isinstance(self.iterations, int) or self.iterations < 1:
            raise ConfigError(f"iterations: must be a whole number >= 1, got {self.iterations!r}")
        if not _positive_number(self.time_limit_s):
            raise ConfigError(f"time_limit_s: must be a positive number, got {self.time_limit_s!r}")
        if not _positive_number(self.budget_usd):
            raise ConfigError(f"budget_usd: must be a positive number, got {self.budget_usd!r}")
        object.__setattr__(self, "objective", Objective.parse(self.objective))
        if not self.offers:
            raise ConfigError("offers: at least one instance type offer is needed")
        keys = [o.key for o in self.offers]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ConfigError(f"offers: listed twice: {', '.join(dupes)}")
        q = self.risk_quantile
        if not (_positive_number(q) and 0.5 <= q < 1.0):
            raise ConfigError(f"risk_quantile: must be a number in [0.5, 1), got {q!r}")
        if self.batch_granularity not in ("pow2", "any"):
            raise ConfigError("batch_granularity: must be 'pow2' or 'any'")
        for o in self.offers:
            self.workload.profile(o.instance.device_type)  # raises naming the device
        if all(o.quota == 0 for o in self.offers):
            raise ConfigError("offers: every quota is 0, nothing can be rented")
        most = sum(
            o.quota * o.instance.ranks_per_vm * self.workload.profile(o.instance.device_type).b_max
            for o in self.offers
        )
        if most < self.global_batch:
            raise ConfigError(
                f"global_batch: {self.global_batch} cannot be held by any configuration: the "
                f"quotas hold at most {most} samples at B_max on every GPU"
            )


def _positive_number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and x > 0 and not math.isnan(x)


def offers_from_catalog(
    catalog: Any,
    spec: Sequence[Mapping[str, Any]],
    region: str,
    *,
    provider: str = "ec2",
) -> tuple[Offer, ...]:
    """Offers from ``[{"type": "g4dn.xlarge", "market": "spot", "quota": 8, "price": 0.3?,
    "zone": ...}]``, with features and (unless given) prices from the catalog."""
    out = []
    for i, item in enumerate(spec):
        where = f"offers[{i}]"
        if "type" not in item:
            raise ConfigError(f"{where}.type: missing")
        t = catalog.get(str(item["type"]), region)
        market = Market.parse(str(item.get("market", "on-demand")))
        zone = item.get("zone")
        price = item.get("price")
        if price is None:
            if market is Market.SPOT and zone is None:
                zone, p = catalog.cheapest_spot(t.name, region)
            else:
                p = catalog.price(t.name, market, region, zone)
            price = p.usd_per_hour
        inst = SimInstance.from_catalog(t, provider=provider, zone=str(zone or ""))
        out.append(
            Offer(
                instance=inst,
                market=market,
                quota=item.get("quota", 0),
                usd_per_hour=float(price),
                zone=zone,
                min_batch=item.get("min_batch"),
            )
        )
    return tuple(out)


REQUEST_FIELDS = {
    "model", "size", "region", "provider", "global_batch", "iterations", "time_limit_s",
    "budget_usd", "objective", "overheads", "offers", "batch_granularity", "risk_quantile",
}  # fmt: skip


def request_from_dict(
    d: Mapping[str, Any],
    *,
    catalog: Any,
    load_profile: Any,
) -> PlanRequest:
    """A request from its YAML/JSON form (see ``docs`` in the README)::

        model: resnet50          # zoo name; profiles are looked up per GPU of the offers
        size: full               # profile size preset (default full)
        region: us-east-1
        global_batch: 1024
        iterations: 400
        time_limit_s: 500        # optional
        budget_usd: 10           # optional
        objective: cost          # time (default) or cost
        risk_quantile: 0.9       # limits hold for this quantile of time and cost (default)
        overheads: {launch_s: 150, detach_s: 5}
        offers:
          - {type: p3.8xlarge, market: spot, quota: 2}          # price from the catalog
          - {type: g4dn.8xlarge, market: on-demand, quota: 8, price: 2.0}

    ``load_profile(model, size, device_type)`` returns a ``ComputeProfile``.
    """
    unknown = sorted(set(d) - REQUEST_FIELDS)
    if unknown:
        from srifty_core.errors import UnknownNameError

        raise UnknownNameError("request field", unknown[0], REQUEST_FIELDS)
    for key in ("model", "global_batch", "iterations", "offers"):
        if key not in d:
            raise ConfigError(f"{key}: missing")
    if not isinstance(d["offers"], list):
        raise ConfigError("offers: must be a list of {type, market, quota[, price, zone]}")
    region = str(d.get("region", "us-east-1"))
    catalog.check_region(region)
    offers = offers_from_catalog(
        catalog, d["offers"], region, provider=str(d.get("provider", "ec2"))
    )
    model, size = str(d["model"]), str(d.get("size", "full"))
    profiles = {
        o.instance.device_type: load_profile(model, size, o.instance.device_type) for o in offers
    }
    oh = d.get("overheads") or {}
    if not isinstance(oh, Mapping):
        raise ConfigError("overheads: must be a mapping like {launch_s: 150}")
    try:
        overheads = Overheads(**{k: float(v) for k, v in oh.items()})
    except TypeError as exc:
        raise ConfigError(f"overheads: {exc}") from exc
    return PlanRequest(
        workload=Workload(model, profiles),
        global_batch=d["global_batch"],
        iterations=d["iterations"],
        offers=offers,
        time_limit_s=d.get("time_limit_s", math.inf),
        budget_usd=d.get("budget_usd", math.inf),
        objective=Objective.parse(str(d.get("objective", "time"))),
        overheads=overheads,
        batch_granularity=str(d.get("batch_granularity", "pow2")),
        risk_quantile=d.get("risk_quantile", DEFAULT_RISK_QUANTILE),
    )
