"""The heterogeneous DDP training worker (torchrun-compatible).

``python -m srifty_core.runtime.worker PLAN.json`` reads ``RANK``, ``WORLD_SIZE``,
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
ranks), ``fp32`` (the default) none. The CPU path always computes in the plan's
``dtype``. Data, loss reweighting and iteration count are the same on both.

Unequal local batches: DDP averages gradients over ranks, so with a mean-reduced loss a
sample on a small-batch rank would weigh more than one on a large-batch rank. Each rank
scales its loss by ``world_size * b_rank / B_global``; after DDP's average every sample
counts ``1 / B_global``, exactly the gradient of one process on the whole global batch.

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

import json
import math
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from srifty_core.errors import ConfigError
from srifty_core.lifetime import die_with_caller
from srifty_core.runtime import run_store
from srifty_core.runtime.checkpoint import CHECKPOINT_FILE, load_checkpoint, save_checkpoint
from srifty_core.runtime.progress import (
    PROGRESS_FILE,
    STATE_FILE,
    ProgressLog,
    ProgressRecord,
    TrainState,
    write_state,
)
from srifty_core.runtime.rendezvous import RANK_OFFSET_ENV

EXIT_STOPPED = 3
"""Exit code of a worker that stopped on SIGTERM after a checkpoint."""
_DTYPES = {"float32": torch.float32, "float64": torch.float64}
DEVICES = ("auto", "cpu", "cuda")
"""A plan's ``device``: ``auto`` (GPUs when this host has one per rank, else the CPU),
``cpu``, or ``cuda`` (an error without one GPU per rank)."""
PRECISIONS = ("fp32", "fp16", "bf16")
"""A plan's ``precision`` on GPUs (the CPU path computes in ``dtype``)."""


@dataclass(frozen=True)
class TrainPlan:
    """What every worker of one configuration runs (the PLAN.json file)."""

    model: str
    size: str
    global_batch: int
    iterations: int
    local_batches: tuple[int, ...]
    run_dir: str
    """Holds the checkpoint and the progress log (shared by every configuration of a run)."""
    config_id: str = "c0"
    seed: int = 0
    lr: float = 0.01
    momentum: float = 0.9
    dtype: str = "float32"
    checkpoint_every: int = 10
    reweight: bool = True
    """Scale each rank's loss so that every sample counts equally (turn off only to show
    why it is needed)."""
    threads: int = 1
    step_sleep_s: float = 0.0
    """Extra seconds per step (to slow a test job down so that it can be interrupted)."""
    timeout_s: float = 60.0
    """Collective timeout: how long a rank waits for a dead peer before failing."""
    device: str = "auto"
    """``auto``, ``cpu`` or ``cuda`` (``DEVICES``; see ``choose_device``)."""
    precision: str = "fp32"
    """``fp32``, ``fp16`` (autocast and a GradScaler) or ``bf16`` (autocast) on GPUs."""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.local_batches, (str, bytes)) or not hasattr(
            self.local_batches, "__iter__"
        ):
            raise ConfigError(f"local_batches: a list of integers, got {self.local_batches!r}")
        batches = tuple(_whole("local_batches", b) for b in self.local_batches)
        object.__setattr__(self, "local_batches", batches)
        for name in ("global_batch", "iterations", "seed", "checkpoint_every", "threads"):
            object.__setattr__(self, name, _whole(name, getattr(self, name)))
        for name, lo, hi in (
            ("lr", 0.0, math.inf),
            ("momentum", 0.0, 1.0),
            ("timeout_s", 0.0, math.inf),
        ):
            v = _finite(name, getattr(self, name))
            if not lo < v < hi and not (name == "momentum" and v == 0.0):
                raise ConfigError(f"{name}: must be in ({lo:g}, {hi:g}), got {v!r}")
        if _finite("step_sleep_s", self.step_sleep_s) < 0:
            raise ConfigError(f"step_sleep_s: must be >= 0, got {self.step_sleep_s!r}")
        if self.threads < 1:
            raise ConfigError(f"threads: must be >= 1, got {self.threads}")
        if not isinstance(self.reweight, bool):
            raise ConfigError(f"reweight: must be true or false, got {self.reweight!r}")
        if not self.local_batches or any(b < 1 for b in self.local_batches):
            raise ConfigError("local_batches: need one batch >= 1 per rank")
        if sum(self.local_batches) != self.global_batch:
            raise ConfigError(
                f"local_batches: {list(self.local_batches)} sum to "
                f"{sum(self.local_batches)}, not the global batch {self.global_batch}"
            )
        if self.iterations < 1:
            raise ConfigError("iterations: must be >= 1")
        if self.checkpoint_every < 1:
            raise ConfigError("checkpoint_every: must be >= 1")
        if self.dtype not in _DTYPES:
            raise ConfigError(f"dtype: must be one of {sorted(_DTYPES)}")
        if self.device not in DEVICES:
            raise ConfigError(f"device: must be one of {list(DEVICES)}, got {self.device!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"precision: must be one of {list(PRECISIONS)}, got {self.precision!r}"
            )
        if self.precision != "fp32" and self.dtype != "float32":
            raise ConfigError(
                f"precision: {self.precision} mixed precision keeps float32 parameters; "
                f"the plan's dtype is {self.dtype}"
            )

    @property
    def world_size(self) -> int:
        return len(self.local_batches)

    @property
    def checkpoint_path(self) -> Path | str:
        """A ``Path``, or a URI when ``run_dir`` is one (``run_store``)."""
        return run_store.join(self.run_dir, CHECKPOINT_FILE)

    @property
    def progress_path(self) -> Path | str:
        return run_store.join(self.run_dir, PROGRESS_FILE)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["local_batches"] = list(self.local_batches)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainPlan:
        return cls(**d)

    def save(self, path: Path | str) -> Path | str:
        return run_store.write_text(path, json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: Path | str) -> TrainPlan:
        text = run_store.read_text(path)
        if text is None:
            raise FileNotFoundError(f"no such plan: {path}")
        try:
            return cls.from_dict(json.loads(text))
        except TypeError as exc:
            raise ConfigError(f"{path}: {exc}") from exc


def _whole(name: str, v: Any) -> int:
    """``v`` as an int when it is a whole number (not a bool, not 8.9), else a
    ``ConfigError`` naming ``name``."""
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or (isinstance(v, float) and (not math.isfinite(v) or not v.is_integer()))
    ):
        raise ConfigError(f"{name}: must be a whole number, got {v!r}")
    return int(v)


def _finite(name: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ConfigError(f"{name}: must be a finite number, got {v!r}")
    return float(v)


def split_batch(global_batch: int, ranks: int) -> tuple[int, ...]:
    """``global_batch`` split as evenly as possible over ``ranks`` (larger ones first)."""
    if ranks < 1 or ranks > global_batch:
        raise ConfigError(f"cannot split a batch of {global_batch} over {ranks} ranks")
    q, r = divmod(global_batch, ranks)
    return tuple(q + (1 if k < r else 0) for k in range(ranks))


def loss_scale(local_batches: Sequence[int], rank: int) -> float:
    """``world_size * b_rank / B_global``: the factor that makes DDP's average of the ranks'
    mean losses the mean over every sample of the global batch."""
    return len(local_batches) * local_batches[rank] / sum(local_batches)


def step_timings(rows: Sequence[Sequence[float]]) -> tuple[tuple[float, ...] | None, float | None]:
    """Rank 0's record of one step from every rank's ``(forward + backward, exchange busy)``
    seconds: the per-rank compute times, and the exchange's busy time as the least over
    the ranks (an early rank's includes waiting for its peers); ``None`` for what some
    rank did not measure (NaN)."""
    fwbw = [float(r[0]) for r in rows]
    busy = [float(r[1]) for r in rows]
    compute = None if not fwbw or any(math.isnan(x) for x in fwbw) else tuple(fwbw)
    exchange = None if not busy or any(math.isnan(x) for x in busy) else min(busy)
    return compute, exchange


@dataclass(frozen=True)
class Placement:
    """Where one rank runs (``choose_device``)."""

    rank: int
    world_size: int
    local_rank: int
    """This rank's index on its host (its GPU, on CUDA)."""
    local_world_size: int
    """Ranks on this host."""
    device: str
    """``cpu`` or ``cuda:<local rank>``."""
    backend: str
    """``gloo`` (CPU) or ``nccl`` (CUDA)."""
    note: str = ""
    """Why ``auto`` fell back to the CPU on a host with GPUs (empty otherwise)."""

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)


def _env_int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise ConfigError(f"environment variable {name} is not set")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}: a whole number, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"environment variable {name}: must be >= 0, got {value}")
    return value


def choose_device(
    env: Mapping[str, str],
    want: str = "auto",
    *,
    cuda_available: bool,
    cuda_devices: int,
) -> Placement:
    """Where this rank runs, from the launcher's environment and what CUDA reports.

    ``RANK`` and ``WORLD_SIZE`` are required. ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``
    (torchrun sets both) place the rank on its host; when either is missing (a plain
    launcher: the local provider, ``run_spawned``) every rank is on this host, so the
    local rank is ``RANK`` and ``WORLD_SIZE`` ranks share it.

    ``want`` is the plan's ``device``: ``cuda`` needs one GPU per rank on this host (else a
    ``ConfigError``) and gives ``cuda:<local rank>`` with NCCL; ``cpu`` gives the CPU with
    gloo; ``auto`` is ``cuda`` when CUDA is available with at least one GPU per local
    rank, else ``cpu`` (every rank of a host decides alike, so a host never mixes
    backends; a job whose hosts differ should say ``cpu`` or ``cuda``)."""
    if want not in DEVICES:
        raise ConfigError(f"device: must be one of {list(DEVICES)}, got {want!r}")
    rank = _env_int(env, "RANK")
    world = _env_int(env, "WORLD_SIZE")
    if world < 1 or rank >= world:
        raise ConfigError(f"RANK {rank} is not in a world of WORLD_SIZE {world}")
    if env.get("LOCAL_RANK", "") != "" and env.get("LOCAL_WORLD_SIZE", "") != "":
        local_rank = _env_int(env, "LOCAL_RANK")
        local_world = _env_int(env, "LOCAL_WORLD_SIZE")
    else:
        local_rank, local_world = rank, world
    if local_world < 1 or local_rank >= local_world or local_world > world:
        raise ConfigError(
            f"LOCAL_RANK {local_rank} of LOCAL_WORLD_SIZE {local_world} does not fit a "
            f"world of {world}"
        )
    gpus = cuda_devices if cuda_available else 0
    fits = gpus >= local_world
    note = ""
    if want == "cuda" and not fits:
        raise ConfigError(
            f"device: cuda needs one GPU per rank: {local_world} rank(s) on this host, "
            f"{gpus} GPU(s) available"
        )
    if want == "auto" and gpus > 0 and not fits:
        note = (
            f"{local_world} ranks on this host but {gpus} GPU(s): running on the CPU "
            "(one rank per GPU; set the plan's device to cuda to make this an error)"
        )
    if want != "cpu" and fits:
        return Placement(rank, world, local_rank, local_world, f"cuda:{local_rank}", "nccl")
    return Placement(rank, world, local_rank, local_world, "cpu", "gloo", note)


def choose_precision(precision: str, device_type: str, bf16_everywhere: bool) -> str:
    """The precision a rank computes in: ``fp32`` on the CPU and when the plan says so;
    on CUDA ``fp16``, or ``bf16`` when every rank's GPU supports it (else ``fp16``).
    ``bf16_everywhere`` must be the same on every rank (``train`` agrees on it with an
    allreduce), so that all ranks scale their gradients alike."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision: must be one of {list(PRECISIONS)}, got {precision!r}")
    if precision == "fp32" or device_type != "cuda":
        return "fp32"
    if precision == "bf16" and not bf16_everywhere:
        return "fp16"
    return precision


_AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _autocast(precision: str, device: torch.device) -> AbstractContextManager[Any]:
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=_AUTOCAST[precision])


def train_step(
    workload: Any,
    batch: tuple[Tensor, ...],
    opt: torch.optim.Optimizer,
    scale: float,
    precision: str = "fp32",
    scaler: torch.amp.GradScaler | None = None,
) -> Tensor:
    """One optimizer step on ``batch`` with the loss scaled by ``scale`` (returned, detached,
    without a device sync): in the
    parameters' dtype for ``fp32``, else under ``torch.autocast`` of ``precision`` (on the
    batch's device); with ``scaler`` (fp16) the backward pass runs on the scaled loss and
    the scaler skips a step whose gradients overflowed (under DDP every rank sees the same
    averaged gradients, so every rank skips alike)."""
    opt.zero_grad(set_to_none=True)
    with _autocast(precision, batch[0].device):
        loss = workload.loss(batch) * scale
    if scaler is None:
        loss.backward()
        opt.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    return loss.detach()


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
    plan: TrainPlan, device: torch.device | None = None
) -> tuple[Any, torch.optim.Optimizer]:
    from srifty_core.profiling.zoo import build

    workload = build(plan.model, plan.size, seed=plan.seed)
    workload.module.to(_DTYPES[plan.dtype])
    if device is not None and device.type != "cpu":
        workload.module.to(device)
    workload.module.train()
    opt = torch.optim.SGD(workload.module.parameters(), lr=plan.lr, momentum=plan.momentum)
    return workload, opt


class _StopFlag:
    def __init__(self) -> None:
        self.set = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.set = True


class ExchangeTimer:
    """A DDP communication hook that is DDP's own all-reduce (each bucket divided by the
    world size, then summed over the ranks: the same arithmetic as DDP's built-in path),
    timed: per step, when the last gradient bucket was ready (the end of this rank's
    backward computation) and how long the exchange kept the links busy (each bucket
    from when it was issued, or the previous one finished, to when it finished; the
    buckets run one after the other).

    On the CPU (gloo) the all-reduce's future completes when the transfer has; on CUDA
    (NCCL) its callbacks run as the work is queued on the GPU's stream, so these times
    would not be the GPU's: ``train`` times only CPU ranks (a CUDA rank's record has no
    timings, and the monitor calibrates from its iteration times alone)."""

    def __init__(self, world: int) -> None:
        import threading

        self.world = world
        self._lock = threading.Lock()
        self.start(0.0)

    def start(self, t0: float) -> None:
        """A new step whose forward pass starts at ``t0`` (``time.perf_counter``)."""
        with self._lock:
            self.t0 = t0
            self.last_ready: float | None = None
            self.busy_s = 0.0
            self._free_at = t0

    def hook(self, state: object, bucket: Any) -> torch.futures.Future[Tensor]:
        ready = time.perf_counter()
        with self._lock:
            self.last_ready = ready
        tensor = bucket.buffer().div_(self.world)
        work = dist.all_reduce(tensor, async_op=True)
        assert work is not None

        def done(fut: torch.futures.Future[Any]) -> Tensor:
            end = time.perf_counter()
            with self._lock:
                self.busy_s += max(end - max(ready, self._free_at), 0.0)
                self._free_at = max(self._free_at, end)
            out: Tensor = fut.value()[0]
            return out

        return work.get_future().then(done)

    def compute_s(self, fallback_end: float) -> float:
        """This step's forward + backward seconds (to ``fallback_end`` when DDP issued no
        bucket)."""
        with self._lock:
            end = self.last_ready if self.last_ready is not None else fallback_end
            return max(end - self.t0, 0.0)


def train(plan: TrainPlan, rank: int, world: int, device: torch.device | None = None) -> int:
    """Run the plan's remaining iterations on this rank of an initialised process group,
    on ``device`` (default: the CPU). Returns 0 when the plan finished, ``EXIT_STOPPED``
    when stopped by SIGTERM."""
    if world != plan.world_size:
        raise ConfigError(f"WORLD_SIZE is {world} but the plan has {plan.world_size} local batches")
    device = device or torch.device("cpu")
    cuda = device.type == "cuda"
    torch.set_num_threads(plan.threads)
    bf16_everywhere = True
    if plan.precision == "bf16":  # every rank asks, so every rank picks the same precision
        ok = torch.tensor([1.0 if cuda and torch.cuda.is_bf16_supported() else 0.0])
        ok = ok.to(device)
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        bf16_everywhere = bool(ok.item() > 0)
    precision = choose_precision(plan.precision, device.type, bf16_everywhere)
    if precision != plan.precision and rank == 0:
        print(
            f"worker: precision {plan.precision} runs as {precision} on {device.type}",
            file=sys.stderr,
        )
    stop = _StopFlag()
    previous = signal.signal(signal.SIGTERM, stop)
    workload, opt = _build(plan, device)
    start = 0
    ckpt = load_checkpoint(plan.checkpoint_path)
    if ckpt is not None:
        if ckpt.global_batch != plan.global_batch:
            raise ConfigError(
                f"checkpoint has global batch {ckpt.global_batch}, the plan "
                f"{plan.global_batch}: resuming needs the same global batch"
            )
        workload.module.load_state_dict(ckpt.model)
        opt.load_state_dict(ckpt.optimizer)
        start = ckpt.iteration
    module: nn.Module = workload.module
    if cuda:
        ddp = nn.parallel.DistributedDataParallel(module, device_ids=[device.index])
    else:
        ddp = nn.parallel.DistributedDataParallel(module)
    workload.module = ddp
    timer = ExchangeTimer(world) if not cuda else None  # see ExchangeTimer on CUDA
    if timer is not None:
        # unannotated: DDP checks a hook's annotations, and this module's are strings
        ddp.register_comm_hook(None, lambda state, bucket: timer.hook(state, bucket))
    scale = loss_scale(plan.local_batches, rank) if plan.reweight else 1.0
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    if scaler is not None and ckpt is not None and ckpt.scaler is not None:
        scaler.load_state_dict(ckpt.scaler)
    log = ProgressLog(plan.progress_path) if rank == 0 else None
    code = 0
    saved = start
    remote_state, state_written = run_store.is_remote(plan.run_dir), -math.inf
    try:
        for i in range(start, plan.iterations):
            t0 = time.perf_counter()
            batch = local_batch(workload, plan, i, rank, device)
            if timer is not None:
                timer.start(time.perf_counter())
            loss = train_step(workload, batch, opt, scale, precision, scaler)
            nan = math.nan
            fwbw = timer.compute_s(time.perf_counter()) if timer is not None else nan
            busy = timer.busy_s if timer is not None else nan
            if plan.step_sleep_s:
                time.sleep(plan.step_sleep_s)
            # One small all-gather per step: the stop flag and this rank's timings.
            mine = torch.tensor([1.0 if stop.set else 0.0, fwbw, busy], dtype=torch.float64)
            if cuda:
                mine = mine.to(device)
            rows = [torch.empty_like(mine) for _ in range(world)]
            dist.all_gather(rows, mine)
            gathered = torch.stack(rows).cpu()
            done = i + 1
            stopping = bool(gathered[:, 0].max().item() > 0)
            if log is not None:
                compute_s, exchange_s = step_timings(gathered[:, 1:].tolist())
                log.append(
                    ProgressRecord(
                        done,
                        time.time(),
                        time.perf_counter() - t0,
                        plan.global_batch,
                        plan.config_id,
                        compute_s,
                        exchange_s,
                    )
                )
                if stopping or done == plan.iterations or done % plan.checkpoint_every == 0:
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
                local_loss = loss.item() / scale if scale else None  # rank 0's samples
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
            if stopping:
                code = EXIT_STOPPED
                break
        if cuda:
            dist.barrier(device_ids=[device.index])
        else:
            dist.barrier()
    finally:
        signal.signal(signal.SIGTERM, previous)
        if log is not None:
            log.close()
    return code


def train_single(plan: TrainPlan, iterations: int | None = None) -> dict[str, Tensor]:
    """Reference: one process, no DDP, the whole global batch per step. Returns the model's
    parameters after ``iterations`` (default: all) steps from scratch."""
    workload, opt = _build(plan)
    whole = TrainPlan.from_dict({**plan.to_dict(), "local_batches": [plan.global_batch]})
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
        f"on {where.device} ({where.backend})",
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

    from srifty_core.cloud.local import free_port

    mp.spawn(  # type: ignore[attr-defined]
        _spawned, args=(plan.to_dict(), free_port()), nprocs=plan.world_size, join=True
    )


def plan_rank(env: Mapping[str, str]) -> int:
    """This process's rank in the plan's order: ``RANK``, except on a VM started by
    ``rendezvous.start_script``, where torchrun's c10d rendezvous numbers the VMs in its own
    order and ``SRIFTY_RANK_OFFSET`` (the plan's first rank on this VM) plus ``LOCAL_RANK``
    is the rank whose local batch this process trains."""
    world = _env_int(env, "WORLD_SIZE")
    if env.get(RANK_OFFSET_ENV, "") == "":
        return _env_int(env, "RANK")
    offset = _env_int(env, RANK_OFFSET_ENV)
    local = _env_int(env, "LOCAL_RANK")
    local_world = _env_int(env, "LOCAL_WORLD_SIZE")
    if local >= local_world or offset + local_world > world:
        raise ConfigError(
            f"{RANK_OFFSET_ENV} {offset} with LOCAL_RANK {local} of LOCAL_WORLD_SIZE "
            f"{local_world} does not fit a world of {world}"
        )
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        # joining MASTER_ADDR:MASTER_PORT with a rank other than torchrun's works only as
        # a client of the agent's store (rendezvous: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=0)
        raise ConfigError(
            f"{RANK_OFFSET_ENV} needs torchrun's agent store (TORCHELASTIC_USE_AGENT_STORE="
            f"True), got {env.get('TORCHELASTIC_USE_AGENT_STORE')!r}"
        )
    return offset + local


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m srifty_core.runtime.worker PLAN.json", file=sys.stderr)
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
