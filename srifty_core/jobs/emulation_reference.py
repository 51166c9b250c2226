"""The reference an emulated cloud profile starts from: a stored profile of the request's
model, size and training settings (``reference_profile``: a measured GPU profile first,
then the CPU's, then an emulated one), or one measured now on this host's CPU with a
small budget (``ensure_reference``).

Light: torch is imported only to make a CPU reference profile.
"""

from __future__ import annotations

from pathlib import Path

from srifty_core.cloud.emulated.world import PROVIDER_NAME
from srifty_core.jobs.cloud_request import CloudProfileRequest
from srifty_core.profiling.profile import ComputeProfile
from srifty_core.profiling.store import ProfileNotFoundError, ProfileStore, profile_hint

REFERENCE_PROBES = 3
REFERENCE_REPEATS = 3
REFERENCE_MAX_BATCH = 64
"""The CPU reference profile's budget (``ensure_reference``): what the emulation needs of
it is the network's memory footprint, its t(B) shape and its gradient buckets."""


def is_emulated(p: ComputeProfile) -> bool:
    """Whether ``p`` was emulated (``ec2-emulated``), not measured."""
    return p.device_name.endswith(f", {PROVIDER_NAME})")


def reference_candidates(
    request: CloudProfileRequest, store: ProfileStore | None = None
) -> list[tuple[Path, ComputeProfile]]:
    """Stored profiles of the request's model, size and training settings (any device),
    best reference first: measured on a GPU, measured on a CPU, emulated."""
    store = store or ProfileStore()
    folder = store.path(request.model, request.size, "cpu", request.settings).parent
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            p = ComputeProfile.from_json(path.read_text(encoding="utf-8"))
        except (ValueError, KeyError, TypeError):
            continue
        if p.settings == request.settings and p.size == request.size:
            found.append((path, p))
    return sorted(found, key=lambda x: (is_emulated(x[1]), x[1].device_type == "cpu"))


def reference_profile(
    request: CloudProfileRequest, store: ProfileStore | None = None
) -> tuple[Path, ComputeProfile]:
    """The best stored reference (``reference_candidates``); ``ProfileNotFoundError`` with
    the command that makes one when there is none."""
    found = reference_candidates(request, store)
    if not found:
        s = request.settings
        raise ProfileNotFoundError(
            f"no profile of {request.model}/{request.size}"
            f"{'' if s.is_default else ' (' + s.label() + ')'} to emulate other GPUs from; "
            + profile_hint(request.model, request.size, "cpu", s)
        )
    return found[0]


def ensure_reference(
    request: CloudProfileRequest, *, make: bool = True, store: ProfileStore | None = None
) -> tuple[Path, ComputeProfile, bool]:
    """The reference an emulated profile starts from: the best stored one, else (``make``)
    one measured now on this host's CPU with a small budget (``REFERENCE_*``) and stored;
    returns (path, profile, made)."""
    try:
        path, p = reference_profile(request, store)
        return path, p, False
    except ProfileNotFoundError:
        if not make:
            raise
    from srifty_core.profiling.config import ProfilerConfig
    from srifty_core.profiling.job import run_profile_job

    config = ProfilerConfig(
        device="cpu",
        probes=REFERENCE_PROBES,
        repeats=REFERENCE_REPEATS,
        refine=0,
        share_host=1,
        max_batch=min(request.max_batch or REFERENCE_MAX_BATCH, REFERENCE_MAX_BATCH),
        settings=request.settings,
    )
    out = (store or ProfileStore()).path(request.model, request.size, "cpu", request.settings)
    result = run_profile_job(request.model, request.size, config, out=out, log_to_mlflow=False)
    return result.path, result.profile, True
