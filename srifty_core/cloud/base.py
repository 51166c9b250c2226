"""The provider interface: launch and release instances, run workers on them, report their
state and interruptions, look up prices.

Three implementations: local processes (``cloud.local``, real), an emulated EC2
(``cloud.emulated``: variance, launch delays, preemptions at scale, on a simulated clock) and
EC2 itself (``cloud.ec2``, through the Airflow Amazon provider's hooks). Every value
crossing the interface is a frozen dataclass; an allocation is addressed by its id, so a
later process (an Airflow teardown, say) can release what an earlier one launched.
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

from srifty_core.catalog.types import InstanceType, Market, Price
from srifty_core.errors import ConfigError, SriftyError


class ProviderError(SriftyError):
    """A provider could not do what was asked (launch, run, release)."""


class InstanceState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    INTERRUPTED = "interrupted"
    """Reclaimed by the provider (a spot interruption); its workers are gone."""
    TERMINATED = "terminated"
    """Released by us."""


@dataclass(frozen=True, slots=True)
class InstanceSpec:
    """What a probe record needs to know about an instance type (its features).

    ``ranks_per_instance`` is how many worker processes one instance runs: one per GPU on
    a GPU type, one for the local CPU pseudo-type.
    """

    name: str
    gpu_model: str
    gpus_per_vm: int
    vcpus: int
    network_gbps: float | None
    """Rated network bandwidth; ``None`` where the provider rates none (loopback)."""
    ranks_per_instance: int = 1

    def __post_init__(self) -> None:
        if self.ranks_per_instance < 1:
            raise ConfigError(f"ranks_per_instance: must be >= 1, got {self.ranks_per_instance}")

    @classmethod
    def from_catalog(cls, t: InstanceType) -> InstanceSpec:
        """The features of a catalog type; one rank per GPU."""
        return cls(
            name=t.name,
            gpu_model=t.gpu_model,
            gpus_per_vm=t.gpus_per_vm,
            vcpus=t.vcpus,
            network_gbps=t.network_gbps,
            ranks_per_instance=max(1, t.gpus_per_vm),
        )


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    instance_type: str
    count: int = 1
    market: Market = Market.ON_DEMAND
    zone: str | None = None
    placement_group: bool = False

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ConfigError(f"count: must be at least 1 instance, got {self.count}")


@dataclass(frozen=True, slots=True)
class Allocation:
    """Instances launched together by one request: one group of repeated probe samples."""

    id: str
    provider: str
    cloud: str
    region: str
    zone: str
    spec: InstanceSpec
    market: Market
    placement_group: bool
    instance_ids: tuple[str, ...]
    created_at: datetime

    @property
    def count(self) -> int:
        return len(self.instance_ids)

    @property
    def ranks(self) -> int:
        """Worker processes the allocation holds (the largest world size it can probe)."""
        return self.count * self.spec.ranks_per_instance


@dataclass(frozen=True, slots=True)
class Instance:
    id: str
    allocation_id: str
    instance_type: str
    market: Market
    zone: str
    state: InstanceState
    address: str
    ranks: tuple[int, ...]
    """Global ranks its workers take."""
    launched_at: datetime | None = None
    """When billing started (the launch request was accepted)."""
    ended_at: datetime | None = None
    """When billing stopped (released by us or taken back); ``None`` while it runs."""


@dataclass(frozen=True, slots=True)
class Interruption:
    instance_id: str
    at: datetime
    reason: str


@dataclass(frozen=True)
class Workers:
    """What ``Provider.start_workers`` starts: each rank's command (``argv``, ``env``) and
    where processes here log (``log_dir``); ``emulate(provider, allocations)`` starts an
    emulator's ranks instead (they emulate the plan's training)."""

    argv: Sequence[str]
    env: Mapping[str, str] | None = None
    log_dir: Path | None = None
    emulate: Callable[[Any, Sequence[Allocation]], None] | None = None


BILLING_MINIMUM_S = 60.0
"""EC2 bills Linux instances per second with a one-minute minimum per instance."""


class TrainingStart(Protocol):
    """What the VMs of one configuration run when they start their workers at launch,
    built by the caller (``worker.rendezvous.TrainingStart``: a training's plan and its
    rendezvous; ``jobs.probe_vms.ProbeStart``: a probe ring's). ``Provider.launch_with``
    launches the configuration's VMs in its rank order (``EC2Provider(training=...)``:
    ``launch_many``)."""

    @property
    def world_size(self) -> int:
        """The plan's ranks (the VMs must hold exactly these)."""
        ...

    def start_script(
        self, vms: Sequence[tuple[int, int]], group: int, host: str, join_timeout_s: int
    ) -> str:
        """The start script of node group ``group`` of the VMs ``vms`` (``(count, ranks per
        VM)`` per launch, in the plan's order; the first VM in a group of its own), told
        the rendezvous endpoint ``host`` (empty on the first VM: it reads its own)."""
        ...


class Provider(abc.ABC):
    """One cloud (or this machine). Implementations keep their state outside the process,
    so ``get_allocation(id)`` works from any process that shares their state folder."""

    name: str
    cloud: str
    region: str
    reruns_workers: bool = False
    """Can ``run`` start new workers on an allocation whose workers were stopped? Only then
    can a re-plan keep the allocation for the next configuration."""
    launch_s: float = 0.0
    """Seconds from a launch request to running workers, which the planner charges a
    configuration it must launch (a job may state its own, ``launch_s``)."""
    detach_s: float = 0.0
    """Seconds a re-plan spends moving the checkpoint's volume to other VMs."""
    shares_host: bool = False
    """Do all its ranks share this one host's cores (worker processes here)? Then its offers
    are the host's pseudo-type (``local.cpu``) and the simulator divides the host among
    them (``SimInstance.shares_host``)."""
    billed: bool = True
    """Does it bill money for its instances? ``False``: nothing is billed (the outcome says
    so, and its costs are the offers' prices only)."""
    interruptions_deplete_spot: bool = True
    """Is a spot instance it takes back spot capacity gone for the rest of the job?
    ``False``: a worker taken back only lowers the quota (the next plan runs on the rest)."""
    reports_exit_codes: bool = False
    """Are ``exit_codes`` the workers' own (processes here)? Then a run has finished once
    they all exited, and their exit before the last checkpoint fails it. ``False``: the VMs
    write their exits into the run folder (``rendezvous.exit_markers``)."""
    starts_at_once: bool = False
    """Do its workers start within seconds (processes here), so that the stall watch judges
    their start too? VMs install and join under a timeout of their own."""
    one_allocation_per_worker: bool = False
    """Launch one allocation per worker, so that a worker taken back leaves its peers'
    allocations whole and keepable by a re-plan?"""
    starts_workers_at_launch: bool = False
    """Do its VMs start the workers themselves when launched (from their user data: EC2),
    so that ``start_workers`` has nothing to do?"""
    simulated: bool = False
    """An emulator: its world (clock, instances) lives in the provider object, so only the
    process that runs the whole job can make it, and it can be told to take instances back."""

    @classmethod
    def from_conf(
        cls, ec2: Mapping[str, Any] | None = None, region: str | None = None, **kwargs: Any
    ) -> Provider:
        """The provider a job's conf asks for (``cloud.get_provider``): its ``ec2`` block and
        ``region`` where the provider takes them; ``kwargs``: what its class takes besides.
        Default: the class's own defaults."""
        return cls(**kwargs)

    @classmethod
    def probe_args(cls, region: str, backend: str) -> list[str]:
        """What ``srifty probe`` takes to probe on this provider in ``region`` over
        ``backend`` (a plan names the probe a never-probed ring needs). Default: the
        provider's name."""
        return [f"--provider {cls.name}"]

    @abc.abstractmethod
    def instance_type(self, name: str) -> InstanceSpec:
        """Features of ``name``; unknown names raise ``UnknownNameError``."""

    @abc.abstractmethod
    def launch(self, request: LaunchRequest) -> Allocation:
        """Start ``request.count`` instances; they are RUNNING (idle) when this returns."""

    @abc.abstractmethod
    def get_allocation(self, allocation_id: str) -> Allocation:
        """An allocation launched earlier, possibly by another process."""

    @abc.abstractmethod
    def describe(self, allocation: Allocation) -> tuple[Instance, ...]:
        """Current state of each instance."""

    @abc.abstractmethod
    def interruptions(self, allocation: Allocation) -> tuple[Interruption, ...]:
        """Instances the provider took back, oldest first."""

    @abc.abstractmethod
    def run(
        self,
        allocation: Allocation,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Start ``argv`` once per rank, torchrun-style: each process gets ``RANK``,
        ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``. Returns at once."""

    @abc.abstractmethod
    def exit_codes(self, allocation: Allocation) -> dict[int, int | None]:
        """Rank -> exit code of the latest ``run`` (``None`` while running)."""

    @abc.abstractmethod
    def stop(self, allocation: Allocation) -> None:
        """Stop the workers of the latest ``run``; the instances stay up for another run."""

    @abc.abstractmethod
    def release(self, allocation: Allocation | str) -> None:
        """Stop every worker and give the instances back. Idempotent; never raises for an
        allocation that is already released."""

    @abc.abstractmethod
    def price(self, instance_type: str, market: Market | str, zone: str | None = None) -> Price:
        """Hourly price; ``MissingPriceError`` where there is none (never 0)."""

    def start_workers(self, allocations: Sequence[Allocation], workers: Workers) -> None:
        """Start a configuration's workers on ``allocations`` (in the plan's rank order);
        returns at once. Default: nothing (VMs that start them at launch,
        ``starts_workers_at_launch``)."""
        return None

    def launch_with(
        self, requests: Sequence[LaunchRequest], start: TrainingStart
    ) -> list[Allocation]:
        """Launch one configuration (``requests``, in its rank order) whose VMs start its
        workers themselves (``starts_workers_at_launch``): each VM runs ``start``'s start
        script for its node group (``cloud.ec2.user_data.TrainingStart``: a training's
        workers, or a probe ring's); if one launch fails, what was launched is released
        first. Default: refused (a provider that starts workers after launch:
        ``start_workers``)."""
        raise ProviderError(
            f"the {self.name} provider starts workers after launch (start_workers), not "
            "from its VMs' launch"
        )

    def log_dir(self, allocation: Allocation) -> Path | None:
        """Where the workers of ``allocation`` log on this machine (``None``: not here)."""
        return None

    async def observe_async(
        self, allocations: Sequence[Allocation]
    ) -> tuple[dict[str, tuple[Interruption, ...]], dict[str, dict[int, int | None]]]:
        """``interruptions`` and ``exit_codes`` of each allocation (by id), for an event
        loop (the Airflow triggerer's). Default: the synchronous calls in a worker thread."""

        def both() -> tuple[dict[str, tuple[Interruption, ...]], dict[str, dict[int, int | None]]]:
            return (
                {a.id: self.interruptions(a) for a in allocations},
                {a.id: self.exit_codes(a) for a in allocations},
            )

        return await asyncio.to_thread(both)

    # ------------------------------------------------------------------ time and money
    def now(self) -> datetime:
        """The provider's clock (UTC): wall time, or the simulated clock of an emulator."""
        return datetime.now(UTC)

    def wait(self, seconds: float) -> None:
        """Let ``seconds`` of the provider's time pass (``now``): a sleep in wall time; an
        emulator moves its simulated clock, and what runs on it, instead."""
        time.sleep(seconds)

    def cost(self, allocation: Allocation, until: datetime | None = None) -> float:
        """US dollars the allocation has cost from launch until ``until`` (default: now).

        Per-second billing at the allocation's market price (spot: the price of its zone),
        with EC2's one-minute minimum per instance that ran at all; each instance is
        billed from ``launched_at`` until it ended (released or interrupted) or ``until``,
        whichever is first. A type without a price raises ``MissingPriceError`` (a cost is
        never silently 0).
        """
        until = until or self.now()
        zone = allocation.zone if allocation.market.value == "spot" else None
        usd_per_hour = self.price(allocation.spec.name, allocation.market, zone).usd_per_hour
        total_s = 0.0
        for inst in self.describe(allocation):
            start = inst.launched_at or allocation.created_at
            end = inst.ended_at if inst.ended_at is not None and inst.ended_at < until else until
            if until <= start:
                continue  # not launched yet at ``until``
            total_s += max((end - start).total_seconds(), BILLING_MINIMUM_S)
        return usd_per_hour * total_s / 3600.0


def release_all(provider: Provider, allocations: Sequence[Allocation | str]) -> None:
    """Release every allocation, whatever happens to one of them: each is tried, and the
    failures are reported together afterwards (``ProviderError`` naming each), so that a
    failing first release never leaves the second one running."""
    failures = []
    for a in allocations:
        try:
            provider.release(a)
        except Exception as exc:
            name = a if isinstance(a, str) else a.id
            failures.append(f"{name}: {type(exc).__name__}: {exc}")
    if failures:
        raise ProviderError(
            f"{len(failures)} of {len(allocations)} allocation(s) could not be released "
            f"(terminate them by their srifty tag): " + "; ".join(failures)
        )
