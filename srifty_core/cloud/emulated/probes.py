"""The emulated EC2's network probes: collective samples on an allocation (``probe``: allreduce
by default; all_gather and reduce_scatter by ``emulator_truth.collective_time``'s published
relations, checked against the public p5 all-gather tables), the
sustained-transfer probe (``probe_sustained``), and the same over one ring of several
allocations (``probe_mix``, ``probe_mix_sustained``), as columns of probe records.

* **Mixed rings.** ``probe_mix``/``probe_mix_sustained`` probe allocations of several
  types as one ring, as a heterogeneous job's allreduce runs (``emulated_probe_sweep``'s
  ``mixes``); the rows carry the mix's label (``probing.mix``).

Every time comes from ``cloud.emulator_truth`` (the network's ground truth); the clock
advances by what was measured. ``cloud.emulated.measurements`` makes a dataset of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import date, timedelta
from typing import Any

import numpy as np
from numpy.typing import NDArray

from srifty_core.cloud import emulator_truth as truth
from srifty_core.cloud.base import Allocation
from srifty_core.cloud.emulated.world import EmulatedWorld, _Alloc
from srifty_core.errors import ConfigError
from srifty_core.probing.config import ALL_REDUCE, BUSBW_FACTOR
from srifty_core.probing.mix import ring_columns

DEFAULT_WORLD_SIZES = (2, 4, 8, 16, 32, 64)
DEFAULT_CONCURRENCY = (1, 2, 4)
PROBE_GAP_S = 0.002
"""Simulated time between two probe samples (synchronisation, bookkeeping)."""
SUSTAINED_BYTES = 256 * 1024**2
"""Buffer of the sustained-transfer probe: a large bucket, back to back, as training sends."""
SUSTAINED_MAX_S = 3900.0
"""The sustained probe gives up waiting for a drop after 65 minutes (AWS: bursts last "5 to
60 minutes")."""


_VARYING = ("world_size", "buffer_bytes", "concurrent", "repeat", "time_s", "probed_at")


def _columns(fixed: Mapping[str, Any], cols: Mapping[str, list[Any]]) -> dict[str, list[Any]]:
    """Probe columns: ``fixed`` on every sample of ``cols``, and each sample's busbw (by the
    ``collective`` of ``fixed``: allreduce where it names none)."""
    m = len(cols["time_s"])
    out: dict[str, list[Any]] = {k: [v] * m for k, v in fixed.items()}
    out.update(cols)
    n_arr = np.asarray(out["world_size"], dtype=np.float64)
    s_arr = np.asarray(out["buffer_bytes"], dtype=np.float64)
    t_arr = np.asarray(out["time_s"], dtype=np.float64)
    factor = BUSBW_FACTOR[fixed.get("collective", ALL_REDUCE)]
    out["busbw"] = list(factor * s_arr * (n_arr - 1.0) / (n_arr * t_arr))
    return out


class EmulatedProbes(EmulatedWorld):
    """The emulated EC2's probes (see the module's docstring)."""

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
        collective: str = ALL_REDUCE,
    ) -> dict[str, list[Any]]:
        """``collective`` samples (allreduce by default) on ``allocation`` as columns of
        probe records (``PROBE_SCHEMA`` names; ``records_to_table``/``columns_to_table`` make
        a table). World sizes above the allocation's ranks are skipped; the clock advances by
        the measured time. NICs rated "up to" a bandwidth burst while their credits last
        (phase ``burst``)."""
        a = self._running(allocation)
        net = truth.NetSpec.of(self.catalog_type(allocation.spec.name))
        size_arr = np.asarray(sorted(set(int(s) for s in sizes)), dtype=np.float64)
        cols: dict[str, list[Any]] = {k: [] for k in _VARYING}
        for n in sorted(set(world_sizes)):
            if n < 2 or n > allocation.ranks:
                continue
            for c in sorted(set(concurrency)):
                for rep in range(repeats):
                    base = truth.collective_time(
                        collective,
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
        out = self._records(a, cols, allocation_slot, day, "burst", collective)
        return out

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
        collective: str | None = None,
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
        if collective is not None:
            labels["collective"] = collective
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
