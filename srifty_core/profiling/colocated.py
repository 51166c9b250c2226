"""Co-located load: background worker processes doing the same training steps beside the
profiler (``colocated_load``), free-running or in lockstep with it (each step started
together, as a job's ranks start theirs); and a model in DDP over a process group of one
(``ddp_of_one``: DDP's own work, no communication). A worker ends with the profiler, even
one killed before it can stop them.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from srifty_core import host_allocator
from srifty_core.errors import SriftyError
from srifty_core.lifetime import die_with_caller
from srifty_core.profiling.buckets import skip_allreduce
from srifty_core.profiling.config import ProfilerConfig
from srifty_core.training_settings import TrainingSettings
from srifty_core.workloads import build, prepare

LOCKSTEP_TIMEOUT_S = 120.0
"""How long a lockstep step waits for the load workers before the profile fails."""


def ddp_of_one(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``module`` in DDP over a process group of this process alone (an in-memory store;
    gloo on the CPU, NCCL on CUDA), its exchange a no-op hook: DDP's own work, no
    communication. The caller destroys the process group."""
    import torch.distributed as dist

    cuda = device.type == "cuda"
    store = dist.HashStore()  # type: ignore[attr-defined]
    dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=0, world_size=1)
    ddp = torch.nn.parallel.DistributedDataParallel(
        module, device_ids=[device.index] if cuda else None
    )
    ddp.register_comm_hook(None, skip_allreduce)
    return ddp


def _load_worker(
    name: str,
    size: str,
    batch: int,
    threads: int,
    device: str,
    ready: Any,
    stop: Any,
    go: Any = None,
    ddp: bool = False,
    caller: int | None = None,
    together: Any = None,
    settings: dict[str, Any] | None = None,
) -> None:
    """Background training steps until ``stop`` is set (a co-located worker); while
    ``go`` (if given) is clear it idles between steps. ``ddp``: the model wrapped in DDP
    over a process group of this worker alone, the exchange a no-op (DDP's own passes).
    ``together`` (this worker's end of a pipe, if given): each step after the first
    starts when the profiler's does (``_step_when_told``). It ends with ``caller`` (the
    profiler) if that is killed before it can set ``stop``: an orphan would keep stepping
    and slow every measurement after it."""
    die_with_caller(caller)
    host_allocator.steady()
    if threads:
        torch.set_num_threads(threads)
    workload = build(name, size).to(torch.device(device))
    prepare(workload, TrainingSettings.from_dict(settings), autocast=True)
    if ddp:
        workload.module = ddp_of_one(workload.module, torch.device(device))
    data = workload.make_batch(batch, torch.device(device), seed=1)
    workload.module.train()
    first = True
    while not stop.is_set():
        if go is not None and not first and not go.wait(0.05):
            continue
        workload.module.zero_grad(set_to_none=True)
        if together is not None and not first and not _step_when_told(together, stop):
            break  # the profiler is done with us
        workload.loss(data).backward()
        if first:
            ready.set()
            first = False


def _step_when_told(conn: Any, stop: Any) -> bool:
    """A load worker in lockstep: say it is ready for a step, then wait for the profiler's
    go. False when the profiler is done (``stop``, or its end of the pipe closed)."""
    try:
        conn.send(b"ready")
        while not conn.poll(0.05):
            if stop.is_set():
                return False
        conn.recv()
    except (EOFError, OSError):
        return False
    return not stop.is_set()


@contextlib.contextmanager
def colocated_load(
    name: str,
    size: str,
    batch: int,
    config: ProfilerConfig,
    device: torch.device,
    others: int | None = None,
    go: Any = None,
    ddp: bool = False,
    lockstep: bool = False,
) -> Iterator[Callable[[], None] | None]:
    """Run ``others`` (default ``config.colocated - 1``) background workers for the
    duration of the block (stepping only while ``go``, an event of the spawn context, is
    set, if given). With ``lockstep`` the block gets a function to call before each
    step it times (``timing.measure_latency``'s ``before_step``): every worker then starts a
    step with it, as a job's ranks do (it raises ``SriftyError`` if a worker stops
    stepping for ``LOCKSTEP_TIMEOUT_S``); else ``None``."""
    n = config.colocated - 1 if others is None else others
    if n <= 0:
        yield None
        return
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    # Lockstep through one pipe per worker, not a shared barrier: a worker killed inside a
    # barrier's wait can die holding its lock, and the profiler's next wait then blocks
    # forever, its timeout never reached; a dead worker's pipe just reads as closed.
    pipes = [ctx.Pipe() for _ in range(n)] if lockstep else []

    def step_together() -> None:
        stopped = SriftyError(
            f"a co-located load worker stopped stepping (no step in {LOCKSTEP_TIMEOUT_S:g} s)"
        )
        deadline = time.monotonic() + LOCKSTEP_TIMEOUT_S
        for (mine, _), p in zip(pipes, procs, strict=True):
            # a worker that died after saying it was ready left that message in the pipe:
            # check it is alive first, or the step would go ahead without it
            if not p.is_alive():
                raise stopped
            try:
                while not mine.poll(0.05):
                    if not p.is_alive() or time.monotonic() > deadline:
                        raise stopped
                mine.recv()  # the worker is ready for a step
            except (EOFError, OSError):
                raise stopped from None
        for mine, _ in pipes:
            try:
                mine.send(b"go")
            except OSError:
                raise stopped from None

    procs: list[Any] = []
    readies = []
    for i in range(n):
        ready = ctx.Event()
        p = ctx.Process(
            target=_load_worker,
            args=(
                name,
                size,
                batch,
                config.threads or 0,
                str(device),
                ready,
                stop,
                go,
                ddp,
                os.getpid(),
                pipes[i][1] if lockstep else None,
                config.settings.to_dict(),
            ),
            daemon=True,
        )
        p.start()
        procs.append(p)
        readies.append(ready)
    try:
        for ready, p in zip(readies, procs, strict=True):
            while not ready.wait(0.5):
                if not p.is_alive():
                    raise SriftyError(f"a co-located load worker died (exit {p.exitcode})")
        yield step_together if lockstep else None
    finally:
        stop.set()  # a worker waiting for its next step sees it and leaves
        for mine, _ in pipes:
            mine.close()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
