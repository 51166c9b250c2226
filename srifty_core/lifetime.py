"""Local workers' process hygiene: workers that end with the process waiting for them, and
the free loopback port their rendezvous listens on (``free_port``).

Local workers start in their own process group (so that one signal stops a whole run), which
also means that killing the command that started them (``srifty train``, ``srifty probe``)
leaves them running, and a rerun then runs beside them on the same folders. A caller that
waits for its workers passes ``caller_env()`` in their environment; each worker calls
``die_with_caller()`` first thing, which asks Linux to send it SIGTERM when its parent dies
(``prctl(PR_SET_PDEATHSIG)``): the train worker checkpoints on SIGTERM and exits, the probe
worker exits. Workers started by one Airflow task and watched by another (plan-and-train)
must outlive their starter and get no such variable.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys

ENV_VAR = "SRIFTY_DIE_WITH_PID"
_PR_SET_PDEATHSIG = 1
LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nobody listens on right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def caller_env() -> dict[str, str]:
    """Environment for workers that must end when this process does."""
    return {ENV_VAR: str(os.getpid())}


def die_with_caller(caller: int | None = None) -> bool:
    """In a worker: SIGTERM when the caller dies (Linux only): the process ``caller``
    names, else the one named in the environment. True when armed. A worker whose caller
    is already gone (reparented before this ran) exits at once."""
    want = str(caller) if caller is not None else os.environ.get(ENV_VAR)
    if not want or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != int(want):  # the caller died before the signal was armed
        os.kill(os.getpid(), signal.SIGTERM)
    return True
