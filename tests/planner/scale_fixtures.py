"""Random small planning requests for the exact-search and approximation tests: several
device types with run-to-run and VM-to-VM spread, instance types of 1 or 2 GPUs, and a
bandwidth model whose bus bandwidth depends on the type, the world size (not monotonically)
and the buffer size, with caps, sustained factors, mixed-ring factors below and above 1 and
a spread of allocation levels: everything the bounds must hold against."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from srifty_core.catalog.types import Market
from srifty_core.planner.request import Objective, Offer, Overheads, PlanRequest
from srifty_core.planner.search import plan
from srifty_core.profiling.profile import ComputeProfile, GradientBucket
from srifty_core.simulator.estimator import Simulator
from srifty_core.simulator.types import SimInstance, Workload
from tests.profiling.test_profile_contract import make_profile

BUCKETS = (
    GradientBucket(0, 40_000, 3, 0.1),
    GradientBucket(1, 90_000, 5, 0.5),
    GradientBucket(2, 30_000, 2, 1.0),
)


def device(name: str, scale: float, *, cv: float = 0.0) -> ComputeProfile:
    """``make_profile`` ``scale`` times slower on device ``name``, with its gradient buckets
    large enough for the exchange to matter and (``cv``) a VM-to-VM spread."""
    p = make_profile()

    def stretch(stats: Any) -> Any:
        return dataclasses.replace(
            stats,
            mean_s=tuple(m * scale for m in stats.mean_s),
            std_s=tuple(s * scale for s in stats.std_s),
        )

    def refit(fit: Any) -> Any:
        return dataclasses.replace(
            fit,
            slopes=tuple(x * scale for x in fit.slopes),
            intercepts=tuple(x * scale for x in fit.intercepts),
        )

    return dataclasses.replace(
        p,
        device_type=name,
        fw=stretch(p.fw),
        bw=stretch(p.bw),
        fw_fit=refit(p.fw_fit),
        bw_fit=refit(p.bw_fit),
        buckets=BUCKETS,
        vm_cv=cv,
        profiled_vms=3 if cv else 1,
    )


WORKLOAD = Workload(
    "m",
    {
        "A": device("A", 0.4),
        "B": device("B", 0.7, cv=0.04),
        "C": device("C", 1.3),
        "D": device("D", 2.0, cv=0.08),
    },
)
INSTANCES = (
    SimInstance("a.1", "A", 1, {"instance_type": "a.1"}),
    SimInstance("a.2", "A", 2, {"instance_type": "a.2"}),
    SimInstance("b.1", "B", 1, {"instance_type": "b.1"}),
    SimInstance("c.1", "C", 1, {"instance_type": "c.1"}),
    SimInstance("c.2", "C", 2, {"instance_type": "c.2"}),
    SimInstance("d.1", "D", 1, {"instance_type": "d.1"}),
)
PRICES = {"a.1": 3.0, "a.2": 5.5, "b.1": 1.6, "c.1": 0.9, "c.2": 1.7, "d.1": 0.35}


class WorldBandwidth:
    """Bus bandwidth by type, world size and buffer size (bytes/s): lower for larger
    rings, with a bump at 6 ranks (a probed world that came out fast), slower for small
    buffers; caps by type and world; a sustained factor; mixed rings 0.85-1.1 x the
    composition by buffer size; allocation levels spread 0.15."""

    base: ClassVar[dict[str, float]] = {
        "a.1": 4e6,
        "a.2": 9e6,
        "b.1": 1.5e6,
        "c.1": 2.5e6,
        "c.2": 5e6,
        "d.1": 0.8e6,
    }

    def predict(self, features: pd.DataFrame) -> np.ndarray:
        out = []
        for t, n, s in zip(
            features["instance_type"], features["world_size"], features["buffer_bytes"],
            strict=True,
        ):  # fmt: skip
            ring = 1.0 + 2.0 / float(n) + (0.4 if int(n) == 6 else 0.0)
            size = float(s) / (float(s) + 20_000.0)
            out.append(self._base(str(t)) * ring * size)
        return np.asarray(out)

    def _base(self, name: str) -> float:
        """By instance type; a type named after one (``a.1.3``) is that one."""
        return self.base[max((k for k in self.base if name.startswith(k)), key=len)]

    def bandwidth_cap(self, instance_type: str, world_size: int) -> float:
        return 1.6 * self._base(instance_type) * (1.0 + 1.0 / world_size)

    def sustained_factor(self, instance_type: str, world_size: int) -> float:
        return 0.9 if instance_type.endswith(".1") else 1.0

    def mixed_factors(self, buffer_bytes: Any, features: Any = None) -> np.ndarray:
        b = np.asarray(buffer_bytes, dtype=np.float64)
        return np.where(b > 50_000, 0.85, 1.1)

    def mixed_bound(self, buffer_bytes: Any) -> np.ndarray:
        return self.mixed_factors(buffer_bytes)

    def level_sigma(self, instance_type: str) -> float:
        return 0.15


def simulator() -> Simulator:
    return Simulator(WorldBandwidth(), iters=48)


def random_request(
    rng: np.random.Generator, *, kinds: int | None = None, quotas: tuple[int, int] = (1, 7)
) -> PlanRequest:
    """2-4 offers (a type on one or two markets), quotas 1-6 (``quotas``: the range, the
    end excluded), a power-of-two global batch
    the quotas hold, either objective; limits set from the configurations' own spread
    (about half of them meet it) or too tight for any, or none."""
    return with_limits(*unlimited_request(rng, kinds=kinds, quotas=quotas))


def unlimited_request(
    rng: np.random.Generator, *, kinds: int | None = None, quotas: tuple[int, int] = (1, 7)
) -> tuple[PlanRequest, float]:
    """``random_request`` before its limits: the request without them, and the draw that
    picks them (``with_limits``). The same draws from ``rng`` as ``random_request``, so a
    caller that rejects the request by its space skips the exhaustive search its limits
    take."""
    k = int(rng.integers(2, 5)) if kinds is None else kinds
    names = [INSTANCES[int(i)] for i in rng.choice(len(INSTANCES), size=k, replace=False)]
    offers = []
    for inst in names:
        market = Market.SPOT if rng.random() < 0.5 else Market.ON_DEMAND
        price = PRICES[inst.name] * (0.4 if market is Market.SPOT else 1.0)
        offers.append(Offer(inst, market, int(rng.integers(*quotas)), price))
    most = sum(o.quota * o.instance.ranks_per_vm * 256 for o in offers)
    batches = [b for b in (32, 64, 128, 256, 512) if b <= most]
    base = PlanRequest(
        workload=WORKLOAD,
        global_batch=int(rng.choice(batches)),
        iterations=200,
        offers=tuple(offers),
        objective=Objective.TIME if rng.random() < 0.5 else Objective.COST,
        overheads=Overheads(launch_s=float(rng.choice([0.0, 60.0]))),
    )
    return base, float(rng.random())


def with_limits(base: PlanRequest, limits: float) -> PlanRequest:
    """``base`` with the limits the draw ``limits`` picks (``random_request``)."""
    if limits < 0.3:
        return base
    free = plan(base, simulator(), method="exhaustive", exhaustive_limit=10**6)
    times = sorted(c.time_at_risk_s for c in free.candidates)
    costs = sorted(c.cost_at_risk_usd for c in free.candidates)
    if limits < 0.55:
        return dataclasses.replace(base, time_limit_s=float(np.median(times)))
    if limits < 0.8:
        return dataclasses.replace(base, budget_usd=float(np.median(costs)))
    if limits < 0.93:
        return dataclasses.replace(
            base, time_limit_s=float(np.quantile(times, 0.6)), budget_usd=float(costs[-1])
        )
    return dataclasses.replace(base, time_limit_s=0.9 * times[0], budget_usd=math.inf)
