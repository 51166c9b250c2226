"""A local copy of the champion bandwidth model, so that planning starts without MLflow.

Importing MLflow and asking its client which version holds ``champion`` costs seconds; the
model itself is a few small JSON files. ``registry.load_champion`` reads this copy instead
when it can say, cheaply, that the copy is the champion; otherwise it asks the store as
before and writes the copy again.

**Layout**, under ``paths.model_cache_dir()`` (``<data dir>/models/cache/``): one folder
per MLflow store (a hash of its tracking URI, since version numbers are per store) and
registered model::

    <store>/<model>/champion.json    the pointer
    <store>/<model>/<version>/       that version's predictor folder (model.json, boosters)

The **pointer** names the version (model name, version, run id, data version), the store
(its URI without credentials), when the store last said this version is champion
(``checked_at``), which code wrote it (``promote``: the code that moves the alias;
``load``: a load that asked the store), and the SHA-256 of every file of the version's
folder. It is written after the folder is complete and replaced atomically.

**Why a copy that passes the checks is the champion's model:**

- A registered version's files never change, so a folder keyed by version is either right
  or damaged. Every read checks each file against the pointer's checksums (and that no file
  is missing or extra); a mismatch sends the load to the store, which writes the folder
  again. The checksums catch damage (a torn write, a disk error, a hand edit), not someone
  who can write into the data folder (they could as well edit the local store itself);
  either way only JSON and XGBoost JSON are read, never a pickle or code.
- Only the pointer can go stale: the alias can move after it was written.

  - *Local SQLite store* (the default, ``sqlite:///...``): every read of the copy first
    reads the alias from the store's own table (``registered_model_aliases``; read-only,
    Python's ``sqlite3``, about a millisecond). Whoever moved it (a refresh, the MLflow UI,
    another process or checkout), the copy is used only while its version holds the alias.
    A table that cannot be read as expected (another MLflow schema, a locked or missing
    file) sends the load to MLflow.
  - *Any other store* (a tracking server, another database): the copy is per machine and
    the pointer is trusted for ``max_age_s()`` after the store last confirmed it
    (``SRIFTY_CHAMPION_MAX_AGE``: ``10m`` by default, ``0`` to ask the store every time);
    after that the load asks the store and rewrites the pointer. A promotion made on this
    machine (``registry.promote``) rewrites the pointer at once; one made elsewhere is seen
    here within the maximum age, or at once with ``srifty plan --refresh-model``. A plan
    made within that window uses the previous champion, and says which version it used.

Nothing here imports MLflow.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sqlite3
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from srifty_core import paths
from srifty_core.atomic import write_text_atomic
from srifty_core.errors import ConfigError

POINTER = "champion.json"
POINTER_FORMAT = 1
MAX_AGE_ENV = "SRIFTY_CHAMPION_MAX_AGE"
DEFAULT_MAX_AGE_S = 600.0
"""How long a pointer from a store other than a local SQLite file is trusted (seconds)."""
LOCAL_SCHEME = "sqlite:///"


@dataclass(frozen=True)
class ChampionSource:
    """Which version a load used and how it knew that version is champion."""

    model: str
    version: str
    run_id: str | None
    data_version: str | None
    store: str
    """The tracking URI, without credentials."""
    origin: str
    """``local copy`` or ``MLflow store``."""
    checked: str
    """How the alias was confirmed (and, from the store, why the local copy was not used)."""

    def describe(self) -> str:
        return f"{self.model} v{self.version}, the champion ({self.origin}: {self.checked})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "version": self.version,
            "run_id": self.run_id,
            "data_version": self.data_version,
            "store": self.store,
            "origin": self.origin,
            "checked": self.checked,
        }


@dataclass(frozen=True)
class Pointer:
    """``champion.json``: the version holding the alias and the checksums of its files."""

    model: str
    version: str
    store: str
    checked_at: float
    written_by: str
    files: dict[str, str] = field(default_factory=dict)
    run_id: str | None = None
    data_version: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": POINTER_FORMAT,
            "model": self.model,
            "version": self.version,
            "run_id": self.run_id,
            "data_version": self.data_version,
            "store": self.store,
            "checked_at": self.checked_at,
            "checked_at_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.checked_at)),
            "written_by": self.written_by,
            "files": dict(sorted(self.files.items())),
        }

    @classmethod
    def from_json(cls, d: Any) -> Pointer | None:
        """The pointer, or None for anything that is not one of this format."""
        try:
            if d["format"] != POINTER_FORMAT:
                return None
            files = d["files"]
            if not isinstance(files, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in files.items()
            ):
                return None
            return cls(
                model=str(d["model"]),
                version=str(d["version"]),
                store=str(d["store"]),
                checked_at=float(d["checked_at"]),
                written_by=str(d["written_by"]),
                files=files,
                run_id=None if d.get("run_id") is None else str(d["run_id"]),
                data_version=None if d.get("data_version") is None else str(d["data_version"]),
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class Hit:
    """A verified local copy: its folder and where it came from."""

    folder: Path
    pointer: Pointer
    source: ChampionSource


def max_age_s() -> float:
    """``SRIFTY_CHAMPION_MAX_AGE`` in seconds (``600``, ``90s``, ``10m``, ``1h``; ``0``:
    always ask the store), default ``DEFAULT_MAX_AGE_S``."""
    text = os.environ.get(MAX_AGE_ENV, "").strip().lower()
    if not text:
        return DEFAULT_MAX_AGE_S
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    try:
        value = float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ConfigError(
            f"{MAX_AGE_ENV}: {text!r} is not a duration like 600, 90s, 10m or 1h (0: always "
            "ask the MLflow store)"
        )
    return value


def public_uri(uri: str) -> str:
    """``uri`` without user, password, query or fragment (what is safe to print)."""
    parts = urlsplit(uri)
    if "@" not in parts.netloc and not parts.query and not parts.fragment:
        return uri
    return f"{parts.scheme}://{parts.netloc.rsplit('@', 1)[-1]}{parts.path}"


def entry_dir(uri: str, model: str, root: Path | None = None) -> Path:
    """The folder of ``model``'s copies from the store at ``uri``."""
    key = hashlib.sha256(uri.encode()).hexdigest()[:16]
    return paths.model_cache_dir(root) / key / model


def checksums(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under ``folder``, by path relative to it (POSIX)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            out[path.relative_to(folder).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def read_pointer(uri: str, model: str, root: Path | None = None) -> Pointer | None:
    try:
        data = json.loads((entry_dir(uri, model, root) / POINTER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    pointer = Pointer.from_json(data)
    if pointer is None or pointer.model != model or not pointer.version.isdigit():
        return None
    if not pointer.files:
        return None
    return pointer


def forget(uri: str, model: str, root: Path | None = None) -> None:
    """Remove the pointer (the copies stay; a load asks the store and writes it again)."""
    (entry_dir(uri, model, root) / POINTER).unlink(missing_ok=True)


def store(
    uri: str,
    model: str,
    version: str,
    folder: Path,
    *,
    written_by: str,
    run_id: str | None = None,
    data_version: str | None = None,
    checked_at: float | None = None,
    root: Path | None = None,
) -> Pointer:
    """Copy ``folder`` (version ``version``'s predictor, as the store gave it) into the
    cache and point ``champion.json`` at it. The folder is complete before the pointer
    names it; a folder already there with the same files is kept, other versions' folders
    are removed."""
    files = checksums(folder)
    if "model.json" not in files:
        raise OSError(f"{folder}: no model.json, not a bandwidth predictor folder")
    base = entry_dir(uri, model, root)
    _install(folder, base / _version_dir(version), files)
    for other in base.iterdir():  # earlier champions' copies (a reader of one falls back)
        if other.is_dir() and other.name.isdigit() and other.name != str(version):
            shutil.rmtree(other, ignore_errors=True)
    pointer = Pointer(
        model=model,
        version=str(version),
        store=public_uri(uri),
        checked_at=time.time() if checked_at is None else checked_at,
        written_by=written_by,
        files=files,
        run_id=run_id,
        data_version=data_version,
    )
    write_text_atomic(base / POINTER, json.dumps(pointer.to_json(), indent=1) + "\n")
    return pointer


def lookup(
    uri: str, model: str, alias: str, *, root: Path | None = None, now: float | None = None
) -> Hit | str:
    """The verified local copy of the version holding ``alias`` in the store at ``uri``,
    or why there is none to use (the rules: module docstring)."""
    pointer = read_pointer(uri, model, root)
    if pointer is None:
        return "no local copy yet"
    v = pointer.version
    if uri.startswith(LOCAL_SCHEME):
        try:
            current = local_alias(uri, model, alias)
        except LookupError as exc:
            return f"the local store's alias could not be read directly ({exc})"
        if current != v:
            holder = f"v{current} is" if current else "no version is"
            return f"local copy v{v} is no longer {alias}: {holder}"
        checked = "alias read from the local MLflow store just now"
    else:
        age = (time.time() if now is None else now) - pointer.checked_at
        limit = max_age_s()
        if not 0 <= age <= limit:
            return (
                f"local copy v{v} was last confirmed {_minutes(age)} ago, over the "
                f"{_minutes(limit)} of {MAX_AGE_ENV}"
            )
        checked = (
            f"the store said so {_minutes(age)} ago (trusted up to {_minutes(limit)}, "
            f"{MAX_AGE_ENV}; --refresh-model asks now)"
        )
    folder = entry_dir(uri, model, root) / _version_dir(v)
    try:
        found = checksums(folder)
    except OSError:
        found = {}
    if found != pointer.files:
        return f"local copy v{v} does not match its checksums"
    source = ChampionSource(
        model=model,
        version=v,
        run_id=pointer.run_id,
        data_version=pointer.data_version,
        store=pointer.store,
        origin="local copy",
        checked=checked,
    )
    return Hit(folder, pointer, source)


def local_alias(uri: str, model: str, alias: str) -> str | None:
    """The version holding ``alias`` in the local SQLite store at ``uri`` (None: no version
    holds it), read from MLflow's ``registered_model_aliases`` table. ``LookupError`` when
    that cannot be told (no such file, another schema, the row of more than one
    workspace)."""
    path = uri[len(LOCAL_SCHEME) :].split("?", 1)[0]
    if not path or not Path(path).is_file():
        raise LookupError(f"no SQLite file at {path!r}")
    try:
        con = sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error as exc:
        raise LookupError(str(exc)) from None
    try:
        cur = con.execute(
            "SELECT * FROM registered_model_aliases WHERE name = ? AND alias = ?",
            (model, alias),
        )
        columns = [d[0] for d in cur.description]
        rows = [dict(zip(columns, r, strict=True)) for r in cur.fetchall()]
    except sqlite3.Error as exc:
        raise LookupError(str(exc)) from None
    finally:
        con.close()
    if not rows:
        return None
    if len(rows) > 1 or rows[0].get("version") is None:
        raise LookupError(f"{len(rows)} rows for alias {alias!r}")
    if rows[0].get("workspace") not in (None, "default"):
        raise LookupError(f"alias {alias!r} is in workspace {rows[0]['workspace']!r}")
    return str(rows[0]["version"])


def _version_dir(version: str) -> str:
    text = str(version)
    if not text.isdigit():
        raise OSError(f"model version {text!r} is not a number")
    return text


def _install(src: Path, dest: Path, files: dict[str, str]) -> None:
    """``src`` copied to ``dest`` through a temporary folder beside it and a rename; kept
    as it is when it already holds exactly ``files``."""
    with contextlib.suppress(OSError):
        if dest.is_dir() and checksums(dest) == files:
            return
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp"))
    old = tmp.with_suffix(".old")
    try:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        if dest.exists():
            os.replace(dest, old)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def _minutes(seconds: float) -> str:
    if seconds < 120:
        return f"{max(seconds, 0):.0f} s"
    return f"{seconds / 60:.0f} min"
