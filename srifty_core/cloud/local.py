"""The local provider: an "instance" is a group of worker processes on this machine.

``launch`` reserves instances (no boot time; they are RUNNING and idle); ``run`` starts one
process per rank on loopback with a free port, each in its own session so that ``release``
can stop it with everything it started (SIGTERM, then SIGKILL after a grace period).
The allocation's state (instances, worker PIDs) is a JSON file under the state folder, so
another process (an Airflow teardown) can release what this one launched; before killing
a recorded PID, ``release`` checks that the process's start time still matches, so a
reused PID is never hit.

Workers run with ``lifetime.caller_env`` (``srifty train``, ``srifty probe``: callers that
wait for them) are tied to the caller: each such allocation gets a guard
(``cloud.local_guard``, one small process in its own session) that waits for the caller to
go away; if the caller dies without releasing the allocation (SIGKILL, SIGTERM, a crash),
the guard releases it: SIGTERM to the workers (the train worker checkpoints), SIGKILL to
whatever still runs after ``TERM_GRACE_S`` (a rank stuck in a long step, a script that
ignores SIGTERM), and the allocation's instances turn terminated in its state file.

Instance types: ``local.cpu`` (one rank per instance, the machine's vCPUs, no rated
network), or any catalog type, whose specs are then used as *labels* (one rank per GPU):
the measurement is still local, and the rows say so (provider and cloud ``local``).

Prices and cost: ``local.cpu`` has no price, and ``price``/``cost`` raise
``MissingPriceError`` for it (this machine is not rented by the second; a cost of 0 would
read as "free" in a plan, and any pseudo-price would be invented). A catalog type used as a
label is priced as that type on EC2 in ``catalog_region`` (spot: the cheapest zone), so
``cost`` says what the same run would have cost there, billed per second since launch.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from srifty_core import paths
from srifty_core.atomic import write_text_atomic
from srifty_core.catalog import Catalog, MissingPriceError
from srifty_core.catalog.types import Market, Price
from srifty_core.cloud.base import (
    Allocation,
    Instance,
    InstanceSpec,
    InstanceState,
    Interruption,
    LaunchRequest,
    Provider,
    ProviderError,
    Workers,
)
from srifty_core.errors import ConfigError, UnknownNameError
from srifty_core.lifetime import ENV_VAR as TIED_ENV
from srifty_core.lifetime import LOOPBACK, free_port
from srifty_core.worker_env import scrubbed

LOCAL_CPU = "local.cpu"
DEFAULT_MAX_RANKS = 16
"""Worker processes one local allocation may hold (a quota: each rank is a Python process
with torch loaded, a few hundred MB)."""
TERM_GRACE_S = 5.0
GUARD_KEEP = b"keep"
"""What the caller tells an allocation's guard (``cloud.local_guard``) before it closes the
pipe, once it released the allocation itself."""
_GUARDS: dict[tuple[str, str], subprocess.Popen[bytes]] = {}
"""This process's guards, by (state folder, allocation id): module-wide, as several
``LocalProvider`` objects of one process may launch and release the same allocation."""


@dataclass(frozen=True)
class LocalHost:
    """Where a local instance's workers run: the address its peers reach it at, what
    precedes each worker's command (e.g. ``ip netns exec NS``) and what its environment
    adds (e.g. ``GLOO_SOCKET_IFNAME``)."""

    address: str = LOOPBACK
    prefix: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


def process_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), ``None`` if it is gone
    or is a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 2 (comm) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def pid_alive(pid: int, start_ticks: int | None = None) -> bool:
    """Whether ``pid`` runs (zombies count as gone) and, if given, started at ``start_ticks``."""
    ticks = process_start_ticks(pid)
    if ticks is None:
        return False
    return start_ticks is None or ticks == start_ticks


class LocalProvider(Provider):
    name = "local"
    cloud = "local"
    reruns_workers = True
    shares_host = True
    billed = False
    interruptions_deplete_spot = False
    reports_exit_codes = True
    starts_at_once = True
    one_allocation_per_worker = True

    @classmethod
    def probe_args(cls, region: str, backend: str) -> list[str]:
        return []  # srifty probe's default

    def __init__(
        self,
        state_dir: Path | None = None,
        *,
        region: str = "local",
        zone: str = "local-a",
        max_ranks: int = DEFAULT_MAX_RANKS,
        catalog_region: str = "us-east-1",
    ) -> None:
        self.state_dir = state_dir or paths.cloud_dir() / "local"
        self.region = region
        self.zone = zone
        self.max_ranks = max_ranks
        self.catalog_region = catalog_region
        self._procs: dict[str, dict[int, subprocess.Popen[bytes]]] = {}

    # ------------------------------------------------------------------ types, prices
    def instance_type(self, name: str) -> InstanceSpec:
        if name == LOCAL_CPU:
            return InstanceSpec(
                name=LOCAL_CPU,
                gpu_model="cpu",
                gpus_per_vm=0,
                vcpus=os.cpu_count() or 1,
                network_gbps=None,
                ranks_per_instance=1,
            )

        catalog = Catalog.load()
        if name not in catalog.names():
            raise UnknownNameError("instance type", name, [LOCAL_CPU, *catalog.names()])
        t = catalog.get(name, self.catalog_region)
        return InstanceSpec.from_catalog(t)

    def price(self, instance_type: str, market: Market | str, zone: str | None = None) -> Price:
        if instance_type == LOCAL_CPU:
            raise MissingPriceError(f"{LOCAL_CPU} runs on this machine and has no price")
        self.instance_type(instance_type)  # unknown names fail with suggestions
        catalog = Catalog.load()
        if zone == self.zone:
            zone = None  # this machine's pseudo-zone: priced as the catalog region
        if Market.parse(market) is Market.SPOT and zone is None:
            return catalog.cheapest_spot(instance_type, self.catalog_region)[1]
        return catalog.price(instance_type, market, self.catalog_region, zone)

    # ------------------------------------------------------------------ lifecycle
    def launch(self, request: LaunchRequest) -> Allocation:
        spec = self.instance_type(request.instance_type)
        ranks = request.count * spec.ranks_per_instance
        if ranks > self.max_ranks:
            raise ConfigError(
                f"count: {request.count} x {spec.name} is {ranks} ranks, over the local "
                f"limit of {self.max_ranks} (LocalProvider(max_ranks=...))"
            )
        if request.zone not in (None, self.zone):
            raise UnknownNameError("zone", request.zone, [self.zone], context="(local provider)")
        alloc_id = f"local-{uuid.uuid4().hex[:12]}"
        now = self.now()
        alloc = Allocation(
            id=alloc_id,
            provider=self.name,
            cloud=self.cloud,
            region=self.region,
            zone=self.zone,
            spec=spec,
            market=Market.parse(request.market),
            placement_group=request.placement_group,
            instance_ids=tuple(f"{alloc_id}-i{k}" for k in range(request.count)),
            created_at=now,
        )
        state: dict[str, Any] = {
            "allocation": _alloc_to_json(alloc),
            "instances": {i: InstanceState.RUNNING.value for i in alloc.instance_ids},
            "ended_at": {},
            "interruptions": [],
            "processes": [],
            "master_port": None,
        }
        self._save(alloc.id, state)
        return alloc

    def get_allocation(self, allocation_id: str) -> Allocation:
        return _alloc_from_json(self._load(allocation_id)["allocation"])

    def describe(self, allocation: Allocation) -> tuple[Instance, ...]:
        state = self._load(allocation.id)
        per = allocation.spec.ranks_per_instance
        ended = state.get("ended_at", {})
        return tuple(
            Instance(
                id=iid,
                allocation_id=allocation.id,
                instance_type=allocation.spec.name,
                market=allocation.market,
                zone=allocation.zone,
                state=InstanceState(state["instances"][iid]),
                address=LOOPBACK,
                ranks=tuple(range(k * per, (k + 1) * per)),
                launched_at=allocation.created_at,
                ended_at=datetime.fromisoformat(ended[iid]) if iid in ended else None,
            )
            for k, iid in enumerate(allocation.instance_ids)
        )

    def interruptions(self, allocation: Allocation) -> tuple[Interruption, ...]:
        state = self._load(allocation.id)
        return tuple(
            Interruption(d["instance_id"], datetime.fromisoformat(d["at"]), d["reason"])
            for d in state["interruptions"]
        )

    def run(
        self,
        allocation: Allocation,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        log_dir: Path | None = None,
    ) -> None:
        self.run_group([allocation], argv, env, log_dir=log_dir)

    def run_group(
        self,
        allocations: Sequence[Allocation],
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        log_dir: Path | None = None,
    ) -> None:
        """Start one process group over several allocations: ranks are numbered across
        them in order (an allocation kept from an earlier configuration and one launched
        for the new one train together)."""
        states = [self._load(a.id) for a in allocations]
        for a, state in zip(allocations, states, strict=True):
            not_running = [i for i, s in state["instances"].items() if s != InstanceState.RUNNING]
            if not_running:
                raise ProviderError(f"allocation {a.id}: instance(s) {not_running} are not running")
            if any(pid_alive(p["pid"], p["start_ticks"]) for p in state["processes"]):
                raise ProviderError(f"allocation {a.id} still runs workers; wait or release")
        port = free_port()
        master = self.host(allocations[0], 0).address
        world = sum(a.ranks for a in allocations)
        # the caller's environment without its secrets (worker_env), plus what it passes
        base_env = {**scrubbed(), **(env or {})}
        tied = base_env.get(TIED_ENV) == str(os.getpid())
        first = 0
        for a, state in zip(allocations, states, strict=True):
            logs = log_dir or self.state_dir / a.id / "logs"
            logs.mkdir(parents=True, exist_ok=True)
            if tied:  # before the workers: a caller killed while starting them is covered
                self._guard(a.id, logs)
            procs: dict[int, subprocess.Popen[bytes]] = {}
            records: list[dict[str, Any]] = []
            per = a.spec.ranks_per_instance
            try:
                for local in range(a.ranks):
                    rank = first + local
                    host = self.host(a, local // per)
                    rank_env = {
                        **base_env,
                        **host.env,
                        "RANK": str(rank),
                        "LOCAL_RANK": str(local % per),
                        "WORLD_SIZE": str(world),
                        "MASTER_ADDR": master,
                        "MASTER_PORT": str(port),
                        "SRIFTY_INSTANCE_ID": a.instance_ids[local // per],
                        "SRIFTY_ALLOCATION_ID": a.id,
                        "OMP_NUM_THREADS": base_env.get("OMP_NUM_THREADS", "1"),
                    }
                    with open(logs / f"rank-{rank}.log", "ab") as log:
                        p = subprocess.Popen(
                            [*host.prefix, *argv],
                            env=rank_env,
                            stdin=subprocess.DEVNULL,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    procs[rank] = p
                    records.append(
                        {
                            "rank": rank,
                            "local": local,  # this allocation's rank: which instance runs it
                            "pid": p.pid,
                            "start_ticks": process_start_ticks(p.pid),
                        }
                    )
            finally:
                # Record whatever started, even if a later rank failed to, so release finds it.
                self._procs[a.id] = procs
                state["processes"] = records
                state["master_port"] = port
                state["log_dir"] = str(logs)
                self._save(a.id, state)
            first += a.ranks

    def host(self, allocation: Allocation, instance: int) -> LocalHost:
        """Where the workers of ``allocation``'s ``instance``-th instance run: this machine,
        on loopback. A subclass may put instances elsewhere on this machine (the tests put
        each in a network namespace of its own, standing in for VMs); the first instance's
        address is the process group's ``MASTER_ADDR``."""
        return LocalHost()

    def exit_codes(self, allocation: Allocation) -> dict[int, int | None]:
        procs = self._procs.get(allocation.id)
        if procs is not None:
            return {rank: p.poll() for rank, p in procs.items()}
        # Started by another process: we only know whether each worker still runs.
        state = self._load(allocation.id)
        return {
            p["rank"]: None if pid_alive(p["pid"], p["start_ticks"]) else -1
            for p in state["processes"]
        }

    def worker_pids(self, allocation: Allocation) -> list[int]:
        """PIDs of the latest ``run``'s workers (alive or not)."""
        return [p["pid"] for p in self._load(allocation.id)["processes"]]

    def start_workers(self, allocations: Sequence[Allocation], workers: Workers) -> None:
        """One process per rank, one process group over the allocations (``run_group``)."""
        self.run_group(allocations, workers.argv, workers.env, log_dir=workers.log_dir)

    def log_dir(self, allocation: Allocation) -> Path | None:
        d = self._load(allocation.id).get("log_dir")
        return Path(d) if d else None

    def interrupt(self, instance_id: str, reason: str = "spot interruption (simulated)") -> None:
        """Take one instance back as a cloud would reclaim a spot VM: its workers are killed
        and it turns INTERRUPTED."""
        alloc_id = instance_id.rsplit("-i", 1)[0]
        state = self._load(alloc_id)
        if instance_id not in state["instances"]:
            raise UnknownNameError("instance", instance_id, state["instances"])
        alloc = _alloc_from_json(state["allocation"])
        k = alloc.instance_ids.index(instance_id)
        per = alloc.spec.ranks_per_instance
        # the instance's ranks within its allocation: a process group over several
        # allocations numbers its global ranks across them (run_group)
        mine = range(k * per, (k + 1) * per)
        # The notice first, as a cloud sends it before it takes the VM: stopping the ranks
        # takes up to the grace period, and a peer rank that loses them exits at once; a
        # monitor that looked in between saw every worker gone and no interruption.
        state["instances"][instance_id] = InstanceState.INTERRUPTED.value
        at = self.now().isoformat()
        state.setdefault("ended_at", {})[instance_id] = at
        state["interruptions"].append({"instance_id": instance_id, "at": at, "reason": reason})
        self._save(alloc.id, state)
        self._stop([p for p in state["processes"] if p.get("local", p["rank"]) in mine], alloc.id)

    def stop(self, allocation: Allocation) -> None:
        self._stop(self._load(allocation.id)["processes"], allocation.id)

    def release(self, allocation: Allocation | str) -> None:
        alloc_id = allocation if isinstance(allocation, str) else allocation.id
        try:
            state = self._load(alloc_id)
        except ProviderError:
            return  # never launched here, or already cleaned up
        self._stop(state["processes"], alloc_id)
        self._procs.pop(alloc_id, None)
        ended = state.setdefault("ended_at", {})
        at = self.now().isoformat()
        for iid, s in state["instances"].items():
            if s == InstanceState.RUNNING:
                state["instances"][iid] = InstanceState.TERMINATED.value
                ended.setdefault(iid, at)
        self._save(alloc_id, state)
        self._unguard(alloc_id)

    # ------------------------------------------------------------------ guards
    def _guard_key(self, alloc_id: str) -> tuple[str, str]:
        return str(self.state_dir.resolve()), alloc_id

    def _guard(self, alloc_id: str, logs: Path) -> None:
        """Start the allocation's guard (once): it releases the allocation if this process
        ends without releasing it (see the module's doc)."""
        key = self._guard_key(alloc_id)
        guard = _GUARDS.get(key)
        if guard is not None and guard.poll() is None:
            return
        with open(logs / "guard.log", "ab") as log:
            _GUARDS[key] = subprocess.Popen(
                [sys.executable, "-m", "srifty_core.cloud.local_guard", str(self.state_dir),
                 alloc_id],
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # not stopped with the caller's process group
                env=scrubbed(),  # a worker's allow-listed environment: it needs no secret
            )  # fmt: skip

    def _unguard(self, alloc_id: str) -> None:
        """The allocation is released: its guard can go."""
        guard = _GUARDS.pop(self._guard_key(alloc_id), None)
        if guard is None or guard.stdin is None:
            return
        with contextlib.suppress(OSError):
            guard.stdin.write(GUARD_KEEP + b"\n")
        with contextlib.suppress(OSError):
            guard.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            guard.wait(timeout=TERM_GRACE_S)

    # ------------------------------------------------------------------ internals
    def _stop(self, records: list[dict[str, Any]], alloc_id: str) -> None:
        """SIGTERM each worker's process group, SIGKILL what is left after the grace
        period, and reap our own children."""
        own = self._procs.get(alloc_id, {})
        live = [r for r in records if pid_alive(r["pid"], r["start_ticks"])]
        for r in live:
            _signal_group(r["pid"], signal.SIGTERM)
        deadline = time.monotonic() + TERM_GRACE_S
        while time.monotonic() < deadline:
            for r in live:
                p = own.get(r["rank"])
                if p is not None:
                    p.poll()
            if not any(pid_alive(r["pid"], r["start_ticks"]) for r in live):
                break
            time.sleep(0.05)
        for r in live:
            # The group may hold grandchildren even when the leader is gone.
            _signal_group(r["pid"], signal.SIGKILL)
        for r in records:
            p = own.get(r["rank"])
            if p is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=TERM_GRACE_S)

    def _path(self, alloc_id: str) -> Path:
        if not alloc_id or "/" in alloc_id or alloc_id.startswith("."):
            raise ConfigError(f"allocation id: {alloc_id!r} is not valid")
        return self.state_dir / f"{alloc_id}.json"

    def _load(self, alloc_id: str) -> dict[str, Any]:
        path = self._path(alloc_id)
        try:
            data: dict[str, Any] = json.loads(path.read_text())
        except FileNotFoundError:
            raise ProviderError(
                f"no local allocation {alloc_id!r} under {self.state_dir}"
            ) from None
        return data

    def _save(self, alloc_id: str, state: dict[str, Any]) -> None:
        write_text_atomic(self._path(alloc_id), json.dumps(state, indent=1))


def local_provider(provider: Provider | None) -> LocalProvider:
    """``provider`` when it is the local one, else the local provider of the default state
    folder (where a job on this machine keeps what it launched)."""
    return provider if isinstance(provider, LocalProvider) else LocalProvider()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    # Each worker leads its own session (start_new_session), so its pgid is its pid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _alloc_to_json(a: Allocation) -> dict[str, Any]:
    d = asdict(a)
    d["market"] = a.market.value
    d["created_at"] = a.created_at.isoformat()
    d["instance_ids"] = list(a.instance_ids)
    return d


def _alloc_from_json(d: dict[str, Any]) -> Allocation:
    return Allocation(
        id=d["id"],
        provider=d["provider"],
        cloud=d["cloud"],
        region=d["region"],
        zone=d["zone"],
        spec=InstanceSpec(**d["spec"]),
        market=Market.parse(d["market"]),
        placement_group=bool(d["placement_group"]),
        instance_ids=tuple(d["instance_ids"]),
        created_at=datetime.fromisoformat(d["created_at"]),
    )
