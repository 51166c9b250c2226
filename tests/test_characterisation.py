"""Characterisation tests: today's behaviour where one concept is defined twice, the
divergences included, pinned so that the fix that gives the concept one home flips the test
visibly (each pinned divergence is named in its test's docstring and in an ``EXPECTED_*``
dict: the fix empties that dict).

No profiling, no training: the request tests build both requests on a stored profile made
here; the profiler tests read defaults only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from srifty_core.planner.request import Objective
from srifty_core.planner.schema.fields import DEFAULT_OBJECTIVE

# ---------------------------------------------------------------- one request, two builders
REQUEST: dict[str, Any] = {
    "model": "resnet18",
    "size": "small",
    "provider": "ec2",
    "region": "us-east-1",
    "global_batch": 256,
    "iterations": 100,
    "time_limit_s": 3600.0,
    "budget_usd": 20.0,
    "checkpoint_every": 10,
    "offers": [
        {"type": "g4dn.xlarge", "market": "on-demand", "quota": 4},
        {"type": "g4dn.xlarge", "market": "spot", "quota": 2, "price": 0.2},
    ],
}
"""A request both paths accept: no ``objective``, ``risk_quantile`` or overheads, so each
path fills in its own defaults."""
JOB_ONLY: dict[str, Any] = {"ec2": {"image_id": "ami-0123456789abcdef0"}}
"""What the job's conf needs besides (the plan's request refuses the key)."""

EXPECTED_REQUEST_DIFFERENCES: dict[str, tuple[Any, Any]] = {}
"""``PlanRequest`` field -> (``srifty plan``'s value, the job's value) for ``REQUEST``."""
EXPECTED_SCHEMA_DEFAULT_DIFFERENCES: dict[str, tuple[Any, Any]] = {}
"""Field -> (``RequestSpec``'s default, ``JobConf``'s) of the fields both schemas have
(issue 49 step 3a: ``JobConf`` extends ``RequestSpec``, one default each: ``provider``
inferred from the offers, ``size`` full, ``region`` us-east-1, ``risk_quantile`` 0.9)."""


def _profile_store(root: Path) -> Path:
    """A store holding a T4 profile of resnet18/small (the g4dn types' GPU): the profile
    contract's synthetic profile, relabelled."""
    from srifty_core.profiling.store import ProfileStore
    from tests.profiling.test_profile_contract import make_profile

    ProfileStore(root).save(make_profile(device_type="T4", device_name="Tesla T4"))
    return root


def _differences(a: Any, b: Any) -> dict[str, tuple[Any, Any]]:
    return {
        f.name: (getattr(a, f.name), getattr(b, f.name))
        for f in dataclasses.fields(a)
        if getattr(a, f.name) != getattr(b, f.name)
    }


def _both(request: Mapping[str, Any], profiles: Path) -> tuple[Any, Any]:
    """``request`` built by ``srifty plan`` (``planner.job.load_request``: ``RequestSpec``)
    and by the plan-and-train DAG (``JobSpec.from_params``: the DAG's ``JobConf``, then
    ``jobs.planning.job_request``); both through ``planner.request.build_request``."""
    from srifty_core.jobs.job import JobSpec
    from srifty_core.jobs.planning import job_request
    from srifty_core.planner.job import load_request

    plan = load_request(dict(request), profiles)
    job = job_request(JobSpec.from_params({**request, **JOB_ONLY}), profiles)
    return plan, job


def test_plan_and_job_paths_build_the_same_request(tmp_path: Path) -> None:
    """The same request through ``srifty plan`` and through the plan-and-train DAG comes out
    the same: workload and its profiles, offers and their prices, limits, risk quantile,
    overheads (launch 150 s, detach 0), checkpoints, batch granularity, spot pricing, and
    the objective (until issue 49 a request without one was optimised for time by ``srifty
    plan`` and for cost by the DAG: one default now, ``schema.fields.DEFAULT_OBJECTIVE``)."""
    plan, job = _both(REQUEST, _profile_store(tmp_path / "profiles"))
    assert _differences(plan, job) == EXPECTED_REQUEST_DIFFERENCES
    # the fields compared are there, and set (not every field at its class default)
    assert plan.time_limit_s == 3600.0 and plan.budget_usd == 20.0 and len(plan.offers) == 2
    assert plan.overheads.launch_s == 150.0 and plan.risk_quantile == 0.9
    assert plan.objective == job.objective == Objective.parse(DEFAULT_OBJECTIVE)
    stated = _both({**REQUEST, "objective": "cost"}, tmp_path / "profiles")
    assert _differences(*stated) == {} and stated[1].objective == Objective.COST


def test_plan_and_job_schemas_default_the_same_fields() -> None:
    """``srifty plan``'s ``RequestSpec`` and the DAG's ``JobConf`` have one default per
    shared field (until issue 49 step 3a: ``provider`` ec2 vs local, ``size`` full vs
    required, ``region`` and ``risk_quantile`` None in the job's, filled in later)."""
    from pydantic_core import PydanticUndefined

    from srifty_core.planner.schema.job_conf import JobConf
    from srifty_core.planner.schema.request_spec import RequestSpec

    shared = sorted(set(RequestSpec.model_fields) & set(JobConf.model_fields))
    assert {"objective", "provider", "size", "region", "risk_quantile", "offers"} <= set(shared)
    assert set(RequestSpec.model_fields) <= set(JobConf.model_fields)  # a conf is a request

    def default(model: Any, name: str) -> Any:
        d = model.model_fields[name].default
        return "required" if d is PydanticUndefined else d

    found = {
        name: (default(RequestSpec, name), default(JobConf, name))
        for name in shared
        if default(RequestSpec, name) != default(JobConf, name)
    }
    assert found == EXPECTED_SCHEMA_DEFAULT_DIFFERENCES


# ---------------------------------------------------------------- one request, one plan
DEFAULTED = {k: v for k, v in REQUEST.items() if k not in ("provider", "region", "size")}
"""``REQUEST`` with the fields whose defaults were unified left out (and ``objective``,
``risk_quantile`` and the overheads, which it never states): each path fills in the same."""


def _planned_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A stored T4 profile of resnet18/full (the default size) and the public bandwidth
    model fitted once for every path (each would fit the same on a fresh install)."""
    import functools

    from srifty_core.planner import job as planner_job
    from srifty_core.profiling.store import ProfileStore
    from tests.profiling.test_profile_contract import make_profile

    ProfileStore().save(make_profile(size="full", device_type="T4", device_name="Tesla T4"))
    monkeypatch.setattr(
        planner_job, "public_bandwidth", functools.cache(planner_job.public_bandwidth)
    )


def _job_plan(params: Mapping[str, Any], key: str, *, shell: bool) -> Any:
    """What ``srifty train --job`` (``job_run``: ``shell``) and the plan-and-train DAG's
    plan task do to plan: ``JobSpec.from_params``, then ``orchestrate.plan_job``."""
    from srifty_core.jobs.job import JobPlan, JobSpec
    from srifty_core.jobs.orchestrate import plan_job

    return JobPlan.load(plan_job(JobSpec.from_params(params, shell=shell), key, track=False))


def test_the_same_request_plans_alike_through_srifty_plan_and_srifty_train_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``srifty plan REQUEST`` and the planning step of ``srifty train --job`` (the same
    request as a job file, plus its EC2 image) choose the same configuration with the same
    prediction, the defaults filled in alike (provider ec2 from the offers, size full)."""
    import json

    from srifty_core.cli import main

    _planned_alike(tmp_path, monkeypatch)
    request = tmp_path / "request.json"
    request.write_text(json.dumps(DEFAULTED))
    assert main(["plan", str(request), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    job = _job_plan({**DEFAULTED, **JOB_ONLY}, "shell", shell=True)
    assert planned["best"] is not None and job.predicted == planned["best"]
    assert job.provider == "ec2" and job.region == "us-east-1"


@pytest.mark.airflow
def test_the_dag_plans_a_request_as_srifty_train_job_does(
    dagbag: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan-and-train DAG's plan task, given the trigger's conf over the DAG's Params
    (what its ``ctx["params"]`` holds), plans what ``srifty train --job`` plans."""
    import copy

    _planned_alike(tmp_path, monkeypatch)
    params = copy.deepcopy(dagbag.get_dag("srifty_plan_and_train").params)
    params.update({**DEFAULTED, **JOB_ONLY})
    dag = _job_plan({k: params[k] for k in params}, "dag", shell=False)
    shell = _job_plan({**DEFAULTED, **JOB_ONLY}, "shell", shell=True)
    assert dag.predicted == shell.predicted and dag.launches == shell.launches
    assert dag.provider == shell.provider == "ec2"


@pytest.mark.airflow
def test_the_dags_params_default_as_the_schema_does(dagbag: Any) -> None:
    """Each Param of the plan-and-train DAG defaults to ``JobConf``'s default (so a trigger
    that leaves a field out plans as ``srifty train --job`` and ``srifty plan`` do); only
    the fields the schema requires carry the trigger form's example values, which make a
    valid conf."""
    from srifty_core.planner.schema.job_conf import JobConf

    dag = dagbag.get_dag("srifty_plan_and_train")
    params = {k: dag.params[k] for k in dag.params}
    assert set(params) == set(JobConf.model_fields)
    differ = {
        name: (params[name], f.default)
        for name, f in JobConf.model_fields.items()
        if not f.is_required() and params[name] != f.default
    }
    assert differ == {}
    required = {name for name, f in JobConf.model_fields.items() if f.is_required()}
    assert required == {"model", "global_batch", "iterations", "offers"}
    JobConf.parse(params)


# ---------------------------------------------------------------- the profiler's defaults
EXPECTED_PROFILER_DIVERGENCES: dict[str, dict[str, Any]] = {}
"""Default -> its value in each source that has it, where they disagree (none since issue
49: ``profiling.budget.ProfilerBudget`` is their one home)."""


def _cli_defaults() -> dict[str, Any]:
    """``srifty profile``'s defaults (``cli.parser.build_parser``), by the profiler's names."""
    from srifty_core.cli.parser import build_parser

    a = build_parser().parse_args(["profile", "--model", "resnet18"])
    return {
        "size": a.size, "precision": a.precision, "optimizer": a.optimizer,
        "compile": a.compile, "channels_last": a.channels_last, "device_types": [a.device],
        "probes": None if a.dense else a.probes, "batch_sizes": a.batch_sizes,
        "repeats": a.repeats, "warmup": a.warmup, "max_batch": a.max_batch,
        "memory_cap_bytes": a.memory_cap_bytes, "max_step_s": a.max_step_s, "threads": a.threads,
        "colocated": a.colocated, "refine": a.refine, "share_host": a.share_host,
        "log_to_mlflow": not a.no_mlflow, "provider": a.provider, "market": a.market,
        "region": a.region, "collect_timeout_s": a.collect_timeout_s, "seed": a.seed,
        "reference_on_cpu": not a.no_reference,
    }  # fmt: skip


def _config_defaults() -> dict[str, Any]:
    """``profiling.profiler.ProfilerConfig``'s defaults (its seed is the profiler's own, not
    the emulator's: left out)."""
    from srifty_core.profiling.config import ProfilerConfig

    c = ProfilerConfig()
    out = {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
    out["device_types"] = [out.pop("device")]
    out.pop("seed")
    return {**out, **out.pop("settings").to_dict()}


def _cloud_defaults() -> dict[str, dict[str, Any]]:
    """``jobs.cloud_request.CloudProfileRequest``'s field defaults, and those its
    ``from_params`` fills in for a conf naming the model only."""
    from srifty_core.jobs.cloud_request import CloudProfileRequest

    return {
        "cloud_request": CloudProfileRequest(model="resnet18").to_dict(),
        "cloud_from_params": CloudProfileRequest.from_params({"model": "resnet18"}).to_dict(),
    }


def disagreements(sources: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{name: {source: value}}`` of the names whose sources do not all agree."""
    out = {}
    for name in sorted(set().union(*sources.values())):
        seen = {s: v[name] for s, v in sources.items() if name in v}
        first = next(iter(seen.values()))
        if any(v != first for v in seen.values()):
            out[name] = seen
    return out


def _shared(sources: Mapping[str, Mapping[str, Any]]) -> set[str]:
    """The names at least two sources have (what the comparison covers)."""
    names = [n for v in sources.values() for n in v if n != "model"]
    return {n for n in names if names.count(n) > 1}


def test_cli_and_profiler_config_defaults_agree() -> None:
    """``srifty profile``'s flags, ``ProfilerConfig`` and ``CloudProfileRequest`` (its
    fields and its ``from_params``) state the same defaults (one home,
    ``ProfilerBudget``, which the flags and the others are made from)."""
    sources = {"cli": _cli_defaults(), "profiler_config": _config_defaults(), **_cloud_defaults()}
    compared = {"size", "probes", "repeats", "refine", "max_batch", "warmup", "share_host"}
    assert _shared(sources) >= compared | {"colocated", "precision", "memory_cap_bytes"}
    assert disagreements(sources) == {}


def test_the_defaults_comparison_sees_a_disagreement() -> None:
    # Guard against a comparison that cannot fail.
    found = disagreements({"a": {"x": 1, "y": 2}, "b": {"x": 1, "y": 3}, "c": {"z": 0}})
    assert found == {"y": {"a": 2, "b": 3}}


@pytest.mark.airflow
def test_one_home_for_profiler_defaults(dagbag: Any) -> None:
    """The profile DAG's Params (size, settings, probes, refine, repeats, max_batch, memory
    cap, threads, share_host, provider, market, region, collect timeout, seed) agree with
    ``srifty profile``'s flags, ``ProfilerConfig`` and ``CloudProfileRequest`` (until issue
    49 the DAG's ``share_host`` defaulted to 2 and the others' to 1: now one default,
    ``ProfilerBudget.share_host``, 2 workers on a CPU)."""
    dag = dagbag.get_dag("srifty_profile_model")
    params = {k: dag.params[k] for k in dag.params}
    mib = params.pop("memory_cap_mib")
    params["memory_cap_bytes"] = None if mib is None else mib * 2**20
    sources = {
        "cli": _cli_defaults(),
        "profiler_config": _config_defaults(),
        **_cloud_defaults(),
        "dag": params,
    }
    assert _shared({"dag": params, "cli": _cli_defaults()}) >= {
        "size", "probes", "refine", "repeats", "max_batch", "memory_cap_bytes", "threads",
        "share_host", "device_types", "provider", "collect_timeout_s", "seed",
    }  # fmt: skip
    assert disagreements(sources) == EXPECTED_PROFILER_DIVERGENCES == {}
