"""Partial pooling of noisy per-key estimates (a random-effects mean and each key's
estimate shrunk towards it).

Several keys (a host's profiled models) each measure the same kind of quantity with a
standard error of their own, and may truly differ. DerSimonian and Laird's moment
estimate of the between-key variance tau^2 says how much: where the keys differ beyond
their errors, each keeps most of its own; where they agree within noise, a noisy key
takes the pool's mean. Every weight comes from the measurements' own errors; nothing is
set by hand.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from srifty_core.errors import ConfigError


def partial_pool(estimates: Sequence[tuple[float, float]], own: int | None = None) -> float:
    """Key ``own``'s estimate shrunk towards the random-effects mean of ``estimates``
    (``(value, standard error)`` pairs, errors > 0), or that mean itself when ``own`` is
    None (a key that measured nothing takes the pool's mean). One estimate: itself."""
    if not estimates:
        raise ConfigError("partial_pool: needs at least one estimate")
    x = np.asarray([v for v, _ in estimates], dtype=np.float64)
    se2 = np.asarray([e for _, e in estimates], dtype=np.float64) ** 2
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(se2)) and np.all(se2 > 0)):
        raise ConfigError(f"partial_pool: values finite and errors > 0, got {list(estimates)}")
    if own is not None and not 0 <= own < x.size:
        raise ConfigError(f"partial_pool: own index {own} outside {x.size} estimates")
    w = 1.0 / se2
    fixed = float(np.sum(w * x) / np.sum(w))
    q = float(np.sum(w * (x - fixed) ** 2))
    scale = float(np.sum(w) - np.sum(w**2) / np.sum(w))
    tau2 = max(0.0, (q - (x.size - 1)) / scale) if scale > 0 else 0.0
    wr = 1.0 / (se2 + tau2)
    mean = float(np.sum(wr * x) / np.sum(wr))
    if own is None:
        return mean
    if tau2 == 0.0:
        return mean  # the keys agree within their errors: all take the pooled mean
    return float((x[own] / se2[own] + mean / tau2) / (1.0 / se2[own] + 1.0 / tau2))
