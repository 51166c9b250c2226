"""The emulated EC2's world: one seeded cloud on a simulated clock, its catalog, allocations
and their instances' lifecycle (launch, workers' exit codes, interruptions, release).

``EmulatedWorld`` is the base of ``EmulatedProvider`` (``cloud.emulated.provider``): the
parts that measure (``probes``, ``training``, ``profiles``) extend it. Nothing runs for real:

* **Clock.** ``now()`` is simulated; it starts at ``start`` and moves only when the
  emulator does something that takes time (``launch`` waits the launch delay, ``release``
  the volume detach, probes and training their measured time) or when you ``advance`` it.
  Billing (``cost``) is per second of simulated time since launch.
* **Launch.** Each instance boots in ``launch_delay_s`` (normal, default 150 s, sd 20 s);
  ``launch`` advances the clock to the slowest boot and returns RUNNING instances. Quotas
  (instances per type, default 64) and capacity (per type and zone, default 256 on-demand
  and 128 spot, shared by all allocations) can run out: ``CapacityError``/``QuotaError``.
* **Network levels.** Each allocation draws its own bandwidth level (small and large
  buffers), narrower with a placement group.
* **Preemptions.** Spot instances are interrupted at ``preemption_rate_per_hour`` (per type,
  or one rate for all; exponential arrivals drawn at launch) or at exact simulated times
  given to ``schedule_interruption`` (tests). They take effect as the clock passes them.
* **Workers.** ``run`` records the argv and environment and marks the workers done at
  once (exit code 0); ``stop`` marks them stopped (-15). Nothing is executed: use
  ``probe`` and ``train`` for measurements.

State lives in the object (one simulated world per object); ``get_allocation`` answers for
allocations this object launched.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from srifty_core.catalog import Catalog
from srifty_core.catalog.types import Market, Price
from srifty_core.cloud import emulator_truth as truth
from srifty_core.cloud.base import (
    Allocation,
    Instance,
    InstanceSpec,
    InstanceState,
    Interruption,
    LaunchRequest,
    Provider,
    ProviderError,
)
from srifty_core.errors import ConfigError, UnknownNameError

if TYPE_CHECKING:
    from srifty_core.catalog.types import InstanceType

PROVIDER_NAME = "ec2-emulated"
DEFAULT_START = datetime(2026, 1, 5, tzinfo=UTC)
ZONE_PREFIX = {"us-east-1": "use1", "us-west-2": "usw2"}


class CapacityError(ProviderError):
    """The zone has no capacity left for this type (EC2: InsufficientInstanceCapacity)."""


class QuotaError(ProviderError):
    """The request would exceed the account's quota for this type."""


@dataclass
class _Inst:
    id: str
    zone: str
    state: InstanceState
    launched_at: datetime
    ended_at: datetime | None = None
    preempt_at: datetime | None = None
    volume: bool = True


@dataclass
class _Alloc:
    allocation: Allocation
    instances: list[_Inst]
    level: truth.NetworkLevel
    credit_s: float = 0.0
    """Seconds of burst left on the allocation's NICs (types rated "up to")."""
    interruptions: list[Interruption] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    exit_codes: dict[int, int | None] = field(default_factory=dict)


class EmulatedWorld(Provider):
    """The emulated EC2 without its measurements: clock, catalog, allocations (see the
    module's docstring). ``EmulatedProvider`` adds probes, training and profiles."""

    name = PROVIDER_NAME
    cloud = "aws"
    reruns_workers = True
    launch_s = 150.0  # as EC2's
    detach_s = 5.0
    simulated = True

    def __init__(
        self,
        *,
        seed: int = 0,
        region: str = "us-east-1",
        start: datetime = DEFAULT_START,
        catalog: Catalog | None = None,
        launch_delay_s: tuple[float, float] = (150.0, 20.0),
        volume_detach_s: float = 5.0,
        quota: int | Mapping[str, int] = 64,
        capacity: int | Mapping[str, int] | None = None,
        spot_capacity: int = 128,
        preemption_rate_per_hour: float | Mapping[str, float] = 0.0,
        spread_small: float = truth.SPREAD_SMALL,
        spread_large: float = truth.SPREAD_LARGE,
        hidden_slowdown: Mapping[str, float] | None = None,
        preempt_after: Mapping[str, float] | None = None,
    ) -> None:
        """``hidden_slowdown``: per instance type, a factor on its GPUs' step times that
        only ``train`` applies (``emulator_truth.slowed``): ``profile`` never sees it, as
        a profile taken on other VMs or days would not (the online recalibration
        benchmark's injected fault). ``preempt_after``: per instance type, seconds into
        its first ``start_training`` at which its first instance is taken back (once)."""
        self.region = region
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._clock = start if start.tzinfo else start.replace(tzinfo=UTC)
        self._catalog = catalog or Catalog.load()
        self._catalog.check_region(region)
        self.launch_delay_s = launch_delay_s
        self.volume_detach_s = volume_detach_s
        self._quota = quota
        self._capacity = capacity
        self._spot_capacity = spot_capacity
        self._preempt = preemption_rate_per_hour
        self.spread_small = spread_small
        self.spread_large = spread_large
        self.hidden_slowdown = dict(hidden_slowdown or {})
        for name, factor in self.hidden_slowdown.items():
            if not factor > 0:
                raise ConfigError(f"hidden_slowdown[{name}]: must be > 0, got {factor}")
        self._preempt_after = dict(preempt_after or {})
        for name, after in self._preempt_after.items():
            self.catalog_type(name)  # an unknown type: the closest names
            if not (math.isfinite(after) and after >= 0):
                raise ConfigError(f"preempt_after[{name}]: must be seconds >= 0, got {after}")
        self._allocs: dict[str, _Alloc] = {}
        self._scripted: list[tuple[datetime, str, str]] = []
        self._n = 0

    # ------------------------------------------------------------------ clock
    def now(self) -> datetime:
        return self._clock

    def advance(self, seconds: float) -> datetime:
        """Move the simulated clock forward, applying the interruptions it passes."""
        if seconds < 0:
            raise ConfigError(f"seconds: the clock only moves forward, got {seconds}")
        self._clock = self._clock + timedelta(seconds=float(seconds))
        self._apply_interruptions()
        return self._clock

    def wait(self, seconds: float) -> None:
        """Let ``seconds`` of simulated time pass (``advance``): no wall time."""
        self.advance(seconds)

    def advance_to(self, t: datetime) -> datetime:
        return self.advance(max(0.0, (t - self._clock).total_seconds()))

    # ------------------------------------------------------------------ types, prices
    def catalog_type(self, name: str) -> InstanceType:
        return self._catalog.get(name, self.region)  # unknown names: the closest ones

    def instance_type(self, name: str) -> InstanceSpec:
        t = self.catalog_type(name)
        return InstanceSpec.from_catalog(t)

    def price(self, instance_type: str, market: Market | str, zone: str | None = None) -> Price:
        self.catalog_type(instance_type)
        if Market.parse(market) is Market.SPOT and zone is None:
            return self._catalog.cheapest_spot(instance_type, self.region)[1]
        return self._catalog.price(instance_type, market, self.region, zone)

    def zones(self, instance_type: str) -> list[str]:
        """Zones offering the type: those with a spot price, else the region's first."""
        t = self.catalog_type(instance_type)
        zones = [z for z, _ in t.spot_zones]
        return zones or [f"{ZONE_PREFIX.get(self.region, self.region)}-az1"]

    # ------------------------------------------------------------------ lifecycle
    def launch(self, request: LaunchRequest) -> Allocation:
        return self.launch_many([request])[0]

    def launch_many(self, requests: Sequence[LaunchRequest]) -> list[Allocation]:
        """Launch several requests at once (one API call each, in parallel, as a planner's
        configuration is launched): the clock advances by the slowest instance's delay."""
        launched = [self._launch_one(r) for r in requests]
        if launched:
            self.advance(max(delay for _, delay in launched))
        out = []
        for alloc, _ in launched:
            for inst in self._get(alloc.id).instances:
                if inst.state is InstanceState.PENDING:
                    inst.state = InstanceState.RUNNING
            out.append(alloc)
        return out

    def _launch_one(self, request: LaunchRequest) -> tuple[Allocation, float]:
        spec = self.instance_type(request.instance_type)
        market = Market.parse(request.market)
        if market is Market.SPOT:
            zone = request.zone or self._catalog.cheapest_spot(spec.name, self.region)[0]
            self.price(spec.name, market, zone)  # no spot price there: MissingPriceError
        else:
            self.price(spec.name, market)
            zone = request.zone or self.zones(spec.name)[0]
            if zone not in self.zones(spec.name):
                raise UnknownNameError("zone", zone, self.zones(spec.name), context=spec.name)
        self._check_limits(spec.name, market, zone, request.count)
        self._n += 1
        alloc_id = f"emu-{self.seed}-{self._n:05d}"
        start = self._clock
        mean, sd = self.launch_delay_s
        delays = np.maximum(10.0, mean + sd * self._rng.standard_normal(request.count))
        level = truth.draw_allocation_level(
            self._rng,
            placement_group=request.placement_group,
            spread_small=self.spread_small,
            spread_large=self.spread_large,
        )
        insts = [
            _Inst(f"{alloc_id}-i{k}", zone, InstanceState.PENDING, start)
            for k in range(request.count)
        ]
        rate = self._rate(spec.name) if market is Market.SPOT else 0.0
        if rate > 0:
            gaps = self._rng.exponential(3600.0 / rate, request.count)
            for inst, gap in zip(insts, gaps, strict=True):
                inst.preempt_at = start + timedelta(seconds=float(gap))
        alloc = Allocation(
            id=alloc_id,
            provider=self.name,
            cloud=self.cloud,
            region=self.region,
            zone=zone,
            spec=spec,
            market=market,
            placement_group=request.placement_group,
            instance_ids=tuple(i.id for i in insts),
            created_at=start,
        )
        credit = truth.NetSpec.of(self.catalog_type(spec.name)).burst_credit_s()
        self._allocs[alloc_id] = _Alloc(alloc, insts, level, credit)
        return alloc, float(delays.max())

    def get_allocation(self, allocation_id: str) -> Allocation:
        return self._get(allocation_id).allocation

    def allocations(self) -> tuple[Allocation, ...]:
        """Every allocation this provider launched (released ones too), oldest first."""
        return tuple(a.allocation for a in self._allocs.values())

    def describe(self, allocation: Allocation) -> tuple[Instance, ...]:
        a = self._get(allocation.id)
        per = allocation.spec.ranks_per_instance
        return tuple(
            Instance(
                id=i.id,
                allocation_id=allocation.id,
                instance_type=allocation.spec.name,
                market=allocation.market,
                zone=i.zone,
                state=i.state,
                address=f"10.0.{k // 250}.{k % 250 + 4}",
                ranks=tuple(range(k * per, (k + 1) * per)),
                launched_at=i.launched_at,
                ended_at=i.ended_at,
            )
            for k, i in enumerate(a.instances)
        )

    def interruptions(self, allocation: Allocation) -> tuple[Interruption, ...]:
        return tuple(self._get(allocation.id).interruptions)

    def schedule_interruption(
        self, instance_id: str, at: datetime | float, reason: str = "spot interruption"
    ) -> None:
        """Interrupt ``instance_id`` when the clock reaches ``at`` (a datetime, or seconds
        from now)."""
        when = at if isinstance(at, datetime) else self._clock + timedelta(seconds=float(at))
        alloc_id = instance_id.rsplit("-i", 1)[0]
        a = self._get(alloc_id)
        if instance_id not in a.allocation.instance_ids:
            raise UnknownNameError("instance", instance_id, a.allocation.instance_ids)
        self._scripted.append((when, instance_id, reason))
        self._apply_interruptions()

    def run(
        self,
        allocation: Allocation,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Record ``argv`` (nothing executes) and mark every rank done with exit code 0."""
        a = self._get(allocation.id)
        down = [i.id for i in a.instances if i.state is not InstanceState.RUNNING]
        if down:
            raise ProviderError(f"allocation {allocation.id}: instance(s) {down} are not running")
        a.runs.append({"argv": list(argv), "env": dict(env or {}), "at": self._clock})
        a.exit_codes = {r: 0 for r in range(allocation.ranks)}

    def runs(self, allocation: Allocation) -> list[dict[str, Any]]:
        """Every ``run`` recorded: argv, env and simulated start time."""
        return list(self._get(allocation.id).runs)

    def exit_codes(self, allocation: Allocation) -> dict[int, int | None]:
        return dict(self._get(allocation.id).exit_codes)

    def stop(self, allocation: Allocation) -> None:
        a = self._get(allocation.id)
        a.exit_codes = {r: (c if c is not None else -15) for r, c in a.exit_codes.items()}

    def release(self, allocation: Allocation | str) -> None:
        alloc_id = allocation if isinstance(allocation, str) else allocation.id
        a = self._allocs.get(alloc_id)
        if a is None:
            return
        a.exit_codes = {r: (c if c is not None else -15) for r, c in a.exit_codes.items()}
        live = [i for i in a.instances if i.state in (InstanceState.RUNNING, InstanceState.PENDING)]
        for i in live:
            i.state = InstanceState.TERMINATED
            i.ended_at = self._clock
        if live and any(i.volume for i in live):
            self.advance(self.volume_detach_s)

    # ------------------------------------------------------------------ internals
    def _running(self, allocation: Allocation) -> _Alloc:
        a = self._get(allocation.id)
        if any(i.state is not InstanceState.RUNNING for i in a.instances):
            raise ProviderError(f"allocation {allocation.id}: not every instance is running")
        return a

    def _get(self, alloc_id: str) -> _Alloc:
        a = self._allocs.get(alloc_id)
        if a is None:
            raise ProviderError(f"no emulated allocation {alloc_id!r} in this provider")
        return a

    def _rate(self, name: str) -> float:
        if isinstance(self._preempt, Mapping):
            return float(self._preempt.get(name, 0.0))
        return float(self._preempt)

    def _limit(self, limit: int | Mapping[str, int] | None, name: str, default: int) -> int:
        if limit is None:
            return default
        if isinstance(limit, Mapping):
            return int(limit.get(name, default))
        return int(limit)

    def _check_limits(self, name: str, market: Market, zone: str, count: int) -> None:
        live = [
            (a.allocation, i)
            for a in self._allocs.values()
            if a.allocation.spec.name == name
            for i in a.instances
            if i.state in (InstanceState.RUNNING, InstanceState.PENDING)
        ]
        quota = self._limit(self._quota, name, 64)
        if len(live) + count > quota:
            raise QuotaError(
                f"{name}: {count} more instance(s) would exceed the quota of {quota} "
                f"({len(live)} running); release some or raise quota="
            )
        if market is Market.SPOT:
            cap = self._spot_capacity
        else:
            cap = self._limit(self._capacity, name, 256)
        used = sum(1 for a, i in live if i.zone == zone and a.market is market)
        if used + count > cap:
            raise CapacityError(
                f"{name} in {zone} ({market.value}): insufficient capacity for {count} more "
                f"instance(s) ({cap - used} left); try another zone or market"
            )

    def _apply_interruptions(self) -> None:
        due = [(t, iid, r) for t, iid, r in self._scripted if t <= self._clock]
        self._scripted = [x for x in self._scripted if x[0] > self._clock]
        events = list(due)
        for a in self._allocs.values():
            for i in a.instances:
                if i.preempt_at is not None and i.preempt_at <= self._clock:
                    events.append((i.preempt_at, i.id, "spot interruption (capacity reclaimed)"))
                    i.preempt_at = None
        for at, iid, reason in sorted(events):
            a = self._allocs[iid.rsplit("-i", 1)[0]]
            inst = next(i for i in a.instances if i.id == iid)
            if inst.state not in (InstanceState.RUNNING, InstanceState.PENDING):
                continue
            inst.state = InstanceState.INTERRUPTED
            inst.ended_at = at
            a.interruptions.append(Interruption(iid, at, reason))
            per = a.allocation.spec.ranks_per_instance
            k = a.allocation.instance_ids.index(iid)
            for r in range(k * per, (k + 1) * per):
                if r in a.exit_codes:
                    a.exit_codes[r] = -9

    def _next_interruption(self, allocs: Sequence[_Alloc], until: datetime) -> datetime | None:
        ids = {i.id for a in allocs for i in a.instances if i.state is InstanceState.RUNNING}
        times = [t for t, iid, _ in self._scripted if iid in ids and t <= until]
        times += [
            i.preempt_at
            for a in allocs
            for i in a.instances
            if i.id in ids and i.preempt_at is not None and i.preempt_at <= until
        ]
        return min(times) if times else None
