"""The sharded iteration (FSDP2's ``fsdp`` and ``hsdp``) as the simulator predicts it.

Contract: ``ShardedSimulator(simulator, strategy).estimate(workload, config)`` is an
``IterationEstimate`` of one iteration of ``config`` training ``workload`` with its
parameters, gradients and optimizer states sharded (``sharding.memory.Layout``); the
compute (slowest VM per iteration, VM spread, shared hosts, calibration) is the wrapped
``Simulator``'s (``Simulator.compute_samples``), the collectives' bus bandwidths its
predictor's (frames with a ``collective`` column). ``schedule`` is the per-unit event
model alone: a pure function of per-unit compute and collective times.

The model (derivation and what is assumed: docs/design/sharding.md, "Simulated
iteration"): the units of ``Workload.unit_parameters`` (the root's own first) share the
passes in proportion to their parameters; on one communication stream, in the order
FSDP2 issues them, each unit's parameters are all-gathered before its forward (the next
one prefetched when a unit's forward starts) and again before its backward (resharded
after forward; the root stays gathered), and its gradients reduce-scattered when its
backward ends (``hsdp``: then all-reduced across the VMs' replicas). FSDP2's own work
around each unit (``ComputeProfile.fsdp_overhead``) is added to every unit's passes and to
the optimizer step.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from srifty_core.errors import ConfigError
from srifty_core.sharding.memory import Strategy, compute_bytes, parse_strategy, reduce_bytes
from srifty_core.simulator.estimator import Simulator, _quantiles
from srifty_core.simulator.exchange import bus_bytes
from srifty_core.simulator.types import (
    P90_Z,
    ClusterConfig,
    IterationEstimate,
    SimInstance,
    Workload,
)

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER = "all_reduce", "all_gather", "reduce_scatter"
"""The values of the bandwidth query's ``collective`` column."""


def shard_bus_bytes(size_bytes: float, world_size: int) -> float:
    """Bytes an all-gather or reduce-scatter of a ``size_bytes`` buffer (the gathered,
    unsharded one) moves per rank on the bus: ``s (n-1) / n`` (nccl-tests' convention)."""
    return size_bytes * (world_size - 1) / world_size


class Schedule(NamedTuple):
    """When one sharded iteration's phases end (seconds from its start)."""

    forward_end: float
    """The last unit's forward compute ends."""
    compute_end: float
    """The root's backward compute ends."""
    end: float
    """The iteration's passes and collectives are all done (before the optimizer step)."""
    comm_busy: float
    """Seconds the communication stream is busy: every collective one after the other."""
    last_reduce: float
    """The last gradient collective ends."""


def schedule(
    fw: Sequence[float],
    bw: Sequence[float],
    gather: Sequence[float],
    reduce: Sequence[float],
) -> Schedule:
    """The event model of one sharded iteration over units ``0..K`` (unit 0 the root's
    own parameters: gathered once before the forward pass, never resharded; its compute
    first in the forward pass and last in the backward pass). ``fw``/``bw``: each unit's
    compute; ``gather``: its all-gather; ``reduce``: its gradients' reduce-scatter (and
    ``hsdp``'s allreduce after it). One stream runs the collectives in issue order, each
    when issued and the one before it has ended; a unit computes when the unit before it
    has and its parameters are gathered.

    Issue order: forward, unit 0's all-gather at the start and that of unit ``k + 1`` when
    unit ``k``'s forward starts; backward (units ``K..1``, then the root), the
    all-gather of the next unit when a unit's backward starts (unit ``K``'s when the
    forward ends), its reduce-scatter when it ends."""
    n = len(fw)
    if not (len(bw) == len(gather) == len(reduce) == n) or n == 0:
        raise ConfigError("schedule: per-unit fw, bw, gather and reduce of one length >= 1")
    q = 0.0  # when the stream is free
    g = gather[0]  # the root's all-gather, issued at 0
    q = g
    c = 0.0  # when the compute is free
    for k in range(n):
        s = max(c, g)  # unit k's forward starts
        if k + 1 < n:  # prefetch the next unit's all-gather
            q = max(q, s) + gather[k + 1]
            g = q
        c = s + fw[k]
    forward_end = c
    order = [*range(n - 1, 0, -1), 0]
    # units resharded after forward are gathered again; the root is not
    g = forward_end if n == 1 else max(q, forward_end) + gather[order[0]]
    if n > 1:
        q = g
    last_reduce = 0.0
    for i, k in enumerate(order):
        s = max(c, g if k != 0 else c)
        if i + 1 < len(order) and order[i + 1] != 0:  # prefetch the next one's all-gather
            q = max(q, s) + gather[order[i + 1]]
            g = q
        c = s + bw[k]
        q = max(q, c) + reduce[k]
        last_reduce = q
    busy = float(sum(gather) + sum(gather[1:]) + sum(reduce))
    return Schedule(forward_end, c, max(c, q), busy, last_reduce)


@lru_cache(maxsize=65536)
def _schedule_cached(
    t_fw: float,
    t_bw: float,
    weights: tuple[float, ...],
    gather: tuple[float, ...],
    reduce: tuple[float, ...],
    unit_fw: float = 0.0,
    unit_bw: float = 0.0,
) -> Schedule:
    return schedule(
        [t_fw * w + unit_fw for w in weights], [t_bw * w + unit_bw for w in weights], gather, reduce
    )


def _distinct(sizes: Sequence[float]) -> tuple[int, ...]:
    """The buffer sizes (bytes, whole) a bandwidth query asks for: each once, in order."""
    return tuple(sorted({max(1, round(s)) for s in sizes if s > 0}))


class _Comm(NamedTuple):
    """Per unit, its collectives' seconds at the typical allocation's bandwidth."""

    gather: tuple[float, ...]
    reduce: tuple[float, ...]
    sigma: float
    extrapolated: tuple[str, ...]


class ShardedSimulator:
    """An ``Estimator`` of the sharded iteration of ``strategy`` (``fsdp`` or ``hsdp``)
    over ``simulator`` (module doc). Every VM of an ``hsdp`` configuration must have as
    many ranks (one shard group per VM): a ``ConfigError`` otherwise."""

    def __init__(self, simulator: Simulator, strategy: Strategy) -> None:
        parse_strategy(strategy)
        if strategy == "ddp":
            raise ConfigError("strategy: the sharded simulator plans fsdp or hsdp, got 'ddp'")
        self.simulator = simulator
        self.strategy = strategy
        self._comm_cache: dict[tuple[object, ...], _Comm] = {}

    def units(self, workload: Workload, config: ClusterConfig) -> tuple[int, ...]:
        """The workload's units (``Workload.unit_parameters``); where it has none, the
        slowest group's parameters as one unit beside an empty root (everything gathered
        at once: the memory model's conservative reading)."""
        if workload.unit_parameters:
            return workload.unit_parameters
        n = max(workload.profile(g.instance.device_type).n_parameters for g in config.groups)
        return (0, n)

    def prefetch(self, workload: Workload, instances: Sequence[SimInstance], max_vms: int) -> None:
        """Ask the bandwidth model, in one call per collective, about every ring a search
        over ``instances`` with up to ``max_vms`` VMs in all can touch (as
        ``Simulator.prefetch`` does for ddp's buckets): estimates then find every curve
        cached."""
        profiles = list(workload.profiles.values())
        units = workload.unit_parameters or (0, max(p.n_parameters for p in profiles))
        gathered = _distinct([n * compute_bytes(profiles[0].settings) for n in units])
        grads = [n * reduce_bytes(profiles[0].settings) for n in units]
        sim = self.simulator

        def rings(inst: SimInstance) -> list[tuple[SimInstance, int]]:
            return [
                (inst, w)
                for w in sorted({max(2, n * inst.ranks_per_vm) for n in range(1, max_vms + 1)})
            ]

        if self.strategy == "fsdp":
            pairs = [pair for inst in instances for pair in rings(inst)]
            if gathered and pairs:
                sim._curves(pairs, gathered, ALL_GATHER)
                sim._curves(pairs, _distinct(grads), REDUCE_SCATTER)
            return
        intra = [(i, i.ranks_per_vm) for i in instances if i.ranks_per_vm > 1]
        if gathered and intra:
            sim._curves(intra, gathered, ALL_GATHER)
            sim._curves(intra, _distinct(grads), REDUCE_SCATTER)
        for rpv in {i.ranks_per_vm for i in instances}:
            pairs = [pair for i in instances if i.ranks_per_vm == rpv for pair in rings(i)]
            shards = _distinct([x / rpv for x in grads])
            if shards and pairs:
                sim._curves(pairs, shards, ALL_REDUCE, concurrent=rpv)

    def _collective_s(
        self,
        instances: Sequence[SimInstance],
        vms: int,
        world: int,
        sizes: Sequence[float],
        collective: str,
        volume_of: float,
        concurrent: int = 1,
    ) -> tuple[float, ...]:
        """Seconds of ``collective`` of each buffer of ``sizes`` bytes in a ring of
        ``world`` ranks on ``vms`` VMs: its bus bytes (``volume_of`` of the buffer) at the
        predictor's bus bandwidth for that size, within the VMs' sustained cap. With
        ``concurrent`` such rings at once on each VM (hsdp's, one per rank of a VM), each
        transfer runs at the rate the predictor gives with that many in flight, and the
        rings share the cap (the VM's total across concurrent collectives)."""
        sim = self.simulator
        distinct = _distinct(sizes)
        if not distinct:
            return tuple(0.0 for _ in sizes)
        busbw = sim._busbw(instances, vms, world, distinct, collective, concurrent)
        cap = sim._cap(instances, vms, world) / concurrent
        at = {s: min(float(b), cap) for s, b in zip(distinct, busbw, strict=True)}
        return tuple(0.0 if s <= 0 else volume_of * s / at[max(1, round(s))] for s in sizes)

    def _comm(self, workload: Workload, config: ClusterConfig, units: tuple[int, ...]) -> _Comm:
        groups = config.groups
        instances = [g.instance for g in groups]
        world, vms = config.world_size, config.vms
        key = (tuple(i.name for i in instances), vms, world, units, id(workload))
        hit = self._comm_cache.get(key)
        if hit is not None:
            return hit
        p = workload.profile(groups[0].instance.device_type)
        gathered = [n * compute_bytes(p.settings) for n in units]
        grads = [n * reduce_bytes(p.settings) for n in units]
        zero = tuple(0.0 for _ in units)
        sim = self.simulator
        sigma = 0.0
        extrapolated: tuple[str, ...] = ()
        if self.strategy == "fsdp":
            shard, cross = world, 1
            s_vms, s_world = vms, world
        else:
            per_vm = {g.instance.ranks_per_vm for g in groups}
            if len(per_vm) > 1:
                raise ConfigError(
                    f"hsdp: every VM needs as many ranks (one shard group each), "
                    f"{config.label()} has {sorted(per_vm)}"
                )
            shard, cross = per_vm.pop(), vms
            s_vms, s_world = 1, shard
        gather = reduce = zero
        if shard > 1:
            f = (shard - 1) / shard
            gather = self._collective_s(instances, s_vms, s_world, gathered, ALL_GATHER, f)
            reduce = self._collective_s(instances, s_vms, s_world, grads, REDUCE_SCATTER, f)
            sigma = sim._net_sigma(instances, s_vms, s_world)
            extrapolated = sim._extrapolated(instances, s_vms, s_world)
        if cross > 1:  # hsdp: each shard all-reduced across the VMs' replicas, a VM's
            # `shard` rings at once over its one network
            shards = [x / shard for x in grads]
            f = bus_bytes(1.0, cross)
            across = self._collective_s(instances, vms, world, shards, ALL_REDUCE, f, shard)
            reduce = tuple(a + b for a, b in zip(reduce, across, strict=True))
            sigma = max(sigma, sim._net_sigma(instances, vms, world))
            extrapolated = tuple(sorted({*extrapolated, *sim._extrapolated(instances, vms, world)}))
        out = _Comm(gather, reduce, sigma, extrapolated)
        self._comm_cache[key] = out
        return out

    def accumulating_s(self, workload: Workload, config: ClusterConfig) -> float:
        """One micro-batch of gradient accumulation but the last, at the mean passes: the
        schedule with every all-gather (FSDP2 reshards after forward and gathers again for
        backward on every micro-batch) and no gradient collective (held back until the
        last micro-batch; ``sharding.wrap.gradient_sync``), and no optimizer step."""
        return self._micro_batch_s(workload, config, reduce=False)

    def syncing_s(self, workload: Workload, config: ClusterConfig) -> float:
        """``accumulating_s`` where every micro-batch reduce-scatters its gradients (the
        sync-each mode: ``IterationEstimate.sync_each_micro_batch``): each unit's
        collective overlaps the backward as on the last."""
        return self._micro_batch_s(workload, config, reduce=True)

    def _micro_batch_s(self, workload: Workload, config: ClusterConfig, reduce: bool) -> float:
        c = self.simulator.compute_samples(workload, config.groups)
        units = self.units(workload, config)
        total = float(sum(units)) or 1.0
        weights = tuple(n / total for n in units)
        comm = self._comm(workload, config, units)
        grads = comm.reduce if reduce else tuple(0.0 for _ in units)
        u_fw, u_bw, _ = self.overhead(workload, config) or (0.0, 0.0, 0.0)
        return _schedule_cached(c.t_fw, c.t_bw, weights, comm.gather, grads, u_fw, u_bw).end

    @staticmethod
    def overhead(workload: Workload, config: ClusterConfig) -> tuple[float, float, float] | None:
        """FSDP2's own work per unit (forward, backward) and on the optimizer step
        (``ComputeProfile.fsdp_overhead``), the largest of the configuration's GPUs (the
        slowest rank holds every unit back); None where a GPU's profile did not measure
        it (nothing is added then, and the estimate says so)."""
        terms = [workload.profile(g.instance.device_type).fsdp_overhead for g in config.groups]
        if not all(len(t) == 3 for t in terms):
            return None
        fw, bw, step = (max(t[i] for t in terms) for i in range(3))
        return fw, bw, step

    def shard_degree(self, config: ClusterConfig) -> int:
        if self.strategy == "fsdp":
            return config.world_size
        return max(g.instance.ranks_per_vm for g in config.groups)

    def estimate(self, workload: Workload, config: ClusterConfig) -> IterationEstimate:
        sim = self.simulator
        c = sim.compute_samples(workload, config.groups)
        units = self.units(workload, config)
        total = float(sum(units)) or 1.0
        weights = tuple(n / total for n in units)
        comm = self._comm(workload, config, units)
        own = self.overhead(workload, config)
        u_fw, u_bw, u_step = own or (0.0, 0.0, 0.0)
        # each rank steps its shard, with FSDP2's per-tensor work on the DTensors besides
        step = c.step / self.shard_degree(config) + u_step
        sched = _schedule_cached(c.t_fw, c.t_bw, weights, comm.gather, comm.reduce, u_fw, u_bw)
        # each sampled iteration: the schedule at the mean passes, shifted by its compute's
        # deviation from the mean, never shorter than the stream's serial work
        deviation = (c.fw - c.t_fw) + (c.bw - c.t_bw)
        it = np.maximum(sched.end + deviation, sched.comm_busy) + step
        exact = sim.mean == "exact"
        t_iter = sched.end + step if exact else float(it.mean())
        slow_it = t_iter
        estimated = [workload.profile(g.instance.device_type) for g in config.groups]
        estimated = [p for p in estimated if p.estimate]
        est_cv = max((p.estimate_cv for p in estimated), default=0.0)
        if comm.sigma > 0 or c.vm_spread or est_cv > 0:
            d_net = d_vm = 0.0
            if comm.sigma > 0:  # the network at the level 10% of allocations fell below
                level = float(np.exp(comm.sigma * P90_Z))
                slow = _schedule_cached(
                    c.t_fw,
                    c.t_bw,
                    weights,
                    tuple(x / level for x in comm.gather),
                    tuple(x / level for x in comm.reduce),
                    u_fw,
                    u_bw,
                )
                d_net = slow.end - sched.end
            if c.vm_spread:  # the slowest VM at the p90 of its spread
                t_fw_slow, t_bw_slow = float(c.fw_slow.mean()), float(c.bw_slow.mean())
                slow = _schedule_cached(
                    t_fw_slow, t_bw_slow, weights, comm.gather, comm.reduce, u_fw, u_bw
                )
                d_vm = slow.end - sched.end
            d_est = (c.t_fw + c.t_bw + step) * float(np.expm1(-P90_Z * est_cv))
            slow_it = t_iter + float(np.sqrt(max(d_net, 0.0) ** 2 + max(d_vm, 0.0) ** 2 + d_est**2))
        q = _quantiles(it, (0.5, 0.9, 0.95))
        compute = c.t_fw + c.t_bw
        return IterationEstimate(
            t_iter=t_iter,
            t_fw=c.t_fw,
            t_bw=c.t_bw,
            t_pe=max(0.0, sched.last_reduce - sched.forward_end),
            exposed_comm=max(0.0, sched.end - compute),
            p50=q[0],
            p95=q[2],
            global_batch=config.global_batch,
            world_size=config.world_size,
            bottleneck="communication" if sched.comm_busy > compute else "compute",
            p90=q[1],
            t_iter_p90=slow_it,
            net_sigma=comm.sigma,
            extrapolated=comm.extrapolated,
            estimated=tuple(sorted({p.estimate_note for p in estimated})),
            missing=tuple(
                name
                for name, lacks in (
                    ("optimizer_step", c.no_step),
                    ("shared_slowdown", c.no_share),
                    ("fsdp_overhead", own is None),
                )
                if lacks
            ),
        )
