"""The monitor switches only when even the optimistic throughput breaks a limit."""

from __future__ import annotations

import pytest

from srifty_core.errors import ConfigError
from srifty_core.jobs.monitor import Limits, Stall, StallWatch, decide, windowed_throughput
from srifty_core.runs.progress import ProgressRecord

B = 100
LIMITS = Limits(iterations=1000, global_batch=B, time_limit_s=1000.0)  # needs 100 samples/s


def records(rates: list[float], start: float = 0.0) -> list[ProgressRecord]:
    out, t = [], start
    for i, rate in enumerate(rates, 1):
        t += B / rate
        out.append(ProgressRecord(i, t, B / rate, B, "c0"))
    return out


def test_window_statistics() -> None:
    recs = records([100.0, 200.0, 100.0, 200.0])
    w = windowed_throughput(recs, now=recs[-1].wall_time, window_s=300)
    assert w is not None and w.steps == 4 and w.throughput == pytest.approx(150.0)
    lo, hi = w.bounds()
    assert lo < 150 < hi and hi - 150 == pytest.approx(1.96 * w.std / 2)
    assert windowed_throughput(recs, now=recs[-1].wall_time, window_s=0.4).steps == 1  # type: ignore[union-attr]
    assert windowed_throughput([], now=0.0) is None


def test_on_track_continues_and_a_sustained_slowdown_replans() -> None:
    fine = records([120.0] * 60)
    d = decide(fine, LIMITS, now=fine[-1].wall_time, started_at=0.0)
    assert d.action == "continue" and "on track" in d.reason
    assert d.projected_time_s is not None and d.projected_time_s < 1000
    slow = records([60.0] * 60)
    d = decide(slow, LIMITS, now=slow[-1].wall_time, started_at=0.0)
    assert d.replan and "1000 s limit" in d.reason and d.iterations_done == 60


def test_the_optimistic_bound_keeps_a_noisy_job_running() -> None:
    # Mean 100 samples/s projects past the limit; the 95% upper bound (about 116) does not.
    recs = records([120.0] * 20 + [20.0] * 5)
    now = recs[-1].wall_time
    d = decide(recs, LIMITS, now=now, started_at=0.0)
    assert d.action == "continue"
    assert d.window is not None and d.window.throughput == pytest.approx(100.0)
    assert decide(recs, LIMITS, now=now, started_at=0.0, z=0.0).replan  # point estimate


def test_a_transient_slowdown_does_not_thrash() -> None:
    recs = records([120.0] * 200 + [40.0] * 10 + [120.0] * 100)
    decisions = [
        decide(recs[:k], LIMITS, now=recs[k - 1].wall_time, started_at=0.0)
        for k in range(1, len(recs) + 1)
    ]
    assert not any(d.replan for d in decisions)
    # A 10 s window would have switched during the burst: the window is what damps it.
    short = [
        decide(recs[:k], LIMITS, now=recs[k - 1].wall_time, started_at=0.0, window_s=10.0)
        for k in range(1, len(recs) + 1)
    ]
    assert any(d.replan for d in short)


def test_budget_projection_and_preemption() -> None:
    priced = Limits(iterations=1000, global_batch=B, budget_usd=1.0, usd_per_hour=10.0)
    recs = records([120.0] * 30)  # 1000 x 100 / 120 s at $10/h is about $2.3
    d = decide(recs, priced, now=recs[-1].wall_time, started_at=0.0)
    assert d.replan and "budget" in d.reason and d.projected_cost_usd is not None
    d = decide(recs, LIMITS, now=recs[-1].wall_time, started_at=0.0, preempted=["p3.8xlarge"])
    assert d.replan and d.depleted == ("p3.8xlarge",) and "preempted" in d.reason
    assert decide([], LIMITS, now=1.0, started_at=0.0).action == "continue"


def test_a_stall_window_is_set_by_the_step_time_and_progress_resets_it() -> None:
    """No step for longer than the window (20 step times, at least min_s, twice the
    longest step; before the first step, startup_s) is a hung job; each new step restarts
    the clock, so a healthy job that runs many windows long never is."""
    rule = Stall(steps=20, min_s=10, startup_s=300)
    watch = StallWatch(rule, started_at=1000.0)
    assert watch.window_s()[0] == 300 and watch.hung(1299.0) is None
    assert watch.hung(1301.0) is not None  # nothing logged in the first 301 s
    t = 1000.0
    for i in range(1, 401):  # 400 steps of 2 s: 800 s, 40 windows of 40 s
        t += 2.0
        watch.see([ProgressRecord(i, t, 2.0, B, "c0")], now=t)
        assert watch.hung(t + 39.0) is None
    assert watch.window_s()[0] == 40.0  # 20 steps of 2 s
    reason = watch.hung(t + 41.0)
    assert reason is not None and reason.startswith("no training step for 41 s")
    watch.see([ProgressRecord(401, t + 30, 30.0, B, "c0")], now=t + 30)  # a checkpoint: 30 s
    assert watch.window_s()[0] == 60.0 and watch.hung(t + 30 + 59) is None
    fast = StallWatch(rule, started_at=0.0)
    fast.see([ProgressRecord(1, 0.1, 0.1, B, "c0")], now=0.1)
    assert fast.window_s()[0] == 10  # 20 steps of 0.1 s is under min_s
    planned = StallWatch(rule, started_at=0.0, planned_step_s=1.5)
    planned.see([ProgressRecord(1, 0.1, 0.1, B, "c0")], now=0.1)
    assert planned.window_s()[0] == 30  # the plan's step time when it is the longer
    vms = StallWatch(rule, started_at=0.0, startup=False)  # VMs: their join timeout rules
    assert vms.hung(10_000.0) is None
    vms.see([ProgressRecord(1, 10_000.0, 0.1, B, "c0")], now=10_000.0)
    assert vms.hung(10_011.0) is not None


def test_a_bad_stall_rule_is_named() -> None:
    with pytest.raises(ConfigError, match="min_s"):
        Stall(min_s=0)
