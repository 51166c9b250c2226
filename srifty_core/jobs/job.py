"""What a plan-and-train job is: the trigger's parameters (``JobSpec``) and one configuration
of it (``JobPlan``: what to launch and what the planner predicted).

Light: no torch (the workers' ``TrainPlan`` is loaded only by ``JobPlan.train``; the monitor
reads what it needs through ``JobPlan.facts``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from srifty_core.catalog.types import Market
from srifty_core.cloud.base import LaunchRequest
from srifty_core.errors import SriftyError
from srifty_core.planner.request import offer_key
from srifty_core.planner.schema.job_conf import JobConf, ResumeSpec, ShellJobConf
from srifty_core.planner.schema.request_spec import RequestSpec
from srifty_core.planner.schema.train_plan import TrainPlan
from srifty_core.runs import store as run_store
from srifty_core.runs.progress import PROGRESS_FILE, STATE_FILE
from srifty_core.training_settings import TrainingSettings
from srifty_core.trigger_models import registered_model

RUNNING = "running"
FINISHED = "finished"
REPLAN = "replan"


class TrainingFailed(SriftyError):
    """Workers exited without finishing and without a preemption; the message names the logs."""


class JobFinished(SriftyError):
    """The job did all its iterations before a re-plan could stop it: nothing to continue
    (a preemption or a re-plan decision close to the end)."""


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
    allocations: tuple[str, ...] = ()
    """Allocations the parent handed over (their VMs still run): the re-plan keeps those its
    configuration wants and releases the rest."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Resume:
        """From the conf's ``resume`` block (checked by ``planner.schema.job_conf.ResumeSpec``)."""
        r = ResumeSpec.parse(d, "resume")
        return cls(
            checkpoint=r.checkpoint,
            iterations_done=r.iterations_done,
            time_spent_s=r.time_spent_s,
            cost_spent_usd=r.cost_spent_usd,
            depleted=tuple(r.depleted),
            parent_run_id=r.parent_run_id,
            job_run_id=r.job_run_id,
            allocations=tuple(r.allocations),
        )


def _default(name: str) -> Any:
    """The conf's default of ``name`` (``planner.schema.job_conf.JobConf``: defined there once)."""
    return JobConf.model_fields[name].default


@dataclass(frozen=True)
class JobSpec:
    """The trigger's parameters, validated: made by ``from_params``; the planning request
    among them is ``request`` (``planner.request.build_request`` plans it)."""

    model: str
    size: str
    global_batch: int
    iterations: int
    """Iterations this run should do (after ``resume.iterations_done``, if resuming)."""
    offers: tuple[Mapping[str, Any], ...]
    """``[{type, market, quota, price?, zone?}]``: what may be rented."""
    provider: str = "local"
    """Always the conf's (inferred from the offers where it names none); ``local`` for the
    jobs a plan file runs, which are made here directly."""
    region: str = _default("region")
    bandwidth: str = _default("bandwidth")
    """``champion`` (the registered XGBoost model) or ``probes`` (the probe-table model)."""
    time_limit_s: float = math.inf
    budget_usd: float = math.inf
    objective: str = _default("objective")
    risk_quantile: float = _default("risk_quantile")
    """The limits hold for this quantile of predicted time and cost (``PlanRequest``)."""
    overheads: Mapping[str, float] = field(default_factory=dict)
    """The conf's ``overheads`` as given (``launch_s`` default: the provider's,
    ``Provider.launch_s``)."""
    batch_granularity: str = _default("batch_granularity")
    spot_interruptions: str = _default("spot_interruptions")
    ec2: Mapping[str, Any] = field(default_factory=dict)
    """EC2 launch settings: ``image_id`` (required for ``ec2``), ``subnet_id``,
    ``security_group_ids``, ``key_name``, ``instance_profile_arn``, ``poll_s``,
    ``wait_timeout_s``, ``join_timeout_s`` (how long torchrun waits for every VM of a
    configuration to join); the AWS connection and what VMs install are deployment settings
    (``planner.schema.job_conf.DEPLOYMENT_ONLY``)."""
    checkpoint_every: int = _default("checkpoint_every")
    step_sleep_s: float = _default("step_sleep_s")
    seed: int = _default("seed")
    precision: str = _default("precision")
    optimizer: str = _default("optimizer")
    compile: bool = _default("compile")
    channels_last: bool = _default("channels_last")
    tf32: bool = _default("tf32")
    entrypoint: tuple[str, ...] = ()
    """Your training script's command on every rank (``worker.launch``); empty: the
    built-in worker."""
    resume: Resume | None = None

    @property
    def settings(self) -> TrainingSettings:
        """The training settings the profiles must have been taken with."""
        return TrainingSettings(
            self.precision, self.optimizer, self.compile, self.channels_last, self.tf32
        )

    @property
    def request(self) -> RequestSpec:
        """The planning request of this run (what is left of the job's, for a re-plan)."""
        return RequestSpec.parse(
            {
                "model": self.model,
                "size": self.size,
                "precision": self.precision,
                "optimizer": self.optimizer,
                "compile": self.compile,
                "channels_last": self.channels_last,
                "tf32": self.tf32,
                "region": self.region,
                "provider": self.provider,
                "global_batch": self.global_batch,
                "iterations": self.iterations,
                "time_limit_s": None if self.time_limit_s == math.inf else self.time_limit_s,
                "budget_usd": None if self.budget_usd == math.inf else self.budget_usd,
                "objective": self.objective,
                "risk_quantile": self.risk_quantile,
                "overheads": dict(self.overheads) or None,
                "batch_granularity": self.batch_granularity,
                "checkpoint_every": self.checkpoint_every,
                "spot_interruptions": self.spot_interruptions,
                "offers": [dict(o) for o in self.offers],
            }
        )

    @classmethod
    def from_params(cls, p: Mapping[str, Any], *, shell: bool = False) -> JobSpec:
        """The DAG's params checked by ``planner.schema.job_conf.JobConf`` (strict types, ranges, no
        unknown keys): every problem is a ``ConfigError`` naming the field. ``shell``: a
        job run from the shell (``ShellJobConf``: the emulated EC2 allowed too, and any
        model reference); else a DAG trigger's, whose model must be registered
        (``trigger_models``: never a file path)."""
        c = (ShellJobConf if shell else JobConf).parse(p)
        if not shell:
            registered_model(c.model)  # data, not code: before anything imports it
        return cls(
            model=c.model,
            size=c.size,
            global_batch=c.global_batch,
            iterations=c.iterations,
            offers=tuple(o.model_dump(exclude_unset=True) for o in c.offers),
            provider=c.provider_name,
            region=c.region,
            bandwidth=c.bandwidth,
            time_limit_s=_limit(c.time_limit_s),
            budget_usd=_limit(c.budget_usd),
            objective=c.objective,
            risk_quantile=c.risk_quantile,
            overheads=c.overheads.model_dump(exclude_unset=True) if c.overheads else {},
            batch_granularity=c.batch_granularity,
            spot_interruptions=c.spot_interruptions,
            ec2=c.ec2.model_dump(exclude_unset=True) if c.ec2 is not None else {},
            checkpoint_every=c.checkpoint_every,
            step_sleep_s=c.step_sleep_s,
            seed=c.seed,
            precision=c.precision,
            optimizer=c.optimizer,
            compile=c.compile,
            channels_last=c.channels_last,
            tf32=c.tf32,
            entrypoint=tuple(c.entrypoint),
            resume=Resume.from_dict(c.resume.model_dump()) if c.resume is not None else None,
        )

    @property
    def target_iterations(self) -> int:
        """The absolute iteration the job ends at (the checkpoint counts from the start)."""
        return self.iterations + (self.resume.iterations_done if self.resume else 0)


def _limit(v: float | None) -> float:
    return math.inf if v is None else float(v)


def item_key(offer: Mapping[str, Any]) -> str:
    """The key of a trigger's offer item (``{type, market?, ...}``)."""
    return offer_key(str(offer["type"]), str(offer.get("market", "on-demand")))


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

    def request(self, count: int | None = None) -> LaunchRequest:
        market = Market.parse(self.market)
        n = self.count if count is None else count
        return LaunchRequest(self.instance_type, count=n, market=market, zone=self.zone)


@dataclass(frozen=True, slots=True)
class TrainFacts:
    """What the monitor needs of the workers' plan, read from its JSON without torch."""

    iterations: int
    global_batch: int
    run_dir: str
    config_id: str
    strategy: str = "ddp"
    """How the workers hold the model (``TrainPlan.strategy``; ddp in plans before it)."""
    micro_batches: int = 1
    """Micro-batches per rank and step (``TrainPlan.micro_batches``)."""
    sync_each_micro_batch: bool = False
    """Whether each micro-batch reduce-scatters (``TrainPlan.sync_each_micro_batch``)."""

    @property
    def progress_path(self) -> Path | str:
        """A ``Path``, or a URI when ``run_dir`` is one (``run_store``)."""
        return run_store.join(self.run_dir, PROGRESS_FILE)

    @property
    def state_path(self) -> Path | str:
        return run_store.join(self.run_dir, STATE_FILE)


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
        d = json.loads(_read(path))
        d["launches"] = tuple(Launch(**x) for x in d["launches"])
        d["explanation"] = tuple(d["explanation"])
        return cls(**d)

    def save(self, path: Path | str) -> Path | str:
        return run_store.write_text(path, self.to_json())

    @property
    def train(self) -> TrainPlan:
        """The workers' plan (imports torch)."""
        return TrainPlan.load(self.train_plan)

    @property
    def facts(self) -> TrainFacts:
        """The workers' plan as far as the monitor needs it (no torch)."""
        d = json.loads(_read(self.train_plan))
        return TrainFacts(
            int(d["iterations"]), int(d["global_batch"]), str(d["run_dir"]),
            str(d.get("config_id", self.config_id)), str(d.get("strategy", "ddp")),
            int(d.get("micro_batches", 1)), bool(d.get("sync_each_micro_batch", False)),
        )  # fmt: skip


def _read(path: Path | str) -> str:
    """A plan's JSON at a local path or a run-storage URI."""
    text = run_store.read_text(path)
    if text is None:
        raise FileNotFoundError(f"no such file: {path}")
    return text
