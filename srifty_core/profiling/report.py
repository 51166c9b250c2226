"""Views of a compute profile: a text summary, a plot, and its MLflow run (recorded
through ``tracking.runs``)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from srifty_core.plotting import pyplot, save_figure
from srifty_core.probing.config import format_size
from srifty_core.profiling.profile import ComputeProfile, mape
from srifty_core.tracking.runs import log_run, srifty_tags

EXPERIMENT = "srifty-compute-profiles"


def _per_step(p: ComputeProfile) -> list[str]:
    """What a training step adds whatever its batch, where the profile measured it."""
    parts = []
    if p.copy_bytes_per_s > 0:
        parts.append(
            f"DDP pass over the gradients {p.ddp_copy_s() * 1e3:.2f} ms "
            f"({p.copy_bytes_per_s / 1e9:.1f} GB/s)"
        )
    if p.ddp_overhead:
        parts.append(
            "DDP's own work (measured) "
            + ", ".join(f"{t * 1e3:.2f} ms with {k} worker(s)" for k, t in p.ddp_overhead)
        )
    if p.optimizer_step_s > 0:
        parts.append(f"optimizer step {p.optimizer_step_s * 1e3:.2f} ms")
    return [f"per step, any batch: {'; '.join(parts)}"] if parts else []


def summary_text(p: ComputeProfile) -> str:
    def pieces(fit: object) -> str:
        bp = getattr(fit, "breakpoints", ())
        return f"{len(bp) + 1} piece(s)" + (
            f", breakpoint(s) at B={', '.join(f'{b:g}' for b in bp)}" if bp else ""
        )

    ran = (
        f" (ran as {p.effective_precision})"
        if p.effective_precision and p.effective_precision != p.settings.precision
        else ""
    )
    bound = "" if p.b_max_limit == "memory" else f", bounded by {p.b_max_limit}"
    lines = [
        f"{p.model}/{p.size} on {p.device_type} ({p.device_name}), {p.probe_mode}, "
        f"{p.fw.repeats} repeats, {p.threads} thread(s)",
        f"trained as: {p.settings.label()}{ran}",
        f"B_max {p.b_max}{bound} (cap {p.memory_cap_bytes / 2**20:.0f} MiB; "
        f"{format_size(round(p.memory_per_sample_bytes))}/sample"
        f" + {p.memory_fixed_bytes / 2**20:.0f} MiB)",
        *(f"warning: noisy measurement: {n}" for n in p.noisy),
        f"parameters {p.n_parameters:,} ({p.gradient_bytes / 2**20:.1f} MiB of gradients) in "
        f"{len(p.buckets)} DDP bucket(s)",
        f"forward: {pieces(p.fw_fit)}; backward: {pieces(p.bw_fit)}",
        *_per_step(p),
        "",
        f"{'batch':>6} {'fw ms':>9} {'+-':>7} {'fit':>9} {'bw ms':>9} {'+-':>7} {'fit':>9}",
    ]
    for i, b in enumerate(p.fw.batch_sizes):
        lines.append(
            f"{b:>6} {p.fw.mean_s[i] * 1e3:>9.2f} {p.fw.std_s[i] * 1e3:>7.2f} "
            f"{p.fw_fit.at(b) * 1e3:>9.2f} {p.bw.mean_s[i] * 1e3:>9.2f} "
            f"{p.bw.std_s[i] * 1e3:>7.2f} {p.bw_fit.at(b) * 1e3:>9.2f}"
        )
    lines.append("")
    lines.append(
        "buckets (reduction order): "
        + ", ".join(f"{b.size_bytes / 2**20:.2f} MiB@{b.ready_fraction:.2f}" for b in p.buckets)
    )
    return "\n".join(lines)


def plot_profile(p: ComputeProfile, path: Path) -> Path:
    """Latency vs batch (measured mean +- std, fitted pieces, breakpoints) and the gradient
    schedule (cumulative bucket bytes vs ready fraction), as a PNG."""
    plt = pyplot()

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = np.linspace(min(p.fw.batch_sizes), p.b_max, 200)
    for stats, fit, label, color in (
        (p.fw, p.fw_fit, "forward", "tab:blue"),
        (p.bw, p.bw_fit, "backward", "tab:orange"),
    ):
        ax.errorbar(
            stats.batch_sizes,
            np.asarray(stats.mean_s) * 1e3,
            yerr=np.asarray(stats.std_s) * 1e3,
            fmt="o",
            color=color,
            capsize=3,
            label=f"{label} measured",
        )
        ax.plot(xs, fit(xs) * 1e3, "-", color=color, alpha=0.7, label=f"{label} fit")
        for bp in fit.breakpoints:
            ax.axvline(bp, color=color, ls=":", alpha=0.6)
    ax.set_xlabel("batch size")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"{p.model}/{p.size} on {p.device_type}: t(B), {p.probe_mode}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    sizes = np.concatenate([[0.0], np.cumsum([b.size_bytes for b in p.buckets]) / 2**20])
    ready = [0.0, *(b.ready_fraction for b in p.buckets)]
    ax2.step(ready, sizes, where="post", color="tab:green")
    ax2.plot(ready[1:], sizes[1:], "o", color="tab:green")
    ax2.set_xlim(0, 1.02)
    ax2.set_ylim(bottom=0)
    ax2.set_xlabel("ready time (fraction of backward pass)")
    ax2.set_ylabel("gradient bytes ready (MiB, cumulative)")
    ax2.set_title(f"{len(p.buckets)} DDP bucket(s), {p.gradient_bytes / 2**20:.1f} MiB")
    ax2.grid(alpha=0.3)
    return save_figure(fig, path)


def log_profile(p: ComputeProfile, tracking_uri: str | None = None) -> str:
    """Log the profile to MLflow: parameters, fit metrics, the JSON and the plot. Returns the
    run id."""
    bs = np.asarray(p.fw.batch_sizes)
    with tempfile.TemporaryDirectory() as tmp:
        j = Path(tmp) / "profile.json"
        j.write_text(p.to_json())
        plot = plot_profile(p, Path(tmp) / "latency_vs_batch.png")
        return log_run(
            EXPERIMENT,
            f"{p.model}-{p.size}-{p.device_type}",
            tags=srifty_tags(kind="compute-profile", model=p.model, device_type=p.device_type),
            params={
                "model": p.model,
                "size": p.size,
                "device_type": p.device_type,
                "device_name": p.device_name,
                "probe_mode": p.probe_mode,
                "batch_sizes": ",".join(map(str, p.fw.batch_sizes)),
                "repeats": p.fw.repeats,
                "threads": p.threads,
                "bucket_cap_bytes": p.bucket_cap_bytes,
                "torch_version": p.torch_version,
            },
            metrics={
                "b_max": p.b_max,
                "memory_per_sample_mib": p.memory_per_sample_bytes / 2**20,
                "n_parameters": p.n_parameters,
                "gradient_mib": p.gradient_bytes / 2**20,
                "n_buckets": len(p.buckets),
                "fw_pieces": p.fw_fit.pieces,
                "bw_pieces": p.bw_fit.pieces,
                "fw_fit_mape_pct": mape(p.fw_fit(bs), p.fw.mean_s),
                "bw_fit_mape_pct": mape(p.bw_fit(bs), p.bw.mean_s),
                "t_iter_at_bmax_s": float(p.t_iter(p.b_max)),
                "ddp_copy_pass_s": p.ddp_copy_s(),
                "ddp_overhead_s": dict(p.ddp_overhead).get(1, 0.0),
                "optimizer_step_s": p.optimizer_step_s,
            },
            files=[j, plot],
            tracking_uri=tracking_uri,
        )
