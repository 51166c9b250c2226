"""The EC2 provider against a moto server on loopback (moto is the only stand-in for AWS
and lives in the tests only): contract, tags, spot, interruptions, prices, user data, and
no leaked instances after failures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from srifty_core.catalog import Catalog, read_overlay
from srifty_core.catalog.types import Market
from srifty_core.cloud import InstanceState, LaunchRequest, Provider, ProviderError
from srifty_core.cloud.ec2 import EC2Provider
from srifty_core.cloud.ec2.prices import refresh_spot_prices
from srifty_core.cloud.ec2.records import TAG_ALLOCATION
from srifty_core.cloud.ec2.user_data import (
    WHEEL_SHA256_ENV,
    WHEEL_URI_ENV,
    WorkerWheel,
    bootstrap_user_data,
)
from srifty_core.errors import ConfigError
from tests.cloud.moto_aws import AMI, SECRET, live_instances
from tests.cloud.provider_contract import ProviderContract


@pytest.fixture
def groups(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Placement groups created and deleted (moto 5.2 has no placement-group actions, so
    these two calls are recorded instead of sent)."""
    seen: dict[str, list[str]] = {"created": [], "deleted": []}
    monkeypatch.setattr(
        EC2Provider, "_create_placement_group", lambda self, n: seen["created"].append(n)
    )
    monkeypatch.setattr(
        EC2Provider, "_delete_placement_group", lambda self, n: seen["deleted"].append(n)
    )
    return seen


def provider(**kw: Any) -> EC2Provider:
    return EC2Provider(image_id=AMI, poll_s=0.05, wait_timeout_s=20, **kw)


class TestEC2Contract(ProviderContract):
    unpriced_type = "g3.4xlarge"  # no spot price in the catalog
    unpriced_market = "spot"

    @pytest.fixture
    def provider(self, aws: Any) -> EC2Provider:
        self.client = aws
        return provider()

    def interrupt(self, provider: Provider, instance_id: str) -> None:
        # EC2 takes the VM back: terminated by someone else, without our released tag.
        self.client.terminate_instances(InstanceIds=[instance_id])


def test_launch_tags_spot_placement_and_release_by_id(
    aws: Any, groups: dict[str, list[str]]
) -> None:
    p = provider()
    a = p.launch(LaunchRequest("g4dn.12xlarge", count=3, market=Market.SPOT, placement_group=True))
    assert a.market is Market.SPOT and a.placement_group and a.ranks == 12
    raw = aws.describe_instances(InstanceIds=list(a.instance_ids))["Reservations"]
    insts = [i for r in raw for i in r["Instances"]]
    assert {i["InstanceLifecycle"] for i in insts} == {"spot"}
    assert all({"Key": TAG_ALLOCATION, "Value": a.id} in i["Tags"] for i in insts)
    assert a.zone.startswith("use1-")  # an AZ ID, like the catalog's
    # Another process (a teardown task) releases it by id.
    EC2Provider().release(a.id)
    assert live_instances(aws) == []
    assert [i.state for i in p.describe(a)] == [InstanceState.TERMINATED] * 3
    assert groups == {"created": [a.id], "deleted": [a.id]}


@pytest.mark.parametrize("where", ["wait", "describe", "interrupt"])
def test_no_leaks_when_launch_fails(
    aws: Any, monkeypatch: pytest.MonkeyPatch, groups: dict[str, list[str]], where: str
) -> None:
    p = provider()
    aws.run_instances(ImageId=AMI, InstanceType="t3.micro", MinCount=1, MaxCount=1)  # not ours

    def boom(*args: Any, **kwargs: Any) -> Any:
        if where == "interrupt":
            raise KeyboardInterrupt
        raise ProviderError(f"injected failure in {where}")

    target = {"wait": "_wait_running", "describe": "get_allocation", "interrupt": "_wait_running"}
    monkeypatch.setattr(EC2Provider, target[where], boom)
    with pytest.raises((ProviderError, KeyboardInterrupt)):
        p.launch(LaunchRequest("g4dn.xlarge", count=4, placement_group=True))
    left = live_instances(aws)
    assert len(left) == 1  # only the instance we did not launch survives
    assert len(groups["created"]) == 1 and groups["deleted"] == groups["created"]


def test_no_leaks_when_an_instance_dies_while_waiting(
    aws: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = provider()
    real = EC2Provider._raw

    def raw_then_kill(self: EC2Provider, ids: Any) -> Any:
        aws.stop_instances(InstanceIds=[ids[0]])  # one instance ends before it runs
        return real(self, ids)

    monkeypatch.setattr(EC2Provider, "_raw", raw_then_kill)
    with pytest.raises(ProviderError, match="ended before running"):
        p.launch(LaunchRequest("g4dn.xlarge", count=3))
    assert live_instances(aws) == []


def test_spot_prices_refresh_into_the_overlay(aws: Any, data_dir: Path) -> None:
    path = refresh_spot_prices(provider(), ["g4dn.xlarge"])
    assert path.parent == data_dir / "prices"
    text = path.read_text()
    assert "g4dn.xlarge" in text and "ec2:describe_spot_price_history" in text
    zone = text.splitlines()[1].split(",")[3]
    assert zone.startswith("use1-az")
    obs = read_overlay(path)
    assert obs and {o.market for o in obs} == {Market.SPOT}
    # Merged by date: moto's dummy history is older than the shipped snapshot, so the
    # shipped price stays unless the observation is at least as recent.
    shipped = Catalog.load(use_overlays=False).price("g4dn.xlarge", "spot", "us-east-1", zone)
    merged = Catalog.load().price("g4dn.xlarge", "spot", "us-east-1", zone)
    (mine,) = [o for o in obs if o.zone == zone and o.instance_type == "g4dn.xlarge"]
    newer = mine.price.observed_on >= shipped.observed_on
    assert merged == (mine.price if newer else shipped)


WHEEL = WorkerWheel("https://artifacts.example.com/srifty/srifty-0.1.0-py3-none-any.whl", "ab" * 32)


def test_user_data_installs_and_starts_the_worker(
    aws: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = bootstrap_user_data(
        ["probe", "--world-sizes", "2,4", "--sizes", "4B:64MB"], wheel=WHEEL, allocation_id="a1"
    )
    lines = script.splitlines()
    local = "/opt/srifty/wheel/srifty-0.1.0-py3-none-any.whl"
    fetch = next(i for i, x in enumerate(lines) if x.startswith("curl "))
    check = lines.index(f"echo '{'ab' * 32}  {local}' | sha256sum --check --strict -")
    install = lines.index(f"/opt/srifty/bin/pip install '{local}[worker]'")
    assert lines[1] == "set -euo pipefail" and fetch < check < install  # no install unchecked
    assert "--proto =https" in lines[fetch] and WHEEL.uri in lines[fetch]
    assert not any("pip install srifty" in x for x in lines)  # never the public index's
    assert "nohup /opt/srifty/bin/srifty probe --world-sizes 2,4 --sizes 4B:64MB" in script
    s3 = WorkerWheel("s3://deploy-bucket/w/srifty-0.1.0-py3-none-any.whl", "cd" * 32)
    assert "aws s3 cp --only-show-errors s3://deploy-bucket/w/srifty-0.1.0" in "\n".join(
        s3.install_lines()
    )
    with pytest.raises(ConfigError, match="worker"):
        bootstrap_user_data(["rm", "-rf", "/"], wheel=WHEEL)
    caplog.set_level("DEBUG")
    # The wheel is a deployment setting (the environment), not the request's or conf's.
    monkeypatch.setenv(WHEEL_URI_ENV, WHEEL.uri)
    monkeypatch.setenv(WHEEL_SHA256_ENV, WHEEL.sha256.upper())
    p = provider(worker=["train", "--plan", "plan.json"])
    assert p.wheel() == WHEEL
    a = p.launch(LaunchRequest("g4dn.xlarge", count=1))
    try:
        attr = aws.describe_instance_attribute(InstanceId=a.instance_ids[0], Attribute="userData")
        import base64

        sent = base64.b64decode(attr["UserData"]["Value"]).decode()
        assert "srifty train --plan plan.json" in sent and a.id in sent
        assert WHEEL.sha256 in sent
        assert SECRET not in sent
        with pytest.raises(ProviderError, match="user data"):
            p.run(a, ["srifty", "probe"])
    finally:
        p.release(a)
    assert SECRET not in caplog.text


@pytest.mark.parametrize(
    ("uri", "sha", "match"),
    [
        ("http://h/srifty-0.1.0-py3-none-any.whl", "ab" * 32, "https:// or s3://"),
        ("https://h/srifty-0.1.0.tar.gz", "ab" * 32, "wheel's file name"),
        ("https://h/evil-0.1.0-py3-none-any.whl", "ab" * 32, "wheel's file name"),
        ("https://h/srifty-0.1.0-py3-none-any.whl", "ab" * 31, WHEEL_SHA256_ENV),
        ("https://h/srifty-0.1.0-py3-none-any.whl", "xy" * 32, WHEEL_SHA256_ENV),
    ],
)
def test_a_bad_worker_wheel_is_refused(uri: str, sha: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        WorkerWheel(uri, sha)


def test_workers_need_the_deployments_wheel_and_a_conf_cannot_name_one(
    aws: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(WHEEL_URI_ENV, raising=False)
    monkeypatch.delenv(WHEEL_SHA256_ENV, raising=False)
    p = provider(worker=["train", "plan.json"])
    with pytest.raises(ConfigError, match=WHEEL_URI_ENV):
        p.launch(LaunchRequest("g4dn.xlarge", count=1))
    assert live_instances(aws) == []  # refused before anything was launched
    monkeypatch.setenv(WHEEL_URI_ENV, WHEEL.uri)
    with pytest.raises(ConfigError, match="both"):
        WorkerWheel.from_env()
    with pytest.raises(ConfigError, match=r"ec2\.package"):
        provider(package="srifty==0.1.0 --index-url https://elsewhere.example/simple")
    provider(package="srifty")  # what an older conf sends by default: ignored


def test_no_leaks_when_describe_instances_fails_during_launch(
    aws: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = provider()

    def no_describe(*args: Any, **kwargs: Any) -> Any:
        raise ProviderError("injected: DescribeInstances throttled")

    # waiting and the cleanup's tag lookup both describe: only run_instances' ids are left
    monkeypatch.setattr(EC2Provider, "_raw", no_describe)
    monkeypatch.setattr(EC2Provider, "_by_tag", no_describe)
    with pytest.raises(ProviderError, match="throttled"):
        p.launch(LaunchRequest("g4dn.xlarge", count=3))
    assert live_instances(aws) == []


def test_every_allocation_is_released_when_one_release_fails(
    aws: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from srifty_core.cloud.base import release_all

    p = provider()
    first = p.launch(LaunchRequest("g4dn.xlarge", count=1))
    second = p.launch(LaunchRequest("g4dn.xlarge", count=2))
    real = EC2Provider.release

    def flaky(self: EC2Provider, allocation: Any) -> None:
        name = allocation if isinstance(allocation, str) else allocation.id
        if name == first.id:
            raise ProviderError("injected: TerminateInstances failed")
        real(self, allocation)

    monkeypatch.setattr(EC2Provider, "release", flaky)
    with pytest.raises(ProviderError, match=rf"1 of 2 .*{first.id}"):
        release_all(p, [first, second])
    assert sorted(live_instances(aws)) == sorted(first.instance_ids)  # the second is gone


def test_throttling_is_retried_with_backoff(aws: Any) -> None:
    """EC2 throttles bursts of API calls (RequestLimitExceeded): the provider's client
    retries them (boto's adaptive mode) instead of failing the launch or the cleanup. The
    first two calls are answered by a throttling error before they leave the client (a
    botocore before-send hook), the third reaches moto."""
    from botocore.awsrequest import AWSResponse

    class Raw:
        def __init__(self, body: bytes) -> None:
            self.body = body

        def stream(self, **_: Any) -> Any:
            yield self.body

    body = (
        b"<Response><Errors><Error><Code>RequestLimitExceeded</Code>"
        b"<Message>Request limit exceeded.</Message></Error></Errors>"
        b"<RequestID>throttled</RequestID></Response>"
    )
    calls: list[int] = []

    def throttle(request: Any, **_: Any) -> Any:
        calls.append(1)
        if len(calls) <= 2:
            return AWSResponse(request.url, 503, {}, Raw(body))
        return None

    p = provider()
    client = p.client()
    assert client.meta.config.retries["mode"] == "adaptive"
    # the Amazon provider's user agent, naming Srifty as its caller (not found on the stack)
    assert "Caller/Srifty" in client.meta.config.user_agent_extra
    client.meta.events.register("before-send.ec2.DescribeAvailabilityZones", throttle)
    zones = p.zone_ids()
    assert len(calls) == 3 and zones and all(z.startswith("use1-") for z in zones.values())


def test_a_mixed_ring_launches_one_allocation_per_type_and_releases_them_all(
    aws: Any, groups: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The mix sweep's launch on EC2 (moto): one tagged allocation per member type, one
    placement group each; a failed second launch leaves none running; a ring launched
    without its workers cannot be swept (EC2's VMs start theirs from their user data:
    ``jobs.probe_vms``, tests/jobs/test_probe_vms.py), which says so before anything
    runs, and the release ends every VM."""
    from srifty_core.measure.mix_sweep import launch_ring, sweep_on_ring
    from srifty_core.probing.config import SweepConfig

    p = provider()
    ring = launch_ring(p, {"g4dn.xlarge": 2, "g4dn.12xlarge": 1}, placement_group=True)
    assert [(a.spec.name, a.count) for a in ring] == [("g4dn.12xlarge", 1), ("g4dn.xlarge", 2)]
    raw = aws.describe_instances()["Reservations"]
    tags = {t["Value"] for r in raw for i in r["Instances"] for t in i["Tags"]
            if t["Key"] == TAG_ALLOCATION}  # fmt: skip
    assert tags == {a.id for a in ring} and len(live_instances(aws)) == 3
    config = SweepConfig(sizes=(1024,), world_sizes=(2,), concurrency=(1,), repeats=1)
    with pytest.raises(ConfigError, match=r"^provider: the ec2 provider's VMs start"):
        sweep_on_ring(config, p, ring)
    from srifty_core.cloud.base import release_all

    release_all(p, ring)
    assert live_instances(aws) == []
    assert sorted(groups["created"]) == sorted(groups["deleted"]) == sorted(a.id for a in ring)

    real_launch = EC2Provider.launch

    def second_fails(self: EC2Provider, request: LaunchRequest) -> Any:
        if request.instance_type == "g4dn.xlarge":
            raise ProviderError("InsufficientInstanceCapacity (simulated)")
        return real_launch(self, request)

    monkeypatch.setattr(EC2Provider, "launch", second_fails)
    with pytest.raises(ProviderError, match="InsufficientInstanceCapacity"):
        launch_ring(p, {"g4dn.xlarge": 1, "g4dn.12xlarge": 1})
    assert live_instances(aws) == []
