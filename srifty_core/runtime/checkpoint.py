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


def load_checkpoint(path: Path | str) -> Checkpoint | None:
    """The checkpoint at ``path``, or ``None`` when there is none yet."""
    target = _local(path)
    if target is None:
        fs, where = _remote(str(path))
        if not fs.exists(where):
            return None
        d = torch.load(io.BytesIO(fs.cat_file(where)), map_location="cpu", weights_only=True)
    elif not target.exists():
        return None
    else:
        d = torch.load(target, map_location="cpu", weights_only=True)
    return Checkpoint(
        iteration=int(d["iteration"]),
        samples=int(d["samples"]),
        global_batch=int(d["global_batch"]),
        config_id=str(d["config_id"]),
        model=d["model"],
        optimizer=d["optimizer"],
    )
