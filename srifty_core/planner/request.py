"""A planning request: what the user asks, validated field by field, and the one builder
of it from a checked request (``build_request``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from srifty_core.catalog.types import Market
from srifty_core.cloud import provider_class, shares_host
from srifty_core.cloud.local import DEFAULT_MAX_RANKS, LOCAL_CPU
from srifty_core.errors import ConfigError, SriftyError
from srifty_core.planner import fit, spot
from srifty_core.planner.schema import fields
from srifty_core.planner.schema.field_errors import check
from srifty_core.planner.schema.fields import DEFAULT_RISK_QUANTILE, DEFAULT_STRATEGY
from srifty_core.planner.schema.request_spec import OfferSpec, OverheadsSpec, RequestSpec
from srifty_core.sharding.memory import STRATEGIES, Strategy, parse_strategy
from srifty_core.simulator.types import SimInstance, Workload
from srifty_core.training_settings import TrainingSettings


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
    interrupt_per_hour: float = 0.0
    """Interruptions per VM-hour (``planner.spot``): 0 on demand."""

    def __post_init__(self) -> None:
        name = f"offers[{self.instance.name}/{self.market.value}]"
        check(f"{name}.quota", fields.Quota, self.quota)
        # A local worker's price is the user's (0: free); a cloud offer's is never 0.
        local = self.instance.name == fields.LOCAL_TYPE
        price = fields.LocalPrice if local else fields.Price
        check(f"{name}.usd_per_hour", price, self.usd_per_hour)
        if not (math.isfinite(self.interrupt_per_hour) and self.interrupt_per_hour >= 0):
            raise ConfigError(
                f"{name}.interrupt_per_hour: must be a finite number >= 0, "
                f"got {self.interrupt_per_hour!r}"
            )
        if self.min_batch is not None:
            check(f"{name}.min_batch", fields.MinBatch, self.min_batch)

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

    def __post_init__(self) -> None:
        for name in ("launch_s", "detach_s", "solve_s"):
            check(f"overheads.{name}", fields.Seconds, getattr(self, name))

    @property
    def total_s(self) -> float:
        return self.launch_s + self.detach_s + self.solve_s


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
    checkpoint_every: int = 10
    """Iterations between checkpoints (what a spot interruption loses)."""
    spot_interruptions: str = "priced"
    """``priced`` (``planner.spot``) or ``ignored`` (spot planned as never interrupted)."""
    strategy: str = DEFAULT_STRATEGY
    """How the ranks hold the model: ``auto`` (the planner chooses, ``planner.strategies``)
    or ``ddp``, ``fsdp``, ``hsdp`` pinned (``sharding.memory.Strategy``)."""

    def __post_init__(self) -> None:
        # The scalar rules are the request schema's (planner.schema.fields); inf means no limit.
        check("global_batch", fields.GlobalBatch, self.global_batch)
        check("iterations", fields.Iterations, self.iterations)
        for name in ("time_limit_s", "budget_usd"):
            limit = getattr(self, name)
            if not (isinstance(limit, float) and limit == math.inf):
                check(name, fields.Limit, limit)
        object.__setattr__(self, "objective", Objective.parse(self.objective))
        if not self.offers:
            raise ConfigError("offers: at least one instance type offer is needed")
        keys = [o.key for o in self.offers]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise ConfigError(f"offers: listed twice: {', '.join(dupes)}")
        check("risk_quantile", fields.RiskQuantile, self.risk_quantile)
        check("batch_granularity", fields.Granularity, self.batch_granularity)
        check("checkpoint_every", fields.Iterations, self.checkpoint_every)
        check("spot_interruptions", fields.SpotPricing, self.spot_interruptions)
        check("strategy", fields.StrategyName, self.strategy)
        for o in self.offers:
            self.workload.profile(o.instance.device_type)  # raises naming the device
        if all(o.quota == 0 for o in self.offers):
            raise ConfigError("offers: every quota is 0, nothing can be rented")
        world = self.max_world
        most = sum(
            o.quota
            * o.instance.ranks_per_vm
            * max(fit.b_max(self.workload, o.instance, s, world) for s in self.strategies)
            for o in self.offers
        )
        if most < 1:  # beyond what the quotas hold: micro-batches (planner.strategies)
            raise ConfigError(
                f"global_batch: {self.global_batch} cannot be held by any configuration: the "
                f"quotas hold at most {most} samples at B_max on every GPU"
                + ("" if self.strategies == ("ddp",) else f" ({', '.join(self.strategies)})")
            )

    @property
    def strategies(self) -> tuple[Strategy, ...]:
        """The strategies the planner may choose from: every one under ``auto``."""
        return STRATEGIES if self.strategy == "auto" else (parse_strategy(self.strategy),)

    @property
    def max_world(self) -> int:
        """The most ranks a configuration can have: every offer's quota rented."""
        return max(1, sum(o.quota * o.instance.ranks_per_vm for o in self.offers))


def offers_from_catalog(
    catalog: Any,
    spec: Sequence[Mapping[str, Any] | OfferSpec],
    region: str,
    *,
    provider: str = "ec2",
) -> tuple[Offer, ...]:
    """Offers from ``[{"type": "g4dn.xlarge", "market": "spot", "quota": 8, "price": 0.3?,
    "zone": ...}]`` (each checked by ``OfferSpec``), with features and (unless given) prices
    from the catalog. Errors name the offer's field: ``offers[1].type: unknown ...``.
    ``provider``: the offers' ``provider`` feature; a provider of ``cloud.PROVIDERS`` also
    says whether their ranks share one host (``Provider.shares_host``)."""
    on_this_host = shares_host(provider)
    out = []
    for i, item in enumerate(spec):
        where = f"offers[{i}]"
        o = item if isinstance(item, OfferSpec) else OfferSpec.parse(item, where)
        t = _named(f"{where}.type", catalog.get, o.type, region)
        market = Market.parse(o.market)
        zone, price = o.zone, o.price
        if price is None:
            if market is Market.SPOT and zone is None:
                zone, p = _named(f"{where}.price", catalog.cheapest_spot, t.name, region)
            else:
                at = f"{where}.zone" if market is Market.SPOT else f"{where}.price"
                p = _named(at, catalog.price, t.name, market, region, zone)
            price = p.usd_per_hour
        inst = SimInstance.from_catalog(
            t, provider=provider, zone=str(zone or ""), shares_host=on_this_host
        )
        hazard = 0.0
        if market is Market.SPOT:
            share = o.interruptions_per_month
            if share is None:  # the catalog's band; a type without one: the top band
                share = spot.monthly_share(t.spot_interrupt_freq) or spot.BAND_MONTHLY[">20%"]
            hazard = spot.hazard_per_hour(share)
        out.append(
            Offer(
                instance=inst,
                market=market,
                quota=o.quota,
                usd_per_hour=float(price),
                zone=zone,
                min_batch=o.min_batch,
                interrupt_per_hour=hazard,
            )
        )
    return tuple(out)


def _named(path: str, lookup: Any, *args: Any) -> Any:
    """``lookup(*args)``, with a lookup error (unknown name, missing price) as a
    ``ConfigError`` naming the request field it came from."""
    try:
        return lookup(*args)
    except ConfigError:
        raise
    except (SriftyError, LookupError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc


REQUEST_FIELDS = frozenset(RequestSpec.model_fields)
"""The keys a request may have (``planner.schema.request_spec.RequestSpec``)."""


def local_offers(items: Sequence[OfferSpec]) -> tuple[Offer, ...]:
    """Offers of the local provider: ``local.cpu`` only (worker processes on this
    machine, at most ``cloud.local.DEFAULT_MAX_RANKS``), priced by the request."""
    out = []
    for i, o in enumerate(items):
        where = f"offers[{i}]"
        if o.type != LOCAL_CPU:
            raise ConfigError(
                f"{where}.type: the local provider offers only {LOCAL_CPU!r}, got {o.type!r}"
            )
        if o.quota > DEFAULT_MAX_RANKS:
            raise ConfigError(
                f"{where}.quota: need 0..{DEFAULT_MAX_RANKS} workers, got {o.quota!r}"
            )
        if o.price is None:
            raise ConfigError(
                f"{where}.price: {LOCAL_CPU} has no market price; give the $/hour a worker "
                "should count for in the budget"
            )
        market = Market.parse(o.market)
        out.append(Offer(SimInstance.local_cpu(), market, o.quota, o.price, min_batch=o.min_batch))
    return tuple(out)


def build_request(
    spec: RequestSpec,
    *,
    catalog: Any,
    load_profile: Any,
    vm_evidence: Mapping[str, tuple[float, int]] | None = None,
    load_units: Any = None,
) -> PlanRequest:
    """The ``PlanRequest`` of ``spec`` (a checked request: ``srifty plan``'s, or a job's
    conf, ``JobConf``, which is one): the one builder, so the same request plans alike
    through ``srifty plan``, ``srifty train --job`` and the plan-and-train DAG.

    Offers: the local provider's ``local.cpu`` workers, else the catalog's types in
    ``region`` (prices from the catalog unless given); profiles:
    ``load_profile(model, size, device_type[, settings])`` per GPU of the offers (the
    request's ``TrainingSettings`` passed where they are not the defaults, so a loader of
    (model, size, device) serves every fp32 SGD request); ``vm_evidence``: what the other
    stored profiles say about VM-to-VM spread (``ProfileStore.vm_spreads``); the launch
    overhead: ``overheads.launch_s``, else the provider's (``Provider.launch_s``);
    ``load_units(model, size, settings)``: the model's FSDP units
    (``Workload.unit_parameters``; asked where the request allows a sharded strategy). Every
    problem with a field is a ``ConfigError`` whose message starts with its path."""
    provider = spec.provider_name
    if provider_class(provider).shares_host:  # this host's pseudo-type
        offers = local_offers(spec.offers)
    else:
        region = _named("region", catalog.check_region, spec.region)
        offers = offers_from_catalog(catalog, spec.offers, region, provider=provider)
    settings = TrainingSettings.from_dict(spec.model_dump())
    extra = () if settings.is_default else (settings,)
    profiles = {
        o.instance.device_type: load_profile(spec.model, spec.size, o.instance.device_type, *extra)
        for o in offers
    }
    oh = spec.overheads or OverheadsSpec()
    launch_s = provider_class(provider).launch_s if oh.launch_s is None else oh.launch_s
    units: tuple[int, ...] = ()
    if load_units is not None and spec.strategy != "ddp":
        units = tuple(load_units(spec.model, spec.size, settings))
    return PlanRequest(
        workload=Workload(spec.model, profiles, vm_evidence or {}, units),
        global_batch=spec.global_batch,
        iterations=spec.iterations,
        offers=offers,
        time_limit_s=math.inf if spec.time_limit_s is None else spec.time_limit_s,
        budget_usd=math.inf if spec.budget_usd is None else spec.budget_usd,
        objective=Objective.parse(spec.objective),
        overheads=Overheads(launch_s=launch_s, detach_s=oh.detach_s, solve_s=oh.solve_s),
        batch_granularity=spec.batch_granularity,
        risk_quantile=spec.risk_quantile,
        checkpoint_every=spec.checkpoint_every,
        spot_interruptions=spec.spot_interruptions,
        strategy=spec.strategy,
    )


def request_from_dict(
    d: Mapping[str, Any],
    *,
    catalog: Any,
    load_profile: Any,
    vm_evidence: Mapping[str, tuple[float, int]] | None = None,
) -> PlanRequest:
    """A request from its YAML/JSON form (docs/usage.md, "Planning a request"), checked by
    ``planner.schema.request_spec.RequestSpec`` before anything is looked up, then
    ``build_request``::

        model: resnet50          # zoo name; profiles are looked up per GPU of the offers
        size: full               # profile size preset (default full)
        region: us-east-1        # (default)
        global_batch: 1024
        iterations: 400
        time_limit_s: 500        # optional
        budget_usd: 10           # optional
        objective: cost          # time (default) or cost
        risk_quantile: 0.9       # limits hold for this quantile of time and cost (default)
        overheads: {launch_s: 150, detach_s: 5}   # launch_s default: the provider's
        offers:
          - {type: p3.8xlarge, market: spot, quota: 2}          # price from the catalog
          - {type: g4dn.8xlarge, market: on-demand, quota: 8, price: 2.0}
    """
    return build_request(
        RequestSpec.parse(d), catalog=catalog, load_profile=load_profile, vm_evidence=vm_evidence
    )
