"""Three "VMs" on this machine, each a network namespace of its own, train one plan in one
torchrun group (c10d rendezvous, gloo on the CPU) with the start script the EC2 user data
runs; then one "VM" is killed mid-run and the survivors resume from the checkpoint.

Real parts: ``ip netns`` namespaces joined by veth pairs to a bridge in a fourth namespace
(addresses that exist only inside namespaces this test made), torchrun's elastic agent and
c10d rendezvous, the worker, the checkpoint and the progress log (a folder every "VM"
sees, standing in for the run storage). What the VM would read from EC2's instance
metadata (its launch index and private address) is given in the environment, which the
start script reads first; ``GLOO_SOCKET_IFNAME`` names the namespace's interface, since
the namespaces share this machine's host name (on EC2 it resolves to the private address).

Needs root and ``ip netns``; skipped otherwise. Every namespace (and every process in it)
is removed in a finalizer, also when the test fails.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from srifty_core import lifetime
from srifty_core.jobs.replanner import Replanner
from srifty_core.planner.schema.train_plan import TrainPlan
from srifty_core.runs.progress import read_progress
from srifty_core.worker.checkpoint import load_checkpoint
from srifty_core.worker.rendezvous import (
    Rendezvous,
    exit_markers,
    node_groups,
    run_id,
    start_script,
)
from srifty_core.worker.worker import train_single
from tests.netns import Net, kill_namespace


def test_namespaces_reach_each_other_and_only_they_hold_the_addresses(net: Net) -> None:
    listen = (
        "import socket,sys; s=socket.socket(); s.bind((sys.argv[1], 29499)); s.listen(1); "
        "print('ready', flush=True); c, _ = s.accept(); c.sendall(b'hi'); c.close()"
    )
    server = subprocess.Popen(
        ["ip", "netns", "exec", net.names[0], sys.executable, "-c", listen, net.addresses[0]],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        connect = (
            "import socket,sys; c=socket.create_connection((sys.argv[1], 29499), timeout=10); "
            "print(c.recv(2).decode())"
        )
        out = subprocess.run(
            ["ip", "netns", "exec", net.names[2], sys.executable, "-c", connect, net.addresses[0]],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert out.stdout.strip() == "hi", out.stderr
    finally:
        server.kill()
        server.wait()
    with socket.socket() as s, pytest.raises(OSError):  # not an address of this machine
        s.bind((net.addresses[0], 0))


class VM:
    """One "VM": its start script run inside its namespace."""

    def __init__(self, ns: str, address: str, script: str, folder: Path, name: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.ns = ns
        self.script = folder / f"{name}.sh"
        self.script.write_text(script)
        self.log = folder / f"{name}.log"
        env = {k: v for k, v in os.environ.items() if k != lifetime.ENV_VAR}
        env.update(
            SRIFTY_LAUNCH_INDEX="0",  # what the instance metadata says on EC2
            SRIFTY_PRIVATE_ADDRESS=address,
            GLOO_SOCKET_IFNAME="eth0",
            OMP_NUM_THREADS="1",
        )
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", ns, "bash", str(self.script)],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                cwd=Path(__file__).resolve().parents[2],
            )  # fmt: skip

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_namespace(self.ns)
            self.proc.wait(timeout=10)
            raise AssertionError(f"{self.ns} did not finish:\n{self.text()[-3000:]}") from None

    def kill(self) -> None:
        kill_namespace(self.ns)

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def start_vms(
    net: Net, plan: TrainPlan, vms: Sequence[int], ranks: Sequence[int], folder: Path
) -> list[VM]:
    """Start the plan on the given namespaces (``ranks[j]`` ranks on ``vms[j]``), one VM
    per node group, the first hosting the rendezvous: what each VM's user data runs."""
    groups = node_groups([(1, r) for r in ranks])
    rdzv = Rendezvous(
        run_id(plan.config_id, plan.run_dir), len(vms), plan.world_size,
        host=net.addresses[vms[0]], join_timeout_s=120,
    )  # fmt: skip
    out = []
    for j, (k, g) in enumerate(zip(vms, groups, strict=True)):
        host = "" if j == 0 else rdzv.host  # the first VM reads its own address
        mine = Rendezvous(rdzv.run_id, rdzv.nnodes, rdzv.world_size, host, rdzv.port, 120)
        script = start_script(
            plan.to_dict(), g, mine, venv=sys.prefix, workdir=str(folder / f"vm{k}"),
            shutdown=False,  # the "VMs" are namespaces of this machine
        )  # fmt: skip
        out.append(VM(net.names[k], net.addresses[k], script, folder, f"{plan.config_id}-vm{k}"))
    return out


def _plan(run_dir: Path, **kw: object) -> TrainPlan:
    base: dict[str, object] = {
        "model": "dlrm",
        "size": "tiny",
        "global_batch": 8,
        "iterations": 12,
        "local_batches": (1, 3, 2, 2),  # VM0: ranks 0-1, VM1: rank 2, VM2: rank 3
        "run_dir": str(run_dir),
        "dtype": "float64",
        "lr": 0.1,
        "momentum": 0.0,
        "checkpoint_every": 4,
        "timeout_s": 30.0,
    }
    base.update(kw)
    return TrainPlan(**base)  # type: ignore[arg-type]


def _ranks_in(text: str) -> list[tuple[int, int]]:
    return [(int(r), int(b)) for r, b in re.findall(r"rank (\d+) of \d+, local batch (\d+)", text)]


def test_three_namespace_vms_train_one_heterogeneous_plan(net: Net, tmp_path: Path) -> None:
    plan = _plan(tmp_path / "run")
    vms = start_vms(net, plan, [0, 1, 2], [2, 1, 1], tmp_path / "vms")
    codes = [vm.wait(timeout=150) for vm in vms]
    logs = [vm.text() for vm in vms]
    assert codes == [0, 0, 0], "\n\n".join(x[-2000:] for x in logs)
    # the plan's ranks, in its VM order, whatever order c10d numbered the VMs in (here:
    # VM1, VM2, VM0, by address as a string)
    assert sorted(net.addresses) == [net.addresses[1], net.addresses[2], net.addresses[0]]
    assert sorted(_ranks_in(logs[0])) == [(0, 1), (1, 3)]
    assert _ranks_in(logs[1]) == [(2, 2)] and _ranks_in(logs[2]) == [(3, 2)]
    ckpt = load_checkpoint(plan.checkpoint_path)
    assert ckpt is not None and ckpt.iteration == plan.iterations
    steps = [r.iteration for r in read_progress(plan.progress_path)]
    assert steps == list(range(1, plan.iterations + 1))
    assert exit_markers(plan.run_dir, plan.config_id) == {"0": 0, "1": 0, "2": 0}
    # one group over three VMs trains what one process trains on the whole global batch
    reference = train_single(plan)
    worst = max(float((ckpt.model[k] - reference[k]).abs().max()) for k in reference)
    assert worst < 1e-9


def test_a_killed_vm_stops_the_job_and_the_survivors_resume(net: Net, tmp_path: Path) -> None:
    plan = _plan(tmp_path / "run", iterations=40, step_sleep_s=0.15, checkpoint_every=5)
    vms = start_vms(net, plan, [0, 1, 2], [2, 1, 1], tmp_path / "vms")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        recs = read_progress(plan.progress_path)
        if recs and recs[-1].iteration >= 12:
            break
        assert all(vm.proc.poll() is None for vm in vms), "\n".join(v.text()[-2000:] for v in vms)
        time.sleep(0.1)
    else:
        raise AssertionError("training never reached iteration 12")
    vms[1].kill()  # the VM with rank 2 dies with all its processes
    survivors = [vms[0], vms[2]]
    codes = [vm.wait(timeout=90) for vm in survivors]
    assert all(c != 0 for c in codes), codes  # the group stopped: nobody trained on alone
    # the survivors reported their failure (what the monitor fails an EC2 run on); the
    # killed VM could not
    markers = exit_markers(plan.run_dir, plan.config_id)
    assert set(markers) == {"0", "2"} and all(c != 0 for c in markers.values()), markers
    ckpt = load_checkpoint(plan.checkpoint_path)
    assert ckpt is not None and 0 < ckpt.iteration < plan.iterations
    assert ckpt.iteration % plan.checkpoint_every == 0
    # Re-plan on the survivors (3 ranks: VM0's two, VM2's one), resume from the checkpoint.
    again = TrainPlan.from_dict(
        {
            **plan.to_dict(),
            "local_batches": list(Replanner.survivors(plan.global_batch, 3)),
            "config_id": "c0.r1",
            "step_sleep_s": 0.0,  # slowed only so that the first group is caught mid-run
        }
    )
    second = start_vms(net, again, [0, 2], [2, 1], tmp_path / "vms")
    codes = [vm.wait(timeout=150) for vm in second]
    assert codes == [0, 0], "\n\n".join(v.text()[-2000:] for v in second)
    final = load_checkpoint(plan.checkpoint_path)
    assert final is not None and final.iteration == plan.iterations
    recs = read_progress(plan.progress_path)
    resumed = [r.iteration for r in recs if r.config_id == "c0.r1"]
    assert resumed == list(range(ckpt.iteration + 1, plan.iterations + 1))
    assert max(r.iteration for r in recs) == plan.iterations
    # resuming on another world size gives the parameters of a straight run
    reference = train_single(plan)
    worst = max(float((final.model[k] - reference[k]).abs().max()) for k in reference)
    assert worst < 1e-9
