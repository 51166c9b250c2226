"""Network namespaces standing in for VMs on this machine (a pytest plugin: the ``net``
fixture), for the tests that run one process group over several "VMs".

``net`` makes ``VMS`` namespaces, each with an ``eth0`` holding one address of ``SUBNET``,
joined by veth pairs to a bridge in a hub namespace: addresses that exist only inside
namespaces the test made. Needs root and ``ip netns``; skipped otherwise. Every namespace
(and every process in it) is removed in a finalizer, also when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

SUBNET = "10.213.77"
VMS = 3
HOSTS = (9, 10, 11)
"""The VMs' last address bytes: c10d orders the VMs by address as a string, which puts the
plan's first VM (``.9``) last, so torchrun's ``RANK`` differs from the plan's rank on every
VM and only the rank offset (``placement.plan_rank``) gives each VM its own local batches."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _netns_usable() -> str | None:
    """Why the test cannot run here, or ``None``."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        return "needs root on Linux (network namespaces)"
    if shutil.which("ip") is None:
        return "needs the ip command (iproute2)"
    probe = f"srifty-probe-{os.getpid()}"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


@dataclass(frozen=True)
class Net:
    names: tuple[str, ...]
    addresses: tuple[str, ...]
    hub: str


def kill_namespace(ns: str) -> None:
    """Kill every process in ``ns`` (a VM that dies takes all its processes with it)."""
    pids = ip("netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


@pytest.fixture
def net() -> Iterator[Net]:
    why = _netns_usable()
    if why:
        pytest.skip(why)
    tag = f"{os.getpid() % 100000}"
    hub = f"srifty-hub-{tag}"
    names = tuple(f"srifty-vm{k}-{tag}" for k in range(VMS))
    addresses = tuple(f"{SUBNET}.{h}" for h in HOSTS)
    made: list[str] = []
    try:
        for ns in (hub, *names):
            ip("netns", "add", ns)
            made.append(ns)
            ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", hub, "link", "add", "br0", "type", "bridge")
        ip("-n", hub, "link", "set", "br0", "up")
        for k, (ns, addr) in enumerate(zip(names, addresses, strict=True)):
            port = f"p{k}"
            ip("-n", hub, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip("-n", hub, "link", "set", port, "master", "br0")
            ip("-n", hub, "link", "set", port, "up")
            ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
        yield Net(names, addresses, hub)
    finally:
        for ns in reversed(made):
            kill_namespace(ns)
        time.sleep(0.2)
        for ns in reversed(made):
            ip("netns", "del", ns, check=False)
        left = set(ip("netns", "list", check=False).stdout.split())
        assert not left & set(made), f"namespaces left behind: {left & set(made)}"
