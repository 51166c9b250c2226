"""Training checkpoints: model, optimizer, data position and iteration in one file.

Written atomically (a temporary file in the same folder, fsync, then ``os.replace``), so a
reader sees the previous checkpoint or the new one, never half of one. Any other fsspec URI
(``s3://bucket/run/checkpoint.pt`` with s3fs installed, ``memory://`` in tests) is written
to a temporary key, then moved over the target (on an object store the final write is one
PUT, which readers see whole or not at all). The data position
is the number of samples consumed (``iteration x global_batch``): data is addressed by
global sample index, so a checkpoint resumes on any world size and mix of local batches
as long as the global batch is unchanged.
"""

from __future__ import annotations

import io
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from srifty_core.errors import ConfigError

CHECKPOINT_FILE = "checkpoint.pt"


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


def _local(path: Path | str) -> Path | None:
    """The local path, or ``None`` for a remote fsspec URI."""
    s = str(path)
    if s.startswith("file://"):
        s = s[len("file://") :]
    elif "://" in s:
        return None
    return Path(s)


def _remote(uri: str) -> tuple[Any, str]:
    import fsspec

    try:
        fs, where = fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"checkpoint path {uri!r}: {exc}") from exc
    return fs, where


def save_checkpoint(
    path: Path | str,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    iteration: int,
    global_batch: int,
    config_id: str,
) -> Path:
    """Write a checkpoint atomically; returns its path."""
    payload = {
        "iteration": iteration,
        "samples": iteration * global_batch,
        "global_batch": global_batch,
        "config_id": config_id,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
    }
    target = _local(path)
    if target is None:
        fs, where = _remote(str(path))
        buf = io.BytesIO()
        torch.save(payload, buf)
        tmp_key = f"{where}.{uuid.uuid4().hex}.tmp"
        fs.pipe_file(tmp_key, buf.getvalue())
        fs.mv(tmp_key, where)
        return Path(where)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as fh:
            torch.save(payload, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()
    return target


class CheckpointError(ConfigError):
    """A checkpoint that cannot be read, or a run that cannot resume from its own."""


def load_checkpoint(path: Path | str) -> Checkpoint | None:
    """The checkpoint at ``path``, or ``None`` when there is none yet; ``CheckpointError``
    when the file is there but not a readable checkpoint."""
    target = _local(path)
    try:
        if target is None:
            fs, where = _remote(str(path))
            if not fs.exists(where):
                return None
            raw: Any = io.BytesIO(fs.cat_file(where))
        elif not target.exists():
            return None
        else:
            raw = target
        d = torch.load(raw, map_location="cpu", weights_only=True)
        return Checkpoint(
            iteration=int(d["iteration"]),
            samples=int(d["samples"]),
            global_batch=int(d["global_batch"]),
            config_id=str(d["config_id"]),
            model=d["model"],
            optimizer=d["optimizer"],
        )
    except Exception as exc:  # torch raises many kinds on a damaged file
        raise CheckpointError(
            f"checkpoint {path} cannot be read ({type(exc).__name__}: {exc}); "
            "move it away and restart the run from scratch (srifty train --restart)"
        ) from exc


def check_resumable(checkpoint_path: Path | str, progress_path: Path, restart: bool) -> int:
    """The iteration a run folder resumes at: its checkpoint's, or 0 for a fresh folder.

    A progress log that records iterations while the checkpoint is missing (deleted, or
    never reached the shared storage) would silently start over at 0 and log the same
    iterations twice: that is an error, unless ``restart``, which moves the old log aside
    (``progress.jsonl.<unix time>.old``) and starts from scratch. A damaged checkpoint is
    an error too (``load_checkpoint``), and with ``restart`` it is moved aside as well."""
    from srifty_core.runtime.progress import read_progress

    try:
        ck = load_checkpoint(checkpoint_path)
    except CheckpointError:
        if not restart:
            raise
        _aside(Path(checkpoint_path))
        ck = None
    if ck is not None:
        return ck.iteration
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


def _aside(path: Path) -> None:
    import time

    if path.exists():
        os.replace(path, path.with_name(f"{path.name}.{int(time.time())}.old"))
