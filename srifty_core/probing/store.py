"""The probe store: a Parquet dataset of probe records, one file per partition.

Layout under ``paths.probe_store_dir()``::

    date=2026-01-31/provider=local/instance_type=local.cpu/data.parquet

A partition is owned by one task (one instance type's sweep on one day). Writing it
replaces the whole file atomically: the table goes to a hidden temporary file beside it,
is fsynced, then renamed over ``data.parquet``. A rerun therefore never duplicates rows,
and a crash leaves either the old file or the new one, never half of one. Folders whose
names start with ``_`` or ``.`` (the sweep's uncommitted partial files) are not data.

**Checksums.** Beside each file, ``data.parquet.sha256`` holds the file's SHA-256, its row
count and size (and the previous file's, see below), and every Parquet page carries a
CRC. Reading checks both, so a flipped bit anywhere in the file is a ``ProbeStoreError``
naming the partition instead of silently different numbers. The sidecar is replaced
(atomically) *before* the data file, and keeps the file it replaces as ``previous``: a
crash between the two renames leaves the old file with a sidecar that still vouches for
it. A partition written before checksums existed (no sidecar) is read unchecked.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import uuid
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from srifty_core import paths
from srifty_core.errors import ConfigError, SriftyError
from srifty_core.probing.config import ALL_REDUCE
from srifty_core.probing.schema import (
    PHASE_BURST,
    PROBE_SCHEMA,
    STATUS_OK,
    check_schema,
    check_values,
    conform,
    upgrade,
)

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

PARTITION_FILE = "data.parquet"
CHECKSUM_FILE = f"{PARTITION_FILE}.sha256"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class ProbeStoreError(SriftyError):
    """The store holds something it should not (a file with another schema, say)."""


def partition_dir(day: date, provider: str, instance_type: str, root: Path | None = None) -> Path:
    """The folder of one partition."""
    for field, value in (("provider", provider), ("instance_type", instance_type)):
        if not _NAME_RE.match(value):
            raise ConfigError(f"{field}: {value!r} cannot name a partition folder")
    base = root or paths.probe_store_dir()
    return (
        base / f"date={day.isoformat()}" / f"provider={provider}" / f"instance_type={instance_type}"
    )


def records_to_table(records: Iterable[dict[str, Any]]) -> pa.Table:
    """Rows as dicts (``probed_at`` a datetime or ISO string, ``date`` a date or ISO string)
    to a checked table; a row without ``phase`` or ``collective`` is a burst allreduce."""
    rows = []
    for r in records:
        r = dict(r)
        if isinstance(r.get("probed_at"), str):
            r["probed_at"] = datetime.fromisoformat(r["probed_at"])
        if isinstance(r.get("date"), str):
            r["date"] = date.fromisoformat(r["date"])
        r.setdefault("phase", PHASE_BURST)
        r.setdefault("collective", ALL_REDUCE)
        rows.append(r)
    try:
        table = pa.Table.from_pylist(rows, schema=PROBE_SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError) as exc:
        raise ProbeStoreError(f"probe records do not fit the schema: {exc}") from exc
    return conform(table)


def write_partition(
    data: Any,
    *,
    day: date,
    provider: str,
    instance_type: str,
    root: Path | None = None,
) -> Path:
    """Replace the partition (day, provider, instance_type) with ``data`` (a DataFrame or
    Table of probe records, all of that partition); return the file written."""
    import pyarrow.compute as pc

    table = conform(data, where=f"probe records for {day}/{provider}/{instance_type}")
    for col, want in (("date", day), ("provider", provider), ("instance_type", instance_type)):
        values = pc.unique(table[col]).to_pylist()
        if values and values != [want]:
            raise ConfigError(
                f"{col}: rows hold {values}, but the partition is {day}/{provider}/{instance_type}"
            )
    folder = partition_dir(day, provider, instance_type, root)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(f".{PARTITION_FILE}.*.tmp"):  # left by a killed writer
        with contextlib.suppress(FileNotFoundError):
            stale.unlink()
    final = folder / PARTITION_FILE
    tmp = folder / f".{PARTITION_FILE}.{uuid.uuid4().hex}.tmp"
    side_tmp = folder / f".{CHECKSUM_FILE}.{uuid.uuid4().hex}.tmp"
    try:
        pq.write_table(table, tmp, write_page_checksum=True)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        entry = _checksum_entry(tmp, table.num_rows)
        previous = _sidecar(folder).get("current") if final.exists() else None
        side_tmp.write_text(json.dumps({"current": entry, "previous": previous}))
        with open(side_tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(side_tmp, folder / CHECKSUM_FILE)  # first: it vouches for old and new
        os.replace(tmp, final)
        _fsync_dir(folder)
    finally:
        for t in (tmp, side_tmp):
            with contextlib.suppress(FileNotFoundError):
                t.unlink()
    return final


def _checksum_entry(path: Path, rows: int) -> dict[str, Any]:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"sha256": digest, "rows": int(rows), "bytes": path.stat().st_size}


def _sidecar(folder: Path) -> dict[str, Any]:
    """The partition's checksum sidecar ({} when there is none)."""
    path = folder / CHECKSUM_FILE
    try:
        out = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ProbeStoreError(f"probe partition checksum {path} is unreadable: {exc}") from exc
    if not isinstance(out, dict):
        raise ProbeStoreError(f"probe partition checksum {path} is not a JSON object")
    return out


def verify_partition(path: Path) -> None:
    """Raise ``ProbeStoreError`` unless ``path`` matches its sidecar's checksum (the
    current file's or, after a crash between the renames, the previous one's)."""
    side = _sidecar(path.parent)
    if not side:
        return
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    vouched = [e for e in (side.get("current"), side.get("previous")) if isinstance(e, dict)]
    if not any(e.get("sha256") == digest and e.get("bytes") == len(data) for e in vouched):
        raise ProbeStoreError(
            f"probe partition {path} does not match its checksum ({CHECKSUM_FILE}): the file "
            "was damaged or changed outside srifty; rerun that day's sweep for this type "
            "(srifty probe ... --day), or delete the partition folder to drop it"
        )


def read_partition_table(path: Path) -> pa.Table:
    """One partition file, its checksum, schema and values checked."""
    verify_partition(path)
    try:
        table = pq.read_table(path, page_checksum_verification=True)
    except (OSError, pa.ArrowInvalid) as exc:
        raise ProbeStoreError(f"cannot read probe partition {path}: {exc}") from exc
    table = upgrade(table)
    check_schema(table.schema, where=str(path))
    check_values(table, where=str(path))
    return table.replace_schema_metadata(None).cast(PROBE_SCHEMA)


def partition_files(
    root: Path | None = None,
    *,
    providers: Iterable[str] | None = None,
    instance_types: Iterable[str] | None = None,
) -> list[Path]:
    """Partition files in the store, pruned by folder name."""
    base = root or paths.probe_store_dir()
    prov = set(providers) if providers is not None else None
    types = set(instance_types) if instance_types is not None else None
    out = []
    for f in sorted(base.glob(f"date=*/provider=*/instance_type=*/{PARTITION_FILE}")):
        p = f.parent.parent.name.removeprefix("provider=")
        t = f.parent.name.removeprefix("instance_type=")
        if (prov is None or p in prov) and (types is None or t in types):
            out.append(f)
    return out


def read_probes(
    root: Path | None = None,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    instance_types: Iterable[str] | None = None,
    providers: Iterable[str] | None = None,
    include_failed: bool = False,
    half_life: timedelta | None = None,
    now: datetime | None = None,
) -> pd.DataFrame:
    """Probe records as a DataFrame (columns of ``PROBE_SCHEMA``), filtered.

    ``since``/``until`` bound ``probed_at`` (``since <= probed_at < until``; naive datetimes
    are UTC). Failed points are left out unless ``include_failed``. With ``half_life``, a
    ``weight`` column holds ``0.5 ** (age / half_life)``, age counted from ``now`` (default:
    the current time), so stale samples count less when the model is refit.
    """
    import pandas as pd

    files = partition_files(root, providers=providers, instance_types=instance_types)
    tables = [read_partition_table(f) for f in files]
    table = pa.concat_tables(tables) if tables else PROBE_SCHEMA.empty_table()
    df = table.to_pandas()
    # Keep the dtype stable whether or not there are rows.
    df["probed_at"] = pd.to_datetime(df["probed_at"], utc=True)
    mask = pd.Series(True, index=df.index)
    if not include_failed:
        mask &= df["status"] == STATUS_OK
    if since is not None:
        mask &= df["probed_at"] >= pd.Timestamp(_utc(since))
    if until is not None:
        mask &= df["probed_at"] < pd.Timestamp(_utc(until))
    df = df[mask].reset_index(drop=True)
    if half_life is not None:
        df["weight"] = age_weights(df["probed_at"], half_life, now)
    result: pd.DataFrame = df
    return result


def age_weights(
    probed_at: pd.Series, half_life: timedelta, now: datetime | None = None
) -> np.ndarray:
    """``0.5 ** (age / half_life)`` per sample; samples from the future weigh 1."""
    import numpy as np
    import pandas as pd

    if not half_life.total_seconds() > 0:
        raise ConfigError(f"half_life: must be positive, got {half_life}")
    ref = pd.Timestamp(_utc(now or datetime.now(UTC)))
    age_s = (ref - pd.to_datetime(probed_at, utc=True)).dt.total_seconds().to_numpy(float)
    age_s = np.clip(age_s, 0.0, None)
    weights: np.ndarray = np.power(0.5, age_s / half_life.total_seconds())
    return weights


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
