"""Online recalibration in the runtime (``jobs.recalibration``): the worker records what
the factors need, a window of a hidden slowdown re-plans a job the slowdown makes miss its
limit and keeps one on track, and the monitor's step wires it (state in the run folder,
factors kept, the re-plan's simulator calibrated)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from srifty_core.catalog.types import Market
from srifty_core.jobs import recalibration as recal
from srifty_core.jobs.job import JobPlan, JobSpec, Launch
from srifty_core.planner.request import Objective, Offer, Overheads, PlanRequest
from srifty_core.planner.search import plan
from srifty_core.runs.progress import WARMUP_STEPS, ProgressRecord, read_progress
from srifty_core.simulator import calibration as calib
from srifty_core.simulator.estimator import Simulator
from srifty_core.simulator.types import ClusterConfig, Group
from tests.simulator.test_calibration import A, B, SpreadBandwidth, workload

N = 2000
BATCH = 64


def setting() -> tuple[PlanRequest, Simulator, ClusterConfig, tuple[str, ...]]:
    """A request (least cost within a deadline 10 % over the cheapest plan's p90), the
    uncalibrated simulator, and the first plan's configuration with its ranks' devices."""
    bw = SpreadBandwidth(1e9, {"a.big": 0.05, "b.big": 0.05})
    sim = Simulator(bw, mean="exact")
    offers = (Offer(A, Market.ON_DEMAND, 4, 1.0), Offer(B, Market.ON_DEMAND, 4, 0.5))

    def request(limit: float) -> PlanRequest:
        return PlanRequest(
            workload=workload(), global_batch=BATCH, iterations=N, offers=offers,
            time_limit_s=limit, objective=Objective.COST, overheads=Overheads(launch_s=10.0),
        )  # fmt: skip

    cheapest = plan(request(math.inf), sim).best
    assert cheapest is not None
    req = request(1.1 * cheapest.time_at_risk_s)
    first = plan(req, sim).best
    assert first is not None
    config = ClusterConfig(tuple(Group(offers[i].instance, c, b) for i, c, b in first.choice))
    devices = tuple(
        g.instance.device_type
        for g in config.groups
        for _ in range(g.count * g.instance.ranks_per_vm)
    )
    return req, sim, config, devices


def context(slow: float = 1.0) -> tuple[recal.Context, float]:
    """The context of the first plan, and its true iteration time under a hidden slowdown
    ``slow`` of every device's compute."""
    req, sim, config, devices = setting()
    ctx = recal.Context(req, sim, config, devices, 2.0, Overheads(launch_s=10.0))
    truth = calib.Calibration("m", {d: calib.Factor(math.log(slow), 0.01) for d in set(devices)})
    return ctx, calib.calibrated(sim, truth).estimate(req.workload, config).t_iter


def records(
    ctx: recal.Context, slow: float, t_iter: float, first: int, n: int, t0: float, seed: int = 0
) -> list[ProgressRecord]:
    """``n`` steps from iteration ``first``: per-rank compute ``slow`` times the predicted
    pass (3 % jitter), the exchange as predicted (5 %), iteration times with a wide jitter
    (what the throughput monitor sees is noisy; the breakdown is not)."""
    rng = np.random.default_rng(seed)
    pred, busy = ctx.simulator.breakdown(ctx.request.workload, ctx.config)
    out, t = [], t0
    for k in range(n):
        step = t_iter * float(rng.choice([0.4, 1.6]))
        t += step
        comp = tuple(slow * pred[d] * float(rng.lognormal(0, 0.03)) for d in ctx.rank_devices)
        out.append(ProgressRecord(first + k, t, step, BATCH, "c0", comp,
                                  busy * float(rng.lognormal(0, 0.05))))  # fmt: skip
    return out


# --------------------------------------------------------------------------- the worker
STEP_SLEEP_S = 0.06
"""Each rank of ``fresh_install_run`` sleeps this long after its backward pass."""


@pytest.fixture(scope="module")
def fresh_install_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """End to end, as the quick start on a fresh clone, once for the tests that read it:
    profile, then train a plan file on two local workers (``train_local``, the built-in
    worker, unequal local batches); no probes, no bandwidth model. In a data folder of
    its own (the tests' own ``data_dir`` is theirs); the WARNING lines logged while it
    trains are kept."""
    import logging

    from srifty_core import paths
    from srifty_core.cloud.local import LocalProvider
    from srifty_core.jobs.local_run import train_local
    from srifty_core.planner.schema.train_plan import TrainPlan

    root = tmp_path_factory.mktemp("fresh-install")
    data = root / "srifty-data"
    data.mkdir()
    messages: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    keep = Keep(logging.WARNING)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(paths.ENV_VAR, str(data))
        mp.setenv("MLFLOW_TRACKING_URI", "")
        _profile_tiny_dlrm()
        run = data / "runs" / "fresh"
        plan = TrainPlan(model="dlrm", size="tiny", global_batch=16, iterations=16,
                         local_batches=(4, 12), run_dir=str(run), checkpoint_every=8,
                         step_sleep_s=STEP_SLEEP_S)  # fmt: skip
        logging.getLogger().addHandler(keep)
        try:
            report = train_local(plan, LocalProvider(root / "cloud"), timeout_s=120)
        finally:
            logging.getLogger().removeHandler(keep)
        yield {"plan": plan, "report": report, "run": run, "warnings": messages}


def test_worker_records_per_rank_compute_and_exchange(fresh_install_run: dict[str, Any]) -> None:
    # Each rank sleeps after its backward pass (work outside forward + backward, as a data
    # loader's): its compute must leave the sleep out. A record's step is rank 0's period;
    # another rank's period starts when it left the last all-gather, which under CPU
    # contention is a few ms before or after rank 0 did, so with a tiny model and no sleep a
    # rank's compute can exceed rank 0's step by that skew (it did, 1 run in 4 under load).
    sleep = STEP_SLEEP_S
    recs = read_progress(fresh_install_run["plan"].progress_path)
    assert [r.iteration for r in recs] == list(range(1, 17))
    for r in recs:
        assert r.compute_s is not None and len(r.compute_s) == 2
        assert all(0 < x < r.step_s - sleep / 2 for x in r.compute_s), r
        assert r.exchange_s is not None and 0 < r.exchange_s < r.step_s
        # rank 0's writes after the step before (its log line, the state file) lie in
        # this step's period; the first step has none before it
        assert r.upkeep_s is not None and 0 <= r.upkeep_s < r.step_s
        assert r.train_s == pytest.approx(r.step_s - r.upkeep_s)
    assert recs[0].upkeep_s == 0.0 and all(r.upkeep_s and r.upkeep_s > 0 for r in recs[1:])
    # An older log's line (no timings) still reads; a record without them writes none.
    old = {"iteration": 1, "wall_time": 1.0, "step_s": 0.1, "samples": 8, "config_id": "c0"}
    r = ProgressRecord.from_dict(old)
    assert r.compute_s is None and r.exchange_s is None and r.to_dict() == old
    assert r.upkeep_s is None and r.train_s == r.step_s
    assert ProgressRecord.from_dict(recs[0].to_dict()) == recs[0]


def test_step_timings_take_the_least_exchange_and_drop_unmeasured() -> None:
    from srifty_core.worker.worker import step_timings

    assert step_timings([[0.2, 0.05], [0.3, 0.02]]) == ((0.2, 0.3), 0.02)
    assert step_timings([[math.nan, math.nan], [0.3, 0.02]]) == (None, None)


# --------------------------------------------------------------------------- the rule
def test_a_hidden_slowdown_that_breaks_the_deadline_replans() -> None:
    ctx, t_true = context(1.3)
    cal = calib.prior(ctx.request.workload, [o.instance for o in ctx.request.offers],
                      ctx.simulator.bandwidth)  # fmt: skip
    recs = records(ctx, 1.3, t_true, 1, 200, 0.0)
    out = recal.assess(ctx, cal, recs, iterations_left=N - 200, iterations_done=200,
                       elapsed_s=200 * t_true, spent_usd=0.1)  # fmt: skip
    assert out.replan and out.reason.startswith("recalibrated") and "limit" in out.reason
    assert out.alternative is not None and out.alternative != ctx.config.label()
    for d in set(ctx.rank_devices):
        assert out.calibration.compute[d].scale == pytest.approx(1.3, rel=0.03)
    # the projection of the rest is the truth's, within 5 %; the uncalibrated one is not
    assert out.projection.mean_s == pytest.approx((N - 200) * t_true, rel=0.05)
    base = ctx.simulator.estimate(ctx.request.workload, ctx.config).t_iter
    assert abs(base / t_true - 1) > 0.1
    assert out.metrics["recal_projected_rest_q_s"] >= out.metrics["recal_projected_rest_s"]


def test_a_job_on_track_keeps_its_configuration() -> None:
    ctx, t_true = context(1.0)
    cal = calib.prior(ctx.request.workload, [o.instance for o in ctx.request.offers],
                      ctx.simulator.bandwidth)  # fmt: skip
    recs = records(ctx, 1.0, t_true, 1, 200, 0.0)
    out = recal.assess(ctx, cal, recs, iterations_left=N - 200, iterations_done=200,
                       elapsed_s=200 * t_true, spent_usd=0.1)  # fmt: skip
    assert not out.replan and out.alternative is None and "on track" in out.reason
    assert out.projection.mean_s == pytest.approx((N - 200) * t_true, rel=0.05)


def test_iteration_times_alone_still_calibrate() -> None:
    ctx, t_true = context(1.3)
    cal = calib.prior(ctx.request.workload, [o.instance for o in ctx.request.offers],
                      ctx.simulator.bandwidth)  # fmt: skip
    old = [ProgressRecord(k, float(k), t_true * (1 + 0.01 * (k % 3)), BATCH, "c0")
           for k in range(1, 51)]  # fmt: skip
    out = recal.assess(ctx, cal, old, iterations_left=N - 50, iterations_done=50,
                       elapsed_s=50 * t_true, spent_usd=0.0, search=False)  # fmt: skip
    assert out.projection.t_iter_s == pytest.approx(t_true, rel=0.05)


def test_a_sharded_accumulating_job_is_projected_as_it_runs() -> None:
    """A job running fsdp in 4 micro-batches: the window corrects the compute factors only
    (the exchange DDP's breakdown prices is not the one it runs), and the rest is projected
    with its own iteration (``plan_estimator``), not DDP's one pass."""
    from dataclasses import replace

    from srifty_core.simulator.accumulation import plan_estimator

    base, _ = context(1.3)
    ctx = replace(base, strategy="fsdp", micro_batches=4)
    assert ctx.sharded and not base.sharded
    truth = calib.Calibration(
        "m", {d: calib.Factor(math.log(1.3), 0.01) for d in set(ctx.rank_devices)}
    )
    running = plan_estimator(calib.calibrated(ctx.simulator, truth), "fsdp", 4)
    t_true = running.estimate(ctx.request.workload, ctx.config).t_iter
    ddp_t = calib.calibrated(ctx.simulator, truth).estimate(ctx.request.workload, ctx.config)
    assert abs(t_true / ddp_t.t_iter - 1) > 0.05  # the two iterations differ
    cal = calib.prior(ctx.request.workload, [o.instance for o in ctx.request.offers],
                      ctx.simulator.bandwidth)  # fmt: skip
    recs = records(ctx, 1.3, t_true, 1, 200, 0.0)
    out = recal.assess(ctx, cal, recs, iterations_left=N - 200, iterations_done=200,
                       elapsed_s=200 * t_true, spent_usd=0.1, search=False)  # fmt: skip
    for d in set(ctx.rank_devices):
        assert out.calibration.compute[d].scale == pytest.approx(1.3, rel=0.03)
    assert not any(f.windows for f in out.calibration.comm.values())
    assert out.projection.t_iter_s == pytest.approx(t_true, rel=0.01)
    with pytest.raises(Exception, match="micro_batches"):
        plan_estimator(ctx.simulator, "fsdp", 0)


# --------------------------------------------------------------------------- the monitor
def job_files(run: Path, ctx: recal.Context) -> tuple[Path, JobSpec]:
    """A local run folder: the workers' plan and the ``JobPlan`` of the first plan."""
    run.mkdir()
    train = run / "plan-c0.json"
    train.write_text(json.dumps({"iterations": N, "global_batch": BATCH, "run_dir": str(run),
                                 "config_id": "c0"}))  # fmt: skip
    launches = tuple(
        Launch(g.instance.name, "on-demand", g.count, g.instance.ranks_per_vm,
               g.batch // g.instance.ranks_per_vm)
        for g in ctx.config.groups
    )  # fmt: skip
    job = JobPlan("c0", "local", "local", str(train), launches, ctx.usd_per_hour,
                  {"t_iter_s": 0.1}, ("plan",))  # fmt: skip
    path = run / "job-c0.json"
    job.save(path)
    spec = JobSpec(model="m", size="s", global_batch=BATCH, iterations=N,
                   offers=({"type": "a.big", "quota": 4}, {"type": "b.big", "quota": 4}),
                   time_limit_s=ctx.request.time_limit_s, objective="cost")  # fmt: skip
    return path, spec


@pytest.mark.parametrize("slow", [1.0, 1.3])
def test_the_monitor_step_recalibrates_keeps_the_factors_and_calibrates_the_replan(
    tmp_path: Path, data_dir: Path, slow: float
) -> None:
    from srifty_core.cloud.local import LocalProvider
    from srifty_core.jobs.monitor_step import Monitor
    from srifty_core.runs.progress import ProgressLog

    ctx, t_true = context(slow)
    run = tmp_path / "run"
    path, spec = job_files(run, ctx)
    assert recal.configuration(ctx.request, JobPlan.load(path)) == (ctx.config, ctx.rank_devices)
    t0 = 1000.0
    recs = records(ctx, slow, t_true, 1, 120, t0)
    window_s = 0.6 * (recs[-1].wall_time - t0)  # the second step closes the window
    monitor = Monitor(path, [], spec, t0, provider=LocalProvider(), window_s=window_s)
    monitor.recal = recal.Recalibrator(monitor.job, spec, window_s=window_s, context=ctx)
    with ProgressLog(run / "progress.jsonl") as log:
        for half in (recs[:60], recs[60:]):
            for r in half:
                log.append(r)
            out = monitor.step(now=half[-1].wall_time + 0.01)
            if half[0].iteration == 1:
                assert out.status == "running" and recal.read_run(run) is None
    state = recal.read_run(run)
    assert state is not None and state["config_id"] == "c0" and state["last_iteration"] == 120
    cal = state["calibration"]
    stored = calib.store_path("m")
    if slow == 1.0:
        assert out.status == "running" and monitor.recal.disabled is None
        assert not stored.exists()  # kept only when the configuration ends
        return
    # the throughput monitor alone, on these noisy iteration times, would not have switched
    assert out.status == "replan" and out.reason.startswith("recalibrated"), out.reason
    d = ctx.rank_devices[0]
    assert cal.compute[d].scale == pytest.approx(1.3, rel=0.03) and cal.compute[d].windows == 1
    assert stored.is_file() and json.loads(stored.read_text())["compute"][d]["windows"] == 1
    # the re-plan plans with what this job measured
    sim, note = recal.planning_simulator(ctx.simulator, ctx.request, run)
    assert note is not None and "measured by this job" in note
    assert sim.calibration is not None and sim.calibration.compute_scale(d) == pytest.approx(
        cal.compute[d].scale
    )
    assert sim.estimate(ctx.request.workload, ctx.config).t_iter == pytest.approx(t_true, rel=0.05)
    # a restarted monitor resumes the state and takes no step twice
    again = recal.Recalibrator(monitor.job, spec, window_s=window_s, context=ctx)
    assert again.step(recs, elapsed_s=1.0, spent_usd=0.0, final=True) is None  # none twice
    assert again.calibration.compute[d].windows == 1 and again.last_iteration == 120


def test_the_factors_go_to_the_configurations_mlflow_run(data_dir: Path) -> None:
    from srifty_core.jobs.job_log import EXPERIMENT, log_factors
    from srifty_core.tracking.store import writer

    client, experiment = writer(EXPERIMENT)
    run_id = client.create_run(experiment).info.run_id
    cal = calib.Calibration(
        "m", {"A": calib.Factor(math.log(1.2), 0.02, 2, 2), "B": calib.Factor()}, {}
    )
    log_factors(run_id, "c1", cal)
    run = client.get_run(run_id)
    assert run.data.metrics == {"calibration.compute.A": pytest.approx(1.2)}  # observed only
    text = Path(client.download_artifacts(run_id, "c1/calibration.json")).read_text()
    assert calib.Calibration.from_dict(json.loads(text)) == cal


def test_the_breakdown_a_rank_is_compared_with_includes_host_sharing() -> None:
    # Two local workers slow each other (the profile's shared_slowdown): what a rank
    # measures includes that, so the breakdown must, or the compute factor would absorb
    # the sharing and the estimate (which models it) would count it twice.
    import dataclasses

    from srifty_core.simulator.types import Workload
    from tests.profiling.test_profile_contract import make_profile
    from tests.simulator.test_estimator import ConstantBandwidth, local, steady

    shared = dataclasses.replace(steady(make_profile()), shared_slowdown=((2, 1.3),))
    w = Workload("m", {"cpu": shared})
    sim = Simulator(ConstantBandwidth(1e12), overlap=0.0)
    two = ClusterConfig((Group(local(), 2, 32),))
    pred, _ = sim.breakdown(w, two)
    one, _ = sim.breakdown(w, ClusterConfig((Group(local(), 1, 32),)))
    assert pred["cpu"] == pytest.approx(1.3 * one["cpu"])
    est = sim.estimate(w, two)
    assert est.t_fw + est.t_bw == pytest.approx(pred["cpu"], rel=1e-6)


def test_a_window_needs_a_few_steps_and_skips_the_warm_up(tmp_path: Path) -> None:
    ctx, t_true = context(1.0)
    path, spec = job_files(tmp_path / "run", ctx)
    r = recal.Recalibrator(JobPlan.load(path), spec, window_s=1e9, context=ctx)
    recs = records(ctx, 1.0, t_true, 1, WARMUP_STEPS + 3, 0.0)
    # the first steps warm up; two more do not measure a window's jitter, even at the end
    two = recs[: WARMUP_STEPS + 2]
    assert r.step(two, elapsed_s=1.0, spent_usd=0.0, final=True) is None
    assert r.step(two, elapsed_s=1.0, spent_usd=0.0) is None  # nothing taken twice
    assert r.step(recs, elapsed_s=1.0, spent_usd=0.0) is None  # the window is not full
    out = r.step(recs, elapsed_s=1.0, spent_usd=0.0, final=True)
    assert out is not None and out.metrics["recal_windows"] == 1.0
    assert out.projection.iterations == N - WARMUP_STEPS - 3


def test_a_plan_file_priced_at_nothing_recalibrates(ready_to_plan: Path) -> None:
    """``srifty train PLAN.json`` prices its workers at the limits' rate, 0 unless given;
    its recalibration was off for that ("offers[local.cpu/on-demand].usd_per_hour: must
    be a positive number ($/hour), got 0.0") and left no calibration.json."""
    from srifty_core.jobs.local_run import plan_file_job
    from srifty_core.jobs.monitor import Limits
    from srifty_core.planner.schema.train_plan import TrainPlan

    run = ready_to_plan / "runs" / "free"
    run.mkdir(parents=True)
    plan = TrainPlan(model="dlrm", size="tiny", global_batch=16, iterations=40,
                     local_batches=(8, 8), run_dir=str(run))  # fmt: skip
    spec, job = plan_file_job(plan, plan.save(run / "plan-c0.json"), Limits(40, 16))
    assert job.usd_per_hour == 0.0
    job.save(run / "job-c0.json")
    r = recal.Recalibrator(job, spec, window_s=1e9, search=False)  # the job's own context
    recs = [ProgressRecord(k, 100.0 + 0.1 * k, 0.1, 16, "c0") for k in range(1, WARMUP_STEPS + 6)]
    assert r.check(recs, elapsed_s=1.0, spent_usd=0.0) is None  # the window is not full
    r.finish(recs, 1.0, 0.0)  # the configuration ended: the window closes
    assert r.disabled is None
    assert r.last is not None and r.last.projection.usd_per_hour == 0.0
    state = recal.read_run(run)
    assert state is not None and state["calibration"].windows == 1


def _profile_tiny_dlrm() -> None:
    """What a fresh install has after the quick start's ``srifty profile``: this host's
    compute profile of the model, and nothing else (no probes, no bandwidth model)."""
    from srifty_core.profiling.config import ProfilerConfig
    from srifty_core.profiling.profiler import profile_model
    from srifty_core.profiling.store import ProfileStore

    config = ProfilerConfig(max_batch=16, repeats=3, warmup=1, threads=1, share_host=1)
    ProfileStore().save(profile_model("dlrm", "tiny", config))


def _plan_file_run(run: Path) -> tuple[Any, Any]:
    """A plan file of tiny DLRM on two ranks in the new run folder ``run``, as ``srifty
    train PLAN.json`` starts it: (its JobSpec, its saved JobPlan)."""
    from srifty_core.jobs.local_run import plan_file_job
    from srifty_core.jobs.monitor import Limits
    from srifty_core.planner.schema.train_plan import TrainPlan

    run.mkdir(parents=True)
    plan = TrainPlan(model="dlrm", size="tiny", global_batch=16, iterations=40,
                     local_batches=(8, 8), run_dir=str(run))  # fmt: skip
    spec, job = plan_file_job(plan, plan.save(run / "plan-c0.json"), Limits(40, 16))
    job.save(run / "job-c0.json")
    return spec, job


def test_a_plan_file_on_a_fresh_install_learns_compute_and_keeps_the_exchange_measured(
    data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """No bandwidth model at all (nothing probed; the public tables have no local.cpu
    rows): recalibration was off ("no bandwidth model"). It now learns the compute
    factors from the ranks' measured compute times against the profile, which is what
    the plan had, and keeps the exchange as measured, saying so; a window of iteration
    times alone moves no factor and says why."""
    import logging

    _profile_tiny_dlrm()
    assert not (data_dir / "probes").exists() and not (data_dir / "calibration").exists()
    run = data_dir / "runs" / "fresh"
    spec, job = _plan_file_run(run)
    r = recal.Recalibrator(job, spec, window_s=1e9, search=False)
    caplog.set_level(logging.WARNING)
    ctx = r.context
    assert ctx.exchange is not None and isinstance(ctx.simulator.bandwidth, recal.Unpriced)
    predicted = ctx.simulator.compute_breakdown(ctx.request.workload, ctx.config)["cpu"]
    slow = 1.5  # the ranks' compute, measured: 1.5x the profile's prediction
    rng = np.random.default_rng(0)
    recs = [
        ProgressRecord(k, 100.0 + 0.1 * k, 0.1, 16, "c0",
                       tuple(slow * predicted * float(rng.lognormal(0, 0.02)) for _ in range(2)),
                       0.004 * float(rng.lognormal(0, 0.05)))
        for k in range(1, WARMUP_STEPS + 9)
    ]  # fmt: skip
    r.finish(recs, 1.0, 0.0)
    assert r.disabled is None
    assert not [m for m in caplog.messages if "is off" in m]
    assert any("compute factors only" in m for m in caplog.messages)
    state = json.loads((run / recal.RUN_FILE).read_text())
    (key,) = [k for k, f in state["calibration"]["compute"].items() if f["windows"] == 1]
    assert state["calibration"]["compute"][key]["scale"] == pytest.approx(slow, rel=0.05)
    assert state["calibration"]["comm"] == {}  # no estimate of the exchange to correct
    assert state["exchange"]["estimated"] is False
    assert "compute only" in state["exchange"]["factors"]
    assert state["exchange"]["measured_s"] == pytest.approx(0.004, rel=0.1)
    # the projection keeps the measured iteration (0.1 s), communication included
    assert state["projection"]["t_iter_s"] == pytest.approx(0.1)
    assert state["projection"]["iterations"] == 40 - (WARMUP_STEPS + 8)
    stored = calib.load_stored("dlrm")  # kept for the model's next plans, compute only
    assert stored is not None and stored.comm == {} and key in stored.compute

    # a script of yours reports iteration times alone: projected, no factor moved
    run2 = data_dir / "runs" / "script"
    spec2, job2 = _plan_file_run(run2)
    r2 = recal.Recalibrator(job2, spec2, window_s=1e9, search=False, context=ctx)
    times = [ProgressRecord(k, 100.0 + 0.2 * k, 0.2, 16, "c0") for k in range(1, WARMUP_STEPS + 6)]
    r2.finish(times, 1.0, 0.0)
    assert r2.disabled is None
    state2 = json.loads((run2 / recal.RUN_FILE).read_text())
    assert not [k for k, f in state2["calibration"]["compute"].items() if f["windows"]]
    assert "iteration times alone" in state2["exchange"]["factors"]
    assert state2["projection"]["t_iter_s"] == pytest.approx(0.2)


@pytest.mark.slow
def test_srifty_train_of_a_plan_file_on_a_fresh_install_writes_calibration_json(
    fresh_install_run: dict[str, Any],
) -> None:
    """End to end, as the quick start on a fresh clone (``fresh_install_run``): profile,
    then train a plan file on local workers with the built-in worker (it records each
    rank's compute and the exchange); no probes, no bandwidth model. The monitor's
    recalibration stays on: the run folder's calibration.json holds the compute factor the
    job measured."""
    report, run = fresh_install_run["report"], fresh_install_run["run"]
    assert report.iterations == 16
    warned = fresh_install_run["warnings"]
    assert not [m for m in warned if "recalibration" in m and "is off" in m]
    state = json.loads((run / recal.RUN_FILE).read_text())
    observed = {k: f for k, f in state["calibration"]["compute"].items() if f["windows"] > 0}
    assert observed and all(f["scale"] > 0 for f in observed.values())
    assert state["exchange"]["estimated"] is False and state["exchange"]["measured_s"] > 0
