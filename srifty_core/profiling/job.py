"""The profiling job: profile, store, log to MLflow. Called by ``srifty profile`` and by the
``srifty_profile_model`` DAG."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from srifty_core.outputs import Output
from srifty_core.profiling.config import ProfilerConfig, Progress
from srifty_core.profiling.profile import ComputeProfile
from srifty_core.profiling.profiler import profile_model
from srifty_core.profiling.report import log_profile
from srifty_core.profiling.store import ProfileStore


@dataclass(frozen=True, slots=True)
class ProfileJobResult:
    profile: ComputeProfile
    path: Path
    """Where the profile went (``-`` for standard output)."""
    mlflow_run_id: str | None


def run_profile_job(
    model: str,
    size: str,
    config: ProfilerConfig,
    *,
    out: Path | Output | None = None,
    log_to_mlflow: bool = True,
    progress: Progress | None = None,
) -> ProfileJobResult:
    """Profile ``model``/``size`` on ``config.device``; write it to ``out`` (a path, or an
    ``outputs.Output``: a checked path or standard output) or the profile store
    (atomically) and log it to MLflow. Nothing is written if profiling fails."""
    profile = profile_model(model, size, config, progress)
    if isinstance(out, Output):
        out.write(profile.to_json())
        path = out.path or Path("-")
    else:
        path = ProfileStore.save_to(profile, out) if out else ProfileStore().save(profile)
    run_id = None
    if log_to_mlflow:
        run_id = log_profile(profile)
    return ProfileJobResult(profile, path, run_id)
