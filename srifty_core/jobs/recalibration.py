"""Online recalibration in the runtime: what a running configuration measures of itself
corrects the simulator, projects the rest of the job, and may re-plan it.

The factors, the projection and the re-plan rule are ``simulator.calibration``'s; this
module wires them to a configuration of a plan-and-train job:

* ``Context.of_job``: what the rule needs of the job: this run's request (what was left
  when it began), the uncalibrated simulator, the running ``ClusterConfig`` and the device
  type of every rank (plan order: ``JobPlan.launches``);
* ``window``: a ``calibration.Window`` from progress records (the iteration times, the
  per-rank forward + backward times per device type, the exchange's busy time that rank
  0 gathered: ``exchange_timer.ExchangeTimer``; older records without them give the iteration
  times alone);
* ``assess`` (one window): update the factors, project the rest (mean and the request's
  risk quantile, the p90 by default), find the best configuration for the rest on the
  recalibrated simulator (``Replanner``; configurations not run yet are projected with
  the scales but the predictive spreads: ``Calibration.unobserved``) and decide with
  ``calibration.should_replan`` (the switch charged: the re-plan's overheads). A re-plan
  whose best choice is the running configuration again is not one: keep;
* ``Recalibrator``: the monitor's state across steps: the records since the last window,
  the calibration, persisted in the run folder (``calibration.json``: a restarted monitor
  resumes it; the next configuration starts from it, widened as a prior; the re-plan
  plans with it: ``planning_simulator``) and, when the configuration ends, kept for the
  model's next jobs (``calibration.save``, MLflow when a run is active).

A sharded or accumulating configuration (``Context.sharded``: the plan's strategy and
micro-batches) is projected with its own iteration (``accumulation.plan_estimator``) and
corrects the compute factors only: its exchange is not the one ``Simulator.breakdown``
prices.

A window closes when its steps span the monitor's window (``window_s``), and at the
configuration's end (a re-plan, the finish) with what it holds, so the next plan is
calibrated by every step measured; never with fewer than ``MIN_STEPS`` steps (a window
mean's noise is its steps' jitter, which one or two steps do not measure). The
configuration's first ``progress.WARMUP_STEPS`` steps (warm-up) are left out. The job's
artificial per-step sleep (``step_sleep_s``, a test knob the simulator does not model) is
added to the projections.

Where no bandwidth model prices the running configuration's exchange (a fresh install:
no probes of ``local.cpu``, so no champion, and the public nccl-tests tables have no
``local.cpu`` rows; a plan file made by hand made no estimate of it either), recalibration
stays on with what the job's plan had: the compute profiles. Only the compute factors
learn (``calibration.update(exchange=False)``: from the ranks' measured compute times),
the exchange is kept as measured (no factor, no estimate to correct), the projection is
the window's measured iteration time (``calibration.project_measured``), no other
configuration is searched (none can be estimated), and ``calibration.json`` says so
(``exchange``), as does one line of the log (``Context.exchange``).

Light: no torch import.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srifty_core.cloud import provider_class
from srifty_core.errors import ConfigError, SriftyError
from srifty_core.jobs.job import JobPlan, JobSpec
from srifty_core.jobs.planning import (
    RUN_FILE,
    job_request,
    load_bandwidth_model,
    planning_simulator,
    read_run,
    run_path,
)
from srifty_core.jobs.replanner import Progress, Replanner
from srifty_core.planner.request import Overheads
from srifty_core.runs import store as run_store
from srifty_core.runs.progress import WARMUP_STEPS, ProgressRecord
from srifty_core.simulator.accumulation import plan_estimator
from srifty_core.simulator.types import ClusterConfig, Group

if TYPE_CHECKING:
    from srifty_core.planner.request import PlanRequest
    from srifty_core.simulator.calibration import Calibration, Projection, Window
    from srifty_core.simulator.estimator import Simulator


class Unpriced:
    """The bandwidth "model" of a job that has none for its links: every question about
    the exchange is refused with ``reason`` (no bandwidth is made up)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def predict(self, features: Any) -> Any:
        raise ConfigError(f"no estimate of the exchange: {self.reason}")

    def bandwidth_cap(self, instance_type: str, world_size: int) -> float:
        raise ConfigError(f"no estimate of the exchange: {self.reason}")


FactorsSink = Callable[[str, str, "Calibration"], None]
"""``(run id, config id, factors)``: where a configuration's factors go when it ends
(``job_log.log_factors``: its MLflow run)."""
MIN_STEPS = 3


@dataclass(frozen=True)
class Context:
    """What recalibrating one configuration needs of its job."""

    request: PlanRequest
    """This run's request (a re-plan's: what was left when it began)."""
    simulator: Simulator
    """Uncalibrated (the factors correct it)."""
    config: ClusterConfig
    rank_devices: tuple[str, ...]
    """The device type of every rank, in plan order."""
    usd_per_hour: float
    overheads: Overheads
    """What switching costs (relaunch, checkpoint restore, solve)."""
    depleted: tuple[str, ...] = ()
    extra_s: float = 0.0
    """Seconds each step adds that the simulator does not model (``step_sleep_s``)."""
    exchange: str | None = None
    """Why nothing estimates the exchange of ``config`` (no bandwidth model prices its
    links; ``simulator``'s bandwidth is then ``Unpriced``): the factors are compute only
    and the exchange is kept as measured (the module's doc). None: estimated."""
    strategy: str = "ddp"
    """How the running workers hold the model (the ``TrainPlan``'s)."""
    micro_batches: int = 1
    """The running plan's micro-batches per rank and step."""
    sync_each_micro_batch: bool = False
    """Whether the running plan's micro-batches each reduce-scatter."""

    @property
    def sharded(self) -> bool:
        """Whether the running step is not DDP's one pass (fsdp/hsdp, or accumulating):
        its exchange is not the one ``Simulator.breakdown`` prices, so the window corrects
        the compute factors only, and the projection is that of its own iteration
        (``simulator.accumulation.plan_estimator``)."""
        return self.strategy != "ddp" or self.micro_batches > 1

    @classmethod
    def of_job(cls, job: JobPlan, spec: JobSpec, bandwidth: Any = None) -> Context:
        """From the job's files and conf (the bandwidth model is loaded when not given;
        ``Unpriced``, or one that cannot price the configuration's links: compute only,
        ``exchange``)."""
        from srifty_core.simulator.estimator import Simulator

        request = job_request(spec)
        types = [o.instance.name for o in request.offers]
        bw = load_bandwidth_model(spec.bandwidth, types) if bandwidth is None else bandwidth
        config, devices = configuration(request, job)
        detach_s = provider_class(spec.provider).detach_s
        overheads = Overheads(launch_s=request.overheads.launch_s, detach_s=detach_s)
        sim, exchange = Simulator(bw), bw.reason if isinstance(bw, Unpriced) else None
        if exchange is None:
            try:  # the model may not know the workers' links (public tables: no local.cpu)
                sim.breakdown(request.workload, config)
            except SriftyError as exc:
                exchange = f"the bandwidth model does not price {config.label()}: {exc}"
                sim = Simulator(Unpriced(exchange))
        facts = job.facts
        return cls(
            request, sim, config, devices, job.usd_per_hour, overheads,
            spec.resume.depleted if spec.resume else (), spec.step_sleep_s, exchange,
            facts.strategy, facts.micro_batches, facts.sync_each_micro_batch,
        )  # fmt: skip


def configuration(request: PlanRequest, job: JobPlan) -> tuple[ClusterConfig, tuple[str, ...]]:
    """The running ``ClusterConfig`` of ``job`` (its launches over the request's offers)
    and the device type of each of its ranks in plan order."""
    groups, devices = [], []
    for x in job.launches:
        offer = next(
            (o for o in request.offers if o.instance.name == x.instance_type
             and o.market.value == x.market), None,
        )  # fmt: skip
        if offer is None:
            raise ConfigError(f"{x.key}: the job runs on an offer its request does not have")
        groups.append(Group(offer.instance, x.count, x.batch_per_rank * x.ranks_per_vm))
        devices += [offer.instance.device_type] * (x.count * x.ranks_per_vm)
    return ClusterConfig(tuple(groups)), tuple(devices)


def window(records: Sequence[ProgressRecord], rank_devices: Sequence[str]) -> Window:
    """A ``calibration.Window`` of ``records``: iteration times; per device type the
    ranks' forward + backward times (iterations x ranks) and the exchange's busy times,
    from the records that carry them for every rank."""
    from srifty_core.simulator import calibration as calib

    timed = [
        r for r in records if r.compute_s is not None and len(r.compute_s) == len(rank_devices)
    ]
    compute: dict[str, list[list[float]]] = {}
    for r in timed:
        assert r.compute_s is not None
        per: dict[str, list[float]] = {}
        for d, x in zip(rank_devices, r.compute_s, strict=True):
            per.setdefault(d, []).append(x)
        for d, xs in per.items():
            compute.setdefault(d, []).append(xs)
    exchange = [r.exchange_s for r in records if r.exchange_s is not None]
    return calib.Window.from_samples(
        [r.train_s for r in records] or None, compute or None, exchange or None
    )


@dataclass(frozen=True)
class Assessment:
    """One window's outcome."""

    calibration: Calibration
    projection: Projection
    """The rest on the running configuration, recalibrated."""
    replan: bool
    reason: str
    alternative: str | None = None
    """The best configuration for the rest, where it is not the running one."""
    metrics: dict[str, float] = field(default_factory=dict)


def assess(
    ctx: Context,
    cal: Calibration,
    records: Sequence[ProgressRecord],
    *,
    iterations_left: int,
    iterations_done: int,
    elapsed_s: float,
    spent_usd: float,
    search: bool = True,
) -> Assessment:
    """Update ``cal`` by the window of ``records``, project the ``iterations_left`` rest,
    and decide (see the module's doc). ``iterations_done``, ``elapsed_s`` and
    ``spent_usd`` count this run (against ``ctx.request``). ``search``: look for a better
    configuration (a plan search), else only the limits decide."""
    from srifty_core.simulator import calibration as calib

    req, sim, config = ctx.request, ctx.simulator, ctx.config
    w = window(records, ctx.rank_devices)
    priced = ctx.exchange is None
    cal = calib.update(cal, w, sim, req.workload, config, exchange=priced and not ctx.sharded)
    if priced:
        mine = plan_estimator(
            calib.calibrated(sim, cal), ctx.strategy, ctx.micro_batches,
            ctx.sync_each_micro_batch,
        )  # fmt: skip
        proj = calib.project(mine, req.workload, config, iterations_left, ctx.usd_per_hour,
                             req.risk_quantile)  # fmt: skip
        proj = _extra(proj, ctx)
    else:  # the measured iteration, its exchange (and any step sleep) included
        if w.iteration is None:
            raise ConfigError("a window without iteration times: nothing to project")
        proj = calib.project_measured(w.iteration, iterations_left, ctx.usd_per_hour,
                                      req.risk_quantile)  # fmt: skip
    alt_label = None
    alt = None
    if search and priced and iterations_left > 0:
        other = calib.calibrated(sim, cal.unobserved())
        replanner = Replanner(other, overheads=ctx.overheads)
        try:
            result = replanner.plan(req, Progress(iterations_done, elapsed_s, spent_usd,
                                                  ctx.depleted))  # fmt: skip
            best, _ = replanner.choose(result)
        except ConfigError:
            best = None  # nothing to plan (a limit spent, every offer gone): limits decide
        if best is not None:
            offers = result.request.offers
            alt_config = ClusterConfig(
                tuple(Group(offers[i].instance, c, b) for i, c, b in best.choice)
            )
            if alt_config.label() != config.label():
                alt_label = best.label
                rate = sum(offers[i].usd_per_hour * c for i, c, _ in best.choice)
                theirs = plan_estimator(
                    other, result.strategy, best.estimate.micro_batches,
                    best.estimate.sync_each_micro_batch,
                )  # fmt: skip
                alt = _extra(calib.project(theirs, req.workload, alt_config, iterations_left,
                                           rate, req.risk_quantile), ctx)  # fmt: skip
    decision = calib.should_replan(
        proj, elapsed_s=elapsed_s, spent_usd=spent_usd, time_limit_s=req.time_limit_s,
        budget_usd=req.budget_usd, alternative=alt, switch_s=ctx.overheads.total_s,
        objective=req.objective.value,
    )  # fmt: skip
    replan, reason = decision.replan, decision.reason
    if replan and alt is None:  # the best for the rest is the running one again
        replan = False
        reason = f"{reason}; no other configuration does better on the recalibrated simulator"
    elif replan:
        reason = f"recalibrated: {reason} ({alt_label})"
    metrics = {
        "recal_projected_rest_s": proj.mean_s,
        "recal_projected_rest_q_s": proj.q_s,
        "recal_t_iter_s": proj.t_iter_s,
        "recal_windows": float(cal.windows),
    }
    metrics.update({f"recal_compute_{k}": f.scale for k, f in cal.compute.items() if f.windows})
    metrics.update({f"recal_comm_{k}": f.scale for k, f in cal.comm.items() if f.windows})
    if w.iteration is not None:
        metrics["recal_measured_t_iter_s"] = w.iteration.mean_s
    if w.exchange is not None:
        metrics["recal_measured_exchange_s"] = w.exchange.mean_s
    return Assessment(cal, proj, replan, reason, alt_label if replan else None, metrics)


def _extra(p: Projection, ctx: Context) -> Projection:
    """``p`` with the steps' unmodelled seconds (``Context.extra_s``) added."""
    if not ctx.extra_s:
        return p
    from srifty_core.simulator.calibration import Projection

    add = p.iterations * ctx.extra_s
    return Projection(p.iterations, p.mean_s + add, p.q_s + add, p.usd_per_hour,
                      p.t_iter_s + ctx.extra_s)  # fmt: skip


class Recalibrator:
    """A configuration's recalibration across monitor steps (see the module's doc).
    ``context`` is made on first use (it loads the bandwidth model): pass one to skip
    that (tests, benchmarks)."""

    def __init__(
        self,
        job: JobPlan,
        spec: JobSpec,
        *,
        window_s: float,
        context: Context | None = None,
        min_steps: int = MIN_STEPS,
        log_factors: FactorsSink | None = None,
        search: bool = True,
    ) -> None:
        self.job, self.spec, self.window_s, self.min_steps = job, spec, window_s, min_steps
        self.log_factors = log_factors
        self.search = search
        """Look for a better configuration at each window (a plan file runs its own only)."""
        self.run_dir = job.facts.run_dir
        self._ctx = context
        self._cal: Calibration | None = None
        self._state: dict[str, Any] | bool | None = False  # False: not read yet
        self.last_iteration = spec.resume.iterations_done if spec.resume else 0
        self._warm = 0  # warm-up steps of this configuration seen (left out)
        self._pending: list[ProgressRecord] = []
        self.last: Assessment | None = None
        self.saved_to: Path | None = None
        self.disabled: str | None = None
        """Why recalibration is off for this configuration (``check``), or None."""

    @property
    def context(self) -> Context:
        """The job's ``Context``; without a bandwidth model (a fresh install), compute only
        (``Context.exchange``, said once in the log)."""
        if self._ctx is None:
            try:
                ctx = Context.of_job(self.job, self.spec)
            except SriftyError as exc:  # a failure of anything but the model is raised again
                ctx = Context.of_job(self.job, self.spec, Unpriced(f"no bandwidth model: {exc}"))
            if ctx.exchange is not None:
                import logging

                logging.getLogger(__name__).warning(
                    "recalibration of %s learns the compute factors only, the exchange kept "
                    "as measured: %s",
                    self.job.config_id,
                    ctx.exchange,
                )
            self._ctx = ctx
        return self._ctx

    @property
    def calibration(self) -> Calibration:
        """This configuration's factors: resumed from the run folder's state when it is
        this configuration's, else the prior (the earlier configuration's, or the
        model's stored, factors widened: ``calibration.prior``)."""
        state = self._resume()
        if self._cal is None:
            from srifty_core.simulator import calibration as calib

            ctx = self.context
            instances = [o.instance for o in ctx.request.offers]
            bw = ctx.simulator.bandwidth
            if state is not None:
                cal = calib.prior(ctx.request.workload, instances, bw, state["calibration"])
            else:
                found = calib.for_request(ctx.request, bw)
                cal = found or calib.prior(ctx.request.workload, instances, bw)
            if ctx.exchange is not None:  # no estimate of the exchange to correct
                cal = calib.Calibration(cal.model, cal.compute, {})
            self._cal = cal
        return self._cal

    def _resume(self) -> dict[str, Any] | None:
        """Read the run folder's state once: this configuration's (a restarted monitor)
        gives the factors and the last step taken; another's is returned (the prior)."""
        if self._state is False:
            state = read_run(self.run_dir)
            if state is not None and state.get("config_id") == self.job.config_id:
                self._cal = state["calibration"]
                self.last_iteration = max(self.last_iteration, int(state.get("last_iteration", 0)))
            self._state = state
        return self._state if isinstance(self._state, dict) else None

    def step(
        self,
        records: Sequence[ProgressRecord],
        *,
        elapsed_s: float,
        spent_usd: float,
        final: bool = False,
    ) -> Assessment | None:
        """Take the steps of ``records`` not seen yet; when a window closes (or ``final``),
        assess it (None otherwise). ``elapsed_s`` and ``spent_usd`` count this run."""
        self._resume()
        mine = [r for r in records if r.config_id == self.job.config_id]
        for r in mine:
            if r.iteration <= self.last_iteration:
                continue
            self.last_iteration = r.iteration
            if self._warm < WARMUP_STEPS:
                self._warm += 1  # warm-up: left out
                continue
            self._pending.append(r)
        pending = self._pending
        if len(pending) < self.min_steps:  # too few to estimate the window's jitter
            return None
        span = pending[-1].wall_time - pending[0].wall_time + pending[0].step_s
        if not final and span < self.window_s:
            return None
        done = max(r.iteration for r in pending)
        facts = self.job.facts
        start = self.spec.resume.iterations_done if self.spec.resume else 0
        out = assess(
            self.context, self.calibration, pending,
            iterations_left=max(facts.iterations - done, 0), iterations_done=done - start,
            elapsed_s=elapsed_s, spent_usd=spent_usd, search=self.search and not final,
        )  # fmt: skip
        self._cal, self._pending, self.last = out.calibration, [], out
        self._write()
        return out

    def check(
        self, records: Sequence[ProgressRecord], elapsed_s: float, spent_usd: float
    ) -> Assessment | None:
        """``step`` for the monitor: advisory, so a failure (no bandwidth model or profile
        at hand, a bad state file) turns recalibration off for this configuration with a
        warning instead of failing the monitor, whose own rules still hold."""
        if self.disabled is not None:
            return None
        try:
            return self.step(records, elapsed_s=elapsed_s, spent_usd=spent_usd)
        except Exception as exc:  # advisory: the monitor goes on without it
            self._disable(exc)
            return None

    def finish(self, records: Sequence[ProgressRecord], elapsed_s: float, spent_usd: float) -> None:
        """``close`` for the monitor (advisory, like ``check``)."""
        if self.disabled is not None:
            return
        try:
            self.close(records, elapsed_s, spent_usd)
        except Exception as exc:  # advisory (see check)
            self._disable(exc)

    def _disable(self, exc: BaseException) -> None:
        import logging

        self.disabled = f"{type(exc).__name__}: {exc}"
        logging.getLogger(__name__).warning(
            "recalibration of %s is off: %s", self.job.config_id, self.disabled
        )

    def _write(self) -> None:
        assert self._cal is not None
        last = self.last
        state: dict[str, Any] = {
            "config_id": self.job.config_id,
            "last_iteration": self.last_iteration,
            "calibration": self._cal.to_dict(),
        }
        if last is not None:
            p = last.projection
            state["projection"] = {"iterations": p.iterations, "mean_s": p.mean_s,
                                   "q_s": p.q_s, "t_iter_s": p.t_iter_s}  # fmt: skip
            state["decision"] = {"replan": last.replan, "reason": last.reason}
        exchange = self.context.exchange
        if exchange is not None:
            measured = last.metrics.get("recal_measured_exchange_s") if last else None
            learned = any(f.windows for f in self._cal.compute.values())
            state["exchange"] = {
                "estimated": False,
                "reason": exchange,
                "factors": "compute only; the exchange is kept as measured"
                if learned
                else "none yet: the steps carry iteration times alone (no per-rank compute "
                "times), which nothing splits into compute and exchange; the projection "
                "keeps the measured iteration",
                "measured_s": measured,
            }
        run_store.write_text(run_path(self.run_dir), json.dumps(state, indent=1) + "\n")

    def close(self, records: Sequence[ProgressRecord], elapsed_s: float, spent_usd: float) -> None:
        """The configuration ended (re-plan or finish): assess what is left in the window
        and keep the factors for the model's next jobs (``calibration.save``)."""
        from srifty_core.simulator import calibration as calib

        self.step(records, elapsed_s=elapsed_s, spent_usd=spent_usd, final=True)
        if self._cal is not None and self._cal.windows > 0:
            self.saved_to = calib.save(self._cal)
            if self.job.config_run_id and self.log_factors is not None:
                self.log_factors(self.job.config_run_id, self.job.config_id, self._cal)


__all__ = [
    "RUN_FILE",
    "Assessment",
    "Context",
    "Recalibrator",
    "Unpriced",
    "assess",
    "configuration",
    "planning_simulator",
    "read_run",
    "window",
]
