"""Gradient accumulation in the simulated iteration: each rank runs its local batch as k
micro-batches and the gradients are exchanged once, with the last.

Contract: ``micro_batches_needed(config, b_max_of)`` is the k a configuration needs for
every rank's micro-batch to fit (``b_max_of(instance, world)``: that GPU's B_max under
the strategy; one k for the whole configuration, as a plan has one); ``micro_config``
the configuration at its micro-batches (each rank's ``ceil(b / k)``, the largest of its
slices); ``Accumulated(inner, k_of, earlier_s)`` an ``Estimator`` whose iteration of a
configuration needing k > 1 is ``inner``'s iteration of the micro configuration (the last
micro-batch: its compute, the whole exchange and overlap, the optimizer step) plus
``k - 1`` times ``earlier_s`` of it (a micro-batch before the last: ddp its forward and
backward passes, no exchange; fsdp/hsdp those with every all-gather and no
reduce-scatter, ``ShardedSimulator.accumulating_s``; with ``sync_each``, FSDP's other
mode, every micro-batch reduce-scatters too, ``syncing_s``, and a rank keeps no unsharded
gradient between them). ``Fastest(first, *others)`` the fastest estimate of those whose
configuration fits (under fsdp/hsdp: the two modes, each at the k its memory allows).
Every sampled quantile shifts by the same mean: the earlier micro-batches' own spread is
not modelled. Derivation: docs/design/sharding.md, "Gradient accumulation".
``plan_estimator(simulator, strategy, k, sync_each)`` is the ``Estimator`` of a plan whose
strategy and micro-batches are known (a running job's: what recalibration projects).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from srifty_core.errors import ConfigError
from srifty_core.sharding.memory import parse_strategy
from srifty_core.simulator.estimator import Estimator, Simulator
from srifty_core.simulator.sharded import ShardedSimulator
from srifty_core.simulator.types import (
    ClusterConfig,
    Group,
    IterationEstimate,
    SimInstance,
    Workload,
)


def micro_batches_needed(
    config: ClusterConfig,
    b_max_of: Callable[[SimInstance, int], int],
    accumulating_of: Callable[[SimInstance, int], int] | None = None,
) -> int:
    """The fewest micro-batches k with every rank's ``ceil(b / k)`` within its GPU's
    B_max (module doc); 0 where some GPU holds no sample at all. ``accumulating_of``: the
    B_max of a micro-batch while gradients accumulate, where that holds more than one pass
    does (a sharded rank keeps every unsharded gradient); ``b_max_of`` when not given."""
    world = config.world_size
    if accumulating_of is not None and all(
        1 <= g.batch_per_rank <= b_max_of(g.instance, world) for g in config.groups
    ):
        return 1
    k = 1
    for g in config.groups:
        most = (accumulating_of or b_max_of)(g.instance, world)
        if most < 1:
            return 0
        k = max(k, -(-g.batch_per_rank // most))
    return k


def passes_s(simulator: Simulator) -> Callable[[Workload, ClusterConfig], float]:
    """ddp's micro-batch before the last: the slowest VM's mean forward and backward passes
    (``no_sync``: nothing exchanged, no step)."""

    def earlier(workload: Workload, micro: ClusterConfig) -> float:
        c = simulator.compute_samples(workload, micro.groups)
        return c.t_fw + c.t_bw

    return earlier


def micro_config(config: ClusterConfig, k: int) -> ClusterConfig:
    """``config`` with each rank's batch its largest micro-batch, ``ceil(b / k)``."""
    return ClusterConfig(
        tuple(
            Group(g.instance, g.count, math.ceil(g.batch_per_rank / k) * g.instance.ranks_per_vm)
            for g in config.groups
        )
    )


class Accumulated:
    """An ``Estimator`` of the iteration with gradient accumulation (module doc):
    ``k_of(config)`` the micro-batches a configuration needs (0: none fits; ``inner``'s
    estimate then, marked ``unfit`` with ``why_none(config)``), ``earlier_s(workload,
    micro)`` one micro-batch before the last."""

    def __init__(
        self,
        inner: object,
        k_of: Callable[[ClusterConfig], int],
        earlier_s: Callable[[Workload, ClusterConfig], float],
        why_none: Callable[[ClusterConfig], str] | None = None,
        sync_each: bool = False,
    ) -> None:
        self.inner = inner
        self.k_of = k_of
        self.earlier_s = earlier_s
        self.why_none = why_none or (lambda _config: "a GPU holds no sample")
        self.sync_each = sync_each

    def estimate(self, workload: Workload, config: ClusterConfig) -> IterationEstimate:
        k = self.k_of(config)
        estimate: Callable[[Workload, ClusterConfig], IterationEstimate]
        estimate = self.inner.estimate  # type: ignore[attr-defined]
        smallest = min(g.batch_per_rank for g in config.groups)
        if k <= 1 or k > smallest:
            e = estimate(workload, config)
            if k == 0:  # the whole batch's own answer would not say why no micro-batch fits
                e = dataclasses.replace(e, unfit=self.why_none(config))
            elif k > smallest:
                why = f"{k} micro-batches needed, more than the smallest local batch {smallest}"
                e = dataclasses.replace(e, unfit=e.unfit or why)
            return e
        micro = micro_config(config, k)
        last = estimate(workload, micro)
        if last.unfit:  # it cannot run (an hsdp mix of unequal VMs has no micro-batch schedule)
            return dataclasses.replace(
                last,
                global_batch=config.global_batch,
                micro_batches=k,
                sync_each_micro_batch=self.sync_each,
            )
        extra = (k - 1) * self.earlier_s(workload, micro)
        return dataclasses.replace(
            last,
            t_iter=last.t_iter + extra,
            t_fw=k * last.t_fw,
            t_bw=k * last.t_bw,
            p50=last.p50 + extra,
            p95=last.p95 + extra,
            p90=None if last.p90 is None else last.p90 + extra,
            t_iter_p90=None if last.t_iter_p90 is None else last.t_iter_p90 + extra,
            global_batch=config.global_batch,
            micro_batches=k,
            sync_each_micro_batch=self.sync_each,
        )


class Fastest:
    """An ``Estimator``: the fastest (mean iteration, as configurations are ranked) of the
    estimators' answers whose configuration fits (``unfit`` empty); where none fits, the
    last one's answer (the mode that needs the least memory: its reason is the real
    one). The others are asked only where ``first``'s answer accumulates or does not fit
    (one pass fits: every mode is that pass); a tie goes to the earlier."""

    def __init__(self, first: Accumulated, *others: Accumulated) -> None:
        self.first = first
        self.others = others

    def estimate(self, workload: Workload, config: ClusterConfig) -> IterationEstimate:
        e = self.first.estimate(workload, config)
        if e.micro_batches <= 1 and not e.unfit:
            return e
        fits = [e] if not e.unfit else []
        last = e
        for other in self.others:
            last = other.estimate(workload, config)
            if not last.unfit:
                fits.append(last)
        return min(fits, key=lambda x: x.t_iter) if fits else last


def plan_estimator(
    simulator: Simulator, strategy: str, micro_batches: int = 1, sync_each: bool = False
) -> Estimator:
    """The ``Estimator`` of configurations trained under ``strategy`` in ``micro_batches``
    per step, both fixed (a running job's plan), ``sync_each`` its sharded accumulation's
    mode: ``simulator`` itself for ddp in one pass, else the sharded iteration
    (``ShardedSimulator``) and the accumulation around it."""
    if micro_batches < 1:
        raise ConfigError(f"micro_batches: must be at least 1, got {micro_batches}")
    sharded = None if strategy == "ddp" else ShardedSimulator(simulator, parse_strategy(strategy))
    if sync_each and sharded is None:
        raise ConfigError("sync_each_micro_batch: only fsdp and hsdp shard their gradients")
    inner: Estimator = simulator if sharded is None else sharded
    if micro_batches == 1:
        return inner
    if sharded is None:
        earlier = passes_s(simulator)
    else:
        earlier = sharded.syncing_s if sync_each else sharded.accumulating_s
    return Accumulated(inner, lambda _config: micro_batches, earlier, sync_each=sync_each)
