"""Operator census: what one training step of a model asks of a device, counted without
running it on that device.

The model is built as a profile would build it (``workloads.build``), its parameters made
on PyTorch's ``meta`` device (shapes and dtypes, no data, no arithmetic; a tied weight
stays one parameter) and stepped under a dispatch
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

import dataclasses
import importlib.util
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from srifty_core import paths
from srifty_core.atomic import write_text_atomic
from srifty_core.errors import ConfigError
from srifty_core.lifetime import caller_env, die_with_caller
from srifty_core.profiling.census_count import CLASSES as CLASSES
from srifty_core.profiling.census_count import check_cpu_room, count, counted_precision, peak_hull
from srifty_core.profiling.layout import model_folder
from srifty_core.training_settings import (
    AUTOCAST,
    DEFAULT_SETTINGS,
    OPTIMIZERS,
    PRECISIONS,
    TrainingSettings,
)
from srifty_core.worker_env import scrubbed
from srifty_core.workloads import ModelRefError, model_key, parse_model

SCHEMA_VERSION = 1
OLD_CLASSES = CLASSES[:3]
"""The operator classes of a census counted before ``OpCensus.classes`` (batch
normalisation among ``other``)."""
BATCHES = (2, 8)
"""The two batch sizes the census steps at (batch norm needs more than one sample)."""
PHASES = ("fw", "bw", "opt")


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
    writes_counted: bool = False
    """Whether an operator that updates tensors in place and returns nothing (the
    optimizers' multi-tensor passes) counts what it writes; ``False`` in a census counted
    before the field (its optimizer step's bytes are what it reads alone)."""
    classes: tuple[str, ...] = OLD_CLASSES
    """The ``CLASSES`` its ``op_class`` indexes (each one's index is kept when a class is
    added): what the census was counted with."""
    peak_bytes0: float = -1.0
    peak_bytes1: float = -1.0
    """The most bytes the forward and backward passes' operators held at once (saved
    tensors, transients such as the logits' gradient, gradients as they accumulate; at the
    counted widths), fixed and per sample; -1 where not counted."""
    peak_lines: tuple[tuple[float, float], ...] = ()
    peak_low_lines: tuple[tuple[float, float], ...] = ()
    """What the passes hold at each moment of the step (after each allocation), a line
    ``fixed + per_sample * B`` a moment, reduced to those on top at some batch (``peak_hull``):
    the most held at batch ``B`` is the largest line there. At the counted widths, then at
    autocast's (as ``saved_low_bytes``; the gradients float32). Empty where not counted.
    B_max reads them beside the saved tensors (``roofline_profile.batch_limit``)."""
    attention_calls: int = -1
    """``F.scaled_dot_product_attention`` calls in the step (-1: not counted). A census of
    a step without any is the same in fp32 and in autocast's 16 bits (``load_census``)."""
    ties_kept: bool = False
    """Whether a weight two modules share (tied embeddings) was counted once; ``False`` in a
    census counted before the field (on meta, counted once per module)."""

    def __post_init__(self) -> None:
        n = len(self.phase)
        if not all(
            len(x) == n for x in (self.op_class, self.flops0, self.flops1, self.bytes0, self.bytes1)
        ):
            raise ConfigError("census: per-operator columns differ in length")
        if not (len(self.bucket_sizes) == len(self.bucket_params) == len(self.bucket_ready_op)):
            raise ConfigError("census: per-bucket columns differ in length")
        if self.classes != CLASSES[: len(self.classes)] or max(self.op_class, default=0) >= len(
            self.classes
        ):
            raise ConfigError(
                f"census: operator classes {list(self.classes)} are not this version's "
                f"({', '.join(CLASSES)}); count it again"
            )

    @property
    def current(self) -> bool:
        """Whether it was counted as ``take_census`` counts today (else a store counts it
        again where torch is, and serves it as it is where torch is not)."""
        return (
            self.saved_low_bytes1 >= 0
            and bool(self.peak_low_lines)
            and self.attention_calls >= 0
            and self.writes_counted
            and self.classes == CLASSES
            and self.ties_kept
        )

    @property
    def key(self) -> str:
        return f"{self.model}/{self.size}{self.settings.suffix}"

    def saved_bytes(self, precision: str) -> tuple[float, float]:
        """(fixed, per sample) bytes the forward pass saves for the backward pass in a step
        at ``precision``: autocast's widths for ``bf16``/``fp16`` where the census counted
        them, else the float32 tensors'."""
        if precision in AUTOCAST and self.saved_low_bytes1 >= 0:
            return self.saved_low_bytes0, self.saved_low_bytes1
        return self.saved_bytes0, self.saved_bytes1

    def held_lines(self, precision: str) -> tuple[tuple[float, float], ...]:
        """``peak_lines`` at ``precision``'s widths (as ``saved_bytes`` picks them); empty
        where the census did not count them."""
        return self.peak_low_lines if precision in AUTOCAST else self.peak_lines

    def held_at(self, precision: str, batch: float) -> float | None:
        """The most the passes hold at once at ``batch`` (``held_lines``' largest there);
        ``None`` where not counted."""
        lines = self.held_lines(precision)
        return max(a + b * batch for a, b in lines) if lines else None

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
            "writes_counted": self.writes_counted,
            "classes": list(self.classes),
            "peak_bytes0": self.peak_bytes0,
            "peak_bytes1": self.peak_bytes1,
            "peak_lines": [list(x) for x in self.peak_lines],
            "peak_low_lines": [list(x) for x in self.peak_low_lines],
            "attention_calls": self.attention_calls,
            "ties_kept": self.ties_kept,
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
                writes_counted=bool(d.get("writes_counted", False)),
                classes=tuple(str(c) for c in d.get("classes", OLD_CLASSES)),
                peak_bytes0=float(d.get("peak_bytes0", -1.0)),
                peak_bytes1=float(d.get("peak_bytes1", -1.0)),
                peak_lines=_lines(d.get("peak_lines", ())),
                peak_low_lines=_lines(d.get("peak_low_lines", ())),
                attention_calls=int(d.get("attention_calls", -1)),
                ties_kept=bool(d.get("ties_kept", False)),
            )
        except KeyError as exc:
            raise ConfigError(f"census is missing field {exc.args[0]!r}") from exc

    @classmethod
    def from_json(cls, text: str) -> OpCensus:
        return cls.from_dict(json.loads(text))


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
        a, b = (count(model, size, settings, n, seed, device) for n in BATCHES)
    except (NotImplementedError, RuntimeError) as exc:  # it reads a value: count it for real
        check_cpu_room(model, size, settings, seed, exc)
        device = "cpu"
        a, b = (count(model, size, settings, n, seed, device) for n in BATCHES)
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
    peak1 = max(0.0, (b.peak - a.peak) / span)
    if len(a.timeline) != len(b.timeline):
        raise ConfigError(
            f"census of {model}/{size}: the step allocates differently at batch "
            f"{BATCHES[0]} and {BATCHES[1]}; its memory is not linear in the batch"
        )
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
        writes_counted=True,
        classes=CLASSES,
        peak_bytes0=max(0.0, a.peak - peak1 * BATCHES[0]),
        peak_bytes1=peak1,
        peak_lines=peak_hull([x[0] for x in a.timeline], [y[0] for y in b.timeline], BATCHES),
        peak_low_lines=peak_hull([x[1] for x in a.timeline], [y[1] for y in b.timeline], BATCHES),
        attention_calls=a.attention_calls,
        ties_kept=True,
    )


def _lines(raw: Any) -> tuple[tuple[float, float], ...]:
    return tuple((float(a), float(b)) for a, b in raw)


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
    stale: OpCensus | None = None  # counted before autocast's widths, the peak at them,
    # in-place writes or today's operator classes
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
            if found.current:
                return found
            stale = stale or found
    if settings.precision == "bf16":  # autocast's: the fp32 census where no attention fuses
        try:
            wide = load_census(
                model, size, TrainingSettings(optimizer=settings.optimizer), root=root, count=False
            )
        except ConfigError:
            wide = None
        if wide is not None and wide.current and wide.attention_calls == 0:
            return dataclasses.replace(wide, settings=settings)
    torch_here = importlib.util.find_spec("torch") is not None
    if stale is not None and not (count and torch_here):
        return stale  # as it was counted until it is counted again
    command = f"python -m srifty_core.profiling.census --model {model} --size {size}"
    if settings.optimizer != "sgd":
        command += f" --optimizer {settings.optimizer}"
    if settings.precision != "fp32":
        command += f" --precision {settings.precision}"
    if not count:
        raise ConfigError(f"no operator census of {model}/{size}; run `{command}`")
    if not torch_here:
        raise ConfigError(
            f"no operator census of {model}/{size} and no torch here to count it: run "
            f"`{command}` where the worker extra is installed, with the same data folder"
        )
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
    the shipped one, at ``settings``' precision or fp32, under either optimizer: units do
    not depend on settings); ``()`` where none has them. Never counts."""
    for precision in dict.fromkeys((settings.precision, "fp32")):
        for optimizer in dict.fromkeys((settings.optimizer, "sgd", "adamw")):
            at = TrainingSettings(optimizer=optimizer, precision=precision)
            try:
                census = load_census(model, size, at, root=root, count=False)
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
    ("srifty_core.profiling.reference_models:bert_large_squad", "adamw"),
    ("srifty_core.profiling.reference_models:resnext101_32x4d", "sgd"),
    ("srifty_core.profiling.reference_models:gpt2_from_scratch", "adamw"),
    ("srifty_core.profiling.reference_models:gpt2_from_scratch", "adamw_fused"),
    ("srifty_core.profiling.reference_models:gpt2_from_scratch", "adamw_fused", "bf16-true"),
    ("srifty_core.profiling.reference_models:gpt2_torch_layers", "adamw_fused", "bf16-true"),
    ("srifty_core.profiling.reference_models:gpt2_sdpa", "adamw_fused", "bf16-true"),
    ("hf:gpt2-xl", "adamw"),
    ("hf:gpt2-xl", "adamw", "bf16-true"),
    # autocast's 16 bits where the step calls attention (fused there: ``census_attention``)
    ("bert_base", "sgd", "bf16"),
    ("bert_base", "adamw", "bf16"),
    ("hf:gpt2-xl", "adamw", "bf16"),
)
"""The censuses the package ships (``full`` size; model, optimizer and, where it is not
fp32, the precision): the zoo's, with the optimizer each is usually trained with (BERT
both), the published benchmarks' networks (``reference_models``; the decoder's later
programs in bf16-true, as published), and GPT-2 XL's decoder (no 16-24 GB GPU holds its
AdamW state in autocast: the sharded strategies' example; in bf16-true one A10G does;
its parameters made on meta, counting it takes seconds); in autocast's bf16/fp16 the models
whose step calls attention (the others' fp32 census serves: ``load_census``)."""


def shipped_settings(how: Sequence[str]) -> TrainingSettings:
    """The settings of a ``SHIPPED_MODELS`` entry's (optimizer[, precision])."""
    return TrainingSettings(optimizer=how[0], precision=how[1] if len(how) > 1 else "fp32")


def ship() -> list[Path]:
    """Take every ``SHIPPED_MODELS`` census anew into ``shipped/census/``."""
    out = []
    for model, *how in SHIPPED_MODELS:
        settings = shipped_settings(how)
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
    ap.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS, help="default: sgd")
    ap.add_argument(
        "--precision",
        default="fp32",
        choices=PRECISIONS,
        help="default: fp32; bf16-true is counted cast to bf16, bf16 and fp16 as one bf16 "
        "census with attention fused (the roofline applies the widths)",
    )
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
            else TrainingSettings(
                optimizer=args.optimizer, precision=counted_precision(args.precision)
            )
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
