"""The compute profile contract: what profiling one model on one device type produces.

Consumed by the simulator and the planner. JSON round-trips exactly (floats are written
with ``repr`` precision by ``json``). No torch here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from srifty_core.errors import ConfigError
from srifty_core.predictors.compute import PiecewiseLinear
from srifty_core.training_settings import DEFAULT_SETTINGS, TrainingSettings

SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class PassStats:
    """Measured latency of one pass (forward or backward) per probed batch size."""

    batch_sizes: tuple[int, ...]
    mean_s: tuple[float, ...]
    std_s: tuple[float, ...]
    repeats: int

    def __post_init__(self) -> None:
        if not (len(self.batch_sizes) == len(self.mean_s) == len(self.std_s)):
            raise ValueError("batch_sizes, mean_s and std_s must have the same length")

    @property
    def cv(self) -> NDArray[np.float64]:
        """Coefficient of variation per batch size."""
        out: NDArray[np.float64] = np.asarray(self.std_s) / np.asarray(self.mean_s)
        return out


@dataclass(frozen=True, slots=True)
class GradientBucket:
    """One gradient bucket as DDP forms it, in the order DDP allreduces them."""

    index: int
    size_bytes: int
    n_params: int
    ready_fraction: float
    """When the bucket's last gradient is ready, as a fraction of the backward pass (0..1)."""


NO_REPLICA = "memory (estimated): no replica fits"
"""``ComputeProfile.b_max_limit`` of an estimate whose GPU holds no replica of the model's
training state (``b_max`` 0): its times reach the batches a rank holds once the state is
sharded away (``planner.fit`` bounds them)."""


@dataclass(frozen=True, slots=True)
class ComputeProfile:
    """Forward/backward latency model, memory limits and gradient schedule of one model on
    one device type."""

    model: str
    size: str
    device_type: str
    """``cpu``, or the GPU model as the catalog names it (``T4``, ``V100``, ``H100``...)."""
    device_name: str
    fw: PassStats
    bw: PassStats
    fw_fit: PiecewiseLinear
    bw_fit: PiecewiseLinear
    b_max: int
    memory_per_sample_bytes: float
    memory_fixed_bytes: float
    memory_cap_bytes: int
    n_parameters: int
    gradient_bytes: int
    buckets: tuple[GradientBucket, ...]
    bucket_cap_bytes: int
    first_bucket_cap_bytes: int
    schedule_batch_size: int
    probe_mode: str
    """``budget:K`` (K probes) or ``dense``."""
    threads: int
    torch_version: str
    created_at: str
    copy_bytes_per_s: float = 0.0
    """Device memory copy bandwidth (bytes/s) copying the gradients once, as DDP does into
    and out of its buckets; 0 where not measured (profiles older than this field)."""
    optimizer_step_s: float = 0.0
    """Seconds of one optimizer step (SGD with momentum, as the Srifty worker trains) over
    all parameters: independent of the batch; 0 where not measured (older profiles)."""
    vm_cv: float = 0.0
    """Spread of the mean step time from one VM of this device type to the next (their
    coefficient of variation), where the profile was taken on several VMs; 0 where not
    measured (one VM, one machine). The simulator's slowest VM and p90 come from it."""
    profiled_vms: int = 1
    """How many VMs the profile was taken on (``vm_cv`` is their spread)."""
    probe_checks: tuple[tuple[int, float], ...] = ()
    """``(batch, relative error)`` per check probe: what the fit of the probes before it
    predicted there, against what it then measured (``refine_batch_sizes``): held-out
    errors of t(B). Empty where the profile made no checks."""
    shared_slowdown: tuple[tuple[int, float], ...] = ()
    """``(workers, factor)`` pairs: how much slower a training step (forward and backward)
    runs when that many workers of this kind share the device, each stepping, all starting
    each step together as a job's ranks do (CPU ranks on one host share its cores, caches
    and memory bus), measured at the schedule batch against the same step alone. Empty
    where not measured (a GPU per rank, older profiles): the simulator then assumes no
    slowdown and says so."""
    ddp_overhead: tuple[tuple[int, float], ...] = ()
    """``(workers, seconds)`` pairs: what DDP adds to a training step, measured (a step of
    the model wrapped in DDP over a process group of one, the exchange replaced by a no-op
    hook, minus the same step unwrapped, in alternating rounds): its autograd hooks, the
    copies of the gradients into the buckets and back, its buffer broadcasts. At 1 worker
    alone, and at k workers with k - 1 others on the device doing the same in step with it
    (CPU ranks on one host; these passes are memory-bound, come at the same moment of
    every rank's step, and slow more than the compute does). Empty
    where not measured (older profiles): the simulator then models the passes from
    ``copy_bytes_per_s``."""
    fsdp_overhead: tuple[float, ...] = ()
    """``(forward s per unit, backward s per unit, optimizer step s)``: what FSDP2 adds to a
    step beyond its collectives, measured (a copy of the model under ``fully_shard`` over a
    two-rank process group whose collectives move nothing, minus the same step unwrapped,
    in alternating rounds;
    ``profiling.overheads.fsdp_overhead``): the pre- and post-hooks of each unit, the
    copies into and out of the all-gather and reduce-scatter buffers, the mixed-precision
    casts, the optimizer's step over DTensors. Per unit of ``sharding.units`` (the root
    counted as one), at least 0. Empty where not measured (older profiles, a profile
    taken inside a training job): the sharded simulator then adds nothing and says so."""
    fsdp_peak_margin: float | None = None
    """How far a sharded training step's measured peak rose above ``sharding.memory``'s
    per-rank model of it (a fraction, negative where the model is above), measured with
    ``fsdp_overhead`` (``profiling.overheads``) at ``schedule_batch_size``: the transient
    the planner adds to a sharded rank's modelled peak (``planner.fit``). None where not
    measured: the planner then adds the worst seen in ``benchmarks/sharded_memory.py``."""
    settings: TrainingSettings = DEFAULT_SETTINGS
    """The training settings the profile was taken with (precision, optimizer, compile,
    channels-last): a plan with other settings does not read it."""
    effective_precision: str = ""
    """The precision the steps actually ran in (a CPU computes fp32 whatever the setting,
    as CPU workers do); empty where the profile predates the field."""
    b_max_limit: str = "memory"
    """What bounds ``b_max``: ``memory`` (the device's, or the CPU cap), ``step time S s``
    (the profiler's ``max_step_s``: larger batches fit but step longer than that) or
    ``max_batch N`` (the search's ceiling)."""
    noisy: tuple[str, ...] = ()
    """Measurements whose repeats disagreed beyond the profiler's bound even after it
    re-measured them (``noise.NOISY_CV``): what to distrust, one line each."""
    estimate: str = ""
    """Empty for a measured profile; else how it was estimated without measuring this
    device (``predictors.roofline``): ``specs`` or ``scaled from <device>``."""
    estimate_cv: float = 0.0
    """The estimate's own spread (sd of its log error, held out by GPU, and by network for
    one the evidence does not hold): the simulator widens ``t_iter_p90`` by it and the
    online recalibration's prior starts that wide."""

    @property
    def estimate_note(self) -> str:
        """What a plan says of an estimated profile: ``device: how (its spread)``."""
        return f"{self.device_type}: {self.estimate} ({self.estimate_cv:.0%} held-out spread)"

    @property
    def store_key(self) -> str:
        """``model/size/device``: where the profile store keeps it, and its label in a
        workload's ``vm_evidence``."""
        return f"{self.model}/{self.size}/{self.device_type}{self.settings.suffix}"

    # ------------------------------------------------------------------ predictions
    def _check_batch(self, batch: ArrayLike) -> NDArray[np.float64]:
        b = np.asarray(batch, dtype=np.float64)
        if np.any(b < 1):
            raise ConfigError(f"batch size must be >= 1, got {batch!r}")
        if np.any(b > self.b_max):
            raise ConfigError(
                f"batch size {batch!r} exceeds B_max={self.b_max} of {self.model} "
                f"on {self.device_type}"
            )
        return b

    def t_fw(self, batch: ArrayLike) -> NDArray[np.float64]:
        """Predicted mean forward latency (s) at ``batch`` (scalar or array)."""
        return self.fw_fit(self._check_batch(batch))

    def t_bw(self, batch: ArrayLike) -> NDArray[np.float64]:
        """Predicted mean backward latency (s)."""
        return self.bw_fit(self._check_batch(batch))

    def t_iter(self, batch: ArrayLike) -> NDArray[np.float64]:
        """Predicted compute time of one iteration, forward plus backward (no communication)."""
        return self.t_fw(batch) + self.t_bw(batch)

    def std_fw(self, batch: ArrayLike) -> NDArray[np.float64]:
        """Predicted standard deviation of the forward latency."""
        return _interp_cv(self.fw, self._check_batch(batch)) * self.t_fw(batch)

    def std_bw(self, batch: ArrayLike) -> NDArray[np.float64]:
        return _interp_cv(self.bw, self._check_batch(batch)) * self.t_bw(batch)

    def host_slowdown(self, workers: int) -> float:
        """Factor on a step's time with ``workers`` workers of this kind sharing the
        device: 1 for one worker or where not measured; between measured worker counts
        interpolated linearly (from 1 at one worker); beyond the largest, extended along
        the last segment (more workers on the same cores keep slowing each other)."""
        if workers <= 1 or not self.shared_slowdown:
            return 1.0
        return _along(((1, 1.0), *self.shared_slowdown), workers)

    def ddp_passes_s(self, workers: int = 1) -> tuple[float, float]:
        """DDP's own work per step with ``workers`` sharing the device: (seconds on the
        backward thread, seconds after the last exchange).

        DDP divides each gradient by the world size while it copies it into its bucket
        (PyTorch's ``Reducer::copy_grad_to_bucket``: one ``mul_out``, "to save one scan
        over all the input parameters"), and Srifty's worker folds the division into the
        loss (``worker.exchange_timer``): no pass of its own. Measured
        (``ddp_overhead``, a no-op hook whose plain copy into the buckets costs what the
        dividing copy does): the copy back out of the buckets is the part after the
        exchange (one copy pass, at most the whole overhead), the rest ran on the backward
        thread; both slow by the measured factor with ``workers`` sharing the device. Not
        measured: two copy passes (``ddp_copy_s``), into the buckets on the backward thread
        and back out after."""
        copy = self.ddp_copy_s()
        if not self.ddp_overhead:
            return copy, copy
        slowdown = self.pass_slowdown(workers)
        overhead = dict(self.ddp_overhead)[1] * slowdown
        after = min(overhead, copy * slowdown)
        return overhead - after, after

    def pass_slowdown(self, workers: int) -> float:
        """Factor on the memory-bound passes (DDP's, the optimizer step) with ``workers``
        sharing the device: the measured ``ddp_overhead`` at ``workers`` over alone, where
        measured at both (at least 1); else ``host_slowdown``."""
        if workers <= 1:
            return 1.0
        alone = dict(self.ddp_overhead).get(1, 0.0)
        if len(self.ddp_overhead) < 2 or alone <= 0:
            return self.host_slowdown(workers)
        return max(1.0, _along(tuple((k, t / alone) for k, t in self.ddp_overhead), workers))

    def ddp_copy_s(self) -> float:
        """Time of one pass over the gradients at the profiled copy bandwidth (0 if unknown).

        DDP makes two such passes on top of the backward pass: copying each gradient into
        its bucket (divided by the world size on the way) and the reduced bucket back."""
        if self.copy_bytes_per_s <= 0:
            return 0.0
        return self.gradient_bytes / self.copy_bytes_per_s

    def memory_bytes(self, batch: ArrayLike) -> NDArray[np.float64]:
        """Training memory at ``batch``: fixed part plus per-sample part."""
        b = np.asarray(batch, dtype=np.float64)
        return self.memory_fixed_bytes + self.memory_per_sample_bytes * b

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "model": self.model,
            "size": self.size,
            "device_type": self.device_type,
            "device_name": self.device_name,
            "fw": _stats_dict(self.fw),
            "bw": _stats_dict(self.bw),
            "fw_fit": self.fw_fit.to_dict(),
            "bw_fit": self.bw_fit.to_dict(),
            "b_max": self.b_max,
            "memory_per_sample_bytes": self.memory_per_sample_bytes,
            "memory_fixed_bytes": self.memory_fixed_bytes,
            "memory_cap_bytes": self.memory_cap_bytes,
            "n_parameters": self.n_parameters,
            "gradient_bytes": self.gradient_bytes,
            "buckets": [
                {
                    "index": b.index,
                    "size_bytes": b.size_bytes,
                    "n_params": b.n_params,
                    "ready_fraction": b.ready_fraction,
                }
                for b in self.buckets
            ],
            "bucket_cap_bytes": self.bucket_cap_bytes,
            "first_bucket_cap_bytes": self.first_bucket_cap_bytes,
            "schedule_batch_size": self.schedule_batch_size,
            "probe_mode": self.probe_mode,
            "threads": self.threads,
            "torch_version": self.torch_version,
            "created_at": self.created_at,
            "copy_bytes_per_s": self.copy_bytes_per_s,
            "optimizer_step_s": self.optimizer_step_s,
            "vm_cv": self.vm_cv,
            "profiled_vms": self.profiled_vms,
            "probe_checks": [[b, e] for b, e in self.probe_checks],
            "shared_slowdown": [[k, f] for k, f in self.shared_slowdown],
            "ddp_overhead": [[k, t] for k, t in self.ddp_overhead],
            "fsdp_overhead": list(self.fsdp_overhead),
            "fsdp_peak_margin": self.fsdp_peak_margin,
            "settings": self.settings.to_dict(),
            "effective_precision": self.effective_precision,
            "b_max_limit": self.b_max_limit,
            "noisy": list(self.noisy),
            "estimate": self.estimate,
            "estimate_cv": self.estimate_cv,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, allow_nan=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ComputeProfile:
        """A profile read back, its numbers checked (``check``): a ``ConfigError`` naming
        the field where one is missing, of the wrong kind or impossible (a NaN or negative
        time, B_max 0, no gradient bucket), never a profile that plans nonsense."""
        if not isinstance(d, dict):
            raise ConfigError(f"a JSON object expected, got {type(d).__name__}")
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ConfigError(
                f"compute profile schema_version {version!r}, expected {SCHEMA_VERSION}"
            )
        try:
            profile = cls(
                model=str(d["model"]),
                size=str(d["size"]),
                device_type=str(d["device_type"]),
                device_name=str(d["device_name"]),
                fw=_stats(d["fw"]),
                bw=_stats(d["bw"]),
                fw_fit=PiecewiseLinear.from_dict(d["fw_fit"]),
                bw_fit=PiecewiseLinear.from_dict(d["bw_fit"]),
                b_max=int(d["b_max"]),
                memory_per_sample_bytes=float(d["memory_per_sample_bytes"]),
                memory_fixed_bytes=float(d["memory_fixed_bytes"]),
                memory_cap_bytes=int(d["memory_cap_bytes"]),
                n_parameters=int(d["n_parameters"]),
                gradient_bytes=int(d["gradient_bytes"]),
                buckets=tuple(
                    GradientBucket(
                        int(b["index"]),
                        int(b["size_bytes"]),
                        int(b["n_params"]),
                        float(b["ready_fraction"]),
                    )
                    for b in d["buckets"]
                ),
                bucket_cap_bytes=int(d["bucket_cap_bytes"]),
                first_bucket_cap_bytes=int(d["first_bucket_cap_bytes"]),
                schedule_batch_size=int(d["schedule_batch_size"]),
                probe_mode=str(d["probe_mode"]),
                threads=int(d["threads"]),
                torch_version=str(d["torch_version"]),
                created_at=str(d["created_at"]),
                copy_bytes_per_s=float(d.get("copy_bytes_per_s", 0.0)),
                optimizer_step_s=float(d.get("optimizer_step_s", 0.0)),
                vm_cv=float(d.get("vm_cv", 0.0)),
                profiled_vms=int(d.get("profiled_vms", 1)),
                probe_checks=tuple((int(b), float(e)) for b, e in d.get("probe_checks", ())),
                shared_slowdown=_slowdown_pairs(d.get("shared_slowdown", ())),
                ddp_overhead=_overhead_pairs(d.get("ddp_overhead", ())),
                fsdp_overhead=_fsdp_overhead(d.get("fsdp_overhead", ())),
                fsdp_peak_margin=_margin(d.get("fsdp_peak_margin")),
                settings=TrainingSettings.from_dict(d.get("settings")),
                effective_precision=str(d.get("effective_precision", "")),
                b_max_limit=str(d.get("b_max_limit", "memory")),
                noisy=tuple(str(x) for x in d.get("noisy", ())),
                estimate=str(d.get("estimate", "")),
                estimate_cv=float(d.get("estimate_cv", 0.0)),
            )
        except KeyError as exc:
            raise ConfigError(f"compute profile is missing field {exc.args[0]!r}") from exc
        except ConfigError:
            raise
        except (TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"compute profile: a field of the wrong kind ({exc})") from exc
        profile.check()
        return profile

    @classmethod
    def from_json(cls, text: str) -> ComputeProfile:
        try:
            d = json.loads(text)
        except RecursionError:
            raise ConfigError("compute profile: nested too deeply") from None
        return cls.from_dict(d)

    def check(self) -> None:
        """Every number where physics puts it: times finite and positive over batches 1 to
        B_max (both passes, their fits and the measurements), B_max at least 1, memory,
        sizes and spreads finite and not negative, at least one gradient bucket, each
        ready within the backward pass. ``ConfigError`` naming the first field that is
        not (``fw_fit.slopes: ...``)."""
        if self.b_max < (0 if self.b_max_limit == NO_REPLICA else 1):
            raise ConfigError(f"b_max: must be at least 1, got {self.b_max}")
        for name, stats in (("fw", self.fw), ("bw", self.bw)):
            _check_stats(name, stats)
        for name, fit in (("fw_fit", self.fw_fit), ("bw_fit", self.bw_fit)):
            _check_fit(name, fit, max(1, self.b_max))
        for name in ("memory_per_sample_bytes", "memory_fixed_bytes", "copy_bytes_per_s",
                     "optimizer_step_s", "vm_cv", "estimate_cv"):  # fmt: skip
            _at_least(name, getattr(self, name), 0.0)
        for name in ("memory_cap_bytes", "n_parameters", "gradient_bytes", "bucket_cap_bytes",
                     "first_bucket_cap_bytes", "schedule_batch_size", "profiled_vms"):  # fmt: skip
            _at_least(name, getattr(self, name), 1)
        if self.threads < 0:
            raise ConfigError(f"threads: must be >= 0, got {self.threads}")
        if not self.buckets:
            raise ConfigError(
                "buckets: empty; a profile holds the gradient buckets DDP forms (one at least)"
            )
        for k, b in enumerate(self.buckets):
            where = f"buckets[{k}]"
            if b.index != k:
                raise ConfigError(f"{where}.index: must be {k} (buckets in order), got {b.index}")
            _at_least(f"{where}.size_bytes", b.size_bytes, 1)
            _at_least(f"{where}.n_params", b.n_params, 1)
            if not (math.isfinite(b.ready_fraction) and 0.0 <= b.ready_fraction <= 1.0):
                raise ConfigError(
                    f"{where}.ready_fraction: must be within 0..1 of the backward pass, "
                    f"got {b.ready_fraction}"
                )
        for batch, e in self.probe_checks:
            if batch < 1 or not math.isfinite(e) or e < 0:
                raise ConfigError(
                    f"probe_checks: (batch, relative error) must be >= 1 and finite >= 0, "
                    f"got {(batch, e)}"
                )


def _slowdown_pairs(raw: Any) -> tuple[tuple[int, float], ...]:
    """``shared_slowdown`` from JSON: ``[workers, factor]`` pairs, workers >= 2 and
    increasing, factors finite and positive."""
    try:
        pairs = tuple((int(k), float(f)) for k, f in raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"shared_slowdown: expected [workers, factor] pairs, got {raw!r}"
        ) from exc
    ks = [k for k, _ in pairs]
    if any(k < 2 for k in ks) or ks != sorted(set(ks)):
        raise ConfigError(f"shared_slowdown: worker counts must be >= 2 and increasing: {ks}")
    if not all(math.isfinite(f) and f > 0 for _, f in pairs):
        raise ConfigError(f"shared_slowdown: factors must be finite and > 0: {pairs}")
    return pairs


def _along(points: tuple[tuple[int, float], ...], workers: int) -> float:
    """``points`` ((workers, value), increasing) at ``workers``: linear between measured
    counts; beyond the largest, along the last segment and no lower than its end."""
    ks = [float(k) for k, _ in points]
    vs = [v for _, v in points]
    if workers <= ks[-1] or len(ks) < 2:
        return float(np.interp(workers, ks, vs))
    slope = (vs[-1] - vs[-2]) / (ks[-1] - ks[-2])
    return max(vs[-1], vs[-1] + slope * (workers - ks[-1]))


def _overhead_pairs(raw: Any) -> tuple[tuple[int, float], ...]:
    """``ddp_overhead`` from JSON: ``[workers, seconds]`` pairs from 1 worker up,
    increasing, seconds finite and >= 0."""
    try:
        pairs = tuple((int(k), float(t)) for k, t in raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"ddp_overhead: expected [workers, seconds] pairs, got {raw!r}") from exc
    ks = [k for k, _ in pairs]
    if pairs and (ks[0] != 1 or ks != sorted(set(ks))):
        raise ConfigError(f"ddp_overhead: worker counts must start at 1 and increase: {ks}")
    if not all(math.isfinite(t) and t >= 0 for _, t in pairs):
        raise ConfigError(f"ddp_overhead: seconds must be finite and >= 0: {pairs}")
    return pairs


def _fsdp_overhead(raw: Any) -> tuple[float, ...]:
    """``fsdp_overhead`` from JSON: empty, or three finite seconds >= 0."""
    if not raw:
        return ()
    try:
        fw, bw, step = (float(x) for x in raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"fsdp_overhead: expected [forward s per unit, backward s per unit, step s], "
            f"got {raw!r}"
        ) from exc
    if not all(math.isfinite(x) and x >= 0 for x in (fw, bw, step)):
        raise ConfigError(f"fsdp_overhead: seconds must be finite and >= 0: {raw!r}")
    return fw, bw, step


def _margin(raw: Any) -> float | None:
    """``fsdp_peak_margin`` from JSON: None, or a finite fraction above -1."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"fsdp_peak_margin: a fraction expected, got {raw!r}") from exc
    if not (math.isfinite(value) and value > -1.0):
        raise ConfigError(f"fsdp_peak_margin: must be finite and above -1, got {raw!r}")
    return value


def _at_least(name: str, value: float, low: float) -> None:
    if not (math.isfinite(value) and value >= low):
        raise ConfigError(f"{name}: must be a finite number >= {low:g}, got {value!r}")


def _check_stats(name: str, s: PassStats) -> None:
    """A pass's measurements: batches >= 1 and increasing, mean times finite and > 0,
    spreads finite and >= 0, repeats >= 1."""
    if not s.batch_sizes:
        raise ConfigError(f"{name}.batch_sizes: empty; a profile measures one batch at least")
    if s.batch_sizes[0] < 1 or list(s.batch_sizes) != sorted(set(s.batch_sizes)):
        raise ConfigError(
            f"{name}.batch_sizes: must be >= 1 and increasing, got {list(s.batch_sizes)}"
        )
    if not all(math.isfinite(t) and t > 0 for t in s.mean_s):
        raise ConfigError(f"{name}.mean_s: times must be finite and > 0, got {list(s.mean_s)}")
    if not all(math.isfinite(t) and t >= 0 for t in s.std_s):
        raise ConfigError(f"{name}.std_s: must be finite and >= 0, got {list(s.std_s)}")
    if s.repeats < 1:
        raise ConfigError(f"{name}.repeats: must be at least 1, got {s.repeats}")


def _check_fit(name: str, fit: PiecewiseLinear, b_max: int) -> None:
    """A fitted t(B): every coefficient finite, breakpoints increasing, and the time it
    predicts positive at every batch from 1 to ``b_max`` (a piecewise-linear function is
    least at an end or a breakpoint, so those are the batches checked)."""
    for part in ("breakpoints", "slopes", "intercepts"):
        values = getattr(fit, part)
        if not all(math.isfinite(v) for v in values):
            raise ConfigError(f"{name}.{part}: must be finite, got {list(values)}")
    if not (math.isfinite(fit.x_min) and math.isfinite(fit.x_max)):
        raise ConfigError(f"{name}: x_min and x_max must be finite, got {fit.x_min}, {fit.x_max}")
    if list(fit.breakpoints) != sorted(set(fit.breakpoints)):
        raise ConfigError(f"{name}.breakpoints: must increase, got {list(fit.breakpoints)}")
    ends = [1.0, float(b_max), *(b for b in fit.breakpoints if 1.0 < b < b_max)]
    for b in ends:
        t = fit.at(b)
        if not (math.isfinite(t) and t > 0):
            raise ConfigError(
                f"{name}: predicts {t:g} s at batch {b:g}; a pass must take a finite time "
                f"> 0 at every batch from 1 to b_max ({b_max})"
            )


def _stats_dict(s: PassStats) -> dict[str, Any]:
    return {
        "batch_sizes": list(s.batch_sizes),
        "mean_s": list(s.mean_s),
        "std_s": list(s.std_s),
        "repeats": s.repeats,
    }


def _stats(d: dict[str, Any]) -> PassStats:
    return PassStats(
        tuple(int(b) for b in d["batch_sizes"]),
        tuple(float(v) for v in d["mean_s"]),
        tuple(float(v) for v in d["std_s"]),
        int(d["repeats"]),
    )


def _interp_cv(stats: PassStats, batch: NDArray[np.float64]) -> NDArray[np.float64]:
    """Coefficient of variation at ``batch``, interpolated linearly in log2(B) between the
    probed sizes and held constant beyond them."""
    xs = np.log2(np.asarray(stats.batch_sizes, dtype=np.float64))
    cv = stats.cv
    if not np.all(np.isfinite(cv)):
        raise ConfigError("profile has a non-finite latency spread")
    return np.interp(np.log2(batch), xs, cv)


def relative_error(predicted: ArrayLike, observed: ArrayLike) -> NDArray[np.float64]:
    """|predicted - observed| / observed, elementwise."""
    p = np.asarray(predicted, dtype=np.float64)
    o = np.asarray(observed, dtype=np.float64)
    return np.abs(p - o) / o


def mape(predicted: ArrayLike, observed: ArrayLike) -> float:
    """Mean absolute percentage error, in percent."""
    err = relative_error(predicted, observed)
    return float(100.0 * err.mean()) if err.size else math.nan
