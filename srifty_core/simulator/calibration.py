"""Online recalibration: what a running job measures of itself corrects the simulator.

Contract: a ``Calibration`` holds log-normal factors (``Factor``): ``compute`` per device
type, ``comm`` per instance type and side of the VM boundary (a key without one: scale 1).
``prior`` / ``for_request`` start one; ``update(cal, window, base_sim, workload, config)``
returns the posterior after a monitor ``Window`` (inputs unchanged; the simulator must be
the uncalibrated one); ``calibrated(sim, cal)`` is the corrected simulator; ``project``
gives the rest of a job (``Projection``); ``should_replan`` (pure) a ``Decision``;
``save`` / ``load_stored`` keep factors in ``<data dir>/calibration/<model>.json``.

Imports the simulator's estimator and types, ``predictors.base.LevelSpread``, ``paths``
and ``atomic`` (at call time); MLflow only when the caller already imported it.

How and why (prior, observations, projection, re-plan rule, persistence, wiring):
docs/design/simulator.md#calibration
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from srifty_core.atomic import write_text_atomic
from srifty_core.errors import ConfigError
from srifty_core.paths import data_dir
from srifty_core.predictors.base import LevelSpread
from srifty_core.simulator.estimator import comm_key, compute_key, is_local, shared_workers
from srifty_core.simulator.types import ClusterConfig, SimInstance, Workload
from srifty_core.tracking.runs import log_to_active_run

if TYPE_CHECKING:
    from srifty_core.planner.request import PlanRequest
    from srifty_core.simulator.estimator import Estimator, Simulator

PRIOR_FLOOR = 0.5
"""Prior sd of a log factor where the simulator learned no spread: vague (a factor of
0.6-1.65 at one sd), so that the first window, not the prior, sets the factor. A
narrow default here would claim knowledge nobody measured: at 0.01 a 10-step window of
the demo's (8% noise) moved its factor by under 1%."""
NOISE_FLOOR = 1e-4
"""Least noise of a window mean (log): a window of identical samples is not exact."""
STORE_DIR = "calibration"
MAX_FACTOR = 1000.0
"""A stored factor further from 1 than this, either way, is damage, not a measurement
(``load_stored`` refuses the file)."""
VERSION = 2
"""2: communication factors per side of the VM boundary (``comm_key``). Those of a version
1 file (per instance type alone) are dropped when read: which links they measured is not
known, and a factor learned on one VM's NVLink slowed rings through the NICs."""


# --------------------------------------------------------------------------- factors
@dataclass(frozen=True, slots=True)
class Factor:
    """A log-normal correction factor: ``log(scale) ~ N(log_scale, sd^2)``."""

    log_scale: float = 0.0
    sd: float = PRIOR_FLOOR
    windows: int = 0
    """Windows of this job behind it (0: a prior, possibly carried from earlier jobs)."""
    seen: int = 0
    """Windows behind it over every job."""

    def __post_init__(self) -> None:
        if not (self.sd > 0 and math.isfinite(self.sd) and math.isfinite(self.log_scale)):
            raise ConfigError(f"a calibration factor needs a finite sd > 0, got {self}")

    @property
    def scale(self) -> float:
        """The factor at its median, ``exp(log_scale)``."""
        return math.exp(self.log_scale)

    def quantile(self, q: float) -> float:
        from scipy.special import ndtri

        return math.exp(self.log_scale + self.sd * float(ndtri(q)))

    def update(self, y: float, noise: float) -> Factor:
        """The conjugate normal update by one observation ``y`` of the log factor with
        noise sd ``noise``."""
        if not (noise > 0 and math.isfinite(y)):
            raise ConfigError(f"an observation needs a finite value and noise > 0: {y}, {noise}")
        w0, w1 = self.sd**-2, noise**-2
        mean = (w0 * self.log_scale + w1 * y) / (w0 + w1)
        return Factor(mean, (w0 + w1) ** -0.5, self.windows + 1, self.seen + 1)

    def carried(self, spread: float) -> Factor:
        """This factor as the prior of another job: same centre, widened by ``spread``
        (other VMs, another allocation), no window of that job yet."""
        return Factor(self.log_scale, math.hypot(self.sd, spread), 0, self.seen)

    def to_dict(self) -> dict[str, Any]:
        return {"log_scale": self.log_scale, "sd": self.sd, "windows": self.windows,
                "seen": self.seen, "scale": self.scale}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Factor:
        return cls(float(d["log_scale"]), float(d["sd"]), int(d.get("windows", 0)),
                   int(d.get("seen", 0)))  # fmt: skip


@dataclass(frozen=True)
class Calibration:
    """A job's correction factors: ``compute`` per device type (``compute_key``), ``comm``
    per instance type and side of the VM boundary (``comm_key``). A key without a factor is
    not corrected (scale 1)."""

    model: str
    compute: Mapping[str, Factor] = field(default_factory=dict)
    comm: Mapping[str, Factor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "compute", MappingProxyType(dict(self.compute)))
        object.__setattr__(self, "comm", MappingProxyType(dict(self.comm)))

    def compute_scale(self, device_type: str) -> float:
        f = self.compute.get(device_type)
        return 1.0 if f is None else f.scale

    def comm_scale(self, key: str) -> float:
        """The communication factor of ``key`` (``comm_key``)."""
        f = self.comm.get(key)
        return 1.0 if f is None else f.scale

    def compute_sigma(self, device_type: str, predictive: float) -> float:
        """The spread of a VM's speed to use in the p90: the posterior's where this job
        observed the device, else ``predictive``."""
        f = self.compute.get(device_type)
        return f.sd if f is not None and f.windows > 0 else predictive

    def comm_sigma(self, key: str, predictive: float) -> float:
        """The spread of the network level: the posterior's where this job observed the
        links of ``key`` (``comm_key``), else ``predictive``."""
        f = self.comm.get(key)
        return f.sd if f is not None and f.windows > 0 else predictive

    def unobserved(self) -> Calibration:
        """The same scales as a prior (no window of this job behind any): what to project
        a configuration the job has not run on with. Its allocation, its ring, its VMs
        are still unknown, so its quantiles keep the predictive spreads."""
        return Calibration(
            self.model,
            {k: Factor(f.log_scale, f.sd, 0, f.seen) for k, f in self.compute.items()},
            {k: Factor(f.log_scale, f.sd, 0, f.seen) for k, f in self.comm.items()},
        )

    @property
    def windows(self) -> int:
        return max((f.windows for f in (*self.compute.values(), *self.comm.values())), default=0)

    def carried_from_store(self) -> bool:
        """Whether any factor came from earlier jobs."""
        return any(f.seen > f.windows for f in (*self.compute.values(), *self.comm.values()))

    def describe(self) -> list[str]:
        """One line per factor moved from 1 or observed: ``T4 compute x1.30 (+-2%)``."""
        out = []
        for kind, factors in (("compute", self.compute), ("network", self.comm)):
            for key, f in sorted(factors.items()):
                if f.seen == 0:
                    continue
                out.append(f"{key} {kind} x{f.scale:.3f} (+-{100 * f.sd:.1f}%, {f.seen} window(s))")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "model": self.model,
            "compute": {k: f.to_dict() for k, f in sorted(self.compute.items())},
            "comm": {k: f.to_dict() for k, f in sorted(self.comm.items())},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Calibration:
        """From ``to_dict``; the communication factors of a version 1 dict are dropped
        (``VERSION``)."""
        comm = dict(d.get("comm", {})) if int(d.get("version", 1)) >= 2 else {}
        return cls(
            str(d["model"]),
            {k: Factor.from_dict(v) for k, v in dict(d.get("compute", {})).items()},
            {k: Factor.from_dict(v) for k, v in comm.items()},
        )


def prior(
    workload: Workload,
    instances: Sequence[SimInstance],
    bandwidth: object,
    stored: Calibration | None = None,
) -> Calibration:
    """The prior of a job over ``instances``: every factor centred on 1 with the width the
    simulator learned (``vm_cv`` pooled per device type; the bandwidth model's
    ``level_sigma`` per instance type, for its rings across VMs and, with several ranks a
    VM, inside one; a profile estimated from specs adds its ``estimate_cv`` in quadrature;
    ``PRIOR_FLOOR`` where it is 0), or, for keys in ``stored``, the stored posterior widened
    by that width (``Factor.carried``)."""
    vm = workload.vm_spreads()
    sigma = bandwidth.level_sigma if isinstance(bandwidth, LevelSpread) else None
    compute: dict[str, Factor] = {}
    comm: dict[str, Factor] = {}
    for inst in instances:
        d = inst.device_type
        if d not in compute and d in workload.profiles:
            # an estimated profile: as wide as its own error too, so a window moves it
            s = math.hypot(vm.get(d, 0.0) or PRIOR_FLOOR, workload.profiles[d].estimate_cv)
            old = None if stored is None else stored.compute.get(d)
            compute[d] = Factor(0.0, s) if old is None else old.carried(s)
        sides = (False, True) if inst.ranks_per_vm > 1 else (False,)
        for key in (comm_key(inst.name, inside) for inside in sides):
            if key in comm:
                continue
            s = (float(sigma(inst.name)) if sigma is not None else 0.0) or PRIOR_FLOOR
            old = None if stored is None else stored.comm.get(key)
            comm[key] = Factor(0.0, s) if old is None else old.carried(s)
    return Calibration(workload.model, compute, comm)


# --------------------------------------------------------------------------- observations
@dataclass(frozen=True, slots=True)
class Measured:
    """A window's mean of a per-iteration quantity: mean, sd of one sample, samples."""

    mean_s: float
    sd_s: float
    n: int

    def __post_init__(self) -> None:
        if not (self.mean_s > 0 and self.sd_s >= 0 and self.n >= 1):
            raise ConfigError(f"a measurement needs mean > 0, sd >= 0, n >= 1: {self}")

    @classmethod
    def of(cls, samples: ArrayLike) -> Measured:
        x = np.asarray(samples, dtype=np.float64).ravel()
        if x.size == 0:
            raise ConfigError("a measurement needs at least one sample")
        return cls(float(x.mean()), float(x.std(ddof=1)) if x.size > 1 else 0.0, int(x.size))

    @property
    def log_noise(self) -> float:
        """The sd of ``log(mean)``: the within-window jitter over the sample count."""
        return max(self.sd_s / self.mean_s / math.sqrt(self.n), NOISE_FLOOR)


@dataclass(frozen=True)
class Window:
    """What rank 0 gathered over one monitor window: per device type the ranks' forward
    + backward time per iteration (``compute``), the exchange's busy time per iteration
    (``exchange``), the iteration time (``iteration``); any may be missing."""

    iteration: Measured | None = None
    compute: Mapping[str, Measured] = field(default_factory=dict)
    exchange: Measured | None = None

    @classmethod
    def from_samples(
        cls,
        iteration_s: ArrayLike | None = None,
        compute_s: Mapping[str, ArrayLike] | None = None,
        exchange_s: ArrayLike | None = None,
    ) -> Window:
        """From raw samples: ``compute_s[device]`` is iterations x that device's ranks
        (or one value per iteration); per iteration the ranks' mean is one sample (the
        ranks of one iteration share its luck; the iterations are the samples)."""

        def per_iteration(a: ArrayLike) -> Any:
            x = np.asarray(a, dtype=np.float64)
            return x.mean(axis=1) if x.ndim == 2 else x

        it = None if iteration_s is None else np.asarray(iteration_s, dtype=np.float64)
        ex = None if exchange_s is None else np.asarray(exchange_s, dtype=np.float64)
        return cls(
            Measured.of(it) if it is not None and it.size else None,
            {d: Measured.of(per_iteration(x)) for d, x in (compute_s or {}).items()
             if np.asarray(x).size},
            Measured.of(ex) if ex is not None and ex.size and float(ex.mean()) > 0 else None,
        )  # fmt: skip


def link_class(config: ClusterConfig, calibration: Calibration | None = None) -> str:
    """The instance type whose links pace the ring: the slowest rated network
    (``network_gbps``, divided by its current communication factor)."""

    def rate(inst: SimInstance) -> float:
        gbps = inst.features.get("network_gbps")
        r = float(gbps) if gbps else math.inf
        key = comm_key(inst.name, config.vms == 1)
        return r / (calibration.comm_scale(key) if calibration is not None else 1.0)

    return min((g.instance for g in config.groups), key=lambda i: (rate(i), i.name)).name


def update(
    calibration: Calibration,
    window: Window,
    simulator: Simulator,
    workload: Workload,
    config: ClusterConfig,
    *,
    exchange: bool = True,
) -> Calibration:
    """The posterior after ``window`` of ``config``. ``simulator`` is the uncalibrated
    one the factors correct (its ``breakdown`` is the prediction).

    ``exchange=False``: nothing estimates the exchange (no bandwidth model prices the
    links of ``config``), so only the compute factors learn, from the ranks' measured
    compute times (``simulator.compute_breakdown``); a measured exchange has no estimate
    to correct and stays as measured, and a window of iteration times alone moves no
    factor (nothing splits its compute from its exchange)."""
    if simulator.calibration is not None:
        raise ConfigError("update: pass the uncalibrated simulator the factors correct")
    compute = dict(calibration.compute)
    comm = dict(calibration.comm)
    if exchange:
        predicted, busy = simulator.breakdown(workload, config)
    else:
        predicted, busy = simulator.compute_breakdown(workload, config), 0.0
    link = comm_key(link_class(config, calibration), config.vms == 1)

    def observe(table: dict[str, Factor], key: str, m: Measured, pred: float) -> None:
        if pred <= 0:
            return
        f = table.get(key) or Factor()
        table[key] = f.update(math.log(m.mean_s / pred), m.log_noise)

    sharing = shared_workers(config.groups)
    local = {g.instance.device_type for g in config.groups if is_local(g.instance)}

    def key(device_type: str) -> str:  # local ranks sharing a host: a factor of their own
        return compute_key(device_type, sharing if device_type in local else 1)

    for d, m in window.compute.items():
        if d in predicted:
            observe(compute, key(d), m, predicted[d])
    if not exchange:
        return Calibration(calibration.model, compute, comm)
    if window.exchange is not None:
        observe(comm, link, window.exchange, busy)
    if not window.compute and window.exchange is None and window.iteration is not None:
        est = simulator.estimate(workload, config)  # only the iteration: its bottleneck side
        if est.bottleneck == "communication" and busy > 0:
            observe(comm, link, window.iteration, est.t_iter)
        else:
            slow = max(predicted, key=lambda d: predicted[d])
            observe(compute, key(slow), window.iteration, est.t_iter)
    return Calibration(calibration.model, compute, comm)


def calibrated(simulator: Simulator, calibration: Calibration | None) -> Simulator:
    """A simulator like ``simulator`` (same bandwidth model, draws, options) under
    ``calibration``."""
    from srifty_core.simulator.estimator import Simulator

    return Simulator(
        simulator.bandwidth,
        iters=simulator.iters,
        seed=simulator.seed,
        mean=simulator.mean,
        overlap=simulator.overlap,
        schedule=simulator.schedule,
        calibration=calibration,
    )


# --------------------------------------------------------------------------- projection
@dataclass(frozen=True, slots=True)
class Projection:
    """The rest of a job on one configuration."""

    iterations: int
    mean_s: float
    q_s: float
    """At the risk quantile (``risk_quantile``; 0.9 by default: the p90)."""
    usd_per_hour: float
    t_iter_s: float

    @property
    def cost_usd(self) -> float:
        return self.usd_per_hour * self.mean_s / 3600.0

    @property
    def cost_q_usd(self) -> float:
        return self.usd_per_hour * self.q_s / 3600.0


def project(
    simulator: Estimator,
    workload: Workload,
    config: ClusterConfig,
    iterations: int,
    usd_per_hour: float,
    risk_quantile: float = 0.9,
) -> Projection:
    """The remaining ``iterations`` of ``config`` on ``simulator`` (the calibrated one):
    mean and ``risk_quantile`` time of the rest, and its cost at ``usd_per_hour``."""
    if iterations < 0:
        raise ConfigError(f"iterations: must be >= 0, got {iterations}")
    est = simulator.estimate(workload, config)
    t_q = est.t_iter_quantile(risk_quantile)
    return Projection(iterations, iterations * est.t_iter, iterations * t_q, usd_per_hour,
                      est.t_iter)  # fmt: skip


def project_measured(
    iteration: Measured, iterations: int, usd_per_hour: float, risk_quantile: float = 0.9
) -> Projection:
    """The remaining ``iterations`` at a window's measured iteration time: its mean, and
    at ``risk_quantile`` the quantile of that mean (``Measured.log_noise``). What a job
    projects where nothing estimates its exchange (``update(exchange=False)``): the
    iteration it measured, communication included, is kept as measured."""
    from scipy.special import ndtri

    if iterations < 0:
        raise ConfigError(f"iterations: must be >= 0, got {iterations}")
    t_q = iteration.mean_s * math.exp(iteration.log_noise * float(ndtri(risk_quantile)))
    return Projection(iterations, iterations * iteration.mean_s, iterations * t_q, usd_per_hour,
                      iteration.mean_s)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Decision:
    replan: bool
    reason: str


def should_replan(
    current: Projection,
    *,
    elapsed_s: float,
    spent_usd: float,
    time_limit_s: float = math.inf,
    budget_usd: float = math.inf,
    alternative: Projection | None = None,
    switch_s: float = 0.0,
    objective: str = "time",
) -> Decision:
    """Whether to re-plan the rest of a job now (pure).

    * the running configuration's projection at the risk quantile ends past the time
      limit, or costs more than the budget left: re-plan;
    * ``alternative`` (the best configuration for the rest, projected on the same
      calibrated simulator, without switching) would, after ``switch_s`` (relaunch,
      checkpoint restore: the request's overheads, billed at its own rate), meet the
      limits at its quantile and beat the running one's *mean* projection on the
      objective even at its quantile ("clearly better"): re-plan;
    * otherwise keep going.
    """
    if objective not in ("time", "cost"):
        raise ConfigError(f"objective: 'time' or 'cost', got {objective!r}")
    finish_q = elapsed_s + current.q_s
    if finish_q > time_limit_s:
        return Decision(True, f"the projection ends at {finish_q:.0f} s at its quantile, "
                              f"past the {time_limit_s:.0f} s limit")  # fmt: skip
    cost_q = spent_usd + current.cost_q_usd
    if cost_q > budget_usd:
        return Decision(True, f"the projection costs ${cost_q:.2f} at its quantile, over "
                              f"the ${budget_usd:.2f} budget")  # fmt: skip
    if alternative is not None:
        alt_q_s = alternative.q_s + switch_s
        alt_q_usd = alternative.usd_per_hour * alt_q_s / 3600.0
        fits = elapsed_s + alt_q_s <= time_limit_s and spent_usd + alt_q_usd <= budget_usd
        if fits and objective == "time" and alt_q_s < current.mean_s:
            return Decision(True, f"another configuration finishes the rest in {alt_q_s:.0f} s "
                                  f"with the switch, under the {current.mean_s:.0f} s of the "
                                  "running one")  # fmt: skip
        if fits and objective == "cost" and alt_q_usd < current.cost_usd:
            return Decision(True, f"another configuration does the rest for ${alt_q_usd:.2f} "
                                  f"with the switch, under the ${current.cost_usd:.2f} of "
                                  "the running one")  # fmt: skip
    return Decision(False, f"on track: the rest ends at {finish_q:.0f} s for ${cost_q:.2f} "
                           "at the quantile")  # fmt: skip


# --------------------------------------------------------------------------- persistence
def store_path(model: str, root: str | Path | None = None) -> Path:
    """``<data dir>/calibration/<model>.json``."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", model).strip("._") or "model"
    return data_dir(root) / STORE_DIR / f"{safe}.json"


def load_stored(model: str, root: str | Path | None = None) -> Calibration | None:
    """Every factor stored for ``model`` (None when nothing is)."""
    path = store_path(model, root)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{path}: not a calibration file ({exc}); delete it to start over"
        ) from exc
    if not isinstance(data, dict) or data.get("model") != model:
        raise ConfigError(f"{path}: not the calibration of {model}; delete it to start over")
    try:
        calibration = Calibration.from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # ConfigError too
        raise ConfigError(
            f"{path}: not a calibration file ({type(exc).__name__}: {exc}); delete it to start over"
        ) from None
    for kind, factors in (("compute", calibration.compute), ("comm", calibration.comm)):
        for key, f in factors.items():
            if abs(f.log_scale) > math.log(MAX_FACTOR) or f.windows < 0 or f.seen < 0:
                raise ConfigError(
                    f"{path}: {kind}.{key}: log_scale {f.log_scale:g} (windows {f.windows}, "
                    f"seen {f.seen}) is no measured factor (at most x{MAX_FACTOR:g} either "
                    "way, counts >= 0); delete it to start over"
                )
    return calibration


def save(calibration: Calibration, root: str | Path | None = None) -> Path:
    """Keep the observed factors of ``calibration`` (those with windows of this job)
    under the model's file, replacing the stored ones of the same keys; logged to the
    active MLflow run as well, when there is one."""
    old = load_stored(calibration.model, root)
    compute = dict(old.compute) if old else {}
    comm = dict(old.comm) if old else {}
    compute.update({k: f for k, f in calibration.compute.items() if f.windows > 0})
    comm.update({k: f for k, f in calibration.comm.items() if f.windows > 0})
    merged = Calibration(calibration.model, compute, comm)
    out = merged.to_dict()
    out["updated_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    path = store_path(calibration.model, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(out, indent=1) + "\n")
    log_mlflow(calibration)
    return path


def log_mlflow(calibration: Calibration) -> bool:
    """Log the factors to the active MLflow run (metrics ``calibration.compute.T4`` ...,
    and ``calibration.json``); False when no run is active (MLflow not even imported:
    no run can be)."""
    metrics = {f"calibration.compute.{k}": f.scale for k, f in calibration.compute.items()}
    metrics.update({f"calibration.comm.{k}": f.scale for k, f in calibration.comm.items()})
    return log_to_active_run(metrics, {"calibration.json": calibration.to_dict()})


def for_request(
    request: PlanRequest, bandwidth: object, root: str | Path | None = None
) -> Calibration | None:
    """The prior of a plan for ``request`` from the factors stored for its model and
    offered types (``prior`` with ``stored``); None when none of them is stored."""
    stored = load_stored(request.workload.model, root)
    if stored is None:
        return None
    instances = [o.instance for o in request.offers]
    cal = prior(request.workload, instances, bandwidth, stored)
    return cal if cal.carried_from_store() else None


__all__ = [
    "Calibration",
    "Decision",
    "Factor",
    "Measured",
    "Projection",
    "Window",
    "calibrated",
    "for_request",
    "link_class",
    "load_stored",
    "log_mlflow",
    "prior",
    "project",
    "project_measured",
    "save",
    "should_replan",
    "store_path",
    "update",
]
