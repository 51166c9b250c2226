"""Planning a run of the job: the trigger's parameters to a saved ``JobPlan``.

The real planner: the compute profiles of the model (``srifty_profile_model`` makes them),
the bus-bandwidth model (``srifty_model_refresh`` makes the champion), the simulator and
the search over the offers. A re-plan (the conf has a ``resume`` block) plans what is left
through the ``Replanner`` and continues on the nearest miss when nothing meets it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srifty_core.catalog import Catalog
from srifty_core.cloud import provider_class
from srifty_core.errors import ConfigError
from srifty_core.jobs.job import (
    JobPlan,
    JobSpec,
    Launch,
    NoFeasiblePlan,
    Resume,
)
from srifty_core.jobs.replanner import Progress, Replanner, without_depleted
from srifty_core.planner import job as planner_job
from srifty_core.planner.request import Overheads
from srifty_core.planner.schema.train_plan import TrainPlan
from srifty_core.profiling.store import ProfileStore
from srifty_core.runs import store as run_store
from srifty_core.runs.progress import PROGRESS_FILE, rewind
from srifty_core.runs.store import runs_dir
from srifty_core.training_settings import DEFAULT_SETTINGS, TrainingSettings

if TYPE_CHECKING:
    from srifty_core.planner.request import PlanRequest
    from srifty_core.simulator.calibration import Calibration
    from srifty_core.simulator.estimator import Simulator

RUN_FILE = "calibration.json"
"""The run folder's calibration state (the latest configuration's: ``recalibration``)."""
PlanSink = Callable[[JobSpec, JobPlan, Mapping[str, Any], str], JobPlan]
"""``(spec, job, plan result, run key) -> job with its run ids``: where a plan is recorded
(``job_log.log_plan``: MLflow)."""


def launches_for(request: Any, choice: Sequence[tuple[int, int, int]]) -> tuple[Launch, ...]:
    """What to launch for a candidate's ``choice`` (offer index, VMs, batch per VM) of
    ``request``: per type, its VMs, ranks per VM and batch per rank."""
    return tuple(
        Launch(
            instance_type=request.offers[i].instance.name,
            market=request.offers[i].market.value,
            count=count,
            ranks_per_vm=request.offers[i].instance.ranks_per_vm,
            batch_per_rank=batch // request.offers[i].instance.ranks_per_vm,
            zone=request.offers[i].zone,
        )
        for i, count, batch in choice
    )


def train_plan_for(
    launches: Sequence[Launch],
    *,
    model: str,
    size: str,
    global_batch: int,
    iterations: int,
    run_dir: str,
    config_id: str = "c0",
    seed: int = 0,
    checkpoint_every: int = 10,
    step_sleep_s: float = 0.0,
    settings: TrainingSettings = DEFAULT_SETTINGS,
    entrypoint: Sequence[str] = (),
    extra: Mapping[str, Any] | None = None,
    strategy: str = "ddp",
    micro_batches: int = 1,
    sync_each_micro_batch: bool = False,
) -> TrainPlan:
    """The workers' plan of ``launches``: one rank per GPU in launch order, each with its
    type's batch per rank, trained under the plan's ``strategy`` (``hsdp`` shards inside
    each VM: its ranks per VM, which the planner keeps equal over the launches), each
    rank's batch in ``micro_batches`` (the planned estimate's, each reduce-scattering its
    gradients with ``sync_each_micro_batch``) (the plan-and-train DAG's and ``srifty plan
    --write-plan``'s)."""
    local_batches = tuple(
        x.batch_per_rank for x in launches for _ in range(x.count * x.ranks_per_vm)
    )
    per_vm = {x.ranks_per_vm for x in launches}
    if strategy == "hsdp" and len(per_vm) != 1:
        raise ConfigError(
            f"strategy: hsdp needs the same GPUs per VM on every VM, got {sorted(per_vm)}"
        )
    return TrainPlan(
        model=model,
        size=size,
        global_batch=global_batch,
        iterations=iterations,
        local_batches=local_batches,
        run_dir=run_dir,
        config_id=config_id,
        seed=seed,
        checkpoint_every=checkpoint_every,
        step_sleep_s=step_sleep_s,
        precision=settings.precision,
        optimizer=settings.optimizer,
        compile=settings.compile,
        channels_last=settings.channels_last,
        tf32=settings.tf32,
        entrypoint=tuple(entrypoint),
        extra=dict(extra or {}),
        strategy=strategy,
        ranks_per_vm=per_vm.pop() if strategy == "hsdp" else 0,
        micro_batches=micro_batches,
        sync_each_micro_batch=sync_each_micro_batch,
    )


def job_request(spec: JobSpec, profiles_root: Path | None = None) -> PlanRequest:
    """The ``PlanRequest`` of this run as its conf states it (``JobSpec.request``, built by
    the one builder, ``planner.request.build_request``, on the catalog and the profile
    store: a GPU nobody profiled is estimated, and recalibrated in the first window); a
    re-plan's conf already holds what is left. ``NoFeasiblePlan`` when the cloud took back
    every offer (``resume.depleted``)."""
    request = planner_job.store_requests(Catalog.load(), ProfileStore(profiles_root))(spec.request)
    gone = spec.resume.depleted if spec.resume else ()
    if not without_depleted(request.offers, gone):
        raise NoFeasiblePlan(f"every offer is depleted ({', '.join(sorted(gone))})")
    return request


def load_bandwidth_model(source: str, instance_types: Sequence[str] = ()) -> Any:
    """The bandwidth predictor. While there is no champion (a fresh install, before the
    srifty_model_refresh DAG or ``srifty fit-bandwidth`` made one) it falls back, as ``srifty
    plan`` does, to the model of the shipped public nccl-tests tables
    (``planner.job.public_bandwidth``), with a warning naming what makes a champion; when
    some of ``instance_types`` are not catalog types (``local.cpu``: nothing public measured
    them, and no prior knows their links) the missing champion is an error naming the DAGs
    that make one."""
    import logging

    from srifty_core.predictors.registry import NoChampionError

    try:
        # through the module, so that what tests patch there is what runs
        model, _ = planner_job.load_bandwidth_with_source(source)
        return model
    except NoChampionError as exc:
        uncovered = sorted(set(instance_types) - set(Catalog.load().names()))
        if uncovered:
            raise ConfigError(
                f"bandwidth: {exc}; the public nccl-tests tables cover catalog types only, "
                f"not {', '.join(uncovered)}: run the srifty_model_refresh DAG (after "
                "srifty_probe_sweep)"
            ) from exc
        model, text = planner_job.public_bandwidth()  # the fallback of load_bandwidth_with_source
        logging.getLogger(__name__).warning(
            "bandwidth: no champion yet (%s), planning on the public tables: %s; the "
            "srifty_model_refresh DAG (after srifty_probe_sweep) makes one of your cloud",
            exc, text,
        )  # fmt: skip
        return model


def _types(request: PlanRequest) -> list[str]:
    return [o.instance.name for o in request.offers]


def _config_id(run_dir: Path | str, resume: Resume | None) -> str:
    if resume is None:
        return "c0"
    found = run_store.names(run_dir, "job-c*.json")
    used = {n.removeprefix("job-").removesuffix(".json") for n in found}
    k = 1
    while f"c{k}" in used:
        k += 1
    return f"c{k}"


def _safe(key: str) -> str:
    out = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    if not out.strip("._"):
        raise ConfigError(f"run key {key!r} gives no usable folder name")
    return out


def _run_dir(spec: JobSpec, run_key: str) -> Path | str:
    if spec.resume is None:
        return run_store.join(run_store.runs_root(), _safe(run_key))
    from srifty_core.worker.checkpoint import CHECKPOINT_FILE, checkpoint_iteration

    if run_store.is_remote(spec.resume.checkpoint) or run_store.is_remote(run_store.runs_root()):
        run_dir = run_store.confined_run_dir(spec.resume.checkpoint, CHECKPOINT_FILE)
        remote_ck = run_store.join(run_dir, CHECKPOINT_FILE)
        if spec.resume.iterations_done > 0 and checkpoint_iteration(remote_ck) is None:
            raise ConfigError(f"resume.checkpoint: no checkpoint at {remote_ck}")
        return run_dir
    ck = Path(spec.resume.checkpoint)
    if ck.name != CHECKPOINT_FILE:
        raise ConfigError(f"resume.checkpoint: expected a path ending in {CHECKPOINT_FILE}")
    # A trigger conf names the checkpoint: it may only point into a run folder of this
    # data folder, never elsewhere (plans, logs and checkpoints are written beside it).
    runs = runs_dir().resolve()
    if not ck.resolve().is_relative_to(runs) or ck.resolve().parent == runs:
        raise ConfigError(
            f"resume.checkpoint: must be in a run folder under {runs} (<run>/{CHECKPOINT_FILE}), "
            f"got {ck}"
        )
    if spec.resume.iterations_done > 0 and checkpoint_iteration(ck) is None:
        raise ConfigError(f"resume.checkpoint: no checkpoint at {ck}")
    return ck.parent


def _rewind_to_checkpoint(run_dir: Path | str) -> None:
    """Cut the records the progress log holds past the checkpoint the run resumes from
    (``progress.rewind``): a run that lost a rank between two checkpoints logged them, and
    the resumed one logs those iterations again."""
    from srifty_core.worker.checkpoint import CHECKPOINT_FILE, checkpoint_iteration

    done = checkpoint_iteration(run_store.join(run_dir, CHECKPOINT_FILE))
    if done is not None:
        rewind(run_store.join(run_dir, PROGRESS_FILE), done)


def plan_job(spec: JobSpec, run_key: str, *, log_plan: PlanSink | None = None) -> Path | str:
    """Plan this run of the job and save it; returns the ``JobPlan`` JSON's path.

    A fresh job gets the run folder ``runs/<run_key>``; a resumed one keeps the folder of
    its checkpoint, so every configuration of the job shares one checkpoint and log.
    The first plan must meet the limits (else ``NoFeasiblePlan`` with the nearest misses);
    a re-plan goes through the ``Replanner`` (depleted offers dropped, the switch charged),
    and one that cannot meet what is left continues on the nearest miss and says so.
    ``log_plan`` records the plan (``orchestrate.plan_job``: in MLflow) before it is saved.
    """
    from srifty_core.planner.search import plan
    from srifty_core.simulator.estimator import Simulator

    run_dir = _run_dir(spec, run_key)
    if isinstance(run_dir, Path):
        run_dir.mkdir(parents=True, exist_ok=True)
    if spec.resume is not None:  # what the last run logged past its checkpoint goes aside
        _rewind_to_checkpoint(run_dir)
    request = job_request(spec)
    # Calibrated by what this job measured (a re-plan) or earlier jobs of the model stored.
    simulator, calibrated = planning_simulator(
        Simulator(load_bandwidth_model(spec.bandwidth, _types(request))), request, run_dir
    )
    if spec.resume is None:
        result = plan(request, simulator)
    else:
        # The conf holds what is left already: nothing done yet of *this* request.
        detach_s = provider_class(spec.provider).detach_s
        overheads = Overheads(launch_s=request.overheads.launch_s, detach_s=detach_s)
        done = Progress(0, depleted=spec.resume.depleted)
        result = Replanner(simulator, overheads=overheads).plan(request, done)
        request = result.request
    if result.space_size == 0:
        raise NoFeasiblePlan(
            f"global_batch: {spec.global_batch} cannot be split over these offers into "
            "power-of-two local batches (one batch per instance type, each within the "
            "model's B_max); try a power-of-two multiple or more quota"
        )
    if result.best is None and spec.resume is None:
        raise NoFeasiblePlan("\n".join(result.explanation()))
    try:
        chosen, note = Replanner.choose(result)
    except ConfigError as exc:
        raise NoFeasiblePlan(str(exc)) from None
    config_id = _config_id(run_dir, spec.resume)
    launches = launches_for(request, chosen.choice)
    train = train_plan_for(
        launches,
        model=spec.model,
        size=spec.size,
        global_batch=spec.global_batch,
        iterations=spec.target_iterations,
        run_dir=str(run_dir),
        config_id=config_id,
        seed=spec.seed,
        checkpoint_every=spec.checkpoint_every,
        step_sleep_s=spec.step_sleep_s,
        settings=spec.settings,
        entrypoint=spec.entrypoint,
        strategy=result.strategy,
        micro_batches=chosen.estimate.micro_batches,
        sync_each_micro_batch=chosen.estimate.sync_each_micro_batch,
    )
    train_path = train.save(run_store.join(run_dir, f"plan-{config_id}.json"))
    usd_per_hour = sum(request.offers[i].usd_per_hour * c for i, c, _ in chosen.choice)
    explanation = tuple(result.explanation())
    if note is not None:
        explanation = (note, *explanation)
    if calibrated is not None:
        explanation = (*explanation, calibrated)
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
    if log_plan is not None:
        job = log_plan(spec, job, result.to_dict(), run_key)
    return job.save(run_store.join(run_dir, f"job-{config_id}.json"))


# --------------------------------------------------------------------------- persistence
def run_path(run_dir: Path | str) -> Path | str:
    return run_store.join(run_dir, RUN_FILE)


def read_run(run_dir: Path | str) -> dict[str, Any] | None:
    """The run folder's calibration state (``Recalibrator``), or None."""
    text = run_store.read_text(run_path(run_dir))
    if text is None:
        return None
    try:
        d = json.loads(text)
        d["calibration"] = _calibration(d["calibration"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{run_path(run_dir)}: not a calibration state ({exc})") from exc
    return dict(d)


def _calibration(d: Mapping[str, Any]) -> Calibration:
    from srifty_core.simulator.calibration import Calibration

    return Calibration.from_dict(d)


def planning_simulator(
    simulator: Simulator, request: PlanRequest, run_dir: Path | str | None
) -> tuple[Simulator, str | None]:
    """The simulator a plan of ``request`` uses: calibrated by the run folder's state (a
    re-plan: what this job measured, scales only: ``Calibration.unobserved``), else by
    the factors stored for the model (``calibration.for_request``), else ``simulator``;
    and a line saying which, for the plan's explanation (None when uncalibrated)."""
    from srifty_core.simulator import calibration as calib

    state = read_run(run_dir) if run_dir is not None else None
    if state is not None and state["calibration"].windows > 0:
        cal: Calibration = state["calibration"].unobserved()
        source = "measured by this job"
    else:
        found = calib.for_request(request, simulator.bandwidth)
        if found is None:
            return simulator, None
        cal, source = found, "stored from earlier jobs"
    lines = cal.describe()
    if not lines:
        return simulator, None
    return calib.calibrated(simulator, cal), f"calibrated ({source}): " + "; ".join(lines)
