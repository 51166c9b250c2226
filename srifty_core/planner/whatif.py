"""What-if answers: how the best plan, its time and cost change when one thing in the request
changes, and what one more VM of each offered type would be worth.

Contract: ``parse_scenario`` reads ``key=value[; key=value ...]`` (a ``FieldError`` naming
the scenario otherwise); ``WhatIf(data, estimator, build).ask(scenario)`` returns an
``Answer`` (the scenario's ``PlanResult`` beside the base plan), ``marginal_values`` one
per offer with one more VM than its quota. The changed request goes through the same
schema as a request file; the base request is never modified. Every scenario plans behind
one ``MemoEstimator``: a configuration already simulated is not simulated again.

Imports ``planner.search.plan`` (at call time), PyYAML, and the planner's and
simulator's types for annotations.

How and why (scenario syntax, the memo): docs/design/planner.md#whatif
"""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from srifty_core.errors import ConfigError, FieldError

if TYPE_CHECKING:
    from srifty_core.planner.request import PlanRequest
    from srifty_core.planner.result import Candidate, PlanResult
    from srifty_core.profiling.profile import ComputeProfile
    from srifty_core.simulator.estimator import Estimator
    from srifty_core.simulator.types import ClusterConfig, IterationEstimate, Workload

OFFER_FIELDS = ("quota", "price", "market", "zone", "min_batch", "type")
_BY_TYPE = re.compile(r"^(?P<field>[a-z_]+)\[(?P<type>[^\]]+)\]$")
_BY_INDEX = re.compile(r"^offers\[(?P<i>\d+)\]\.(?P<field>[a-z_]+)$")


@dataclass(frozen=True)
class Assignment:
    key: str
    value: Any


@dataclass(frozen=True)
class Scenario:
    """One what-if: its text as typed and the assignments it makes."""

    text: str
    assignments: tuple[Assignment, ...]


def parse_scenario(text: str) -> Scenario:
    """``key=value[; key=value ...]`` (module docstring); a ``FieldError`` naming the
    scenario otherwise."""
    import yaml

    parts = [p.strip() for p in str(text).split(";") if p.strip()]
    if not parts:
        raise FieldError("what-if", f"empty scenario {text!r}: write key=value")
    out = []
    for part in parts:
        key, sep, raw = part.partition("=")
        key = key.strip()
        if not sep or not key:
            raise FieldError("what-if", f"{part!r}: write key=value, e.g. budget_usd=20")
        try:
            value = yaml.safe_load(raw.strip()) if raw.strip() else None
        except yaml.YAMLError:
            value = raw.strip()
        out.append(Assignment(key, value))
    return Scenario(str(text), tuple(out))


def apply_scenario(data: Mapping[str, Any], scenario: Scenario) -> dict[str, Any]:
    """A deep copy of the request dict ``data`` with the scenario's assignments made."""
    out = copy.deepcopy(dict(data))
    for a in scenario.assignments:
        where = f"what-if {scenario.text!r}"
        m = _BY_TYPE.match(a.key)
        n = _BY_INDEX.match(a.key)
        found = m or n
        if found:
            name = found.group("field")
            if name not in OFFER_FIELDS:
                raise FieldError(
                    where, f"{name!r} is not an offer field ({', '.join(OFFER_FIELDS)})"
                )
            offers = out.get("offers")
            if not isinstance(offers, list):
                raise FieldError(where, "the request has no offers list")
            if n:
                i = int(n.group("i"))
                if i >= len(offers):
                    raise FieldError(where, f"offers[{i}]: the request has {len(offers)} offers")
                offer = offers[i]
            else:
                offer = _offer_by_type(offers, str(found.group("type")), where)  # found is m here
            if not isinstance(offer, dict):
                raise FieldError(where, "that offer is not a mapping")
            offer[name] = a.value
            continue
        target: dict[str, Any] = out
        *heads, last = a.key.split(".")
        for h in heads:
            nxt = target.get(h)
            if nxt is None:
                nxt = target[h] = {}
            if not isinstance(nxt, dict):
                raise FieldError(where, f"{h!r} is not a mapping in the request")
            target = nxt
        if a.value is None:
            target.pop(last, None)  # null: back to the default (no limit for the limits)
        else:
            target[last] = a.value
    return out


def _offer_by_type(offers: list[Any], key: str, where: str) -> Any:
    itype, _, market = key.partition("@")
    found = [
        o
        for o in offers
        if isinstance(o, dict)
        and o.get("type") == itype
        and (not market or str(o.get("market", "on-demand")).replace("_", "-") == market)
    ]
    if len(found) == 1:
        return found[0]
    if not found:
        offered = sorted({str(o.get("type")) for o in offers if isinstance(o, dict)})
        raise FieldError(where, f"no offer of {key!r}; offered: {', '.join(offered)}")
    raise FieldError(where, f"{itype!r} is offered on several markets: write {itype}@spot")


class MemoEstimator:
    """An estimator that remembers every estimate it gave, keyed by the workload's name and
    profiles and the configuration: what-if scenarios on the same workload simulate only
    configurations no earlier search did. ``hits`` and ``misses`` count."""

    def __init__(self, inner: Estimator) -> None:
        self.inner = inner
        self.hits = 0
        self.misses = 0
        self._memo: dict[tuple[Any, ...], IterationEstimate] = {}
        self._keep: list[Any] = []  # the profiles behind the ids in the keys

    def _key(self, workload: Workload, config: ClusterConfig) -> tuple[Any, ...]:
        profiles = tuple(sorted((d, id(p)) for d, p in workload.profiles.items()))
        return (workload.model, profiles, config)

    def estimate(self, workload: Workload, config: ClusterConfig) -> IterationEstimate:
        key = self._key(workload, config)
        hit = self._memo.get(key)
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        out = self.inner.estimate(workload, config)
        self._memo[key] = out
        self._keep.append(workload.profiles)
        return out

    def __getattr__(self, name: str) -> Any:
        """Everything else is the inner estimator's: so the memo is a
        ``PlannerEstimator`` (prefetch, the floors) exactly where the inner one is."""
        return getattr(self.inner, name)


def profile_loader(
    load: Callable[..., ComputeProfile],
) -> Callable[..., ComputeProfile]:
    """``load`` with each (model, size, device[, settings]) read once: every scenario's
    workload then holds the same profile objects, which the memo and the simulator's
    caches key on."""
    seen: dict[tuple[Any, ...], ComputeProfile] = {}

    def cached(model: str, size: str, device: str, *settings: Any) -> ComputeProfile:
        key = (model, size, device, *settings)
        if key not in seen:
            seen[key] = load(model, size, device, *settings)
        return seen[key]

    return cached


@dataclass(frozen=True)
class Answer:
    """One scenario's plan beside the base plan."""

    scenario: str
    result: PlanResult
    seconds: float

    def delta(self, base: PlanResult) -> tuple[float | None, float | None]:
        """(time, cost) of this scenario's best minus the base's best; None where either
        found no feasible plan."""
        if self.result.best is None or base.best is None:
            return None, None
        return (
            self.result.best.time_s - base.best.time_s,
            self.result.best.cost_usd - base.best.cost_usd,
        )


@dataclass
class WhatIf:
    """A base request and an estimator, ready to answer scenarios (module docstring)."""

    data: Mapping[str, Any]
    estimator: Estimator
    build: Callable[[Mapping[str, Any]], PlanRequest]
    """Request dict -> ``PlanRequest`` (validated; profiles through ``profile_loader``, as
    ``planner.job.store_requests`` builds it)."""
    plan_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.memo = MemoEstimator(self.estimator)
        self.base_request = self.build(self.data)
        t0 = time.perf_counter()
        self.base = self._plan(self.base_request)
        self.base_seconds = time.perf_counter() - t0

    def _plan(self, request: PlanRequest) -> PlanResult:
        from srifty_core.planner.search import plan

        return plan(request, self.memo, **self.plan_kwargs)

    def ask(self, scenario: str | Scenario) -> Answer:
        sc = scenario if isinstance(scenario, Scenario) else parse_scenario(scenario)
        t0 = time.perf_counter()
        try:
            request = self.build(apply_scenario(self.data, sc))
        except FieldError as exc:
            if exc.path.startswith("what-if"):
                raise
            raise FieldError(f"what-if {sc.text!r}: {exc.path}", exc.problem) from exc
        except ConfigError as exc:
            raise ConfigError(f"what-if {sc.text!r}: {exc}") from exc
        result = self._plan(request)
        return Answer(sc.text, result, time.perf_counter() - t0)

    def marginal_values(self) -> list[Answer]:
        """Per offer, the plan with one more VM of it than its quota (``quota[TYPE]=q+1``)."""
        out = []
        for i, offer in enumerate(self.base_request.offers):
            out.append(self.ask(f"offers[{i}].quota={offer.quota + 1}"))
        return out


def _money(v: float) -> str:
    return f"${v:,.2f}"


def _label(c: Candidate | None) -> str:
    return "no feasible plan" if c is None else c.label


def render(what: WhatIf, answers: Sequence[Answer], marginal: Sequence[Answer] = ()) -> str:
    """The base plan and each scenario's, with the change in time and cost."""
    base = what.base
    lines = [
        f"base: {_label(base.best)}"
        + (
            f", {base.best.time_s:,.0f} s, {_money(base.best.cost_usd)}"
            if base.best is not None
            else ""
        )
        + f" ({what.base_seconds:.2f} s to plan)"
    ]
    rows = [("what if", "best plan", "time", "cost", "time change", "cost change", "answered in")]
    for title, group in (("", answers), ("one more VM: ", marginal)):
        for a in group:
            dt, dc = a.delta(base)
            best = a.result.best
            rows.append(
                (
                    title + a.scenario,
                    _label(best),
                    "-" if best is None else f"{best.time_s:,.0f} s",
                    "-" if best is None else _money(best.cost_usd),
                    "-" if dt is None else f"{dt:+,.0f} s",
                    "-" if dc is None else f"{dc:+,.2f} $",
                    f"{a.seconds:.2f} s",
                )
            )
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    for r in rows:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    if marginal:
        worth = [(a, a.delta(base)[0]) for a in marginal if a.delta(base)[0] is not None]
        saves = [(a, dt) for a, dt in worth if dt is not None and dt < -0.5]
        for a, dt in sorted(saves, key=lambda x: x[1]):
            lines.append(f"one more VM ({a.scenario}) saves {-dt:,.0f} s")
        if not saves:
            lines.append("no single extra VM makes the best plan faster")
    return "\n".join(lines)


def to_dict(
    what: WhatIf, answers: Sequence[Answer], marginal: Sequence[Answer] = ()
) -> dict[str, Any]:
    def one(a: Answer) -> dict[str, Any]:
        dt, dc = a.delta(what.base)
        best = a.result.best
        return {
            "scenario": a.scenario,
            "best": None if best is None else best.to_dict(a.result.request),
            "time_change_s": dt,
            "cost_change_usd": dc,
            "seconds": a.seconds,
        }

    return {
        "base": what.base.to_dict(),
        "base_seconds": what.base_seconds,
        "what_if": [one(a) for a in answers],
        "one_more_vm": [one(a) for a in marginal],
        "simulations": {"reused": what.memo.hits, "run": what.memo.misses},
    }
