"""What a probe sweep measures: buffer sizes, world sizes, concurrency, repeats, backend.

Pure and light (no torch, no pyarrow): the CLI, the DAG and the worker share these
definitions, and every check here runs before any process starts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from srifty_core.errors import ConfigError, UnknownNameError

MIN_BUFFER_BYTES = 4
"""Smallest buffer: one float32 element."""
MAX_BUFFER_BYTES = 512 * 1024**2
"""Largest buffer: 512 MB, the top of the method's grid."""
ELEMENT_BYTES = 4
"""Buffers are float32 tensors, so every size is a multiple of 4 bytes."""
MAX_CONCURRENT = 16
BACKENDS = ("gloo", "nccl")
ALL_REDUCE = "all_reduce"
COLLECTIVES = (ALL_REDUCE, "all_gather", "reduce_scatter")
"""The collectives a sweep probes, by nccl-tests' names; a record without one is an allreduce."""
BUSBW_FACTOR = {ALL_REDUCE: 2.0, "all_gather": 1.0, "reduce_scatter": 1.0}
"""nccl-tests' bus-bandwidth factor: busbw = factor * s * (n-1) / (n t), ``s`` the total
buffer (an all-gather's output, a reduce-scatter's input)."""
DEFAULT_COLLECTIVES = (ALL_REDUCE,)
"""A ``SweepConfig`` that names none times allreduces, as every sweep before the others;
``srifty probe`` and the sweep DAG ask for all three by default."""
DEFAULT_CONCURRENCY = (1, 2, 4)
DEFAULT_POINTS_PER_DECADE = 3
MIN_ALLOCATIONS = 3
"""A bandwidth model's refresh needs probes from at least this many allocations (two to
cross-validate on, one held out): the sweep DAG's and ``srifty probe``'s default."""

_UNITS = {
    "": 1,
    "B": 1,
    "K": 1024,
    "KB": 1024,
    "KIB": 1024,
    "M": 1024**2,
    "MB": 1024**2,
    "MIB": 1024**2,
    "G": 1024**3,
    "GB": 1024**3,
    "GIB": 1024**3,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str, field_name: str = "sizes") -> int:
    """Bytes from ``4B``, ``64KB``, ``1.5MB``, ``512MiB`` or ``4096``.

    KB, MB and GB are powers of 1024, as nccl-tests reports them.
    """
    m = _SIZE_RE.match(str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise ConfigError(
            f"{field_name}: cannot read {text!r} as a size; write e.g. 4B, 64KB, 512MB"
        )
    value = float(m.group(1)) * _UNITS[m.group(2).upper()]
    if value != int(value):
        raise ConfigError(f"{field_name}: {text!r} is not a whole number of bytes")
    return int(value)


def format_size(n: int) -> str:
    """``4B``, ``64KB``, ``1.5MB`` (powers of 1024)."""
    for unit, scale in (("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.3g}{unit}"
    return f"{n}B"


def geometric_sizes(
    lo: int,
    hi: int,
    *,
    points_per_decade: float | None = None,
    steps: int | None = None,
) -> tuple[int, ...]:
    """Sizes from ``lo`` to ``hi`` (both included), evenly spaced on a log scale.

    ``steps`` gives the number of points; otherwise ``points_per_decade`` (default 3) sets
    the spacing. Each size is rounded to a whole number of float32 elements; duplicates
    that rounding creates at the small end are dropped.
    """
    if steps is not None and points_per_decade is not None:
        raise ConfigError("sizes: give either steps or points_per_decade, not both")
    _check_size(lo, "sizes")
    _check_size(hi, "sizes")
    if hi < lo:
        raise ConfigError(f"sizes: range {format_size(lo)}:{format_size(hi)} goes downwards")
    if lo == hi:
        return (lo,)
    if steps is not None:
        if steps < 2:
            raise ConfigError(f"steps: need at least 2 points for a range, got {steps}")
        n = steps
    else:
        ppd = DEFAULT_POINTS_PER_DECADE if points_per_decade is None else points_per_decade
        if not ppd > 0:
            raise ConfigError(f"points_per_decade: must be positive, got {ppd}")
        n = max(2, math.ceil(math.log10(hi / lo) * ppd - 1e-9) + 1)
    ratio = (hi / lo) ** (1.0 / (n - 1))
    out: list[int] = []
    for i in range(n):
        raw = lo * ratio**i
        size = max(ELEMENT_BYTES, round(raw / ELEMENT_BYTES) * ELEMENT_BYTES)
        size = min(size, hi)
        if not out or size > out[-1]:
            out.append(size)
    out[-1] = hi
    return tuple(out)


def parse_sizes(
    spec: str, *, points_per_decade: float | None = None, steps: int | None = None
) -> tuple[int, ...]:
    """``4B:64MB`` (a geometric range) or ``4B,1KB,1MB`` (an explicit list)."""
    spec = spec.strip()
    if ":" in spec:
        parts = spec.split(":")
        if len(parts) != 2:
            raise ConfigError(f"sizes: {spec!r} is not LO:HI")
        lo, hi = (parse_size(p) for p in parts)
        return geometric_sizes(lo, hi, points_per_decade=points_per_decade, steps=steps)
    if steps is not None or points_per_decade is not None:
        raise ConfigError("sizes: steps/points_per_decade apply to a LO:HI range only")
    sizes = tuple(sorted({parse_size(p) for p in spec.split(",") if p.strip()}))
    if not sizes:
        raise ConfigError("sizes: empty")
    return sizes


def parse_int_list(text: str, field_name: str) -> tuple[int, ...]:
    """``1,2,4`` -> (1, 2, 4), naming ``field_name`` on bad input."""
    try:
        values = tuple(int(p) for p in str(text).split(",") if p.strip())
    except ValueError:
        raise ConfigError(
            f"{field_name}: {text!r} is not a comma-separated list of integers"
        ) from None
    if not values:
        raise ConfigError(f"{field_name}: empty")
    return values


def _check_size(n: int, field_name: str) -> None:
    if not MIN_BUFFER_BYTES <= n <= MAX_BUFFER_BYTES:
        raise ConfigError(
            f"{field_name}: {n} bytes is out of range "
            f"[{format_size(MIN_BUFFER_BYTES)}, {format_size(MAX_BUFFER_BYTES)}]"
        )
    if n % ELEMENT_BYTES:
        raise ConfigError(
            f"{field_name}: {n} bytes is not a whole number of float32 elements "
            f"(a multiple of {ELEMENT_BYTES})"
        )


def busbw(
    buffer_bytes: float, world_size: int, time_s: float, collective: str = ALL_REDUCE
) -> float:
    """Bus bandwidth in bytes/s of one collective: ``2*s*(n-1)/(n*t)`` for an allreduce,
    ``s*(n-1)/(n*t)`` for an all-gather or reduce-scatter (``BUSBW_FACTOR``).

    The average bandwidth seen on one link during a ring collective (nccl-tests' busbw);
    it folds ``n`` and ``s`` into the label so that different set-ups alias less.
    """
    if world_size < 1 or not time_s > 0:
        raise ValueError(f"busbw needs world_size >= 1 and time_s > 0, got {world_size}, {time_s}")
    return BUSBW_FACTOR[collective] * buffer_bytes * (world_size - 1) / (world_size * time_s)


def check_collectives(values: Iterable[str], field_name: str = "collectives") -> tuple[str, ...]:
    """``values`` as a tuple in ``COLLECTIVES`` order, each checked."""
    out = []
    for v in values:
        if v not in COLLECTIVES:
            raise ConfigError(f"{field_name}: must be one of {', '.join(COLLECTIVES)}, got {v!r}")
        out.append(v)
    if not out:
        raise ConfigError(f"{field_name}: empty")
    if len(set(out)) != len(out):
        raise ConfigError(f"{field_name}: {list(out)} lists a collective twice")
    return tuple(c for c in COLLECTIVES if c in out)


SWEEP_TIMEOUT_S = 3600.0
"""The default limit of one allocation's sweep; a sustained probe's seconds come on top."""


@dataclass(frozen=True, slots=True)
class Point:
    """One grid point of a sweep: ``repeats`` samples are taken at it on one allocation.

    ``allocation_slot`` says which of the sweep's allocations (0, 1, ...) it belongs to:
    the method repeats the grid on fresh allocations to capture placement variance.
    ``collective`` names what is timed (``COLLECTIVES``).
    """

    allocation_slot: int
    world_size: int
    buffer_bytes: int
    concurrent: int
    collective: str = ALL_REDUCE

    @property
    def key(self) -> tuple[int, int, int, int, str]:
        return (
            self.allocation_slot,
            self.world_size,
            self.buffer_bytes,
            self.concurrent,
            self.collective,
        )


@dataclass(frozen=True, slots=True)
class SweepConfig:
    """A probe sweep. Constructing one checks every field (``ConfigError`` names it).

    ``concurrency`` lists how many asynchronous allreduces (each of ``buffer_bytes``) are
    in flight at once; a sample's ``time_s`` is the time until all of them finished on
    the slowest rank, and its ``busbw`` is that of one transfer (aggregate = concurrent x
    busbw). ``warmup`` untimed rounds precede each point's ``repeats`` timed samples.
    ``collectives`` lists what is timed at every point (``COLLECTIVES``, kept in that
    order; default ``DEFAULT_COLLECTIVES``): each one at every size, world size and
    concurrency, so all three take about three times an allreduce-only sweep. The
    sustained probe is an allreduce.
    """

    sizes: tuple[int, ...]
    world_sizes: tuple[int, ...] = (2,)
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    repeats: int = 5
    warmup: int = 2
    backend: str = "gloo"
    allocations: int = 1
    sweep_timeout_s: float = SWEEP_TIMEOUT_S
    """The whole run on one allocation: the driver stops the workers after this, and it is
    also the process group's timeout (ranks outside a subgroup wait at a barrier while the
    subgroup sweeps, so a shorter per-collective timeout would fire on them)."""
    sustained_s: float = 0.0
    """The sustained-transfer probe, after the grid of the largest world size: allreduce
    ``sustained_bytes`` back to back, as training sends, for up to this many seconds (or
    until the rate has dropped and held, a NIC's burst credits spent), then ``repeats``
    samples recorded with phase ``sustained``. 0: none. EC2 types rated "up to" a bandwidth
    burst for 5-60 minutes (3900 s covers them); a NIC without credits needs seconds."""
    sustained_bytes: int = 64 * 1024**2
    collectives: tuple[str, ...] = DEFAULT_COLLECTIVES

    def __post_init__(self) -> None:
        if isinstance(self.collectives, str):
            raise ConfigError(f"collectives: expected a list, got {self.collectives!r}")
        object.__setattr__(self, "collectives", check_collectives(self.collectives))
        if not self.sizes:
            raise ConfigError("sizes: empty")
        for s in self.sizes:
            _check_size(int(s), "sizes")
        if list(self.sizes) != sorted(set(self.sizes)):
            raise ConfigError("sizes: must be strictly increasing without duplicates")
        if not self.world_sizes:
            raise ConfigError("world_sizes: empty")
        for n in self.world_sizes:
            if int(n) < 2:
                raise ConfigError(f"world_sizes: an allreduce needs at least 2 ranks, got {n}")
        if list(self.world_sizes) != sorted(set(self.world_sizes)):
            raise ConfigError("world_sizes: must be strictly increasing without duplicates")
        if not self.concurrency:
            raise ConfigError("concurrency: empty")
        for c in self.concurrency:
            if not 1 <= int(c) <= MAX_CONCURRENT:
                raise ConfigError(f"concurrency: {c} is out of range [1, {MAX_CONCURRENT}]")
        if list(self.concurrency) != sorted(set(self.concurrency)):
            raise ConfigError("concurrency: must be strictly increasing without duplicates")
        if self.repeats < 1:
            raise ConfigError(f"repeats: must be at least 1, got {self.repeats}")
        if self.warmup < 0:
            raise ConfigError(f"warmup: must be >= 0, got {self.warmup}")
        if self.allocations < 1:
            raise ConfigError(f"allocations: must be at least 1, got {self.allocations}")
        if self.backend not in BACKENDS:
            raise UnknownNameError("backend", self.backend, BACKENDS)
        if not (0 <= self.sustained_s < math.inf):
            raise ConfigError(f"sustained_s: must be a number >= 0, got {self.sustained_s}")
        if not self.sweep_timeout_s > 0:
            raise ConfigError(f"sweep_timeout_s: must be positive, got {self.sweep_timeout_s}")
        if not self.sustained_s < self.sweep_timeout_s:
            raise ConfigError(
                f"sustained_s: {self.sustained_s:g} s must be under sweep_timeout_s "
                f"({self.sweep_timeout_s:g} s)"
            )
        _check_size(int(self.sustained_bytes), "sustained_bytes")

    @property
    def max_world_size(self) -> int:
        return max(self.world_sizes)

    def points(self, allocation_slot: int = 0) -> list[Point]:
        """The grid of one allocation, in the order the worker measures it."""
        return [
            Point(allocation_slot, n, s, c, k)
            for n in self.world_sizes
            for k in self.collectives
            for c in self.concurrency
            for s in self.sizes
        ]

    def all_points(self) -> list[Point]:
        return [p for slot in range(self.allocations) for p in self.points(slot)]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SweepConfig:
        known = {
            "sizes",
            "world_sizes",
            "concurrency",
            "repeats",
            "warmup",
            "backend",
            "allocations",
            "sweep_timeout_s",
            "sustained_s",
            "sustained_bytes",
            "collectives",
        }
        unknown = set(d) - known
        if unknown:
            raise ConfigError(f"sweep config: unknown field(s) {sorted(unknown)}")
        kw: dict[str, Any] = dict(d)
        for k in ("sizes", "world_sizes", "concurrency"):
            if k in kw:
                kw[k] = tuple(int(x) for x in _as_iter(kw[k], k))
        if "collectives" in kw:
            kw["collectives"] = check_collectives(
                str(x) for x in _as_iter(kw["collectives"], "collectives")
            )
        return cls(**kw)


def _as_iter(v: Any, name: str) -> Iterable[Any]:
    if isinstance(v, str | bytes) or not isinstance(v, Sequence):
        raise ConfigError(f"{name}: expected a list, got {v!r}")
    return v


def config_from_params(params: Mapping[str, Any]) -> SweepConfig:
    """A ``SweepConfig`` from the DAG's params (or any mapping of the CLI's options):
    ``sizes`` (``LO:HI`` or a list string), ``points_per_decade``/``steps``, ``world_sizes``,
    ``concurrency``, ``repeats``, ``warmup``, ``backend``, ``sustained_s``, ``collectives``
    (a list or a comma-separated string)."""
    kw: dict[str, Any] = {
        "sizes": parse_sizes(
            str(params["sizes"]),
            points_per_decade=params.get("points_per_decade"),
            steps=params.get("steps"),
        )
    }
    for name in ("world_sizes", "concurrency"):
        if name in params:
            kw[name] = tuple(int(v) for v in _as_iter(params[name], name))
    for name in ("repeats", "warmup", "allocations"):
        if params.get(name) is not None:
            kw[name] = int(params[name])
    if params.get("sustained_s"):
        kw["sustained_s"] = float(params["sustained_s"])
        kw["sweep_timeout_s"] = SWEEP_TIMEOUT_S + kw["sustained_s"]
    if params.get("backend"):
        kw["backend"] = str(params["backend"])
    if params.get("collectives") is not None:
        given = params["collectives"]
        items = str(given).split(",") if isinstance(given, str) else _as_iter(given, "collectives")
        kw["collectives"] = check_collectives(str(x).strip() for x in items if str(x).strip())
    return SweepConfig(**kw)
