"""Probing a mixed-type ring for real (issue 52 item 1): one allocation per member type,
one gloo process group over all of them, rows in the store under the mix's label; on
local processes (``srifty probe --mix``) and on network namespaces standing in for VMs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from srifty_core.cli import main
from srifty_core.cloud.base import Allocation
from srifty_core.cloud.local import LocalHost, LocalProvider
from srifty_core.errors import ConfigError, UnknownNameError
from srifty_core.measure.mix_sweep import launch_ring, probe_mix_sweep
from srifty_core.probing.config import SweepConfig
from srifty_core.probing.mix import MIXED_GPU
from srifty_core.probing.store import read_probes
from tests.netns import Net

MIX = "g4dn.xlarge:1,g5.xlarge:2"
LABEL = "mix_1xg4dn.xlarge_2xg5.xlarge"
TINY = ["--sizes", "4B,4KB", "--repeats", "2", "--warmup", "1", "--concurrency", "1"]
TINY += ["--collectives", "all_reduce", "--allocations", "1", "--day", "2026-03-01"]


def _states(cloud: Path) -> dict[str, set[str]]:
    """Each local allocation's instance states, by allocation id."""
    return {
        f.stem: set(json.loads(f.read_text())["instances"].values())
        for f in cloud.glob("local-*.json")
    }


def test_probe_mix_measures_one_ring_and_stores_it_under_the_label(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["probe", "--mix", MIX, "--no-progress", *TINY]) == 0
    out = capsys.readouterr().out
    assert "2 point(s) measured, 0 already stored, 0 failed" in out
    df = read_probes(instance_types=[LABEL])
    assert len(df) == 4 and set(df["instance_type"]) == {LABEL}
    assert set(df["gpu_model"]) == {MIXED_GPU} and set(df["world_size"]) == {3}
    assert set(df["gpus_per_vm"]) == {1} and df["busbw"].gt(0).all()
    (ring,) = set(df["allocation_id"])
    ids = ring.split("+")
    assert len(ids) == 2  # one allocation per member type, both in the ring
    states = _states(data_dir / "cloud" / "local")
    assert set(ids) <= set(states) and all(states[i] == {"terminated"} for i in ids)
    assert main(["probe", "--mix", MIX, "--no-progress", *TINY]) == 0
    assert "0 point(s) measured, 2 already stored" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--mix", "g4dn.xlarge:2"], "--mix: a mix needs at least two instance types"),
        (["--mix", "g4dn.xlarge:1,g5.xlarg:1"], "did you mean 'g5.xlarge'"),
        (["--mix", MIX, "--world-sizes", "2"], "--world-sizes: a mix is probed at its ring"),
        (["--mix", MIX, "--instances", "2"], "--instances: a mix is probed at its ring"),
    ],
)
def test_bad_mixes_fail_before_anything_is_launched(
    data_dir: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main(["probe", "--no-progress", *extra]) == 2
    assert message in capsys.readouterr().err
    assert not _states(data_dir / "cloud" / "local")


def test_a_failed_rank_fails_the_point_releases_every_member_and_a_rerun_completes(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = SweepConfig(
        sizes=(4, 4096), world_sizes=(2,), concurrency=(1,), repeats=2, warmup=0,
        collectives=("all_reduce",),
    )  # fmt: skip
    mix = {"g4dn.xlarge": 1, "g5.xlarge": 1}
    monkeypatch.setenv("SRIFTY_PROBE_FAIL_AT", "1:1")  # rank 1 (the g5) dies at point 1
    first = probe_mix_sweep(config, mix)
    assert first.measured == 1 and len(first.failed) == 1
    assert "rank 1 exited with code 17" in first.failed[0].reason
    states = _states(data_dir / "cloud" / "local")
    assert len(states) == 2 and all(s == {"terminated"} for s in states.values())
    monkeypatch.delenv("SRIFTY_PROBE_FAIL_AT")
    again = probe_mix_sweep(config, "mix_1xg4dn.xlarge_1xg5.xlarge")
    assert again.ok and again.measured == 1 and again.skipped == 1 and again.rows == 4


def test_a_ring_whose_second_member_cannot_launch_releases_the_first(data_dir: Path) -> None:
    provider = LocalProvider()
    with pytest.raises(UnknownNameError, match=r"instance type 'zz\.nope'"):
        launch_ring(provider, {"g4dn.xlarge": 1, "zz.nope": 1})
    states = _states(data_dir / "cloud" / "local")
    assert len(states) == 1 and list(states.values()) == [{"terminated"}]


def test_the_single_type_sweep_points_a_mix_label_to_the_mix_sweep(data_dir: Path) -> None:
    from srifty_core.measure.sweep import probe_sweep

    config = SweepConfig(sizes=(1024,), world_sizes=(2,), concurrency=(1,), repeats=1)
    with pytest.raises(ConfigError, match=r"^instance_type: .*srifty probe --mix"):
        probe_sweep(config, instance_type=LABEL)


class NamespaceProvider(LocalProvider):
    """The local provider with each instance in a network namespace of its own (``net``):
    its workers start there (``ip netns exec``) and reach the others only over the
    namespaces' bridge. Instances take the namespaces in the order they are first asked
    for; the process group's master address is the first one's, which exists nowhere
    but inside that namespace."""

    def __init__(self, net: Net, state_dir: Path) -> None:
        super().__init__(state_dir)
        self.net = net
        self.where: dict[str, int] = {}

    def host(self, allocation: Allocation, instance: int) -> LocalHost:
        iid = allocation.instance_ids[instance]
        k = self.where.setdefault(iid, len(self.where) % len(self.net.names))
        return LocalHost(
            self.net.addresses[k],
            ("ip", "netns", "exec", self.net.names[k]),
            {"GLOO_SOCKET_IFNAME": "eth0"},
        )


def test_a_mixed_ring_probed_over_namespace_vms_lands_in_the_store(
    net: Net, data_dir: Path
) -> None:
    provider = NamespaceProvider(net, data_dir / "ns-cloud")
    config = SweepConfig(
        sizes=(4, 65536), world_sizes=(2,), concurrency=(1,), repeats=2, warmup=1,
        collectives=("all_reduce",),
    )  # fmt: skip
    result = probe_mix_sweep(config, {"g4dn.xlarge": 1, "g5.xlarge": 2}, provider=provider)
    assert result.ok and result.measured == 2, result.failed
    assert sorted(provider.where.values()) == [0, 1, 2]  # three "VMs", one ring
    df = read_probes(instance_types=[LABEL])
    assert len(df) == 4 and set(df["world_size"]) == {3} and df["busbw"].gt(0).all()
    states = _states(data_dir / "ns-cloud")
    assert len(states) == 2 and all(s == {"terminated"} for s in states.values())


def test_a_provider_that_starts_workers_at_launch_is_refused_before_launching(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EC2's VMs start their workers from their user data: swept as a local provider is
    (launch, then run the workers), the mix sweep says so before it launches anything
    (``jobs.probe_vms`` sweeps them, tests/jobs/test_probe_vms.py)."""
    monkeypatch.setattr(LocalProvider, "starts_workers_at_launch", True)
    config = SweepConfig(sizes=(1024,), world_sizes=(2,), concurrency=(1,), repeats=1)
    with pytest.raises(ConfigError, match=r"^provider: the local provider's VMs start"):
        probe_mix_sweep(config, {"g4dn.xlarge": 1, "g5.xlarge": 1})
    assert not _states(data_dir / "cloud" / "local")


def test_on_the_emulated_ec2_a_probe_is_the_emulators_sweep_mixes_included(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The emulated EC2 has no probe workers: ``srifty probe`` there runs its sweep on the
    same grid and stores the rows, for a type and for a mix (seeded by the day: again,
    the same rows)."""
    emulated = ["--provider", "ec2-emulated", *TINY]
    assert main(["probe", "--mix", MIX, "--no-progress", *emulated]) == 0
    assert main(["probe", "--instance-type", "g5.xlarge", "--no-progress", *emulated]) == 0
    out = capsys.readouterr().out
    assert "emulated rows in" in out and "busbw p50" in out
    df = read_probes(providers=["ec2-emulated"])
    mixed = df[df["instance_type"] == LABEL]
    assert set(mixed["world_size"]) == {3} and set(mixed["gpu_model"]) == {MIXED_GPU}
    assert set(df[df["instance_type"] == "g5.xlarge"]["world_size"]) == {2}
    assert sorted(df["buffer_bytes"].unique()) == [4, 4096]
    first = mixed.sort_values(["buffer_bytes", "repeat"])["busbw"].tolist()
    assert main(["probe", "--mix", MIX, "--no-progress", *emulated]) == 0
    again = read_probes(providers=["ec2-emulated"], instance_types=[LABEL])
    assert again.sort_values(["buffer_bytes", "repeat"])["busbw"].tolist() == first
