"""Training checkpoints: model, optimizer, data position and iteration in one file.

Written, then published (``run_store.publish``): locally a temporary file in the same
folder, fsync, then ``os.replace``; at an fsspec URI (``s3://bucket/run/checkpoint.pt``
through s3fs, ``memory://`` in tests) a temporary key, then a server-side copy over the
target. A reader sees the previous checkpoint or the new one, never half of one. The data
position is the number of samples consumed (``iteration x global_batch``): data is
addressed by global sample index, so a checkpoint resumes on any world size and mix of
local batches as long as the global batch is unchanged.

Sharded runs (``fsdp``/``hsdp``) write another kind beside it (``worker.sharded_checkpoint``:
DCP's files in a new folder under ``checkpoint.sharded/``, then the small summary
``checkpoint.sharded.json`` naming it, published whole). ``checkpoint_iteration`` and
``check_resumable`` answer for both kinds: the run folder's checkpoint is whichever holds
the later iteration (``latest``).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from srifty_core.errors import ConfigError
from srifty_core.planner.schema.train_plan import CHECKPOINT_FILE
from srifty_core.runs import store as run_store
from srifty_core.runs.progress import read_progress, rewind

__all__ = [
    "CHECKPOINT_FILE",
    "Checkpoint",
    "CheckpointError",
    "check_resumable",
    "checkpoint_iteration",
    "latest",
    "load_checkpoint",
    "save_checkpoint",
    "sharded_paths",
    "sharded_summary",
    "sidecar_path",
]
SIDECAR_SUFFIX = ".json"
SHARDED_SUFFIX = ".sharded"
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Checkpoint:
    iteration: int
    """Iterations done (the next one to run has this index)."""
    samples: int
    """Data position: samples consumed so far."""
    global_batch: int
    config_id: str
    model: dict[str, Any]
    optimizer: dict[str, Any]
    scaler: dict[str, Any] | None = None
    """fp16's ``GradScaler`` state (its loss scale and growth tracker), ``None`` otherwise:
    a resumed fp16 run continues with the scale it had reached instead of relearning it
    from 65536 through a burst of skipped steps."""
    extra: dict[str, Any] | None = None
    """A training script's own state (``worker.user.save_checkpoint(extra=...)``: a
    learning-rate schedule, a data position of its own), tensors and plain values."""


def save_checkpoint(
    path: Path | str,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    iteration: int,
    global_batch: int,
    config_id: str,
    scaler: torch.amp.GradScaler | None = None,
    extra: dict[str, Any] | None = None,
) -> Path | str:
    """Write a checkpoint and publish it whole (``run_store.publish``); returns where."""
    payload: dict[str, Any] = {
        "iteration": iteration,
        "samples": iteration * global_batch,
        "global_batch": global_batch,
        "config_id": config_id,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
    }
    if scaler is not None:
        payload["scaler"] = scaler.state_dict()
    if extra is not None:
        payload["extra"] = extra
    buf = io.BytesIO()
    torch.save(payload, buf)
    data = buf.getvalue()
    del buf  # the serialized checkpoint is held once, not twice
    digest = hashlib.sha256(data).hexdigest()
    where = run_store.publish(path, data)
    summary = {"iteration": iteration, "config_id": config_id, "sha256": digest}
    try:  # best effort: a summary older than its checkpoint is never trusted
        run_store.write_text(sidecar_path(path), json.dumps(summary) + "\n")
    except OSError as exc:
        _log.warning("checkpoint summary %s not written: %s", sidecar_path(path), exc)
    return where


class CheckpointError(ConfigError):
    """A checkpoint that cannot be read, or a run that cannot resume from its own."""


def sidecar_path(path: Path | str) -> Path | str:
    """The checkpoint's summary beside it: ``checkpoint.pt`` -> ``checkpoint.json``."""
    base = run_store.name(path)
    stem = base.rsplit(".", 1)[0] if "." in base else base
    return run_store.join(run_store.parent(path), f"{stem}{SIDECAR_SUFFIX}")


@dataclass(frozen=True)
class ShardedSummary:
    """What ``checkpoint.sharded.json`` says of the sharded checkpoint it publishes."""

    iteration: int
    samples: int
    global_batch: int
    config_id: str
    folder: Path | str
    """DCP's folder of this checkpoint (``checkpoint.sharded/<name>``)."""
    world: int
    """The ranks that wrote it (any world size loads it: DCP reshards)."""
    strategy: str
    optimizer: bool = True
    """Whether it holds the optimizer's state (a script may checkpoint its model alone)."""


def sharded_paths(path: Path | str) -> tuple[Path | str, Path | str]:
    """The summary and the folder of the sharded checkpoint beside the one-file checkpoint
    ``path``: ``checkpoint.pt`` -> ``checkpoint.sharded.json``, ``checkpoint.sharded/``."""
    base = run_store.name(path)
    stem = base.rsplit(".", 1)[0] if "." in base else base
    folder = run_store.join(run_store.parent(path), f"{stem}{SHARDED_SUFFIX}")
    summary = run_store.join(run_store.parent(path), f"{stem}{SHARDED_SUFFIX}{SIDECAR_SUFFIX}")
    return summary, folder


def sharded_summary(path: Path | str) -> ShardedSummary | None:
    """The sharded checkpoint beside ``path`` (``None`` when there is none, or when the
    folder its summary names is gone); ``CheckpointError`` for a damaged summary."""
    summary, folder = sharded_paths(path)
    raw = run_store.read_text(summary)
    if raw is None:
        return None
    try:
        d = json.loads(raw)
        out = ShardedSummary(
            iteration=int(d["iteration"]),
            samples=int(d["samples"]),
            global_batch=int(d["global_batch"]),
            config_id=str(d["config_id"]),
            folder=run_store.join(folder, _plain_name(d["folder"])),
            world=int(d["world"]),
            strategy=str(d["strategy"]),
            optimizer=bool(d.get("optimizer", True)),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"sharded checkpoint summary {summary} cannot be read ({type(exc).__name__}: "
            f"{exc}); move it away and restart the run from scratch (srifty train --restart)"
        ) from exc
    if not run_store.exists(run_store.join(out.folder, ".metadata")):
        return None  # its folder moved aside or deleted
    return out


def _plain_name(value: object) -> str:
    if not isinstance(value, str) or not value or "/" in value or value.startswith("."):
        raise ValueError(f"folder: a plain name, got {value!r}")
    return value


def latest(path: Path | str) -> tuple[Literal["file", "sharded"], int] | None:
    """Which kind of checkpoint the run folder of ``path`` resumes from, and its iteration:
    the one-file checkpoint (``ddp``) or the sharded one (``fsdp``/``hsdp``), whichever
    holds the later iteration (the later written when both hold the same); ``None`` when
    there is neither."""
    whole = _file_iteration(path)
    sharded = sharded_summary(path)
    if sharded is None:
        return None if whole is None else ("file", whole)
    if whole is None or sharded.iteration > whole:
        return ("sharded", sharded.iteration)
    if whole > sharded.iteration:
        return ("file", whole)
    newer = run_store.modified(sharded_paths(path)[0]) >= run_store.modified(path)
    return ("sharded", whole) if newer else ("file", whole)


def checkpoint_iteration(path: Path | str) -> int | None:
    """The iteration of the run folder's checkpoint (``latest``, either kind; ``None``
    when there is none), read from the small summaries without loading a checkpoint
    (``_file_iteration``)."""
    found = latest(path)
    return None if found is None else found[1]


def _file_iteration(path: Path | str) -> int | None:
    """The iteration of the one-file checkpoint at ``path`` (``None`` when there is none), read from
    its small summary ``checkpoint.json`` (``save_checkpoint`` writes it right after the
    checkpoint), without downloading and unpickling the checkpoint itself. A summary that
    is missing, damaged or older than the checkpoint (a writer stopped between the two)
    falls back to loading the checkpoint."""
    raw = run_store.read_text(sidecar_path(path))
    if raw is not None:
        try:
            iteration = json.loads(raw)["iteration"]
        except (ValueError, KeyError, TypeError):
            iteration = None
        if isinstance(iteration, int) and not isinstance(iteration, bool):
            fresh = _not_older(sidecar_path(path), path)
            if fresh is None:
                return None  # a summary without its checkpoint (moved aside)
            if fresh:
                return iteration
    ck = load_checkpoint(path)
    return ck.iteration if ck else None


def _not_older(summary: Path | str, checkpoint: Path | str) -> bool | None:
    """Whether ``summary`` was written no earlier than ``checkpoint``; ``None`` when there
    is no checkpoint."""
    try:
        ck = run_store.modified(checkpoint)
    except FileNotFoundError:
        return None
    try:
        return run_store.modified(summary) >= ck
    except FileNotFoundError:
        return False


def load_checkpoint(path: Path | str) -> Checkpoint | None:
    """The checkpoint at ``path``, or ``None`` when there is none yet; ``CheckpointError``
    when the file is there but not a readable checkpoint. An error reading the storage
    (a denied or throttled GET, an expired token, a network error) is raised as itself:
    it says nothing about the checkpoint, which must not be taken for damaged."""
    data = run_store.read_bytes(path)
    if data is None:
        return None
    try:
        d = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        ck = Checkpoint(
            iteration=int(d["iteration"]),
            samples=int(d["samples"]),
            global_batch=int(d["global_batch"]),
            config_id=str(d["config_id"]),
            model=d["model"],
            optimizer=d["optimizer"],
            scaler=d.get("scaler"),
            extra=d.get("extra"),
        )
    except Exception as exc:  # torch raises many kinds on a damaged file
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({type(exc).__name__}: {exc}); "
            "move it away and restart the run from scratch (srifty train --restart)"
        ) from exc
    _check_digest(path, ck, data)
    return ck


def _check_digest(path: Path | str, ck: Checkpoint, data: bytes) -> None:
    """A checkpoint whose bytes differ from the sha256 its summary recorded for that same
    iteration and configuration is damaged: ``torch.load`` does not check the zip's CRCs,
    so flipped bytes inside a tensor load silently and train on damaged weights. A summary
    of another checkpoint (written before this one was, or left by an older version
    without a digest) checks nothing."""
    try:
        raw = run_store.read_text(sidecar_path(path))
        summary = json.loads(raw) if raw is not None else None
    except (OSError, ValueError):
        return
    if not isinstance(summary, dict) or not isinstance(summary.get("sha256"), str):
        return
    if summary.get("iteration") != ck.iteration or summary.get("config_id") != ck.config_id:
        return
    if hashlib.sha256(data).hexdigest() != summary["sha256"]:
        raise CheckpointError(
            f"checkpoint {path} does not match the sha256 recorded when it was written "
            f"(iteration {ck.iteration}): it is damaged; restore it, or restart the run "
            "from scratch (srifty train --restart)"
        )


def check_resumable(checkpoint_path: Path | str, progress_path: Path | str, restart: bool) -> int:
    """The iteration a run folder resumes at: its checkpoint's, or 0 for a fresh folder.

    A progress log that records iterations while the checkpoint is missing (deleted, or
    never reached the shared storage) would silently start over at 0 and log the same
    iterations twice: that is an error, unless ``restart``, which moves the old log aside
    (``progress.jsonl.<unix time>.old``) and starts from scratch. A damaged checkpoint is
    an error too (``load_checkpoint``), and with ``restart`` it is moved aside as well;
    so is a damaged sharded summary. Either kind counts (``latest``).
    Records the log holds beyond the checkpoint (an attempt that died between two
    checkpoints logged them; the resumed run logs those iterations again) are cut off it
    and kept beside it (``progress.rewind``)."""
    try:
        ck = load_checkpoint(checkpoint_path)
    except CheckpointError:
        if not restart:
            raise
        _aside(checkpoint_path)
        _aside(sidecar_path(checkpoint_path))
        ck = None
    try:
        sharded = sharded_summary(checkpoint_path)
    except CheckpointError:
        if not restart:
            raise
        _aside(sharded_paths(checkpoint_path)[0])
        sharded = None
    at = max(ck.iteration if ck else 0, sharded.iteration if sharded else 0)
    if ck is not None or sharded is not None:
        rewind(progress_path, at)
        return at
    done = read_progress(progress_path)
    if done and not restart:
        raise CheckpointError(
            f"{progress_path} records {done[-1].iteration} iteration(s) but there is no "
            f"checkpoint at {checkpoint_path}: resuming would start over at 0 and log them "
            "again. Restore the checkpoint, or start from scratch on purpose with --restart"
        )
    if done:
        _aside(progress_path)
    return 0


def _aside(path: Path | str) -> None:
    import time

    run_store.move_aside(path, f"{int(time.time())}.old")
