"""The probe worker: one process per rank, torchrun-style.

    python -m srifty_core.measure.probe_worker PLAN.json

The same entry point runs on a VM (under torchrun or a provider's ``run``) and locally;
on a VM that started it at launch, PLAN.json names the plan on the run storage and rank 0
writes its rows there (``jobs.probe_vms``).
It reads ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (and ``LOCAL_RANK``
for the GPU) from the environment, and the plan from the JSON file: the sweep config, the
points to measure, the labels every row carries, and the partial file rank 0 appends to.

For each world size in the plan every rank joins a subgroup of the first ``n`` ranks (the
others wait at a barrier). At each point: ``warmup`` untimed rounds, then ``repeats``
samples, each: barrier, start ``concurrent`` asynchronous collectives of ``buffer_bytes``,
wait for all; the sample's time is the slowest rank's (an allreduce MAX of the times).
The point's ``collective`` says which (``_collective_ops``): an allreduce of the buffer, an
all-gather into it (``all_gather_single``, formerly ``all_gather_into_tensor``: each rank
sends ``buffer_bytes / n``) or a reduce-scatter of it (``reduce_scatter_single``, formerly
``reduce_scatter_tensor``: each rank keeps ``buffer_bytes / n``), as nccl-tests sizes them;
a buffer under one float32 per rank is rounded up to that. gloo (CPU) and NCCL run all three.

When the plan asks for it (``sustained``: slot and world size, with ``SweepConfig.sustained_s``
> 0), the grid of that world size is followed by the sustained-transfer probe, once per
allocation (a NIC whose credits are spent shows no drop to wait for): back-to-back
allreduces of ``sustained_bytes`` until
the time is up or the rate has dropped to at most ``SUSTAINED_DROP`` of its start and held
for ``SUSTAINED_HOLD`` samples, then ``repeats`` samples recorded with phase
``sustained`` (grid rows are phase ``burst``). Every rank sees the same (MAX-reduced)
times, so all decide to stop together.

A point whose samples spread more than ``noise.NOISY_CV`` (std/mean) is measured again, up
to ``noise.NOISY_RETRIES`` times, and the quietest attempt is kept; its rows carry the
spread and, when even that one is above the bound, ``noisy`` (every rank sees the same
times, so all ranks decide alike).

Rank 0 appends each completed point's rows to the partial file and fsyncs it, so a worker
that dies later loses nothing measured. If a point fails, rank 0 appends one failed row
with the reason and exits 1.

Test hooks: ``SRIFTY_PROBE_FAIL_AT=RANK:INDEX[:hang]`` makes rank RANK exit with code 17
(or hang) at the first timed sample of the INDEX-th point of this plan;
``SRIFTY_PROBE_NOISE=INDEX:ATTEMPTS[,INDEX:ATTEMPTS...]`` makes the INDEX-th point's
samples deterministic (on every rank alike): each attempt's samples all take its first
sample's time, that first one ``NOISE_FACTOR`` times longer in the first ATTEMPTS attempts
(spread 144% at 5 repeats), so those are noisy and the later ones quiet (spread 0).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from srifty_core.atomic import open_for_append
from srifty_core.lifetime import die_with_caller
from srifty_core.noise import NOISY_RETRIES, is_noisy, spread
from srifty_core.probing.config import ALL_REDUCE, ELEMENT_BYTES, Point, SweepConfig, busbw
from srifty_core.probing.schema import PHASE_BURST, PHASE_SUSTAINED, STATUS_FAILED, STATUS_OK
from srifty_core.runs import store as run_store

SUSTAINED_DROP = 0.8
SUSTAINED_HOLD = 5

FAIL_ENV = "SRIFTY_PROBE_FAIL_AT"
FAIL_EXIT_CODE = 17
NOISE_ENV = "SRIFTY_PROBE_NOISE"
NOISE_FACTOR = 10.0


def _noise_hook() -> dict[int, int]:
    """``SRIFTY_PROBE_NOISE``: point index -> attempts made noisy."""
    spec = os.environ.get(NOISE_ENV, "")
    out = {}
    for part in filter(None, spec.split(",")):
        index, attempts = part.split(":")
        out[int(index)] = int(attempts)
    return out


def _fail_hook(rank: int) -> tuple[int, str] | None:
    spec = os.environ.get(FAIL_ENV, "")
    if not spec:
        return None
    parts = spec.split(":")
    if int(parts[0]) != rank:
        return None
    return int(parts[1]), (parts[2] if len(parts) > 2 else "exit")


class _Rows:
    """Where rank 0 puts each completed point's rows: appended to the partial file and
    fsynced; on run storage (``plan["out"]`` a URI: a probe ring whose VMs started at
    launch, ``jobs.probe_vms``), the whole file written again (one PUT, whole or not at
    all), since an object store cannot append."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.remote = run_store.is_remote(out)
        self.text = ""

    def add(self, rows: list[dict[str, Any]]) -> None:
        lines = "".join(json.dumps(r) + "\n" for r in rows)
        if self.remote:
            self.text += lines
            run_store.write_text(self.out, self.text)
            return
        with open_for_append(Path(self.out)) as fh:
            fh.write(lines)
            fh.flush()
            os.fsync(fh.fileno())


def run_plan(plan: dict[str, Any]) -> int:
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    config = SweepConfig.from_dict(plan["config"])
    points = [Point(*p) for p in plan["points"]]
    labels: dict[str, Any] = plan["labels"]
    out = _Rows(str(plan["out"]))
    fail = _fail_hook(rank)
    noise = _noise_hook()

    torch.set_num_threads(1)
    if config.backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    addr, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
    dist.init_process_group(
        config.backend,
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=config.sweep_timeout_s),
    )

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    sustained = plan.get("sustained")  # [slot, world size] of the sustained probe, or None
    # Every rank creates every subgroup, in the same order (a collective call).
    sizes = sorted({p.world_size for p in points} | ({sustained[1]} if sustained else set()))
    groups: dict[int, Any] = {}
    for n in sizes:
        if n > world:
            raise SystemExit(f"world size {n} > {world} ranks in this allocation")
        groups[n] = dist.group.WORLD if n == world else dist.new_group(ranks=list(range(n)))

    index = 0
    current: Point | None = None
    sample = 0
    try:
        for n in sizes:
            group = groups[n]
            if rank < n:
                for p in (q for q in points if q.world_size == n):
                    current, sample = p, 0
                    bufs = _collective_ops(p, group, device)
                    for _ in range(config.warmup):
                        for w in [start() for start in bufs]:
                            w.wait()
                    sync()
                    best: tuple[float, list[float]] | None = None
                    for attempt in range(1 + NOISY_RETRIES):
                        times: list[float] = []
                        base: float | None = None
                        for r in range(config.repeats):
                            sample = r
                            if fail is not None and fail[0] == index and r == 0:
                                if fail[1] == "hang":
                                    time.sleep(3600)
                                os._exit(FAIL_EXIT_CODE)
                            t = _timed_allreduce(bufs, group, device, sync)
                            if index in noise:  # the test hook (module doc)
                                base = t if base is None else base
                                noisy = r == 0 and attempt < noise[index]
                                t = base * (NOISE_FACTOR if noisy else 1.0)
                            times.append(t)
                        cv = spread(times)
                        if best is None or cv < best[0]:
                            best = (cv, times)
                        if not is_noisy(best[0]):
                            break
                    if rank == 0 and best is not None:
                        cv, times = best
                        rows = [
                            _row(
                                labels, config, p, r, STATUS_OK, t,
                                busbw(p.buffer_bytes, n, t, p.collective),
                                spread=cv, noisy=is_noisy(cv),
                            )
                            for r, t in enumerate(times)
                        ]  # fmt: skip
                        out.add(rows)
                    del bufs
                    index += 1
                    current = None
                if sustained and n == sustained[1]:
                    current = Point(sustained[0], n, config.sustained_bytes, 1)
                    rows = _sustained(config, current, group, device, sync, labels)
                    if rank == 0:
                        out.add(rows)
                    current = None
            else:
                index += sum(1 for q in points if q.world_size == n)
            dist.barrier()
    except Exception as exc:
        if rank == 0 and current is not None:
            reason = f"{type(exc).__name__}: {exc}".strip()[:2000]
            out.add([_row(labels, config, current, sample, STATUS_FAILED, None, None, reason)])
        traceback.print_exc()
        return 1
    dist.destroy_process_group()
    return 0


def _collective_ops(p: Point, group: Any, device: Any) -> list[Any]:
    """``p.concurrent`` callables, each starting one asynchronous ``p.collective`` on its
    own buffers (sizes: module docstring) and returning its work handle."""
    import torch
    import torch.distributed as dist

    n = dist.get_world_size(group)
    numel = max(1, p.buffer_bytes // ELEMENT_BYTES)

    def zeros(k: int) -> Any:
        return torch.zeros(k, dtype=torch.float32, device=device)

    ops: list[Any] = []
    for _ in range(p.concurrent):
        if p.collective == ALL_REDUCE:
            buf = zeros(numel)
            ops.append(lambda b=buf: dist.all_reduce(b, group=group, async_op=True))
            continue
        shard = max(1, numel // n)
        full, part = zeros(shard * n), zeros(shard)
        if p.collective == "all_gather":
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
            ops.append(lambda o=full, i=part, f=gather: f(o, i, group=group, async_op=True))
        elif p.collective == "reduce_scatter":
            scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
            ops.append(lambda o=part, i=full, f=scatter: f(o, i, group=group, async_op=True))
        else:
            raise ValueError(f"collective: {p.collective!r} is not one this worker times")
    return ops


def _timed_allreduce(bufs: list[Any], group: Any, device: Any, sync: Any) -> float:
    """One sample: after a barrier, one asynchronous collective per entry of ``bufs`` (a
    tensor to allreduce, or a callable from ``_collective_ops`` that starts one) at once,
    until all have ended; the slowest rank's time (MAX-reduced, so every rank returns the
    same number)."""
    import torch
    import torch.distributed as dist

    dist.barrier(group=group)
    t0 = time.perf_counter()
    works = [b() if callable(b) else dist.all_reduce(b, group=group, async_op=True) for b in bufs]
    for w in works:
        w.wait()
    sync()
    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=device)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX, group=group)
    return float(dt.item())


def _agreed_elapsed(start: float, group: Any, device: Any) -> float:
    """Seconds since ``start`` on the rank that has waited longest (MAX-reduced): every
    rank takes the same decision to go on or stop, so none leaves the loop while another
    waits in one more allreduce (its clock alone would let them disagree by a round)."""
    import torch
    import torch.distributed as dist

    e = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
    dist.all_reduce(e, op=dist.ReduceOp.MAX, group=group)
    return float(e.item())


def _sustained(
    config: SweepConfig, p: Point, group: Any, device: Any, sync: Any, labels: dict[str, Any]
) -> list[dict[str, Any]]:
    """The sustained-transfer probe at ``p`` (rule: module docstring)."""
    import statistics

    import torch

    numel = max(1, p.buffer_bytes // ELEMENT_BYTES)
    buf = torch.zeros(numel, dtype=torch.float32, device=device)
    start = time.perf_counter()
    first: list[float] = []
    recent: list[float] = []
    while _agreed_elapsed(start, group, device) < config.sustained_s:
        t = _timed_allreduce([buf], group, device, sync)
        if len(first) < SUSTAINED_HOLD:
            first.append(t)
            continue
        recent = [*recent[-(SUSTAINED_HOLD - 1) :], t]
        slow = statistics.median(first) / SUSTAINED_DROP  # time, so slower = larger
        if len(recent) == SUSTAINED_HOLD and min(recent) >= slow:
            break  # dropped and held: the burst is spent
    times = [_timed_allreduce([buf], group, device, sync) for _ in range(config.repeats)]
    cv = spread(times)  # no re-measurement: the burst is spent once (noisy: not checked)
    return [
        _row(
            labels, config, p, r, STATUS_OK, t, busbw(p.buffer_bytes, p.world_size, t),
            phase=PHASE_SUSTAINED, spread=cv,
        )
        for r, t in enumerate(times)
    ]  # fmt: skip


def _row(
    labels: dict[str, Any],
    config: SweepConfig,
    p: Point,
    repeat: int,
    status: str,
    time_s: float | None,
    bw: float | None,
    error: str | None = None,
    phase: str = PHASE_BURST,
    spread: float | None = None,
    noisy: bool | None = None,
) -> dict[str, Any]:
    return {
        **labels,
        "allocation_slot": p.allocation_slot,
        "world_size": p.world_size,
        "buffer_bytes": p.buffer_bytes,
        "concurrent": p.concurrent,
        "collective": p.collective,
        "backend": config.backend,
        "repeat": repeat,
        "time_s": time_s,
        "busbw": bw,
        "status": status,
        "error": error,
        "probed_at": datetime.now(UTC).isoformat(),
        "phase": phase,
        "spread": spread,
        "noisy": noisy,
    }


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m srifty_core.measure.probe_worker PLAN.json", file=sys.stderr)
        return 2
    die_with_caller()
    return run_plan(load_plan(args[0]))


def load_plan(location: str) -> dict[str, Any]:
    """The plan at ``location`` (a path, or a URI on the run storage). A VM's start script
    holds a stub whose ``plan`` names the real one on the run storage (EC2's user data
    is at most 16 KB; a sweep's points can be more)."""
    text = run_store.read_text(location)
    if text is None:
        raise SystemExit(f"probe worker: no plan at {location}")
    plan: dict[str, Any] = json.loads(text)
    if "points" not in plan and isinstance(plan.get("plan"), str):
        return load_plan(plan["plan"])
    return plan


if __name__ == "__main__":
    sys.exit(main())
