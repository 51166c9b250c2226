"""What the planner answers: the chosen configuration with its numbers, the cost/time
frontier of what it evaluated, and why the winner won (or the nearest misses)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from srifty_core.cloud import find_provider_class
from srifty_core.errors import SriftyError
from srifty_core.planner import spot as spot_model
from srifty_core.planner.request import Objective, PlanRequest
from srifty_core.planner.space import Choice, Space, gpu_batches, nearest_global_batches
from srifty_core.planner.spot import SpotRisk
from srifty_core.profiling.store import cloud_profile_command
from srifty_core.simulator.types import IterationEstimate


@dataclass(frozen=True, slots=True)
class Candidate:
    """One evaluated configuration."""

    choice: Choice
    label: str
    estimate: IterationEstimate
    time_s: float
    cost_usd: float
    violations: tuple[str, ...]
    """Limits it breaks, e.g. ``time +12%``; empty when feasible."""
    time_q_s: float | None = None
    """Job time at the request's risk quantile (what the time limit is checked against)."""
    cost_q_usd: float | None = None
    """Cost at the request's risk quantile (what the budget is checked against)."""
    spot: SpotRisk = spot_model.NONE
    """What spot interruptions add (already in the times and costs above)."""

    @property
    def time_at_risk_s(self) -> float:
        return self.time_s if self.time_q_s is None else self.time_q_s

    @property
    def cost_at_risk_usd(self) -> float:
        return self.cost_usd if self.cost_q_usd is None else self.cost_q_usd

    @property
    def feasible(self) -> bool:
        return not self.violations

    @property
    def vms(self) -> int:
        return sum(c for _, c, _ in self.choice)

    def to_dict(self, request: PlanRequest) -> dict[str, Any]:
        offers = request.offers
        return {
            "label": self.label,
            "groups": [
                {
                    "instance_type": offers[i].instance.name,
                    "market": offers[i].market.value,
                    "zone": offers[i].zone,
                    "count": c,
                    "batch_per_vm": b,
                    "batch_per_gpu": b // offers[i].instance.ranks_per_vm,
                    "usd_per_hour": offers[i].usd_per_hour,
                }
                for i, c, b in self.choice
            ],
            "t_iter_s": self.estimate.t_iter,
            "t_fw_s": self.estimate.t_fw,
            "t_bw_s": self.estimate.t_bw,
            "t_pe_s": self.estimate.t_pe,
            "exposed_comm_s": self.estimate.exposed_comm,
            "p90_s": self.estimate.p90,
            "p95_s": self.estimate.p95,
            "t_iter_p90_s": self.estimate.t_iter_p90,
            "time_at_risk_s": self.time_at_risk_s,
            "cost_at_risk_usd": self.cost_at_risk_usd,
            "risk_quantile": request.risk_quantile,
            "spot_interruptions": {
                "expected": self.spot.expected,
                "at_risk_quantile": self.spot.at_quantile,
                "expected_extra_s": self.spot.extra_s,
                "extra_at_risk_quantile_s": self.spot.extra_q_s,
            },
            "missing_terms": list(self.estimate.missing),
            "bandwidth_extrapolated": list(self.estimate.extrapolated),
            "compute_estimated": list(self.estimate.estimated),
            "bottleneck": self.estimate.bottleneck,
            "throughput": self.estimate.throughput,
            "time_s": self.time_s,
            "cost_usd": self.cost_usd,
            "feasible": self.feasible,
            "violations": list(self.violations),
        }


class EstimateError(SriftyError):
    """An estimate that is no time (NaN, infinite, zero or negative): the inputs behind it
    (a profile, the bandwidth model, a calibration) are broken; never a plan."""


def evaluate(request: PlanRequest, choice: Choice, estimate: IterationEstimate) -> Candidate:
    """Time = overheads + iterations x t_iter; cost = per-second billing of every VM at its
    price for that whole time (VMs are paid from launch). Both also at the request's risk
    quantile (``t_iter_quantile``), which is what the limits are checked against. An
    estimate that is not a finite positive time is an ``EstimateError`` naming the
    configuration (the planner never ranks, nor returns, a NaN plan)."""
    offers = request.offers
    time_s = request.overheads.total_s + request.iterations * estimate.t_iter
    rate = sum(offers[i].usd_per_hour * c for i, c, _ in choice)
    t_q = estimate.t_iter_quantile(request.risk_quantile)
    _check_estimate(request, choice, estimate, t_q)
    time_q = request.overheads.total_s + request.iterations * t_q
    risk = spot_model.NONE
    hazard = sum(offers[i].interrupt_per_hour * c for i, c, _ in choice)
    if request.spot_interruptions == "priced" and hazard > 0:
        risk = spot_model.interruption_risk(
            hazard,
            time_s=time_s,
            time_q_s=time_q,
            checkpoint_s=request.checkpoint_every * estimate.t_iter,
            restart_s=request.overheads.launch_s + request.overheads.detach_s,
            quantile=request.risk_quantile,
        )
        time_s, time_q = time_s + risk.extra_s, time_q + risk.extra_q_s
    cost = rate * time_s / 3600.0
    cost_q = rate * time_q / 3600.0
    broken = violations(request, time_q, cost_q)
    if estimate.unfit:
        broken = (f"memory: {estimate.unfit}", *broken)
    label = choice_label(offers, choice)
    return Candidate(choice, label, estimate, time_s, cost, broken, time_q, cost_q, risk)


def _check_estimate(request: PlanRequest, choice: Choice, e: IterationEstimate, q: float) -> None:
    """What the plan is ranked and checked on (the iteration time, and at the risk
    quantile) must be a finite time > 0; the breakdown (``t_fw``...) may be unknown (NaN:
    a measured configuration's)."""
    times = {"t_iter": e.t_iter, "at the risk quantile": q}
    bad = {k: v for k, v in times.items() if not (math.isfinite(v) and v > 0)}
    if bad:
        shown = ", ".join(f"{k} {v:g} s" for k, v in bad.items())
        devices = sorted({request.offers[i].instance.device_type for i, _, _ in choice})
        raise EstimateError(
            f"the estimate of {choice_label(request.offers, choice)} is not a time "
            f"({shown}): check the compute profiles of {request.workload.model} on "
            f"{', '.join(devices)}, the bandwidth model and the calibration it was made with"
        )


def choice_label(offers: Any, choice: Choice) -> str:
    """``2xp3.8xlarge/spot@512+8xg3.8xlarge/on-demand@64``: a choice over ``offers``."""
    return "+".join(f"{c}x{offers[i].key}@{b}" for i, c, b in choice)


def violations(request: Any, time_s: float, cost_usd: float) -> tuple[str, ...]:
    """The limits of ``request`` that ``time_s`` and ``cost_usd`` break, each with how
    far (``time +1.1%``)."""
    out = []
    if time_s > request.time_limit_s:
        out.append(f"time +{100 * (time_s / request.time_limit_s - 1):.1f}%")
    if cost_usd > request.budget_usd:
        out.append(f"cost +{100 * (cost_usd / request.budget_usd - 1):.1f}%")
    return tuple(out)


def rank_key(objective: Objective, c: Candidate) -> tuple[float, float, int, str]:
    """Objective first, the other measure second, fewer VMs, then the label (stable)."""
    if objective is Objective.TIME:
        return (c.time_s, c.cost_usd, c.vms, c.label)
    return (c.cost_usd, c.time_s, c.vms, c.label)


def frontier(candidates: list[Candidate]) -> list[Candidate]:
    """Configurations no other one beats on both time and cost, fastest first."""
    out: list[Candidate] = []
    best_cost = float("inf")
    for c in sorted(candidates, key=lambda c: (c.time_s, c.cost_usd)):
        if c.cost_usd < best_cost:
            out.append(c)
            best_cost = c.cost_usd
    return out


def miss_ratio(request: PlanRequest, c: Candidate) -> float:
    """How far a configuration is from meeting both limits (1 = just meets them); one
    whose ranks cannot hold their batches is never near (inf)."""
    if c.estimate.unfit:
        return math.inf
    return max(c.time_at_risk_s / request.time_limit_s, c.cost_at_risk_usd / request.budget_usd)


@dataclass(frozen=True)
class PlanResult:
    """The planner's answer. ``best`` is ``None`` when no configuration meets the limits;
    ``nearest_misses`` then says how close the closest ones came and which limit binds."""

    request: PlanRequest
    method: str
    best: Candidate | None
    evaluated: int
    space_size: int
    solve_s: float
    frontier: tuple[Candidate, ...]
    runners_up: tuple[Candidate, ...]
    nearest_misses: tuple[Candidate, ...]
    candidates: tuple[Candidate, ...] = ()
    """Every configuration evaluated (for plots and comparisons)."""
    below_threshold: tuple[str, ...] = ()
    """Offers (``type/market``) whose batch in ``best`` is under their saturation
    threshold: the best plan came from below it."""
    searched_below_threshold: bool = False
    """The space under the saturation thresholds was small enough to search too."""
    strategy: str = "ddp"
    """How the ranks of ``best`` hold the model (``planner.strategies``)."""
    strategy_reason: str = ""
    """Why that strategy: what it beat, or why the others had no plan."""

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step of ``best`` (gradient accumulation; 1: none)."""
        return 1 if self.best is None else self.best.estimate.micro_batches

    @property
    def sync_each_micro_batch(self) -> bool:
        """Whether ``best``'s micro-batches each reduce-scatter their gradients."""
        return self.best is not None and self.best.estimate.sync_each_micro_batch

    @property
    def feasible(self) -> bool:
        return self.best is not None

    def _profile_command(self, estimated: tuple[str, ...]) -> str:
        """The command that profiles the model on the estimated GPUs, one offered type
        each."""
        r = self.request
        devices = [x.split(":")[0] for x in estimated]
        types: dict[str, str] = {}
        for o in r.offers:
            if o.instance.device_type in devices:
                types.setdefault(o.instance.device_type, o.instance.name)
        p = r.workload.profile(devices[0])
        return cloud_profile_command(r.workload.model, p.size, p.settings, list(types.values()))

    def _why_no_configuration(self) -> str:
        """Why there was nothing to evaluate: no split of the global batch into local
        batches the offers take (one batch per type, powers of two per GPU up to B_max,
        quotas), and the nearest global batches that split."""
        r = self.request
        wide = Space.build(r, saturate=False)
        offered = [o for o in r.offers if o.quota > 0]
        each = []
        for o in offered:
            bs = gpu_batches(r, o, saturate=False)
            span = f"{bs[0]}-{bs[-1]}" if bs else "none"
            ranks = o.instance.ranks_per_vm
            each.append(f"{o.key}: {span} x {ranks} GPU{'s' if ranks > 1 else ''}, up to {o.quota}")
        how = "every integer" if r.batch_granularity == "any" else "a power of two per GPU"
        text = (
            f"No configuration holds global_batch {r.global_batch} exactly, so none was "
            f"evaluated: every VM of an offer takes one local batch ({how} up to the "
            f"profile's B_max) and at most the offer's quota of VMs runs ({'; '.join(each)})"
        )
        if wide.size(limit=1) > 0:
            return (
                f"{text}; the splits that exist use batches under the types' saturation "
                "thresholds: set the offers' min_batch lower."
            )
        below, above = nearest_global_batches(wide)
        near = [str(b) for b in (below, above) if b is not None]
        if near:
            text += f"; the nearest global batches these offers hold: {' and '.join(near)}"
        if r.batch_granularity != "any":
            text += " (or batch_granularity: any, for local batches of any size)"
        return text + "."

    def explanation(self) -> list[str]:
        """Plain sentences: why the winner won, or why nothing could."""
        r = self.request
        lines = []
        if self.best is None and self.space_size == 0:
            return [self._why_no_configuration()]
        if self.best is None:
            lines.append(
                f"No configuration meets the limits (time {r.time_limit_s:g} s, budget "
                f"${r.budget_usd:g}) among {self.evaluated} evaluated."
            )
            at_q = f"p{100 * r.risk_quantile:g}"
            for m in self.nearest_misses:
                # the limits are checked at the risk quantile: the excess is against those
                # figures, so they are the ones shown beside it
                lines.append(
                    f"  nearest: {m.label}: {m.time_at_risk_s:.0f} s, "
                    f"${m.cost_at_risk_usd:.2f} at {at_q} ({', '.join(m.violations)}); "
                    f"typical {m.time_s:.0f} s, ${m.cost_usd:.2f}"
                )
            if self.nearest_misses:
                binds = {v.split()[0] for m in self.nearest_misses for v in m.violations}
                lines.append(f"The binding limit: {' and '.join(sorted(binds))}.")
            if self.strategy_reason:
                lines.append(f"Strategy {self.strategy_reason}.")
            return lines
        b, e = self.best, self.best.estimate
        lines.append(
            f"{b.label}: {e.t_iter * 1e3:.1f} ms/iteration ({e.throughput:.0f} samples/s), "
            f"{b.time_s:.0f} s and ${b.cost_usd:.2f} for {r.iterations} iterations "
            f"(objective: minimize {r.objective.value})."
        )
        if self.strategy_reason:
            lines.append(f"Strategy {self.strategy_reason}.")
        q = r.risk_quantile
        lines.append(
            f"At p{100 * q:g} of allocations: {b.time_at_risk_s:.0f} s and "
            f"${b.cost_at_risk_usd:.2f} ({e.t_iter_quantile(q) * 1e3:.1f} ms/iteration; "
            f"the limits are checked at p{100 * q:g}, configurations ranked by the typical)."
        )
        if b.spot.rate_per_hour > 0:
            rate = sum(r.offers[i].usd_per_hour * c for i, c, _ in b.choice)
            lines.append(
                f"Spot interruptions (in the figures above): {b.spot.expected:.2f} expected "
                f"({b.spot.at_quantile} at p{100 * q:g}), costing {b.spot.extra_s:.0f} s and "
                f"${rate * b.spot.extra_s / 3600:.2f} in expectation "
                f"(checkpoint every {r.checkpoint_every} iterations, relaunch "
                f"{r.overheads.launch_s + r.overheads.detach_s:.0f} s)."
            )
        elif r.spot_interruptions == "ignored" and any(
            r.offers[i].interrupt_per_hour > 0 for i, _, _ in b.choice
        ):
            lines.append("Spot interruptions ignored (spot_interruptions: ignored).")
        if e.missing:
            lines.append(
                f"Not in the estimate (the profiles did not measure them): "
                f"{', '.join(e.missing)}; it is that much too fast."
            )
        if e.estimated:
            lines.append(
                f"Compute estimated, not measured: {'; '.join(e.estimated)} (from the "
                "model's operator census and the GPU's sheet; the p90 carries the estimate's "
                "held-out error, and a running job recalibrates it in its first window). "
                f"To plan on measurements: `{self._profile_command(e.estimated)}`."
            )
        types = [x for x in e.extrapolated if not x.startswith("the mix ")]
        mixes = [x.removeprefix("the mix ") for x in e.extrapolated if x.startswith("the mix ")]
        if types:
            lines.append(
                f"Bandwidth extrapolated for {', '.join(types)}: never probed at this "
                "shape (type, VMs, ranks per VM), so the bandwidth model's prior answered and "
                "the p90 carries its wider held-out error; probe it to narrow the estimate."
            )
        if mixes:
            counts: dict[str, int] = {}
            for i, n, _ in b.choice:
                name = r.offers[i].instance.name
                counts[name] = counts.get(name, 0) + n
            spec = ",".join(f"{t}:{n}" for t, n in sorted(counts.items()))
            first = r.offers[b.choice[0][0]].instance.features
            lines.append(
                f"Mixed ring {', '.join(mixes)} never probed as one ring: its bandwidth is "
                "composed from its members' (the slowest, times the mixed-ring factor), and "
                "the p90 carries how far single mixes stray from that factor; to measure "
                f"it: `{probe_mix_command(spec, first)}` (or the sweep DAG's mixes)."
            )
        exposed = "."
        if e.exposed_comm:
            exposed = f", {e.exposed_comm * 1e3:.1f} ms of communication exposed."
        if self.strategy == "ddp":
            lines.append(
                f"Iteration: forward {e.t_fw * 1e3:.1f} ms + max(backward {e.t_bw * 1e3:.1f} "
                f"ms, gradient exchange {e.t_pe * 1e3:.1f} ms); {e.bottleneck} binds" + exposed
            )
        else:
            lines.append(
                f"Iteration ({self.strategy}): forward {e.t_fw * 1e3:.1f} ms and backward "
                f"{e.t_bw * 1e3:.1f} ms per unit between all-gathers and reduce-scatters "
                f"(the last ends {e.t_pe * 1e3:.1f} ms into the backward); {e.bottleneck} binds"
                + exposed
            )
        if e.micro_batches > 1 and e.sync_each_micro_batch:
            lines.append(
                f"Gradient accumulation: each rank runs its local batch as {e.micro_batches} "
                "micro-batches, each reduce-scattering its gradients into the sharded ones "
                "(no rank holds the unsharded gradients between micro-batches; forward and "
                "backward above are every micro-batch's); the global batch and the loss "
                "are the request's."
            )
        elif e.micro_batches > 1:
            lines.append(
                f"Gradient accumulation: each rank runs its local batch as {e.micro_batches} "
                "micro-batches and exchanges gradients once, with the last (forward and "
                "backward above are every micro-batch's; the exchange overlaps the last "
                "one's backward alone); the global batch and the loss are the request's."
            )
        if self.below_threshold:
            lines.append(
                "Local batches below the saturation threshold for "
                f"{', '.join(self.below_threshold)}: the space under the thresholds was small "
                "enough to search, and it won."
            )
        for c in self.runners_up:
            dt = 100 * (c.time_s / b.time_s - 1)
            dc = 100 * (c.cost_usd / b.cost_usd - 1)
            why = ", ".join(c.violations) if c.violations else f"time {dt:+.1f}%, cost {dc:+.1f}%"
            lines.append(f"  runner-up {c.label}: {why}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        r = self.request
        return {
            "model": r.workload.model,
            "global_batch": r.global_batch,
            "iterations": r.iterations,
            "objective": r.objective.value,
            "time_limit_s": r.time_limit_s if r.time_limit_s != float("inf") else None,
            "budget_usd": r.budget_usd if r.budget_usd != float("inf") else None,
            "method": self.method,
            "strategy": self.strategy,
            "strategy_reason": self.strategy_reason,
            "micro_batches": self.micro_batches,
            "sync_each_micro_batch": self.sync_each_micro_batch,
            "feasible": self.feasible,
            "best": self.best.to_dict(r) if self.best else None,
            "evaluated": self.evaluated,
            "space_size": self.space_size,
            "solve_s": self.solve_s,
            "frontier": [c.to_dict(r) for c in self.frontier],
            "runners_up": [c.to_dict(r) for c in self.runners_up],
            "nearest_misses": [c.to_dict(r) for c in self.nearest_misses],
            "searched_below_threshold": self.searched_below_threshold,
            "below_threshold": list(self.below_threshold),
            "explanation": self.explanation(),
        }


def probe_mix_command(spec: str, features: Mapping[str, Any]) -> str:
    """The ``srifty probe`` that measures the mix ``spec`` (``TYPE:VMS,...``) where its
    offers run (``features``: an offer's probe features, its provider, region, backend;
    ``Provider.probe_args``)."""
    cls = find_provider_class(features.get("provider"))
    region = str(features.get("region") or "us-east-1")
    backend = str(features.get("backend") or "gloo")
    extra = cls.probe_args(region, backend) if cls is not None else []
    return " ".join(["srifty probe", f"--mix {spec}", *extra])
