"""``Simulator.estimate(workload, config) -> IterationEstimate``: compute under variance plus
the event-driven gradient exchange, ``t_iter = t_fw + max(t_bw, t_pe)`` per iteration.

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
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray
from scipy.special import ndtri

from srifty_core.errors import ConfigError
from srifty_core.predictors.base import BandwidthPredictor
from srifty_core.simulator.compute import expected_max
from srifty_core.simulator.exchange import bus_bytes, simulate_exchange
from srifty_core.simulator.types import ClusterConfig, IterationEstimate, SimInstance, Workload

DEFAULT_ITERS = 256


class Estimator(Protocol):
    """What the planner needs: an iteration estimate for a configuration."""

    def estimate(self, workload: Workload, config: ClusterConfig) -> IterationEstimate: ...


class Simulator:
    """The Srifty simulator over a bandwidth predictor.

    ``iters`` iterations are sampled per estimate (seeded by ``seed``); ``mean="sampled"``
    reports the sample means (the method), ``mean="exact"`` replaces the mean compute
    times by their numerically integrated expectation (no sampling noise).
    """

    def __init__(
        self,
        bandwidth: BandwidthPredictor,
        *,
        iters: int = DEFAULT_ITERS,
        seed: int = 0,
        mean: str = "sampled",
        max_types: int = 8,
    ) -> None:
        if iters < 2:
            raise ConfigError(f"iters must be >= 2, got {iters}")
        if mean not in ("sampled", "exact"):
            raise ConfigError(f"mean must be 'sampled' or 'exact', got {mean!r}")
        self.bandwidth = bandwidth
        self.iters = iters
        self.seed = seed
        self.mean = mean
        rng = np.random.default_rng(seed)
        # common random numbers: columns are instance-type slots, fw and bw blocks apart
        self._u_fw = rng.random((iters, max_types))
        self._u_bw = rng.random((iters, max_types))
        self._busbw_cache: dict[tuple[Any, ...], NDArray[np.float64]] = {}
        self._cap_cache: dict[tuple[str, int], float] = {}
        self._exchange = lru_cache(maxsize=65536)(self._exchange_uncached)

    # ------------------------------------------------------------------ bandwidth
    def _busbw(
        self, instances: Sequence[SimInstance], world: int, sizes: tuple[int, ...]
    ) -> NDArray[np.float64]:
        """Stand-alone bus bandwidth per bucket: the slowest type's, one batched query."""
        key = (tuple(i.name for i in instances), world, sizes)
        hit = self._busbw_cache.get(key)
        if hit is not None:
            return hit
        import pandas as pd

        rows = [
            {**inst.features, "world_size": world, "buffer_bytes": s, "concurrent": 1}
            for inst in instances
            for s in sizes
        ]
        pred = np.asarray(self.bandwidth.predict(pd.DataFrame(rows)), dtype=np.float64)
        if pred.shape != (len(rows),) or not np.all(pred > 0):
            raise ConfigError("the bandwidth predictor returned non-positive or misshapen output")
        out: NDArray[np.float64] = pred.reshape(len(instances), len(sizes)).min(axis=0)
        self._busbw_cache[key] = out
        return out

    def _cap(self, instances: Sequence[SimInstance], world: int) -> float:
        caps = []
        for inst in instances:
            key = (inst.name, world)
            if key not in self._cap_cache:
                self._cap_cache[key] = float(self.bandwidth.bandwidth_cap(inst.name, world))
            caps.append(self._cap_cache[key])
        return min(caps)

    def _exchange_uncached(
        self,
        fractions: tuple[float, ...],
        volumes: tuple[float, ...],
        busbw: tuple[float, ...],
        cap: float,
        t_bw: float,
    ) -> float:
        starts = [f * t_bw for f in fractions]
        return simulate_exchange(starts, volumes, busbw, cap).t_pe

    # ------------------------------------------------------------------ estimate
    def estimate(self, workload: Workload, config: ClusterConfig) -> IterationEstimate:
        groups = config.groups
        if len(groups) > self._u_fw.shape[1]:
            raise ConfigError(f"at most {self._u_fw.shape[1]} instance types per configuration")
        mu_fw, sd_fw, mu_bw, sd_bw, counts = [], [], [], [], []
        for g in groups:
            p = workload.profile(g.instance.device_type)
            b = g.batch_per_rank
            mu_fw.append(float(p.t_fw(b)))
            sd_fw.append(float(p.std_fw(b)))
            mu_bw.append(float(p.t_bw(b)))
            sd_bw.append(float(p.std_bw(b)))
            counts.append(g.count)
        j = len(groups)
        k = np.asarray(counts, dtype=np.float64)
        fw = (np.asarray(mu_fw) + np.asarray(sd_fw) * ndtri(self._u_fw[:, :j] ** (1.0 / k))).max(1)
        bw = (np.asarray(mu_bw) + np.asarray(sd_bw) * ndtri(self._u_bw[:, :j] ** (1.0 / k))).max(1)
        if self.mean == "exact":
            t_fw = expected_max(mu_fw, sd_fw, counts)
            t_bw = expected_max(mu_bw, sd_bw, counts)
        else:
            t_fw, t_bw = float(fw.mean()), float(bw.mean())

        world = config.world_size
        t_pe = 0.0
        if world > 1:
            slow = max(range(j), key=lambda i: mu_bw[i])
            buckets = workload.profile(groups[slow].instance.device_type).buckets
            sizes = tuple(b.size_bytes for b in buckets)
            instances = [g.instance for g in groups]
            busbw = self._busbw(instances, world, sizes)
            t_pe = self._exchange(
                tuple(b.ready_fraction for b in buckets),
                tuple(bus_bytes(s, world) for s in sizes),
                tuple(float(x) for x in busbw),
                self._cap(instances, world),
                t_bw,
            )
        it = fw + np.maximum(bw, t_pe)
        t_iter = float(it.mean()) if self.mean == "sampled" else t_fw + max(t_bw, t_pe)
        return IterationEstimate(
            t_iter=t_iter,
            t_fw=t_fw,
            t_bw=t_bw,
            t_pe=t_pe,
            exposed_comm=max(0.0, t_pe - t_bw),
            p50=float(np.percentile(it, 50)),
            p95=float(np.percentile(it, 95)),
            global_batch=config.global_batch,
            world_size=world,
            bottleneck="communication" if t_pe > t_bw else "compute",
        )
