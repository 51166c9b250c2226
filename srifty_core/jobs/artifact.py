"""The worker wheel a run's VMs install: a wheel of exactly the Srifty source that plans and
launches the run, uploaded with its sha256 to the run storage.

What the VMs install is a deployment setting (``cloud.ec2.user_data.WorkerWheel``). When the
deployment names a wheel (``SRIFTY_WORKER_WHEEL_URI`` and ``SRIFTY_WORKER_WHEEL_SHA256``)
that wheel is used, always. When it names none but has run storage
(``SRIFTY_RUN_STORAGE=s3://bucket/prefix``), ``worker_wheel`` makes one of this process's
own source:

1. **The source** is the tree Srifty runs from (a checkout, an editable install, or the
   control-plane image's copied sources: ``paths.in_source_tree``). Its *source digest* is
   a sha256 over what goes into the wheel (``pyproject.toml``, ``README.md`` and every file
   under ``srifty_core/`` but caches), so uncommitted edits count; ``git rev-parse HEAD``
   and whether those files differ from it are recorded too, for provenance. A Srifty
   installed from a wheel has no sources to build from: the deployment must then name the
   wheel (``ConfigError`` saying so).
2. **Find or build.** Builds live under ``<source>/dist/srifty-worker/<source digest>/``
   (the wheel and ``source.json``, what it was built from and its sha256); one whose digest
   and sha256 still match is reused, else ``pip wheel --no-deps`` builds one from a copy of
   the sources in a temporary folder (no ``build/`` or ``*.egg-info`` in the source tree).
   Where the source tree is read-only (an image), the builds go to the data folder's
   ``worker-wheels/``. A file lock keeps concurrent tasks from building the same digest
   twice; the newest ``KEEP_BUILDS`` builds are kept.
3. **Upload**, content-addressed: ``<run storage>/wheels/<sha256>/srifty-<version>-py3-
   none-any.whl`` (one PUT, seen whole or not at all) and ``source.json`` beside it;
   skipped when that object is already there with the same size (its key is its hash).
4. The result, a ``WorkerWheel`` (the ``s3://`` URI and the sha256 the VM checks before
   installing), is cached per process and source digest.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from srifty_core import paths
from srifty_core.atomic import write_text_atomic
from srifty_core.cloud.ec2.user_data import WHEEL_SHA256_ENV, WHEEL_URI_ENV, WorkerWheel
from srifty_core.errors import ConfigError
from srifty_core.runs import store as run_store

log = logging.getLogger(__name__)

WHEELS_FOLDER = "wheels"
"""Under the run storage: ``wheels/<sha256>/<wheel file>``."""
BUILDS_FOLDER = "srifty-worker"
"""Under the source tree's ``dist/``: ``srifty-worker/<source digest>/``."""
SOURCE_JSON = "source.json"
KEEP_BUILDS = 4
SOURCE_FILES = ("pyproject.toml", "README.md")
PACKAGE = "srifty_core"
_SKIP_DIRS = frozenset({"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"})
_SKIP_SUFFIXES = (".pyc", ".pyo")
BUILD_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Artifact:
    """A worker wheel: where the VMs get it (``wheel``), the local file, what it was built
    from (``source``: ``source_digest``, ``commit``, ``dirty``, ``sha256``, ...), and what
    this call did (``built``: a new build, else a stored one; ``uploaded``: a new upload,
    else the object was there)."""

    wheel: WorkerWheel
    path: Path
    source: Mapping[str, object]
    built: bool
    uploaded: bool


_CACHE: dict[tuple[str, str, str], Artifact] = {}


def clear_cache() -> None:
    """Forget this process's artifacts (the next call looks at the stored builds again)."""
    _CACHE.clear()


def source_root() -> Path | None:
    """The source tree this Srifty runs from, or ``None`` for an installed wheel."""
    return paths.REPO_ROOT if paths.in_source_tree() else None


def source_files(root: Path) -> Iterator[Path]:
    """What the wheel is built from, relative to ``root``, in a stable order."""
    for name in SOURCE_FILES:
        if (root / name).is_file():
            yield Path(name)
    for dirpath, dirnames, filenames in os.walk(root / PACKAGE):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for f in sorted(filenames):
            if not f.endswith(_SKIP_SUFFIXES):
                yield (Path(dirpath) / f).relative_to(root)


def source_digest(root: Path) -> str:
    """A sha256 over the names and contents of ``source_files(root)``."""
    h = hashlib.sha256()
    for rel in source_files(root):
        h.update(rel.as_posix().encode() + b"\0")
        h.update(file_sha256(root / rel).encode() + b"\n")
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def git_state(root: Path) -> tuple[str, bool | None]:
    """``(HEAD commit, whether the wheel's sources differ from it)`` of a git checkout;
    ``("", None)`` elsewhere (an image's copied sources have no history)."""
    if not (root / ".git").exists() or shutil.which("git") is None:
        return "", None
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", *SOURCE_FILES, PACKAGE],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "", None
    return head, bool(status.strip())


def builds_dir(root: Path) -> Path:
    """``<root>/dist/srifty-worker`` when it can be written, else the data folder's
    ``worker-wheels`` (a read-only source tree: the control-plane image)."""
    here = root / "dist" / BUILDS_FOLDER
    try:
        here.mkdir(parents=True, exist_ok=True)
        if os.access(here, os.W_OK):
            return here
    except OSError:
        pass
    there = paths.data_dir() / "worker-wheels"
    there.mkdir(parents=True, exist_ok=True)
    return there


def stored_build(folder: Path) -> tuple[Path, dict[str, object]] | None:
    """The wheel in ``folder`` and its ``source.json``, when the file still has the sha256
    recorded there (else ``None``: a torn or changed build is never reused)."""
    try:
        record = json.loads((folder / SOURCE_JSON).read_text())
        wheel = folder / str(record["wheel"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(record, dict) or not wheel.is_file():
        return None
    if file_sha256(wheel) != record.get("sha256"):
        return None
    return wheel, record


def build_wheel(root: Path, out: Path) -> tuple[Path, dict[str, object]]:
    """Build a wheel of ``root`` (from a copy of its sources in a temporary folder) into
    ``out`` with ``source.json`` beside it; returns both."""
    with tempfile.TemporaryDirectory(prefix="srifty-wheel-") as tmp:
        src, wheels = Path(tmp) / "src", Path(tmp) / "wheels"
        for rel in source_files(root):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, src / rel)
        digest = source_digest(src)  # of what is built, even if the tree moves on meanwhile
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-input", "-q"]
        if _setuptools_here():
            cmd.append("--no-build-isolation")  # offline: this environment's setuptools
        cmd += [str(src), "-w", str(wheels)]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        built = sorted(wheels.glob("srifty-*-py3-none-any.whl"))
        if run.returncode != 0 or len(built) != 1:
            raise ConfigError(
                f"could not build the worker wheel from {root} ({' '.join(cmd[2:5])}: exit "
                f"{run.returncode}): {(run.stderr or run.stdout)[-1500:]}; or set "
                f"{WHEEL_URI_ENV} and {WHEEL_SHA256_ENV} to a wheel built elsewhere"
            )
        commit, dirty = git_state(root)
        record: dict[str, object] = {
            "wheel": built[0].name,
            "sha256": file_sha256(built[0]),
            "size": built[0].stat().st_size,
            "source_digest": digest,
            "commit": commit,
            "dirty": dirty,
            "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "python": sys.version.split()[0],
        }
        out.mkdir(parents=True, exist_ok=True)
        target = out / built[0].name
        staging = out / f".{built[0].name}.tmp"
        shutil.copyfile(built[0], staging)
        os.replace(staging, target)  # the record is written last: it marks a whole build
        write_text_atomic(out / SOURCE_JSON, json.dumps(record, indent=2) + "\n")
    return target, record


def _setuptools_here() -> bool:
    """Whether this environment has the setuptools the project builds with (>= 68)."""
    from importlib import metadata

    try:
        return int(metadata.version("setuptools").split(".")[0]) >= 68
    except (metadata.PackageNotFoundError, ValueError):
        return False


def _prune(builds: Path, keep: str) -> None:
    """Keep the newest ``KEEP_BUILDS`` build folders (and ``keep``)."""
    folders = sorted(
        (d for d in builds.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime, reverse=True
    )
    for d in folders[KEEP_BUILDS:]:
        if d.name != keep:
            shutil.rmtree(d, ignore_errors=True)


def find_or_build(root: Path, digest: str | None = None) -> tuple[Path, dict[str, object], bool]:
    """The stored build of ``root``'s current sources, or a new one: ``(wheel, record,
    built now)``."""
    from filelock import FileLock

    digest = digest or source_digest(root)
    builds = builds_dir(root)
    with FileLock(str(builds / ".lock"), timeout=BUILD_TIMEOUT_S + 60):
        found = stored_build(builds / digest)
        if found is not None and found[1].get("source_digest") == digest:
            os.utime(builds / digest)  # recently used: the last to be pruned
            return found[0], found[1], False
        shutil.rmtree(builds / ".building", ignore_errors=True)  # a build killed midway
        wheel, record = build_wheel(root, builds / ".building")
        final = builds / str(record["source_digest"])
        shutil.rmtree(final, ignore_errors=True)
        os.replace(builds / ".building", final)
        _prune(builds, final.name)
        log.info("built the worker wheel %s (sources %s)", record["wheel"], final.name[:12])
        return final / wheel.name, record, True


def _check_storage(storage: str) -> None:
    if not storage.startswith("s3://"):
        raise ConfigError(
            f"{paths.RUN_STORAGE_ENV}: the VMs fetch the worker wheel with `aws s3 cp`, so the "
            f"run storage must be s3://bucket/prefix to hold it (got {storage!r}); or set "
            f"{WHEEL_URI_ENV} and {WHEEL_SHA256_ENV}"
        )


def upload(wheel: Path, record: Mapping[str, object], storage: str) -> tuple[WorkerWheel, bool]:
    """Put ``wheel`` at ``<storage>/wheels/<sha256>/<name>`` (and its ``source.json``)
    unless an object of the same size is there; returns the ``WorkerWheel`` and whether it
    was uploaded now."""
    _check_storage(storage)
    sha = str(record["sha256"])
    uri = str(run_store.join(storage, WHEELS_FOLDER, sha, wheel.name))
    fs, where = run_store.filesystem(uri)
    fs.invalidate_cache()
    size = wheel.stat().st_size
    if fs.exists(where) and int(fs.size(where)) == size:
        return WorkerWheel(uri, sha), False
    fs.put_file(str(wheel), where)  # one PUT (or one multipart upload): whole or nothing
    fs.pipe_file(
        str(run_store.join(str(run_store.parent(where)), SOURCE_JSON)),
        (json.dumps(dict(record), indent=2) + "\n").encode(),
    )
    log.info("uploaded the worker wheel to %s", uri)
    return WorkerWheel(uri, sha), True


def prepare(root: Path | None = None, storage: str | None = None) -> Artifact:
    """The worker wheel of ``root``'s sources (default: this Srifty's source tree) at
    ``storage`` (default: the deployment's run storage): found or built, uploaded once."""
    root = root if root is not None else source_root()
    if root is None:
        raise ConfigError(
            f"Srifty is installed without its sources, so it cannot build the wheel its VMs "
            f"install: the deployment must set {WHEEL_URI_ENV} (an s3:// or https:// URI of "
            f"the wheel of this version) and {WHEEL_SHA256_ENV}"
        )
    storage = storage if storage is not None else paths.run_storage()
    if not storage:
        raise ConfigError(
            f"EC2 workers install Srifty from a wheel: set {WHEEL_URI_ENV} and "
            f"{WHEEL_SHA256_ENV}, or {paths.RUN_STORAGE_ENV} (s3://bucket/prefix) for the "
            "run to upload the wheel of its own source there"
        )
    _check_storage(storage)
    digest = source_digest(root)
    key = (str(root.resolve()), storage, digest)
    if key in _CACHE:
        return replace(_CACHE[key], built=False, uploaded=False)
    path, record, built = find_or_build(root, digest)
    wheel, uploaded = upload(path, record, storage)
    _CACHE[key] = Artifact(wheel, path, record, built, uploaded)
    return _CACHE[key]


def worker_wheel() -> WorkerWheel:
    """The wheel a run's VMs install: the deployment's (``WorkerWheel.from_env``), else
    this source's wheel on the run storage (``prepare``)."""
    named = WorkerWheel.from_env()
    return named if named is not None else prepare().wheel
