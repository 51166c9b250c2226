"""Piecewise-linear compute-latency model t(B), fitted from a batch-size sweep.

Contract: ``fit_piecewise(x, y, cv=..., repeats=...)`` fits the mean latencies ``y`` at
distinct batch sizes ``x`` and returns a ``PiecewiseLinear``: continuous, breakpoints
among the probed sizes, every slope >= 0 (a larger batch never takes less time),
extrapolating its first/last piece outside the fitted range; ``fit_line`` is the
single-line baseline. ``budget_batch_sizes``, ``dense_batch_sizes`` and
``refine_batch_sizes`` choose which batch sizes to probe.

Imports only ``srifty_core.errors``; pure numpy, no torch.

How and why (hinge basis, relative error, BIC): docs/design/compute.md#compute
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from srifty_core.errors import ConfigError

DEFAULT_NOISE_FLOOR = 0.01
"""Relative residuals under 1% are treated as noise: no breakpoint is added to explain them."""


@dataclass(frozen=True, slots=True)
class PiecewiseLinear:
    """t(B) = slopes[i] * B + intercepts[i] on piece i; pieces split at ``breakpoints``.

    Continuous at each breakpoint. ``x_min``/``x_max`` is the fitted range; evaluating outside
    it extrapolates the first/last piece (callers decide whether that is allowed).
    """

    breakpoints: tuple[float, ...]
    slopes: tuple[float, ...]
    intercepts: tuple[float, ...]
    x_min: float
    x_max: float

    def __post_init__(self) -> None:
        if len(self.slopes) != len(self.breakpoints) + 1 or len(self.intercepts) != len(
            self.slopes
        ):
            raise ValueError("a piecewise-linear model needs len(breakpoints)+1 pieces")

    @property
    def pieces(self) -> int:
        return len(self.slopes)

    def __call__(self, batch: ArrayLike) -> NDArray[np.float64]:
        x = np.asarray(batch, dtype=np.float64)
        piece = np.searchsorted(np.asarray(self.breakpoints), x, side="right")
        out: NDArray[np.float64] = (
            np.asarray(self.slopes)[piece] * x + np.asarray(self.intercepts)[piece]
        )
        return out

    def at(self, batch: float) -> float:
        """Scalar evaluation."""
        return float(self(batch))

    @classmethod
    def flat(cls, value: float) -> PiecewiseLinear:
        """A one-piece constant model (the fit of a single batch size)."""
        return cls((), (0.0,), (float(value),), 1.0, 1.0)

    def to_dict(self) -> dict[str, object]:
        return {
            "breakpoints": list(self.breakpoints),
            "slopes": list(self.slopes),
            "intercepts": list(self.intercepts),
            "x_min": self.x_min,
            "x_max": self.x_max,
        }

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> PiecewiseLinear:
        def floats(key: str) -> tuple[float, ...]:
            value = d[key]
            if not isinstance(value, list):
                raise ConfigError(f"piecewise model: {key} must be a list")
            return tuple(float(v) for v in value)

        def number(key: str) -> float:
            value = d[key]
            if not isinstance(value, int | float | str):
                raise ConfigError(f"piecewise model: {key} must be a number")
            return float(value)

        return cls(
            breakpoints=floats("breakpoints"),
            slopes=floats("slopes"),
            intercepts=floats("intercepts"),
            x_min=number("x_min"),
            x_max=number("x_max"),
        )


def _hinge_design(x: NDArray[np.float64], knots: Sequence[float]) -> NDArray[np.float64]:
    cols = [np.ones_like(x), x, *(np.maximum(0.0, x - k) for k in knots)]
    return np.stack(cols, axis=1)


def _fit_rising(a: NDArray[np.float64], b: NDArray[np.float64]) -> NDArray[np.float64]:
    """Least squares ``a @ coef ~ b`` over a hinge design whose pieces all rise: each
    piece's slope (the running sum of ``coef[1:]``) is >= 0, since a larger batch never
    takes less time. Noise between two close probes could otherwise tilt the last piece
    down, and extrapolated to B_max it predicted negative times (a profile of the digits
    MLP probed at 1, 8 and 16 with B_max 739,556 predicted -0.9 s there).

    The unconstrained fit is kept when it already rises (the common case: the same
    coefficients as before). Otherwise the problem is solved in the slopes themselves
    (``t = c + s_0 B + sum_j (s_j - s_{j-1}) max(0, B - k_j)``, every ``s_i >= 0``): a
    convex problem with at most ``max_knots + 1`` bounds, whose optimum lies on one face
    ``{s_i = 0, i in Z}``; every face is solved and the best feasible one kept."""
    coef, *_ = np.linalg.lstsq(a, b, rcond=None)
    if np.all(np.cumsum(coef[1:]) >= 0.0):
        return np.asarray(coef, dtype=np.float64)
    m = a.shape[1] - 1  # slopes
    to_coef = np.zeros((m + 1, m + 1))  # coef = to_coef @ [c, s_0, ..., s_{m-1}]
    to_coef[0, 0] = 1.0
    for i in range(m):
        to_coef[1 + i, 1 + i] = 1.0
        if i:
            to_coef[1 + i, i] = -1.0
    design = a @ to_coef
    best: tuple[float, NDArray[np.float64]] | None = None
    for zeros in itertools.chain.from_iterable(
        itertools.combinations(range(m), r) for r in range(1, m + 1)
    ):
        keep = [0, *(1 + i for i in range(m) if i not in zeros)]
        sol, *_ = np.linalg.lstsq(design[:, keep], b, rcond=None)
        params = np.zeros(m + 1)
        params[keep] = sol
        if np.any(params[1:] < 0.0):
            continue
        chi2 = float(np.sum((design @ params - b) ** 2))
        if best is None or chi2 < best[0]:
            best = (chi2, params)
    assert best is not None  # every slope zero (a constant) is always feasible
    return np.asarray(to_coef @ best[1], dtype=np.float64)


def _to_pieces(
    coef: NDArray[np.float64], knots: Sequence[float], x_min: float, x_max: float
) -> PiecewiseLinear:
    slopes, intercepts = [float(coef[1])], [float(coef[0])]
    for j, k in enumerate(knots):
        c = float(coef[2 + j])
        slopes.append(slopes[-1] + c)
        intercepts.append(intercepts[-1] - c * k)
    return PiecewiseLinear(
        tuple(float(k) for k in knots), tuple(slopes), tuple(intercepts), x_min, x_max
    )


def _check_xy(x: ArrayLike, y: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    if xa.ndim != 1 or xa.shape != ya.shape:
        raise ConfigError("batch sizes and latencies must be 1-D arrays of the same length")
    if xa.size < 2:
        raise ConfigError(f"need at least 2 batch sizes to fit, got {xa.size}")
    if np.any(ya <= 0) or not np.all(np.isfinite(ya)):
        raise ConfigError("latencies must be positive and finite")
    if np.unique(xa).size != xa.size:
        raise ConfigError("batch sizes must be distinct (average repeats first)")
    order = np.argsort(xa)
    return xa[order], ya[order]


def fit_line(x: ArrayLike, y: ArrayLike) -> PiecewiseLinear:
    """The single-line baseline: ordinary least squares t = a*B + b over all points."""
    xa, ya = _check_xy(x, y)
    a, b = np.polyfit(xa, ya, 1)
    return PiecewiseLinear((), (float(a),), (float(b),), float(xa[0]), float(xa[-1]))


def fit_piecewise(
    x: ArrayLike,
    y: ArrayLike,
    *,
    cv: ArrayLike | None = None,
    repeats: int = 1,
    max_knots: int = 2,
    noise_floor: float = DEFAULT_NOISE_FLOOR,
) -> PiecewiseLinear:
    """Fit t(B) on distinct batch sizes ``x`` with mean latencies ``y``.

    ``cv`` (per-point coefficient of variation of the repeats) and ``repeats`` set the noise
    level of each point's mean; ``noise_floor`` bounds it from below. Breakpoints are chosen
    among interior batch sizes; a model never has more parameters than points minus one.
    A profile must take a positive time at every batch, and very noisy probes on a loaded
    host can tip the first piece below zero (a tiny BERT's backward at 1, 4 and 8: 1.28,
    0.82 and 5.9 ms, fitted as a line through -1.6 ms at batch 1). Such a candidate is
    refit with its time at batch 1 held at the least the probes allow, ``t(b0) / b0`` of
    the smallest probe ``b0`` (a pass's time per sample does not grow as the batch
    shrinks), so every candidate, and the model chosen by score, predicts a positive time.
    """
    xa, ya = _check_xy(x, y)
    n = xa.size
    if cv is None:
        sigma = np.full(n, noise_floor)
    else:
        cva = np.asarray(cv, dtype=np.float64)[np.argsort(np.asarray(x, dtype=np.float64))]
        sigma = np.maximum(cva / math.sqrt(max(repeats, 1)), noise_floor)
    w = 1.0 / (ya * sigma)  # whitened relative residuals
    interior = xa[1:-1]
    first = np.array([min(1.0, float(xa[0]))])
    best: tuple[float, PiecewiseLinear] | None = None
    for n_knots in range(0, max(0, min(max_knots, n - 3)) + 1):
        for knots in itertools.combinations(interior, n_knots):
            design = _hinge_design(xa, knots)
            coef = _fit_rising(design * w[:, None], ya * w)
            at_first = _hinge_design(first, knots)[0]
            if not float(at_first @ coef) > 0.0 and xa[0] > 0:
                floor = float(ya[0]) * float(first[0]) / float(xa[0])
                coef = _fit_rising_through(design, ya, w, at_first, floor)
            resid = (design @ coef - ya) * w
            chi2 = float(resid @ resid)
            bic = chi2 + design.shape[1] * math.log(n)
            if best is None or bic < best[0] - 1e-12:
                best = (bic, _to_pieces(coef, knots, float(xa[0]), float(xa[-1])))
    if best is None:  # unreachable: n >= 2 always admits the single line
        raise RuntimeError("no candidate model was fitted")
    return best[1]


def _fit_rising_through(
    design: NDArray[np.float64],
    y: NDArray[np.float64],
    w: NDArray[np.float64],
    at: NDArray[np.float64],
    value: float,
) -> NDArray[np.float64]:
    """``_fit_rising`` (weights ``w``) with the prediction at the design row ``at`` held at
    ``value``: the intercept is eliminated (``coef[0] = value - at[1:] @ coef[1:]``), the
    slopes fitted to what is left. Pieces that rise from a positive ``value`` at the
    smallest batch stay positive at every larger one."""
    reduced = design - np.outer(design[:, 0], at)  # the intercept's column becomes zero
    coef = _fit_rising(reduced * w[:, None], (y - value) * w)
    coef[0] = value - float(at[1:] @ coef[1:])
    return coef


def budget_batch_sizes(b_max: int, k: int, b_min: int = 1) -> list[int]:
    """``k`` probe batch sizes from ``b_min`` to ``b_max``, spaced geometrically and rounded
    to powers of two (both ends always included; fewer if the range is too small)."""
    if k < 2:
        raise ConfigError(f"probes must be >= 2, got {k}")
    if b_max < b_min:
        raise ConfigError(f"B_max {b_max} is below the smallest batch {b_min}")
    lo, hi = math.log2(b_min), math.log2(b_max)
    out = {b_min, b_max}
    for i in range(1, k - 1):
        e = lo + (hi - lo) * i / (k - 1)
        out.add(int(min(b_max, max(b_min, 2 ** round(e)))))
    return sorted(out)


DEFAULT_REFINE_TOLERANCE = 0.03
"""A check probe the fit misses by more than this (relative) is a bend the fit lacks."""


def gap_midpoint(a: int, b: int) -> int | None:
    """The batch size halfway between ``a`` and ``b`` in log scale (rounded), or None when
    no integer lies strictly between them."""
    if b - a < 2:
        return None
    m = round(math.sqrt(a * b))
    return min(b - 1, max(a + 1, m))


def refine_batch_sizes(
    sizes: Sequence[int],
    predict: Callable[[int], float],
    measure: Callable[[int], tuple[float, float]],
    *,
    budget: int,
    tolerance: float = DEFAULT_REFINE_TOLERANCE,
) -> list[tuple[int, float]]:
    """Check the fit between the probes, and probe more where it bends.

    After the budgeted probes ``sizes`` are measured and fitted, each gap between
    neighbours (widest in log scale first) gets one check probe at its midpoint: the
    current fit ``predict(b)`` is compared with what ``measure(b)`` then measures (mean,
    and the relative noise of that mean), and the caller refits with the new point. Where
    the fit missed by more than ``tolerance`` (or 3x the point's noise, whichever is
    larger), the two halves of that gap join the queue: a piecewise-linear fit through a
    few probes cannot see a bend between them (a 4-probe fit of a model whose latency
    bends between 8 and 32 misses batch 16 by 40%). At most ``budget`` checks.

    Returns ``(batch, relative error of the fit before that probe)`` per check: held-out
    errors of the fit, which the profile keeps."""
    if budget < 0:
        raise ConfigError(f"refine: must be >= 0, got {budget}")
    known = sorted(set(int(b) for b in sizes))
    queue = list(itertools.pairwise(known))
    checks: list[tuple[int, float]] = []
    while queue and len(checks) < budget:
        queue.sort(key=lambda g: math.log(g[1]) - math.log(g[0]))
        a, b = queue.pop()  # the widest gap left
        m = gap_midpoint(a, b)
        if m is None:
            continue
        before = float(predict(m))
        mean, noise = measure(m)
        err = abs(before - mean) / mean
        checks.append((m, err))
        if err > max(tolerance, 3.0 * noise):
            queue += [(a, m), (m, b)]
    return checks


def dense_batch_sizes(b_max: int, b_min: int = 1) -> list[int]:
    """Powers of two from ``b_min`` up to ``b_max``, plus ``b_max`` itself."""
    out = []
    b = b_min
    while b < b_max:
        out.append(b)
        b *= 2
    out.append(b_max)
    return out
