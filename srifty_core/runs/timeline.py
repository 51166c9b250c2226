"""The timeline of a training job: iterations done against time, one colour per
configuration, with the re-plans and their reasons marked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from srifty_core.plotting import pyplot, save_figure
from srifty_core.runs.progress import ProgressRecord


def plot_timeline(
    records: Sequence[ProgressRecord],
    path: Path,
    *,
    target: int | None = None,
    decisions: Sequence[Mapping[str, Any]] = (),
    time_limit_s: float | None = None,
) -> Path:
    """Write the plot to ``path`` (PNG) and return it. Time 0 is the start of the first
    logged step; gaps between configurations are the re-plan, launch and restart."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    if records:
        t0 = min(r.wall_time - r.step_s for r in records)
        configs: list[str] = []
        for r in records:
            if r.config_id not in configs:
                configs.append(r.config_id)
        for k, cid in enumerate(configs):
            pts = [(r.wall_time - t0, r.iteration) for r in records if r.config_id == cid]
            ax.plot(*zip(*pts, strict=True), ".-", ms=3, color=f"C{k}", label=cid)
        ends = [d for d in decisions if d.get("status") == "replan"]
        for d in ends:
            at = float(d.get("at", 0.0)) - t0
            ax.axvline(at, color="tab:red", ls=":", lw=1)
            ax.annotate(
                str(d.get("reason", "re-plan"))[:48], (at, 0), rotation=90, fontsize=7,
                va="bottom", ha="right", color="tab:red",
            )  # fmt: skip
    if target:
        ax.axhline(target, color="gray", ls="--", lw=1, label=f"target {target}")
    if time_limit_s:
        ax.axvline(time_limit_s, color="black", ls="--", lw=1, label="time limit")
    ax.set_xlabel("seconds since the first step")
    ax.set_ylabel("iterations done")
    ax.set_title("training timeline (colour = configuration)")
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)
