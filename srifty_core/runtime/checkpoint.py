"""Training checkpoints: model, optimizer, data position and iteration in one file.

Written atomically (a temporary file in the same folder, fsync, then ``os.replace``), so a
reader sees the previous checkpoint or the new one, never half of one. The data position
is the number of samples consumed (``iteration x global_batch``): data is addressed by
global sample index, so a checkpoint resumes on any world size and mix of local batches
as long as the global batch is unchanged.
"""

from __future__ import annotations

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


def _local(path: Path | str) -> Path:
    s = str(path)
    if s.startswith("file://"):
        s = s[len("file://") :]
    elif "://" in s:
        raise ConfigError(f"checkpoint path: only local paths are supported, got {s!r}")
    return Path(s)


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
    target = _local(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    payload = {
        "iteration": iteration,
        "samples": iteration * global_batch,
        "global_batch": global_batch,
        "config_id": config_id,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
    }
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
    if not target.exists():
        return None
    d = torch.load(target, map_location="cpu", weights_only=True)
    return Checkpoint(
        iteration=int(d["iteration"]),
        samples=int(d["samples"]),
        global_batch=int(d["global_batch"]),
        config_id=str(d["config_id"]),
        model=d["model"],
        optimizer=d["optimizer"],
    )
