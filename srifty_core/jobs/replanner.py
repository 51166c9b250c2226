"""Re-planning, in one place: what is left of the job, the next configuration, and the
change from the running one that touches only what differs.

``Replanner`` is used by every path that re-plans:

* the ``srifty_plan_and_train`` DAG: ``child_conf`` (the parent run) turns what is left into
  the conf of the run that continues the job and hands over the allocations whose VMs
  still run; the child's plan task plans with ``Replanner.choose`` and its provision task
  keeps the handed-over allocations its configuration wants (``Replanner.apply``);
* ``srifty train`` (``local_run.train_local``): on a preemption, the survivors' capacity
  (``Replanner.survivors``) and the same change (keep, release, launch);
* the preemption benchmark: ``Replanner.plan`` on the emulated cloud, then ``change``.

What is left: ``N - n`` iterations, ``T - t`` seconds and ``$ - c`` dollars; depleted offers
(spot capacity taken back) are dropped; the overheads of switching (launching the new VMs,
detaching the checkpoint volume) are charged. The original request is never modified.

The change is computed per allocation (a provider launches and releases whole ones): an
allocation of a (type, market) the new configuration still wants is kept while every VM
of it runs and the kept VMs do not exceed the wanted count; the rest of that (type,
market) is launched; allocations no longer wanted, with lost VMs, or beyond the count are
released. Keeping VMs saves their launch delay (about 150 s on EC2) and warm caches.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from srifty_core.catalog.types import Market
from srifty_core.cloud.base import (
    Allocation,
    InstanceState,
    LaunchRequest,
    Provider,
    ProviderError,
    release_all,
)
from srifty_core.cloud.ec2 import EC2Provider
from srifty_core.errors import ConfigError
from srifty_core.planner.request import Offer, Overheads, PlanRequest

if TYPE_CHECKING:
    from srifty_core.planner.result import Candidate, PlanResult

Key = tuple[str, Market]
SWITCH_OVERHEADS = Overheads(launch_s=EC2Provider.launch_s, detach_s=EC2Provider.detach_s)
"""EC2's launch time and EBS's detach time (``EC2Provider``'s), the method's defaults."""


@dataclass(frozen=True, slots=True)
class Progress:
    """What the job did so far (over every configuration)."""

    iterations_done: int
    elapsed_s: float = 0.0
    spent_usd: float = 0.0
    depleted: tuple[str, ...] = ()
    """Offer keys (``type/market``) or types taken back for good (spot)."""
    lost: Mapping[str, int] = field(default_factory=dict)
    """Instances taken back per offer key (their quota is lowered)."""


@dataclass(frozen=True, slots=True)
class Left:
    """What is left of the job's targets."""

    iterations: int
    time_limit_s: float
    budget_usd: float


@dataclass(frozen=True, slots=True)
class ConfigurationChange:
    keep: tuple[Allocation, ...]
    release: tuple[Allocation, ...]
    launch: tuple[LaunchRequest, ...]


class Replanner:
    """The one re-planner (see the module's doc). ``estimator`` (a ``Simulator``) is needed
    only by ``plan``."""

    def __init__(self, estimator: Any = None, *, overheads: Overheads = SWITCH_OVERHEADS):
        self.estimator = estimator
        self.overheads = overheads

    # ------------------------------------------------------------------ what is left
    @staticmethod
    def left(iterations: int, time_limit_s: float, budget_usd: float, done: Progress) -> Left:
        """The targets less what ``done`` used (a limit may be spent: at most 0 left)."""
        return Left(
            iterations - done.iterations_done,
            time_limit_s - done.elapsed_s if math.isfinite(time_limit_s) else math.inf,
            budget_usd - done.spent_usd if math.isfinite(budget_usd) else math.inf,
        )

    def rest(self, request: PlanRequest, done: Progress) -> PlanRequest:
        """The request for the rest of the job (a new object)."""
        left = self.left(request.iterations, request.time_limit_s, request.budget_usd, done)
        if left.iterations < 1:
            raise ConfigError(f"iterations_done: {done.iterations_done} leaves nothing to plan")
        if left.time_limit_s <= 0 or left.budget_usd <= 0:
            which = "time limit" if left.time_limit_s <= 0 else "budget"
            raise ConfigError(f"the {which} is already spent; nothing can be planned for the rest")
        offers = without_depleted(request.offers, done.depleted)
        if not offers:
            gone = ", ".join(sorted(done.depleted))
            raise ConfigError(f"every offered instance type is depleted ({gone})")
        return dataclasses.replace(
            request,
            iterations=left.iterations,
            time_limit_s=left.time_limit_s,
            budget_usd=left.budget_usd,
            offers=offers,
            overheads=self.overheads,
        )

    # ------------------------------------------------------------------ the next plan
    def plan(self, request: PlanRequest, done: Progress, **plan_kwargs: Any) -> PlanResult:
        """Plan the rest of the job (see ``rest``) with the original objective."""
        from srifty_core.planner.search import plan

        if self.estimator is None:
            raise ConfigError("Replanner.plan needs an estimator (a Simulator)")
        return plan(self.rest(request, done), self.estimator, **plan_kwargs)

    @staticmethod
    def choose(result: PlanResult) -> tuple[Candidate, str | None]:
        """The configuration to continue on: the best, else (nothing meets what is left of
        the limits) the nearest miss, with a note saying so. ``None`` notes a met plan."""
        if result.best is not None:
            return result.best, None
        if not result.nearest_misses:
            raise ConfigError("\n".join(result.explanation()))
        miss = result.nearest_misses[0]
        return miss, (
            "no configuration meets what is left of the limits; continuing on the nearest "
            f"miss: {miss.label}"
        )

    @staticmethod
    def target(request: PlanRequest, choice: Iterable[tuple[int, int, int]]) -> dict[Key, int]:
        """VMs wanted per (type, market) by a candidate's ``choice``."""
        out: dict[Key, int] = {}
        for i, count, _ in choice:
            o = request.offers[i]
            key = (o.instance.name, o.market)
            out[key] = out.get(key, 0) + count
        return out

    @staticmethod
    def survivors(global_batch: int, alive: int) -> tuple[int, ...]:
        """Local batches over ``alive`` identical workers when no hardware model is at hand
        (``srifty train`` runs a plan file without profiles): the batch split evenly."""
        if alive < 1 or alive > global_batch:
            raise ConfigError(f"cannot split a batch of {global_batch} over {alive} ranks")
        q, r = divmod(global_batch, alive)
        return tuple(q + (1 if k < r else 0) for k in range(alive))

    # ------------------------------------------------------------------ the change
    @staticmethod
    def change(
        provider: Provider, current: Sequence[Allocation], target: Mapping[Key, int]
    ) -> ConfigurationChange:
        """What to keep, release and launch to go from ``current`` to ``target`` VM counts."""
        keep, release = [], []
        kept: dict[Key, int] = {}
        for a in current:
            key = (a.spec.name, a.market)
            n = running_count(provider, a)
            want = target.get(key, 0)
            if n > 0 and n == a.count and kept.get(key, 0) + n <= want:
                keep.append(a)
                kept[key] = kept.get(key, 0) + n
            else:  # not wanted, lost VMs (interrupted), or more than wanted
                release.append(a)
        launch = tuple(
            LaunchRequest(name, count=want - kept.get((name, market), 0), market=market)
            for (name, market), want in sorted(target.items())
            if want - kept.get((name, market), 0) > 0
        )
        return ConfigurationChange(tuple(keep), tuple(release), launch)

    @classmethod
    def apply(
        cls, provider: Provider, current: Sequence[Allocation], target: Mapping[Key, int]
    ) -> tuple[list[Allocation], ConfigurationChange]:
        """Release what goes, launch what is new (all at once where the provider can), and
        return the allocations of the new configuration with the change made."""
        change = cls.change(provider, current, target)
        release_all(provider, change.release)
        new = launch_all(provider, change.launch)
        return [*change.keep, *new], change


def without_depleted(offers: Iterable[Offer], depleted: Iterable[str]) -> tuple[Offer, ...]:
    """The offers whose type (``g4dn.xlarge``) or offer key (``g4dn.xlarge/spot``) is not
    depleted."""
    gone = set(depleted)
    return tuple(o for o in offers if o.instance.name not in gone and o.key not in gone)


def running_count(provider: Provider, allocation: Allocation) -> int:
    return sum(i.state is InstanceState.RUNNING for i in provider.describe(allocation))


def launch_all(provider: Provider, requests: Sequence[LaunchRequest]) -> list[Allocation]:
    """Launch every request, all at once where the provider can (``launch_many``); if one
    fails, what was already launched is released before the error goes up."""
    launch_many = getattr(provider, "launch_many", None)
    if launch_many is not None:
        return list(launch_many(list(requests)))
    out: list[Allocation] = []
    try:
        for r in requests:
            out.append(provider.launch(r))
    except BaseException as exc:
        try:
            release_all(provider, out)
        except ProviderError as leak:  # the launch error goes up; the leak is named on it
            exc.add_note(str(leak))
        raise
    return out
