"""The cost/time picture of a plan: every configuration evaluated, the frontier, the
choice and the limits."""

from __future__ import annotations

from pathlib import Path

from srifty_core.planner.result import PlanResult
from srifty_core.plotting import pyplot, save_figure


def plot_frontier(result: PlanResult, path: Path) -> Path:
    plt = pyplot()

    r = result.request
    fig, ax = plt.subplots(figsize=(7, 4.6))
    ok = [c for c in result.candidates if c.feasible]
    bad = [c for c in result.candidates if not c.feasible]
    ax.scatter(
        [c.time_s for c in bad],
        [c.cost_usd for c in bad],
        s=8,
        c="lightgray",
        label="breaks a limit",
    )
    ax.scatter(
        [c.time_s for c in ok],
        [c.cost_usd for c in ok],
        s=10,
        c="tab:blue",
        alpha=0.6,
        label="feasible",
    )
    f = result.frontier
    ax.plot(
        [c.time_s for c in f],
        [c.cost_usd for c in f],
        "-",
        c="tab:orange",
        label="cost/time frontier",
    )
    if result.best is not None:
        b = result.best
        ax.scatter(
            [b.time_s],
            [b.cost_usd],
            marker="*",
            s=220,
            c="tab:red",
            zorder=5,
            label=f"chosen: {b.label}",
        )
    if r.time_limit_s != float("inf"):
        ax.axvline(r.time_limit_s, ls="--", c="gray", lw=1)
    if r.budget_usd != float("inf"):
        ax.axhline(r.budget_usd, ls="--", c="gray", lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("predicted training time (s)")
    ax.set_ylabel("predicted cost ($)")
    ax.set_title(
        f"{r.workload.model}: B={r.global_batch}, {r.iterations} iterations, "
        f"minimize {r.objective.value} ({result.evaluated} configurations, {result.method})",
        fontsize=9,
    )
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3, which="both")
    return save_figure(fig, path)
