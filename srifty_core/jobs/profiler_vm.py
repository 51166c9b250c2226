"""One profiling VM's life: its record (``ProfilerVM``, what later steps in other processes
need to find it again), its launch (``provision_profiler_vm``, the setup step) and its
release with its bill (``release``, ``VMBill``: the teardown step).

The emulated EC2 keeps its world in the provider object, and the DAG's tasks are separate
processes: like the local provider (``cloud.local``: JSON state under
``<data dir>/cloud/``), each profiling VM's state is a small record,
``<data dir>/cloud/profilers/<id>.json``. An emulated VM's record holds its world's seed,
start and clock: a later task rebuilds the world by replaying the seeded launch and moving
the clock on (``emulated_world``), so the VM's allocation id, zone and billing are the same
in every task. An EC2 VM is found by its allocation tag (``cloud.ec2``); its record also
travels in XCom.
"""

from __future__ import annotations

import json
import re
import uuid
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from srifty_core import paths
from srifty_core.atomic import write_text_atomic
from srifty_core.catalog.types import Market
from srifty_core.cloud import provider_class
from srifty_core.cloud.base import Allocation, LaunchRequest, Provider, ProviderError
from srifty_core.cloud.ec2 import EC2Provider
from srifty_core.cloud.emulated.provider import EmulatedProvider
from srifty_core.errors import ConfigError
from srifty_core.jobs.artifact import worker_wheel
from srifty_core.jobs.cloud_request import CloudProfileRequest, check_cloud_request, ec2_settings
from srifty_core.jobs.vm_script import vm_script
from srifty_core.runs import store as run_store

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_name(text: str) -> str:
    """``text`` as one file-name part: runs of other characters as ``_``."""
    return _SAFE.sub("_", text).strip("._") or "x"


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
        return paths.cloud_dir() / "profilers" / f"{safe_name(vm_id)}.json"

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


def load_vm(vm: ProfilerVM | Mapping[str, Any]) -> ProfilerVM:
    """The VM of a record (or its dict, as XCom carries it), as last saved here."""
    return (vm if isinstance(vm, ProfilerVM) else ProfilerVM.from_dict(vm)).latest()


def world_seed(seed: int, instance_type: str) -> int:
    """The emulated world's seed of one type's VM: one stream per type, same per seed."""
    return zlib.crc32(f"{seed}:{instance_type}".encode())


def emulated_world(vm: ProfilerVM) -> tuple[EmulatedProvider, Allocation]:
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


def ec2_provider(vm: ProfilerVM, *, with_wheel: bool = False) -> EC2Provider:
    """The EC2 provider of the VM's settings and region (``with_wheel``: able to launch,
    with the worker wheel the VM installs)."""
    wheel = None
    if with_wheel:
        wheel = worker_wheel()
    return EC2Provider.from_conf(vm.ec2, vm.region, wheel=wheel)


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
    vm_id = f"{safe_name(key or 'profile')}.{safe_name(name)}.{uuid.uuid4().hex[:8]}"
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
        ec2=ec2_settings(ec2 or {}),
    )  # fmt: skip
    ec2p = ec2_provider(vm, with_wheel=True)
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
    v = load_vm(vm)
    if v.released and v.bill:
        return VMBill(**v.bill)
    if provider_class(v.provider).simulated:
        p, alloc = emulated_world(v)
        p.release(alloc)
        bill = _bill(p, alloc)
        replace(v, clock=p.now().isoformat(), released=True, bill=bill.to_dict()).save()
        return bill
    cloud = ec2_provider(v)
    cloud.release(v.allocation_id)
    bill = _bill(cloud, cloud.get_allocation(v.allocation_id))
    replace(v, released=True, bill=bill.to_dict()).save()
    return bill
