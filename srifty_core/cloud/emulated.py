"""The emulated EC2: a seeded cloud on a simulated clock, for probes, profiles, training and
preemptions at scale (tens of VMs, many allocations) in seconds.

It implements the ``Provider`` interface over the real catalog (instance types, GPU specs,
on-demand and zone spot prices) and draws every measurement from ``cloud.emulator_truth``
(the ground-truth network and compute model, documented there). Nothing runs for real:

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
* **Mixed rings.** ``probe_mix``/``probe_mix_sustained`` probe allocations of several
  types as one ring, as a heterogeneous job's allreduce runs (``emulated_probe_sweep``'s
  ``mixes``); the rows carry the mix's label (``probing.mix``).
* **Preemptions.** Spot instances are interrupted at ``preemption_rate_per_hour`` (per type,
  or one rate for all; exponential arrivals drawn at launch) or at exact simulated times
  given to ``schedule_interruption`` (tests). They take effect as the clock passes them.
* **Workers.** ``run`` records the argv and environment and marks the workers done at
  once (exit code 0); ``stop`` marks them stopped (-15). Nothing is executed: use
  ``probe`` and ``train`` for measurements.
* **Training as the clock runs.** ``start_training`` draws a run's iterations (as
  ``train``) without moving the clock; then each step of the clock (``advance``, ``wait``)
  hands the iterations that ended by then to a callback (``TrainingStep``: what a rank 0
  would log), until the run ends (exit code 0) or an interruption stops its ranks
  (``preempt_after``: the first instance of a type that trains is taken back that many
  seconds into its training, once).

State lives in the provider object (one simulated world per object); ``get_allocation``
answers for allocations this object launched.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

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
    Workers,
)
from srifty_core.errors import ConfigError, UnknownNameError
from srifty_core.predictors.compute import (
    PiecewiseLinear,
    budget_batch_sizes,
    fit_piecewise,
    refine_batch_sizes,
)
from srifty_core.probing.config import MAX_BUFFER_BYTES, MIN_BUFFER_BYTES, geometric_sizes
from srifty_core.probing.mix import mix_label, ring_columns
from srifty_core.profiling.profile import PassStats

if TYPE_CHECKING:
    import pyarrow as pa

    from srifty_core.catalog.types import InstanceType
    from srifty_core.profiling.profile import ComputeProfile

PROVIDER_NAME = "ec2-emulated"
DEFAULT_START = datetime(2026, 1, 5, tzinfo=UTC)
ZONE_PREFIX = {"us-east-1": "use1", "us-west-2": "usw2"}
DEFAULT_WORLD_SIZES = (2, 4, 8, 16, 32, 64)
DEFAULT_CONCURRENCY = (1, 2, 4)
PROBE_GAP_S = 0.002
"""Simulated time between two probe samples (synchronisation, bookkeeping)."""
MEMORY_BOUND_BATCH = 1 << 24
"""``profile`` without ``max_batch``: B_max is the GPU memory's bound alone (this is only
the arithmetic's ceiling)."""
SUSTAINED_BYTES = 256 * 1024**2
"""Buffer of the sustained-transfer probe: a large bucket, back to back, as training sends."""
SUSTAINED_MAX_S = 3900.0
"""The sustained probe gives up waiting for a drop after 65 minutes (AWS: bursts last "5 to
60 minutes")."""


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


@dataclass(frozen=True, slots=True)
class TrainingRun:
    """What ``EmulatedProvider.train`` measured (seconds of simulated time)."""

    iteration_s: NDArray[np.float64]
    """Time of each completed iteration."""
    compute_s: NDArray[np.float64]
    """Slowest forward + backward pass of each iteration."""
    exposed_comm_s: NDArray[np.float64]
    """Communication not hidden behind the backward pass."""
    completed: int
    interrupted: tuple[Interruption, ...]
    """Interruptions that stopped the run early (empty when it completed)."""
    started_at: datetime
    ended_at: datetime
    pass_s: NDArray[np.float64] = field(default_factory=lambda: np.zeros((0, 0)))
    """Iterations x VMs: each VM's own forward + backward pass (what its rank times of
    itself and rank 0 gathers each window), VMs in the order of ``vm_types``."""
    vm_types: tuple[str, ...] = ()
    """The instance type of each column of ``pass_s``."""
    exchange_s: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    """Per iteration, the time the gradient exchange kept the links busy."""

    @property
    def mean_s(self) -> float:
        return float(self.iteration_s.mean()) if self.completed else math.nan

    def window(self, start: int, stop: int) -> dict[str, Any]:
        """Iterations ``start`` to ``stop`` (a monitor window) as rank 0 gathers them:
        ``iteration_s``, ``exchange_s`` (arrays) and ``pass_s`` per instance type (an
        array of iterations x that type's VMs)."""
        stop = min(stop, self.completed)
        cols: dict[str, list[int]] = {}
        for k, name in enumerate(self.vm_types):
            cols.setdefault(name, []).append(k)
        return {
            "iteration_s": self.iteration_s[start:stop],
            "exchange_s": self.exchange_s[start:stop],
            "pass_s": {name: self.pass_s[start:stop, ks] for name, ks in cols.items()},
        }


@dataclass(frozen=True, slots=True)
class TrainingStep:
    """One iteration of a ``start_training`` run, handed over once the clock passed its end:
    what rank 0 of a real run would log of it."""

    index: int
    """0 for the run's first iteration."""
    ended_at: datetime
    iteration_s: float
    pass_s: tuple[float, ...]
    """Each VM's forward + backward pass, VMs in the order of ``vm_types``."""
    vm_types: tuple[str, ...]
    exchange_s: float


@dataclass
class _Session:
    """A run started by ``start_training``, handed out as the clock passes its iterations."""

    allocs: list[_Alloc]
    run: TrainingRun
    iterations: int
    ends: list[datetime]
    on_step: Callable[[TrainingStep], None]
    delivered: int = 0


class EmulatedProvider(Provider):
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
        self._sessions: list[_Session] = []
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
        self._deliver_steps()
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
        self._end_sessions(allocation.id)
        a.exit_codes = {r: (c if c is not None else -15) for r, c in a.exit_codes.items()}

    def release(self, allocation: Allocation | str) -> None:
        alloc_id = allocation if isinstance(allocation, str) else allocation.id
        a = self._allocs.get(alloc_id)
        if a is None:
            return
        self._end_sessions(alloc_id)
        a.exit_codes = {r: (c if c is not None else -15) for r, c in a.exit_codes.items()}
        live = [i for i in a.instances if i.state in (InstanceState.RUNNING, InstanceState.PENDING)]
        for i in live:
            i.state = InstanceState.TERMINATED
            i.ended_at = self._clock
        if live and any(i.volume for i in live):
            self.advance(self.volume_detach_s)

    # ------------------------------------------------------------------ measurements
    def probe(
        self,
        allocation: Allocation,
        sizes: Sequence[int],
        world_sizes: Sequence[int] = DEFAULT_WORLD_SIZES,
        concurrency: Sequence[int] = DEFAULT_CONCURRENCY,
        *,
        repeats: int = 5,
        allocation_slot: int = 0,
        day: date | None = None,
    ) -> dict[str, list[Any]]:
        """Allreduce samples on ``allocation`` as columns of probe records (``PROBE_SCHEMA``
        names; ``records_to_table``/``columns_to_table`` make a table). World sizes above
        the allocation's ranks are skipped; the clock advances by the measured time. NICs
        rated "up to" a bandwidth burst while their credits last (phase ``burst``)."""
        a = self._running(allocation)
        net = truth.NetSpec.of(self.catalog_type(allocation.spec.name))
        size_arr = np.asarray(sorted(set(int(s) for s in sizes)), dtype=np.float64)
        cols: dict[str, list[Any]] = {k: [] for k in _VARYING}
        for n in sorted(set(world_sizes)):
            if n < 2 or n > allocation.ranks:
                continue
            for c in sorted(set(concurrency)):
                for rep in range(repeats):
                    base = truth.allreduce_time(
                        net,
                        size_arr,
                        n,
                        concurrent=c,
                        level_small=a.level.small,
                        level_large=a.level.large,
                        bursting=a.credit_s > 0,
                    )
                    times = base * truth.sample_noise(self._rng, size_arr)
                    a.credit_s = max(0.0, a.credit_s - float(times.sum()))
                    for s, ts in zip(size_arr, times, strict=True):
                        self._sample(cols, n, int(s), c, rep, float(ts))
        self._apply_interruptions()
        return self._records(a, cols, allocation_slot, day, "burst")

    def probe_sustained(
        self,
        allocation: Allocation,
        world_size: int,
        *,
        size: int = SUSTAINED_BYTES,
        repeats: int = 5,
        max_s: float = SUSTAINED_MAX_S,
        allocation_slot: int = 0,
        day: date | None = None,
    ) -> dict[str, list[Any]]:
        """The sustained-transfer probe: allreduce ``size`` bytes back to back, as training
        does, until the rate has dropped to a steady level (the NICs' burst credits are
        spent) or ``max_s`` seconds have passed, then record ``repeats`` samples (phase
        ``sustained``). On a type that does not burst it ends after ``repeats`` samples."""
        a = self._running(allocation)
        n = min(int(world_size), allocation.ranks)
        if n < 2:
            raise ConfigError(f"world_size: a sustained probe needs >= 2 ranks, got {n}")
        net = truth.NetSpec.of(self.catalog_type(allocation.spec.name))

        def took(s: NDArray[np.float64]) -> NDArray[np.float64]:
            return truth.allreduce_time(
                net, s, n, level_small=a.level.small, level_large=a.level.large,
                bursting=a.credit_s > 0,
            )  # fmt: skip

        cols = self._sustained([a], took, n, size, repeats, max_s)
        return self._records(a, cols, allocation_slot, day, "sustained")

    def probe_mix(
        self,
        allocations: Sequence[Allocation],
        sizes: Sequence[int],
        *,
        repeats: int = 5,
        allocation_slot: int = 0,
        day: date | None = None,
    ) -> dict[str, list[Any]]:
        """Allreduce samples over ONE ring of every rank of ``allocations`` (one allocation
        per instance type, launched by the caller), as a heterogeneous job's ring runs
        (``emulator_truth.cluster_allreduce_time``: paced by its slowest link, latency
        growing with all its VMs). Columns as ``probe``'s under the mix's label
        (``probing.mix``), phase ``burst``: each size at the full world size, concurrency 1
        (what a job's DDP buckets see), ``repeats`` samples. Each allocation's NICs burst
        while its own credits last, and every transfer spends every member's credits."""
        group = self._mix_group(allocations)
        size_arr = np.asarray(sorted(set(int(s) for s in sizes)), dtype=np.float64)
        cols: dict[str, list[Any]] = {k: [] for k in _VARYING}
        n = sum(a.allocation.ranks for a in group)
        for rep in range(repeats):
            base = truth.cluster_allreduce_time(self._ring(group), size_arr)
            times = base * truth.sample_noise(self._rng, size_arr)
            for a in group:
                a.credit_s = max(0.0, a.credit_s - float(times.sum()))
            for s, ts in zip(size_arr, times, strict=True):
                self._sample(cols, n, int(s), 1, rep, float(ts))
        self._apply_interruptions()
        return self._mix_records(group, cols, allocation_slot, day, "burst")

    def probe_mix_sustained(
        self,
        allocations: Sequence[Allocation],
        *,
        size: int = SUSTAINED_BYTES,
        repeats: int = 5,
        max_s: float = SUSTAINED_MAX_S,
        allocation_slot: int = 0,
        day: date | None = None,
    ) -> dict[str, list[Any]]:
        """``probe_sustained`` over the ring of ``probe_mix``: back-to-back transfers until
        no member has burst credits left (every NIC of a ring is busy the whole time) or
        ``max_s`` seconds have passed, then ``repeats`` samples (phase ``sustained``)."""
        group = self._mix_group(allocations)

        def took(s: NDArray[np.float64]) -> NDArray[np.float64]:
            return truth.cluster_allreduce_time(self._ring(group), s)

        n = sum(a.allocation.ranks for a in group)
        cols = self._sustained(group, took, n, size, repeats, max_s)
        return self._mix_records(group, cols, allocation_slot, day, "sustained")

    def _sustained(
        self,
        group: Sequence[_Alloc],
        took: Callable[[NDArray[np.float64]], NDArray[np.float64]],
        n: int,
        size: int,
        repeats: int,
        max_s: float,
    ) -> dict[str, list[Any]]:
        """The sustained probe over the NICs of ``group`` (one allocation, or a mixed
        ring): back-to-back transfers of ``size`` bytes (each ``took`` seconds in the
        current credit state) until no member has burst credits left or ``max_s`` seconds
        have passed, then ``repeats`` samples as columns."""
        s = np.asarray([float(size)])
        left = max(a.credit_s for a in group)
        if left > 0:
            one = float(took(s)[0])
            spend = min(left, max_s)
            for a in group:
                a.credit_s = max(0.0, a.credit_s - spend)
            self._clock += timedelta(seconds=spend + PROBE_GAP_S * spend / one)
        base = took(s)
        cols: dict[str, list[Any]] = {k: [] for k in _VARYING}
        for rep in range(repeats):
            ts = float((base * truth.sample_noise(self._rng, s))[0])
            self._sample(cols, n, int(size), 1, rep, ts)
        self._apply_interruptions()
        return cols

    def _mix_group(self, allocations: Sequence[Allocation]) -> list[_Alloc]:
        """The running allocations of a mix, one per type, in type-name order."""
        names = [a.spec.name for a in allocations]
        if len(set(names)) != len(names):
            raise ConfigError(f"allocations: one per instance type in a mix, got {sorted(names)}")
        if len(names) < 2:
            raise ConfigError(f"allocations: a mix needs at least two instance types, got {names}")
        return [self._running(a) for a in sorted(allocations, key=lambda a: a.spec.name)]

    def _ring(self, group: Sequence[_Alloc]) -> list[truth.RingMember]:
        return [
            truth.RingMember(
                truth.NetSpec.of(self.catalog_type(a.allocation.spec.name)),
                a.allocation.count,
                a.allocation.spec.ranks_per_instance,
                a.level.small,
                a.level.large,
                a.credit_s > 0,
            )
            for a in group
        ]

    def _mix_records(
        self,
        group: Sequence[_Alloc],
        cols: dict[str, list[Any]],
        allocation_slot: int,
        day: date | None,
        phase: str,
    ) -> dict[str, list[Any]]:
        allocs = [a.allocation for a in group]
        ring = ring_columns(
            {a.spec.name: a.count for a in allocs},
            [a.spec for a in allocs],
            [a.zone for a in allocs],
        )
        labels = {
            **ring,
            "placement_group": all(a.placement_group for a in allocs),
            "allocation_id": "+".join(a.id for a in allocs),
        }
        return _columns(self._fixed(labels, allocation_slot, day, phase), cols)

    def _running(self, allocation: Allocation) -> _Alloc:
        a = self._get(allocation.id)
        if any(i.state is not InstanceState.RUNNING for i in a.instances):
            raise ProviderError(f"allocation {allocation.id}: not every instance is running")
        return a

    def _sample(
        self, cols: dict[str, list[Any]], n: int, s: int, c: int, rep: int, t: float
    ) -> None:
        cols["world_size"].append(n)
        cols["buffer_bytes"].append(s)
        cols["concurrent"].append(c)
        cols["repeat"].append(rep)
        cols["time_s"].append(t)
        cols["probed_at"].append(self._clock)
        self._clock += timedelta(seconds=t + PROBE_GAP_S)

    def _records(
        self,
        a: _Alloc,
        cols: dict[str, list[Any]],
        allocation_slot: int,
        day: date | None,
        phase: str,
    ) -> dict[str, list[Any]]:
        allocation = a.allocation
        t = self.catalog_type(allocation.spec.name)
        labels = {
            "zone": allocation.zone,
            "instance_type": t.name,
            "gpu_model": t.gpu_model,
            "gpus_per_vm": t.gpus_per_vm,
            "vcpus": t.vcpus,
            "network_gbps": t.network_gbps,
            "placement_group": allocation.placement_group,
            "allocation_id": allocation.id,
        }
        return _columns(self._fixed(labels, allocation_slot, day, phase), cols)

    def _fixed(
        self, labels: Mapping[str, Any], allocation_slot: int, day: date | None, phase: str
    ) -> dict[str, Any]:
        """The columns every row of one probe shares: ``labels`` (what was probed) and
        this provider's, the slot, the day and the phase."""
        return {
            "date": day or self._clock.date(),
            "provider": self.name,
            "cloud": self.cloud,
            "region": self.region,
            **labels,
            "allocation_slot": allocation_slot,
            "backend": "nccl",
            "status": "ok",
            "error": None,
            "phase": phase,
        }

    def train(
        self,
        allocations: Iterable[Allocation],
        profile: ComputeProfile,
        batches: Mapping[str, int],
        iterations: int,
        *,
        reference: truth.DeviceRate | None = None,
        seed: int | None = None,
        warm_s: float = 0.0,
        advance: bool = True,
    ) -> TrainingRun:
        """Run ``iterations`` synchronous data-parallel iterations over the RUNNING
        instances of ``allocations`` (mixed types allowed), in simulated time.
        ``advance=False``: draw the run from now without moving the clock (its
        ``ended_at`` is when it would end; ``start_training`` lets the clock run it).

        ``warm_s``: seconds of the same training that ran before the first iteration
        counted (not billed, no clock move): NICs that burst have spent that much of their
        credits, as hours into a real job.

        ``batches[type]`` is the number of samples one VM of that type processes per
        iteration, split evenly over its GPUs. Gradient buckets come from the profile
        (``profile.buckets``, in DDP's order). The profile's latency is scaled to each GPU
        (see ``emulator_truth``); ``reference`` overrides the device it was measured on.
        If an instance is interrupted mid-run, the run stops at the last iteration that
        ended before the interruption.
        """
        allocs = [self._get(a.id) for a in allocations]
        if not allocs:
            raise ConfigError("allocations: none given")
        rng = np.random.default_rng(seed) if seed is not None else self._rng
        rates = {
            t.gpu_model: truth.device_rate(t)
            for t in self._catalog.by_region(self.region)
            if t.gpu is not None and t.gpu.memory_bw_gbs is not None
        }
        ref = reference or truth.reference_rate(profile, rates)
        groups = []
        vm_types: list[str] = []
        for a in allocs:
            name = a.allocation.spec.name
            if name not in batches:
                raise ConfigError(f"batches: no local batch for {name}")
            live = [i for i in a.instances if i.state is InstanceState.RUNNING]
            if not live:
                raise ProviderError(f"allocation {a.allocation.id} has no running instance")
            t = self.catalog_type(name)
            group = truth.group_for(
                t, len(live), batches[name], profile, ref, a.level, rng, credit_s=a.credit_s
            )
            if name in self.hidden_slowdown:
                group = truth.slowed(group, self.hidden_slowdown[name])
            groups.append(group)
            vm_types.extend([name] * len(live))
        ordered = sorted(profile.buckets, key=lambda b: b.index)
        detail = truth.training_iterations_detail(
            groups,
            [b.size_bytes for b in ordered],
            [b.ready_fraction for b in ordered],
            iterations,
            rng,
            warm_s=warm_s,
        )
        iters, compute, exposed = detail.iteration_s, detail.compute_s, detail.exposed_s
        started = self._clock
        ends = started + timedelta(seconds=float(np.cumsum(iters)[-1]))
        first_stop = self._next_interruption(allocs, ends)
        completed = iterations
        if first_stop is not None:
            elapsed = (first_stop - started).total_seconds()
            completed = int(np.searchsorted(np.cumsum(iters), elapsed, side="right"))
        if advance:
            self.advance_to(first_stop if first_stop is not None else ends)
        hit = tuple(
            x
            for a in allocs
            for x in a.interruptions
            if first_stop is not None and started <= x.at <= first_stop
        )
        return TrainingRun(
            iteration_s=iters[:completed],
            compute_s=compute[:completed],
            exposed_comm_s=exposed[:completed],
            completed=completed,
            interrupted=hit,
            started_at=started,
            ended_at=self._clock if advance else (first_stop or ends),
            pass_s=detail.pass_s[:completed],
            vm_types=tuple(vm_types),
            exchange_s=detail.exchange_s[:completed],
        )

    def start_workers(self, allocations: Sequence[Allocation], workers: Workers) -> None:
        """Start the emulated ranks (``workers.emulate``: they emulate the plan's training
        on this provider, ``start_training``); no process runs here."""
        if workers.emulate is None:
            raise ProviderError(f"{self.name}: runs emulated ranks only (Workers.emulate)")
        workers.emulate(self, allocations)

    def start_training(
        self,
        allocations: Sequence[Allocation],
        profile: ComputeProfile,
        batches: Mapping[str, int],
        iterations: int,
        on_step: Callable[[TrainingStep], None],
        *,
        reference: truth.DeviceRate | None = None,
    ) -> TrainingRun:
        """Start ``iterations`` iterations on ``allocations`` (as ``train``) that run as the
        clock moves: each ``advance`` hands the iterations that ended by then to
        ``on_step``, in order. The ranks run (exit code ``None``) until the last iteration
        (then 0), an interruption of one of their instances (its ranks -9, the others wait
        in the collective until ``stop``), ``stop`` or ``release``. ``preempt_after`` is
        armed here. Returns the run as drawn (``ended_at``: when it would end)."""
        allocs = [self._running(a) for a in allocations]
        for a in allocs:
            after = self._preempt_after.pop(a.allocation.spec.name, None)
            if after is not None:
                victim = a.instances[0].id
                self.schedule_interruption(victim, after, "spot interruption (preempt_after)")
        run = self.train(allocations, profile, batches, iterations, reference=reference,
                         advance=False)  # fmt: skip
        ends = [run.started_at + timedelta(seconds=float(t)) for t in np.cumsum(run.iteration_s)]
        for a in allocs:
            a.runs.append({"argv": ["<emulated training>"], "env": {}, "at": self._clock})
            a.exit_codes = {r: None for r in range(a.allocation.ranks)}
        self._sessions.append(_Session(allocs, run, iterations, ends, on_step))
        self._deliver_steps()
        return run

    def _deliver_steps(self) -> None:
        """Hand each started run the iterations the clock has passed (``start_training``)."""
        for s in list(self._sessions):
            ids = {i.id for a in s.allocs for i in a.instances}
            stops = [
                x.at for a in s.allocs for x in a.interruptions
                if x.instance_id in ids and x.at >= s.run.started_at
            ]  # fmt: skip
            stop = min(stops) if stops else None
            while (
                s.delivered < s.run.completed
                and s.ends[s.delivered] <= self._clock
                and (stop is None or s.ends[s.delivered] <= stop)
            ):
                k = s.delivered
                s.delivered += 1
                s.on_step(
                    TrainingStep(
                        k,
                        s.ends[k],
                        float(s.run.iteration_s[k]),
                        tuple(float(x) for x in s.run.pass_s[k]),
                        s.run.vm_types,
                        float(s.run.exchange_s[k]),
                    )
                )
            if stop is not None and stop <= self._clock:
                self._sessions.remove(s)  # the interrupted ranks are -9, the rest wait
            elif stop is None and s.delivered >= s.iterations:
                self._sessions.remove(s)
                for a in s.allocs:
                    a.exit_codes = {r: 0 if c is None else c for r, c in a.exit_codes.items()}

    def _end_sessions(self, alloc_id: str) -> None:
        self._sessions = [
            s for s in self._sessions if all(a.allocation.id != alloc_id for a in s.allocs)
        ]

    def profile(
        self,
        instance_type: str,
        reference: ComputeProfile,
        *,
        probes: int = 4,
        repeats: int = 5,
        warmup: int = 2,
        max_batch: int | None = None,
        reference_rate: truth.DeviceRate | None = None,
        seed: int | None = None,
        vms: int = 3,
        refine: int = 3,
    ) -> ComputeProfile:
        """What ``srifty profile`` run on one VM of ``instance_type`` would measure for the
        model of ``reference`` (a profile of the same network on another device).

        * **B_max**: the largest per-GPU batch up to ``max_batch`` (the profiler's search
          range) whose footprint ``reference.memory_fixed_bytes +
          reference.memory_per_sample_bytes x B`` fits one GPU's memory
          (``emulator_truth.max_batch_in_memory``, the test training applies). The
          footprint is the network's, so the memory fields are kept; ``memory_cap_bytes``
          becomes the GPU's.
        * **Latency**: at the budgeted batch sizes (``budget_batch_sizes(B_max, probes)``)
          the ground truth's pass times (the reference scaled to this GPU), on ``vms`` VMs
          at once (default 3, as the profiling DAG maps over VMs), each with its own
          spatial factor, times a temporal factor per step (``repeats`` steps after
          ``warmup``): per size the mean of the VMs' means and the pooled within-VM std,
          fitted with ``fit_piecewise`` as the profiler does; ``vm_cv`` is the spread of
          the VMs' mean step times.
          Then, as the profiler does (``refine``, default 3), check probes between the
          budgeted ones where the fit may bend (``refine_batch_sizes``), refitted after
          each; the fit's errors at them are kept in ``probe_checks``.
        * **Per-step terms**: DDP's copy bandwidth and the optimizer step
          (``emulator_truth.step_costs``), median of ``repeats`` timings.
        * **Gradient buckets** (sizes, ready fractions): the reference's; they depend on
          the model and DDP's bucketing, not on the device.

        The clock advances by the measured steps. ``device_type`` is the GPU model as the
        catalog names it (T4, V100, M60, A10G...).
        """
        import statistics

        if repeats < 2:
            raise ConfigError(f"repeats: need at least 2 for a spread, got {repeats}")
        if vms < 1:
            raise ConfigError(f"vms: need at least 1, got {vms}")
        t = self.catalog_type(instance_type)
        rng = np.random.default_rng(seed) if seed is not None else self._rng
        rate = truth.device_rate(t)
        rates = {
            x.gpu_model: truth.device_rate(x)
            for x in self._catalog.by_region(self.region)
            if x.gpu is not None and x.gpu.memory_bw_gbs is not None
        }
        ref = reference_rate or truth.reference_rate(reference, rates)
        scale = truth.compute_scale(ref, rate)
        b_max = truth.max_batch_in_memory(reference, t, max_batch or MEMORY_BOUND_BATCH)
        if b_max < 1:
            need = float(reference.memory_bytes(1)) / 1024**3
            raise ConfigError(
                f"{reference.model}/{reference.size} does not fit one {t.gpu_model} of "
                f"{instance_type}: one sample needs {need:.1f} GiB of {t.gpu_memory_gib:g} GiB"
            )
        sizes = budget_batch_sizes(b_max, probes) if b_max > 1 else [1]
        spatial = truth.draw_spatial(rng, vms)  # the VMs the profile runs on, at once
        fw_by: dict[int, list[list[float]]] = {}
        bw_by: dict[int, list[list[float]]] = {}
        elapsed = 0.0

        def run(b: int) -> None:
            nonlocal elapsed
            t_fw, t_bw, cv_fw, cv_bw = truth.profile_pass_times(reference, b, scale)
            fw_vm, bw_vm = [], []
            for k in range(vms):
                fw = t_fw * spatial[k] * truth.draw_temporal(rng, (warmup + repeats,), cv_fw)
                bw = t_bw * spatial[k] * truth.draw_temporal(rng, (warmup + repeats,), cv_bw)
                if k == 0:
                    elapsed += float(fw.sum() + bw.sum())
                fw_vm.append([float(x) for x in fw[warmup:]])
                bw_vm.append([float(x) for x in bw[warmup:]])
            fw_by[b], bw_by[b] = fw_vm, bw_vm

        def stats(by: Mapping[int, list[list[float]]]) -> PassStats:
            """Mean over VMs of each VM's mean; the spread within a VM (pooled)."""
            bs = sorted(by)
            return PassStats(
                tuple(bs),
                tuple(statistics.fmean(statistics.fmean(v) for v in by[b]) for b in bs),
                tuple(
                    math.sqrt(statistics.fmean(statistics.variance(v) for v in by[b])) for b in bs
                ),
                repeats,
            )

        def fits() -> tuple[PiecewiseLinear, PiecewiseLinear]:
            f, b = stats(fw_by), stats(bw_by)
            return (
                fit_piecewise(f.batch_sizes, f.mean_s, cv=f.cv, repeats=repeats),
                fit_piecewise(b.batch_sizes, b.mean_s, cv=b.cv, repeats=repeats),
            )

        for b in sizes:
            run(b)
        checks: list[tuple[int, float]] = []
        if len(sizes) >= 2 and refine > 0:
            current = list(fits())

            def predict(b: int) -> float:
                return current[0].at(b) + current[1].at(b)

            def measure(b: int) -> tuple[float, float]:
                run(b)
                current[:] = fits()
                steps = [
                    f + w
                    for fv, bv in zip(fw_by[b], bw_by[b], strict=True)
                    for f, w in zip(fv, bv, strict=True)
                ]
                mean = statistics.fmean(steps)
                return mean, statistics.stdev(steps) / mean / math.sqrt(len(steps))

            checks = refine_batch_sizes(sizes, predict, measure, budget=refine)
        sizes = sorted(fw_by)
        fw_s = [fw_by[b] for b in sizes]
        bw_s = [bw_by[b] for b in sizes]

        vm_means = [
            statistics.fmean(
                statistics.fmean(fw_s[i][k]) + statistics.fmean(bw_s[i][k])
                for i in range(len(sizes))
            )
            for k in range(vms)
        ]
        vm_cv = statistics.stdev(vm_means) / statistics.fmean(vm_means) if vms >= 2 else 0.0

        # what every step adds whatever the batch: DDP's copy pass, the optimizer step
        copy_s, step_s = truth.step_costs(reference, rate)
        copy_m = copy_s * float(np.median(truth.draw_temporal(rng, (repeats,), 0.02)))
        step_m = step_s * float(np.median(truth.draw_temporal(rng, (repeats,), 0.02)))
        elapsed += repeats * (copy_s + step_s)
        fw_stats, bw_stats = stats(fw_by), stats(bw_by)
        if len(sizes) >= 2:
            fw_fit = fit_piecewise(sizes, fw_stats.mean_s, cv=fw_stats.cv, repeats=repeats)
            bw_fit = fit_piecewise(sizes, bw_stats.mean_s, cv=bw_stats.cv, repeats=repeats)
        else:  # B_max = 1: one point, a flat line through it
            fw_fit = PiecewiseLinear.flat(fw_stats.mean_s[0])
            bw_fit = PiecewiseLinear.flat(bw_stats.mean_s[0])
        self.advance(elapsed)
        return dataclasses.replace(
            reference,
            device_type=t.gpu_model,
            device_name=f"{t.gpu_model} ({t.name}, {self.name})",
            fw=fw_stats,
            bw=bw_stats,
            fw_fit=fw_fit,
            bw_fit=bw_fit,
            b_max=b_max,
            memory_cap_bytes=int(truth.gpu_memory_bytes(t)),
            schedule_batch_size=sizes[len(sizes) // 2],
            probe_mode=f"budget:{probes}" + (f"+{len(checks)}" if checks else ""),
            probe_checks=tuple(checks),
            threads=0,
            copy_bytes_per_s=float(reference.gradient_bytes) / copy_m,
            optimizer_step_s=step_m,
            vm_cv=vm_cv,
            profiled_vms=vms,
            created_at=self._clock.isoformat(timespec="seconds"),
        )

    # ------------------------------------------------------------------ internals
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


_VARYING = ("world_size", "buffer_bytes", "concurrent", "repeat", "time_s", "probed_at")


def _columns(fixed: Mapping[str, Any], cols: Mapping[str, list[Any]]) -> dict[str, list[Any]]:
    """Probe columns: ``fixed`` on every sample of ``cols``, and each sample's busbw."""
    m = len(cols["time_s"])
    out: dict[str, list[Any]] = {k: [v] * m for k, v in fixed.items()}
    out.update(cols)
    n_arr = np.asarray(out["world_size"], dtype=np.float64)
    s_arr = np.asarray(out["buffer_bytes"], dtype=np.float64)
    t_arr = np.asarray(out["time_s"], dtype=np.float64)
    out["busbw"] = list(2.0 * s_arr * (n_arr - 1.0) / (n_arr * t_arr))
    return out


def emulated_profiles(
    instance_types: Sequence[str],
    reference: ComputeProfile,
    *,
    probes: int = 4,
    repeats: int = 5,
    max_batch: int | None = None,
    region: str = "us-east-1",
    seed: int = 0,
    catalog: Catalog | None = None,
    reference_rate: truth.DeviceRate | None = None,
    vms: int = 3,
) -> dict[str, ComputeProfile]:
    """``EmulatedProvider.profile`` on each type's GPU, once per GPU model (profiles are per
    device type), in the order given on one provider, each on ``vms`` VMs: ``{gpu_model:
    profile}``. Same
    arguments and seed, same profiles. ``reference_rate``: as for ``profile``."""
    p = EmulatedProvider(seed=seed, region=region, catalog=catalog)
    out: dict[str, ComputeProfile] = {}
    for name in instance_types:
        gpu = p.catalog_type(name).gpu_model
        if gpu not in out:
            out[gpu] = p.profile(
                name,
                reference,
                probes=probes,
                repeats=repeats,
                max_batch=max_batch,
                reference_rate=reference_rate,
                vms=vms,
            )
    return out


def columns_to_table(cols: Mapping[str, Sequence[Any]]) -> pa.Table:
    """Probe columns (from ``EmulatedProvider.probe``) as a table checked against
    ``PROBE_SCHEMA``."""
    import pyarrow as pa

    from srifty_core.probing.schema import PROBE_SCHEMA, conform

    n = len(cols["time_s"])
    arrays = [
        pa.array(cols[f.name], type=f.type) if f.name in cols else pa.nulls(n, type=f.type)
        for f in PROBE_SCHEMA
    ]  # spread and noisy: not computed by the emulator (null)
    return conform(pa.Table.from_arrays(arrays, schema=PROBE_SCHEMA))


def emulated_probe_sweep(
    instance_types: Sequence[str],
    *,
    sizes: Sequence[int] | None = None,
    world_sizes: Sequence[int] = DEFAULT_WORLD_SIZES,
    concurrency: Sequence[int] = DEFAULT_CONCURRENCY,
    allocations: int = 3,
    repeats: int = 5,
    placement_group: bool = False,
    regions: Sequence[str] = ("us-east-1",),
    seed: int = 0,
    day: date | None = None,
    provider: EmulatedProvider | None = None,
    sustained: bool = True,
    mixes: Sequence[Mapping[str, int]] = (),
) -> pa.Table:
    """An emulated probe dataset: for each region and type, ``allocations`` fresh
    allocations of ``ceil(max world size / GPUs per VM)`` VMs, each swept over ``sizes``
    (default 4 B..512 MB, 3 points a decade) x ``world_sizes`` x ``concurrency`` with
    ``repeats`` samples, then (``sustained``) the sustained-transfer probe at each world
    size (phase ``sustained``: what training sees once "up to" NICs spent their burst).

    Then each mix of ``mixes`` (``{instance type: VMs}``, e.g. ``{"g4dn.12xlarge": 1,
    "g4dn.xlarge": 3}``) on ``allocations`` fresh groups of allocations (one per type,
    launched together): ``probe_mix`` over ``sizes`` at the ring's full world size, then
    (``sustained``) ``probe_mix_sustained``; rows under the mix's label (``probing.mix``).
    The mixes come after every type's own sweep, so adding them changes no other row.

    Returns one table (``PROBE_SCHEMA``, provider ``ec2-emulated``);
    ``write_emulated_probes`` stores it. Same arguments and seed, same rows."""
    import pyarrow as pa

    size_list = list(sizes or geometric_sizes(MIN_BUFFER_BYTES, MAX_BUFFER_BYTES))
    mix_list = [dict(m) for m in mixes]
    for i, m in enumerate(mix_list):
        mix_label(m, field=f"mixes[{i}]")  # bad input fails before anything is launched
    tables = []
    for r, region in enumerate(regions):
        p = provider if provider is not None and provider.region == region else None
        p = p or EmulatedProvider(seed=seed * 1000 + r, region=region)
        for name in instance_types:
            spec = p.instance_type(name)
            top = max(world_sizes)
            count = max(2, math.ceil(top / spec.ranks_per_instance))
            for slot in range(allocations):
                alloc = p.launch(LaunchRequest(name, count=count, placement_group=placement_group))
                try:
                    cols = p.probe(
                        alloc,
                        size_list,
                        world_sizes,
                        concurrency,
                        repeats=repeats,
                        allocation_slot=slot,
                        day=day,
                    )
                    tables.append(columns_to_table(cols))
                    if sustained:
                        for n in sorted(w for w in set(world_sizes) if 2 <= w <= alloc.ranks):
                            tables.append(
                                columns_to_table(
                                    p.probe_sustained(
                                        alloc, n, repeats=repeats, allocation_slot=slot, day=day
                                    )
                                )
                            )
                finally:
                    p.release(alloc)
        for m in mix_list:
            for slot in range(allocations):
                group = p.launch_many(
                    [
                        LaunchRequest(name, count=count, placement_group=placement_group)
                        for name, count in sorted(m.items())
                    ]
                )
                try:
                    tables.append(
                        columns_to_table(
                            p.probe_mix(
                                group, size_list, repeats=repeats, allocation_slot=slot, day=day
                            )
                        )
                    )
                    if sustained:
                        tables.append(
                            columns_to_table(
                                p.probe_mix_sustained(
                                    group, repeats=repeats, allocation_slot=slot, day=day
                                )
                            )
                        )
                finally:
                    for alloc in group:
                        p.release(alloc)
    from srifty_core.probing.schema import PROBE_SCHEMA

    return pa.concat_tables(tables) if tables else PROBE_SCHEMA.empty_table()


def write_emulated_probes(table: pa.Table, root: Any = None) -> list[Any]:
    """Write an emulated sweep into the probe store, one partition per (day, type)."""
    import pyarrow.compute as pc

    from srifty_core.probing.store import write_partition

    out = []
    days = pc.unique(table["date"]).to_pylist()
    for day in days:
        on_day = table.filter(pc.equal(table["date"], pa_scalar_date(day)))
        for name in sorted(pc.unique(on_day["instance_type"]).to_pylist()):
            part = on_day.filter(pc.equal(on_day["instance_type"], name))
            out.append(
                write_partition(
                    part, day=day, provider=PROVIDER_NAME, instance_type=name, root=root
                )
            )
    return out


def pa_scalar_date(d: date) -> Any:
    import pyarrow as pa

    return pa.scalar(d, type=pa.date32())


def emulate_training(
    counts: Mapping[str, int],
    batches: Mapping[str, int],
    profile: ComputeProfile,
    iterations: int,
    *,
    market: Market | str = Market.ON_DEMAND,
    region: str = "us-east-1",
    placement_group: bool = False,
    seed: int = 0,
    reference: truth.DeviceRate | None = None,
    warm_s: float = 0.0,
) -> TrainingRun:
    """Launch ``counts[type]`` VMs of each type on a fresh emulator, run ``iterations``
    iterations (``batches[type]`` samples per VM; ``warm_s`` as ``train``), release, and
    return what was measured. One allocation per type; same inputs and seed, same numbers."""
    p = EmulatedProvider(seed=seed, region=region)
    launched = []
    try:
        for name, count in counts.items():
            if count > 0:
                launched.append(
                    p.launch(
                        LaunchRequest(
                            name,
                            count=count,
                            market=Market.parse(market),
                            placement_group=placement_group,
                        )
                    )
                )
        return p.train(launched, profile, batches, iterations, reference=reference, warm_s=warm_s)
    finally:
        for a in launched:
            p.release(a)
