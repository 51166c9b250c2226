"""Local rank processes kept for the test session: ``RankPool.spawn(fn, args, nprocs)`` runs
``fn(rank, *args)`` on ranks ``0 .. nprocs-1`` as ``torch.multiprocessing.spawn`` does, but
in processes started once (spawn context) and reused by the next call, of any world size
up to the largest asked for so far (the extra ones wait).

What a run costs here is mostly starting its processes: each imports torch (~1.6 s of CPU)
and, once it builds DDP or FSDP, much of torch.distributed and torch._dynamo (~3-5 s in
all). The tests that train a plan on several local processes (``worker.run_rank`` per
rank, what ``run_spawned`` runs; ``tests/jobs`` still runs ``run_spawned`` itself) pay for
that once per session instead of once per run. Each call starts its own process group (a
fresh port) and ends it, as ``run_rank`` does; a task must free what holds its process
group (a DDP model) before destroying it, since the process lives on. A call that fails
on any rank stops every process of the pool (the others may wait in a collective) and
raises with the rank's traceback (a rank that hangs: its stacks); the next call starts
fresh ones.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import queue
import signal
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from srifty_core.planner.schema.train_plan import TrainPlan

_POLL_S = 0.5


def _serve(rank: int, tasks: Any, results: Any, stacks: str) -> None:
    """One pool process: run each task as ``rank``, until killed (``RankPool.close``).
    SIGUSR1 writes its threads' stacks to ``stacks``."""
    import faulthandler

    with open(stacks, "w") as dump:
        faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
        while True:
            fn, args = tasks.get()
            try:
                fn(rank, *args)
                gc.collect()  # the task's garbage goes now, not during the next one
            except BaseException:
                results.put((rank, traceback.format_exc()))
                return  # a failed rank may hold a broken process group: the pool restarts
            results.put((rank, None))


class RankPool:
    def __init__(self, folder: Path) -> None:
        """``folder``: where a rank writes its stacks when asked (a hung rank's)."""
        self._ctx = mp.get_context("spawn")
        self._results: Any = None
        self._procs: list[Any] = []
        self._tasks: list[Any] = []
        self._stacks = folder
        self.started = 0
        """Processes started so far."""

    def train(self, plan: TrainPlan) -> None:
        """``worker.run_spawned(plan)`` on the pool: one rank per local batch."""
        from srifty_core.lifetime import free_port
        from srifty_core.worker.worker import _spawned

        self.spawn(_spawned, (plan.to_dict(), free_port()), plan.world_size)

    def spawn(
        self, fn: Callable[..., None], args: tuple[Any, ...], nprocs: int, timeout_s: float = 300
    ) -> None:
        """``fn(rank, *args)`` on ranks ``0 .. nprocs-1``; returns when every one has
        returned, raises ``RuntimeError`` with the first failure's traceback."""
        self._grow(nprocs)
        for tasks in self._tasks[:nprocs]:
            tasks.put((fn, args))
        pending = set(range(nprocs))
        end = time.monotonic() + timeout_s
        while pending:
            got = self._result()
            if got is None:
                procs = {r: self._procs[r] for r in pending}
                dead = {r: p.exitcode for r, p in procs.items() if not p.is_alive()}
                if dead:
                    self.close()
                    raise RuntimeError(f"pool ranks {sorted(dead)} of {nprocs} exited: {dead}")
                if time.monotonic() > end:
                    stacks = self._stacks_of(sorted(pending))
                    self.close()
                    raise RuntimeError(
                        f"pool ranks {sorted(pending)} of {nprocs} did not finish in "
                        f"{timeout_s:.0f} s; their stacks:\n{stacks}"
                    )
                continue
            rank, error = got
            if error is not None:
                self.close()
                raise RuntimeError(f"rank {rank} of {nprocs} failed:\n{error}")
            pending.discard(rank)

    def _result(self) -> tuple[int, str | None] | None:
        try:
            return self._results.get(timeout=_POLL_S)  # type: ignore[no-any-return]
        except queue.Empty:
            return None

    def _stacks_of(self, ranks: list[int]) -> str:
        for r in ranks:
            os.kill(self._procs[r].pid, signal.SIGUSR1)
        time.sleep(1.0)
        return "\n".join(f"rank {r}:\n{(self._stacks / f'{r}.txt').read_text()}" for r in ranks)

    def _grow(self, nprocs: int) -> None:
        if self._results is None:
            self._results = self._ctx.Queue()
        while len(self._procs) < nprocs:
            rank, tasks = len(self._procs), self._ctx.Queue()
            stacks = str(self._stacks / f"{rank}.txt")
            proc = self._ctx.Process(
                target=_serve, args=(rank, tasks, self._results, stacks), daemon=True
            )
            proc.start()
            self.started += 1
            self._procs.append(proc)
            self._tasks.append(tasks)

    def close(self) -> None:
        """Stop every process at once (one that failed may have left the others waiting
        in a collective; at the session's end nothing is left to wait for)."""
        for proc in self._procs:
            proc.kill()
        for proc in self._procs:
            proc.join(timeout=10)
        self._procs, self._tasks, self._results = [], [], None
