"""nccl-tests output (``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf``) parsed
into the rows of the shipped table (``predictors.nccl_tests``; columns: SOURCES.md section 4).

Contract: ``parse_tables(text, collective=None)`` returns one ``ParsedTable`` per result
table in ``text`` (a log, a README, a comment): its collective (from the ``# Collective test
starting: X_perf`` line before it, else ``collective``; none of either: ``ConfigError``) and
its rows, each the out-of-place and in-place time (us), algbw and busbw (GB/s) as printed.
Lines may carry a launcher's prefix (``0:``, ``[1,0]<stdout>:``); both layouts of nccl-tests
are read (with a ``root`` column since 2.10, without before). Nothing is guessed: a row
that does not parse ends its table. ``world_size_from_ratio`` reads the rank count from
busbw / algbw where the output does not state it (nccl-tests' factors: ``2(n-1)/n`` for
all_reduce, ``(n-1)/n`` for the others), from the row with the largest algbw.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from srifty_core.errors import ConfigError
from srifty_core.probing.config import BUSBW_FACTOR, COLLECTIVES

_PREFIX = re.compile(r"^\s*(?:\[\d+,\d+\]<std(?:out|err)>:|\d+:)?")
_MARKER = re.compile(r"#\s*Collective test starting:\s*(\w+?)(?:_perf)?(?:_mpi)?\s*$")
_HEADER = re.compile(r"#\s+size\s+count\s+type\s+redop(\s+root)?\s+time\s+algbw\s+busbw")
_NUM = r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"


@dataclass(frozen=True)
class ParsedRow:
    size_bytes: int
    count_elements: int
    dtype: str
    redop: str
    time_us: float
    algbw_GBps: float
    busbw_GBps: float
    inplace_time_us: float | None
    inplace_algbw_GBps: float | None
    inplace_busbw_GBps: float | None


@dataclass(frozen=True)
class ParsedTable:
    collective: str
    rows: list[ParsedRow] = field(default_factory=list)
    first_line: int = 0
    """Line number (0-based) of the table's header in the text."""


def _strip(line: str) -> str:
    return _PREFIX.sub("", line, count=1).strip()


def _row(text: str, has_root: bool) -> ParsedRow | None:
    parts = text.split()
    if len(parts) < 7 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    head = 5 if has_root else 4  # size count type redop [root]
    try:
        values = parts[head:]
        t, alg, bus = float(values[0]), float(values[1]), float(values[2])
        # then #wrong (or error), and the in-place triple where printed
        rest = values[4:]
        inplace = (float(rest[0]), float(rest[1]), float(rest[2])) if len(rest) >= 3 else None
    except (IndexError, ValueError):
        return None
    return ParsedRow(
        size_bytes=int(parts[0]),
        count_elements=int(parts[1]),
        dtype=parts[2],
        redop=parts[3],
        time_us=t,
        algbw_GBps=alg,
        busbw_GBps=bus,
        inplace_time_us=None if inplace is None else inplace[0],
        inplace_algbw_GBps=None if inplace is None else inplace[1],
        inplace_busbw_GBps=None if inplace is None else inplace[2],
    )


def parse_tables(text: str, collective: str | None = None) -> list[ParsedTable]:
    """Every result table in ``text`` (rules: module docstring)."""
    if collective is not None and collective not in COLLECTIVES:
        raise ConfigError(
            f"collective: must be one of {', '.join(COLLECTIVES)}, got {collective!r}"
        )
    tables: list[ParsedTable] = []
    marker: str | None = None
    current: ParsedTable | None = None
    has_root = True
    for k, raw in enumerate(text.splitlines()):
        line = _strip(raw)
        m = _MARKER.search(line)
        if m:
            marker = m.group(1)
            current = None
            continue
        h = _HEADER.search(line)
        if h:
            name = marker or collective
            if name is None:
                raise ConfigError(
                    f"line {k + 1}: a result table without a '# Collective test starting' "
                    "line; pass collective= to say which it is"
                )
            # a collective not among ours (alltoall, broadcast, ...): its rows are skipped
            current = ParsedTable(name, [], k) if name in COLLECTIVES else None
            if current is not None:
                tables.append(current)
            has_root = h.group(1) is not None
            continue
        if current is None or not line or line.startswith("#"):
            continue
        row = _row(line, has_root)
        if row is None:
            current = None  # the table ended
            continue
        current.rows.append(row)
    return [t for t in tables if t.rows]


def world_size_from_ratio(table: ParsedTable) -> int:
    """The rank count busbw / algbw implies (rules: module docstring); ``ConfigError`` when
    the printed digits cannot tell it."""
    best = max(table.rows, key=lambda r: r.algbw_GBps)
    if not best.algbw_GBps > 0:
        raise ConfigError("world size: no row with a positive algbw to read busbw/algbw from")
    r = best.busbw_GBps / best.algbw_GBps
    f = BUSBW_FACTOR[table.collective]
    # r = f (n-1)/n  ->  n = f / (f - r)
    if not 0 < r < f:
        raise ConfigError(f"world size: busbw/algbw = {r:.4f} is not below {f:g}")
    n = round(f / (f - r))
    # the printed 2 decimals must be consistent with n exactly
    tol = 0.006 / best.algbw_GBps + 0.005 / best.algbw_GBps
    if abs(f * (n - 1) / n - r) > max(tol, 1e-3):
        raise ConfigError(f"world size: busbw/algbw = {r:.4f} matches no whole rank count")
    return int(n)


__all__ = ["ParsedRow", "ParsedTable", "parse_tables", "world_size_from_ratio"]
