"""Sharded checkpoints (``fsdp``/``hsdp``): every rank writes its own shards with
``torch.distributed.checkpoint`` (DCP), and any world size loads them (DCP reshards).

Contract: ``save_sharded`` and ``load_latest`` are collectives (every rank of the started
group calls them). A save writes DCP's files into a new folder
``checkpoint.sharded/<iteration>-<nonce>/`` (with ``extra.pt``: a script's own state and
fp16's scaler, from rank 0), then rank 0 publishes the small summary
``checkpoint.sharded.json`` naming that folder (iteration, data position, global batch,
configuration, world size, strategy: ``checkpoint.ShardedSummary``) through
``run_store.publish``, and only then removes the older folders and a superseded one-file
checkpoint. A kill before the summary is published leaves the previous summary naming the
previous, untouched folder: a reader sees the old checkpoint or the new one, never half
of one (replacing a non-empty folder by ``rename`` is not atomic on POSIX, and object
stores have no rename; the summary is the one object replaced whole).

State dicts come from ``torch.distributed.checkpoint.state_dict.get_state_dict`` and go
back with ``set_state_dict``: their keys are the module's own (no ``module.`` of DDP, none
of FSDP2), so the two kinds cross over. ``load_latest`` loads whichever kind the run folder
resumes from (``checkpoint.latest``) into a DDP or FSDP2 module: a sharded one through DCP
(into full tensors under DDP, into this world's shards under FSDP2), a one-file ``ddp``
checkpoint as a full state dict every rank reads and keeps its own shards of. Derivation and
checks: docs/design/sharding.md, "Training".
"""

from __future__ import annotations

import io
import json
import logging
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from srifty_core.errors import ConfigError
from srifty_core.runs import store as run_store
from srifty_core.worker.checkpoint import (
    CheckpointError,
    latest,
    load_checkpoint,
    sharded_paths,
    sharded_summary,
    sidecar_path,
)

__all__ = ["Resumed", "load_latest", "save_sharded"]
EXTRA_FILE = "extra.pt"
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Resumed:
    """What ``load_latest`` loaded besides the model and optimizer."""

    iteration: int
    kind: str
    """``file`` (a one-file ``ddp`` checkpoint) or ``sharded``."""
    scaler: dict[str, Any] | None = None
    extra: dict[str, Any] | None = None


def _full() -> Any:
    """``StateDictOptions`` of a full (unsharded) state dict every rank holds whole."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True)


def save_sharded(
    path: Path | str,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    iteration: int,
    global_batch: int,
    config_id: str,
    strategy: str,
    scaler: torch.amp.GradScaler | None = None,
    extra: dict[str, Any] | None = None,
) -> Path | str:
    """Write the sharded checkpoint of ``model`` (and ``optimizer``) beside the one-file
    checkpoint ``path`` and publish it (module doc); every rank calls it. Returns its
    folder."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict
    from torch.distributed.checkpoint.state_dict_saver import save

    summary, root = sharded_paths(path)
    name = [f"{iteration:09d}-{uuid.uuid4().hex[:12]}" if dist.get_rank() == 0 else ""]
    dist.broadcast_object_list(name, src=0)  # one folder for every rank
    folder = run_store.join(root, name[0])
    if optimizer is None:
        state: dict[str, Any] = {"model": get_model_state_dict(model)}
    else:
        msd, osd = get_state_dict(model, optimizer)
        state = {"model": msd, "optim": osd}
    if run_store.local_path(folder) is not None:
        Path(folder).mkdir(parents=True, exist_ok=True)
    save(state, checkpoint_id=str(folder))
    if dist.get_rank() == 0:
        if scaler is not None or extra is not None:
            buf = io.BytesIO()
            torch.save({"scaler": scaler.state_dict() if scaler else None, "extra": extra}, buf)
            run_store.publish(run_store.join(folder, EXTRA_FILE), buf.getvalue())
        record = {
            "iteration": iteration,
            "samples": iteration * global_batch,
            "global_batch": global_batch,
            "config_id": config_id,
            "folder": name[0],
            "world": dist.get_world_size(),
            "strategy": strategy,
            "optimizer": optimizer is not None,
        }
        run_store.publish(summary, (json.dumps(record) + "\n").encode())
        _drop_superseded(path, root, keep=name[0])
    dist.barrier()  # every rank returns once the checkpoint is published
    return folder


def _drop_superseded(path: Path | str, root: Path | str, keep: str) -> None:
    """Best effort, after publishing: the older sharded folders, and a one-file checkpoint
    of an earlier iteration (a run re-planned from ``ddp``)."""
    try:
        for old in run_store.names(root, "*"):
            if old != keep:
                _remove_tree(run_store.join(root, old))
        found = latest(path)
        if found is not None and found[0] == "sharded" and run_store.exists(path):
            for stale in (path, sidecar_path(path)):
                _remove_tree(stale)
    except (OSError, CheckpointError) as exc:
        _log.warning("superseded checkpoints beside %s not removed: %s", path, exc)


def _remove_tree(location: Path | str) -> None:
    local = run_store.local_path(location)
    if local is not None:
        if local.is_dir():
            shutil.rmtree(local, ignore_errors=True)
        else:
            local.unlink(missing_ok=True)
        return
    fs, where = run_store.filesystem(str(location))
    if fs.exists(where):
        fs.rm(where, recursive=True)


def load_latest(
    path: Path | str,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    global_batch: int,
) -> Resumed | None:
    """Load the run folder's checkpoint (``checkpoint.latest``: either kind) into ``model``
    (a DDP or FSDP2 module, or a plain one) and ``optimizer``; every rank calls it.
    ``None`` when there is none; ``ConfigError`` when its global batch is not
    ``global_batch`` (the data position would not carry over)."""
    found = latest(path)
    if found is None:
        return None
    if found[0] == "file":
        return _load_file(path, model, optimizer, global_batch)
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )
    from torch.distributed.checkpoint.state_dict_loader import load

    info = sharded_summary(path)
    if info is None:  # removed between the two reads
        raise CheckpointError(f"the sharded checkpoint beside {path} disappeared while loading")
    _same_batch(info.global_batch, global_batch)
    if optimizer is None or not info.optimizer:  # a script may save its model alone
        state: dict[str, Any] = {"model": get_model_state_dict(model)}
        load(state, checkpoint_id=str(info.folder))
        set_model_state_dict(model, state["model"])
    else:
        msd, osd = get_state_dict(model, optimizer)
        state = {"model": msd, "optim": osd}
        load(state, checkpoint_id=str(info.folder))
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
    raw = run_store.read_bytes(run_store.join(info.folder, EXTRA_FILE))
    kept = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True) if raw else {}
    return Resumed(info.iteration, "sharded", kept.get("scaler"), kept.get("extra"))


def _same_batch(saved: int, plan: int) -> None:
    if saved != plan:
        raise ConfigError(
            f"checkpoint has global batch {saved}, the plan {plan}: resuming needs the same "
            "global batch"
        )


def _load_file(
    path: Path | str, model: nn.Module, optimizer: torch.optim.Optimizer | None, global_batch: int
) -> Resumed:
    """A one-file checkpoint (full tensors, the optimizer's state by parameter index) into
    any module: every rank reads the whole file and keeps what it holds."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    ck = load_checkpoint(path)
    if ck is None:
        raise CheckpointError(f"the checkpoint {path} disappeared while loading")
    _same_batch(ck.global_batch, global_batch)
    if optimizer is None or not ck.optimizer:
        set_model_state_dict(model, ck.model, options=_full())
    else:
        osd = _by_name(ck.optimizer, model)
        set_state_dict(
            model, optimizer, model_state_dict=ck.model, optim_state_dict=osd,
            options=_full(),
        )  # fmt: skip
    return Resumed(ck.iteration, "file", ck.scaler, ck.extra)


def _by_name(osd: dict[str, Any], model: nn.Module) -> dict[str, Any]:
    """An optimizer state dict keyed by parameter index (``Optimizer.state_dict``, built
    over ``module.parameters()`` in order) keyed by parameter name instead, as
    ``set_state_dict`` takes it."""
    inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    names = [n for n, _ in inner.named_parameters()]
    groups = [dict(g) for g in osd["param_groups"]]
    index = [i for g in groups for i in g["params"]]
    if len(index) != len(names):
        raise CheckpointError(
            f"the checkpoint's optimizer holds {len(index)} parameters, the model "
            f"{len(names)}: it was not written for this model"
        )
    for g in groups:
        g["params"] = [names[i] for i in g["params"]]
    state = {names[i]: v for i, v in osd["state"].items()}
    return {"state": state, "param_groups": groups}
