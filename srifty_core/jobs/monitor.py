"""The monitor: is the running configuration still going to meet the limits?

It keeps a windowed throughput (samples/s of the steps that finished in the last
``window_s``, default 5 minutes) with its standard deviation, takes the upper 95%
confidence bound of the mean (the optimistic throughput) and projects the finish time and
the cost of the remaining iterations with it. It recommends ``replan`` only when even the
optimistic projection breaks a limit, so a transient slowdown (which widens the bound)
does not make it switch. A preemption is different: the instance type is marked
depleted and the decision is ``replan`` at once. ``StallWatch`` says when a configuration
has logged no step for longer than its step time allows (a hung script or rank). Light: no
torch import.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from srifty_core.errors import ConfigError
from srifty_core.runs.progress import ProgressRecord

CONTINUE = "continue"
REPLAN = "replan"
Z_95 = 1.96


@dataclass(frozen=True, slots=True)
class Limits:
    """The job's original targets and the running configuration's price."""

    iterations: int
    global_batch: int
    time_limit_s: float = math.inf
    budget_usd: float = math.inf
    usd_per_hour: float = 0.0
    """What the running configuration costs per hour (all its VMs)."""

    def __post_init__(self) -> None:
        if self.iterations < 1 or self.global_batch < 1:
            raise ConfigError("iterations and global_batch: must be >= 1")
        if self.usd_per_hour < 0:
            raise ConfigError("usd_per_hour: must be >= 0")


@dataclass(frozen=True, slots=True)
class Window:
    throughput: float
    """Mean samples/s over the steps in the window."""
    std: float
    steps: int

    def bounds(self, z: float = Z_95) -> tuple[float, float]:
        """The (pessimistic, optimistic) confidence bounds of the mean throughput."""
        half = z * self.std / math.sqrt(self.steps) if self.steps > 1 else 0.0
        return max(self.throughput - half, 0.0), self.throughput + half


@dataclass(frozen=True, slots=True)
class Decision:
    action: str
    """``continue`` or ``replan``."""
    reason: str
    iterations_done: int
    elapsed_s: float
    spent_usd: float
    window: Window | None = None
    optimistic_throughput: float | None = None
    projected_time_s: float | None = None
    """Elapsed plus the remaining iterations at the optimistic throughput."""
    projected_cost_usd: float | None = None
    depleted: tuple[str, ...] = field(default_factory=tuple)

    @property
    def replan(self) -> bool:
        return self.action == REPLAN


def windowed_throughput(
    records: Sequence[ProgressRecord], now: float, window_s: float = 300.0
) -> Window | None:
    """Samples/s per step over the steps that finished in ``(now - window_s, now]``."""
    rates = [
        r.samples / r.step_s
        for r in records
        if now - window_s < r.wall_time <= now and r.step_s > 0
    ]
    if not rates:
        return None
    std = statistics.stdev(rates) if len(rates) > 1 else 0.0
    return Window(statistics.fmean(rates), std, len(rates))


def decide(
    records: Sequence[ProgressRecord],
    limits: Limits,
    *,
    now: float,
    started_at: float,
    spent_usd: float | None = None,
    preempted: Iterable[str] = (),
    window_s: float = 300.0,
    z: float = Z_95,
    min_steps: int = 3,
) -> Decision:
    """``continue`` or ``replan`` for a job that started at ``started_at`` (Unix time).

    ``spent_usd`` defaults to the running configuration's rate times the elapsed time;
    ``preempted`` lists instance types the provider took back (depleted: re-plan at once).
    """
    done = max((r.iteration for r in records), default=0)
    elapsed = max(now - started_at, 0.0)
    spent = limits.usd_per_hour * elapsed / 3600.0 if spent_usd is None else spent_usd
    depleted = tuple(sorted(set(preempted)))

    def out(action: str, reason: str, window: Window | None = None) -> Decision:
        return Decision(action, reason, done, elapsed, spent, window, depleted=depleted)

    if depleted:
        return out(REPLAN, f"preempted: {', '.join(depleted)} marked depleted")
    if done >= limits.iterations:
        return out(CONTINUE, "finished")
    if elapsed > limits.time_limit_s:
        return out(REPLAN, "time limit already exceeded")
    if spent > limits.budget_usd:
        return out(REPLAN, "budget already exceeded")
    window = windowed_throughput(records, now, window_s)
    if window is None or window.steps < min_steps:
        return out(CONTINUE, "too few steps in the window to judge", window)
    optimistic = window.bounds(z)[1]
    remaining_s = (limits.iterations - done) * limits.global_batch / optimistic
    t_proj = elapsed + remaining_s
    c_proj = spent + limits.usd_per_hour * remaining_s / 3600.0
    at = f"even at the optimistic {optimistic:.1f} samples/s the job"
    if t_proj > limits.time_limit_s:
        action = REPLAN
        reason = f"{at} ends at {t_proj:.0f} s, past the {limits.time_limit_s:.0f} s limit"
    elif c_proj > limits.budget_usd:
        action = REPLAN
        reason = f"{at} costs ${c_proj:.2f}, over the ${limits.budget_usd:.2f} budget"
    else:
        action = CONTINUE
        reason = f"on track: the optimistic projection ends at {t_proj:.0f} s for ${c_proj:.2f}"
    return Decision(
        action, reason, done, elapsed, spent, window, optimistic, t_proj, c_proj, depleted
    )


@dataclass(frozen=True, slots=True)
class Stall:
    """When a running configuration counts as hung (``StallWatch``): no new step for
    ``steps`` step times (the typical step logged so far, or the planned one if longer),
    never less than ``min_s`` nor than twice the longest step seen (a checkpoint, an
    evaluation pass); before its first step, ``startup_s`` (starting Python, building
    the model, the ranks' rendezvous, a first compiled step)."""

    steps: float = 20.0
    min_s: float = 120.0
    startup_s: float = 600.0

    def __post_init__(self) -> None:
        for name in ("steps", "min_s", "startup_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(f"{name}: must be a positive number of seconds, got {v!r}")


class StallWatch:
    """The clock of one configuration's progress: ``see`` the steps each look finds,
    ``hung`` says (the reason) when none came for longer than the window. Time is the
    monitor's own (``now`` of its looks, not the records' clocks), so a skewed clock
    on a VM neither hides nor fakes a stall."""

    def __init__(
        self,
        rule: Stall,
        started_at: float,
        planned_step_s: float = 0.0,
        *,
        startup: bool = True,
    ) -> None:
        """``startup``: also judge the time before the first step (off where the start has
        its own timeout: VMs that install the wheel, then wait for each other up to their
        join timeout)."""
        self.rule = rule
        self.startup = startup
        self.progress_at = started_at
        self.planned_step_s = planned_step_s if math.isfinite(planned_step_s) else 0.0
        self._steps: deque[float] = deque(maxlen=64)
        self._longest = 0.0

    def see(self, records: Sequence[ProgressRecord], now: float) -> None:
        """The steps logged since the last look (none: no progress)."""
        if not records:
            return
        self.progress_at = max(self.progress_at, now)
        for r in records:
            if math.isfinite(r.step_s) and r.step_s > 0:
                self._steps.append(r.step_s)
                self._longest = max(self._longest, r.step_s)

    def window_s(self) -> tuple[float, str]:
        """How long without a step is too long, and how that was set."""
        rule = self.rule
        if not self._steps:
            w = max(rule.startup_s, rule.min_s, rule.steps * self.planned_step_s)
            return w, f"{w:.0f} s before the first step"
        typical = max(statistics.median(self._steps), self.planned_step_s)
        w = max(rule.min_s, rule.steps * typical, 2.0 * self._longest)
        return w, (
            f"{w:.0f} s: {rule.steps:g} steps of {typical:.3g} s, at least {rule.min_s:g} s "
            f"and twice the longest step, {self._longest:.3g} s"
        )

    def hung(self, now: float) -> str | None:
        """Why the configuration looks hung at ``now``, or ``None``."""
        if not self._steps and not self.startup:
            return None
        idle = now - self.progress_at
        window, why = self.window_s()
        if idle <= window:
            return None
        return f"no training step for {idle:.0f} s (the window: {why})"
