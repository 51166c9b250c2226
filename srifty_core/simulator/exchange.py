"""Gradient exchange: when does the last allreduce of an iteration end?

Contract: ``serial_exchange(starts, volumes, busbw)`` is DDP's schedule (buckets in their
order on one stream) and returns when the last ends (0 with no bucket);
``simulate_exchange(starts, volumes, busbw, cap)`` is the method's event model (ready
buckets run concurrently and share the VM's cap) and returns an ``ExchangeResult``
(``t_pe``: when the last transfer ends). Time 0 is the start of the backward pass;
volumes are bus bytes (``bus_bytes``: ``2 s (n-1) / n``); bandwidths must be positive
(``ValueError`` otherwise). Pure functions.

Imports nothing of srifty_core (standard library only).

How and why (the sharing rule, the events): docs/design/simulator.md#exchange
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ExchangeResult:
    t_pe: float
    finish: tuple[float, ...]
    """Finish time of each bucket (input order)."""
    max_concurrency: int


def bus_bytes(size_bytes: float, world_size: int) -> float:
    """Bytes one allreduce of ``size_bytes`` moves per rank on the bus: 2 s (n-1) / n."""
    return 2.0 * size_bytes * (world_size - 1) / world_size


def serial_exchange(
    starts: Sequence[float], volumes: Sequence[float], busbw: Sequence[float]
) -> float:
    """DDP's schedule: buckets go out in their order on one communication stream, each
    when it is ready and the one before it has ended, at its own bus bandwidth; returns
    when the last ends (0 with no bucket)."""
    end = 0.0
    for start, volume, b in zip(starts, volumes, busbw, strict=True):
        if b <= 0:
            raise ValueError("bandwidths must be positive")
        end = max(end, start) + volume / b
    return end


def simulate_exchange(
    starts: Sequence[float],
    volumes: Sequence[float],
    busbw: Sequence[float],
    cap: float,
) -> ExchangeResult:
    """Run the event simulation.

    ``starts``: when each transfer starts (s); ``volumes``: its bus bytes (``bus_bytes``);
    ``busbw``: its stand-alone bus bandwidth (bytes/s, > 0); ``cap``: the VM's total bus
    bandwidth (bytes/s, > 0; ``inf`` for no cap).
    """
    n = len(starts)
    if not (len(volumes) == len(busbw) == n):
        raise ValueError("starts, volumes and busbw must have the same length")
    if n == 0:
        return ExchangeResult(0.0, (), 0)
    if cap <= 0 or any(b <= 0 for b in busbw):
        raise ValueError("bandwidths must be positive")
    order = sorted(range(n), key=lambda i: (starts[i], i))
    remaining = [float(v) for v in volumes]
    finish = [math.nan] * n
    active: list[int] = []
    t = 0.0
    nxt = 0
    max_c = 0
    rates: dict[int, float] = {}
    while nxt < n or active:
        # rates for the current active set (recomputed on every change of the set)
        if active:
            c = len(active)
            b_agg = sum(busbw[a] for a in active)
            if b_agg < cap:
                rates = {a: busbw[a] for a in active}
            else:
                share = cap / c
                rates = {a: min(busbw[a], share) for a in active}
            t_finish = min(t + remaining[a] / rates[a] for a in active)
        else:
            t_finish = math.inf
        t_start = starts[order[nxt]] if nxt < n else math.inf
        t_next = min(t_finish, t_start)
        if t_next > t and active:
            dt = t_next - t
            for a in active:
                remaining[a] -= rates[a] * dt
        t = max(t, t_next)
        if active:
            done = [a for a in active if remaining[a] <= 1e-9 * volumes[a] + 1e-12]
            if t_finish <= t_start and not done:  # guard against rounding: finish the earliest
                done = [min(active, key=lambda a: remaining[a] / rates[a])]
            for a in done:
                finish[a] = t
                active.remove(a)
        while nxt < n and starts[order[nxt]] <= t:
            i = order[nxt]
            nxt += 1
            if volumes[i] <= 0:
                finish[i] = t
                continue
            active.append(i)
        max_c = max(max_c, len(active))
    return ExchangeResult(max(finish), tuple(finish), max_c)
