"""A probe sweep on VMs that start their workers at launch (EC2): each allocation slot's
ring launched with the probe worker in its user data, its rows read back from the run
storage.

``StartAtLaunch`` is the sweep's ``measure.sweep.RingRunner`` for such providers
(``Provider.starts_workers_at_launch``), for one instance type or a mix alike:

* ``launch_slot``: the slot's probe plan (the points it misses, the sustained probe,
  ``out``: ``rows.jsonl``) is written to a fresh folder of the run storage
  (``<storage>/probes/<day>/<provider>/<label>/slot-<k>-<id>/``); every VM's start script
  (``worker.rendezvous.start_script`` with the probe worker as torchrun's module) holds
  only a stub naming it (EC2's user data is at most 16 KB). The ring's VMs are launched
  as one configuration (``Provider.launch_with``: the first VM alone, hosting the c10d
  rendezvous, the others told its address). Each VM installs the wheel, joins the ring,
  measures (rank 0 writes the rows after each point), writes its exit marker into the
  folder and shuts itself down.
* ``collect_slot``: wait until every VM has reported its exit (or every instance has
  ended, or the wait ran out: ``wait_s`` for launch, install and join, then the sweep's
  timeout), copying rank 0's rows into the slot's partial file as they come (progress);
  then label them with the allocations (their ids and zones were unknown when the plan was
  written) and settle what is missing as failed points (``measure.runner.settle``), as a
  sweep on the local provider does. The sweep then releases the VMs (one that shut down
  is terminated already) and commits the partition.

Needs run storage (``SRIFTY_RUN_STORAGE``): the VMs write there and this process reads.
The probe sweep DAG runs ``launch_slot`` and ``collect_slot`` as separate tasks (the folder
travels in XCom); ``srifty probe --provider ec2`` runs them through ``StartAtLaunch``.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import date
from pathlib import Path
from typing import Any

from filelock import FileLock

from srifty_core import paths
from srifty_core.cloud import get_provider, provider_class
from srifty_core.cloud.base import Allocation, LaunchRequest, Provider
from srifty_core.errors import ConfigError
from srifty_core.jobs.artifact import worker_wheel
from srifty_core.jobs.cloud_request import ec2_settings
from srifty_core.jobs.profiler_vm import safe_name
from srifty_core.measure.checks import checked_size
from srifty_core.measure.mix_sweep import ring_config, ring_requests
from srifty_core.measure.partials import (
    Partition,
    complete_points,
    parse_partial_text,
    partial_dir,
    rewrite_partial,
    writer_lock,
)
from srifty_core.measure.runner import (
    FailedPoint,
    Wait,
    labels,
    probe_plan,
    ring_id,
    ring_labels,
    settle,
)
from srifty_core.measure.sweep import (
    RingRunner,
    SlotWork,
    SweepResult,
    launch_requests,
    missing_in_slot,
    slot_result,
)
from srifty_core.probing.config import Point, SweepConfig
from srifty_core.probing.mix import parse_mix
from srifty_core.runs import store as run_store
from srifty_core.worker.rendezvous import TrainingStart, exit_markers, run_id

PROBE_MODULE = "srifty_core.measure.probe_worker"
CONFIG_ID = "probe"
"""The configuration id of a probe ring's exit markers (``exit-probe-<node>.json``)."""
PLAN_NAME = "plan.json"
ROWS_NAME = "rows.jsonl"
WAIT_S = 1800.0
"""How long a ring's VMs may take to launch, install the wheel and join before its
sweep's own timeout starts counting (EC2's launch wait and install time, 900 + 600 s,
with a margin)."""
POLL_S = 5.0


def _run_storage(provider: str) -> str:
    storage = paths.run_storage()
    if storage is None:
        raise ConfigError(
            f"probing on {provider} VMs needs run storage they can write: set "
            f"{paths.RUN_STORAGE_ENV} (an s3:// URI the VMs' instance profile can write)"
        )
    return storage


def slot_folder(work: SlotWork, provider: Provider) -> str:
    """A fresh folder of the run storage for one slot's ring; a ``ConfigError`` naming
    ``SRIFTY_RUN_STORAGE`` when there is none (checked before anything is launched)."""
    storage = _run_storage(provider.name)
    name = f"slot-{work.slot}-{uuid.uuid4().hex[:10]}"
    where = ("probes", work.day.isoformat(), provider.name, safe_name(work.label), name)
    return str(run_store.join(storage, *where))


def launch_slot(provider: Provider, work: SlotWork) -> tuple[tuple[Allocation, ...], str]:
    """Write the slot's plan to a fresh run-storage folder and launch the ring with the
    probe worker in its VMs' start scripts; the allocations (in launch order) and the
    folder."""
    folder = slot_folder(work, provider)
    specs = [provider.instance_type(r.instance_type) for r in work.requests]
    world = sum(r.count * s.ranks_per_instance for r, s in zip(work.requests, specs, strict=True))
    out = str(run_store.join(folder, ROWS_NAME))
    plan = probe_plan(work.config, work.points, work.sustained_slot, {"date": ""}, out)
    plan_uri = str(run_store.join(folder, PLAN_NAME))
    run_store.write_text(plan_uri, json.dumps({**plan, "label": work.label}))
    stub = {"world_size": world, "run_dir": folder, "config_id": CONFIG_ID, "plan": plan_uri}
    start = TrainingStart(json.dumps(stub), run_id(CONFIG_ID, folder), module=PROBE_MODULE)
    return tuple(provider.launch_with(work.requests, start)), folder


def ring_row_labels(ring: Sequence[Allocation], day: date) -> dict[str, Any]:
    """The labels of a ring's rows: one type's (its allocations' ids joined, as one
    allocation of the store), or a mix's (``measure.runner.ring_labels``). A configuration
    launches its first VM alone, so one type may come as two allocations: they count as
    one member."""
    by_type: dict[str, list[Allocation]] = {}
    for a in ring:
        by_type.setdefault(a.spec.name, []).append(a)
    members = [
        dataclasses.replace(
            group[0],
            id=ring_id(group),
            instance_ids=tuple(i for a in group for i in a.instance_ids),
            placement_group=all(a.placement_group for a in group),
        )
        for group in by_type.values()
    ]
    if len(members) == 1:
        return labels(members[0], day)
    return ring_labels(members, day)


def collect_slot(
    provider: Provider,
    ring: Sequence[Allocation],
    folder: str,
    *,
    day: date,
    root: Path | None = None,
    on_point: Callable[[], None] | None = None,
    wait_s: float = WAIT_S,
    poll_s: float = POLL_S,
) -> list[FailedPoint]:
    """Wait for the ring launched by ``launch_slot`` into ``folder``, keeping its rows in
    the slot's partial file of ``day`` as they come, and settle them (the failed points).
    What it measured is read from the plan in ``folder``, so another process (the DAG's
    next task) can collect what one launched."""
    text = run_store.read_text(run_store.join(folder, PLAN_NAME))
    if text is None:
        raise ConfigError(f"no probe plan in {folder}: was the ring launched by launch_slot?")
    plan = json.loads(text)
    config = SweepConfig.from_dict(plan["config"])
    points = [Point(*p) for p in plan["points"]]
    sustained = plan["sustained"][0] if plan.get("sustained") else None
    row_labels = ring_row_labels(ring, day)
    if row_labels["instance_type"] != plan["label"]:
        raise ConfigError(
            f"the ring is {row_labels['instance_type']}, its plan in {folder} {plan['label']}"
        )
    local = partial_dir(day, ring[0].provider, plan["label"], root)
    local.mkdir(parents=True, exist_ok=True)
    out = local / f"{ring_id(ring)}.jsonl"
    nnodes = sum(a.count for a in ring)
    wait = Wait(wait_s + config.sweep_timeout_s)
    seen = 0
    rows: list[dict[str, Any]] = []
    with FileLock(writer_lock(out)):
        while True:
            markers = exit_markers(folder, CONFIG_ID)
            rows = _rows(folder, row_labels, rows, out)
            done = len(complete_points(rows, config.repeats))
            if on_point is not None:
                for _ in range(done - seen):
                    on_point()
            seen = max(seen, done)
            ended = len(markers) >= nnodes or all(
                c is not None for a in ring for c in provider.exit_codes(a).values()
            )
            if wait.over(ended, any(c != 0 for c in markers.values())):
                break
            time.sleep(poll_s)
        rows = _rows(folder, row_labels, rows, out)
    codes: dict[int, int | None] = {k: code for k, (_, code) in enumerate(sorted(markers.items()))}
    for k in range(len(codes), nnodes):  # a VM that never reported
        codes[k] = None if wait.timed_out else -1
    return settle(
        out, rows, points, config, row_labels,
        codes=codes, timed_out=wait.timed_out, sustained_slot=sustained,
    )  # fmt: skip


def _rows(
    folder: str, row_labels: dict[str, Any], last: list[dict[str, Any]], out: Path
) -> list[dict[str, Any]]:
    """Rank 0's rows so far, labelled with the ring, copied into the partial file when
    they changed; ``last`` when the run storage has none (yet)."""
    data = run_store.read_bytes(run_store.join(folder, ROWS_NAME))
    if data is None:
        return last
    rows = parse_partial_text(data.decode("utf-8", errors="replace"), row_labels)
    if len(rows) != len(last):
        rewrite_partial(out, rows)
    return rows


class StartAtLaunch:
    """The sweep's ring runner for VMs that start their workers at launch
    (``measure.sweep.RingRunner``): ``launch_slot``, then ``collect_slot``."""

    def __init__(self, *, wait_s: float = WAIT_S, poll_s: float = POLL_S) -> None:
        self.wait_s, self.poll_s = wait_s, poll_s
        self._folders: dict[str, str] = {}

    def launch(self, provider: Provider, work: SlotWork) -> Sequence[Allocation]:
        ring, folder = launch_slot(provider, work)
        self._folders[ring_id(ring)] = folder
        vms = sum(a.count for a in ring)
        print(  # minutes pass before the first point: say what is being waited for
            f"probe {work.label}: slot {work.slot}: {vms} VM(s) launched ({ring_id(ring)}); "
            "they install the worker, join as one ring and write their rows to "
            f"{folder}",
            file=sys.stderr,
        )
        return ring

    def measure(
        self,
        provider: Provider,
        ring: Sequence[Allocation],
        work: SlotWork,
        on_point: Callable[[], None] | None,
    ) -> list[FailedPoint]:
        return collect_slot(
            provider, ring, self._folders.pop(ring_id(ring)), day=work.day, root=work.root,
            on_point=on_point, wait_s=self.wait_s, poll_s=self.poll_s,
        )  # fmt: skip


def probe_provider(
    name: str,
    *,
    ec2: Mapping[str, Any] | None = None,
    region: str = "us-east-1",
    launching: bool = True,
) -> tuple[Provider, RingRunner | None]:
    """The provider a probe sweep runs on, and its ring runner: for VMs that start their
    workers at launch (EC2), the provider of the ``ec2`` settings (an AMI required,
    ``cloud_request.ec2_settings``) in ``region``, with the worker wheel its VMs install
    (``artifact.worker_wheel``; ``launching=False``: none, for a step that only watches or
    releases), and ``StartAtLaunch``; else the provider's defaults and ``None`` (the
    sweep's own launch-then-run)."""
    cls = provider_class(name)
    if not cls.starts_workers_at_launch:
        if ec2:
            raise ConfigError(f"--ec2: settings of the ec2 provider, not of {name}")
        return get_provider(name), None
    settings = ec2_settings(ec2 or {})
    _run_storage(name)  # before a wheel is built and uploaded for nothing
    wheel = worker_wheel() if launching else None
    provider = get_provider(name, ec2=settings, region=region, wheel=wheel)
    return provider, StartAtLaunch(poll_s=float(settings.get("poll_s", POLL_S)))


# ----------------------------------------------------------- the sweep DAG's two steps
def launch_for_slot(
    config: SweepConfig,
    provider: Provider,
    label: str,
    requests: Sequence[LaunchRequest],
    *,
    slot: int,
    day: date,
    root: Path | None = None,
) -> tuple[tuple[Allocation, ...], str]:
    """The DAG's setup step: launch the ring for what ``label``'s partition of ``day``
    still misses of ``slot`` (``launch_slot``); nothing (``((), "")``) when it misses
    nothing."""
    records = Partition(day, provider.name, label, root, fresh=False).all_records()
    todo, sustained = missing_in_slot(records, config, slot)
    if not todo and sustained is None:
        return (), ""
    work = SlotWork(config, label, tuple(requests), slot, tuple(todo), sustained, day, root)
    return launch_slot(provider, work)


def sweep_launched(
    config: SweepConfig,
    provider: Provider,
    ring: Sequence[Allocation],
    folder: str,
    label: str,
    *,
    slot: int,
    day: date,
    root: Path | None = None,
    poll_s: float = POLL_S,
) -> SweepResult:
    """The DAG's sweep step on what ``launch_for_slot`` launched into ``folder``:
    ``collect_slot``, then commit the partition (the teardown step releases the ring)."""
    t0 = time.perf_counter()
    todo: list[Point] = []
    failures: list[FailedPoint] = []
    if ring:
        text = run_store.read_text(run_store.join(folder, PLAN_NAME)) or "{}"
        todo = [Point(*p) for p in json.loads(text).get("points", [])]
        failures = collect_slot(provider, ring, folder, day=day, root=root, poll_s=poll_s)
    part = Partition(day, provider.name, label, root, fresh=False)
    return slot_result(config, part, slot, todo, failures, [a.id for a in ring], t0)


def allocate_slot(
    config: SweepConfig,
    provider: Provider,
    runner: RingRunner | None,
    *,
    instance_type: str | None = None,
    mix: str | None = None,
    slot: int,
    day: date,
) -> tuple[tuple[Allocation, ...], str, str]:
    """The probe sweep DAG's setup step for one slot of one type or mix (``runner`` from
    ``probe_provider``): the ring launched (one allocation per member type, or for VMs
    that start their workers at launch the configuration ``launch_for_slot`` launched),
    its run-storage folder (``""`` where workers start after launch) and the partition's
    label."""
    if mix is not None:
        counts = parse_mix(mix, field="mix")
        config, label = ring_config(config, counts, provider)
        requests = ring_requests(counts)
    else:
        spec, count = checked_size(config, provider, str(instance_type), None)
        label, requests = spec.name, (LaunchRequest(spec.name, count),)
    if runner is None:
        return launch_requests(provider, requests), "", label
    ring, folder = launch_for_slot(config, provider, label, requests, slot=slot, day=day)
    return ring, folder, label
