"""The sweep summary: median bus bandwidth per (phase, world size, size, concurrency,
collective), with spread; the sustained-transfer probe's rows come last, marked."""

from __future__ import annotations

from typing import TYPE_CHECKING

from srifty_core.noise import NOISY_CV, NOISY_RETRIES
from srifty_core.probing.config import ALL_REDUCE, format_size
from srifty_core.probing.schema import PHASE_BURST, PHASE_SUSTAINED

if TYPE_CHECKING:
    import pandas as pd


def format_rate(bytes_per_s: float) -> str:
    """``1.23 GB/s`` (decimal units, as nccl-tests prints bandwidth)."""
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.3g} {unit}"
    return f"{bytes_per_s:.3g} B/s"


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (phase, world_size, buffer_bytes, concurrent, collective) over the ok rows of
    ``df``: samples, allocations, median/p10/p90 busbw and time, and spread = (p90 - p10) /
    median. The spread covers repeats and allocations together. Grid rows (``burst``) sort
    before the sustained probe's."""
    import pandas as pd

    ok = df[df["status"] == "ok"]
    if "phase" not in ok.columns:
        ok = ok.assign(phase=PHASE_BURST)
    if "collective" not in ok.columns:
        ok = ok.assign(collective=ALL_REDUCE)
    keys = ["phase", "world_size", "buffer_bytes", "concurrent", "collective"]
    if ok.empty:
        return pd.DataFrame(
            columns=[*keys, "samples", "allocations", "busbw_median", "busbw_p10", "busbw_p90"]
        )
    g = ok.groupby(keys)
    out = pd.DataFrame(
        {
            "samples": g["busbw"].size(),
            "allocations": g["allocation_id"].nunique(),
            "time_median_s": g["time_s"].median(),
            "busbw_median": g["busbw"].median(),
            "busbw_p10": g["busbw"].quantile(0.1),
            "busbw_p90": g["busbw"].quantile(0.9),
        }
    ).reset_index()
    out["spread"] = (out["busbw_p90"] - out["busbw_p10"]) / out["busbw_median"]
    result: pd.DataFrame = out.sort_values(keys).reset_index(drop=True)
    return result


def format_summary(summary: pd.DataFrame) -> str:
    """A plain-text table of ``summarize``'s output."""
    head = (
        f"{'world':>5} {'size':>7} {'conc':>4} {'n':>4} {'allocs':>6} "
        f"{'time p50':>10} {'busbw p50':>11} {'p10 .. p90':>23} {'spread':>7} collective"
    )
    lines = [head, "-" * len(head)]
    for r in summary.to_dict("records"):
        band = f"{format_rate(float(r['busbw_p10']))} .. {format_rate(float(r['busbw_p90']))}"
        lines.append(
            f"{int(r['world_size']):>5} {format_size(int(r['buffer_bytes'])):>7} "
            f"{int(r['concurrent']):>4} {int(r['samples']):>4} {int(r['allocations']):>6} "
            f"{float(r['time_median_s']) * 1e3:>8.3f}ms "
            f"{format_rate(float(r['busbw_median'])):>11} {band:>23} {float(r['spread']):>6.0%}"
            f" {r.get('collective', ALL_REDUCE)}"
            + ("  sustained" if r.get("phase") == PHASE_SUSTAINED else "")
        )
    return "\n".join(lines)


def noisy_points(df: pd.DataFrame) -> list[str]:
    """One warning line per grid point whose kept repeats still spread more than the bound
    after the re-measurements (rows flagged ``noisy``): where, its world size, buffer size
    and concurrency, and the spread (std/mean)."""
    if "noisy" not in df.columns or df.empty:
        return []
    flagged = df[(df["status"] == "ok") & (df["noisy"].fillna(False).astype(bool))]
    if "collective" not in flagged.columns:
        flagged = flagged.assign(collective=ALL_REDUCE)
    keys = ["allocation_slot", "world_size", "buffer_bytes", "concurrent"]
    lines = []
    for _, g in flagged.groupby([*keys, "collective"], sort=True):
        slot, n, size, conc = (int(g[k].iloc[0]) for k in keys)
        what = str(g["collective"].iloc[0])
        cv = float(g["spread"].max())
        lines.append(
            f"warning: noisy probe: world size {n}, {format_size(size)} x {conc} {what} "
            f"(slot {slot}, "
            f"{g['allocation_id'].iloc[0]}): repeats spread {cv:.0%} (std/mean, over "
            f"{NOISY_CV:.0%}) after {NOISY_RETRIES} re-measurements; flagged noisy in the store"
        )
    return lines
