"""The emulated EC2's training: synchronous data-parallel iterations over running
allocations in simulated time (``train``), and runs that go on as the clock moves
(``start_training``, the emulated ranks' ``start_workers``).

* **Training as the clock runs.** ``start_training`` draws a run's iterations (as
  ``train``) without moving the clock; then each step of the clock (``advance``, ``wait``)
  hands the iterations that ended by then to a callback (``TrainingStep``: what a rank 0
  would log), until the run ends (exit code 0) or an interruption stops its ranks
  (``preempt_after``: the first instance of a type that trains is taken back that many
  seconds into its training, once).

Every time comes from ``cloud.emulator_truth`` (``training_iterations_detail``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from srifty_core.cloud import emulator_truth as truth
from srifty_core.cloud.base import Allocation, InstanceState, Interruption, ProviderError, Workers
from srifty_core.cloud.emulated.world import EmulatedWorld, _Alloc
from srifty_core.errors import ConfigError

if TYPE_CHECKING:
    from srifty_core.profiling.profile import ComputeProfile


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


class EmulatedTraining(EmulatedWorld):
    """The emulated EC2's training (see the module's docstring): the clock hands the runs
    ``start_training`` started their iterations; ``stop`` and ``release`` end them."""

    @functools.cached_property
    def _sessions(self) -> list[_Session]:
        """The runs of ``start_training`` still handed iterations as the clock moves."""
        return []

    def advance(self, seconds: float) -> datetime:
        """Move the simulated clock forward, applying the interruptions it passes, and hand
        each started run the iterations that ended by then."""
        super().advance(seconds)
        self._deliver_steps()
        return self._clock

    def stop(self, allocation: Allocation) -> None:
        self._end_sessions(allocation.id)
        super().stop(allocation)

    def release(self, allocation: Allocation | str) -> None:
        self._end_sessions(allocation if isinstance(allocation, str) else allocation.id)
        super().release(allocation)

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
            t.device_type: truth.device_rate(t)
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
