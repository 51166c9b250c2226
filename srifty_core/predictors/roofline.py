"""Compute latency on a GPU nobody profiled: an operator roofline over the model's census,
with efficiencies learned from measurements.

Contract: ``learn(observations)`` returns a ``Roofline`` (``Efficiencies`` fitted to every
measured time, the held-out spreads ``specs_cv`` and ``scaled_cv``, ``carry``);
``op_times``/``pass_times`` are its predictions for a census on a ``DeviceSpec`` (a GPU's
sheet). The profile built from it: ``profiling.roofline_profile``.

Imports ``profiling.census`` for annotations; numpy and SciPy, no torch.

How and why (the roofline, what is learned, the two paths): docs/design/compute.md#roofline
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from srifty_core.errors import ConfigError
from srifty_core.training_settings import AUTOCAST

if TYPE_CHECKING:
    from srifty_core.catalog.types import GpuSpec
    from srifty_core.profiling.census import OpCensus

MODES = ("fp32", "tf32", "amp", "pure16")
"""``fp32``: PyTorch's defaults (convolutions in TF32 where the GPU has it, matrix products
in FP32); ``tf32``: both in TF32 (NVIDIA's containers); ``amp``: both in FP16/BF16 under
autocast (the activations' bytes a learned share, ``Efficiencies.half_bytes``, of the
float32 census's); ``pure16``: both in BF16 with every tensor 2-byte (``bf16-true``: the
census was counted at those widths, so its bytes stand as counted)."""
CLASS_OTHER = 2
"""``census.CLASSES.index("other")``: the operators with no counted FLOPs."""
CLASS_NORM = 3
"""``census.CLASSES.index("norm")``: batch normalisation (memory-bound, several passes)."""

MEMORY_HEADROOM = 0.9
"""Share of a GPU's usable memory a batch may fill (the CUDA context, cuDNN's workspaces
and the allocator's fragmentation take the rest)."""
MAX_BATCH = 4096
"""Largest local batch an estimate offers (the profiler's GPU searches stop near here)."""


def mode_of(precision: str, tf32: bool = False) -> str:
    """The roofline mode of a training setting's precision (``fp32``, ``fp16``, ``bf16``,
    ``bf16-true``) and its ``tf32`` switch: ``amp`` for autocast's, ``pure16`` for a bf16
    model, else ``tf32`` when it is on."""
    if precision == "bf16-true":
        return "pure16"
    if precision in AUTOCAST:
        return "amp"
    return "tf32" if tf32 else "fp32"


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """What the roofline reads of a GPU's sheet: peaks in FLOP/s, bandwidth in bytes/s."""

    name: str
    fp32_flops: float
    memory_bytes_per_s: float
    memory_gib: float
    tf32_flops: float | None = None
    fp16_flops: float | None = None
    """FP16/BF16 dense tensor-core peak, else the vector units' FP16 peak."""
    variant: str = ""
    model: str = ""
    """The GPU model (``A100``) where ``name`` is a variant's device type (``A100-80GB``)."""

    @property
    def chip(self) -> str:
        """The GPU model: what a held-out split leaves out whole (two variants of one
        chip are one GPU to it)."""
        return self.model or self.name

    @classmethod
    def from_gpu(cls, gpu: GpuSpec, memory_gib: float) -> DeviceSpec:
        if gpu.memory_bw_gbs is None:
            raise ConfigError(f"{gpu.model}: the catalog has no memory bandwidth for it")
        return cls(
            name=gpu.device_type or gpu.model,
            model=gpu.model,
            fp32_flops=gpu.fp32_tflops * 1e12,
            memory_bytes_per_s=gpu.memory_bw_gbs * 1e9,
            memory_gib=memory_gib,
            tf32_flops=gpu.tf32_tflops * 1e12 if gpu.tf32_tflops else None,
            fp16_flops=gpu.fp16_tflops * 1e12 if gpu.fp16_tflops else None,
            variant=gpu.variant,
        )

    def units(self, mode: str) -> tuple[tuple[float, str], tuple[float, str]]:
        """(peak FLOP/s, unit) of a convolution and of a matrix product in ``mode``; the
        unit is one of ``UNITS``. A 16-bit figure at most twice the FP32 one is the vector
        units' (they do at most two FP16 operations per FP32 one; tensor cores four or more):
        the sheet has no tensor figure, so ``amp`` is costed on the vector units."""
        if mode not in MODES:
            raise ConfigError(f"mode: one of {', '.join(MODES)}, got {mode!r}")
        simt = (self.fp32_flops, "simt")
        if mode in ("amp", "pure16"):
            half = self.fp16_flops or 0.0
            if half <= 2 * self.fp32_flops:  # no tensor figure on the sheet
                simt = (max(half, self.fp32_flops), "simt")
                return simt, simt
            return (half, "half"), (half, "half")
        tf32 = (self.tf32_flops, "tf32") if self.tf32_flops else simt
        return tf32, (tf32 if mode == "tf32" else simt)

    def peaks(self, mode: str) -> tuple[float, float, float]:
        """(convolution, matrix product, other) peak FLOP/s in ``mode``."""
        (conv, _), (mm, _) = self.units(mode)
        return conv, mm, self.fp32_flops


UNITS = ("simt", "tf32", "half")
"""Where a convolution or matrix product runs: the FP32 vector units, the TF32 tensor cores,
the FP16/BF16 tensor cores (``DeviceSpec.units``)."""


@dataclass(frozen=True, slots=True)
class Efficiencies:
    """The learned part: the share of its peak each unit reaches on a matrix product
    (``simt``, ``tf32``, ``half``), a convolution's rate relative to a matrix product's on
    the same unit (it can pass 1: cuDNN's Winograd and FFT algorithms do fewer
    multiplications than the direct count), the share of the memory bandwidth reached, the
    bytes of a 16-bit step relative to a 32-bit one, the cost of one operator in each pass,
    the bytes a fused implementation's elementwise operators move relative to eager's
    (``Observation.fused``; evidence only), the bytes batch normalisation moves
    relative to what the census counts (its kernels pass over a tensor more than once), and
    the seconds a sample adds to a published step beyond its passes, the same on every GPU
    (the input pipeline and host work of a benchmark's loop; evidence only: an estimate is
    of the passes srifty's profiler times, on batches already on the device)."""

    simt: float = 0.8
    tf32: float = 0.4
    half: float = 0.4
    conv: float = 1.0
    memory: float = 0.7
    half_bytes: float = 0.6
    launch_fw_s: float = 3e-5
    launch_bw_s: float = 5e-5
    fused: float = 1.0
    norm: float = 1.0
    host_s: float = 1e-6

    def as_log(self) -> NDArray[np.float64]:
        return np.log([getattr(self, f) for f in self.__slots__])

    @classmethod
    def from_log(cls, x: Sequence[float] | NDArray[np.float64]) -> Efficiencies:
        v = np.exp(np.asarray(x, dtype=np.float64))
        return cls(*(float(a) for a in v))

    def to_dict(self) -> dict[str, float]:
        return {f: float(getattr(self, f)) for f in self.__slots__}

    @classmethod
    def from_dict(cls, d: Mapping[str, float]) -> Efficiencies:
        return cls(**{f: float(d[f]) for f in cls.__slots__})

    def unit(self, name: str) -> float:
        return float(getattr(self, name))


_LOWER = np.log([1e-2, 1e-2, 1e-2, 0.1, 1e-2, 0.25, 1e-7, 1e-7, 0.05, 1.0, 1e-9])
_UPPER = np.log([4.0, 2.0, 2.0, 4.0, 1.0, 1.0, 1e-3, 1e-3, 2.0, 5.0, 1e-2])


class _Ops:
    """A census as arrays, per phase (cached per census object)."""

    def __init__(self, census: OpCensus) -> None:
        phase = np.asarray(census.phase, dtype=np.int64)
        cls = np.asarray(census.op_class, dtype=np.int64)
        f0, f1 = np.asarray(census.flops0), np.asarray(census.flops1)
        m0, m1 = np.asarray(census.bytes0), np.asarray(census.bytes1)
        self.parts = []
        for k in range(3):
            sel = phase == k
            self.parts.append((cls[sel], f0[sel], f1[sel], m0[sel], m1[sel]))
        self.param_bytes = float(census.gradient_bytes)
        self.ready_op = np.asarray(census.bucket_ready_op, dtype=np.int64)


_OPS_CACHE: dict[int, tuple[Any, _Ops]] = {}


def _ops(census: OpCensus) -> _Ops:
    hit = _OPS_CACHE.get(id(census))
    if hit is None or hit[0] is not census:
        hit = (census, _Ops(census))
        _OPS_CACHE[id(census)] = hit
    return hit[1]


def op_times(
    census: OpCensus,
    device: DeviceSpec,
    mode: str,
    eff: Efficiencies,
    batch: float,
    phase: int,
    fused: bool = False,
) -> NDArray[np.float64]:
    """Each operator's time (s) of ``phase`` (0 forward, 1 backward, 2 optimizer step) at
    ``batch`` on ``device``; ``fused``: in an implementation that fuses the elementwise
    operators (``Observation.fused``)."""
    cls, f0, f1, m0, m1 = _ops(census).parts[phase]
    (conv, conv_unit), (mm, mm_unit) = device.units(mode)
    rate = np.array(
        [
            conv * eff.unit(conv_unit) * eff.conv,
            mm * eff.unit(mm_unit),
            device.fp32_flops * eff.memory,  # no FLOPs are counted for them
            device.fp32_flops * eff.memory,
        ]
    )[cls]
    flops = f0 + f1 * batch
    moved = m0 + m1 * batch
    if mode == "amp" and phase < 2:  # activations in 16 bits
        moved = moved * eff.half_bytes
    if fused and phase < 2:
        moved = np.where(cls == CLASS_OTHER, moved * eff.fused, moved)
    moved = np.where(cls == CLASS_NORM, moved * eff.norm, moved)
    bandwidth = device.memory_bytes_per_s * eff.memory
    launch = eff.launch_bw_s if phase == 1 else eff.launch_fw_s
    if phase == 2:  # multi-tensor updates: memory-bound, one launch each
        out: NDArray[np.float64] = moved / bandwidth + launch
        return out
    out = np.maximum(flops / rate, moved / bandwidth) + launch
    return out


def pass_times(
    census: OpCensus,
    device: DeviceSpec,
    mode: str,
    eff: Efficiencies,
    batch: float,
    fused: bool = False,
) -> tuple[float, float, float]:
    """(forward, backward, optimizer step) seconds at ``batch``."""
    return (
        float(op_times(census, device, mode, eff, batch, 0, fused).sum()),
        float(op_times(census, device, mode, eff, batch, 1, fused).sum()),
        float(op_times(census, device, mode, eff, batch, 2, fused).sum()),
    )


# ----------------------------------------------------------------------------- fitting
@dataclass(frozen=True, slots=True)
class Observation:
    """One measured time: ``what`` is ``fw``, ``bw`` or ``step`` (forward + backward +
    optimizer step, what a published throughput's batch over samples/s gives)."""

    census: OpCensus
    device: DeviceSpec
    mode: str
    batch: int
    seconds: float
    what: str
    source: str = ""
    group: str = ""
    """What is left out together in ``held_out`` (the GPU)."""
    fused: bool = False
    """The program fuses the elementwise operators the eager census counts one by one
    (NVIDIA's BERT): their bytes are ``Efficiencies.fused`` times the census's."""

    def same_model(self, other: Observation) -> bool:
        """Whether ``other`` times the same model, precision and kind as this one."""
        return (self.census.key, self.mode, self.what) == (other.census.key, other.mode, other.what)

    def same_program(self, other: Observation) -> bool:
        """Whether ``other`` is the same program (source, model, precision, kind) as this
        one, wherever it ran: what ``scaled`` may scale from."""
        return self.same_model(other) and (self.source, self.fused) == (other.source, other.fused)


def predict(obs: Observation, eff: Efficiencies) -> float:
    fw, bw, opt = pass_times(obs.census, obs.device, obs.mode, eff, obs.batch, obs.fused)
    step = fw + bw + opt + eff.host_s * obs.batch
    return {"fw": fw, "bw": bw, "step": step}[obs.what]


def fit(observations: Sequence[Observation], start: Efficiencies | None = None) -> Efficiencies:
    """The efficiencies that minimise the squared log error over ``observations`` (each
    source weighted equally within its GPU, each GPU equally: one GPU's many rows do not
    outvote the others)."""
    from scipy.optimize import least_squares

    if not observations:
        raise ConfigError("roofline fit: no measured times to learn from")
    weights = _weights(observations)
    logs = np.log([o.seconds for o in observations])
    design = _Design(observations)

    def residuals(x: NDArray[np.float64]) -> NDArray[np.float64]:
        out: NDArray[np.float64] = (np.log(design.times(np.exp(x))) - logs) * weights
        return out

    x0 = np.clip((start or Efficiencies()).as_log(), _LOWER + 1e-9, _UPPER - 1e-9)
    res = least_squares(residuals, x0, bounds=(_LOWER, _UPPER))
    return Efficiencies.from_log(res.x)


_UNIT_INDEX = {name: i for i, name in enumerate(UNITS)}
_MEMORY = len(UNITS)
"""Index of ``Efficiencies.memory`` among the rate factors (after the units')."""


class _Design:
    """Observations as one flat array of their operators, so that the fit's residuals for
    any ``Efficiencies`` are a few numpy operations (the same sums ``predict`` makes, one
    observation at a time): what does not depend on the efficiencies (FLOPs and bytes at
    the batch, the peak and unit of each operator, which factors apply) is made once."""

    def __init__(self, observations: Sequence[Observation]) -> None:
        phases = {"fw": (0,), "bw": (1,), "step": (0, 1, 2)}
        cols: dict[str, list[NDArray[Any]]] = {
            k: []
            for k in (
                *("obs", "flops", "moved", "peak", "unit", "conv", "half", "fused", "norm"),
                *("bw", "ph"),
            )
        }
        for i, o in enumerate(observations):
            (conv, conv_unit), (mm, mm_unit) = o.device.units(o.mode)
            peaks = np.array([conv, mm, o.device.fp32_flops, o.device.fp32_flops])
            units = np.array([_UNIT_INDEX[conv_unit], _UNIT_INDEX[mm_unit], _MEMORY, _MEMORY])
            for ph in phases[o.what]:
                cls, f0, f1, m0, m1 = _ops(o.census).parts[ph]
                n = len(cls)
                cols["obs"].append(np.full(n, i))
                cols["flops"].append(f0 + f1 * o.batch)
                cols["moved"].append(m0 + m1 * o.batch)
                cols["peak"].append(peaks[cls])
                cols["unit"].append(units[cls])
                cols["conv"].append(cls == 0)
                cols["half"].append(np.full(n, o.mode == "amp" and ph < 2))
                cols["fused"].append((cls == CLASS_OTHER) & (o.fused and ph < 2))
                cols["norm"].append(cls == CLASS_NORM)
                cols["bw"].append(np.full(n, o.device.memory_bytes_per_s))
                cols["ph"].append(np.full(n, ph))
        flat = {k: np.concatenate(v) if v else np.zeros(0) for k, v in cols.items()}
        self.n = len(observations)
        self.step_batch = np.array([o.batch if o.what == "step" else 0 for o in observations])
        self.obs = flat["obs"].astype(np.int64)
        self.flops, self.moved, self.peak = flat["flops"], flat["moved"], flat["peak"]
        self.bandwidth = flat["bw"]
        self.unit = flat["unit"].astype(np.int64)
        self.conv = flat["conv"].astype(bool)
        self.half = flat["half"].astype(bool)
        self.fused = flat["fused"].astype(bool)
        self.norm = flat["norm"].astype(bool)
        self.memory_bound = flat["ph"] == 2
        self.backward = flat["ph"] == 1

    def times(self, v: NDArray[np.float64]) -> NDArray[np.float64]:
        """Each observation's predicted seconds (``predict``) under the efficiencies whose
        fields (``Efficiencies.__slots__`` order) are ``v``."""
        simt, tf32, half, conv, memory, half_bytes, launch_fw, launch_bw, fused, norm, host = v
        rate = self.peak * np.array([simt, tf32, half, memory])[self.unit]
        rate = np.where(self.conv, rate * conv, rate)
        moved = np.where(self.half, self.moved * half_bytes, self.moved)
        moved = np.where(self.fused, moved * fused, moved)
        moved = np.where(self.norm, moved * norm, moved)
        compute = np.where(self.memory_bound, 0.0, self.flops / rate)
        t = np.maximum(compute, moved / (self.bandwidth * memory))
        t = t + np.where(self.backward, launch_bw, launch_fw)
        out = np.bincount(self.obs, weights=t, minlength=self.n) + host * self.step_batch
        return np.asarray(out, dtype=np.float64)


def _weights(observations: Sequence[Observation]) -> NDArray[np.float64]:
    per_group: dict[str, int] = {}
    for o in observations:
        per_group[o.group] = per_group.get(o.group, 0) + 1
    w = np.array([1.0 / per_group[o.group] for o in observations])
    out: NDArray[np.float64] = np.sqrt(w / w.mean())
    return out


def carry_share(observations: Sequence[Observation], eff: Efficiencies) -> float:
    """The share of one GPU's departure from the roofline (log measured over predicted)
    that the same program shows on another GPU: the least-squares slope, through the
    origin, of one's log residual on the other's over every pair of ``same_program``
    observations on different GPUs, clipped to [0, 1] (1 where no pair exists)."""
    resid = [math.log(o.seconds / predict(o, eff)) for o in observations]
    num = den = 0.0
    for i, a in enumerate(observations):
        for j, b in enumerate(observations):
            if a.group != b.group and a.same_program(b):
                num += resid[i] * resid[j]
                den += resid[j] ** 2
    return min(1.0, max(0.0, num / den)) if den > 0 else 1.0


def scale(measured_s: float, source_pred_s: float, target_pred_s: float, carry: float) -> float:
    """A time on the target GPU from one measured on the source GPU: the target's
    roofline time times the share ``carry`` of the measurement's departure from the
    source's roofline time (log scale)."""
    return float(target_pred_s * (measured_s / source_pred_s) ** carry)


@dataclass(frozen=True)
class HeldOut:
    """Relative errors, (predicted - measured) / measured, of predictions made without the
    GPU they predict, per GPU left out (efficiencies fitted on the other GPUs)."""

    specs: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    """Each of its observations from its sheet alone."""
    scaled: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    """Each of its observations from every observation of the same program
    (``Observation.same_program``) on another GPU (``scale``, with the ``carry_share``
    of the other GPUs)."""
    scaled_any: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    """As ``scaled``, from every observation of the same model, precision and kind, of any
    program (another framework or harness too): a bound on what a measured profile of a
    different program tells."""
    carry: Mapping[str, float] = field(default_factory=dict)
    """The ``carry_share`` learned without the GPU."""
    specs_steps: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    """As ``specs``, of what a plan adds up: a profile's forward and backward at one batch
    as one step (their errors at small batches, where launch cost dominates, are large and
    opposite: the published steps fix a step's launch cost, not its split), a published
    step as it is."""

    def log_sd(self, path: str = "specs") -> float:
        """RMS of the log errors of ``path`` (``specs``, ``specs_steps`` or ``scaled``)
        over every GPU left out (0 with none)."""
        errs = [math.log1p(e) for v in getattr(self, path).values() for e in v]
        return float(np.sqrt(np.mean(np.square(errs)))) if errs else 0.0


def held_out(observations: Sequence[Observation]) -> HeldOut:
    """Leave each GPU (``Observation.group``) out in turn: fit on the rest, predict it
    from its sheet and scaled from each observation of the same program on the rest."""
    specs: dict[str, tuple[float, ...]] = {}
    scaled: dict[str, tuple[float, ...]] = {}
    scaled_any: dict[str, tuple[float, ...]] = {}
    carry: dict[str, float] = {}
    steps: dict[str, tuple[float, ...]] = {}
    for g in sorted({o.group for o in observations}):
        train = [o for o in observations if o.group != g]
        if not train:
            continue
        eff = fit(train)
        carry[g] = share = carry_share(train, eff)
        pred = {id(o): predict(o, eff) for o in observations}  # one prediction each
        left = [o for o in observations if o.group == g]
        specs[g] = tuple(pred[id(o)] / o.seconds - 1.0 for o in left)
        sums: dict[tuple[Any, ...], list[float]] = {}
        for o in left:
            same_batch = (o.census.key, o.device.name, o.mode, o.batch, o.source, o.fused)
            key = (id(o),) if o.what == "step" else same_batch
            acc = sums.setdefault(key, [0.0, 0.0])
            acc[0] += pred[id(o)]
            acc[1] += o.seconds
        steps[g] = tuple(p / m - 1.0 for p, m in sums.values())
        for out, same in ((scaled, True), (scaled_any, False)):
            out[g] = tuple(
                scale(src.seconds, pred[id(src)], pred[id(o)], share) / o.seconds - 1.0
                for o in left
                for src in train
                if (o.same_program(src) if same else o.same_model(src))
            )
    return HeldOut(specs, scaled, scaled_any, carry, steps)


@dataclass(frozen=True)
class Roofline:
    """A fitted roofline: the efficiencies, what they were learned from and the spreads its
    estimates carry (held out by GPU, and by network)."""

    efficiencies: Efficiencies
    observations: int
    gpus: tuple[str, ...]
    specs_cv: float
    """sd of the log error of a spec estimate's step for a GPU left out of the fit
    (``HeldOut.specs_steps``)."""
    scaled_cv: float
    """sd of the log error scaling a measured profile to another GPU (left out)."""
    carry: float = 1.0
    """``carry_share``: how much of a measured profile's departure from the roofline a
    scaled estimate keeps."""
    model_cv: float = 0.0
    """sd of the log error of a spec estimate's step for a network left out of the fit
    (each census model in turn, ``HeldOut.specs_steps``): what a network the evidence
    does not hold adds (``spec_cv``)."""
    networks: tuple[str, ...] = ()
    """The census models the evidence holds."""

    def spec_cv(self, model: str) -> float:
        """The spread of a spec estimate of ``model``: ``specs_cv``, and ``model_cv`` in
        quadrature where the evidence does not hold the network."""
        if model in self.networks or not self.networks:
            return self.specs_cv
        return math.hypot(self.specs_cv, self.model_cv)

    def to_dict(self) -> dict[str, Any]:
        return {
            "efficiencies": self.efficiencies.to_dict(),
            "observations": self.observations,
            "gpus": list(self.gpus),
            "specs_cv": self.specs_cv,
            "scaled_cv": self.scaled_cv,
            "carry": self.carry,
            "model_cv": self.model_cv,
            "networks": list(self.networks),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Roofline:
        return cls(
            Efficiencies.from_dict(d["efficiencies"]),
            int(d["observations"]),
            tuple(d["gpus"]),
            float(d["specs_cv"]),
            float(d["scaled_cv"]),
            float(d["carry"]),
            float(d["model_cv"]),
            tuple(str(m) for m in d["networks"]),
        )


def learn(observations: Sequence[Observation], held: HeldOut | None = None) -> Roofline:
    """``fit`` on every observation, with its ``carry_share`` and the spreads
    ``held_out`` measures (``held``, where the caller has it already; 0 where fewer than
    two GPUs were measured; the scaled path's is the specs' where no pair matched), and
    ``model_cv``, leaving each census model out in turn (0 with fewer than two)."""
    eff = fit(observations)
    gpus = tuple(sorted({o.group for o in observations}))
    networks = tuple(sorted({o.census.model for o in observations}))
    specs_cv = scaled_cv = model_cv = 0.0
    if len(gpus) > 1:
        held = held or held_out(observations)
        specs_cv = held.log_sd("specs_steps") or held.log_sd("specs")
        scaled_cv = held.log_sd("scaled") or specs_cv
    if len(networks) > 1:
        by_network = [replace(o, group=o.census.model) for o in observations]
        model_cv = held_out(by_network).log_sd("specs_steps")
    carry = carry_share(observations, eff)
    return Roofline(eff, len(observations), gpus, specs_cv, scaled_cv, carry, model_cv, networks)
