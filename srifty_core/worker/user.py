"""The library side of your own training script under a Srifty plan.

``srifty train plan.json -- python train.py ARGS`` (or a plan's ``entrypoint``) runs your
script on every rank with its share of the plan in the environment (``worker.launch``);
these functions read it, so the monitor sees progress and a re-plan resumes your state::

    import torch
    from srifty_core.worker import user as srifty

    device = srifty.init()                      # joins the ranks (gloo on CPU, NCCL on GPUs)
    model = srifty.wrap(Net().to(device))       # DDP, or FSDP2's shards (the plan's strategy)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)   # after wrap: over the shards
    start = srifty.load_checkpoint(model, opt)  # 0, or where the job stopped
    for it in range(start, srifty.iterations()):
        idx = srifty.sample_indices(it, len(dataset))  # this rank's slice of the batch
        x, y = dataset[idx]
        opt.zero_grad()
        loss = loss_fn(model(x.to(device)), y.to(device)) * srifty.loss_scale()
        loss.backward()
        opt.step()
        srifty.report(it + 1, loss, model=model, optimizer=opt)
    srifty.finish()

- ``local_batch()`` is this rank's share of the global batch (they differ between
  ranks on mixed VM types); ``loss_scale()`` is ``world_size * b_rank / B_global``: a
  mean-reduced loss times it makes DDP's average over ranks the gradient of the whole
  global batch, every sample weighing the same.
- ``sample_indices(iteration, n)`` addresses data by global sample position: iteration
  ``i``'s global batch is positions ``i*B .. (i+1)*B`` of a sequence of seeded
  permutations of ``range(n)`` (one per epoch), and this rank takes its slice. The samples
  a step sees therefore do not depend on the world size, and a job resumed on other VMs
  continues the same sequence.
- ``report(iteration, loss, ...)`` ends a step: every rank calls it. It agrees with the
  other ranks whether the job is stopping (a rank got SIGTERM: a preemption or a
  re-plan), logs the step with the global batch's mean loss to the progress log the
  monitor reads (rank 0), checkpoints (rank 0) every ``checkpoint_every`` iterations, at
  the last one and when stopping, and on stopping ends the process with
  ``EXIT_STOPPED`` after the checkpoint, as the built-in worker does.
- The runtime checks what you report, and stops the job with ``ReportError`` (the
  message is also the job's error) when it cannot be right: ``iteration`` must be the
  last reported one plus one (the first: where the run folder's checkpoint stands, plus
  one; ``load_checkpoint``'s return value is that point), the global batch's loss must be
  finite (the step is not checkpointed, so the checkpoint keeps the last finite weights),
  and ``finish()`` must come after the plan's last iteration (``iterations()``) with a
  checkpoint holding it (``report(..., model=...)`` or ``save_checkpoint``). A script
  that exits 0 without that fails the job too.
- ``micro_batches()`` is the plan's gradient accumulation (1: none). With k > 1, run
  this rank's batch as ``micro_split(local_batch(), k)`` slices, each loss times
  ``loss_scale() * m_j / local_batch()`` and its backward inside
  ``gradient_sync(model, j == k - 1)`` (the exchange once, with the last; a sharded plan
  with ``sync_each_micro_batch`` exchanges every one, which ``wrap`` arranges), then one
  ``opt.step()``: the step of the whole local batch, as the built-in worker takes it.
- ``autocast()`` runs what it holds in the plan's precision as the built-in worker does
  (bf16 on GPUs; nothing on the CPU); ``precision()`` says which. Under ``bf16-true`` there
  is no autocast: ``wrap`` casts the model to bf16, and your floating inputs go in as
  bf16 too (``x.to(torch.bfloat16)`` where ``precision() == "bf16-true"``).
- ``save_checkpoint`` / ``load_checkpoint`` use the run folder's checkpoint (the one a
  re-plan resumes from); ``extra`` keeps your own state beside the model and optimizer.
- ``wrap(module)`` readies your model for the plan's ``strategy``: DDP for ``ddp``;
  for ``fsdp``/``hsdp`` FSDP2's ``fully_shard`` per unit and on the root, in place
  (``sharding.wrap``: bf16 parameters with float32 reduction on GPUs under a bf16 plan).
  Make the optimizer after it. Under a sharded plan ``save_checkpoint`` (and ``report``'s)
  is a collective: every rank writes its shards (``worker.sharded_checkpoint``: DCP,
  loadable on another world size), and anything that runs the sharded model's forward
  (an evaluation) must run on every rank. ``load_checkpoint`` loads either kind into
  either model (a ``ddp`` checkpoint into shards, a sharded one into DDP), so a re-plan
  may change the strategy.
"""

from __future__ import annotations

import functools
import math
import os
import signal
import sys
import time
from contextlib import AbstractContextManager
from datetime import timedelta
from types import FrameType
from typing import Any, cast

import torch
import torch.distributed as dist

from srifty_core import host_allocator
from srifty_core.batches import micro_split
from srifty_core.errors import ConfigError
from srifty_core.planner.schema.train_plan import TrainPlan
from srifty_core.runs import store as run_store
from srifty_core.runs.progress import (
    STATE_FILE,
    ProgressLog,
    ProgressRecord,
    TrainState,
    refuse_report,
    write_state,
)
from srifty_core.sharding.wrap import gradient_sync as gradient_sync
from srifty_core.sharding.wrap import wrap as shard
from srifty_core.worker.checkpoint import checkpoint_iteration, latest
from srifty_core.worker.checkpoint import load_checkpoint as _load
from srifty_core.worker.checkpoint import save_checkpoint as _save
from srifty_core.worker.launch import PLAN_ENV
from srifty_core.worker.sharded_checkpoint import load_latest, save_sharded
from srifty_core.workloads.prepare import set_tf32

__all__ = [
    "EXIT_STOPPED",
    "ReportError",
    "autocast",
    "checkpoint_extra",
    "finish",
    "global_batch",
    "gradient_sync",
    "init",
    "iterations",
    "load_checkpoint",
    "local_batch",
    "loss_scale",
    "micro_batches",
    "micro_split",
    "plan",
    "precision",
    "rank",
    "report",
    "sample_indices",
    "save_checkpoint",
    "should_stop",
    "world_size",
    "wrap",
]

EXIT_STOPPED = 3
"""Exit code of a rank that stopped on SIGTERM after the checkpoint (as the worker's)."""


class ReportError(ConfigError):
    """What the script reported cannot be right (module doc); the job stops with it."""


class _State:
    stop = False
    start = 0
    """The iteration the run folder's checkpoint held when this rank started."""
    reported: int | None = None
    device: torch.device | None = None
    precision = "fp32"
    """What this rank computes in (``worker.worker.agreed_precision`` of the plan's)."""
    log: ProgressLog | None = None
    last_step: float | None = None
    saved = 0
    extra: dict[str, Any] | None = None


_state = _State()


def _env(name: str) -> str:
    value = os.environ.get(name)
    if value is None:
        raise ConfigError(
            f"{name} is not set: run this script under a plan (srifty train PLAN.json -- "
            "python SCRIPT), which sets it on every rank"
        )
    return value


@functools.cache
def plan() -> TrainPlan:
    """The plan this rank runs (``SRIFTY_PLAN``)."""
    return TrainPlan.load(_env(PLAN_ENV))


def rank() -> int:
    """This rank in the plan's order (its local batch is ``local_batches[rank]``)."""
    return int(_env("SRIFTY_PLAN_RANK"))


def world_size() -> int:
    return int(_env("SRIFTY_WORLD_SIZE"))


def local_batch() -> int:
    """Samples this rank takes from each global batch."""
    return int(_env("SRIFTY_LOCAL_BATCH"))


def global_batch() -> int:
    return int(_env("SRIFTY_GLOBAL_BATCH"))


def loss_scale() -> float:
    """``world_size * b_rank / B_global``: multiply your mean-reduced loss by it."""
    return float(_env("SRIFTY_LOSS_SCALE"))


def micro_batches() -> int:
    """Micro-batches per step of this rank's local batch (the plan's; module doc)."""
    return plan().micro_batches


def iterations() -> int:
    """The iteration the job ends at (counted from the job's start, not this run's)."""
    return int(_env("SRIFTY_ITERATIONS"))


def init(timeout_s: float | None = None) -> torch.device:
    """Join this plan's ranks and return the device this rank trains on: a GPU per rank
    with NCCL where the host has one per rank, else the CPU with gloo (the built-in
    worker's ``place``). Installs the SIGTERM handler ``report`` answers."""
    from srifty_core.worker.worker import agreed_precision, place

    p = plan()
    host_allocator.steady()
    torch.set_num_threads(p.threads)
    where = place(p, rank(), world_size())
    if where.is_cuda:
        torch.cuda.set_device(where.local_rank)
    if not dist.is_initialized():
        dist.init_process_group(
            where.backend,
            init_method=f"tcp://{_env('MASTER_ADDR')}:{_env('MASTER_PORT')}",
            rank=rank(),
            world_size=world_size(),
            timeout=timedelta(seconds=timeout_s or p.timeout_s),
        )

    def on_term(signum: int, frame: FrameType | None) -> None:
        _state.stop = True

    signal.signal(signal.SIGTERM, on_term)
    _state.device = where.torch_device
    set_tf32(p.tf32, where.torch_device.type)  # the plan's matmul precision, as the worker's
    _state.precision = agreed_precision(p.precision, where.torch_device)
    _state.log = ProgressLog(p.progress_path) if rank() == 0 else None
    _state.start = checkpoint_iteration(p.checkpoint_path) or 0
    _state.reported = None
    _state.last_step = time.perf_counter()
    return where.torch_device


def autocast() -> AbstractContextManager[Any]:
    """The plan's precision for your forward pass and loss, as the built-in worker runs it:
    ``torch.autocast`` in bf16 on GPUs (fp16 where one of the ranks' GPUs lacks bf16, or
    when the plan says fp16: then scale the loss with a ``torch.amp.GradScaler``), nothing
    on the CPU or for an fp32 plan. Parameters and the optimizer stay float32::

        with srifty.autocast():
            loss = loss_fn(model(x), y) * srifty.loss_scale()
        loss.backward()
    """
    from srifty_core.worker.worker import precision_context

    if _state.device is None:
        raise ConfigError("autocast: call srifty_core.worker.user.init() first")
    return precision_context(_state.precision, _state.device)


def precision() -> str:
    """What this rank computes in after ``init()``: ``fp32``, ``bf16``, ``bf16-true`` or
    ``fp16``."""
    return _state.precision


def sample_indices(iteration: int, n_samples: int) -> torch.Tensor:
    """This rank's sample indices (into a data set of ``n_samples``) for ``iteration``:
    its slice of positions ``iteration*B .. (iteration+1)*B`` of a sequence of seeded
    permutations of ``range(n_samples)``, one per epoch (module doc)."""
    if n_samples < 1:
        raise ConfigError(f"n_samples must be >= 1, got {n_samples}")
    start = iteration * global_batch() + int(_env("SRIFTY_BATCH_OFFSET"))
    positions = torch.arange(start, start + local_batch())
    epochs = positions // n_samples
    out = torch.empty_like(positions)
    for epoch in epochs.unique().tolist():
        gen = torch.Generator().manual_seed(int(_env("SRIFTY_SEED")) * 1_000_003 + epoch)
        perm = torch.randperm(n_samples, generator=gen)
        mask = epochs == epoch
        out[mask] = perm[positions[mask] % n_samples]
    return out


def wrap(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` (on ``init()``'s device) ready for the plan's strategy (module doc):
    ``DistributedDataParallel`` for ``ddp``, else ``module`` itself sharded by FSDP2; cast
    to bf16 first where the rank computes in ``bf16-true``."""
    if _state.device is None:
        raise ConfigError("wrap: call srifty_core.worker.user.init() first")
    if _state.precision == "bf16-true":
        module.to(torch.bfloat16)
    p = plan()
    if not p.sharded:
        ids = [_state.device.index] if _state.device.type == "cuda" else None
        return torch.nn.parallel.DistributedDataParallel(module, device_ids=ids)
    return shard(module, p.layout, p.settings, _state.device, p.sync_each_micro_batch)


def load_checkpoint(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """Load the run folder's checkpoint into ``model`` (and ``optimizer``) if there is
    one; returns the iteration to start from (0 for a fresh job). Your own state saved
    with it is ``checkpoint_extra()``. Under a sharded plan, or from a sharded checkpoint,
    every rank calls it (``sharded_checkpoint.load_latest``: ``model`` as ``wrap``
    returned it, DDP or sharded)."""
    p = plan()
    found = latest(p.checkpoint_path)
    if found is not None and (p.sharded or found[0] == "sharded"):
        resumed = load_latest(p.checkpoint_path, model, optimizer, p.global_batch)
        if resumed is None:
            return 0
        _state.saved = _state.start = resumed.iteration
        _state.extra = resumed.extra
        return resumed.iteration
    ck = _load(p.checkpoint_path)
    if ck is None:
        return 0
    ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    if ddp and not all(k.startswith("module.") for k in ck.model):
        model = cast(torch.nn.Module, model.module)  # its own keys, as save_checkpoint
    if ck.global_batch != p.global_batch:
        raise ConfigError(
            f"checkpoint has global batch {ck.global_batch}, the plan {p.global_batch}: "
            "resuming needs the same global batch"
        )
    model.load_state_dict(ck.model)
    if optimizer is not None and ck.optimizer:
        optimizer.load_state_dict(ck.optimizer)
    _state.saved = _state.start = ck.iteration
    _state.extra = ck.extra
    return ck.iteration


def checkpoint_extra() -> dict[str, Any] | None:
    """The ``extra`` state of the checkpoint ``load_checkpoint`` loaded, if any."""
    return _state.extra


def save_checkpoint(
    iteration: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Rank 0 writes the run folder's checkpoint (whole or not at all); other ranks do
    nothing. Under a sharded plan every rank writes its shards (a collective: every rank
    calls it). ``report`` calls it when one is due."""
    p = plan()
    if p.sharded:
        save_sharded(
            p.checkpoint_path, model=model, optimizer=optimizer, iteration=iteration,
            global_batch=p.global_batch, config_id=p.config_id, strategy=p.strategy,
            extra=extra,
        )  # fmt: skip
        _state.saved = iteration
        return
    if rank() != 0:
        return
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module  # the module's own keys, as the built-in worker saves
    _save(
        p.checkpoint_path,
        model=model,
        optimizer=optimizer or _NoOptimizer(),  # type: ignore[arg-type]
        iteration=iteration,
        global_batch=p.global_batch,
        config_id=p.config_id,
        extra=extra,
    )
    _state.saved = iteration


class _NoOptimizer:
    def state_dict(self) -> dict[str, Any]:
        return {}


def should_stop() -> bool:
    """Whether this rank got SIGTERM (``report`` agrees on it with every rank)."""
    return _state.stop


def report(
    iteration: int,
    loss: torch.Tensor | float,
    *,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    extra: dict[str, Any] | None = None,
) -> None:
    """End of a step, on every rank (module doc): ``iteration`` is the number of
    iterations done, ``loss`` this rank's loss as it went into ``backward`` (scaled by
    ``loss_scale()``). With ``model`` it checkpoints when due and before stopping."""
    if _state.device is None:
        raise ConfigError("report: call srifty_core.worker.user.init() first")
    p = plan()
    if p.step_sleep_s:  # a demo's or a test's slowed job (TrainPlan.step_sleep_s)
        time.sleep(p.step_sleep_s)
    value = float(loss.detach().item() if isinstance(loss, torch.Tensor) else loss)
    expected = (_state.start if _state.reported is None else _state.reported) + 1
    wrong = isinstance(iteration, bool) or not isinstance(iteration, int) or iteration != expected
    flags = [1.0 if _state.stop else 0.0, value, 1.0 if wrong else 0.0]
    row = torch.tensor(flags, dtype=torch.float64)
    if _state.device.type == "cuda":
        row = row.to(_state.device)
    dist.all_reduce(row)  # stop flags, scaled losses, wrong iterations: summed over ranks
    stopping = bool(row[0].item() > 0)
    if row[2].item() > 0:
        after = (
            f"iteration {_state.reported}" if _state.reported is not None
            else f"the checkpoint's iteration {_state.start}" if _state.start
            else "the start (no checkpoint)"
        )  # fmt: skip
        _refuse(
            f"report: iteration {iteration!r}, expected {expected} (after {after}): report "
            "the number of iterations done, each step once, counted from the job's start "
            "(resume at load_checkpoint()'s return value)"
        )
    # the scaled losses sum to world * the global batch's mean loss (loss_scale's weights)
    mean_loss = row[1].item() / world_size()
    if not math.isfinite(mean_loss):
        kept = f"iteration {_state.saved}" if _state.saved else "none"
        _refuse(
            f"report: the loss at iteration {iteration} is {mean_loss} (not finite): training "
            f"stopped; the checkpoint keeps the last finite weights ({kept})"
        )
    _state.reported = iteration
    now = time.perf_counter()
    step_s = now - (_state.last_step or now)
    due = stopping or iteration >= p.iterations or iteration % p.checkpoint_every == 0
    if model is not None and due and iteration > _state.saved:
        save_checkpoint(iteration, model, optimizer, extra)
    if _state.log is not None:
        _state.log.append(
            ProgressRecord(
                iteration, time.time(), step_s, p.global_batch, p.config_id, loss=mean_loss
            )
        )
        loss_value = mean_loss if math.isfinite(mean_loss) else None
        state = TrainState(iteration, time.time(), p.config_id, _state.saved, loss_value)
        write_state(run_store.join(p.run_dir, STATE_FILE), state)
    _state.last_step = time.perf_counter()
    if stopping:
        finish(wait=False)  # a peer may be gone (preempted): no barrier
        sys.exit(EXIT_STOPPED)


def _refuse(reason: str) -> None:
    """Stop this rank for what the script reported: rank 0 records why for the monitor
    (``progress.refuse_report``); every rank that agreed on it raises ``ReportError``."""
    p = plan()
    if rank() == 0:
        refuse_report(p.run_dir, p.config_id, reason)
    if _state.log is not None:
        _state.log.close()
        _state.log = None
    raise ReportError(reason)


def finish(wait: bool = True) -> None:
    """Close the progress log and leave the process group after the last ``report``
    (with ``wait``, once every rank is there). With ``wait`` the plan's last iteration
    must have been reported and checkpointed (module doc), else ``ReportError``."""
    if wait and _state.device is not None:
        p = plan()
        done = _state.start if _state.reported is None else _state.reported
        missing = rank() == 0 and _state.saved < p.iterations  # rank 0 saves
        row = torch.tensor([1.0 if missing else 0.0], dtype=torch.float64)
        if _state.device.type == "cuda":
            row = row.to(_state.device)
        if dist.is_initialized():
            dist.all_reduce(row)
        if done < p.iterations:
            _refuse(
                f"finish: the script reported iteration {done} of {p.iterations}: "
                "report(iteration, loss) after every step, up to iterations()"
            )
        if row[0].item() > 0:
            _refuse(
                f"finish: no checkpoint holds the last iteration {p.iterations} (the last "
                f"saved: {_state.saved or 'none'}): pass model= (and optimizer=) to "
                "report, or call save_checkpoint before finish(); the trained weights "
                "would be lost"
            )
    if _state.log is not None:
        _state.log.close()
        _state.log = None
    if dist.is_initialized():
        if wait:
            dist.barrier()
        dist.destroy_process_group()
