"""Profiling in the cloud: one VM per offered instance type runs the profiler on its GPU,
and the compute profile comes back into the profile store.

Steps (the ``srifty_profile_model`` DAG runs each as a task; ``profile_in_cloud`` runs
them in one process for ``srifty profile --provider``):

1. ``check_cloud_request``: the provider, the types (catalog names, closest ones on a typo),
   the market and the EC2 settings, before anything is launched.
2. ``provision_profiler_vm`` (setup): launch one VM of the type (on-demand unless
   ``market`` says spot). On ``ec2`` the VM installs the worker wheel the training path
   installs (``runtime.artifact.worker_wheel``: the deployment's, else this source's,
   uploaded to the run storage) and runs ``vm_script``: ``srifty profile --model M --size
   S --device cuda --no-mlflow`` with the training settings and the probe budget, then
   ``python -m srifty_core.jobs.profile_vms finish``, which writes ``profile.json`` (on
   success) and ``exit.json`` (the profiler's exit code and its last lines) into the VM's
   folder on the run storage, then shuts the VM down (launched to terminate on shutdown:
   it stops billing by itself).
3. ``profile_on_vm``: on ``ec2``, ``collect_profile`` waits (``timeout_s``, polling every
   ``poll_s``) for that ``profile.json``, checks it is the requested model, size and
   settings, and writes it into the profile store (atomically, keyed as local profiles
   are). On ``ec2-emulated`` nothing runs: ``EmulatedProvider.profile`` emulates what the
   profiler would measure on that GPU from a reference profile of the same model and
   settings in the store (``reference_profile``: a measured GPU profile first, then the
   CPU's, then an emulated one; ``ensure_reference`` can make a CPU one here first).
4. ``release`` (teardown): give the VM back and return its bill (``VMBill``: VM seconds,
   the per-second cost at the catalog's price with EC2's one-minute minimum).

The emulated EC2 keeps its world in the provider object, and the DAG's tasks are separate
processes: like the local provider (``cloud.local``: JSON state under
``<data dir>/cloud/``), each profiling VM's state is a small record,
``<data dir>/cloud/profilers/<id>.json`` (``ProfilerVM``). An emulated VM's record holds
its world's seed, start and clock: a later task rebuilds the world by replaying the
seeded launch and moving the clock on, so the VM's allocation id, zone and billing are the
same in every task. An EC2 VM is found by its allocation tag (``cloud.ec2``); its record
also travels in XCom.

Light: torch is imported only to make a CPU reference profile (``ensure_reference``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from srifty_core import paths
from srifty_core.atomic import write_text_atomic
from srifty_core.catalog import Catalog
from srifty_core.catalog.types import Market
from srifty_core.cloud import provider_class
from srifty_core.cloud.base import Allocation, LaunchRequest, Provider, ProviderError
from srifty_core.cloud.ec2 import EC2Provider
from srifty_core.cloud.emulated.provider import EmulatedProvider
from srifty_core.cloud.emulated.world import PROVIDER_NAME
from srifty_core.errors import ConfigError, FieldError, SriftyError, UnknownNameError
from srifty_core.planner.schema.field_errors import field_error
from srifty_core.planner.schema.job_conf import Ec2Settings
from srifty_core.profiling.budget import DEFAULT_BUDGET, KNOBS
from srifty_core.profiling.profile import ComputeProfile
from srifty_core.profiling.store import ProfileNotFoundError, ProfileStore, profile_hint
from srifty_core.runs import store as run_store
from srifty_core.runtime.artifact import worker_wheel
from srifty_core.training_settings import DEFAULT_SETTINGS, TrainingSettings
from srifty_core.trigger_models import registered_model
from srifty_core.workloads import SIZES, model_key, parse_model

CLOUD_PROVIDERS = ("ec2-emulated", "ec2")
"""Providers a profile can be taken on (``cloud.PROVIDERS`` less ``local``, whose
profiles the DAG's ``device_types`` take on the worker itself)."""
PROFILE_FILE = "profile.json"
EXIT_FILE = "exit.json"
VM_HOME = "/opt/srifty"
VM_PROFILE = f"{VM_HOME}/profile.json"
VM_LOG = f"{VM_HOME}/profile.log"
COLLECT_TIMEOUT_S = 3600.0
"""How long ``collect_profile`` waits for a VM's profile by default: the wheel's install
(``cloud.ec2.user_data.INSTALL_S``) and a full-size model's profile."""
POLL_S = 10.0
REFERENCE_PROBES = 3
REFERENCE_REPEATS = 3
REFERENCE_MAX_BATCH = 64
"""The CPU reference profile's budget (``ensure_reference``): what the emulation needs of
it is the network's memory footprint, its t(B) shape and its gradient buckets."""
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class CollectTimeout(ProviderError):
    """The VM's profile did not arrive in the run storage in time."""


def _safe(text: str) -> str:
    return _SAFE.sub("_", text).strip("._") or "x"


# --------------------------------------------------------------------------- requests
_BUDGET_FIELDS = ("probes", "repeats", "refine", "max_batch")
"""The budget a VM's profiler is given (the rest keeps the profiler's defaults)."""


@dataclass(frozen=True, slots=True)
class CloudProfileRequest:
    """What to profile on each VM: the model reference and size, the training settings,
    and the profiler's budget (``srifty profile``'s ``--probes``, ``--repeats``,
    ``--refine``, ``--max-batch``: none means the GPU's memory bounds B_max), defaults and
    bounds from ``ProfilerBudget``."""

    model: str
    size: str = "small"
    settings: TrainingSettings = DEFAULT_SETTINGS
    probes: int = DEFAULT_BUDGET.probes  # type: ignore[assignment]  # 4: never dense on a VM
    repeats: int = DEFAULT_BUDGET.repeats
    refine: int = DEFAULT_BUDGET.refine
    max_batch: int | None = DEFAULT_BUDGET.max_batch

    def __post_init__(self) -> None:
        try:
            parse_model(self.model)
        except ConfigError as exc:
            raise FieldError("model", str(exc)) from None
        if self.size not in SIZES:
            raise FieldError("size", f"one of {', '.join(SIZES)}, got {self.size!r}")
        for name in _BUDGET_FIELDS[:3]:
            value, low = getattr(self, name), KNOBS[name].minimum or 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise FieldError(name, f"an integer >= {low:g}, got {value!r}")
        if self.max_batch is not None and (
            isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int)
            or self.max_batch < 1
        ):  # fmt: skip
            raise FieldError("max_batch", f"null or an integer >= 1, got {self.max_batch!r}")

    @classmethod
    def from_params(cls, p: Mapping[str, Any]) -> CloudProfileRequest:
        """From the profiling DAG's params (or any mapping with those keys): a trigger's,
        so the model must be registered (``trigger_models``: never a file path)."""
        try:
            model = registered_model(p["model"])
        except ConfigError as exc:
            raise FieldError("model", str(exc).removeprefix("model: ")) from None
        return cls(
            model=model,
            size=p.get("size", "small"),
            settings=TrainingSettings.from_dict(p),
            **{k: p[k] for k in _BUDGET_FIELDS if k in p},
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("settings")
        return {**d, **self.settings.to_dict()}

    def profiler_argv(self, out: str = VM_PROFILE) -> list[str]:
        """The ``srifty`` command a GPU VM runs: the profiler on its CUDA device, with the
        training settings, the budget, no MLflow, the profile written to ``out``."""
        argv = ["profile", "--model", self.model, "--size", self.size, "--device", "cuda"]
        argv += ["--no-mlflow", "--precision", self.settings.precision]
        argv += ["--optimizer", self.settings.optimizer]
        if self.settings.compile:
            argv.append("--compile")
        if self.settings.channels_last:
            argv.append("--channels-last")
        argv += ["--probes", str(self.probes), "--repeats", str(self.repeats)]
        argv += ["--refine", str(self.refine)]
        if self.max_batch is not None:
            argv += ["--max-batch", str(self.max_batch)]
        return [*argv, "--out", out]


def check_cloud_request(
    provider: str,
    instance_types: Sequence[str],
    *,
    market: str = "on-demand",
    region: str = "us-east-1",
    ec2: Mapping[str, Any] | None = None,
    model: str | None = None,
) -> list[str]:
    """Check what a cloud profiling run needs before anything is launched; returns the
    instance types as the catalog names them. Each problem is a ``FieldError`` naming its
    field (``provider``, ``instance_types[1]``, ``market``, ``ec2.image_id``, ...)."""
    if provider not in CLOUD_PROVIDERS:
        raise FieldError("provider", f"one of {', '.join(CLOUD_PROVIDERS)}, got {provider!r}")
    if not instance_types:
        raise FieldError("instance_types", "give at least one catalog instance type")
    if len(set(instance_types)) != len(instance_types):
        raise FieldError("instance_types", f"each type once, got {list(instance_types)}")
    try:
        Market.parse(market)
    except (ConfigError, UnknownNameError, ValueError) as exc:
        raise FieldError("market", str(exc)) from None
    catalog = Catalog.load()
    try:
        catalog.check_region(region)
    except (ConfigError, UnknownNameError) as exc:
        raise FieldError("region", str(exc)) from None
    out = []
    for i, name in enumerate(instance_types):
        try:
            t = catalog.get(name, region)
        except (ConfigError, UnknownNameError) as exc:
            raise FieldError(f"instance_types[{i}]", str(exc)) from None
        if t.gpu is None or t.gpus_per_vm < 1:
            raise FieldError(f"instance_types[{i}]", f"{name} has no GPU to profile")
        try:  # a VM that cannot be billed is not launched
            if Market.parse(market) is Market.SPOT:
                catalog.cheapest_spot(t.name, region)
            else:
                catalog.price(t.name, Market.ON_DEMAND, region)
        except SriftyError as exc:
            raise FieldError(f"instance_types[{i}]", f"{name}: {exc}") from None
        out.append(t.name)
    if not provider_class(provider).simulated:  # a real VM: EC2's settings, a model it has
        _ec2_settings(ec2 or {})
        if model is not None and parse_model(model).kind == "file":
            raise FieldError(
                "model",
                f"{model!r} is a file on this machine, not on the VM: profile a zoo name, "
                "hf:NAME or an installed package.module:factory on EC2",
            )
    return out


def _ec2_settings(ec2: Mapping[str, Any]) -> dict[str, Any]:
    """The trigger's ``ec2`` block checked as the plan-and-train DAG's (no deployment
    settings, an AMI required)."""
    from pydantic import ValidationError

    try:
        settings = Ec2Settings.model_validate(dict(ec2))
    except ValidationError as exc:
        raise field_error(exc, Ec2Settings, "ec2") from None
    if not settings.image_id:
        raise FieldError("ec2.image_id", "the ec2 provider needs an AMI to launch")
    return settings.model_dump(exclude_none=True)


# --------------------------------------------------------------------------- the VM
@dataclass(frozen=True)
class ProfilerVM:
    """One profiling VM: what later steps (other processes) need to find it again.

    ``run_dir`` (``ec2``): its folder on the run storage, where it writes ``profile.json``
    and ``exit.json``. ``seed``, ``start``, ``clock`` (``ec2-emulated``): its emulated
    world (see the module's doc). ``script``: what the VM runs (on the emulated EC2, what
    it would run)."""

    id: str
    provider: str
    instance_type: str
    gpu_model: str
    market: str
    region: str
    allocation_id: str
    launched_at: str
    run_dir: str = ""
    script: str = ""
    seed: int = 0
    start: str = ""
    clock: str = ""
    ec2: dict[str, Any] = field(default_factory=dict)
    released: bool = False
    bill: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def record_path(vm_id: str) -> Path:
        return paths.cloud_dir() / "profilers" / f"{_safe(vm_id)}.json"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProfilerVM:
        return cls(**dict(d))

    def save(self) -> ProfilerVM:
        write_text_atomic(self.record_path(self.id), json.dumps(self.to_dict(), indent=2))
        return self

    @classmethod
    def load(cls, vm_id: str) -> ProfilerVM:
        path = cls.record_path(vm_id)
        if not path.is_file():
            raise ProviderError(f"no profiling VM {vm_id!r} (no record {path})")
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))

    def latest(self) -> ProfilerVM:
        """This VM's record as last saved here (an emulated world's clock moves in the
        profile step), else itself."""
        path = self.record_path(self.id)
        if path.is_file():
            return self.from_dict(json.loads(path.read_text(encoding="utf-8")))
        return self


def _vm(vm: ProfilerVM | Mapping[str, Any]) -> ProfilerVM:
    return (vm if isinstance(vm, ProfilerVM) else ProfilerVM.from_dict(vm)).latest()


def world_seed(seed: int, instance_type: str) -> int:
    """The emulated world's seed of one type's VM: one stream per type, same per seed."""
    return zlib.crc32(f"{seed}:{instance_type}".encode())


def _emulated_world(vm: ProfilerVM) -> tuple[EmulatedProvider, Allocation]:
    """Rebuild the VM's emulated world: replay its seeded launch, move the clock on."""
    p = EmulatedProvider(seed=vm.seed, region=vm.region, start=datetime.fromisoformat(vm.start))
    alloc = p.launch(LaunchRequest(vm.instance_type, 1, Market.parse(vm.market)))
    if alloc.id != vm.allocation_id:
        raise ProviderError(
            f"the emulated world of {vm.id} does not replay ({alloc.id} != {vm.allocation_id})"
        )
    if vm.clock:
        p.advance_to(datetime.fromisoformat(vm.clock))
    return p, alloc


def _ec2_provider(vm: ProfilerVM, *, with_wheel: bool = False) -> EC2Provider:
    wheel = None
    if with_wheel:
        wheel = worker_wheel()
    return EC2Provider.from_conf(vm.ec2, vm.region, wheel=wheel)


def vm_script(request: CloudProfileRequest, run_dir: str) -> str:
    """The VM's start script (bash): the profiler on the GPU, then ``finish`` (profile and
    exit code into ``run_dir``), then shut down (the VM terminates and stops billing)."""
    import shlex

    profile = " ".join(shlex.quote(a) for a in request.profiler_argv(VM_PROFILE))
    finish = [
        f"{VM_HOME}/bin/python", "-m", "srifty_core.jobs.profile_vms", "finish",
        "--run-dir", run_dir, "--profile", VM_PROFILE, "--log", VM_LOG,
    ]  # fmt: skip
    lines = [
        "#!/bin/bash",
        f"# srifty: profile {request.model}/{request.size} on this VM's GPU",
        "set -uo pipefail",
        f"export SRIFTY_DATA_DIR={VM_HOME}/data",
        "code=0",
        f"{VM_HOME}/bin/srifty {profile} >{VM_LOG} 2>&1 || code=$?",
        f"cat {VM_LOG}",
        " ".join(shlex.quote(a) for a in finish) + ' --code "$code"',
        "shutdown -h now",
    ]
    return "\n".join(lines) + "\n"


def provision_profiler_vm(
    provider: str,
    instance_type: str,
    request: CloudProfileRequest,
    *,
    market: str = "on-demand",
    region: str = "us-east-1",
    ec2: Mapping[str, Any] | None = None,
    key: str = "",
    seed: int = 0,
) -> ProfilerVM:
    """Launch one VM of ``instance_type`` to profile on (the setup step); its record is
    saved (``ProfilerVM.save``) and returned. ``key`` names the run (the DAG's run id).

    ``ec2``: the VM installs the worker wheel and runs ``vm_script``, writing into a fresh
    folder of the run storage (``SRIFTY_RUN_STORAGE``, required). ``ec2-emulated``: the
    seeded launch (its delay on the simulated clock); nothing runs."""
    names = check_cloud_request(
        provider, [instance_type], market=market, region=region, ec2=ec2, model=request.model
    )
    name = names[0]
    vm_id = f"{_safe(key or 'profile')}.{_safe(name)}.{uuid.uuid4().hex[:8]}"
    if provider_class(provider).simulated:
        start = datetime.now(UTC).replace(microsecond=0)
        s = world_seed(seed, name)
        p = EmulatedProvider(seed=s, region=region, start=start)
        alloc = p.launch(LaunchRequest(name, 1, Market.parse(market)))
        vm = ProfilerVM(
            id=vm_id, provider=provider, instance_type=name,
            gpu_model=p.catalog_type(name).gpu_model, market=Market.parse(market).value,
            region=region, allocation_id=alloc.id,
            launched_at=alloc.created_at.isoformat(),
            script=vm_script(request, f"emulated://{vm_id}"), seed=s,
            start=start.isoformat(), clock=p.now().isoformat(),
        )  # fmt: skip
        return vm.save()

    storage = paths.run_storage()
    if not storage or not run_store.is_remote(storage):
        raise ConfigError(
            f"profiling on EC2 needs run storage the VMs can write: set {paths.RUN_STORAGE_ENV} "
            f"(an s3:// URI the VMs' instance profile can write), got {storage!r}"
        )
    run_dir = str(run_store.join(storage, "profile-runs", vm_id))
    vm = ProfilerVM(
        id=vm_id, provider=provider, instance_type=name, gpu_model="",
        market=Market.parse(market).value, region=region, allocation_id="",
        launched_at="", run_dir=run_dir, script=vm_script(request, run_dir),
        ec2=_ec2_settings(ec2 or {}),
    )  # fmt: skip
    ec2p = _ec2_provider(vm, with_wheel=True)
    alloc = ec2p.launch_script(LaunchRequest(name, 1, Market.parse(market)), vm.script)
    gpu = ec2p.catalog().get(name, region).gpu_model
    vm = replace(
        vm, allocation_id=alloc.id, gpu_model=gpu, launched_at=alloc.created_at.isoformat()
    )
    try:
        return vm.save()
    except BaseException:
        ec2p.release(alloc)  # nobody would know to release it
        raise


# --------------------------------------------------------------------------- references
def _is_emulated(p: ComputeProfile) -> bool:
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
    return sorted(found, key=lambda x: (_is_emulated(x[1]), x[1].device_type == "cpu"))


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
    from srifty_core.profiling.job import run_profile_job
    from srifty_core.profiling.profiler import ProfilerConfig

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


# --------------------------------------------------------------------------- profiling
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
    v = _vm(vm)
    store = store or ProfileStore()
    if not provider_class(v.provider).simulated:
        return collect_profile(v, request, store=store, timeout_s=timeout_s, poll_s=poll_s)
    ref_path, ref = reference_profile(request, store)
    p, _ = _emulated_world(v)
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
    v = _vm(vm)
    store = store or ProfileStore()
    where = f"{v.instance_type} ({v.allocation_id})"
    prof_uri = str(run_store.join(v.run_dir, PROFILE_FILE))
    exit_uri = str(run_store.join(v.run_dir, EXIT_FILE))
    cloud = provider or _ec2_provider(v)
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


# --------------------------------------------------------------------------- release
@dataclass(frozen=True, slots=True)
class VMBill:
    """What one profiling VM cost: ``vm_s`` seconds from launch to its end (released, or
    shut down by itself), ``cost_usd`` at ``usd_per_hour`` billed per second with EC2's
    one-minute minimum (``Provider.cost``)."""

    instance_type: str
    allocation_id: str
    market: str
    usd_per_hour: float
    vm_s: float
    cost_usd: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _bill(provider: Provider, alloc: Allocation) -> VMBill:
    now = provider.now()
    spot = alloc.market is Market.SPOT
    usd = provider.price(alloc.spec.name, alloc.market, alloc.zone if spot else None)
    vm_s = 0.0
    for i in provider.describe(alloc):
        start = i.launched_at or alloc.created_at
        vm_s += max(0.0, ((i.ended_at or now) - start).total_seconds())
    return VMBill(
        alloc.spec.name, alloc.id, alloc.market.value, usd.usd_per_hour, vm_s,
        provider.cost(alloc),
    )  # fmt: skip


def release(vm: ProfilerVM | Mapping[str, Any]) -> VMBill:
    """Give the VM back (the teardown: idempotent, also after a failed profile) and
    return its bill; the record says it was released."""
    v = _vm(vm)
    if v.released and v.bill:
        return VMBill(**v.bill)
    if provider_class(v.provider).simulated:
        p, alloc = _emulated_world(v)
        p.release(alloc)
        bill = _bill(p, alloc)
        replace(v, clock=p.now().isoformat(), released=True, bill=bill.to_dict()).save()
        return bill
    cloud = _ec2_provider(v)
    cloud.release(v.allocation_id)
    bill = _bill(cloud, cloud.get_allocation(v.allocation_id))
    replace(v, released=True, bill=bill.to_dict()).save()
    return bill


# --------------------------------------------------------------------------- summary
def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per type (each row a ``VMBill`` dict with its ``CloudProfileResult`` under
    ``profile``, ``None`` where it failed): B_max, profile path, VM seconds and cost; and
    the totals."""
    out = []
    for r in rows:
        prof = r.get("profile") or {}
        out.append(
            {
                "instance_type": r["instance_type"],
                "device_type": prof.get("device_type"),
                "b_max": prof.get("b_max"),
                "path": prof.get("path"),
                "vm_s": float(r["vm_s"]),
                "cost_usd": float(r["cost_usd"]),
                "usd_per_hour": float(r["usd_per_hour"]),
                "market": r["market"],
                "ok": bool(prof),
            }
        )
    return {
        "types": out,
        "total_vm_s": sum(x["vm_s"] for x in out),
        "total_cost_usd": sum(x["cost_usd"] for x in out),
        "failed": [x["instance_type"] for x in out if not x["ok"]],
    }


def format_summary(summary: Mapping[str, Any]) -> str:
    lines = []
    for x in summary["types"]:
        what = (
            f"{x['device_type']}: B_max {x['b_max']}, profile {x['path']}"
            if x["ok"]
            else "no profile (failed)"
        )
        lines.append(
            f"{x['instance_type']} ({x['market']}): {what}; VM {x['vm_s']:.0f} s, "
            f"${x['cost_usd']:.4f} at ${x['usd_per_hour']:g}/h"
        )
    lines.append(
        f"total: {len(summary['types'])} VM(s), {summary['total_vm_s']:.0f} VM-seconds, "
        f"${summary['total_cost_usd']:.4f}"
    )
    return "\n".join(lines)


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


# --------------------------------------------------------------------------- on the VM
def finish(run_dir: str, code: int, profile: Path, log: Path | None = None) -> int:
    """On the VM, after the profiler: its profile (when it succeeded) and then
    ``exit.json`` (the code and the log's last lines) into ``run_dir``."""
    tail = ""
    if log is not None and log.is_file():
        tail = log.read_text(encoding="utf-8", errors="replace")[-2000:]
    if code == 0 and profile.is_file():
        run_store.write_text(run_store.join(run_dir, PROFILE_FILE), profile.read_text("utf-8"))
    elif code == 0:
        code, tail = 1, f"{tail}\nno profile at {profile}"
    done = {"code": code, "tail": tail, "at": datetime.now(UTC).isoformat()}
    run_store.write_text(run_store.join(run_dir, EXIT_FILE), json.dumps(done))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m srifty_core.jobs.profile_vms")
    sub = parser.add_subparsers(dest="command", required=True)
    fin = sub.add_parser("finish", help="on a profiling VM: hand the profile to the run storage")
    fin.add_argument("--run-dir", required=True)
    fin.add_argument("--profile", required=True, type=Path)
    fin.add_argument("--log", type=Path)
    fin.add_argument("--code", required=True, type=int)
    args = parser.parse_args(argv)
    return finish(args.run_dir, args.code, args.profile, args.log)


if __name__ == "__main__":
    sys.exit(main())
