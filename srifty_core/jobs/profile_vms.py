"""Profiling in the cloud: one VM per offered instance type runs the profiler on its GPU,
and the compute profile comes back into the profile store. This module holds the profile
step (``profile_on_vm``) and all the steps in one process (``profile_in_cloud``).

Steps (the ``srifty_profile_model`` DAG runs each as a task; ``profile_in_cloud`` runs
them in one process for ``srifty profile --provider``):

1. ``cloud_request.check_cloud_request``: the provider, the types (catalog names, closest
   ones on a typo), the market and the EC2 settings, before anything is launched.
2. ``profiler_vm.provision_profiler_vm`` (setup): launch one VM of the type (on-demand
   unless ``market`` says spot). On ``ec2`` the VM installs the worker wheel the training
   path installs (``jobs.artifact.worker_wheel``: the deployment's, else this source's,
   uploaded to the run storage) and runs ``vm_script.vm_script``: ``srifty profile --model
   M --size S --device cuda --no-mlflow`` with the training settings and the probe budget,
   then ``python -m srifty_core.jobs.vm_script finish``, which writes ``profile.json`` (on
   success) and ``exit.json`` (the profiler's exit code and its last lines) into the VM's
   folder on the run storage, then shuts the VM down (launched to terminate on shutdown:
   it stops billing by itself).
3. ``profile_on_vm``: on ``ec2``, ``collect_profile`` waits (``timeout_s``, polling every
   ``poll_s``) for that ``profile.json``, checks it is the requested model, size and
   settings, and writes it into the profile store (atomically, keyed as local profiles
   are). On ``ec2-emulated`` nothing runs: ``EmulatedProvider.profile`` emulates what the
   profiler would measure on that GPU from a reference profile of the same model and
   settings in the store (``emulation_reference``: a measured GPU profile first, then the
   CPU's, then an emulated one; ``ensure_reference`` can make a CPU one here first).
4. ``profiler_vm.release`` (teardown): give the VM back and return its bill (``VMBill``: VM
   seconds, the per-second cost at the catalog's price with EC2's one-minute minimum).

The run's report is ``profile_summary``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any

from srifty_core.cloud import provider_class
from srifty_core.cloud.base import Provider, ProviderError
from srifty_core.errors import ConfigError, SriftyError
from srifty_core.jobs.cloud_request import CloudProfileRequest, check_cloud_request
from srifty_core.jobs.emulation_reference import ensure_reference, reference_profile
from srifty_core.jobs.profile_summary import summarize
from srifty_core.jobs.profiler_vm import (
    ProfilerVM,
    ec2_provider,
    emulated_world,
    load_vm,
    provision_profiler_vm,
    release,
)
from srifty_core.jobs.vm_script import EXIT_FILE, PROFILE_FILE, VM_LOG
from srifty_core.profiling.profile import ComputeProfile
from srifty_core.profiling.store import ProfileStore
from srifty_core.runs import store as run_store
from srifty_core.workloads import model_key

COLLECT_TIMEOUT_S = 3600.0
"""How long ``collect_profile`` waits for a VM's profile by default: the wheel's install
(``cloud.ec2.user_data.INSTALL_S``) and a full-size model's profile."""
POLL_S = 10.0


class CollectTimeout(ProviderError):
    """The VM's profile did not arrive in the run storage in time."""


@dataclass(frozen=True, slots=True)
class CloudProfileResult:
    instance_type: str
    device_type: str
    b_max: int
    b_max_limit: str
    path: str
    reference: str = ""
    """The profile the emulation started from (``ec2-emulated``)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def profile_on_vm(
    vm: ProfilerVM | Mapping[str, Any],
    request: CloudProfileRequest,
    *,
    store: ProfileStore | None = None,
    timeout_s: float = COLLECT_TIMEOUT_S,
    poll_s: float = POLL_S,
) -> CloudProfileResult:
    """The profile step: ``ec2``: ``collect_profile`` (the VM profiles by itself);
    ``ec2-emulated``: ``EmulatedProvider.profile`` from the stored reference
    (``reference_profile``), on the VM's world; the profile goes into the store."""
    v = load_vm(vm)
    store = store or ProfileStore()
    if not provider_class(v.provider).simulated:
        return collect_profile(v, request, store=store, timeout_s=timeout_s, poll_s=poll_s)
    ref_path, ref = reference_profile(request, store)
    p, _ = emulated_world(v)
    profile = p.profile(
        v.instance_type,
        ref,
        probes=request.probes,
        repeats=request.repeats,
        refine=request.refine,
        max_batch=request.max_batch,
        vms=1,  # this VM
    )
    replace(v, clock=p.now().isoformat()).save()
    profile = _as_measured_on_gpu(profile, request)
    path = store.save(profile)
    return CloudProfileResult(
        v.instance_type, profile.device_type, profile.b_max, profile.b_max_limit, str(path),
        str(ref_path),
    )  # fmt: skip


def _as_measured_on_gpu(profile: ComputeProfile, request: CloudProfileRequest) -> ComputeProfile:
    """What ``EmulatedProvider.profile`` carries over from its reference but a profile
    taken on the GPU would not say: the reference host's bound on B_max, its noise
    warnings, its host-sharing and DDP measurements (a GPU per rank: modelled from the
    copy bandwidth), and the precision a CPU computes in."""
    ceiling = request.max_batch
    limit = f"max_batch {ceiling}" if ceiling is not None and profile.b_max >= ceiling else "memory"
    return replace(
        profile,
        b_max_limit=limit,
        noisy=(),
        shared_slowdown=(),
        ddp_overhead=(),
        effective_precision=request.settings.precision,
    )


def _read_json(location: str) -> dict[str, Any] | None:
    text = run_store.read_text(location)
    return None if text is None else dict(json.loads(text))


def collect_profile(
    vm: ProfilerVM | Mapping[str, Any],
    request: CloudProfileRequest,
    *,
    store: ProfileStore | None = None,
    timeout_s: float = COLLECT_TIMEOUT_S,
    poll_s: float = POLL_S,
    provider: Provider | None = None,
) -> CloudProfileResult:
    """Wait for the EC2 VM's ``profile.json`` in its run-storage folder and write it into
    the profile store. Fails when the VM's profiler exited non-zero (its last lines in the
    message), when the VM ended without a profile, or after ``timeout_s``
    (``CollectTimeout``)."""
    v = load_vm(vm)
    store = store or ProfileStore()
    where = f"{v.instance_type} ({v.allocation_id})"
    prof_uri = str(run_store.join(v.run_dir, PROFILE_FILE))
    exit_uri = str(run_store.join(v.run_dir, EXIT_FILE))
    cloud = provider or ec2_provider(v)
    deadline = time.monotonic() + timeout_s
    while True:
        text = run_store.read_text(prof_uri)
        if text is not None:
            profile = ComputeProfile.from_json(text)
            _check_collected(profile, request, where)
            path = store.save(profile)
            return CloudProfileResult(
                v.instance_type, profile.device_type, profile.b_max, profile.b_max_limit,
                str(path),
            )  # fmt: skip
        done = _read_json(exit_uri)
        if done is not None and int(done.get("code", 1)) != 0:
            raise ProviderError(
                f"the profiler on {where} exited with code {done.get('code')}: "
                f"{done.get('tail', '').strip().splitlines()[-1:] or ['(no output)']}"
                f"; the VM's log: {VM_LOG}, /var/log/srifty-worker.log"
            )
        states = {i.state.value for i in cloud.describe(cloud.get_allocation(v.allocation_id))}
        if states and states <= {"terminated", "interrupted"}:
            if run_store.read_text(prof_uri) is None:
                raise ProviderError(
                    f"the VM {where} ended ({', '.join(sorted(states))}) without writing {prof_uri}"
                )
            continue
        if time.monotonic() > deadline:
            raise CollectTimeout(
                f"no profile from {where} at {prof_uri} after {timeout_s:.0f} s "
                f"(collect_timeout_s); the VM's log: /var/log/srifty-worker.log"
            )
        time.sleep(poll_s)


def _check_collected(profile: ComputeProfile, request: CloudProfileRequest, where: str) -> None:
    if model_key(profile.model) != model_key(request.model) or profile.size != request.size:
        raise ConfigError(
            f"the profile from {where} is of {profile.model}/{profile.size}, not "
            f"{request.model}/{request.size}"
        )
    if profile.settings != request.settings:
        raise ConfigError(
            f"the profile from {where} was taken with {profile.settings.label()}, not "
            f"{request.settings.label()}"
        )


def profile_in_cloud(
    provider: str,
    instance_types: Sequence[str],
    request: CloudProfileRequest,
    *,
    market: str = "on-demand",
    region: str = "us-east-1",
    ec2: Mapping[str, Any] | None = None,
    make_reference: bool = True,
    seed: int = 0,
    timeout_s: float = COLLECT_TIMEOUT_S,
    poll_s: float = POLL_S,
) -> dict[str, Any]:
    """The DAG's steps in one process (``srifty profile --provider``): check, (emulated) the
    reference, then per type provision, profile, release (always); the summary. A type
    whose profile failed is in ``summary["failed"]`` with its error under ``errors``."""
    names = check_cloud_request(
        provider, instance_types, market=market, region=region, ec2=ec2, model=request.model
    )
    if provider_class(provider).simulated:
        ensure_reference(request, make=make_reference)
    key = f"cli-{datetime.now(UTC):%Y%m%dT%H%M%S}"
    rows, errors = [], {}
    for name in names:
        vm = provision_profiler_vm(
            provider, name, request, market=market, region=region, ec2=ec2, key=key, seed=seed
        )
        result = None
        try:
            result = profile_on_vm(vm, request, timeout_s=timeout_s, poll_s=poll_s).to_dict()
        except SriftyError as exc:
            errors[name] = str(exc)
        finally:
            bill = release(vm)
        rows.append({**bill.to_dict(), "profile": result})
    return {**summarize(rows), "errors": errors}
