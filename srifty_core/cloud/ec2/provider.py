"""EC2 itself, through the Airflow Amazon provider's ``EC2Hook`` (boto3 under it): the
provider's launch, release and observation of VMs.

* **Credentials** come from the Airflow connection (``aws_conn_id``, default
  ``aws_default``); this module never reads, logs or writes them, and the user data it
  sends holds no secret (the VM gets AWS access, if it needs any, from its instance
  profile).
* **Launch** is one ``run_instances`` call (``cloud.ec2.launch_args``: on-demand, or spot
  with ``InstanceMarketOptions``: one-time, terminate on interruption), optionally in a fresh
  cluster placement group, with every instance and volume tagged ``srifty:allocation=<id>``
  and ``srifty:managed=true``; then it waits until every instance runs.
* **No leaks.** If anything fails after ``run_instances`` was sent (an error, a timeout,
  Ctrl-C), everything carrying the allocation's tag is terminated before the error goes up.
  ``release`` tags the instances ``srifty:released`` and terminates them; it is idempotent.
* **Interruptions** and exit codes: read with ``describe_instances`` and
  ``describe_spot_instance_requests`` and judged by ``cloud.ec2.records``.
* **Prices** come from the catalog (``cloud.ec2.prices`` refreshes its spot prices).
* **Workers** start from the user data (``cloud.ec2.user_data``: the deployment's wheel,
  then ``srifty probe|profile|train ...``). A configuration (a training's or a probe
  ring's ``TrainingStart``: ``launch_with``, or ``launch_many`` with ``training=``)
  launches its first VM alone, then at once the others with its private address as the
  rendezvous endpoint, in one cluster placement group when asked; each VM runs the start
  script the caller gives (``worker.rendezvous``: torchrun with c10d over the VMs), which
  writes an exit marker into the run folder (on run storage, ``SRIFTY_RUN_STORAGE``) when
  torchrun ends and shuts the VM down, which terminates it
  (``InstanceInitiatedShutdownBehavior=terminate``). ``run`` on a running allocation is
  not supported (no remote shell): pass the worker when launching.

Airflow and boto3 are imported inside methods (importing this module stays light). The tests
run it against a moto server on loopback (a test stand-in, never imported here).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from srifty_core.catalog import Catalog
from srifty_core.catalog.types import Market, Price
from srifty_core.cloud.base import (
    Allocation,
    Instance,
    InstanceSpec,
    Interruption,
    LaunchRequest,
    Provider,
    ProviderError,
    TrainingStart,
    release_all,
)
from srifty_core.cloud.ec2.launch_args import run_instances_args
from srifty_core.cloud.ec2.records import (
    LIVE_STATES,
    TAG_ALLOCATION,
    TAG_MANAGED,
    TAG_MARKET,
    TAG_PLACEMENT,
    TAG_RELEASED,
    exit_codes_from,
    instances_from,
    interruptions_from,
    placement_group,
    tags,
    utc,
)
from srifty_core.cloud.ec2.user_data import (
    INSTALL_S,
    WHEEL_SHA256_ENV,
    WHEEL_URI_ENV,
    TrainingUserData,
    WorkerWheel,
    bootstrap_user_data,
)
from srifty_core.errors import ConfigError, UnknownNameError

log = logging.getLogger(__name__)

AWS_CONN_ENV = "SRIFTY_AWS_CONN_ID"
"""The deployment's Airflow AWS connection for launching VMs (default ``aws_default``): a
deployment setting, never a trigger conf's (``planner.schema.job_conf.DEPLOYMENT_ONLY``)."""


def deployment_conn_id(env: Mapping[str, str] | None = None) -> str:
    """The AWS connection id the deployment chose (``SRIFTY_AWS_CONN_ID``)."""
    value = (os.environ if env is None else env).get(AWS_CONN_ENV, "").strip()
    return value or "aws_default"


EC2_MAX_ATTEMPTS = 10
"""Attempts per EC2 API call (boto's adaptive retry mode) before a throttling or transient
error reaches the caller."""


class EC2Provider(Provider):
    name = "ec2"
    cloud = "aws"
    launch_s = 150.0  # request to running workers: about 150 s
    detach_s = 5.0  # an EBS volume's detach and attach: about 5 s
    starts_workers_at_launch = True  # from the user data

    @classmethod
    def probe_args(cls, region: str, backend: str) -> list[str]:
        ec2 = """--ec2 '{"image_id": "ami-..."}'"""
        return [f"--provider {cls.name}", f"--region {region}", ec2, f"--backend {backend}"]

    @classmethod
    def from_conf(
        cls, ec2: Mapping[str, Any] | None = None, region: str | None = None, **kwargs: Any
    ) -> EC2Provider:
        """The provider a conf's ``ec2`` block asks for (``image_id``, ``subnet_id``,
        ``security_group_ids``, ``key_name``, ``instance_profile_arn``, ``poll_s``,
        ``wait_timeout_s``, ``join_timeout_s``) in ``region``, launching with the
        deployment's connection (``deployment_conn_id``); ``kwargs``: the rest (``worker``,
        ``wheel``, ``training``)."""
        e = dict(ec2 or {})
        return cls(
            aws_conn_id=deployment_conn_id(),
            region=region or "us-east-1",
            image_id=e.get("image_id"),
            subnet_id=e.get("subnet_id"),
            security_group_ids=tuple(e.get("security_group_ids", ())),
            key_name=e.get("key_name"),
            instance_profile_arn=e.get("instance_profile_arn"),
            poll_s=float(e.get("poll_s", 5.0)),
            wait_timeout_s=float(e.get("wait_timeout_s", 900.0)),
            join_timeout_s=e.get("join_timeout_s"),
            **kwargs,
        )

    def __init__(
        self,
        *,
        aws_conn_id: str = "aws_default",
        region: str = "us-east-1",
        image_id: str | None = None,
        subnet_id: str | None = None,
        security_group_ids: Sequence[str] = (),
        key_name: str | None = None,
        instance_profile_arn: str | None = None,
        worker: Sequence[str] | None = None,
        package: str | None = None,
        wheel: WorkerWheel | None = None,
        training: TrainingStart | None = None,
        wait_timeout_s: float = 900.0,
        join_timeout_s: float | None = None,
        poll_s: float = 5.0,
        catalog: Catalog | None = None,
    ) -> None:
        self.aws_conn_id = aws_conn_id
        self.region = region
        self.image_id = image_id
        self.subnet_id = subnet_id
        self.security_group_ids = tuple(security_group_ids)
        self.key_name = key_name
        self.instance_profile_arn = instance_profile_arn
        self.worker = tuple(worker) if worker else None
        if package not in (None, "", "srifty"):
            # What the VMs install is a deployment setting, never a request's or conf's.
            raise ConfigError(
                f"ec2.package: {package!r} is not accepted; the workers install the wheel "
                f"of the deployment settings {WHEEL_URI_ENV} and {WHEEL_SHA256_ENV}"
            )
        self._wheel = wheel
        if training is not None and self.worker:
            raise ConfigError("EC2Provider: give worker (probe, profile) or training, not both")
        self.training = training
        self.wait_timeout_s = wait_timeout_s
        # how long a training VM's torchrun waits for its peers: they boot and install
        # minutes apart (at most the launch wait), then install the wheel
        self.join_timeout_s = int(
            join_timeout_s if join_timeout_s is not None else wait_timeout_s + INSTALL_S
        )
        if self.join_timeout_s < 1:
            raise ConfigError(f"join_timeout_s: >= 1 s, got {join_timeout_s}")
        self.poll_s = poll_s
        self._catalog = catalog
        self._client_cache: Any = None
        self._zone_ids: dict[str, str] | None = None
        self._async_hook: Any = None

    def wheel(self) -> WorkerWheel:
        """The wheel the workers install: the one given, else the deployment's
        (``WorkerWheel.from_env``); a ``ConfigError`` when there is none."""
        wheel = self._wheel or WorkerWheel.from_env()
        if wheel is None:
            raise ConfigError(
                f"EC2 workers install Srifty from a wheel: set {WHEEL_URI_ENV} (https:// or "
                f"s3://) and {WHEEL_SHA256_ENV} in the deployment's environment"
            )
        return wheel

    # ------------------------------------------------------------------ AWS access
    def client(self) -> Any:
        """The boto3 EC2 client of the Airflow connection (created once)."""
        if self._client_cache is None:
            self._client_cache = self._hook().conn
        return self._client_cache

    def _hook(self) -> Any:
        """An ``EC2Hook`` of the Airflow connection, its user agent's caller ``Srifty``."""
        from airflow.providers.amazon.aws.hooks.ec2 import EC2Hook
        from botocore.config import Config

        class SriftyEC2Hook(EC2Hook):
            def _get_caller(self, target_function_name: str = "execute") -> str:
                return "Srifty"  # the hook's own reads every frame's source (~0.3 s)

        return SriftyEC2Hook(
            aws_conn_id=self.aws_conn_id,
            region_name=self.region,
            api_type="client_type",
            # throttling (RequestLimitExceeded) and transient errors: boto's adaptive
            # retry mode, exponential backoff with jitter and client-side rate limiting
            config=Config(retries={"mode": "adaptive", "max_attempts": EC2_MAX_ATTEMPTS}),
        )

    def zone_ids(self) -> dict[str, str]:
        """AZ name -> AZ ID (the catalog uses IDs, which are the same in every account)."""
        if self._zone_ids is None:
            zones = self.client().describe_availability_zones()["AvailabilityZones"]
            self._zone_ids = {z["ZoneName"]: z.get("ZoneId", z["ZoneName"]) for z in zones}
        return self._zone_ids

    def _zone_name(self, zone: str) -> str:
        maps = self.zone_ids()
        by_id = {v: k for k, v in maps.items()}
        if zone in maps:
            return zone
        if zone in by_id:
            return by_id[zone]
        raise UnknownNameError("zone", zone, list(by_id), context=f"in {self.region}")

    # ------------------------------------------------------------------ types, prices
    def catalog(self) -> Catalog:
        return self._catalog or Catalog.load()

    def instance_type(self, name: str) -> InstanceSpec:
        t = self.catalog().get(name, self.region)  # unknown names: the closest ones
        return InstanceSpec.from_catalog(t)

    def price(self, instance_type: str, market: Market | str, zone: str | None = None) -> Price:
        self.instance_type(instance_type)
        catalog = self.catalog()
        if Market.parse(market) is Market.SPOT and zone is None:
            return catalog.cheapest_spot(instance_type, self.region)[1]
        return catalog.price(instance_type, market, self.region, zone)

    # ------------------------------------------------------------------ lifecycle
    def launch(self, request: LaunchRequest) -> Allocation:
        if self.training is not None:
            raise ProviderError(
                "a training configuration launches all its VMs together: use launch_many"
            )
        return self._launch(request, None)

    def launch_script(self, request: LaunchRequest, script: str) -> Allocation:
        """One allocation whose VMs install the worker wheel and run ``script`` (a bash
        script, as a training configuration's start script: ``training_user_data``), e.g.
        a profiling VM (``jobs.profiler_vm``). Launched with
        ``InstanceInitiatedShutdownBehavior=terminate``: a script that ends with
        ``shutdown`` stops the VM's billing itself."""
        if self.training is not None or self.worker:
            raise ProviderError("launch_script: this provider was made for worker or training")
        return self._launch(request, TrainingUserData(script, self.wheel()))

    def launch_many(self, requests: Sequence[LaunchRequest]) -> list[Allocation]:
        """Launch every request; if one fails, what was launched is released first.

        Training (``training`` given): the requests are the configuration's launches in
        the plan's order. The first VM is launched alone and hosts the rendezvous; the
        others, one ``run_instances`` call per request, are launched right after it (not
        waiting for it to run) with its private address as the endpoint; then all are
        waited for together. With ``placement_group`` asked, all share one cluster
        placement group, made here. Each VM's user data installs the wheel and runs
        ``rendezvous.start_script`` for its node group (its index and first rank follow
        from its launch index)."""
        if self.training is None:
            out: list[Allocation] = []
            try:
                for r in requests:
                    out.append(self._launch(r, None))
                return out
            except BaseException as exc:
                try:
                    release_all(self, out)
                except ProviderError as leak:
                    exc.add_note(str(leak))
                raise
        return self.launch_with(requests, self.training)

    def launch_with(
        self, requests: Sequence[LaunchRequest], training: TrainingStart
    ) -> list[Allocation]:
        """``launch_many`` of a configuration whose start is given here (a probe ring's)."""
        if self.worker:
            raise ProviderError("launch_with: this provider was made for worker")
        started: dict[str, list[str]] = {}  # allocation id -> instance ids it returned
        group: str | None = None
        try:
            specs = [self.instance_type(r.instance_type) for r in requests]
            vms = [(r.count, s.ranks_per_instance) for r, s in zip(requests, specs, strict=True)]
            world = sum(count * per for count, per in vms)
            if world != training.world_size:
                raise ConfigError(f"the VMs hold {world} ranks, the plan has {training.world_size}")
            wheel = self.wheel()
            if any(r.placement_group for r in requests):
                group = f"srifty-pg-{uuid.uuid4().hex[:12]}"
                self._create_placement_group(group)
            host = ""  # the first VM reads its own address
            k = 0
            for r in requests:
                for part in [1, r.count - 1] if not started and r.count > 1 else [r.count]:
                    script = training.start_script(vms, k, host, self.join_timeout_s)
                    k += 1
                    req = LaunchRequest(r.instance_type, part, r.market, r.zone, r.placement_group)
                    alloc_id = _new_id()
                    started[alloc_id] = []
                    raws = self._run_instances(
                        alloc_id,
                        req,
                        TrainingUserData(script, wheel),
                        group if r.placement_group else None,
                    )
                    started[alloc_id] = [i["InstanceId"] for i in raws]
                    if not host:
                        host = str(raws[0].get("PrivateIpAddress") or "")
                        if not host:
                            raise ProviderError(f"{alloc_id}: the first VM has no private address")
            self._wait_running([i for ids in started.values() for i in ids])
            return [self.get_allocation(a) for a in started]
        except BaseException:
            log.warning("launch of %s failed; terminating what it started", list(started))
            for alloc_id, ids in started.items():
                self._cleanup(alloc_id, ids, None)
            if group is not None:
                self._delete_placement_group(group)
            raise

    def _launch(self, request: LaunchRequest, user_data: Callable[[str], str] | None) -> Allocation:
        """One ``run_instances`` call (in a placement group of its own when asked), then
        wait until its instances run; ``user_data(allocation id)`` is the VMs' user data
        (default: ``bootstrap_user_data`` of ``worker``, if any)."""
        alloc_id = _new_id()
        group = alloc_id if request.placement_group else None
        launched: list[str] = []
        try:
            if group is not None:
                self._create_placement_group(group)
            launched = [
                i["InstanceId"] for i in self._run_instances(alloc_id, request, user_data, group)
            ]
            self._wait_running(launched)
            return self.get_allocation(alloc_id)
        except BaseException:
            log.warning("launch of %s failed; terminating what it started", alloc_id)
            self._cleanup(alloc_id, launched, group)
            raise

    def _run_instances(
        self,
        alloc_id: str,
        request: LaunchRequest,
        user_data: Callable[[str], str] | None,
        group: str | None,
    ) -> list[dict[str, Any]]:
        """The ``run_instances`` call of allocation ``alloc_id`` (in placement group
        ``group``, if any); returns the instances of its answer. Cleaning up after a
        failure is the caller's (``_cleanup``: by tag, so also what a call that timed out
        started)."""
        spec = self.instance_type(request.instance_type)
        market = Market.parse(request.market)
        if not self.image_id:
            raise ConfigError("image_id: EC2Provider(image_id=...) needs an AMI to launch")
        if user_data is not None:
            data: str | None = user_data(alloc_id)
        elif self.worker:
            data = bootstrap_user_data(self.worker, wheel=self.wheel(), allocation_id=alloc_id)
        else:
            data = None
        kwargs = run_instances_args(
            alloc_id,
            spec.name,
            request.count,
            market,
            image_id=self.image_id,
            user_data=data,
            zone_name=self._zone_name(request.zone) if request.zone else None,
            group=group,
            subnet_id=self.subnet_id,
            security_group_ids=self.security_group_ids,
            key_name=self.key_name,
            instance_profile_arn=self.instance_profile_arn,
        )
        log.info("launching %d x %s (%s) as %s", request.count, spec.name, market, alloc_id)
        resp = self.client().run_instances(**kwargs)
        return list(resp["Instances"])

    def _wait_running(self, instance_ids: Sequence[str]) -> None:
        """Poll until every instance runs; one that ends first, or the timeout, fails."""
        deadline = time.monotonic() + self.wait_timeout_s
        while True:
            states = {i["InstanceId"]: i["State"]["Name"] for i in self._raw(instance_ids)}
            if states and all(s == "running" for s in states.values()):
                return
            dead = [i for i, s in states.items() if s not in ("pending", "running")]
            if dead:
                raise ProviderError(f"instance(s) {dead} ended before running: {states}")
            if time.monotonic() > deadline:
                raise ProviderError(
                    f"instances not running after {self.wait_timeout_s:.0f} s: {states}"
                )
            time.sleep(self.poll_s)

    def _cleanup(self, alloc_id: str, known: Sequence[str], group: str | None) -> None:
        """Terminate every instance of the allocation (known ids and any carrying its tag)
        and delete placement group ``group``, if given. Never raises: it runs while another
        error is on its way up."""
        try:  # the ids run_instances returned first: describing may be what failed
            self._terminate(sorted(known))
        except Exception as exc:
            log.error("cleanup of %s failed (%s); terminate by tag %s", alloc_id, exc, alloc_id)
        try:  # then anything else carrying the allocation's tag
            tagged = {i["InstanceId"] for i in self._by_tag(alloc_id)} - set(known)
            self._terminate(sorted(tagged))
        except Exception as exc:
            log.error("cleanup of %s failed (%s); terminate by tag %s", alloc_id, exc, alloc_id)
        if group is not None:
            self._delete_placement_group(group)

    def _terminate(self, ids: Sequence[str]) -> None:
        if not ids:
            return
        client = self.client()
        stamp = datetime.now(UTC).isoformat()
        with contextlib.suppress(Exception):
            client.create_tags(Resources=list(ids), Tags=[{"Key": TAG_RELEASED, "Value": stamp}])
        client.terminate_instances(InstanceIds=list(ids))

    def _create_placement_group(self, name: str) -> None:
        self.client().create_placement_group(
            GroupName=name,
            Strategy="cluster",
            TagSpecifications=[
                {
                    "ResourceType": "placement-group",
                    "Tags": [
                        {"Key": TAG_ALLOCATION, "Value": name},
                        {"Key": TAG_MANAGED, "Value": "true"},
                    ],
                }
            ],
        )

    def _delete_placement_group(self, name: str) -> None:
        with contextlib.suppress(Exception):
            self.client().delete_placement_group(GroupName=name)

    def _raw(self, instance_ids: Sequence[str]) -> list[dict[str, Any]]:
        if not instance_ids:
            return []
        pages = (
            self.client()
            .get_paginator("describe_instances")
            .paginate(InstanceIds=list(instance_ids))
        )
        return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]

    def _by_tag(self, alloc_id: str) -> list[dict[str, Any]]:
        pages = (
            self.client()
            .get_paginator("describe_instances")
            .paginate(Filters=[{"Name": f"tag:{TAG_ALLOCATION}", "Values": [alloc_id]}])
        )
        found = [i for page in pages for r in page["Reservations"] for i in r["Instances"]]
        return sorted(found, key=lambda i: (i.get("AmiLaunchIndex", 0), i["InstanceId"]))

    def get_allocation(self, allocation_id: str) -> Allocation:
        raw = self._by_tag(allocation_id)
        if not raw:
            raise ProviderError(f"no EC2 instances tagged {TAG_ALLOCATION}={allocation_id}")
        found = tags(raw[0])
        zone_name = raw[0].get("Placement", {}).get("AvailabilityZone", "")
        return Allocation(
            id=allocation_id,
            provider=self.name,
            cloud=self.cloud,
            region=self.region,
            zone=self.zone_ids().get(zone_name, zone_name),
            spec=self.instance_type(raw[0]["InstanceType"]),
            market=Market.parse(found.get(TAG_MARKET, "on-demand")),
            placement_group=placement_group(allocation_id, found) is not None,
            instance_ids=tuple(i["InstanceId"] for i in raw),
            created_at=min(utc(i["LaunchTime"]) for i in raw),
        )

    def describe(self, allocation: Allocation) -> tuple[Instance, ...]:
        by_id = {i["InstanceId"]: i for i in self._raw(allocation.instance_ids)}
        return instances_from(allocation, by_id, self.now)

    def interruptions(self, allocation: Allocation) -> tuple[Interruption, ...]:
        raws = {i["InstanceId"]: i for i in self._raw(allocation.instance_ids)}
        spot_ids = [
            r["SpotInstanceRequestId"] for r in raws.values() if r.get("SpotInstanceRequestId")
        ]
        reqs: list[Mapping[str, Any]] = []
        if spot_ids:
            found = self.client().describe_spot_instance_requests(SpotInstanceRequestIds=spot_ids)
            reqs = found.get("SpotInstanceRequests", [])
        return interruptions_from(allocation, raws, reqs, self.now)

    async def observe_async(
        self, allocations: Sequence[Allocation]
    ) -> tuple[dict[str, tuple[Interruption, ...]], dict[str, dict[int, int | None]]]:
        """``interruptions`` and ``exit_codes`` of each allocation through the Amazon
        provider's async hook (``EC2Hook.get_async_conn``: aiobotocore, kept between calls):
        two API calls for every allocation together, so a slow or throttled EC2 API never
        blocks the event loop; the same rules as the synchronous calls
        (``records.interruptions_from``, ``records.exit_codes_from``)."""
        ids = [i for a in allocations for i in a.instance_ids]
        raws: dict[str, dict[str, Any]] = {}
        requests: list[dict[str, Any]] = []
        if ids:
            if self._async_hook is None:
                self._async_hook = self._hook()
            async with await self._async_hook.get_async_conn() as client:
                pages = client.get_paginator("describe_instances").paginate(InstanceIds=ids)
                async for page in pages:
                    for r in page["Reservations"]:
                        raws.update({i["InstanceId"]: i for i in r["Instances"]})
                spot = [
                    r["SpotInstanceRequestId"]
                    for r in raws.values()
                    if r.get("SpotInstanceRequestId")
                ]
                if spot:
                    resp = await client.describe_spot_instance_requests(SpotInstanceRequestIds=spot)
                    requests = list(resp.get("SpotInstanceRequests", []))
        return (
            {a.id: interruptions_from(a, raws, requests, self.now) for a in allocations},
            {a.id: exit_codes_from(a, raws, self.now) for a in allocations},
        )

    def run(
        self,
        allocation: Allocation,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
    ) -> None:
        raise ProviderError(
            "EC2Provider starts workers from user data at launch: create it with "
            "EC2Provider(worker=['probe', ...], image_id=...) and launch again"
        )

    def exit_codes(self, allocation: Allocation) -> dict[int, int | None]:
        """Unknown from here (workers report through the probe store and the progress log):
        ``None`` per rank while its instance runs, -1 once it has ended. Training VMs write
        torchrun's exit code into the run folder (``rendezvous.exit_markers``), which the
        monitor reads."""
        raws = {i["InstanceId"]: i for i in self._raw(allocation.instance_ids)}
        return exit_codes_from(allocation, raws, self.now)

    def stop(self, allocation: Allocation) -> None:
        """Workers stop with their instances: release the allocation."""
        self.release(allocation)

    def release(self, allocation: Allocation | str) -> None:
        alloc_id = allocation if isinstance(allocation, str) else allocation.id
        raw = self._by_tag(alloc_id)
        live = [i["InstanceId"] for i in raw if i["State"]["Name"] in LIVE_STATES]
        if live:
            log.info("terminating %d instance(s) of %s", len(live), alloc_id)
        self._terminate(live)
        group = placement_group(alloc_id, tags(raw[0])) if raw else None
        if group is not None and not self._placement_group_in_use(group):
            self._delete_placement_group(group)  # the last allocation in it was released

    def _placement_group_in_use(self, group: str) -> bool:
        """Whether a live instance (of another allocation) is still in ``group``."""
        pages = (
            self.client()
            .get_paginator("describe_instances")
            .paginate(
                Filters=[
                    {"Name": f"tag:{TAG_PLACEMENT}", "Values": [group]},
                    {"Name": "instance-state-name", "Values": list(LIVE_STATES)},
                ]
            )
        )
        return any(r["Instances"] for page in pages for r in page["Reservations"])


def _new_id() -> str:
    return f"srifty-{uuid.uuid4().hex[:12]}"
