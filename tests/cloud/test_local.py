"""The local provider: real processes on loopback, clean release, no orphans."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from srifty_core.catalog import Catalog, MissingPriceError
from srifty_core.catalog.types import Market
from srifty_core.cloud import InstanceState, LaunchRequest, Provider, ProviderError, get_provider
from srifty_core.cloud.local import LOCAL_CPU, LocalProvider, pid_alive
from srifty_core.errors import ConfigError, UnknownNameError
from tests.cloud.provider_contract import ProviderContract


def _wait_for(cond, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


def _gone(pid: int) -> bool:
    """No such process, or a zombie nobody reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat[stat.rindex(")") + 2] in "ZX"


def test_types_features_and_prices() -> None:
    p = LocalProvider()
    cpu = p.instance_type(LOCAL_CPU)
    assert (cpu.gpu_model, cpu.gpus_per_vm, cpu.vcpus, cpu.network_gbps) == (
        "cpu",
        0,
        os.cpu_count(),
        None,
    )
    g = p.instance_type("g4dn.12xlarge")  # a catalog type, used as a label
    t = Catalog.load().get("g4dn.12xlarge", "us-east-1")
    assert (g.gpu_model, g.gpus_per_vm, g.vcpus, g.network_gbps) == (
        t.gpu_model,
        t.gpus_per_vm,
        t.vcpus,
        t.network_gbps,
    )
    assert g.ranks_per_instance == t.gpus_per_vm == 4
    with pytest.raises(UnknownNameError, match=r"did you mean 'g4dn\.xlarge'"):
        p.instance_type("g4dn.xlarg")
    with pytest.raises(MissingPriceError, match="no price"):
        p.price(LOCAL_CPU, "on-demand")
    assert p.price("g4dn.xlarge", Market.ON_DEMAND) == Catalog.load().price(
        "g4dn.xlarge", "on-demand", "us-east-1"
    )
    with pytest.raises(UnknownNameError, match="unknown provider 'lcoal'"):
        get_provider("lcoal")


def test_launch_describe_release(data_dir: Path) -> None:
    p = LocalProvider()
    a = p.launch(LaunchRequest("g4dn.12xlarge", count=2, market=Market.SPOT))
    assert a.ranks == 8 and a.count == 2 and a.market is Market.SPOT
    inst = p.describe(a)
    assert [i.state for i in inst] == [InstanceState.RUNNING] * 2
    assert [i.ranks for i in inst] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert (data_dir / "cloud" / "local" / f"{a.id}.json").exists()
    assert LocalProvider().get_allocation(a.id) == a  # from another provider object
    p.release(a)
    assert [i.state for i in p.describe(a)] == [InstanceState.TERMINATED] * 2
    p.release(a)  # idempotent
    p.release("local-never-launched")
    with pytest.raises(ConfigError, match=r"count: 5 x g4dn\.12xlarge is 20 ranks"):
        p.launch(LaunchRequest("g4dn.12xlarge", count=5))
    with pytest.raises(ConfigError, match="count: must be at least 1"):
        LaunchRequest(LOCAL_CPU, count=0)


def test_run_gives_each_rank_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the launcher's secrets stay with it (srifty_core.worker_env)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", "aws://key:secret@")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("SRIFTY_PLAIN_SETTING", "kept")
    p = LocalProvider()
    a = p.launch(LaunchRequest(LOCAL_CPU, count=3))
    out = tmp_path / "env"
    out.mkdir()
    code = (
        "import json, os, sys; keys = ('RANK','LOCAL_RANK','WORLD_SIZE','MASTER_ADDR',"
        "'MASTER_PORT','SRIFTY_INSTANCE_ID'); "
        "env = {k: os.environ[k] for k in keys}; "
        "env['leaked'] = [k for k in ('AIRFLOW_CONN_AWS_DEFAULT', 'AWS_SECRET_ACCESS_KEY') "
        "if k in os.environ]; env['kept'] = os.environ.get('SRIFTY_PLAIN_SETTING'); "
        "json.dump(env, open(sys.argv[1] + '/' + os.environ['RANK'], 'w'))"
    )
    try:
        p.run(a, [sys.executable, "-c", code, str(out)])
        _wait_for(lambda: all(c is not None for c in p.exit_codes(a).values()))
        assert p.exit_codes(a) == {0: 0, 1: 0, 2: 0}
    finally:
        p.release(a)
    envs = [json.loads((out / str(r)).read_text()) for r in range(3)]
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["WORLD_SIZE"] for e in envs} == {"3"}
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
    assert len({e["MASTER_PORT"] for e in envs}) == 1
    assert [e["SRIFTY_INSTANCE_ID"] for e in envs] == list(a.instance_ids)
    assert all(e["leaked"] == [] and e["kept"] == "kept" for e in envs)


SPAWNER = (
    "import subprocess, sys, time; "
    "c = subprocess.Popen(['sleep', '120']); "
    "print(c.pid, flush=True); time.sleep(120)"
)


def _grandchildren(p: LocalProvider, a) -> list[int]:  # type: ignore[no-untyped-def]
    logs = p.log_dir(a)
    assert logs is not None
    pids = []
    for rank in range(a.ranks):
        log = logs / f"rank-{rank}.log"
        _wait_for(lambda log=log: log.exists() and log.read_text().strip() != "")
        pids.append(int(log.read_text().split()[0]))
    return pids


def test_release_kills_workers_and_what_they_started() -> None:
    p = LocalProvider()
    a = p.launch(LaunchRequest(LOCAL_CPU, count=2))
    p.run(a, [sys.executable, "-c", SPAWNER])
    workers = p.worker_pids(a)
    children = _grandchildren(p, a)
    assert all(pid_alive(pid) for pid in workers + children)
    with pytest.raises(ProviderError, match="still runs workers"):
        p.run(a, [sys.executable, "-c", "pass"])
    p.release(a)
    _wait_for(lambda: all(_gone(pid) for pid in workers + children))
    assert all(c is not None for c in p.exit_codes(a).values())


def test_release_from_another_process_leaves_no_orphans(data_dir: Path) -> None:
    # The launching process exits (an Airflow task that died); its workers live on in their
    # own sessions until a later process releases the allocation by id (the teardown).
    script = (
        "import sys, json\n"
        "from srifty_core.cloud.local import LocalProvider, LOCAL_CPU\n"
        "from srifty_core.cloud import LaunchRequest\n"
        "p = LocalProvider(); a = p.launch(LaunchRequest(LOCAL_CPU, count=2))\n"
        f"p.run(a, [sys.executable, '-c', {SPAWNER!r}])\n"
        "print(json.dumps({'id': a.id, 'pids': p.worker_pids(a)}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    p = LocalProvider()
    a = p.get_allocation(info["id"])
    children = _grandchildren(p, a)
    assert all(pid_alive(pid) for pid in info["pids"] + children)
    assert p.exit_codes(a) == {0: None, 1: None}
    p.release(info["id"])
    _wait_for(lambda: all(_gone(pid) for pid in info["pids"] + children))
    assert [i.state for i in p.describe(a)] == [InstanceState.TERMINATED] * 2


def test_interrupt_kills_the_workers_of_a_group_over_several_allocations() -> None:
    # one process group over two allocations (a configuration that kept one and launched
    # one): the second allocation's worker is global rank 1 but its instance's rank 0
    p = LocalProvider()
    a = p.launch(LaunchRequest(LOCAL_CPU, count=1, market=Market.SPOT))
    b = p.launch(LaunchRequest(LOCAL_CPU, count=1, market=Market.SPOT))
    p.run_group([a, b], [sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (pa,), (pb,) = p.worker_pids(a), p.worker_pids(b)
        p.interrupt(b.instance_ids[0])
        assert _gone(pb) and pid_alive(pa)
        assert [i.state for i in p.describe(b)] == [InstanceState.INTERRUPTED]
    finally:
        p.release(a)
        p.release(b)


def test_interrupt_takes_one_instance_back() -> None:
    p = LocalProvider()
    a = p.launch(LaunchRequest(LOCAL_CPU, count=2, market=Market.SPOT))
    p.run(a, [sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        pids = p.worker_pids(a)
        p.interrupt(a.instance_ids[1])
        assert [i.state for i in p.describe(a)] == [
            InstanceState.RUNNING,
            InstanceState.INTERRUPTED,
        ]
        assert [i.instance_id for i in p.interruptions(a)] == [a.instance_ids[1]]
        assert _gone(pids[1]) and pid_alive(pids[0])
        assert p.exit_codes(a)[1] is not None and p.exit_codes(a)[0] is None
        p.stop(a)
        assert _gone(pids[0])
        with pytest.raises(ProviderError, match="not running"):
            p.run(a, [sys.executable, "-c", "pass"])
    finally:
        p.release(a)
    assert [i.state for i in p.describe(a)] == [InstanceState.TERMINATED, InstanceState.INTERRUPTED]


class TestLocalContract(ProviderContract):
    unpriced_type = LOCAL_CPU
    unpriced_market = "on-demand"

    @pytest.fixture
    def provider(self, data_dir: Path) -> LocalProvider:
        return LocalProvider()

    def interrupt(self, provider: Provider, instance_id: str) -> None:
        assert isinstance(provider, LocalProvider)
        provider.interrupt(instance_id)
