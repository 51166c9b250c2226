"""The probe record: ONE schema for every collective measurement, checked on write and read.

``collective`` names what was timed (``probing.config.COLLECTIVES``: all_reduce, all_gather,
reduce_scatter); records written before the column existed were allreduces and read as
``all_reduce``. ``busbw`` follows nccl-tests: ``2s(n-1)/(n t)`` for an allreduce,
``s(n-1)/(n t)`` for the others, ``s`` the total buffer.

One row per sample (``repeat``) of one grid point on one allocation. A row with ``status``
``failed`` records a point that could not be measured, with the reason in ``error`` and no
``time_s``/``busbw``; ``repeat`` is then the sample at which it failed.

A ring over VMs of several instance types (a *mix*) is stored with the same columns under
an ``instance_type`` label naming the mix, ``mix_1xg4dn.12xlarge_3xg4dn.xlarge``; its other
columns describe the ring (``probing.mix``). Such labels must parse.
"""

from __future__ import annotations

import warnings
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from srifty_core.errors import ConfigError, SriftyError
from srifty_core.probing.config import (
    ALL_REDUCE,
    BUSBW_FACTOR,
    COLLECTIVES,
    MAX_BUFFER_BYTES,
    MIN_BUFFER_BYTES,
)
from srifty_core.probing.mix import is_mix, parse_mix

STATUS_OK = "ok"
STATUS_FAILED = "failed"
PHASE_BURST = "burst"
PHASE_SUSTAINED = "sustained"
PHASES = (PHASE_BURST, PHASE_SUSTAINED)

# (name, type, nullable, meaning)
_FIELDS: tuple[tuple[str, pa.DataType, bool, str], ...] = (
    ("date", pa.date32(), False, "partition day (the run's logical date)"),
    ("provider", pa.string(), False, "provider that ran it: local, ec2-emulated, ec2"),
    ("cloud", pa.string(), False, "cloud: local, aws"),
    ("region", pa.string(), False, "region, e.g. us-east-1 (local: local)"),
    ("zone", pa.string(), False, "availability zone ID, e.g. use1-az1"),
    (
        "instance_type",
        pa.string(),
        False,
        "instance type, e.g. g4dn.xlarge or local.cpu; a mixed-type ring: a mix label, "
        "e.g. mix_1xg4dn.12xlarge_3xg4dn.xlarge (probing.mix)",
    ),
    ("gpu_model", pa.string(), False, "GPU model, e.g. T4 (cpu for CPU ranks; mixed for a mix)"),
    ("gpus_per_vm", pa.int32(), False, "GPUs per instance"),
    ("vcpus", pa.int32(), False, "vCPUs per instance"),
    ("network_gbps", pa.float64(), True, "rated network bandwidth, Gbps (null: none rated)"),
    ("placement_group", pa.bool_(), False, "instances in a cluster placement group"),
    ("allocation_id", pa.string(), False, "one VM allocation = one group of repeated samples"),
    ("allocation_slot", pa.int32(), False, "which of the sweep's allocations (0, 1, ...)"),
    ("world_size", pa.int32(), False, "ranks in the allreduce"),
    ("buffer_bytes", pa.int64(), False, "size of each allreduce buffer, bytes"),
    ("concurrent", pa.int32(), False, "asynchronous allreduces in flight at once"),
    ("backend", pa.string(), False, "gloo or nccl"),
    ("repeat", pa.int32(), False, "sample index at this point"),
    ("time_s", pa.float64(), True, "time until all concurrent transfers ended, slowest rank"),
    (
        "busbw",
        pa.float64(),
        True,
        "bus bandwidth of one transfer, bytes/s: 2s(n-1)/(n t) (allreduce), s(n-1)/(n t) "
        "(all-gather, reduce-scatter)",
    ),
    ("status", pa.string(), False, "ok or failed"),
    ("error", pa.string(), True, "why the point failed (null when ok)"),
    ("probed_at", pa.timestamp("us", tz="UTC"), False, "when the sample was taken"),
    (
        "phase",
        pa.string(),
        False,
        "burst (short probes of a fresh allocation: NICs rated 'up to' a bandwidth burst) or "
        "sustained (back-to-back transfers after the burst credits are spent, as training sees)",
    ),
    (
        "spread",
        pa.float64(),
        True,
        "std/mean of time_s over the point's kept repeats (null: not computed, older records)",
    ),
    (
        "noisy",
        pa.bool_(),
        True,
        "the point's repeats still spread more than noise.NOISY_CV after up to "
        "noise.NOISY_RETRIES re-measurements (null: not checked, older records)",
    ),
    (
        "collective",
        pa.string(),
        False,
        "what was timed: all_reduce, all_gather or reduce_scatter (nccl-tests' names; "
        "buffer_bytes is the total buffer); older records: all_reduce",
    ),
)
NULLABLE_SINCE = ("spread", "noisy")
"""Columns added after partitions were written without them: read back as nulls."""

PROBE_SCHEMA = pa.schema(
    [pa.field(n, t, nullable=nl, metadata={"doc": doc}) for n, t, nl, doc in _FIELDS]
)
COLUMNS: tuple[str, ...] = tuple(f[0] for f in _FIELDS)
POINT_KEY = ("allocation_slot", "world_size", "buffer_bytes", "concurrent", "collective")
"""Columns naming a grid point of a sweep (within one partition)."""


class ProbeSchemaError(SriftyError, ValueError):
    """Probe records that do not match the schema; the message names the column."""


def _kind(t: pa.DataType) -> str:
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_integer(t):
        return "integer"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_timestamp(t):
        return "timestamp-utc" if t.tz in ("UTC", "+00:00", "Etc/UTC") else "timestamp-naive"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_null(t):
        return "null"
    return str(t)


def conform(data: Any, *, where: str = "probe records") -> pa.Table:
    """A pyarrow Table with exactly ``PROBE_SCHEMA``, from a pandas DataFrame or a Table.

    Columns must all be present (no extra ones) and of the right kind (integer, float,
    string, bool, UTC timestamp, date); widths are then cast safely. Required columns
    must hold no nulls, and the values must make sense (``check_values``).
    """
    import pandas as pd

    if isinstance(data, pd.DataFrame):
        with warnings.catch_warnings():
            # pyarrow reads tz-aware columns through Series.values, which pandas 3.1 flags.
            warnings.filterwarnings("ignore", message="Series.values returning an ndarray")
            table = pa.Table.from_pandas(data, preserve_index=False)
    elif isinstance(data, pa.Table):
        table = data
    else:
        raise TypeError(f"{where}: expected a pandas DataFrame or pyarrow Table, got {type(data)}")
    table = upgrade(table)
    names = table.column_names
    missing = [c for c in COLUMNS if c not in names]
    extra = [c for c in names if c not in COLUMNS]
    if missing:
        raise ProbeSchemaError(f"{where}: missing column(s) {missing}")
    if extra:
        raise ProbeSchemaError(f"{where}: unexpected column(s) {extra}")
    arrays = []
    for f in PROBE_SCHEMA:
        col = table.column(f.name)
        got, want = _kind(col.type), _kind(f.type)
        if got != want and not (got == "null" and f.nullable):
            raise ProbeSchemaError(
                f"{where}: column {f.name!r} has type {col.type}, expected {f.type}"
            )
        try:
            col = col.cast(f.type, safe=not pa.types.is_timestamp(f.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ProbeSchemaError(f"{where}: column {f.name!r}: {exc}") from exc
        if not f.nullable and col.null_count:
            raise ProbeSchemaError(
                f"{where}: column {f.name!r} has {col.null_count} null value(s); it is required"
            )
        arrays.append(col)
    out = pa.Table.from_arrays(arrays, schema=PROBE_SCHEMA)
    check_values(out, where=where)
    return out


def upgrade(table: pa.Table) -> pa.Table:
    """Records of an older schema with the columns added since: ``phase`` (``with_phase``),
    ``collective`` (``with_collective``) and, as nulls, ``NULLABLE_SINCE``."""
    table = with_collective(with_phase(table))
    for name in NULLABLE_SINCE:
        if name not in table.column_names:
            f = PROBE_SCHEMA.field(name)
            table = table.append_column(f, pa.nulls(table.num_rows, type=f.type))
    if set(table.column_names) == set(COLUMNS):
        table = table.select(list(COLUMNS))  # the added columns in their place
    return table


def with_phase(table: pa.Table) -> pa.Table:
    """Records written before the ``phase`` column existed were all short probes: give
    them ``phase = burst``."""
    if "phase" in table.column_names:
        return table
    return table.append_column(
        pa.field("phase", pa.string(), nullable=False), pa.array([PHASE_BURST] * table.num_rows)
    )


def with_collective(table: pa.Table) -> pa.Table:
    """Records written before the ``collective`` column existed were all allreduces: give
    them ``collective = all_reduce``."""
    if "collective" in table.column_names:
        return table
    return table.append_column(
        pa.field("collective", pa.string(), nullable=False),
        pa.array([ALL_REDUCE] * table.num_rows, type=pa.string()),
    )


def check_schema(schema: pa.Schema, *, where: str) -> None:
    """Raise unless ``schema`` is ``PROBE_SCHEMA`` (names, order, types, nullability)."""
    got = [(f.name, f.type, f.nullable) for f in schema]
    want = [(f.name, f.type, f.nullable) for f in PROBE_SCHEMA]
    if got == want:
        return
    got_d = {n: (t, nl) for n, t, nl in got}
    for n, t, nl in want:
        if n not in got_d:
            raise ProbeSchemaError(f"{where}: missing column {n!r}")
        if got_d[n] != (t, nl):
            raise ProbeSchemaError(
                f"{where}: column {n!r} is {got_d[n][0]} (nullable={got_d[n][1]}), "
                f"expected {t} (nullable={nl})"
            )
    extra = [n for n, _, _ in got if n not in COLUMNS]
    raise ProbeSchemaError(f"{where}: unexpected column(s) {extra} or column order differs")


def check_values(table: pa.Table, *, where: str = "probe records") -> None:
    """Value rules the types cannot say: status, ranges, the collective's name, and busbw =
    factor * s(n-1)/(n t) (factor 2 for an allreduce, 1 for the others)."""
    if table.num_rows == 0:
        return

    def bad(mask: Any, what: str) -> None:
        n = pc.sum(pc.cast(pc.fill_null(mask, True), pa.int64())).as_py() or 0
        if n:
            raise ProbeSchemaError(f"{where}: {n} row(s) with {what}")

    status = table["status"]
    bad(pc.invert(pc.is_in(status, pa.array([STATUS_OK, STATUS_FAILED]))), "status not ok/failed")
    for label in pc.unique(table["instance_type"]).to_pylist():
        if is_mix(label):  # a mixed-type ring (``probing.mix``): its label must parse
            try:
                parse_mix(label)
            except ConfigError as exc:
                raise ProbeSchemaError(f"{where}: {exc}") from exc
    bad(pc.less(table["world_size"], 2), "world_size < 2")
    bad(
        pc.or_(
            pc.less(table["buffer_bytes"], MIN_BUFFER_BYTES),
            pc.greater(table["buffer_bytes"], MAX_BUFFER_BYTES),
        ),
        "buffer_bytes out of range",
    )
    bad(pc.less(table["concurrent"], 1), "concurrent < 1")
    bad(pc.invert(pc.is_in(table["phase"], pa.array(list(PHASES)))), "phase not burst/sustained")
    bad(
        pc.invert(pc.is_in(table["collective"], pa.array(list(COLLECTIVES)))),
        f"collective not one of {', '.join(COLLECTIVES)}",
    )
    ok = pc.equal(status, STATUS_OK)
    okt = table.filter(ok)
    if okt.num_rows:
        bad(pc.invert(pc.greater(okt["time_s"], 0.0)), "status ok and time_s missing or <= 0")
        bad(pc.invert(pc.greater(okt["busbw"], 0.0)), "status ok and busbw missing or <= 0")
        bad(pc.is_valid(okt["error"]), "status ok and an error message")
        n = pc.cast(okt["world_size"], pa.float64())
        factor = pc.if_else(
            pc.equal(okt["collective"], ALL_REDUCE),
            BUSBW_FACTOR[ALL_REDUCE],
            BUSBW_FACTOR["all_gather"],
        )
        fs = pc.multiply(pc.cast(okt["buffer_bytes"], pa.float64()), factor)
        expected = pc.divide(pc.multiply(fs, pc.subtract(n, 1.0)), pc.multiply(n, okt["time_s"]))
        rel = pc.abs(pc.divide(pc.subtract(okt["busbw"], expected), expected))
        bad(
            pc.greater(rel, 1e-6),
            "busbw != 2*buffer_bytes*(world_size-1)/(world_size*time_s) for all_reduce "
            "(1*... for all_gather and reduce_scatter)",
        )
    failed = table.filter(pc.invert(ok))
    if failed.num_rows:
        bad(pc.is_null(failed["error"]), "status failed and no error message")
