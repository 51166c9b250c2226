"""The heterogeneous data-parallel training worker: DDP or FSDP2 (torchrun-compatible).

``python -m srifty_core.worker.worker PLAN.json`` reads ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` (and ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` as torchrun
sets them) from the environment, joins a process group and trains the plan's zoo model
with rank ``r`` on a local batch of ``local_batches[r]`` samples. Across VMs (torchrun's
c10d rendezvous, ``rendezvous.start_script``) ``r`` is the plan's rank ``plan_rank``:
``SRIFTY_RANK_OFFSET + LOCAL_RANK``, not the rendezvous's ``RANK``.

Device (``choose_device``, a pure function of the environment and what CUDA reports): on
a VM with GPUs each rank takes one GPU (``cuda:LOCAL_RANK``) and the group uses NCCL; on
a VM without (or with fewer GPUs than ranks on it, when the plan's ``device`` is
``auto``) every rank runs on the CPU and the group uses gloo. Under torchrun
``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` place the rank on its VM; a plain launcher (the
local provider, ``run_spawned``) puts every rank on one host, so the local rank is the
global one. On GPUs the plan's ``precision`` applies: ``fp16`` runs the forward pass
under ``torch.autocast`` with a ``GradScaler``, ``bf16`` under ``torch.autocast`` in
bfloat16 where every rank's GPU supports it (else fp16 with the scaler, agreed by all
ranks), ``bf16-true`` with the model and its floating inputs cast to bfloat16 (the same
fallback), ``fp32`` (the default) none. The CPU path always computes in the plan's
``dtype``. Data, loss reweighting and iteration count are the same on both.

Unequal local batches: DDP averages gradients over ranks, so with a mean-reduced loss a
sample on a small-batch rank would weigh more than one on a large-batch rank. Each rank
scales its loss by ``world_size * b_rank / B_global``; after DDP's average every sample
counts ``1 / B_global``, exactly the gradient of one process on the whole global batch.
(On the CPU the timed hook sums instead of averaging, and the loss carries the 1/world
too: ``b_rank / B_global`` in all, the same gradients.)

Sharded plans (``strategy`` ``fsdp``/``hsdp``): the model is sharded by FSDP2
(``sharding.wrap``) before the optimizer is made over its shards; its reduce-scatter
averages over the ranks as DDP does, so the same loss scale applies; every rank writes
its shards into a DCP checkpoint (``worker.sharded_checkpoint``) that any world size,
and a ``ddp`` plan, resumes from (and a sharded plan resumes a one-file checkpoint).

Gradient accumulation (``micro_batches`` k > 1): each rank runs its local batch as k
micro-batches (``micro_split``), each loss also scaled by its share ``m_j / b_rank``, the
exchange held back but on the last (``sharding.wrap.gradient_sync``; a sharded plan with
``sync_each_micro_batch`` reduce-scatters every one), then one optimizer step: the
parameters of k = 1, in the activations of one micro-batch.

Data are addressed by global sample index: iteration ``i``'s global batch is a seeded
synthetic batch of ``B_global`` samples and rank ``r`` takes the slice starting at
``sum(local_batches[:r])``. A checkpoint therefore resumes on any world size and mix of
local batches (same global batch), and gives the same parameters as a straight run.

Rank 0 appends a progress record per step (with, on the CPU, every rank's forward +
backward seconds and the exchange's busy time, gathered with the stop flag in one small
all-gather per step: ``ExchangeTimer``, for the monitor's online recalibration), writes a
checkpoint every ``checkpoint_every`` steps, at the end, and when any rank got SIGTERM
(the ranks agree on stopping through that all-gather, then exit with ``EXIT_STOPPED``);
then it replaces the small state file (iteration, time, its loss, the checkpoint's
iteration) the monitor reads.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from srifty_core import host_allocator
from srifty_core.batches import loss_scale, micro_split, split_batch
from srifty_core.errors import ConfigError
from srifty_core.lifetime import die_with_caller, free_port
from srifty_core.planner.schema.train_plan import DEVICES, TrainPlan
from srifty_core.runs import store as run_store
from srifty_core.runs.progress import (
    STATE_FILE,
    ProgressLog,
    ProgressRecord,
    TrainState,
    refuse_report,
    write_state,
)
from srifty_core.sharding.wrap import gradient_sync, wrap
from srifty_core.training_settings import BF16, PRECISIONS
from srifty_core.worker.checkpoint import latest, load_checkpoint, save_checkpoint
from srifty_core.worker.exchange_timer import ExchangeTimer, step_timings
from srifty_core.worker.placement import Placement, choose_device, plan_rank
from srifty_core.worker.sharded_checkpoint import load_latest, save_sharded
from srifty_core.workloads import build, choose_precision, make_optimizer, prepare

__all__ = [
    "DEVICES",
    "EXIT_STOPPED",
    "PRECISIONS",
    "ExchangeTimer",
    "Placement",
    "TrainPlan",
    "agreed_precision",
    "choose_device",
    "choose_precision",
    "local_batch",
    "loss_scale",
    "main",
    "place",
    "plan_rank",
    "precision_context",
    "run_rank",
    "run_spawned",
    "split_batch",
    "step_timings",
    "train",
    "train_single",
    "train_step",
]

EXIT_STOPPED = 3
"""Exit code of a worker that stopped on SIGTERM after a checkpoint."""
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


_AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16}


def precision_context(precision: str, device: torch.device) -> AbstractContextManager[Any]:
    """``torch.autocast`` of ``precision`` on ``device``; nothing for ``fp32`` and for
    ``bf16-true`` (the model itself is bf16: ``workloads.prepare.cast_to_bf16``)."""
    if precision not in _AUTOCAST:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=_AUTOCAST[precision])


def agreed_precision(precision: str, device: torch.device) -> str:
    """The precision every rank of the started process group computes in for a plan's
    ``precision`` (``choose_precision``): for bf16 on GPUs the ranks agree with an allreduce
    whether every GPU supports it, so that all fall back to fp16 alike (a collective: every
    rank of a GPU group calls it); ranks on CPUs compute in fp32 without asking (a group's
    ranks share one backend: all on GPUs or all on CPUs)."""
    bf16_everywhere = True
    if precision in BF16 and device.type == "cuda":
        ok = torch.tensor([1.0 if torch.cuda.is_bf16_supported() else 0.0], device=device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        bf16_everywhere = bool(ok.item() > 0)
    return choose_precision(precision, device.type, bf16_everywhere)


def train_step(
    workload: Any,
    batch: tuple[Tensor, ...],
    opt: torch.optim.Optimizer,
    scale: float,
    precision: str = "fp32",
    scaler: torch.amp.GradScaler | None = None,
    micro_batches: int = 1,
) -> Tensor:
    """One optimizer step on ``batch`` with the loss scaled by ``scale`` (returned, detached,
    without a device sync): in the
    parameters' dtype for ``fp32``, else under ``torch.autocast`` of ``precision`` (on the
    batch's device); with ``scaler`` (fp16) the backward pass runs on the scaled loss and
    the scaler skips a step whose gradients overflowed (under DDP every rank sees the same
    averaged gradients, so every rank skips alike). With ``micro_batches`` > 1 the batch
    runs as that many slices (``micro_split``), each loss also scaled by its share of the
    batch, the gradients accumulated and exchanged with the last (``gradient_sync``; a
    module sharded with ``sync_each_micro_batch`` exchanges each): the same step, and the
    same returned loss, as on the whole batch."""
    opt.zero_grad(set_to_none=True)
    sizes = micro_split(len(batch[0]), micro_batches)
    total: Tensor | None = None
    lo = 0
    for j, m in enumerate(sizes):
        part = batch if len(sizes) == 1 else tuple(t[lo : lo + m] for t in batch)
        lo += m
        with gradient_sync(workload.module, j == len(sizes) - 1):
            with precision_context(precision, batch[0].device):
                loss = workload.loss(part) * (scale * m / len(batch[0]))
            (loss if scaler is None else scaler.scale(loss)).backward()
        total = loss.detach() if total is None else total + loss.detach()
    if scaler is None:
        opt.step()
    else:
        scaler.step(opt)
        scaler.update()
    assert total is not None
    return total


def local_batch(
    workload: Any,
    plan: TrainPlan,
    iteration: int,
    rank: int,
    device: torch.device | None = None,
) -> tuple[Tensor, ...]:
    """Rank ``rank``'s slice of iteration ``iteration``'s global batch (made on the CPU,
    so every device sees the same samples, then moved to ``device``)."""
    full = workload.make_batch(
        plan.global_batch, torch.device("cpu"), seed=plan.seed * 1_000_003 + iteration
    )
    lo = sum(plan.local_batches[:rank])
    hi = lo + plan.local_batches[rank]
    dtype = _DTYPES[plan.dtype]
    out = tuple((t[lo:hi].to(dtype) if t.is_floating_point() else t[lo:hi]) for t in full)
    if device is None or device.type == "cpu":
        return out
    return tuple(t.to(device, non_blocking=True) for t in out)


def _build(
    plan: TrainPlan,
    device: torch.device | None = None,
    shard: bool = False,
    precision: str | None = None,
) -> tuple[Any, torch.optim.Optimizer]:
    """The plan's workload and its optimizer; with ``shard`` (an fsdp/hsdp plan, in a
    started group) the module is sharded (``sharding.wrap``) before the optimizer is
    made over its shards. ``precision``: what the ranks agreed to compute in
    (``agreed_precision``)."""
    workload = build(plan.model, plan.size, seed=plan.seed)
    workload.module.to(_DTYPES[plan.dtype])
    if device is not None and device.type != "cpu":
        workload.module.to(device)
    workload.module.train()
    # channels-last, compile, a bf16-true cast; train_step autocasts
    prepare(workload, plan.settings, precision=precision)
    if shard:
        wrap(
            workload.module,
            plan.layout,
            plan.settings,
            device or torch.device("cpu"),
            plan.sync_each_micro_batch,
        )
    opt = make_optimizer(
        plan.settings, workload.module.parameters(), lr=plan.lr, momentum=plan.momentum
    )
    return workload, opt


class _StopFlag:
    def __init__(self) -> None:
        self.set = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.set = True


def _barrier(device: torch.device) -> None:
    if device.type == "cuda":
        dist.barrier(device_ids=[device.index])
    else:
        dist.barrier()


def train(plan: TrainPlan, rank: int, world: int, device: torch.device | None = None) -> int:
    """Run the plan's remaining iterations on this rank of an initialised process group,
    on ``device`` (default: the CPU). Returns 0 when the plan finished, ``EXIT_STOPPED``
    when stopped by SIGTERM."""
    if world != plan.world_size:
        raise ConfigError(f"WORLD_SIZE is {world} but the plan has {plan.world_size} local batches")
    device = device or torch.device("cpu")
    cuda = device.type == "cuda"
    host_allocator.steady()  # the heap behaviour the profile measured
    torch.set_num_threads(plan.threads)
    precision = agreed_precision(plan.precision, device)
    if precision != plan.precision and rank == 0:
        print(
            f"worker: precision {plan.precision} runs as {precision} on {device.type}",
            file=sys.stderr,
        )
    stop = _StopFlag()
    previous = signal.signal(signal.SIGTERM, stop)
    workload, opt = _build(plan, device, shard=plan.sharded, precision=precision)
    start = 0
    found = latest(plan.checkpoint_path)
    ckpt = None
    if found is not None and found[0] == "file" and not plan.sharded:
        ckpt = load_checkpoint(plan.checkpoint_path)
    scaler_state = None
    if ckpt is not None:  # ddp from a one-file checkpoint: as ever
        if ckpt.global_batch != plan.global_batch:
            raise ConfigError(
                f"checkpoint has global batch {ckpt.global_batch}, the plan "
                f"{plan.global_batch}: resuming needs the same global batch"
            )
        workload.module.load_state_dict(ckpt.model)
        opt.load_state_dict(ckpt.optimizer)
        start, scaler_state = ckpt.iteration, ckpt.scaler
    module: nn.Module = workload.module
    timer = None
    if not plan.sharded:
        if cuda:
            ddp = nn.parallel.DistributedDataParallel(module, device_ids=[device.index])
        else:
            ddp = nn.parallel.DistributedDataParallel(module)
        workload.module = ddp
        timer = ExchangeTimer(world) if not cuda else None  # see ExchangeTimer on CUDA
        if timer is not None:
            # unannotated: DDP checks a hook's annotations, and this module's are strings
            ddp.register_comm_hook(None, lambda state, bucket: timer.hook(state, bucket))
    if found is not None and (plan.sharded or found[0] == "sharded"):
        # the other kind, or a sharded model: loaded into the wrapped module (DCP)
        resumed = load_latest(plan.checkpoint_path, workload.module, opt, plan.global_batch)
        if resumed is not None:
            start, scaler_state = resumed.iteration, resumed.scaler
    # FSDP's reduce-scatter averages over the ranks as DDP's allreduce does: same scale
    scale = loss_scale(plan.local_batches, rank) if plan.reweight else 1.0
    if timer is not None:  # its hook sums: DDP's 1/world rides on the loss
        scale *= timer.loss_factor
    scaler = _grad_scaler(device, plan.sharded) if precision == "fp16" else None
    if scaler is not None and scaler_state is not None:
        scaler.load_state_dict(scaler_state)
    log = ProgressLog(plan.progress_path) if rank == 0 else None
    code = 0
    saved = start
    remote_state, state_written = run_store.is_remote(plan.run_dir), -math.inf
    try:
        # A step is the time between two of the ranks' common points (the all-gather that
        # ends each step): every rank's compute and exchange lie inside it, and rank 0's
        # log and checkpoint writes count where the job pays for them.
        _barrier(device)
        t_prev = time.perf_counter()
        upkeep = 0.0  # rank 0's writes since the last common point (in the next step)
        for i in range(start, plan.iterations):
            batch = local_batch(workload, plan, i, rank, device)
            if timer is not None:
                timer.start(time.perf_counter())
            loss = train_step(workload, batch, opt, scale, precision, scaler, plan.micro_batches)
            nan = math.nan
            fwbw = timer.compute_s(time.perf_counter()) if timer is not None else nan
            busy = timer.busy_s if timer is not None else nan
            if plan.step_sleep_s:
                time.sleep(plan.step_sleep_s)
            # One small all-gather per step: the stop flag, this rank's timings and loss.
            mine = torch.tensor(
                [1.0 if stop.set else 0.0, fwbw, busy, float(loss.item())], dtype=torch.float64
            )
            if cuda:
                mine = mine.to(device)
            rows = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(rows, mine)
            gathered = torch.stack(rows).cpu()
            t_now = time.perf_counter()
            step_s, t_prev = t_now - t_prev, t_now
            done = i + 1
            stopping = bool(gathered[:, 0].max().item() > 0)
            non_finite(gathered[:, 3].tolist(), done, saved, plan, rank)
            due = stopping or done == plan.iterations or done % plan.checkpoint_every == 0
            if log is not None:
                compute_s, exchange_s = step_timings(gathered[:, 1:3].tolist())
                local_loss = loss.item() / scale if scale else None  # rank 0's samples
                log.append(
                    ProgressRecord(
                        done,
                        time.time(),
                        step_s,
                        plan.global_batch,
                        plan.config_id,
                        compute_s,
                        exchange_s,
                        upkeep,
                        local_loss,
                    )
                )
                if due and not plan.sharded:
                    save_checkpoint(
                        plan.checkpoint_path,
                        model=module,
                        optimizer=opt,
                        iteration=done,
                        global_batch=plan.global_batch,
                        config_id=plan.config_id,
                        scaler=scaler,
                    )
                    saved = done
            if due and plan.sharded:  # every rank writes its shards
                save_sharded(
                    plan.checkpoint_path, model=module, optimizer=opt, iteration=done,
                    global_batch=plan.global_batch, config_id=plan.config_id,
                    strategy=plan.strategy, scaler=scaler,
                )  # fmt: skip
                saved = done
            if log is not None:
                now = time.monotonic()
                # on object storage a state write is a PUT: once per flush window, and
                # always at a checkpoint and at the end (the monitor lags by the window)
                if (
                    not remote_state
                    or saved == done
                    or stopping
                    or now - state_written >= run_store.FLUSH_S
                ):
                    state = TrainState(done, time.time(), plan.config_id, saved, local_loss)
                    write_state(run_store.join(plan.run_dir, STATE_FILE), state)
                    state_written = now
                upkeep = time.perf_counter() - t_now
            if stopping:
                code = EXIT_STOPPED
                break
        _barrier(device)
    finally:
        signal.signal(signal.SIGTERM, previous)
        if log is not None:
            log.close()
    return code


def _grad_scaler(device: torch.device, sharded: bool) -> torch.amp.GradScaler:
    """fp16's loss scaler; over shards the ranks agree on a step's overflow (each rank
    checks only its own shards' gradients)."""
    if sharded:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device.type)
    return torch.amp.GradScaler(device.type)


class NonFiniteLoss(ConfigError):
    """A rank's loss was NaN or infinite: every rank stops before anything is saved."""


def non_finite(losses: Sequence[float], done: int, saved: int, plan: TrainPlan, rank: int) -> None:
    """Stop the job when a rank's loss of this step is not finite (every rank sees the same
    gathered losses, so all stop together): rank 0 records why for the monitor
    (``progress.refuse_report``), then each raises ``NonFiniteLoss``. Nothing of this step
    is logged or checkpointed: the checkpoint keeps the last finite weights."""
    bad = {r: x for r, x in enumerate(losses) if not math.isfinite(x)}
    if not bad:
        return
    which = ", ".join(f"rank {r}: {x}" for r, x in bad.items())
    reason = (
        f"the loss at iteration {done} is not finite ({which}): training stopped; the "
        f"checkpoint keeps the last finite weights (iteration {saved or 'none'}); lower the "
        "learning rate or check the data"
    )
    if rank == 0:
        refuse_report(plan.run_dir, plan.config_id, reason)
    raise NonFiniteLoss(reason)


def train_single(plan: TrainPlan, iterations: int | None = None) -> dict[str, Tensor]:
    """Reference: one process, no DDP, the whole global batch per step. Returns the model's
    parameters after ``iterations`` (default: all) steps from scratch."""
    workload, opt = _build(plan)
    one = {"local_batches": [plan.global_batch], "ranks_per_vm": 0, "strategy": "ddp"}
    whole = TrainPlan.from_dict({**plan.to_dict(), **one})
    for i in range(plan.iterations if iterations is None else iterations):
        opt.zero_grad(set_to_none=True)
        workload.loss(local_batch(workload, whole, i, 0)).backward()
        opt.step()
    return {k: v.detach().clone() for k, v in workload.module.state_dict().items()}


def place(
    plan: TrainPlan, rank: int, world: int, env: Mapping[str, str] | None = None
) -> Placement:
    """``choose_device`` for this process: ``rank`` and ``world`` as given, ``LOCAL_RANK``
    and ``LOCAL_WORLD_SIZE`` from ``env`` (default: the environment), CUDA as torch
    sees it."""
    env = os.environ if env is None else env
    merged = {k: env[k] for k in ("LOCAL_RANK", "LOCAL_WORLD_SIZE") if k in env}
    merged.update(RANK=str(rank), WORLD_SIZE=str(world))
    available = torch.cuda.is_available()
    return choose_device(
        merged,
        plan.device,
        cuda_available=available,
        cuda_devices=torch.cuda.device_count() if available else 0,
    )


def run_rank(plan: TrainPlan, rank: int, world: int, addr: str, port: int) -> int:
    """Join the group at ``addr:port`` as ``rank`` of ``world`` (gloo on the CPU, NCCL on
    this rank's GPU: ``place``) and train."""
    where = place(plan, rank, world)
    print(
        f"worker: rank {rank} of {world}, local batch {plan.local_batches[rank]}, "
        f"on {where.device} ({where.backend}), {plan.strategy}",
        file=sys.stderr,
    )
    if where.note:
        print(f"worker rank {rank}: {where.note}", file=sys.stderr)
    if where.is_cuda:
        torch.cuda.set_device(where.local_rank)
        if rank == 0:
            print(
                f"worker: {world} rank(s) on CUDA (NCCL), this one on {where.device}, "
                f"precision {plan.precision}",
                file=sys.stderr,
            )
    dist.init_process_group(
        where.backend,
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=plan.timeout_s),
    )
    try:
        return train(plan, rank, world, where.torch_device)
    finally:
        dist.destroy_process_group()


def _spawned(rank: int, plan_dict: dict[str, Any], port: int) -> None:
    plan = TrainPlan.from_dict(plan_dict)
    run_rank(plan, rank, plan.world_size, "127.0.0.1", port)


def run_spawned(plan: TrainPlan) -> None:
    """Run the plan with one local process per local batch (``torch.multiprocessing``)."""
    import torch.multiprocessing as mp

    mp.spawn(  # type: ignore[attr-defined]
        _spawned, args=(plan.to_dict(), free_port()), nprocs=plan.world_size, join=True
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m srifty_core.worker.worker PLAN.json", file=sys.stderr)
        return 2
    die_with_caller()
    plan = TrainPlan.load(args[0])
    try:
        rank, world = plan_rank(os.environ), int(os.environ["WORLD_SIZE"])
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except KeyError as exc:
        print(f"worker: environment variable {exc.args[0]} is not set", file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"worker: {exc}", file=sys.stderr)
        return 2
    return run_rank(plan, rank, world, addr, port)


if __name__ == "__main__":
    sys.exit(main())
