"""Slowest-VM compute under variance.

In synchronous training every iteration waits for the slowest VM. Each VM's latency in an
iteration is drawn from a normal distribution (mean from the fitted t(B) at its batch,
spread from the profile); the iteration takes the maximum over VMs. Two ways to get the
expectation of that maximum, which agree (tests check it):

- ``sample_max``: draw ``iters`` iterations (vectorized, seeded) and take the max per
  iteration. Only the per-type maxima are drawn: the max of ``k`` iid normals is drawn
  directly as ``mu + sigma * max(Z_1..Z_k)``, and ``max(Z_1..Z_k)`` has CDF ``Phi(z)^k``,
  so one uniform per (iteration, type) gives it by inversion: ``Phi^-1(U^(1/k))``.
- ``expected_max``: numerical integration of ``E[M] = int_0^inf 1 - prod_j F_j(t)^k_j dt``
  (plus the negative part, negligible for latencies).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray
from scipy.special import ndtr, ndtri


def sample_max(
    mus: Sequence[float],
    sigmas: Sequence[float],
    counts: Sequence[int],
    iters: int,
    rng: np.random.Generator,
) -> NDArray[np.float64]:
    """Per iteration, the max over all VMs (``counts[j]`` VMs with N(mus[j], sigmas[j]))."""
    mu = np.asarray(mus, dtype=np.float64)
    sigma = np.asarray(sigmas, dtype=np.float64)
    k = np.asarray(counts, dtype=np.float64)
    u = rng.random((iters, mu.size))
    # max of k iid standard normals by inversion of Phi(z)^k
    z = ndtri(u ** (1.0 / k))
    out: NDArray[np.float64] = (mu + sigma * z).max(axis=1)
    return out


def sample_max_per_vm(
    mus: Sequence[float],
    sigmas: Sequence[float],
    counts: Sequence[int],
    iters: int,
    rng: np.random.Generator,
) -> NDArray[np.float64]:
    """The straightforward version: one draw per VM per iteration, then the max (a reference
    for tests and the speed benchmark)."""
    mu = np.repeat(np.asarray(mus, dtype=np.float64), counts)
    sigma = np.repeat(np.asarray(sigmas, dtype=np.float64), counts)
    draws = rng.normal(mu, sigma, size=(iters, mu.size))
    out: NDArray[np.float64] = draws.max(axis=1)
    return out


def expected_max(
    mus: Sequence[float], sigmas: Sequence[float], counts: Sequence[int], points: int = 2049
) -> float:
    """E[max over VMs] by integrating ``1 - prod F_j(t)^k_j`` (trapezoid on a grid spanning
    every distribution's +-8 sigma)."""
    mu = np.asarray(mus, dtype=np.float64)
    sigma = np.maximum(np.asarray(sigmas, dtype=np.float64), 1e-12)
    k = np.asarray(counts, dtype=np.float64)
    lo = float(np.min(mu - 8 * sigma))
    hi = float(np.max(mu + 8 * sigma))
    t = np.linspace(lo, hi, points)
    log_cdf = np.log(np.clip(ndtr((t[:, None] - mu) / sigma), 1e-300, 1.0))
    cdf_max = np.exp((log_cdf * k).sum(axis=1))
    # E[M] = lo + int_lo^hi (1 - F_M(t)) dt for M >= lo (mass below lo is < 1e-15)
    return float(lo + np.trapezoid(1.0 - cdf_max, t))


def shared_host_factors(work: Sequence[float], slowdown: Callable[[int], float]) -> list[float]:
    """Per worker, its step time on a shared host over its step time alone.

    Workers on one host start their steps together and share it: while ``k`` of them are
    still stepping, each advances at ``1 / slowdown(k)`` of its speed alone (the profile's
    ``host_slowdown``). The one with the least work (``work``: seconds alone) finishes
    first, the others then run with one fewer beside them, and so on (processor sharing in
    order of work). With equal work every factor is ``slowdown(n)``; a worker with much
    more work than the others runs most of its step alone."""
    order = sorted(range(len(work)), key=lambda i: work[i])
    out = [1.0] * len(work)
    t = done = 0.0
    active = len(work)
    for i in order:
        t += (work[i] - done) * slowdown(active)
        done = work[i]
        active -= 1
        out[i] = t / work[i] if work[i] > 0 else 1.0
    return out
