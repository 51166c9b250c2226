"""The profiler's budget: the knobs a user sets (probes, repeats, refine, B_max bounds,
threads, host sharing), each with its one default, bounds and help text (``Knob``); and
the model size and device a profile takes by default (``DEFAULT_SIZE``, ``DEFAULT_DEVICE``).

``ProfilerConfig`` extends ``ProfilerBudget``; ``srifty profile``'s flags
(``add_budget_flags``), the profile DAG's Params (``budget_params``) and
``CloudProfileRequest``'s defaults are generated from these fields, so they cannot drift.
A stdlib dataclass, not pydantic: ``srifty --help`` builds the flags and stays light.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from srifty_core.errors import ConfigError

DEFAULT_SIZE = "small"
"""The model size a profile is taken at when none is given (``srifty profile --size``, the
profile DAG's ``size``, ``CloudProfileRequest``, ``profile_model``)."""
DEFAULT_DEVICE = "cpu"
"""The device a local profile runs on when none is given (``srifty profile --device``, the
profile DAG's ``device_types``, ``ProfilerConfig``)."""
DEFAULT_CPU_MEMORY_CAP = 4 * 1024**3
"""CPU: the memory a batch must fit in when ``memory_cap_bytes`` is not set."""
DEFAULT_CPU_MAX_STEP_S = 2.0
"""CPU: the B_max search stops at batches whose step would take longer than this (a CPU
step is linear in the batch well before the memory runs out: BENCHMARKS.md, "Profiling
time")."""
SHARE_HOST_CPU = 2
"""``share_host``'s default on a CPU: measure the slowdown of 2 workers side by side, what
a local run's ranks on a host do to each other. Without it the simulator predicts a local
2-rank run as if each rank had the host alone; measured in step on this project's 2-core
host: ResNet-18 1.16, DLRM 1.76 (docs/usage.md, "Host sharing", has the figures, the
noise and the cost)."""


@dataclass(frozen=True, slots=True)
class Knob:
    """How a budget field is offered. ``help``: one line for the flag and the Param;
    ``none``: what ``None`` means (said as the default); ``minimum``: the least value
    (every surface); ``trigger_maximum``: a DAG trigger's ceiling (a guard on what one
    trigger may cost; the CLI and the library take any); ``flag``/``param``: the flag's
    and the Param's name (default: from the field's; ``""``: not offered there);
    ``param_unit``: the field's value per unit of the Param's (MiB for memory)."""

    help: str
    none: str = ""
    minimum: float | None = None
    trigger_maximum: float | None = None
    flag: str | None = None
    param: str | None = None
    param_unit: int = 1
    param_null: bool = True
    """Whether a trigger may give ``null`` (where ``None`` is the default, it may)."""


def _knob(default: Any, **knob: Any) -> Any:
    return field(default=default, metadata={"knob": Knob(**knob)})


@dataclass(frozen=True, slots=True)
class ProfilerBudget:
    """What to measure and how hard; the profiler's only defaults."""

    probes: int | None = _knob(
        4, help="batch sizes to measure", minimum=2, trigger_maximum=32, param_null=False
    )
    """Budgeted mode: this many batch sizes. ``None``: a dense sweep (powers of two:
    ``srifty profile --dense``)."""
    batch_sizes: tuple[int, ...] | None = _knob(
        None, help="explicit sizes, e.g. 1,8,32,64", none="the probes'", minimum=1, param=""
    )
    """Explicit batch sizes (overrides ``probes``); each must fit."""
    repeats: int = _knob(5, help="timed steps per size", minimum=2, trigger_maximum=100)
    warmup: int = _knob(2, help="untimed steps first", minimum=0, param="")
    memory_cap_bytes: int | None = _knob(
        None,
        help="memory a batch must fit in, e.g. 4GiB",
        none="4 GiB on a CPU, the GPU's own on CUDA",
        minimum=1,
        flag="--memory-cap",
        param="memory_cap_mib",
        param_unit=2**20,
    )
    """CPU: the memory budget a batch must fit in (``DEFAULT_CPU_MEMORY_CAP``). CUDA: the
    device's memory."""
    max_batch: int | None = _knob(
        None,
        help="B_max search ceiling",
        none="none, until a batch does not fit the memory",
        minimum=1,
    )
    """Upper end of the B_max search; ``None``: no constant ceiling, the search doubles
    until a batch does not fit the memory (``memory_cap_bytes``)."""
    max_step_s: float | None = _knob(
        None,
        help="B_max stops at batches whose step takes longer (0: no bound, the memory alone)",
        none=f"{DEFAULT_CPU_MAX_STEP_S:g} on a CPU, none on CUDA",
        minimum=0,
        param="",
    )
    """Largest step worth profiling: a batch whose forward pass alone takes more than a
    third of this is counted as not fitting, so B_max is the largest batch that fits the
    memory *and* steps within this (the profile records which bound it hit). ``None``:
    ``DEFAULT_CPU_MAX_STEP_S`` on a CPU, no bound on CUDA; 0: no bound."""
    threads: int | None = _knob(
        None, help="CPU threads (match the training ranks)", none="torch's", minimum=1
    )
    """CPU threads (``torch.set_num_threads``); ``None`` keeps torch's default."""
    colocated: int = _knob(
        1,
        help="workers sharing this host in training: measure with that many running",
        minimum=1,
        param="",
    )
    """Workers that share this device (host) in training. With more than one, the latency
    sweep runs ``colocated - 1`` background processes doing the same training steps at the
    same batch, so the profile sees the contention training will see (CPU ranks sharing a
    host's cores and memory bus)."""
    refine: int = _knob(
        3,
        help="check probes between the budgeted ones, where t(B) may bend (0: none)",
        minimum=0,
        trigger_maximum=16,
    )
    """Budgeted mode: at most this many check probes between the budgeted ones, where the
    fit may bend (``predictors.compute.refine_batch_sizes``); 0: none. Their held-out
    errors are kept in ``ComputeProfile.probe_checks``."""
    share_host: int | None = _knob(
        None,
        help="on a CPU, measure how a step slows with up to this many workers sharing the "
        "host (local runs' ranks; 1: not measured; ignored on CUDA)",
        none=f"{SHARE_HOST_CPU} on a CPU, 1 with --colocated",
        minimum=1,
        trigger_maximum=64,
    )
    """On a CPU, measure how a step slows when up to this many workers of the same kind
    share the host (``ComputeProfile.shared_slowdown``, for 2..``share_host``), what local
    ranks on one host do to each other; ignored on CUDA, where each rank has its own
    device. ``None``: ``SHARE_HOST_CPU`` (2), or 1 with ``colocated`` (the profile already
    runs under that load). 1: not measured; the simulator then treats local ranks as if
    each had the host alone and says so (``missing``). Cannot be above 1 with
    ``colocated``."""

    def __post_init__(self) -> None:
        if self.memory_cap_bytes is not None and self.memory_cap_bytes < 1:
            # 0 read as "the default cap" let the B_max search run the host out of memory
            raise ConfigError(f"memory_cap must be at least 1 byte, got {self.memory_cap_bytes}")
        if self.batch_sizes is not None and (
            not self.batch_sizes or any(b < 1 for b in self.batch_sizes)
        ):
            raise ConfigError(f"batch_sizes must be >= 1 each, got {list(self.batch_sizes)}")
        for name, k in KNOBS.items():
            value = getattr(self, name)
            number = isinstance(value, int | float) and not isinstance(value, bool)
            if k.minimum is not None and number and not value >= k.minimum:
                raise ConfigError(f"{name} must be >= {k.minimum:g}, got {value}")
        if self.colocated > 1 and (self.share_host or 1) > 1:
            raise ConfigError(
                "colocated and share_host are two ways to account for a shared host "
                "(profile under load, or measure the slowdown apart): set one of them to 1"
            )

    def shared_workers(self, cpu: bool) -> int:
        """Up to how many workers side by side ``shared_slowdown`` measures (1: none)."""
        if not cpu:
            return 1
        if self.share_host is None:
            return 1 if self.colocated > 1 else SHARE_HOST_CPU
        return self.share_host


KNOBS: dict[str, Knob] = {f.name: f.metadata["knob"] for f in dataclasses.fields(ProfilerBudget)}
"""Each budget field's ``Knob``, in field order."""
DEFAULT_BUDGET = ProfilerBudget()


def _default_text(name: str) -> str:
    value = getattr(DEFAULT_BUDGET, name)
    return KNOBS[name].none if value is None else f"{value:g}"


def _flag(name: str) -> str:
    k = KNOBS[name]
    return k.flag if k.flag is not None else "--" + name.replace("_", "-")


def add_budget_flags(
    parser: argparse.ArgumentParser, types: dict[str, Callable[[str], Any]] | None = None
) -> None:
    """Add a flag per budget field (``--probes``, ``--memory-cap``, ...) to ``parser``,
    with the field's default and help; ``types``: a field's parser where it is not its
    annotation's scalar (a size in bytes, a list of sizes)."""
    scalar = {"int": int, "float": float, "int | None": int, "float | None": float}
    for f in dataclasses.fields(ProfilerBudget):
        k: Knob = f.metadata["knob"]
        if k.flag == "":
            continue
        kind = (types or {}).get(f.name) or scalar.get(str(f.type))
        if kind is None:
            raise TypeError(f"add_budget_flags: give the parser of {f.name} ({f.type})")
        flag = _flag(f.name)
        parser.add_argument(
            flag,
            dest=f.name,
            metavar=flag.removeprefix("--").upper().replace("-", "_"),
            type=kind,
            default=f.default,
            help=f"{k.help} (default: {_default_text(f.name)})",
        )


def budget_params() -> dict[str, dict[str, Any]]:
    """``{Param name: Param keyword arguments}`` per budget field the profile DAG offers:
    the default (in the Param's unit), JSON type, bounds and description."""
    out: dict[str, dict[str, Any]] = {}
    for f in dataclasses.fields(ProfilerBudget):
        k: Knob = f.metadata["knob"]
        if k.param == "":
            continue
        json_type = "number" if "float" in str(f.type) else "integer"
        nullable = "None" in str(f.type) and k.param_null
        unit = k.param_unit
        kw: dict[str, Any] = {
            "default": None if f.default is None else f.default // unit,  # type: ignore[operator]
            "type": ["null", json_type] if nullable else json_type,
        }
        if k.minimum is not None:
            kw["minimum"] = k.minimum if unit == 1 else max(1, int(k.minimum) // unit)
        if k.trigger_maximum is not None:
            kw["maximum"] = k.trigger_maximum
        text = k.help[0].upper() + k.help[1:]
        unit_text = " In MiB." if unit == 2**20 else ""
        default = _default_text(f.name)
        kw["description"] = f"{text}.{unit_text} Default: {default}."
        out[k.param or f.name] = kw
    return out


def budget_from_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """The budget fields a DAG's params set, by field name and in the field's unit
    (``memory_cap_mib`` -> ``memory_cap_bytes``); what the params lack is left out."""
    out = {}
    for name, k in KNOBS.items():
        key = k.param or name
        if k.param != "" and key in params:
            value = params[key]
            out[name] = value * k.param_unit if value is not None else None
    return out
