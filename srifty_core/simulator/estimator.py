"""``Simulator.estimate(workload, config) -> IterationEstimate``: compute under variance plus
the event-driven gradient exchange, ``t_iter = t_fw + max(t_bw, t_pe)`` per iteration (plus,
where the profile measured them, DDP's copy of the reduced gradients out of its buckets and
the optimizer step).

The planner calls this thousands of times per request, so what repeats is cached:

- predictor queries, one batched call per (instance types, world size, bucket sizes);
- bandwidth caps per (instance type, world size);
- exchange results per (bandwidths, caps, bucket schedule, backward time);
- the random draws: one block of uniforms per simulator (common random numbers), so two
  configurations are compared on the same luck and a plan is reproducible bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray
from scipy.special import ndtri

from srifty_core.errors import ConfigError
from srifty_core.predictors.base import BandwidthExtras, BandwidthPredictor
from srifty_core.predictors.mixed_rings import ring_features
from srifty_core.simulator.compute import expected_max, shared_host_factors
from srifty_core.simulator.exchange import bus_bytes, serial_exchange, simulate_exchange
from srifty_core.simulator.types import (
    P90_Z,
    ClusterConfig,
    Group,
    IterationEstimate,
    SimInstance,
    Workload,
)

if TYPE_CHECKING:
    from srifty_core.profiling.profile import ComputeProfile
    from srifty_core.simulator.calibration import Calibration

DEFAULT_ITERS = 256
SCHEDULES = ("ddp", "concurrent")


class Estimator(Protocol):
    """What the planner needs: an iteration estimate for a configuration."""

    def estimate(self, workload: Workload, config: ClusterConfig) -> IterationEstimate: ...


@runtime_checkable
class PlannerEstimator(Estimator, Protocol):
    """An estimator with what the planner's searches use beyond estimates: bandwidth
    curves asked in one call (``prefetch``, ``prefetch_configs``) and the lower bounds of
    the branch and bound (``pass_floor``, ``pass_floors``, ``exchange_floor``,
    ``ring_ceiling``). ``Simulator`` has them all, the analytical ``ApmEstimator`` none;
    ``planner_estimator`` says which an estimator is."""

    def prefetch(
        self, workload: Workload, instances: Sequence[SimInstance], max_vms: int
    ) -> None: ...

    def prefetch_configs(self, workload: Workload, configs: Sequence[ClusterConfig]) -> None: ...

    def pass_floor(self, workload: Workload, group: Group, column: int) -> tuple[float, float]: ...

    def pass_floors(
        self, workload: Workload, instance: SimInstance, batch: int, column: int, counts: int
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]: ...

    def exchange_floor(self, workload: Workload, config: ClusterConfig, t_bw: float) -> float: ...

    def ring_ceiling(
        self, workload: Workload, instance: SimInstance, vms: Sequence[int]
    ) -> dict[tuple[int, ...], NDArray[np.float64]]: ...


def planner_estimator(estimator: Estimator) -> PlannerEstimator | None:
    """``estimator`` itself where it has every method of ``PlannerEstimator`` (a
    ``Simulator``, or a wrapper that hands them on, as ``planner.whatif.MemoEstimator``
    does), else ``None``. A search asks once (the check costs microseconds), then calls
    them typed."""
    return estimator if isinstance(estimator, PlannerEstimator) else None


class ComputeTerms(NamedTuple):
    """One group's compute per iteration at its batch per rank (seconds, under the
    simulator's calibration), and how its VMs differ."""

    fw: float
    """Mean forward pass."""
    fw_sd: float
    """Standard deviation of the forward pass."""
    bw: float
    """Mean backward pass."""
    bw_sd: float
    """Standard deviation of the backward pass."""
    ddp_bw: float
    """DDP's own work on the backward thread (``ComputeProfile.ddp_passes_s``)."""
    ddp_after: float
    """DDP's copy out of its buckets, after the exchange."""
    step: float
    """The optimizer step (0 where the profile did not measure it)."""
    vm_cv: float
    """VM-to-VM spread of the profile (``ComputeProfile.vm_cv``)."""
    vms: int
    """VMs profiled."""


class HostSharing(NamedTuple):
    """How local workers sharing this host slow each other (``Simulator._host_sharing``)."""

    factors: list[float]
    """Per group, the factor on its forward and backward times."""
    passes: float
    """The factor on the passes every worker makes at the same moment (DDP's copies, the
    optimizer step)."""
    unmeasured: bool
    """Whether a profile lacked the measurement (the factors are then 1)."""


class ComputeSamples(NamedTuple):
    """A configuration's compute over a simulator's draws (``Simulator.compute_samples``)."""

    fw: NDArray[np.float64]
    """Per iteration, the slowest VM's forward pass."""
    bw: NDArray[np.float64]
    """Per iteration, the slowest VM's backward pass."""
    fw_slow: NDArray[np.float64]
    """The forward pass on an allocation whose slowest VM is at the p90 of its spread."""
    bw_slow: NDArray[np.float64]
    t_fw: float
    """Mean of ``fw`` (its numerical expectation with ``mean="exact"``)."""
    t_bw: float
    mu_bw: list[float]
    """Per group, its mean backward pass."""
    ddp_bw: float
    ddp_after: float
    step: float
    """The optimizer step, the slowest group's."""
    vm_spread: bool
    no_step: bool
    no_copy: bool
    no_share: bool


class Simulator:
    """The Srifty simulator over a bandwidth predictor.

    ``iters`` iterations are sampled per estimate (seeded by ``seed``); ``mean="sampled"``
    reports the sample means (the method), ``mean="exact"`` replaces the mean compute
    times by their numerically integrated expectation (no sampling noise).

    ``overlap`` is how much of the gradient exchange can run during the backward pass: 1
    (the method; NCCL on GPUs moves data while the SMs compute) starts each bucket when it
    is ready; 0 starts every bucket when the backward pass ends; values between
    interpolate. ``None`` (the default) decides per configuration: 1 on GPUs, and on CPU
    workers 1 only where each host leaves a core per rank free for gloo beyond the ranks'
    compute threads (the profile's ``threads``), else 0: gloo's reductions then need the
    very cores the backward pass is using (measured in DDP on a 2-core host: a 1.5 MB
    bucket issued mid-backward took 5.5 ms against 1.3 ms for the same allreduce on idle
    cores, while on a 16-core host the exchange hid behind the backward;
    docs/benchmarks/local-ddp.md). All ``local`` workers share one host.

    Every bucket runs at the mean transfer's bus bandwidth, not the typical one: the
    predictor's curve times its ``mean_time_factors`` (``predictors.network``; 1 where it
    has none), since a job's time adds up its transfers and right-skewed ones average
    above their median.

    DDP's own work per step is added where the profile measured it
    (``ComputeProfile.ddp_passes_s``: its measured ``ddp_overhead``, or else two passes
    at its copy bandwidth): its hooks and the copies of each gradient into its bucket
    (divided by the world size on the way) run on the backward thread (added to
    ``t_bw``), and copying the reduced buckets back into the gradients follows the last
    transfer (added to ``t_iter``). Negligible on GPUs, milliseconds per 10 MB on a CPU
    core.

    The optimizer step (``ComputeProfile.optimizer_step_s``, the slowest group's) follows,
    with one worker as with many: every rank steps its optimizer once the gradients are in.
    Profiles that did not measure it add nothing.

    Local workers share this one host: where the profile measured how a step slows with
    others stepping beside it (``ComputeProfile.shared_slowdown``), each worker's forward
    and backward are stretched by processor sharing in order of work (a worker with a
    small batch finishes first, and the rest then run with one fewer beside them), and
    the passes all workers make at once (DDP's, the optimizer step: memory-bound) by
    ``ComputeProfile.pass_slowdown``, the measured slowdown of DDP's own work where the
    profile has it, else the full step slowdown. A profile without the measurement leaves
    them alone and the estimate lists ``shared_slowdown`` in ``missing``.

    ``calibration`` (``simulator.calibration.Calibration``, what a running job measured of
    itself) scales every compute term of a device type by its compute factor and divides
    each instance type's bus bandwidth and cap by its communication factor; where the job
    observed a factor, its posterior spread replaces the predictive one (``vm_cv``'s
    pooled spread, the network's ``level_sigma``) in ``t_iter_p90``. ``None``: no change.

    Which of its optional methods the bandwidth predictor has (``predictors.base``:
    ``in_domain``, ``sustained_factor``, ``level_sigma``, ``mean_time_factors``,
    ``mixed_factors``) is asked once, when the simulator is made.
    """

    def __init__(
        self,
        bandwidth: BandwidthPredictor,
        *,
        iters: int = DEFAULT_ITERS,
        seed: int = 0,
        mean: str = "sampled",
        max_types: int = 8,
        overlap: float | None = None,
        schedule: str = "ddp",
        calibration: Calibration | None = None,
    ) -> None:
        if iters < 2:
            raise ConfigError(f"iters must be >= 2, got {iters}")
        if mean not in ("sampled", "exact"):
            raise ConfigError(f"mean must be 'sampled' or 'exact', got {mean!r}")
        if overlap is not None and not 0.0 <= overlap <= 1.0:
            raise ConfigError(f"overlap must be within [0, 1], got {overlap!r}")
        if schedule not in SCHEDULES:
            raise ConfigError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        self.overlap = overlap
        self.schedule = schedule
        self.calibration = calibration
        self.bandwidth = bandwidth
        self._bw_extras = BandwidthExtras.of(bandwidth)  # its optional methods, asked once
        self.iters = iters
        self.seed = seed
        self.mean = mean
        rng = np.random.default_rng(seed)
        # common random numbers: columns are instance-type slots, fw and bw blocks apart
        self._u_fw = rng.random((iters, max_types))
        self._u_bw = rng.random((iters, max_types))
        self._busbw_cache: dict[tuple[Any, ...], NDArray[np.float64]] = {}
        self._curve_cache: dict[
            tuple[str, int, tuple[int, ...], str | None, int], NDArray[np.float64]
        ] = {}
        self._outside: set[tuple[str, int]] = set()
        self._cap_cache: dict[tuple[str, int], float] = {}
        self._sigma_cache: dict[str, float] = {}
        self._mix_cache: dict[tuple[str, ...], float | None] = {}
        self._spread_cache: dict[tuple[Any, ...], tuple[tuple[Any, ...], dict[str, float]]] = {}
        self._compute_cache: dict[tuple[int, int, int], tuple[ComputeProfile, ComputeTerms]] = {}
        self._z_cache: dict[tuple[int, int], tuple[NDArray[np.float64], NDArray[np.float64]]] = {}
        self._zbar_cache: dict[tuple[int, int], tuple[float, float]] = {}
        self._zbar_tables: dict[int, tuple[NDArray[np.float64], NDArray[np.float64]]] = {}
        self._exchange = lru_cache(maxsize=65536)(self._exchange_uncached)

    # ------------------------------------------------------------------ bandwidth
    def _busbw(
        self,
        instances: Sequence[SimInstance],
        vms: int,
        world: int,
        sizes: tuple[int, ...],
        collective: str | None = None,
        concurrent: int = 1,
    ) -> NDArray[np.float64]:
        """Stand-alone bus bandwidth per bucket: the slowest type's, one batched query.

        A ring crosses every VM of the job, whatever its type, and runs at its slowest
        link: each type is asked at the world size of a ring of ``vms`` VMs of its own
        (``vms x ranks per VM``; the job's world size when there is one type), the
        bandwidth its links give in a ring that long. A ring of several types is then
        scaled by the mixed-ring factor the probes of such rings measured
        (``_mixed_factors``). ``collective``: the query frame's ``collective`` column
        (``all_reduce``, ``all_gather``, ``reduce_scatter``); ``None`` leaves the column out
        (DDP's allreduce, as the predictors were first taught). ``concurrent``: the
        collectives of this shape each VM runs at once (the query's ``concurrent`` column;
        hsdp's rings across VMs, one per rank of a VM), each transfer's own rate."""
        key = (tuple(i.name for i in instances), vms, world, sizes, collective, concurrent)
        hit = self._busbw_cache.get(key)
        if hit is not None:
            return hit
        worlds = [_ring_world(inst, vms, world, len(instances)) for inst in instances]
        pairs = list(zip(instances, worlds, strict=True))
        pred = np.stack(self._curves(pairs, sizes, collective, concurrent))
        out: NDArray[np.float64] = pred.min(axis=0)
        if len({inst.name for inst in instances}) > 1:
            out = out * _mixed_factors(self._bw_extras, sizes, _ring(instances, world))
        self._busbw_cache[key] = out
        return out

    def _curves(
        self,
        pairs: Sequence[tuple[SimInstance, int]],
        sizes: tuple[int, ...],
        collective: str | None = None,
        concurrent: int = 1,
    ) -> list[NDArray[np.float64]]:
        """Per (type, world size): the predicted bus bandwidth at ``sizes`` with
        ``concurrent`` such collectives in flight on each VM (``_busbw``), the mean
        transfer's (``_mean_time_factors``; at the type's sustained rate under DDP's
        schedule). What is not cached yet is asked in
        one batched call: a model call costs about the same for 10 rows or 10,000."""
        missing = list(
            {(inst.name, n): (inst, n) for inst, n in pairs
             if (inst.name, n, sizes, collective, concurrent) not in self._curve_cache}.values()
        )  # fmt: skip
        which = {} if collective is None else {"collective": collective}
        if missing:
            import pandas as pd

            rows = [
                {
                    **inst.features,
                    "world_size": n,
                    "buffer_bytes": s,
                    "concurrent": concurrent,
                    **which,
                }
                for inst, n in missing
                for s in sizes
            ]
            frame = pd.DataFrame(rows)
            pred = np.asarray(self.bandwidth.predict(frame), dtype=np.float64)
            if pred.shape != (len(rows),) or not np.all(pred > 0):
                raise ConfigError(
                    "the bandwidth predictor returned non-positive or misshapen output"
                )
            extras = self._bw_extras
            domain = extras.in_domain
            inside = np.asarray(domain(frame), dtype=bool) if domain else np.ones(len(rows), bool)
            factor = extras.sustained_factor
            for k, (inst, n) in enumerate(missing):
                curve = pred[k * len(sizes) : (k + 1) * len(sizes)]
                curve = curve * _mean_time_factors(extras, inst.name, sizes)
                if not inside[k * len(sizes) : (k + 1) * len(sizes)].all():
                    self._outside.add((inst.name, n))
                if self.schedule == "ddp" and factor is not None:  # a long job: sustained
                    curve = curve * float(factor(inst.name, n))
                if self.calibration is not None:  # what this job measured of its links
                    curve = curve / self.calibration.comm_scale(_comm_key(inst, n))
                self._curve_cache[(inst.name, n, sizes, collective, concurrent)] = curve
        cache = self._curve_cache
        return [cache[(inst.name, n, sizes, collective, concurrent)] for inst, n in pairs]

    def prefetch(self, workload: Workload, instances: Sequence[SimInstance], max_vms: int) -> None:
        """Ask the bandwidth model, in one call, about every (type, world size) a search
        over ``instances`` with up to ``max_vms`` VMs in all can touch, for every bucket
        layout of the workload's profiles: one type alone at ``n`` VMs, or in a mixed ring
        of ``n`` VMs (``_ring_world``). The planner calls it once per request; estimates
        then find every curve cached."""
        layouts = {tuple(b.size_bytes for b in p.buckets) for p in workload.profiles.values()}
        pairs = [
            (inst, w)
            for inst in instances
            for w in sorted({max(2, n * inst.ranks_per_vm) for n in range(1, max_vms + 1)})
        ]
        for sizes in layouts:
            if sizes:
                self._curves(pairs, sizes)

    def prefetch_configs(self, workload: Workload, configs: Sequence[ClusterConfig]) -> None:
        """Ask the bandwidth model, in one call per bucket layout, about every (type,
        ring world size) that estimating ``configs`` needs and is not cached yet (a
        search that simulates a few hundred chosen configurations, where ``prefetch``'s
        every world size would cost more than it saves)."""
        layouts = {tuple(b.size_bytes for b in p.buckets) for p in workload.profiles.values()}
        pairs: dict[tuple[str, int], tuple[SimInstance, int]] = {}
        for config in configs:
            world = config.world_size
            if world <= 1:
                continue
            instances = [g.instance for g in config.groups]
            for inst in instances:
                n = _ring_world(inst, config.vms, world, len(instances))
                pairs.setdefault((inst.name, n), (inst, n))
        for sizes in layouts:
            if sizes and pairs:
                self._curves(list(pairs.values()), sizes)

    def _extrapolated(
        self, instances: Sequence[SimInstance], vms: int, world: int
    ) -> tuple[str, ...]:
        """The types whose bus bandwidth in this ring came from outside what the probes
        covered (the bandwidth model's ``in_domain``; its ``level_sigma`` widens their p90)."""
        out = sorted(
            {
                inst.name
                for inst in instances
                if (inst.name, _ring_world(inst, vms, world, len(instances))) in self._outside
            }
        )
        if self._unprobed_mix(instances) is not None:
            out.append("the mix " + "+".join(sorted({i.name for i in instances})))
        return tuple(out)

    def _unprobed_mix(self, instances: Sequence[SimInstance]) -> float | None:
        """For a ring of several types the probes never held as one ring, the spread the
        bandwidth model gives it (``unprobed_mix_sigma``); ``None`` otherwise."""
        names = tuple(sorted({inst.name for inst in instances}))
        if len(names) < 2:
            return None
        if names not in self._mix_cache:
            fn = self._bw_extras.unprobed_mix_sigma
            self._mix_cache[names] = fn(names) if fn is not None else None
        return self._mix_cache[names]

    def _cap(self, instances: Sequence[SimInstance], vms: int, world: int) -> float:
        """The sustained bus bandwidth of the slowest type (what a long job's transfers
        get once burst credits are spent; the bandwidth model's ``bandwidth_cap``)."""
        caps = []
        for inst in instances:
            n = _ring_world(inst, vms, world, len(instances))
            key = (inst.name, n)
            if key not in self._cap_cache:
                cap = float(self.bandwidth.bandwidth_cap(inst.name, n))
                if self.calibration is not None:
                    cap = cap / self.calibration.comm_scale(_comm_key(inst, n))
                self._cap_cache[key] = cap
            caps.append(self._cap_cache[key])
        return min(caps)

    def _net_sigma(self, instances: Sequence[SimInstance], vms: int, world: int) -> float:
        """Spread (sd of log) of the network level across allocations, the widest of the
        types in a ring of ``vms`` VMs, widened by an unprobed mix's spread
        (``_unprobed_mix``, added in quadrature); 0 where the bandwidth model does not know
        it."""
        out = 0.0
        for inst in instances:
            key = comm_key(inst.name, vms == 1)
            hit = self._sigma_cache.get(key)
            if hit is None:
                fn = self._bw_extras.level_sigma
                hit = float(fn(inst.name)) if fn is not None else 0.0
                if self.calibration is not None:  # measured on this allocation: posterior
                    hit = self.calibration.comm_sigma(key, hit)
                self._sigma_cache[key] = hit
            out = max(out, hit)
        mix = self._unprobed_mix(instances)
        return out if not mix else float(np.hypot(out, mix))

    def _exchange_uncached(
        self,
        fractions: tuple[float, ...],
        volumes: tuple[float, ...],
        busbw: tuple[float, ...],
        cap: float,
        t_bw: float,
        overlap: float,
    ) -> float:
        lag = 1.0 - overlap
        starts = [(f + lag * (1.0 - f)) * t_bw for f in fractions]
        if self.schedule == "ddp":
            return serial_exchange(starts, volumes, [min(b, cap) for b in busbw])
        return simulate_exchange(starts, volumes, busbw, cap).t_pe

    def _overlap(self, workload: Workload, groups: Sequence[Group]) -> float:
        if self.overlap is not None:
            return self.overlap
        cpu = [g.instance for g in groups if g.instance.device_type == "cpu"]
        if not cpu:  # GPUs: the method's overlap
            return 1.0
        local_ranks = shared_workers(groups)
        for inst in cpu:
            threads = max(1, workload.profile(inst.device_type).threads)
            ranks = local_ranks if is_local(inst) else inst.ranks_per_vm
            if int(inst.features.get("vcpus") or 0) < ranks * (threads + 1):
                return 0.0  # no core left for gloo: the exchange waits for the backward pass
        return 1.0

    def _host_sharing(
        self,
        workload: Workload,
        groups: Sequence[Group],
        terms: Sequence[ComputeTerms],
    ) -> HostSharing:
        """Local workers share this host: per group, the factor on its forward and
        backward times; the factor on the passes every worker makes at the same moment,
        DDP's copies and the optimizer step; whether a profile lacked the measurement.

        Each worker's step alone is its profile's forward plus backward at its batch;
        sharing follows ``compute.shared_host_factors`` with the profile's measured
        ``host_slowdown``. Cloud VMs do not share: factors 1."""
        ones = [1.0] * len(groups)
        local = [i for i, g in enumerate(groups) if is_local(g.instance)]
        workers = shared_workers(groups)
        if workers <= 1:
            return HostSharing(ones, 1.0, False)
        profiles = {i: workload.profile(groups[i].instance.device_type) for i in local}
        if any(not p.shared_slowdown for p in profiles.values()):
            return HostSharing(ones, 1.0, True)
        slowdown = profiles[local[0]].host_slowdown  # one host, one kind of worker
        work = [float(terms[i].fw + terms[i].bw) for i in local]  # fw + bw alone, seconds
        ranks = [groups[i].count * groups[i].instance.ranks_per_vm for i in local]
        per_worker = [w for w, n in zip(work, ranks, strict=True) for _ in range(n)]
        factors = shared_host_factors(per_worker, slowdown)
        out, at = list(ones), 0
        for i, n in zip(local, ranks, strict=True):
            out[i] = max(factors[at : at + n])
            at += n
        return HostSharing(out, profiles[local[0]].pass_slowdown(workers), False)

    def _vm_spreads(self, workload: Workload) -> dict[str, float]:
        """Per device type, the predictive spread of a VM's speed (``vm_cv`` of its
        profile), pooled over the workload's profiles taken on several VMs and its
        ``vm_evidence`` (``Workload.vm_spreads``: a few VMs per device leave 2 degrees of
        freedom alone). Cached per set of profiles and evidence."""
        key = (
            *sorted((d, id(p)) for d, p in workload.profiles.items()),
            id(workload.vm_evidence),
        )
        hit = self._spread_cache.get(key)
        held = (*workload.profiles.values(), workload.vm_evidence)
        if hit is None or hit[0] != held:
            spreads = workload.vm_spreads()
            if self.calibration is not None:  # these VMs measured: posterior spread
                spreads = {d: self.calibration.compute_sigma(d, s) for d, s in spreads.items()}
            hit = (held, spreads)
            self._spread_cache[key] = hit
        return hit[1]

    def _compute(
        self, workload: Workload, device_type: str, batch: int, sharing: int = 1
    ) -> ComputeTerms:
        """The compute terms of ``device_type`` at ``batch``, with ``sharing`` workers on
        its host (which compute factor of a calibration applies), cached per profile,
        batch and sharing."""
        p = workload.profile(device_type)
        key = (id(p), batch, sharing)
        hit = self._compute_cache.get(key)
        if hit is None or hit[0] is not p:  # the profile is kept in the entry: ids stay valid
            k = (
                1.0
                if self.calibration is None
                else self.calibration.compute_scale(compute_key(device_type, sharing))
            )
            ddp_bw, ddp_after = p.ddp_passes_s()
            hit = (
                p,
                ComputeTerms(
                    fw=float(p.t_fw(batch)) * k,
                    fw_sd=float(p.std_fw(batch)) * k,
                    bw=float(p.t_bw(batch)) * k,
                    bw_sd=float(p.std_bw(batch)) * k,
                    ddp_bw=ddp_bw * k,
                    ddp_after=ddp_after * k,
                    step=p.optimizer_step_s * k,
                    vm_cv=p.vm_cv,
                    vms=p.profiled_vms,
                ),
            )
            self._compute_cache[key] = hit
        return hit[1]

    def _terms(self, workload: Workload, groups: Sequence[Group]) -> list[ComputeTerms]:
        """``_compute`` of each group, local workers with the number sharing their host."""
        sharing = shared_workers(groups)
        return [
            self._compute(
                workload,
                g.instance.device_type,
                g.batch_per_rank,
                sharing if is_local(g.instance) else 1,
            )
            for g in groups
        ]

    def _z(self, column: int, count: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Standard-normal maxima of ``count`` VMs per iteration for slot ``column`` (fw, bw),
        by inversion of Phi(z)^count on the common random numbers."""
        key = (column, count)
        hit = self._z_cache.get(key)
        if hit is None:
            hit = (
                ndtri(self._u_fw[:, column] ** (1.0 / count)),
                ndtri(self._u_bw[:, column] ** (1.0 / count)),
            )
            self._z_cache[key] = hit
        return hit

    def _more_types(self, types: int) -> None:
        """Draw uniforms for type slots beyond ``max_types`` (any number of types works;
        the first ``max_types`` slots keep their draws, so estimates of smaller
        configurations do not change). Seeded by (seed, slot): reproducible."""
        have = self._u_fw.shape[1]
        extra = [np.random.default_rng((self.seed, col)) for col in range(have, types)]
        self._u_fw = np.column_stack([self._u_fw, *(g.random(self.iters) for g in extra)])
        self._u_bw = np.column_stack([self._u_bw, *(g.random(self.iters) for g in extra)])

    # ------------------------------------------------------------------ floors
    # Lower bounds of what ``estimate`` answers, for the planner's branch and bound: from
    # the same draws, curves and caps, so they hold for this simulator's estimates (not
    # just in expectation). Nothing here changes an estimate.

    def pass_floor(self, workload: Workload, group: Group, column: int) -> tuple[float, float]:
        """(forward, backward) no more than the ``t_fw`` and ``t_bw`` that ``estimate``
        gives any configuration holding ``group`` as its ``column``-th group: the means,
        over this simulator's draws, of this group's own slowest VM (an iteration waits
        for the slowest VM of every group; DDP's copies only add). With ``mean="exact"``,
        its mean passes (a maximum of VMs is no faster than any of them). Local workers
        slow each other down by an amount known only with all of them: (0, 0)."""
        if is_local(group.instance):
            return 0.0, 0.0
        m_f, s_f, m_b, s_b, _, _, _, cv, _ = self._compute(
            workload, group.instance.device_type, group.batch_per_rank
        )
        if self.mean == "exact":  # the integration's own error is far below this margin
            return m_f * (1.0 - 1e-6), m_b * (1.0 - 1e-6)
        if column >= self._u_fw.shape[1]:
            self._more_types(column + 1)
        t_f, t_b = s_f, s_b
        if cv > 0:
            t_f, t_b = float(np.hypot(s_f, m_f * cv)), float(np.hypot(s_b, m_b * cv))
        key = (column, group.count)
        zbar = self._zbar_cache.get(key)
        if zbar is None:
            z_f, z_b = self._z(column, group.count)
            zbar = (float(z_f.mean()), float(z_b.mean()))
            self._zbar_cache[key] = zbar
        return m_f + t_f * zbar[0], m_b + t_b * zbar[1]

    def pass_floors(
        self, workload: Workload, instance: SimInstance, batch: int, column: int, counts: int
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """``pass_floor`` of a group of ``instance`` at ``batch`` per VM in slot ``column``
        for every count from 1 to ``counts`` (two arrays), at once."""
        if is_local(instance):
            return np.zeros(counts), np.zeros(counts)
        m_f, s_f, m_b, s_b, _, _, _, cv, _ = self._compute(
            workload, instance.device_type, batch // instance.ranks_per_vm
        )
        if self.mean == "exact":
            return np.full(counts, m_f * (1.0 - 1e-6)), np.full(counts, m_b * (1.0 - 1e-6))
        if column >= self._u_fw.shape[1]:
            self._more_types(column + 1)
        t_f, t_b = s_f, s_b
        if cv > 0:
            t_f, t_b = float(np.hypot(s_f, m_f * cv)), float(np.hypot(s_b, m_b * cv))
        z_f, z_b = self._zbar_table(column, counts)
        return m_f + t_f * z_f[:counts], m_b + t_b * z_b[:counts]

    def _zbar_table(
        self, column: int, counts: int
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """Per count 1..``counts`` (at least), the mean over this simulator's draws of the
        largest of that many standard normals in slot ``column`` (forward, backward)."""
        have = self._zbar_tables.get(column)
        if have is not None and len(have[0]) >= counts:
            return have
        start = 0 if have is None else len(have[0])
        parts: tuple[list[NDArray[np.float64]], list[NDArray[np.float64]]] = (
            [] if have is None else [have[0]],
            [] if have is None else [have[1]],
        )
        for lo in range(start, counts, 256):  # 256 counts at a time: bounded memory
            k = 1.0 / np.arange(lo + 1, min(counts, lo + 256) + 1, dtype=np.float64)
            for out, u in zip(parts, (self._u_fw, self._u_bw), strict=True):
                out.append(ndtri(u[:, column][:, None] ** k[None, :]).mean(axis=0))
        table = (np.concatenate(parts[0]), np.concatenate(parts[1]))
        self._zbar_tables[column] = table
        return table

    def exchange_floor(self, workload: Workload, config: ClusterConfig, t_bw: float) -> float:
        """No more than the ``t_pe`` that ``estimate`` gives ``config`` when ``t_bw`` is no
        more than its mean backward pass (e.g. ``pass_floor``'s): the same exchange, with
        the buckets ready by ``t_bw`` (DDP's schedule: the end only moves later with the
        starts; the concurrent one: each bucket's own transfer at its bus bandwidth
        within the cap). 0 for one rank, and for local workers (host sharing)."""
        groups = config.groups
        world = config.world_size
        if world <= 1 or any(is_local(g.instance) for g in groups):
            return 0.0
        slow = max(groups, key=lambda g: self._compute(workload, g.instance.device_type,
                                                       g.batch_per_rank).bw)  # fmt: skip
        buckets = workload.profile(slow.instance.device_type).buckets
        sizes = tuple(b.size_bytes for b in buckets)
        if not sizes:
            return 0.0
        instances = [g.instance for g in groups]
        busbw = self._busbw(instances, config.vms, world, sizes)
        cap = self._cap(instances, config.vms, world)
        fractions = tuple(b.ready_fraction for b in buckets)
        volumes = tuple(bus_bytes(s, world) for s in sizes)
        if self.schedule == "ddp":
            overlap = self._overlap(workload, groups)
            return float(
                self._exchange(
                    fractions, volumes, tuple(float(x) for x in busbw), cap, t_bw, overlap
                )
            )
        return max(
            f * t_bw + v / min(float(b), cap)
            for f, v, b in zip(fractions, volumes, busbw, strict=True)
        )

    def ring_ceiling(
        self, workload: Workload, instance: SimInstance, vms: Sequence[int]
    ) -> dict[tuple[int, ...], NDArray[np.float64]]:
        """Per bucket layout of the workload's profiles, an array (``len(vms)`` x buckets):
        at least the bus bandwidth (bytes/s, within the cap) each bucket's transfer gets
        in ``estimate`` of any configuration holding ``instance`` among ``v`` VMs in all,
        for each ``v`` of ``vms``. A ring runs at its slowest type's curve at that type's
        ring world size (``_ring_world``: ``v`` VMs of it, or the job's world with one
        type) and within its cap there, times the mixed-ring factor with several types:
        so this type's own curve and cap at ``max(2, v x ranks per VM)``, times the
        mixed-ring factor where it is above 1."""
        layouts = {tuple(b.size_bytes for b in p.buckets) for p in workload.profiles.values()}
        out: dict[tuple[int, ...], NDArray[np.float64]] = {}
        worlds = [max(2, v * instance.ranks_per_vm) for v in vms]
        for sizes in layouts:
            if not sizes:
                out[sizes] = np.full((len(worlds), 0), np.inf)
                continue
            boost = np.maximum(_mixed_bound(self._bw_extras, sizes), 1.0)
            curves = self._curves([(instance, w) for w in worlds], sizes)
            rows = []
            for w, curve in zip(worlds, curves, strict=True):
                cap = self._cap([instance], 1, w)  # one type: its cap at world size w
                rows.append(np.minimum(curve * boost, cap))
            out[sizes] = np.array(rows, dtype=np.float64).reshape(len(worlds), len(sizes))
        return out

    def compute_breakdown(self, workload: Workload, config: ClusterConfig) -> dict[str, float]:
        """``breakdown``'s compute side alone, which needs no bandwidth model: per device
        type of ``config``, the mean forward + backward pass of one rank."""
        compute: dict[str, float] = {}
        terms = self._terms(workload, config.groups)
        # local workers slowing each other on this host, as ``estimate`` has it: what a
        # rank measures includes that, so the prediction it is compared with must too
        share, _, _ = self._host_sharing(workload, config.groups, terms)
        for g, t, h in zip(config.groups, terms, share, strict=True):
            d = g.instance.device_type
            compute[d] = max(compute.get(d, 0.0), (t.fw + t.bw) * h)
        return compute

    def breakdown(
        self, workload: Workload, config: ClusterConfig
    ) -> tuple[dict[str, float], float]:
        """What a running job can measure of itself, as this simulator predicts it: per
        device type of ``config``, the mean forward + backward pass of one rank (the
        profile's mean at its batch per rank, under this simulator's calibration; the
        slowest group's where a type appears at several batches), and the seconds per
        iteration the gradient exchange keeps the links busy (each bucket's transfer at
        its bus bandwidth within the cap, one after the other as DDP issues them; 0 for
        one rank). ``simulator.calibration`` compares these with a window's measurements."""
        compute = self.compute_breakdown(workload, config)
        world = config.world_size
        if world <= 1:
            return compute, 0.0
        groups = config.groups
        slow = max(groups, key=lambda g: self._compute(workload, g.instance.device_type,
                                                       g.batch_per_rank).bw)  # fmt: skip
        sizes = tuple(b.size_bytes for b in workload.profile(slow.instance.device_type).buckets)
        if not sizes:
            return compute, 0.0
        instances = [g.instance for g in groups]
        busbw = self._busbw(instances, config.vms, world, sizes)
        cap = self._cap(instances, config.vms, world)
        busy = sum(
            bus_bytes(s, world) / min(float(b), cap) for s, b in zip(sizes, busbw, strict=True)
        )
        return compute, float(busy)

    def _z_slow(self, count: int) -> float:
        """The 90th percentile of the largest of ``count`` standard normals."""
        return float(ndtri(0.9 ** (1.0 / count)))

    # ------------------------------------------------------------------ estimate
    def compute_samples(self, workload: Workload, groups: Sequence[Group]) -> ComputeSamples:
        """Every group's passes over this simulator's draws, the slowest VM's per
        iteration (``ComputeSamples``): what ``estimate`` and the sharded iteration
        (``simulator.sharded``) build on."""
        if len(groups) > self._u_fw.shape[1]:
            self._more_types(len(groups))
        mu_fw, sd_fw, mu_bw, sd_bw, counts = [], [], [], [], []
        fw = bw = fw_slow = bw_slow = None
        vm_spread = False
        ddp_bw = ddp_after = 0.0  # DDP's own work (ddp_passes_s), on the slowest
        step = 0.0  # the optimizer step, on the slowest
        no_step = no_copy = False  # a profile that did not measure the term
        terms = self._terms(workload, groups)
        share, pass_share, no_share = self._host_sharing(workload, groups, terms)
        for col, g in enumerate(groups):
            m_f, s_f, m_b, s_b, c_bw, c_after, o, cv, _ = terms[col]
            if share[col] != 1.0:  # local workers slowing each other on this host
                h = share[col]
                m_f, s_f, m_b, s_b = m_f * h, s_f * h, m_b * h, s_b * h
                c_bw, c_after, o = c_bw * pass_share, c_after * pass_share, o * pass_share
            ddp_bw = max(ddp_bw, c_bw)
            ddp_after = max(ddp_after, c_after)
            step = max(step, o)
            prof = workload.profile(g.instance.device_type)
            no_copy = no_copy or not (prof.ddp_overhead or prof.copy_bytes_per_s > 0)
            no_step = no_step or o <= 0
            z_f, z_b = self._z(col, g.count)
            t_f, t_b = s_f, s_b
            if cv > 0:  # VMs differ: over allocations, a VM's step spreads by both
                vm_spread = True
                t_f, t_b = float(np.hypot(s_f, m_f * cv)), float(np.hypot(s_b, m_b * cv))
            f, b = m_f + t_f * z_f, m_b + t_b * z_b
            f_slow, b_slow = f, b
            if cv > 0:  # p90 of the slowest VM's factor, predictive: cv came from a few VMs
                spread = self._vm_spreads(workload).get(g.instance.device_type, 0.0)
                slow_vm = 1.0 + spread * self._z_slow(g.count)
                f_slow, b_slow = m_f * slow_vm + s_f * z_f, m_b * slow_vm + s_b * z_b
            fw = f if fw is None else np.maximum(fw, f)
            bw = b if bw is None else np.maximum(bw, b)
            fw_slow = f_slow if fw_slow is None else np.maximum(fw_slow, f_slow)
            bw_slow = b_slow if bw_slow is None else np.maximum(bw_slow, b_slow)
            mu_fw.append(m_f)
            sd_fw.append(t_f)
            mu_bw.append(m_b)
            sd_bw.append(t_b)
            counts.append(g.count)
        if fw is None or bw is None or fw_slow is None or bw_slow is None:
            raise ConfigError("a configuration needs at least one group of VMs")
        if self.mean == "exact":
            t_fw = expected_max(mu_fw, sd_fw, counts)
            t_bw = expected_max(mu_bw, sd_bw, counts)
        else:
            t_fw, t_bw = float(fw.mean()), float(bw.mean())
        return ComputeSamples(
            fw, bw, fw_slow, bw_slow, t_fw, t_bw, mu_bw, ddp_bw, ddp_after, step,
            vm_spread, no_step, no_copy, no_share,
        )  # fmt: skip

    def estimate(self, workload: Workload, config: ClusterConfig) -> IterationEstimate:
        groups = config.groups
        c = self.compute_samples(workload, groups)
        fw, bw, fw_slow, bw_slow, t_fw, t_bw, mu_bw = c[:7]
        ddp_bw, ddp_after, step, vm_spread, no_step, no_copy, no_share = c[7:]
        j = len(groups)
        world = config.world_size
        t_pe = copy_out = 0.0
        sigma = 0.0
        fractions: tuple[float, ...] = ()
        volumes: tuple[float, ...] = ()
        busbw = np.zeros(0)
        cap = overlap = 0.0
        extrapolated: tuple[str, ...] = ()
        if world > 1:
            if ddp_bw > 0:  # hooks, into the buckets (divided): on the backward thread
                bw = bw + ddp_bw
                bw_slow = bw_slow + ddp_bw
                t_bw += ddp_bw
            copy_out = ddp_after  # back out of the buckets, after the exchange
            slow = max(range(j), key=lambda i: mu_bw[i])
            buckets = workload.profile(groups[slow].instance.device_type).buckets
            sizes = tuple(b.size_bytes for b in buckets)
            instances = [g.instance for g in groups]
            vms = config.vms
            busbw = self._busbw(instances, vms, world, sizes)
            extrapolated = self._extrapolated(instances, vms, world)
            cap = self._cap(instances, vms, world)
            fractions = tuple(b.ready_fraction for b in buckets)
            volumes = tuple(bus_bytes(s, world) for s in sizes)
            overlap = self._overlap(workload, groups)
            t_pe = self._exchange(
                fractions, volumes, tuple(float(x) for x in busbw), cap, t_bw, overlap
            )
            sigma = self._net_sigma(instances, vms, world)
        after = copy_out + step  # after the exchange: DDP's copy out, the optimizer step
        estimated = [workload.profile(g.instance.device_type) for g in groups]
        estimated = [p for p in estimated if p.estimate]
        est_cv = max((p.estimate_cv for p in estimated), default=0.0)
        it = fw + np.maximum(bw, t_pe) + after
        exact = self.mean == "exact"
        t_iter = t_fw + max(t_bw, t_pe) + after if exact else float(it.mean())
        slow_it = t_iter
        if sigma > 0 or vm_spread or est_cv > 0:
            # a 90th-percentile allocation, from two independent sources combined in
            # quadrature: the network at the level 10% of allocations fell below, and the
            # slowest VM at the 90th percentile of its spread
            d_net = d_vm = 0.0
            if sigma > 0 and world > 1:
                level = float(np.exp(sigma * P90_Z))
                slow_net = self._exchange(
                    fractions,
                    volumes,
                    tuple(float(x) * level for x in busbw),
                    cap * level,
                    t_bw,
                    overlap,
                )
                d_net = float((fw + np.maximum(bw, slow_net) + after).mean()) - t_iter
            if vm_spread:
                t_bw_slow = float(bw_slow.mean())
                t_pe_vm = t_pe
                if world > 1:
                    t_pe_vm = self._exchange(
                        fractions, volumes, tuple(float(x) for x in busbw), cap, t_bw_slow, overlap
                    )
                slow_vm = float((fw_slow + np.maximum(bw_slow, t_pe_vm) + after).mean())
                d_vm = slow_vm - t_iter
            # and a third: an estimated profile's own error, common to every VM of its GPU
            # (the compute at the 90th percentile of the estimate's log error)
            d_est = (t_fw + t_bw + after) * float(np.expm1(-P90_Z * est_cv))
            slow_it = t_iter + float(np.sqrt(max(d_net, 0.0) ** 2 + max(d_vm, 0.0) ** 2 + d_est**2))
        p50, p90, p95 = _quantiles(it, (0.5, 0.9, 0.95))
        return IterationEstimate(
            t_iter=t_iter,
            t_fw=t_fw,
            t_bw=t_bw,
            t_pe=t_pe,
            exposed_comm=max(0.0, t_pe - t_bw),
            p50=float(p50),
            p95=float(p95),
            global_batch=config.global_batch,
            world_size=world,
            bottleneck="communication" if t_pe > t_bw else "compute",
            p90=float(p90),
            t_iter_p90=slow_it,
            net_sigma=sigma,
            extrapolated=extrapolated,
            estimated=tuple(sorted({p.estimate_note for p in estimated})),
            missing=tuple(
                name
                for name, lacks in (
                    ("optimizer_step", no_step),
                    ("ddp_copy", no_copy and world > 1),
                    ("shared_slowdown", no_share),
                )
                if lacks
            ),
        )


def _quantiles(x: NDArray[np.float64], qs: tuple[float, ...]) -> tuple[float, ...]:
    """``np.quantile(x, qs)`` (linear interpolation) from one sort, without its overhead:
    the estimate's hot path."""
    s = np.sort(x)
    n = s.size - 1
    out = []
    for q in qs:
        pos = q * n
        lo = int(pos)
        hi = min(lo + 1, n)
        out.append(float(s[lo] + (pos - lo) * (s[hi] - s[lo])))
    return tuple(out)


def _ring_world(inst: SimInstance, vms: int, world: int, types: int) -> int:
    """The world size to ask the bandwidth model for one type of a ring of ``vms`` VMs:
    the job's own with one type, else a ring of ``vms`` VMs of this type."""
    return world if types == 1 else max(2, vms * inst.ranks_per_vm)


def _comm_key(inst: SimInstance, ring_world: int) -> str:
    """``comm_key`` of ``inst`` in a ring of ``ring_world`` of its ranks (``_ring_world``):
    inside one VM when they fit on one (the simulator places ``ranks_per_vm`` on each)."""
    return comm_key(inst.name, ring_world <= inst.ranks_per_vm)


def _mean_time_factors(
    extras: BandwidthExtras, instance_type: str, sizes: tuple[int, ...]
) -> NDArray[np.float64]:
    """What turns the predictor's typical bus bandwidth into the mean transfer's
    (``predictors.network``: a job's time adds up mean iterations, and on right-skewed
    links the mean transfer is slower than the typical one), by buffer size; 1 where the
    bandwidth model learned none."""
    fn = extras.mean_time_factors
    if fn is None:
        return np.ones(len(sizes))
    factors = fn(instance_type, np.asarray(sizes, dtype=np.float64))
    return _checked_factors(factors, "mean_time_factors", sizes)


def _mixed_factors(
    extras: BandwidthExtras, sizes: tuple[int, ...], ring: NDArray[np.float64]
) -> NDArray[np.float64]:
    """What the probes of mixed-type rings say of the composition ``_busbw`` makes of
    several types (``predictors.mixed_rings``: measured over composed bus bandwidth, by
    buffer size and the ring's features); 1 where the bandwidth model learned none."""
    fn = extras.mixed_factors
    if fn is None:
        return np.ones(len(sizes))
    return _checked_factors(fn(np.asarray(sizes, dtype=np.float64), ring), "mixed_factors", sizes)


def _mixed_bound(extras: BandwidthExtras, sizes: tuple[int, ...]) -> NDArray[np.float64]:
    """At least ``_mixed_factors`` of any ring (the pruning bound's); 1 where the model
    learned none."""
    fn = extras.mixed_bound
    if fn is None:
        return np.ones(len(sizes))
    return _checked_factors(fn(np.asarray(sizes, dtype=np.float64)), "mixed_bound", sizes)


def _ring(instances: Sequence[SimInstance], world: int) -> NDArray[np.float64]:
    """The ``ring_features`` of a ring over these types (their GPUs per VM and rated
    links, from the features the bandwidth model is asked with) and ``world`` ranks."""
    gpus = [float(i.features.get("gpus_per_vm") or i.ranks_per_vm) for i in instances]
    rated = [i.features.get("network_gbps") for i in instances]
    return ring_features(gpus, [None if r is None else float(r) for r in rated], world)


def _checked_factors(
    factors: NDArray[np.float64], method: str, sizes: tuple[int, ...]
) -> NDArray[np.float64]:
    """What the predictor's ``method`` answered for ``sizes``, checked (positive, one per
    size)."""
    out = np.asarray(factors, dtype=np.float64)
    if out.shape != (len(sizes),) or not np.all(out > 0):
        raise ConfigError(f"the bandwidth predictor's {method} are non-positive or misshapen")
    return out


def is_local(instance: SimInstance) -> bool:
    """A worker on the shared host: all of them share this one host's cores
    (``SimInstance.shares_host``)."""
    return instance.shares_host


def shared_workers(groups: Sequence[Group]) -> int:
    """How many workers share this host: every rank of the groups on the shared host (0 if
    none)."""
    return sum(g.count * g.instance.ranks_per_vm for g in groups if is_local(g.instance))


def compute_key(device_type: str, sharing: int) -> str:
    """The key of a calibration's compute factor: the device type, or, for workers that
    share one host (local CPU ranks), the device type and how many share it. What a job
    measures with two ranks on two cores includes their contention, and says nothing of
    one rank alone (the demo's re-plan onto one worker was predicted 11% slow when the
    factor of two sharing ranks was carried over)."""
    return device_type if sharing <= 1 else f"{device_type} x{sharing} on one host"


def comm_key(instance_type: str, one_vm: bool) -> str:
    """The key of a calibration's communication factor: the instance type and the links
    its ring crosses, inside one VM (NVLink or PCIe) or across VMs (the NICs). What one
    VM's exchange measured says nothing of a ring through the NICs, nor the other way
    round (a factor learned on one p3.8xlarge, whose exchange had been priced at NIC
    speed and ran 70x faster on NVLink, once slowed every 2-VM plan of the type 70x)."""
    return f"{instance_type} {'in one VM' if one_vm else 'across VMs'}"


if TYPE_CHECKING:  # mypy holds the simulator to what the planner asks of it
    _SIMULATOR_IS_A_PLANNER_ESTIMATOR: type[PlannerEstimator] = Simulator
