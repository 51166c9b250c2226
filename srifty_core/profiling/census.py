"""Operator census: what one training step of a model asks of a device, counted without
running it on that device.

The model is built as a profile would build it (``workloads.build``), moved to PyTorch's
``meta`` device (shapes and dtypes, no data, no arithmetic) and stepped under a dispatch
mode that records every ATen operator the step launches: its phase (forward, backward,
optimizer step), its floating-point operations (``torch.utils.flop_counter``'s formulas) and
the bytes of the tensors it reads and writes, at two batch sizes. Each operator's counts are
linear in the batch (the same graph at both sizes), so the census gives them at any batch.
Views and allocations launch no kernel and are left out. A model whose step cannot run on
``meta`` (it reads a value) is counted on the CPU at the same two small batches instead.

The census also records DDP's gradient buckets (formed as the profiler forms them, from the
order in which the backward pass produced the gradients) with the backward operator after
which each bucket is complete, and the memory the step holds: the tensors saved for the
backward pass (per sample and fixed) and the parameters.

``predictors.roofline`` turns a census into latencies on a GPU it was never run on. The
census depends on the model, its size and its training settings only, so the profile store
keeps one per model next to its profiles (``census<settings suffix>.json``) and the
package ships the zoo's ``full`` models' (``shipped/census/``): planning does not need
torch.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from srifty_core import paths
from srifty_core.atomic import write_text_atomic
from srifty_core.errors import ConfigError
from srifty_core.lifetime import caller_env, die_with_caller
from srifty_core.profiling.config import DEFAULT_BUCKET_CAP_BYTES, DEFAULT_FIRST_BUCKET_BYTES
from srifty_core.profiling.layout import model_folder
from srifty_core.training_settings import DEFAULT_SETTINGS, TrainingSettings
from srifty_core.worker_env import scrubbed
from srifty_core.workloads import ModelRefError, build, make_optimizer, model_key, parse_model

SCHEMA_VERSION = 1
BATCHES = (2, 8)
"""The two batch sizes the census steps at (batch norm needs more than one sample)."""
PHASES = ("fw", "bw", "opt")
CLASSES = ("conv", "matmul", "other")
"""Operator classes: convolutions and matrix products run on tensor cores where the
precision lets them (convolutions also in TF32 under PyTorch's defaults, matrix products
not), the rest on the vector units."""

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
}
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
    "sym_size",
    "sym_stride",
    "sym_numel",
    "is_same_size",
    "_local_scalar_dense",
}


@dataclass(frozen=True, slots=True)
class OpCensus:
    """The counted step of one model at one size with one set of training settings.

    Per operator ``i`` (in launch order): ``phase[i]`` and ``op_class[i]`` (indices into
    ``PHASES`` and ``CLASSES``), ``flops = flops0[i] + flops1[i] * B`` and ``bytes =
    bytes0[i] + bytes1[i] * B`` at batch ``B`` (float32 tensors)."""

    model: str
    size: str
    settings: TrainingSettings
    phase: tuple[int, ...]
    op_class: tuple[int, ...]
    flops0: tuple[float, ...]
    flops1: tuple[float, ...]
    bytes0: tuple[float, ...]
    bytes1: tuple[float, ...]
    n_parameters: int
    gradient_bytes: int
    bucket_sizes: tuple[int, ...]
    bucket_params: tuple[int, ...]
    bucket_ready_op: tuple[int, ...]
    """Per bucket (DDP's reduction order): the index, among the backward operators, of the
    last one before the bucket's last gradient was ready."""
    bucket_cap_bytes: int
    first_bucket_cap_bytes: int
    saved_bytes0: float
    saved_bytes1: float
    """Tensors the forward pass saves for the backward pass: fixed and per sample."""
    device: str
    """Where it was counted: ``meta`` or ``cpu``."""
    torch_version: str
    created_at: str
    saved_low_bytes0: float = -1.0
    saved_low_bytes1: float = -1.0
    """The same tensors as autocast keeps them in a bf16 or fp16 step (2-byte outputs of its
    lower-precision operators and what follows from them alone; its float32 operators'
    outputs at 4): fixed and per sample. -1 in a census counted before the fields (not
    known: ``saved_bytes`` for every precision)."""
    unit_parameters: tuple[int, ...] = ()
    """Trainable parameters of the root's own, then of each unit FSDP shards as one
    (``sharding.units.unit_parameters``): what the planner's sharded strategies hold and
    gather. Empty in a census counted before the field (not known)."""

    def __post_init__(self) -> None:
        n = len(self.phase)
        if not all(
            len(x) == n for x in (self.op_class, self.flops0, self.flops1, self.bytes0, self.bytes1)
        ):
            raise ConfigError("census: per-operator columns differ in length")
        if not (len(self.bucket_sizes) == len(self.bucket_params) == len(self.bucket_ready_op)):
            raise ConfigError("census: per-bucket columns differ in length")

    @property
    def key(self) -> str:
        return f"{self.model}/{self.size}{self.settings.suffix}"

    def saved_bytes(self, precision: str) -> tuple[float, float]:
        """(fixed, per sample) bytes the forward pass saves for the backward pass in a step
        at ``precision``: autocast's widths for ``bf16``/``fp16`` where the census counted
        them, else the float32 tensors'."""
        if precision in ("bf16", "fp16") and self.saved_low_bytes1 >= 0:
            return self.saved_low_bytes0, self.saved_low_bytes1
        return self.saved_bytes0, self.saved_bytes1

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "model": self.model,
            "size": self.size,
            "settings": self.settings.to_dict(),
            "phase": list(self.phase),
            "op_class": list(self.op_class),
            "flops0": list(self.flops0),
            "flops1": list(self.flops1),
            "bytes0": list(self.bytes0),
            "bytes1": list(self.bytes1),
            "n_parameters": self.n_parameters,
            "gradient_bytes": self.gradient_bytes,
            "bucket_sizes": list(self.bucket_sizes),
            "bucket_params": list(self.bucket_params),
            "bucket_ready_op": list(self.bucket_ready_op),
            "bucket_cap_bytes": self.bucket_cap_bytes,
            "first_bucket_cap_bytes": self.first_bucket_cap_bytes,
            "saved_bytes0": self.saved_bytes0,
            "saved_bytes1": self.saved_bytes1,
            "saved_low_bytes0": self.saved_low_bytes0,
            "saved_low_bytes1": self.saved_low_bytes1,
            "device": self.device,
            "torch_version": self.torch_version,
            "created_at": self.created_at,
            "unit_parameters": list(self.unit_parameters),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OpCensus:
        if d.get("schema_version") != SCHEMA_VERSION:
            raise ConfigError(
                f"census schema_version {d.get('schema_version')!r}, expected {SCHEMA_VERSION}"
            )
        try:
            return cls(
                model=str(d["model"]),
                size=str(d["size"]),
                settings=TrainingSettings.from_dict(d.get("settings")),
                phase=tuple(int(x) for x in d["phase"]),
                op_class=tuple(int(x) for x in d["op_class"]),
                flops0=tuple(float(x) for x in d["flops0"]),
                flops1=tuple(float(x) for x in d["flops1"]),
                bytes0=tuple(float(x) for x in d["bytes0"]),
                bytes1=tuple(float(x) for x in d["bytes1"]),
                n_parameters=int(d["n_parameters"]),
                gradient_bytes=int(d["gradient_bytes"]),
                bucket_sizes=tuple(int(x) for x in d["bucket_sizes"]),
                bucket_params=tuple(int(x) for x in d["bucket_params"]),
                bucket_ready_op=tuple(int(x) for x in d["bucket_ready_op"]),
                bucket_cap_bytes=int(d["bucket_cap_bytes"]),
                first_bucket_cap_bytes=int(d["first_bucket_cap_bytes"]),
                saved_bytes0=float(d["saved_bytes0"]),
                saved_bytes1=float(d["saved_bytes1"]),
                saved_low_bytes0=float(d.get("saved_low_bytes0", -1.0)),
                saved_low_bytes1=float(d.get("saved_low_bytes1", -1.0)),
                device=str(d["device"]),
                torch_version=str(d["torch_version"]),
                created_at=str(d["created_at"]),
                unit_parameters=tuple(int(x) for x in d.get("unit_parameters", ())),
            )
        except KeyError as exc:
            raise ConfigError(f"census is missing field {exc.args[0]!r}") from exc

    @classmethod
    def from_json(cls, text: str) -> OpCensus:
        return cls.from_dict(json.loads(text))


def op_class_of(name: str) -> int:
    """The ``CLASSES`` index of the ATen operator ``name`` (its overload packet's name)."""
    if name in _CONV:
        return CLASSES.index("conv")
    if name in _MATMUL:
        return CLASSES.index("matmul")
    return CLASSES.index("other")


# ----------------------------------------------------------------------------- counting
def take_census(
    model: str,
    size: str = "full",
    settings: TrainingSettings = DEFAULT_SETTINGS,
    *,
    seed: int = 0,
) -> OpCensus:
    """Count one training step of ``model`` (any ``workloads`` reference) at ``size`` with
    ``settings``' optimizer, on ``meta`` (or, where the step reads a value, on the CPU)."""
    import torch

    device = "meta"
    try:
        a, b = (_count(model, size, settings, n, seed, device) for n in BATCHES)
    except (NotImplementedError, RuntimeError):  # the step reads a value: count it for real
        device = "cpu"
        a, b = (_count(model, size, settings, n, seed, device) for n in BATCHES)
    if [(o[0], o[1]) for o in a.ops] != [(o[0], o[1]) for o in b.ops]:
        raise ConfigError(
            f"census of {model}/{size}: the step launches different operators at batch "
            f"{BATCHES[0]} and {BATCHES[1]}; its cost is not linear in the batch"
        )
    span = float(BATCHES[1] - BATCHES[0])
    flops1 = [max(0.0, (y[2] - x[2]) / span) for x, y in zip(a.ops, b.ops, strict=True)]
    bytes1 = [max(0.0, (y[3] - x[3]) / span) for x, y in zip(a.ops, b.ops, strict=True)]
    flops0 = [max(0.0, x[2] - s * BATCHES[0]) for x, s in zip(a.ops, flops1, strict=True)]
    bytes0 = [max(0.0, x[3] - s * BATCHES[0]) for x, s in zip(a.ops, bytes1, strict=True)]
    saved1 = max(0.0, (b.saved - a.saved) / span)
    low1 = max(0.0, (b.saved_low - a.saved_low) / span)
    return OpCensus(
        model=model,
        size=size,
        settings=settings,
        phase=tuple(o[0] for o in a.ops),
        op_class=tuple(o[1] for o in a.ops),
        flops0=tuple(flops0),
        flops1=tuple(flops1),
        bytes0=tuple(bytes0),
        bytes1=tuple(bytes1),
        n_parameters=a.n_parameters,
        gradient_bytes=a.gradient_bytes,
        bucket_sizes=a.bucket_sizes,
        bucket_params=a.bucket_params,
        bucket_ready_op=a.bucket_ready_op,
        bucket_cap_bytes=a.bucket_cap_bytes,
        first_bucket_cap_bytes=a.first_bucket_cap_bytes,
        saved_bytes0=max(0.0, a.saved - saved1 * BATCHES[0]),
        saved_bytes1=saved1,
        saved_low_bytes0=max(0.0, a.saved_low - low1 * BATCHES[0]),
        saved_low_bytes1=low1,
        device=device,
        torch_version=str(torch.__version__),
        unit_parameters=a.unit_parameters,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


@dataclass
class _Counted:
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


def _count(
    model: str, size: str, settings: TrainingSettings, batch_size: int, seed: int, device: str
) -> _Counted:
    import torch
    from torch import distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import flop_registry

    from srifty_core.profiling.buckets import trainable
    from srifty_core.sharding.units import unit_parameters

    workload = build(model, size, seed=seed)
    dev = torch.device(device)
    workload.module.to(dev)
    workload.module.train()
    batch = tuple(t.to(dev) for t in workload.make_batch(batch_size, torch.device("cpu"), seed))
    params = trainable(workload.module)
    own = {p.untyped_storage()._cdata for p in params}
    # weights and buffers (batch norm's running statistics): autocast leaves them float32,
    # an operator's width follows its activations
    weights = {t.untyped_storage()._cdata for t in workload.module.parameters()}
    weights |= {t.untyped_storage()._cdata for t in workload.module.buffers()}
    own |= {t.untyped_storage()._cdata for t in batch}
    saved: dict[int, tuple[int, int]] = {}  # storage: (bytes, bytes of an element)
    # Under autocast (bf16/fp16): the storages that would hold 2-byte tensors. The weights'
    # 2-byte copies are not counted: FSDP2's mixed precision frees them after each unit,
    # and on the H200 the float32 count of the fixed part was already over DDP's peak.
    low: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st._cdata not in own:
            saved[st._cdata] = (st.nbytes(), t.element_size())
        return t

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
            if func.is_view or name in _NO_KERNEL:
                return out
            tensors = [
                t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)
            ]
            if self.phase == 0:
                self.widths(name, args, kwargs, out)
            flops = 0.0
            counter: Callable[..., Any] | None = flop_registry.get(func._overloadpacket)
            if counter is not None:
                flops = float(counter(*args, **kwargs, out_val=out))
            nbytes = float(sum(t.numel() * t.element_size() for t in tensors))
            self.ops.append((self.phase, op_class_of(name), flops, nbytes))
            self.backward_ops += self.phase == 1
            return out

        @staticmethod
        def widths(name: str, args: Any, kwargs: Any, out: Any) -> None:
            """What autocast would make of this forward operator's outputs: 2-byte for
            its lower-precision list, 4-byte for its float32 list, else 2-byte when every
            floating activation it reads is (weights follow their input, as batch norm's
            do)."""
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
                        low.add(c)
                    else:
                        low.discard(c)

    ready: dict[int, int] = {}
    census = Census()

    def hook_for(i: int) -> Callable[[torch.Tensor], None]:
        def hook(_: torch.Tensor) -> None:
            if i not in ready:
                ready[i] = max(0, census.backward_ops - 1)

        return hook

    handles = [p.register_post_accumulate_grad_hook(hook_for(i)) for i, p in enumerate(params)]
    optimizer = make_optimizer(settings, params, lr=0.01)
    for group in optimizer.param_groups:  # as on CUDA: one multi-tensor kernel per update
        group["foreach"] = True
    try:
        with census:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = workload.loss(batch)
            census.phase = 1
            loss.backward()
        optimizer.step()  # the first step makes the optimizer's state; the census times the next
        with census:
            census.phase = 2
            optimizer.step()
    finally:
        for h in handles:
            h.remove()
    for i in range(len(params)):  # a hook that did not fire (a tied weight on meta): last
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
    return _Counted(
        ops=census.ops,
        saved=float(sum(n for n, _ in saved.values())),
        saved_low=float(
            sum(n * 2 // w if c in low and w > 2 else n for c, (n, w) in saved.items())
        ),
        n_parameters=sum(p.numel() for p in params),
        gradient_bytes=sum(size_of),
        bucket_sizes=tuple(sum(size_of[i] for i in m) for m in members),
        bucket_params=tuple(len(m) for m in members),
        bucket_ready_op=tuple(max(ready[i] for i in m) for m in members),
        bucket_cap_bytes=DEFAULT_BUCKET_CAP_BYTES,
        first_bucket_cap_bytes=DEFAULT_FIRST_BUCKET_BYTES,
        unit_parameters=unit_parameters(workload.module),
    )


# ----------------------------------------------------------------------------- storage
SHIPPED_DIR = Path(__file__).resolve().parent.parent / "shipped" / "census"


def census_path(root: Path, model: str, size: str, settings: TrainingSettings) -> Path:
    """Where the profile store ``root`` keeps the census (beside the model's profiles)."""
    return model_folder(root, model, size) / f"census{settings.suffix}.json"


def shipped_census_path(model: str, size: str, settings: TrainingSettings) -> Path:
    return SHIPPED_DIR / f"{model_key(model)}-{size}{settings.suffix}.json"


def load_census(
    model: str,
    size: str,
    settings: TrainingSettings = DEFAULT_SETTINGS,
    *,
    root: Path | None = None,
    count: bool = True,
) -> OpCensus:
    """The census of ``model``/``size`` with ``settings``: the store's, else the shipped
    one, else (``count``) taken now and kept in the store. Without torch (a planner-only
    install) a model with neither is a ``ConfigError`` saying how to make it."""
    root = root or paths.profiles_dir()
    for path in (
        census_path(root, model, size, settings),
        shipped_census_path(model, size, settings),
    ):
        if path.is_file():
            try:
                found = OpCensus.from_json(path.read_text(encoding="utf-8"))
            except (ValueError, KeyError, TypeError) as exc:  # a schema ConfigError too
                raise ConfigError(
                    f"{path}: not an operator census ({exc}); delete it to count it again"
                ) from exc
            # one counted before autocast's widths: counted again where torch is here
            if (
                found.saved_low_bytes1 >= 0
                or not count
                or importlib.util.find_spec("torch") is None
            ):
                return found
            break
    command = f"python -m srifty_core.profiling.census --model {model} --size {size}"
    if settings.optimizer != "sgd":
        command += f" --optimizer {settings.optimizer}"
    if not count:
        raise ConfigError(f"no operator census of {model}/{size}; run `{command}`")
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            f"no operator census of {model}/{size} and no torch here to count it: run "
            f"`{command}` where the worker extra is installed, with the same data folder"
        ) from exc
    census = (
        count_in_child(model, size, settings)
        if is_user_code(model)
        else take_census(model, size, settings)
    )
    write_text_atomic(census_path(root, model, size, settings), census.to_json())
    return census


def stored_unit_parameters(
    model: str, size: str, settings: TrainingSettings, *, root: Path | None = None
) -> tuple[int, ...]:
    """The FSDP units of ``model``/``size`` from a census already counted (the store's or
    the shipped one, under either optimizer: units do not depend on settings); ``()`` where
    none has them. Never counts: planning a model that fits needs no census."""
    for optimizer in dict.fromkeys((settings.optimizer, "sgd", "adamw")):
        try:
            census = load_census(
                model, size, TrainingSettings(optimizer=optimizer), root=root, count=False
            )
        except ConfigError:
            continue
        if census.unit_parameters:
            return census.unit_parameters
    return ()


def is_user_code(model: str) -> bool:
    """Whether counting ``model`` runs code the caller did not write: a factory in a file
    or a module. Zoo names and ``hf:`` configs are data (a stored name is no reference)."""
    try:
        return parse_model(model).kind in ("file", "module")
    except ModelRefError:
        return False


def count_in_child(model: str, size: str, settings: TrainingSettings) -> OpCensus:
    """``take_census`` in a child interpreter (``python -m srifty_core.profiling.census
    --out``) with a worker's environment (``worker_env.scrubbed``: none of this process's
    secrets) in this working directory: how planning counts a user's factory. It ends when
    this process does. A failure is one ``ConfigError`` line naming the model."""
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="srifty-census-") as tmp:
        out = Path(tmp) / "census.json"
        argv = [sys.executable, "-m", "srifty_core.profiling.census", "--model", model]
        argv += ["--size", size, "--settings", json.dumps(settings.to_dict()), "--out", str(out)]
        proc = subprocess.run(
            argv,
            env={**scrubbed(), **caller_env()},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            check=False,
        )
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        if proc.returncode != 0 or not out.is_file():
            last = lines[-1] if lines else "(no message)"
            prefix = "python -m srifty_core.profiling.census: error: "
            if proc.returncode == 2 and last.startswith(prefix):
                raise ConfigError(last.removeprefix(prefix))  # already one line naming it
            how = f"exit code {proc.returncode}" if proc.returncode else "exit code 0, no census"
            raise ConfigError(
                f"model: counting the operators of {model} in a child process failed "
                f"({how}): {last}"
            )
        try:
            return OpCensus.from_json(out.read_text(encoding="utf-8"))
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(
                f"model: counting the operators of {model} gave no census ({exc})"
            ) from exc


SHIPPED_MODELS = (
    ("resnet18", "sgd"),
    ("resnet50", "sgd"),
    ("vgg16", "sgd"),
    ("alexnet", "sgd"),
    ("inception_v3", "sgd"),
    ("shufflenet_v2", "sgd"),
    ("bert_base", "sgd"),
    ("bert_base", "adamw"),
    ("xlm", "adamw"),
    ("dlrm", "sgd"),
    ("srifty_core.profiling.reference_models:bert_base_squad", "adamw"),
    ("hf:gpt2-xl", "adamw"),
)
"""The censuses the package ships (``full`` size): the zoo's, with the optimizer each is
usually trained with (BERT both), the published benchmarks' networks
(``reference_models``), and GPT-2 XL's decoder (no 16-24 GB GPU holds its AdamW state: the
sharded strategies' example; counting it builds 1.6 B parameters, about a minute)."""


def ship() -> list[Path]:
    """Take every ``SHIPPED_MODELS`` census anew into ``shipped/census/``."""
    out = []
    for model, optimizer in SHIPPED_MODELS:
        settings = TrainingSettings(optimizer=optimizer)
        census = take_census(model, "full", settings)
        out.append(
            write_text_atomic(shipped_census_path(model, "full", settings), census.to_json())
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m srifty_core.profiling.census``: take a model's census into the profile
    store (or, ``--ship``, the package's)."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m srifty_core.profiling.census", description=main.__doc__
    )
    ap.add_argument(
        "--model", help="a model reference (zoo name, module:factory, file.py:factory, hf:NAME)"
    )
    ap.add_argument("--size", default="full", help="size preset (default: full)")
    ap.add_argument("--optimizer", default="sgd", choices=("sgd", "adamw"), help="default: sgd")
    ap.add_argument("--ship", action="store_true", help="retake the package's shipped censuses")
    ap.add_argument(
        "--out", type=Path, help="write the census to this file instead of the profile store"
    )
    ap.add_argument("--settings", help=argparse.SUPPRESS)  # count_in_child: all the settings
    args = ap.parse_args(argv)
    die_with_caller()  # a child of count_in_child ends with its caller
    if args.ship:
        for path in ship():
            print(path)
        return 0
    if not args.model:
        ap.error("--model is required (or --ship)")
    try:
        settings = (
            TrainingSettings.from_dict(json.loads(args.settings))
            if args.settings
            else TrainingSettings(optimizer=args.optimizer)
        )
        model_key(args.model)  # a bad reference is one line before anything is built
        census = take_census(args.model, args.size, settings)
    except ConfigError as exc:
        ap.exit(2, f"{ap.prog}: error: {exc}\n")
    path = args.out or census_path(paths.profiles_dir(), args.model, args.size, settings)
    write_text_atomic(path, census.to_json())
    print(f"{path}: {len(census.phase)} operators, {census.n_parameters} parameters")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
