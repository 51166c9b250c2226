"""The census's counting pass (``census.take_census`` runs it at two batch sizes): one
training step of a built model on ``meta`` (or the CPU) under a dispatch mode that records
each ATen operator's phase, class, FLOPs and bytes, the tensors saved for the backward pass
and what the passes hold after each allocation (both also at autocast's widths), and the
order gradients become ready (DDP's buckets). A ``bf16-true`` step is counted with the
model and its inputs cast to bf16; in 16 bits (``bf16-true``, autocast's bf16 and fp16) its
attention is the fused kernel (``census_attention``)."""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from srifty_core.errors import ConfigError
from srifty_core.host_allocator import available_bytes
from srifty_core.profiling.config import DEFAULT_BUCKET_CAP_BYTES, DEFAULT_FIRST_BUCKET_BYTES
from srifty_core.training_settings import (
    AUTOCAST,
    OPTIMIZER_STATES,
    STATE_BYTES,
    TrainingSettings,
)
from srifty_core.workloads import build, make_optimizer
from srifty_core.workloads.prepare import cast_to_bf16

if TYPE_CHECKING:
    import torch

    from srifty_core.workloads.zoo import Workload

SIXTEEN_BITS = ("bf16-true", *AUTOCAST)
"""Precisions whose census counts attention as the fused kernel (``census_attention``)."""


def counted_precision(precision: str) -> str:
    """The precision a census of a step at ``precision`` is counted in: ``bf16-true`` (the
    model cast), ``bf16`` for autocast's bf16 and fp16 (one census: attention fused, the
    widths kept beside), else ``fp32`` (the roofline applies TF32)."""
    return {"bf16-true": "bf16-true", "bf16": "bf16", "fp16": "bf16"}.get(precision, "fp32")


CLASSES = ("conv", "matmul", "other", "norm")
"""Operator classes: convolutions and matrix products run on tensor cores where the
precision lets them (convolutions also in TF32 under PyTorch's defaults, matrix products
not), the rest on the vector units; ``norm`` is batch normalisation, which passes over its
tensors more often than the census counts them (its statistics, then the normalisation; in
backward, reductions over the input and the gradient, then the input's gradient): the
roofline learns how many more times (``Efficiencies.norm``). A census counted before the
class (``OpCensus.classes``) has it in ``other``."""

_CONV = {"convolution", "convolution_backward", "_convolution", "cudnn_convolution"}
_MATMUL = {
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "_scaled_mm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_flash_attention_forward",
    "_flash_attention_backward",
    "_efficient_attention_forward",
    "_efficient_attention_backward",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward",
    "fused_rnn",  # cuDNN's recurrent layers, as the census counts them (``census_rnn``)
    "fused_rnn_backward",
}
_NORM = {
    *("native_batch_norm", "native_batch_norm_backward", "batch_norm_backward"),
    *("_native_batch_norm_legit", "_native_batch_norm_legit_functional"),
    *("_batch_norm_with_update", "_batch_norm_with_update_functional"),
    *("cudnn_batch_norm", "cudnn_batch_norm_backward"),
    *("miopen_batch_norm", "miopen_batch_norm_backward"),
}
"""Batch normalisation in training, forward and backward, as ATen names it on any device."""
_AUTOCAST_LOW = _CONV | _MATMUL | {"linear", "matmul", "addbmm", "addmv", "mv", "prelu"}
"""Operators autocast runs in bf16/fp16 (``torch.autocast``'s lower-precision list on CUDA,
as ATen names them): their outputs, and what follows from those alone, are 2-byte tensors
in a mixed-precision step."""
_AUTOCAST_FP32 = {
    *("acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p"),
    *("reciprocal", "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm"),
    *("native_layer_norm", "group_norm", "native_group_norm", "norm", "linalg_vector_norm"),
    *("cosine_similarity", "nll_loss", "nll_loss_forward", "nll_loss2d_forward", "kl_div"),
    *("l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "binary_cross_entropy_with_logits"),
    *("dist", "cdist", "renorm", "logsumexp", "prod", "cumprod", "cumsum", "sum"),
    *("softmax", "_softmax", "log_softmax", "_log_softmax"),
}
"""Operators autocast runs in float32 whatever their inputs (its float32 list on CUDA)."""
_NO_KERNEL = {
    "detach",
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "lift_fresh",
    "_reshape_alias",
    "_unsafe_view",  # a view ATen does not mark as one (reshape after a copy)
    "alias",
    "set_",
    "resize_",
    "_record_function_enter_new",  # the profiler's markers: host-side only
    "_record_function_exit",
    "sym_size",
    "sym_stride",
    "sym_numel",
    "is_same_size",
    "_local_scalar_dense",
}


def op_class_of(name: str) -> int:
    """The ``CLASSES`` index of the ATen operator ``name`` (its overload packet's name)."""
    if name in _CONV:
        return CLASSES.index("conv")
    if name in _MATMUL:
        return CLASSES.index("matmul")
    if name in _NORM:
        return CLASSES.index("norm")
    return CLASSES.index("other")


@contextlib.contextmanager
def fused_on(device: Any) -> Iterator[None]:
    """Let a fused optimizer step on ``device``: torch refuses the meta device before it
    runs (a check of its own; its fused kernels have meta implementations, which the census
    counts as the one operator they are on a GPU). Elsewhere nothing changes."""
    from torch.optim import adam, adamw

    if device.type != "meta":
        yield
        return
    check = "_device_dtype_check_for_fused"
    saved = {m: getattr(m, check) for m in (adam, adamw) if hasattr(m, check)}
    try:
        for m in saved:
            setattr(m, check, lambda *a, **k: None)
        yield
    finally:
        for m, f in saved.items():
            setattr(m, check, f)


@dataclass
class Counted:
    ops: list[tuple[int, int, float, float]]
    saved: float
    saved_low: float
    n_parameters: int
    gradient_bytes: int
    bucket_sizes: tuple[int, ...]
    bucket_params: tuple[int, ...]
    bucket_ready_op: tuple[int, ...]
    bucket_cap_bytes: int
    first_bucket_cap_bytes: int
    unit_parameters: tuple[int, ...]
    peak: float = 0.0
    timeline: list[tuple[float, float]] = field(default_factory=list)
    attention_calls: int = 0


@contextlib.contextmanager
def _parameters_on_meta() -> Iterator[None]:
    """Each parameter a module registers is moved to meta as it is registered, as
    accelerate's ``init_empty_weights`` does: its initialisation then costs nothing, and
    what else the factory makes (its data, buffers, batches) stays where it puts it."""
    from torch import nn

    register = nn.Module.register_parameter
    moved: dict[int, tuple[nn.Parameter, nn.Parameter]] = {}  # id -> (given, its meta copy)

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if type(param) is nn.Parameter and param.device.type != "meta":
            given, meta = moved.get(id(param), (None, None))
            if given is not param:  # one copy a parameter: one given to two modules is a tie
                meta = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
                meta.__dict__.update(param.__dict__)
                moved[id(param)] = (param, meta)
            param = meta
        register(module, name, param)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def _built_on_meta(model: str, size: str, seed: int) -> Workload | None:
    """The workload with its parameters made on meta (``_parameters_on_meta``); ``None``
    where the factory reads a weight's value as it builds (it raises there). A reference
    that is wrong in itself (a ``ConfigError`` of its own, not one wrapping what the build
    raised) raises: no other device mends it, and building it on the CPU could take more
    memory than the host has."""
    try:
        with _parameters_on_meta():
            return build(model, size, seed=seed)
    except ConfigError as exc:
        if exc.__cause__ is None:
            raise
        return None
    except Exception:
        return None


def _built(model: str, size: str, seed: int, dev: torch.device) -> Workload:
    """The workload with its model on ``dev``: for ``meta``, its parameters made there where
    the factory allows (``_parameters_on_meta``: GPT-2 XL in seconds, not a minute of
    initialising 1.6 B weights), else built on the CPU; then moved in place, so that a tied
    weight (an LM head sharing the embedding) stays one parameter (a plain ``.to("meta")``
    gives each module its own copy)."""
    import torch

    workload = _built_on_meta(model, size, seed) if dev.type == "meta" else None
    if workload is None:  # on the CPU
        workload = build(model, size, seed=seed)
    module = workload.module
    if any(t.device != dev for t in (*module.parameters(), *module.buffers())):
        swap = torch.__future__.get_swap_module_params_on_conversion()
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            module.to(dev)
        finally:
            torch.__future__.set_swap_module_params_on_conversion(swap)
    return workload


def check_cpu_room(
    model: str, size: str, settings: TrainingSettings, seed: int, exc: BaseException
) -> None:
    """A ``ConfigError`` where counting ``model``'s step on the CPU (its step did not run on
    meta: ``exc``) would need more memory than this host has available: its parameters,
    gradients and optimizer states at the settings' widths (and the float32 build a
    bf16-true cast starts from), the least the CPU's step holds."""
    built = _built_on_meta(model, size, seed)
    if built is None:  # a build that fails on meta cannot be sized
        return
    n = sum(p.numel() for p in built.module.parameters())
    states = 2 + OPTIMIZER_STATES[settings.optimizer]  # the parameter, its gradient, states
    need = max(4 * n, STATE_BYTES[settings.precision] * n * states)  # built in float32 first
    room = available_bytes()
    if room is not None and need > room:
        said = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(
            f"census of {model}/{size}: its step does not run on the meta device "
            f"({type(exc).__name__}: {said}), "
            f"and counting it on the CPU needs at least {need / 2**30:.1f} GiB, more than "
            f"the {room / 2**30:.1f} GiB available here"
        )


def count(
    model: str, size: str, settings: TrainingSettings, batch_size: int, seed: int, device: str
) -> Counted:
    import torch
    from torch import distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import flop_registry

    from srifty_core.profiling.buckets import trainable
    from srifty_core.profiling.census_attention import Attention
    from srifty_core.profiling.census_rnn import fused_rnns
    from srifty_core.sharding.units import unit_parameters

    dev = torch.device(device)
    workload = _built(model, size, seed, dev)
    if settings.precision == "bf16-true":  # counted as it runs: every tensor at 2 bytes
        cast_to_bf16(workload)
    workload.module.train()
    batch = tuple(t.to(dev) for t in workload.make_batch(batch_size, torch.device("cpu"), seed))
    params = trainable(workload.module)
    own = {p.untyped_storage()._cdata for p in params}
    # weights and buffers (batch norm's running statistics): autocast leaves them float32,
    # an operator's width follows its activations
    weights = {t.untyped_storage()._cdata for t in workload.module.parameters()}
    weights |= {t.untyped_storage()._cdata for t in workload.module.buffers()}
    own |= {t.untyped_storage()._cdata for t in batch}
    # storage: (bytes, bytes of an element, 2-byte under autocast when it was saved)
    saved: dict[int, tuple[int, int, bool]] = {}
    # Under autocast (bf16/fp16): the storages that would hold 2-byte tensors. The weights'
    # 2-byte copies are not counted: FSDP2's mixed precision frees them after each unit,
    # and on the H200 the float32 count of the fixed part was already over DDP's peak.
    # Keyed by address, and each key dropped when its storage is freed: a freed storage's
    # address taken by a new one would pass its width on (the count varied run to run).
    # Not held here, so that the step frees what it frees (the peak below).
    low: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st._cdata not in own:
            saved[st._cdata] = (st.nbytes(), t.element_size(), st._cdata in low)
        return t

    # The most bytes the forward and backward passes' operators hold at once: each new
    # storage an operator returns counts until it is freed (storages are weakly referenced),
    # at the counted widths and at autocast's (``low``, decided before it is held).
    live = [0.0, 0.0, 0.0]  # (now, peak, now at autocast's widths)
    held_now: dict[int, float] = {}  # storage: its bytes at autocast's widths

    def freed(key: int, n: float) -> None:
        live[0] -= n
        live[2] -= held_now.pop(key, 0.0)

    # what is held after each allocation, (counted widths, autocast's): a moment of the
    # step, the same moments at every batch (``census.peak_hull`` fits a line to each)
    timeline: list[tuple[float, float]] = []

    def count_low(key: int, n: float) -> None:
        live[2] += n - held_now.get(key, 0.0)
        held_now[key] = n
        timeline.append((live[0], live[2]))

    def hold(out: Any) -> None:
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            st = t.untyped_storage()
            if st._cdata in held_now or st._cdata in own:
                continue
            n = float(st.nbytes())
            weakref.finalize(st, freed, st._cdata, n)
            live[0] += n
            live[1] = max(live[1], live[0])
            narrow = st._cdata in low and t.element_size() > 2
            count_low(st._cdata, n * 2 / t.element_size() if narrow else n)

    class Census(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.phase = 0
            self.backward_ops = 0
            self.ops: list[tuple[int, int, float, float]] = []

        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            name = func._overloadpacket.__name__
            kernel = not (func.is_view or name in _NO_KERNEL)
            if self.phase < 2:  # the backward pass's widths by the same rule (a gradient
                # is as wide as what it is the gradient of; matrix products run narrow)
                if kernel:
                    self.widths(name, args, kwargs, out)
                hold(out)
            if not kernel:
                return out
            tensors = [
                t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)
            ]
            flops = 0.0
            counter: Callable[..., Any] | None = flop_registry.get(func._overloadpacket)
            if counter is not None:
                flops = float(counter(*args, **kwargs, out_val=out))
            nbytes = float(sum(t.numel() * t.element_size() for t in tensors))
            if not func._schema.returns:  # updates in place and returns nothing (foreach,
                # fused optimizers): what it writes crosses memory too
                nbytes += float(sum(
                    t.numel() * t.element_size()
                    for a, v in zip(func._schema.arguments, args, strict=False)
                    if a.alias_info is not None and a.alias_info.is_write
                    for t in tree_flatten(v)[0] if isinstance(t, torch.Tensor)
                ))  # fmt: skip
            self.ops.append((self.phase, op_class_of(name), flops, nbytes))
            self.backward_ops += self.phase == 1
            return out

        @staticmethod
        def widths(name: str, args: Any, kwargs: Any, out: Any) -> None:
            """What autocast would make of this operator's outputs: 2-byte for its
            lower-precision list, 4-byte for its float32 list, else 2-byte when every
            floating activation it reads is (weights follow their input, as batch norm's
            do). In the backward pass the same rule (``hook_for`` widens the gradients
            autocast accumulates in float32)."""
            ins = [
                t
                for t in tree_flatten((args, kwargs))[0]
                if isinstance(t, torch.Tensor) and t.is_floating_point()
            ]
            acts = [t.untyped_storage()._cdata for t in ins]
            acts = [c for c in acts if c not in weights]
            if name in _AUTOCAST_LOW:
                is_low = True
            elif name in _AUTOCAST_FP32:
                is_low = False
            else:
                is_low = bool(acts) and all(c in low for c in acts)
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    c = t.untyped_storage()._cdata
                    if is_low:
                        if c not in low:
                            low.add(c)
                            weakref.finalize(t.untyped_storage(), low.discard, c)
                    else:
                        low.discard(c)

    ready: dict[int, int] = {}
    census = Census()

    def hook_for(i: int) -> Callable[[torch.Tensor], None]:
        def hook(p: torch.Tensor) -> None:
            if i not in ready:
                ready[i] = max(0, census.backward_ops - 1)
            grad = p.grad  # autocast accumulates a float32 gradient, however narrow the
            if grad is not None:  # product it came from
                st = grad.untyped_storage()
                if st._cdata in held_now:
                    count_low(st._cdata, float(st.nbytes()))

        return hook

    handles = [p.register_post_accumulate_grad_hook(hook_for(i)) for i, p in enumerate(params)]
    optimizer = make_optimizer(settings, params, lr=0.01)
    if not any(g.get("fused") for g in optimizer.param_groups):
        for group in optimizer.param_groups:  # as on CUDA: one multi-tensor kernel per update
            group["foreach"] = True
    rnns = fused_rnns() if dev.type == "meta" else contextlib.nullcontext()
    # flash attention, as a GPU runs it in 16 bits (only the meta device has its operators)
    attention = Attention(fuse=dev.type == "meta" and settings.precision in SIXTEEN_BITS)
    try:
        with census, rnns, attention:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = workload.loss(batch)
            census.phase = 1
            loss.backward()
        with fused_on(dev):
            optimizer.step()  # the first step makes the state; the census times the next
            with census:
                census.phase = 2
                optimizer.step()
    finally:
        for h in handles:
            h.remove()
    for i in range(len(params)):  # a hook that did not fire: ready with the last operator
        ready.setdefault(i, max(0, census.backward_ops - 1))
    # DDP's buckets as the profiler forms them (``buckets.form_buckets``), from the order
    # the gradients were ready in
    order = [i for i in sorted(ready, key=lambda i: (ready[i], i))]
    members, _ = dist._compute_bucket_assignment_by_size(  # type: ignore[attr-defined]
        [params[i] for i in order],
        [DEFAULT_FIRST_BUCKET_BYTES, DEFAULT_BUCKET_CAP_BYTES],
        [False] * len(order),
        order,
    )
    size_of = [p.numel() * p.element_size() for p in params]
    return Counted(
        ops=census.ops,
        saved=float(sum(n for n, _, _ in saved.values())),
        saved_low=float(
            sum(n * 2 // w if is_low and w > 2 else n for n, w, is_low in saved.values())
        ),
        n_parameters=sum(p.numel() for p in params),
        gradient_bytes=sum(size_of),
        bucket_sizes=tuple(sum(size_of[i] for i in m) for m in members),
        bucket_params=tuple(len(m) for m in members),
        bucket_ready_op=tuple(max(ready[i] for i in m) for m in members),
        bucket_cap_bytes=DEFAULT_BUCKET_CAP_BYTES,
        first_bucket_cap_bytes=DEFAULT_FIRST_BUCKET_BYTES,
        unit_parameters=unit_parameters(workload.module),
        peak=live[1],
        timeline=timeline,
        attention_calls=attention.calls,
    )


def peak_hull(
    at_a: Sequence[float], at_b: Sequence[float], batches: tuple[int, int] = (2, 8)
) -> tuple[tuple[float, float], ...]:
    """The lines ``(fixed, per_sample)`` through each moment's bytes held at ``batches``
    (``census.BATCHES``),
    only those on top at some batch of at least 1 (the upper envelope, by slope)."""
    span = float(batches[1] - batches[0])
    best: dict[float, float] = {}  # slope: the largest fixed part with it
    for ya, yb in zip(at_a, at_b, strict=True):
        per = max(0.0, (yb - ya) / span)
        fixed = ya - per * batches[0]
        if fixed > best.get(per, -math.inf):
            best[per] = fixed
    hull: list[tuple[float, float]] = []  # by slope; each on top right of the one before

    def cross(p: tuple[float, float], q: tuple[float, float]) -> float:
        return (p[0] - q[0]) / (q[1] - p[1])  # the batch where q overtakes p

    for per in sorted(best):
        line = (best[per], per)
        while hull and (
            hull[-1][0] <= line[0]  # below everywhere right of 0 (less fixed and slope)
            or (len(hull) > 1 and cross(hull[-2], line) <= cross(hull[-2], hull[-1]))
        ):
            hull.pop()
        hull.append(line)
    while len(hull) > 1 and cross(hull[0], hull[1]) <= 1.0:  # overtaken before batch 1
        hull.pop(0)
    return tuple(hull)
