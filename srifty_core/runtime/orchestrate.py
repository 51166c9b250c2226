"""The plan-and-train job in steps, for an orchestrator (the ``srifty_plan_and_train`` DAG).

``train_local`` runs a whole job in one process; an orchestrator instead runs it as separate
tasks, each of which may run in another process or on another machine, and which pass
only paths and ids to each other:

1. ``plan_job`` turns the trigger's parameters into a plan with the real planner: the
   compute profiles of the model (``srifty_profile_model`` makes them), the champion
   bus-bandwidth model (``srifty_model_refresh`` makes it), the simulator and the search
   over the offers. It writes the workers' ``TrainPlan`` and a ``JobPlan`` (what to
   launch, the prediction, the planner's explanation) as JSON, and records the plan in
   MLflow (the job's run; a nested run for each re-plan). A ``resume`` block (set by a
   re-plan) continues an earlier run of the job from its checkpoint.
2. ``provision`` launches the instances of the plan; ``start_training`` starts the workers.
3. ``poll`` is the monitor's step: ``running``, ``finished`` or ``replan`` (a preemption,
   or the monitor projects a broken limit that another configuration could meet); workers
   that died otherwise raise. Every step is appended to the run folder's
   ``decisions.jsonl``.
4. ``child_conf`` stops the workers (they checkpoint) and builds the trigger conf of the
   follow-up run: the remaining iterations, time and budget, the checkpoint, the offers
   less what was taken back, and the parent's ids.
5. ``finish`` logs the outcome and the timeline to the job's MLflow run; ``release``
   gives back what ``provision`` launched, whatever happened (a teardown).

Providers: ``local`` (worker processes on this machine; its one type, ``local.cpu``, is
offered with the quota of workers and a price the trigger gives, since this machine has
no market price) and ``ec2`` (the catalog's types through the Airflow AWS connection;
the workers start from the VMs' user data). On ``ec2`` the run folder must be on storage
that the VMs and the monitor share (a file system mounted at the same path).

Importing this module loads torch (through the workers' plan and checkpoint formats);
the Airflow plugin imports it only inside its trigger and sensor, never when DAGs parse.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from srifty_core import paths
from srifty_core.atomic import open_for_append, write_text_atomic
from srifty_core.catalog.types import Market
from srifty_core.cloud.base import LaunchRequest, Provider, release_all
from srifty_core.cloud.local import DEFAULT_MAX_RANKS, LOCAL_CPU, LocalProvider
from srifty_core.errors import ConfigError, SriftyError
from srifty_core.planner.request import offer_key
from srifty_core.planner.schema import DEFAULT_RISK_QUANTILE
from srifty_core.runtime.checkpoint import CHECKPOINT_FILE, load_checkpoint
from srifty_core.runtime.monitor import Limits, decide
from srifty_core.runtime.progress import iter_jsonl, read_progress
from srifty_core.runtime.worker import TrainPlan

RUNNING = "running"
FINISHED = "finished"
REPLAN = "replan"
DECISIONS_FILE = "decisions.jsonl"
DEFAULT_LAUNCH_S = {"local": 0.0, "ec2": 150.0}
"""Seconds from the request to running VMs, charged by the planner (EC2: about 150 s)."""
DETACH_S = {"local": 0.0, "ec2": 5.0}
"""Moving the checkpoint volume when a re-plan switches VMs (EBS detach: about 5 s)."""


class TrainingFailed(SriftyError):
    """Workers exited without finishing and without a preemption; the message names the logs."""


class NoFeasiblePlan(SriftyError):
    """No configuration of the offers meets the limits; the message has the nearest misses."""


@dataclass(frozen=True, slots=True)
class Resume:
    """Where an earlier run of the job stopped."""

    checkpoint: str
    iterations_done: int
    time_spent_s: float = 0.0
    cost_spent_usd: float = 0.0
    depleted: tuple[str, ...] = ()
    """Offers (``type/market``) taken back by the cloud: left out of every later plan."""
    parent_run_id: str | None = None
    """The Airflow run that re-planned."""
    job_run_id: str | None = None
    """The job's MLflow run (each re-plan is a run nested under it)."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Resume:
        """From the conf's ``resume`` block (checked by ``planner.schema.ResumeSpec``)."""
        from srifty_core.planner.schema import ResumeSpec

        r = ResumeSpec.parse(d, "resume")
        return cls(
            checkpoint=r.checkpoint,
            iterations_done=r.iterations_done,
            time_spent_s=r.time_spent_s,
            cost_spent_usd=r.cost_spent_usd,
            depleted=tuple(r.depleted),
            parent_run_id=r.parent_run_id,
            job_run_id=r.job_run_id,
        )


@dataclass(frozen=True)
class JobSpec:
    """The trigger's parameters, validated: made by ``from_params``."""

    model: str
    size: str
    global_batch: int
    iterations: int
    """Iterations this run should do (after ``resume.iterations_done``, if resuming)."""
    offers: tuple[Mapping[str, Any], ...]
    """``[{type, market, quota, price?, zone?}]``: what may be rented."""
    provider: str = "local"
    region: str = "us-east-1"
    bandwidth: str = "champion"
    """``champion`` (the registered XGBoost model) or ``probes`` (the probe-table model)."""
    time_limit_s: float = math.inf
    budget_usd: float = math.inf
    objective: str = "cost"
    risk_quantile: float = DEFAULT_RISK_QUANTILE
    """The limits hold for this quantile of predicted time and cost (``PlanRequest``)."""
    launch_s: float | None = None
    """Launch overhead the planner charges; default per provider (``DEFAULT_LAUNCH_S``)."""
    ec2: Mapping[str, Any] = field(default_factory=dict)
    """EC2 launch settings: ``image_id`` (required for ``ec2``), ``subnet_id``,
    ``security_group_ids``, ``key_name``, ``instance_profile_arn``, ``aws_conn_id``,
    ``package``."""
    checkpoint_every: int = 10
    step_sleep_s: float = 0.0
    seed: int = 0
    resume: Resume | None = None

    @classmethod
    def from_params(cls, p: Mapping[str, Any]) -> JobSpec:
        """The DAG's params checked by ``planner.schema.JobConf`` (strict types, ranges, no
        unknown keys): every problem is a ``ConfigError`` naming the field."""
        from srifty_core.planner.schema import JobConf

        c = JobConf.parse(p)
        return cls(
            model=c.model,
            size=c.size,
            global_batch=c.global_batch,
            iterations=c.iterations,
            offers=tuple(o.model_dump(exclude_unset=True) for o in c.offers),
            provider=c.provider,
            region=c.region or "us-east-1",
            bandwidth=c.bandwidth,
            time_limit_s=_limit(c.time_limit_s),
            budget_usd=_limit(c.budget_usd),
            objective=c.objective,
            risk_quantile=DEFAULT_RISK_QUANTILE if c.risk_quantile is None else c.risk_quantile,
            launch_s=c.launch_s,
            ec2=c.ec2.model_dump(exclude_unset=True) if c.ec2 is not None else {},
            checkpoint_every=c.checkpoint_every,
            step_sleep_s=c.step_sleep_s,
            seed=c.seed,
            resume=Resume.from_dict(c.resume.model_dump()) if c.resume is not None else None,
        )

    @property
    def target_iterations(self) -> int:
        """The absolute iteration the job ends at (the checkpoint counts from the start)."""
        return self.iterations + (self.resume.iterations_done if self.resume else 0)


def _limit(v: float | None) -> float:
    return math.inf if v is None else float(v)


def runs_dir(root: Path | None = None) -> Path:
    """Run folders of orchestrated jobs (checkpoint, progress log, plans)."""
    return (root or paths.data_dir()) / "runs"


# ---------------------------------------------------------------------------- the plan
@dataclass(frozen=True, slots=True)
class Launch:
    """``count`` VMs of ``instance_type`` on ``market``, each running ``ranks_per_vm``
    ranks with ``batch_per_rank`` samples."""

    instance_type: str
    market: str
    count: int
    ranks_per_vm: int
    batch_per_rank: int
    zone: str | None = None

    @property
    def key(self) -> str:
        return offer_key(self.instance_type, self.market)

    def request(self) -> LaunchRequest:
        market = Market.parse(self.market)
        return LaunchRequest(self.instance_type, count=self.count, market=market, zone=self.zone)


@dataclass(frozen=True)
class JobPlan:
    """One configuration of the job: what to launch and what the planner predicted."""

    config_id: str
    provider: str
    region: str
    train_plan: str
    """Path of the workers' ``TrainPlan`` JSON."""
    launches: tuple[Launch, ...]
    usd_per_hour: float
    predicted: Mapping[str, Any]
    """The chosen candidate (``Candidate.to_dict``): t_iter, time, cost, feasibility."""
    explanation: tuple[str, ...]
    job_run_id: str | None = None
    config_run_id: str | None = None
    ec2: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        d = asdict(self)
        d["launches"] = [asdict(x) for x in self.launches]
        return json.dumps(d, indent=2, default=str)

    @classmethod
    def load(cls, path: Path | str) -> JobPlan:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
        d["launches"] = tuple(Launch(**x) for x in d["launches"])
        d["explanation"] = tuple(d["explanation"])
        return cls(**d)

    def save(self, path: Path) -> Path:
        write_text_atomic(path, self.to_json())
        return path

    @property
    def train(self) -> TrainPlan:
        return TrainPlan.load(self.train_plan)


def local_offers(items: Sequence[Mapping[str, Any]]) -> tuple[Any, ...]:
    """Offers of the local provider: ``local.cpu`` only, priced by the trigger."""
    from srifty_core.planner.request import Offer
    from srifty_core.simulator.types import SimInstance

    out = []
    for i, item in enumerate(items):
        where = f"offers[{i}]"
        if item.get("type") != LOCAL_CPU:
            raise ConfigError(
                f"{where}.type: the local provider offers only {LOCAL_CPU!r}, "
                f"got {item.get('type')!r}"
            )
        quota = item.get("quota", 0)
        if not isinstance(quota, int) or not 0 <= quota <= DEFAULT_MAX_RANKS:
            raise ConfigError(f"{where}.quota: need 0..{DEFAULT_MAX_RANKS} workers, got {quota!r}")
        if item.get("price") is None:
            raise ConfigError(
                f"{where}.price: {LOCAL_CPU} has no market price; give the $/hour a worker "
                "should count for in the budget"
            )
        market = Market.parse(str(item.get("market", "on-demand")))
        price, min_batch = float(item["price"]), item.get("min_batch")
        out.append(Offer(SimInstance.local_cpu(), market, quota, price, min_batch=min_batch))
    return tuple(out)


def build_request(spec: JobSpec, profiles_root: Path | None = None) -> Any:
    """The ``PlanRequest`` of this run: the offers (less the depleted ones), the profiles
    and the limits left."""
    from srifty_core.planner.request import (
        Objective,
        Overheads,
        PlanRequest,
        offers_from_catalog,
    )
    from srifty_core.profiling.store import ProfileStore
    from srifty_core.runtime.replan import without_depleted
    from srifty_core.simulator.types import Workload

    if spec.provider == "local":
        offers = local_offers(spec.offers)
    else:
        from srifty_core.catalog import Catalog

        catalog = Catalog.load()
        catalog.check_region(spec.region)
        offers = offers_from_catalog(catalog, spec.offers, spec.region, provider=spec.provider)
    gone = spec.resume.depleted if spec.resume else ()
    offers = without_depleted(offers, gone)
    if not offers:
        raise NoFeasiblePlan(f"every offer is depleted ({', '.join(sorted(gone))})")
    store = ProfileStore(profiles_root)
    profiles = {
        o.instance.device_type: store.load(spec.model, spec.size, o.instance.device_type)
        for o in offers
    }
    launch_s = DEFAULT_LAUNCH_S[spec.provider] if spec.launch_s is None else spec.launch_s
    detach_s = DETACH_S[spec.provider] if spec.resume else 0.0
    return PlanRequest(
        workload=Workload(spec.model, profiles),
        global_batch=spec.global_batch,
        iterations=spec.iterations,
        offers=offers,
        time_limit_s=spec.time_limit_s,
        budget_usd=spec.budget_usd,
        objective=Objective.parse(spec.objective),
        overheads=Overheads(launch_s=launch_s, detach_s=detach_s),
        risk_quantile=spec.risk_quantile,
    )


def load_bandwidth_model(source: str) -> Any:
    """The bandwidth predictor, with the DAG that makes it named when it is missing."""
    from srifty_core.planner.job import load_bandwidth
    from srifty_core.predictors.registry import NoChampionError

    try:
        return load_bandwidth(source)
    except NoChampionError as exc:
        raise ConfigError(
            f"bandwidth: {exc}; or run the srifty_model_refresh DAG (after srifty_probe_sweep)"
        ) from exc


def _config_id(run_dir: Path, resume: Resume | None) -> str:
    if resume is None:
        return "c0"
    used = {p.stem.removeprefix("job-") for p in run_dir.glob("job-c*.json")}
    k = 1
    while f"c{k}" in used:
        k += 1
    return f"c{k}"


def plan_job(spec: JobSpec, run_key: str, *, track: bool = True) -> Path:
    """Plan this run of the job and save it; returns the ``JobPlan`` JSON's path.

    A fresh job gets the run folder ``runs/<run_key>``; a resumed one keeps the folder of
    its checkpoint, so every configuration of the job shares one checkpoint and log.
    The first plan must meet the limits (else ``NoFeasiblePlan`` with the nearest misses);
    a re-plan that cannot meet what is left continues on the nearest miss and says so.
    """
    from srifty_core.planner.search import plan
    from srifty_core.simulator.estimator import Simulator

    if spec.resume is not None:
        ck = Path(spec.resume.checkpoint)
        if ck.name != CHECKPOINT_FILE:
            raise ConfigError(f"resume.checkpoint: expected a path ending in {CHECKPOINT_FILE}")
        run_dir = ck.parent
        if spec.resume.iterations_done > 0 and load_checkpoint(ck) is None:
            raise ConfigError(f"resume.checkpoint: no checkpoint at {ck}")
    else:
        run_dir = runs_dir() / _safe(run_key)
    run_dir.mkdir(parents=True, exist_ok=True)
    request = build_request(spec)
    bandwidth = load_bandwidth_model(spec.bandwidth)
    result = plan(request, Simulator(bandwidth))
    chosen = result.best
    if result.space_size == 0:
        raise NoFeasiblePlan(
            f"global_batch: {spec.global_batch} cannot be split over these offers into "
            "power-of-two local batches (one batch per instance type, each within the "
            "model's B_max); try a power-of-two multiple or more quota"
        )
    if chosen is None:
        if spec.resume is None or not result.nearest_misses:
            raise NoFeasiblePlan("\n".join(result.explanation()))
        chosen = result.nearest_misses[0]
    config_id = _config_id(run_dir, spec.resume)
    launches = tuple(
        Launch(
            instance_type=request.offers[i].instance.name,
            market=request.offers[i].market.value,
            count=count,
            ranks_per_vm=request.offers[i].instance.ranks_per_vm,
            batch_per_rank=batch // request.offers[i].instance.ranks_per_vm,
            zone=request.offers[i].zone,
        )
        for i, count, batch in chosen.choice
    )
    local_batches = tuple(
        x.batch_per_rank for x in launches for _ in range(x.count * x.ranks_per_vm)
    )
    train = TrainPlan(
        model=spec.model,
        size=spec.size,
        global_batch=spec.global_batch,
        iterations=spec.target_iterations,
        local_batches=local_batches,
        run_dir=str(run_dir),
        config_id=config_id,
        seed=spec.seed,
        checkpoint_every=spec.checkpoint_every,
        step_sleep_s=spec.step_sleep_s,
    )
    train_path = train.save(run_dir / f"plan-{config_id}.json")
    usd_per_hour = sum(request.offers[i].usd_per_hour * c for i, c, _ in chosen.choice)
    explanation = tuple(result.explanation())
    if result.best is None:
        explanation = (
            "no configuration meets what is left of the limits; continuing on the nearest "
            f"miss: {chosen.label}",
            *explanation,
        )
    job = JobPlan(
        config_id=config_id,
        provider=spec.provider,
        region=spec.region,
        train_plan=str(train_path),
        launches=launches,
        usd_per_hour=usd_per_hour,
        predicted=chosen.to_dict(request),
        explanation=explanation,
        ec2=dict(spec.ec2),
    )
    if track:
        from srifty_core.runtime import job_log

        job = job_log.log_plan(spec, job, result.to_dict(), run_key)
    return job.save(run_dir / f"job-{config_id}.json")


def _safe(key: str) -> str:
    out = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    if not out.strip("._"):
        raise ConfigError(f"run key {key!r} gives no usable folder name")
    return out


# ------------------------------------------------------------------- running the plan
def make_provider(job: JobPlan, *, worker: Sequence[str] | None = None) -> Provider:
    if job.provider == "local":
        return LocalProvider()
    from srifty_core.cloud.ec2 import EC2Provider

    e = dict(job.ec2)
    return EC2Provider(
        aws_conn_id=str(e.get("aws_conn_id", "aws_default")),
        region=job.region,
        image_id=e.get("image_id"),
        subnet_id=e.get("subnet_id"),
        security_group_ids=tuple(e.get("security_group_ids", ())),
        key_name=e.get("key_name"),
        instance_profile_arn=e.get("instance_profile_arn"),
        worker=worker,
        package=str(e.get("package", "srifty")),
        poll_s=float(e.get("poll_s", 5.0)),
        wait_timeout_s=float(e.get("wait_timeout_s", 900.0)),
    )


def worker_command(job: JobPlan) -> list[str]:
    return [sys.executable, "-m", "srifty_core.runtime.worker", job.train_plan]


def provision(job_path: Path | str, provider: Provider | None = None) -> list[str]:
    """Launch every group of the plan; returns the allocation ids. On a failure, what was
    already launched is released before the error goes up."""
    job = JobPlan.load(job_path)
    if provider is None:
        # On EC2 the workers start from the user data: `srifty train` on the plan.
        worker = None if job.provider == "local" else ["train", job.train_plan]
        provider = make_provider(job, worker=worker)
    from srifty_core.runtime.apply import launch_all

    return [a.id for a in launch_all(provider, [x.request() for x in job.launches])]


def start_training(
    job_path: Path | str, allocation_ids: Sequence[str], provider: Provider | None = None
) -> float:
    """Start the workers on the allocations; returns the start time (Unix seconds).

    Local: one process per rank (ranks in the order of the plan's groups). EC2: the
    workers started from the user data at launch; this only notes the time.
    """
    job = JobPlan.load(job_path)
    if job.provider == "local":
        provider = provider or make_provider(job)
        (alloc_id,) = allocation_ids  # one type, one allocation
        provider.run(provider.get_allocation(alloc_id), worker_command(job))
    return time.time()


@dataclass(frozen=True, slots=True)
class PollResult:
    status: str
    """``running``, ``finished`` or ``replan``."""
    reason: str
    iterations_done: int
    elapsed_s: float
    """Since the job's start (earlier configurations included)."""
    spent_usd: float
    depleted: tuple[str, ...] = ()
    interrupted: tuple[str, ...] = ()
    """Instance ids the provider took back."""
    lost: Mapping[str, int] = field(default_factory=dict)
    """Instances taken back per offer (``type/market``)."""
    optimistic_throughput: float | None = None
    projected_time_s: float | None = None
    config_id: str = ""
    at: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["depleted"], d["interrupted"], d["lost"] = (
            list(self.depleted), list(self.interrupted), dict(self.lost),
        )  # fmt: skip
        return d


def poll(
    job_path: Path | str,
    allocation_ids: Sequence[str],
    spec: JobSpec,
    started_at: float,
    *,
    provider: Provider | None = None,
    now: float | None = None,
) -> PollResult:
    """One look at the running job: the provider's interruptions, the workers, the monitor."""
    job = JobPlan.load(job_path)
    provider = provider or make_provider(job)
    plan = job.train
    allocs = [provider.get_allocation(a) for a in allocation_ids]
    now = time.time() if now is None else now
    prior_s = spec.resume.time_spent_s if spec.resume else 0.0
    prior_usd = spec.resume.cost_spent_usd if spec.resume else 0.0
    # A resumed run's conf carries what is left of the time and the budget.
    limits = Limits(
        iterations=plan.iterations,
        global_batch=plan.global_batch,
        time_limit_s=spec.time_limit_s,
        budget_usd=spec.budget_usd,
        usd_per_hour=job.usd_per_hour,
    )
    records = [r for r in read_progress(plan.progress_path) if r.wall_time >= started_at]
    lost: dict[str, int] = {}
    interrupted: list[str] = []
    for a in allocs:
        gone = provider.interruptions(a)
        if gone:
            key = offer_key(a.spec.name, a.market)
            lost[key] = lost.get(key, 0) + len(gone)
            interrupted += [i.instance_id for i in gone]
    # Spot capacity taken back is depleted for the rest of the job (the method); a local
    # worker taken back only lowers the quota (the next plan runs on the survivors).
    preempted = [k for k in lost if job.provider != "local" and k.endswith("/spot")]
    decision = decide(records, limits, now=now, started_at=started_at, preempted=preempted)
    codes = [c for a in allocs for c in provider.exit_codes(a).values()]
    all_exited = bool(codes) and all(c is not None for c in codes)
    ck = load_checkpoint(plan.checkpoint_path)
    done_ck = ck is not None and ck.iteration >= plan.iterations
    finished = done_ck and (all_exited or job.provider != "local")
    done = max(decision.iterations_done, spec.resume.iterations_done if spec.resume else 0)

    def result(status: str, reason: str) -> PollResult:
        return PollResult(
            status,
            reason,
            done,
            prior_s + decision.elapsed_s,
            prior_usd + decision.spent_usd,
            tuple(sorted({*(spec.resume.depleted if spec.resume else ()), *decision.depleted})),
            tuple(interrupted),
            lost,
            decision.optimistic_throughput,
            None if decision.projected_time_s is None else prior_s + decision.projected_time_s,
            job.config_id,
            now,
        )

    if finished:
        out = result(FINISHED, f"finished {plan.iterations} iterations")
    elif lost:
        taken = ", ".join(sorted(interrupted))
        why = decision.reason if decision.depleted else "the next plan runs on what is left"
        out = result(REPLAN, f"taken back by the provider: {taken}; {why}")
    elif decision.replan and _alternatives(spec, job):
        out = result(REPLAN, decision.reason)
    elif decision.replan:
        out = result(RUNNING, f"{decision.reason}; no other configuration to switch to")
    elif all_exited and isinstance(provider, LocalProvider):
        logs = ", ".join(str(provider.log_dir(a)) for a in allocs)
        raise TrainingFailed(
            f"workers exited at iteration {done} of {plan.iterations} without a preemption; "
            f"see the logs in {logs}"
        )
    else:
        out = result(RUNNING, decision.reason)
    _append_decision(Path(plan.run_dir), out)
    return out


def _alternatives(spec: JobSpec, job: JobPlan) -> bool:
    """Is there capacity this configuration does not use (another offer, or quota left)?
    Without any, a re-plan for falling behind could only choose the same VMs again."""
    used = Counter[str]()
    for x in job.launches:
        used[x.key] += x.count
    gone = set(spec.resume.depleted) if spec.resume else set()
    for o in spec.offers:
        key = _item_key(o)
        if key not in gone and int(o.get("quota", 0)) > used[key]:
            return True
    return False


def _item_key(offer: Mapping[str, Any]) -> str:
    """The key of a trigger's offer item (``{type, market?, ...}``)."""
    return offer_key(str(offer["type"]), str(offer.get("market", "on-demand")))


def _append_decision(run_dir: Path, result: PollResult) -> None:
    path = run_dir / DECISIONS_FILE
    with open_for_append(path) as f:
        f.write(json.dumps(result.to_dict(), default=str) + "\n")


def read_decisions(run_dir: Path | str, config_id: str | None = None) -> list[dict[str, Any]]:
    records = iter_jsonl(Path(run_dir) / DECISIONS_FILE)
    return [d for d in records if config_id is None or d.get("config_id") == config_id]


def child_conf(
    params: Mapping[str, Any],
    job_path: Path | str,
    allocation_ids: Sequence[str],
    result: Mapping[str, Any],
    parent_run_id: str,
    *,
    provider: Provider | None = None,
) -> dict[str, Any]:
    """Stop the workers (they checkpoint) and build the conf of the run that continues the job.

    The follow-up plans again with the remaining iterations, time and budget; offers taken
    back are dropped (spot, ``depleted``) or their quota lowered (local workers).
    """
    job = JobPlan.load(job_path)
    provider = provider or make_provider(job)
    plan = job.train
    for a in allocation_ids:
        provider.stop(provider.get_allocation(a))
    ck = load_checkpoint(plan.checkpoint_path)
    done = ck.iteration if ck else 0
    remaining = plan.iterations - done
    if remaining < 1:
        raise TrainingFailed("the job already finished; nothing to re-plan")
    lost = dict(result.get("lost") or {})
    offers = []
    for o in params["offers"]:
        o = dict(o)
        o["quota"] = max(int(o.get("quota", 0)) - int(lost.get(_item_key(o), 0)), 0)
        offers.append(o)
    if all(o["quota"] == 0 for o in offers):
        raise TrainingFailed("every instance was taken back; nothing is left to resume on")
    conf = {k: v for k, v in params.items() if k != "resume"}
    conf["iterations"] = remaining
    conf["offers"] = offers
    elapsed, spent = float(result["elapsed_s"]), float(result["spent_usd"])
    prior = params.get("resume") or {}
    prior_s = float(prior.get("time_spent_s", 0.0))
    prior_usd = float(prior.get("cost_spent_usd", 0.0))
    for key, used in (("time_limit_s", elapsed - prior_s), ("budget_usd", spent - prior_usd)):
        if params.get(key) is not None:
            conf[key] = max(float(params[key]) - used, 1e-9)
    conf["resume"] = {
        "checkpoint": str(plan.checkpoint_path),
        "iterations_done": done,
        "time_spent_s": elapsed,
        "cost_spent_usd": spent,
        "depleted": list(result.get("depleted", ())),
        "parent_run_id": parent_run_id,
        "job_run_id": job.job_run_id,
    }
    from srifty_core.runtime import job_log

    job_log.log_configuration_end(job, result, outcome="replan")
    # Beside the checkpoint too, so the follow-up can be started by hand if need be.
    write_text_atomic(Path(plan.run_dir) / f"replan-after-{job.config_id}.json",
                      json.dumps(conf, indent=2))  # fmt: skip
    return conf


def finish(job_path: Path | str, result: Mapping[str, Any]) -> dict[str, Any]:
    """The job finished: log the last configuration, the outcome and the timeline."""
    from srifty_core.runtime import job_log

    job = JobPlan.load(job_path)
    job_log.log_configuration_end(job, result, outcome="finished")
    return job_log.log_outcome(job, result)


def job_failed(job_path: Path | str, reason: str) -> None:
    """Record in MLflow that the job failed (the DAG's failure callback)."""
    from srifty_core.runtime import job_log

    job_log.log_failure(JobPlan.load(job_path), reason)


def release(allocation_ids: Sequence[str] | str, provider: Provider | None = None,
            job_path: Path | str | None = None) -> None:  # fmt: skip
    """Give back the allocations and stop anything still running on them (idempotent)."""
    ids = [allocation_ids] if isinstance(allocation_ids, str) else list(allocation_ids)
    if provider is None:
        provider = make_provider(JobPlan.load(job_path)) if job_path else LocalProvider()
    release_all(provider, ids)
