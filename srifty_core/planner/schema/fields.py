"""The field types of the request documents: each a pydantic type with its range and the
``Rule`` its errors quote (``must be <rule>, got <value>``), and the limits they share.

``RequestSpec``, ``JobConf`` and the planner's dataclasses (``field_errors.check``) all
check their fields with these types, so each rule is written once.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema

from srifty_core.catalog.types import Market
from srifty_core.workloads import MODEL_NAMES, SIZES, ModelRefError, parse_model

DEFAULT_RISK_QUANTILE = 0.9
"""Limits are checked against the 90th percentile of predicted job time and cost."""

MAX_BATCH = 10**9
"""Samples per iteration (or per GPU) a request may ask for."""
MAX_ITERATIONS = 10**12
MAX_QUOTA = 100_000
"""VMs of one type and market an offer may allow."""
MAX_OFFERS = 1000
MAX_SEED = 2**32 - 1
MAX_TEXT = 200
"""Characters of a name (model, type, region, zone, ...)."""


class Rule:
    """What a field must be, in words (``a number in [0.5, 1)``): every error on the field
    says ``must be <rule>, got <value>``."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"Rule({self.text!r})"


def _canonical(parse: Any) -> Any:
    """A before-validator: the canonical spelling of a string ``parse`` accepts; anything
    else unchanged (so the error shows what was given)."""

    def normalize(value: Any) -> Any:
        if isinstance(value, str):
            try:
                return parse(value)
            except (LookupError, ValueError):
                return value
        return value

    return BeforeValidator(normalize)


def _market(value: str) -> str:
    return Market.parse(value).value


def _objective(value: str) -> str:
    key = value.strip().lower().removeprefix("min_").removeprefix("minimize_")
    if key not in ("time", "cost"):
        raise ValueError(value)
    return key


def _one_of(names: tuple[str, ...]) -> Any:
    def check(value: str) -> str:
        if value not in names:
            raise ValueError(value)
        return value

    return AfterValidator(check)


# ---------------------------------------------------------------------- field types
Text = Annotated[
    str, Field(strict=True, min_length=1, max_length=MAX_TEXT), Rule("a non-empty string")
]
LongText = Annotated[
    str, Field(strict=True, min_length=1, max_length=4096), Rule("a non-empty string")
]
"""A path."""
RunId = Annotated[str, Field(strict=True, max_length=4096), Rule("a string")]
GlobalBatch = Annotated[
    int, Field(strict=True, ge=1, le=MAX_BATCH), Rule(f"a whole number from 1 to {MAX_BATCH}")
]
MinBatch = GlobalBatch
Iterations = Annotated[
    int,
    Field(strict=True, ge=1, le=MAX_ITERATIONS),
    Rule(f"a whole number from 1 to {MAX_ITERATIONS}"),
]
IterationsDone = Annotated[
    int,
    Field(strict=True, ge=0, le=MAX_ITERATIONS),
    Rule(f"a whole number from 0 to {MAX_ITERATIONS}"),
]
Quota = Annotated[
    int, Field(strict=True, ge=0, le=MAX_QUOTA), Rule(f"a whole number from 0 to {MAX_QUOTA}")
]
Seed = Annotated[
    int, Field(strict=True, ge=0, le=MAX_SEED), Rule(f"a whole number from 0 to {MAX_SEED}")
]
Limit = Annotated[
    float,
    Field(strict=True, gt=0, allow_inf_nan=False),
    Rule("a positive number (leave it out for no limit)"),
]
Price = Annotated[
    float, Field(strict=True, gt=0, allow_inf_nan=False), Rule("a positive number ($/hour)")
]
LocalPrice = Annotated[
    float,
    Field(strict=True, ge=0, allow_inf_nan=False),
    Rule("a number >= 0 ($/hour a local worker counts for; 0: free)"),
]
"""The price of ``LOCAL_TYPE``: no market sets it, the user states what a worker on this
machine counts for, and 0 (free) is a valid answer. Every cloud type's price stays
``Price`` (> 0): a zero there is a mistake, never a free VM."""
LOCAL_TYPE = "local.cpu"
"""The local provider's pseudo-type (``cloud.local.LOCAL_CPU``): worker processes on this
machine, priced by the user (``LocalPrice``)."""
Seconds = Annotated[
    float, Field(strict=True, ge=0, allow_inf_nan=False), Rule("a number of seconds >= 0")
]
PositiveSeconds = Annotated[
    float, Field(strict=True, gt=0, allow_inf_nan=False), Rule("a number of seconds > 0")
]
Spent = Annotated[float, Field(strict=True, ge=0, allow_inf_nan=False), Rule("a number >= 0")]
RiskQuantile = Annotated[
    float,
    Field(strict=True, ge=0.5, lt=1.0, allow_inf_nan=False),
    Rule("a number in [0.5, 1)"),
]
MonthlyShare = Annotated[
    float,
    Field(strict=True, ge=0.0, lt=1.0, allow_inf_nan=False),
    Rule("a share in [0, 1), e.g. 0.12 for 12% of VMs a month"),
]
SpotPricing = Annotated[Literal["priced", "ignored"], Rule("'priced' or 'ignored'")]
MarketName = Annotated[
    Literal["on-demand", "spot"], _canonical(_market), Rule("'on-demand' or 'spot'")
]
ObjectiveName = Annotated[Literal["time", "cost"], _canonical(_objective), Rule("'time' or 'cost'")]
DEFAULT_OBJECTIVE: Literal["time", "cost"] = "time"
"""What a request optimises when it does not say: the fastest plan within the limits. The one
default of ``srifty plan``'s request, a job file and the plan-and-train DAG's conf."""
Granularity = Annotated[Literal["pow2", "any"], Rule("'pow2' or 'any'")]
StrategyName = Annotated[
    Literal["auto", "ddp", "fsdp", "hsdp"], Rule("one of auto, ddp, fsdp, hsdp")
]
"""How the ranks hold the model (``sharding.memory.Strategy``): ``auto`` lets the planner
choose per configuration; ``ddp``, ``fsdp`` or ``hsdp`` pins one."""
DEFAULT_STRATEGY: Literal["auto", "ddp", "fsdp", "hsdp"] = "auto"
JobProvider = Annotated[Literal["local", "ec2"], Rule("'local' or 'ec2'")]
"""Where a DAG run's workers may run (the emulated EC2 lives in one process: the shell's)."""


def _shell_provider(value: str) -> str:
    key = value.strip().lower()
    return "ec2-emulated" if key == "emulated" else key


ShellJobProvider = Annotated[
    Literal["local", "ec2", "ec2-emulated"],
    _canonical(_shell_provider),
    Rule("'local', 'ec2' or 'ec2-emulated' (alias 'emulated')"),
]
"""Where a request is planned for and a job from the shell runs."""
BandwidthSource = Annotated[Literal["champion", "probes"], Rule("'champion' or 'probes'")]
SizeName = Annotated[
    str,
    Field(strict=True),
    _one_of(SIZES),
    WithJsonSchema({"type": "string", "enum": list(SIZES)}),
    Rule(f"one of {', '.join(SIZES)}"),
]


def _model_ref(value: str) -> str:
    try:
        return parse_model(value).text
    except ModelRefError as exc:
        raise ValueError(value) from exc


ModelName = Annotated[
    str,
    Field(strict=True, min_length=1, max_length=4096),
    AfterValidator(_model_ref),
    WithJsonSchema(
        {
            "type": "string",
            "pattern": (
                f"^(({'|'.join(MODEL_NAMES)})|hf:.+"
                "|[^:]+:[A-Za-z_][A-Za-z0-9_]*(,(seq|vocab)=[0-9]+){0,2})$"
            ),
            # a trigger form offers what a trigger may name (no file paths: trigger_models)
            "examples": [*MODEL_NAMES, "hf:gpt2", "hf:opt-125m,seq=2048"],
        }
    ),
    Rule(
        f"a zoo model ({', '.join(MODEL_NAMES)}), 'package.module:factory', "
        "'path/to/file.py:factory' or 'hf:NAME' (the last three may end ',seq=N', ',vocab=N')"
    ),
]
"""A model reference (``srifty_core.workload``), normalised."""


def _model_or_name(value: str) -> str:
    try:
        return parse_model(value).text
    except ModelRefError:
        return value  # a name profiles are stored under (the store says if there are none)


StoredModel = Annotated[
    str,
    Field(strict=True, min_length=1, max_length=4096),
    AfterValidator(_model_or_name),
    Rule("a model reference or the name its profiles are stored under"),
]
"""A request's model: a reference (normalised) or a stored name."""
PrecisionName = Annotated[
    Literal["fp32", "fp16", "bf16", "bf16-true"], Rule("'fp32', 'fp16', 'bf16' or 'bf16-true'")
]
OptimizerName = Annotated[
    Literal["sgd", "adamw", "adamw_fused"], Rule("'sgd', 'adamw' or 'adamw_fused'")
]
Flag = Annotated[bool, Field(strict=True), Rule("true or false")]
