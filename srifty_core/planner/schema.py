"""What a user may send to the planner, checked field by field in one place.

``RequestSpec`` is a ``srifty plan`` request file; ``JobConf`` is the conf of the
``srifty_plan_and_train`` DAG (the same planning fields plus the run's settings). Both are
strict pydantic models: numbers are numbers (no booleans, no strings, no NaN or infinity),
whole numbers are whole, every value is in its range, and an unknown key is an error that
names it and the closest known one. ``parse`` turns every problem into a ``FieldError`` (a
``ConfigError``) whose one-line message starts with the field's path::

    offers[1].quota: must be a whole number from 0 to 100000, got -2

The dataclasses the planner works on (``planner.request``) check their scalar fields with the
same types (``check``), so the rules are written once. The DAG's trigger form takes its
per-field JSON schemas from ``JobConf`` (``param_schemas``).

Light to import: pydantic and the names of the zoo, no planner or simulator.
"""

from __future__ import annotations

import copy
import datetime
import math
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    model_validator,
)

from srifty_core.catalog.types import Market
from srifty_core.errors import FieldError, UnknownNameError
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
            "pattern": (f"^(({'|'.join(MODEL_NAMES)})|hf:.+|[^:]+:[A-Za-z_][A-Za-z0-9_]*)$"),
            # a trigger form offers what a trigger may name (no file paths: trigger_models)
            "examples": [*MODEL_NAMES, "hf:gpt2"],
        }
    ),
    Rule(
        f"a zoo model ({', '.join(MODEL_NAMES)}), 'package.module:factory', "
        "'path/to/file.py:factory' or 'hf:NAME'"
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
PrecisionName = Annotated[Literal["fp32", "fp16", "bf16"], Rule("'fp32', 'fp16' or 'bf16'")]
OptimizerName = Annotated[Literal["sgd", "adamw"], Rule("'sgd' or 'adamw'")]
Flag = Annotated[bool, Field(strict=True), Rule("true or false")]


# ---------------------------------------------------------------------- the models
_M = TypeVar("_M", bound="Strict")


class _PathError(ValueError):
    """Raised by a model validator about one field (pydantic gives such errors no path)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(problem)
        self.path = path
        self.problem = problem


class Strict(BaseModel):
    """Strict types, finite floats, no unknown keys; ``parse`` raises ``FieldError``."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)
    kind: ClassVar[str] = "field"
    """What an unknown key is called in errors (``unknown offer field 'qouta'``)."""
    rule: ClassVar[str] = "a mapping"

    @classmethod
    def parse(cls: type[_M], data: Any, where: str = "") -> _M:
        """``data`` checked; ``where`` is the path of ``data`` in a larger document
        (``offers[2]``), put before the fields named in errors."""
        if isinstance(data, Mapping) and not isinstance(data, dict):
            data = dict(data)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise field_error(exc, cls, where) from None


OfferPrice = Annotated[
    float,
    Field(strict=True, ge=0, allow_inf_nan=False),
    Rule(f"a number >= 0 ($/hour; 0, free, only for {LOCAL_TYPE})"),
]
"""An offer's stated price: a cloud type's ``Price`` (> 0), ``LOCAL_TYPE``'s ``LocalPrice``
(0 allowed); ``OfferSpec`` refuses a 0 for any other type."""


class OfferSpec(Strict):
    """Up to ``quota`` VMs of ``type`` on ``market``; ``price`` ($/hour) from the catalog
    unless given (``local.cpu``, the local provider's workers, has none: give it)."""

    kind = "offer"
    rule = "a mapping like {type: g4dn.xlarge, market: spot, quota: 8}"
    type: Text
    market: MarketName = "on-demand"
    quota: Quota = 0
    price: OfferPrice | None = None
    zone: Text | None = None
    min_batch: MinBatch | None = None
    interruptions_per_month: MonthlyShare | None = None
    """Share of spot VMs interrupted per month (``planner.spot``); default: the catalog's
    band for the type."""

    @model_validator(mode="after")
    def _zero_only_for_local(self) -> OfferSpec:
        if self.price == 0 and self.type != LOCAL_TYPE:
            raise _PathError(
                "price",
                f"must be a positive number ($/hour) for {self.type} (only {LOCAL_TYPE} may "
                "be free), got 0",
            )
        return self


class OverheadsSpec(Strict):
    kind = "overheads"
    rule = "a mapping like {launch_s: 150, detach_s: 5}"
    launch_s: Seconds | None = None
    """Request to running workers; default: the provider's (``Provider.launch_s``: local 0,
    ec2 and ec2-emulated 150 s)."""
    detach_s: Seconds = 0.0
    solve_s: Seconds = 0.0


class RequestSpec(Strict):
    """A planning request: a ``srifty plan`` request file (docs/usage.md, "Planning a
    request") and the planning part of a job's conf (``JobConf`` adds the run's settings).
    Each field and its default is defined here once."""

    kind = "request"
    rule = "a mapping of request fields (model, global_batch, iterations, offers, ...)"
    model: StoredModel
    """A model reference (``workload``), or the name its profiles are stored under."""
    size: SizeName = Field(
        "full",
        description=(
            "The model's size preset; default full, the model as its name says (tiny and "
            "small are CPU-friendly stand-ins for demos and tests)."
        ),
    )
    precision: PrecisionName = "fp32"
    optimizer: OptimizerName = "sgd"
    compile: Flag = False
    channels_last: Flag = False
    """Training settings (``training_settings``): the profiles read are those taken with
    them."""
    region: Text = Field(
        "us-east-1",
        description="The catalog region of the offers' types and prices (local.cpu has none).",
    )
    provider: ShellJobProvider | None = Field(
        None,
        description=(
            "Where the workers run: local (local.cpu processes on this machine), ec2, or "
            "ec2-emulated (from the shell only); default: inferred from the offers, local "
            "when every offer is local.cpu, else ec2. It sets the launch overhead charged "
            "(the provider's: local 0, ec2 150 s) unless overheads.launch_s is given."
        ),
    )
    global_batch: GlobalBatch
    iterations: Iterations = Field(
        description="Iterations to train (a re-planning run's conf: those still to do)."
    )
    time_limit_s: Limit | None = None
    budget_usd: Limit | None = None
    objective: ObjectiveName = DEFAULT_OBJECTIVE
    risk_quantile: RiskQuantile = Field(
        DEFAULT_RISK_QUANTILE,
        description="The limits hold for this quantile of predicted time and cost.",
    )
    overheads: OverheadsSpec | None = Field(
        None,
        description=(
            "Fixed costs of starting a configuration: launch_s (default: the provider's), "
            "detach_s and solve_s (default 0)."
        ),
    )
    batch_granularity: Granularity = "pow2"
    checkpoint_every: Iterations = 10
    """Iterations between checkpoints: the work a spot interruption loses."""
    spot_interruptions: SpotPricing = "priced"
    """``priced``: spot offers carry their interruption risk (``planner.spot``);
    ``ignored``: planned as if spot VMs were never interrupted."""
    offers: Annotated[
        list[OfferSpec],
        Field(min_length=1, max_length=MAX_OFFERS),
        Rule(f"a list of 1 to {MAX_OFFERS} offers {{type, market, quota[, price, zone]}}"),
    ] = Field(
        description=(
            "What may be rented: {type, market, quota, price?, zone?}. local: type local.cpu, "
            "quota = worker processes, price = the $/hour a worker counts for (0.1 is a "
            "nominal demo value); ec2: catalog types, prices from the catalog unless given."
        )
    )

    @model_validator(mode="before")
    @classmethod
    def _provider_from_offers(cls, data: Any) -> Any:
        """A request without ``provider`` (or with null) gets the one its offers imply."""
        if isinstance(data, Mapping) and data.get("provider") is None:
            offers = data.get("offers")
            local = (
                isinstance(offers, list)
                and bool(offers)
                and all(isinstance(o, Mapping) and o.get("type") == LOCAL_TYPE for o in offers)
            )
            return {**data, "provider": "local" if local else "ec2"}
        return data

    @property
    def provider_name(self) -> str:
        """``provider``, which parsing always fills in (``_provider_from_offers``)."""
        return self.provider or "ec2"  # pragma: no branch - never None once parsed


def _request_field(name: str) -> Any:
    """``RequestSpec``'s field ``name`` for a subclass that narrows its type: the same
    default and description (defined once, in ``RequestSpec``)."""
    f = RequestSpec.model_fields[name]
    if f.is_required():
        return Field(description=f.description)
    return Field(f.default, description=f.description)


class JobOffer(OfferSpec):
    """An offer of a job: it rents for real, so it states how many it may (``quota``
    required)."""

    quota: Quota


class Ec2Settings(Strict):
    """EC2 launch settings: image_id (required for the ec2 provider), subnet_id,
    security_group_ids, key_name, instance_profile_arn, poll_s, wait_timeout_s,
    join_timeout_s.

    What a VM installs and which AWS connection launches it are deployment settings
    (``DEPLOYMENT_ONLY``), never a trigger's: whoever may trigger a run must not choose
    the credentials or the code that runs on the VMs."""

    kind = "ec2"
    rule = "a mapping like {image_id: ami-...}"
    image_id: Text | None = None
    subnet_id: Text | None = None
    security_group_ids: Annotated[list[Text], Field(max_length=50)] = []
    key_name: Text | None = None
    instance_profile_arn: Text | None = None
    poll_s: PositiveSeconds | None = None
    wait_timeout_s: PositiveSeconds | None = None
    join_timeout_s: PositiveSeconds | None = None
    """How long a training VM's torchrun waits for its peers (default: wait_timeout_s
    plus the install time, ``cloud.ec2.user_data.INSTALL_S``)."""

    @model_validator(mode="before")
    @classmethod
    def _no_deployment_settings(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            for key, setting in DEPLOYMENT_ONLY.items():
                if key in data:
                    raise _PathError(
                        key, f"is a deployment setting ({setting}), not a trigger field"
                    )
        return data


DEPLOYMENT_ONLY: Mapping[str, str] = {
    "aws_conn_id": "the environment variable SRIFTY_AWS_CONN_ID",
    "package": "SRIFTY_WORKER_WHEEL_URI and SRIFTY_WORKER_WHEEL_SHA256",
}
"""Keys of a trigger's ``ec2`` settings that only the deployment may set, and where."""


class ResumeSpec(Strict):
    """Where an earlier run of the job stopped (set by a re-plan)."""

    kind = "resume"
    rule = "a mapping like {checkpoint: ..., iterations_done: 40}"
    checkpoint: LongText
    iterations_done: IterationsDone
    time_spent_s: Seconds = 0.0
    cost_spent_usd: Spent = 0.0
    depleted: Annotated[list[Text], Field(max_length=MAX_OFFERS)] = []
    parent_run_id: RunId | None = None
    job_run_id: RunId | None = None
    allocations: Annotated[list[RunId], Field(max_length=MAX_OFFERS)] = []
    """Allocations the parent run handed over (still running): the re-plan keeps those its
    configuration wants and releases the rest."""


class JobConf(RequestSpec):
    """The conf of the ``srifty_plan_and_train`` DAG: a planning request (``RequestSpec``:
    its fields, defaults and rules) plus the run's settings (``runtime.job.JobSpec``). A
    job trains its model, so ``model`` is a reference (not only a stored profile's name),
    each offer states its ``quota``, and the DAG runs on ``local`` or ``ec2``."""

    kind = "conf"
    rule = "a mapping of conf fields (model, size, global_batch, iterations, offers, ...)"
    model: ModelName
    provider: JobProvider | None = _request_field("provider")
    offers: Annotated[
        list[JobOffer],
        Field(min_length=1, max_length=MAX_OFFERS),
        Rule(f"a list of 1 to {MAX_OFFERS} offers {{type, market, quota[, price, zone]}}"),
    ] = _request_field("offers")  # type: ignore[assignment]  # a list of the narrower offers
    bandwidth: BandwidthSource = "champion"
    ec2: Ec2Settings | None = None
    step_sleep_s: Seconds = Field(
        0.0, description="Extra seconds per step (slows a demo job so it can be interrupted)."
    )
    seed: Seed = 0
    entrypoint: Annotated[list[LongText], Field(max_length=256), Rule("a list of strings")] = Field(
        [],
        description=(
            "Your training script's command, run on every rank torchrun-style "
            "(srifty_core.runtime.user), e.g. ['python', 'train.py', '--lr', '0.1']; "
            "empty: the built-in worker."
        ),
    )
    resume: ResumeSpec | None = Field(
        None, description="Set by a re-plan: where the earlier run stopped."
    )

    @model_validator(mode="after")
    def _ec2_needs_an_image(self) -> JobConf:
        if self.provider == "ec2" and (self.ec2 is None or not self.ec2.image_id):
            raise _PathError("ec2.image_id", "the ec2 provider needs an AMI to launch")
        return self


class ShellJobConf(JobConf):
    """A job file of ``srifty train --job``: the DAG's conf, whose ``provider`` may also be
    the emulated EC2 (``ec2-emulated``, alias ``emulated``), which lives in one process and
    so runs only from the shell (``runtime.emulated_job``), never as the DAG's tasks."""

    provider: ShellJobProvider | None = _request_field("provider")  # type: ignore[assignment]


# ---------------------------------------------------------------------- errors
class HugeInt:
    """An integer literal too long to convert (Python refuses over 4300 digits), as the
    request file readers keep it: no field type accepts it, so the error names the field
    instead of the parser crashing."""

    __slots__ = ("digits",)

    def __init__(self, digits: int) -> None:
        self.digits = digits

    def __repr__(self) -> str:
        return f"a {self.digits}-digit integer"


def field_error(exc: ValidationError, root: Any, where: str = "") -> FieldError:
    """One ``FieldError`` for a pydantic ``ValidationError`` of ``root`` (a model class or
    an annotated type): the first problem, then the paths of the others."""
    problems = []
    errors = exc.errors(include_url=False)
    # An unknown key first: it is most often a typo of the field also reported missing.
    errors.sort(key=lambda e: e["type"] != "extra_forbidden")
    for err in errors:
        path, text = _describe(err, root)
        problems.append((_join(where, path), text, err["type"] == "missing"))
    if not problems:  # pragma: no cover - pydantic always reports one
        return FieldError(where or "value", "is invalid")
    whole = where or str(getattr(root, "kind", "value"))
    (path, text, _), rest = problems[0], problems[1:]
    path = path or whole
    if rest:
        others = [f"{p or whole}{' (missing)' if gone else ''}" for p, _, gone in rest[:5]]
        more = f", {len(rest) - 5} more" if len(rest) > 5 else ""
        text += f" (also wrong: {', '.join(others)}{more})"
    return FieldError(path, text)


def _describe(err: Mapping[str, Any], root: Any) -> tuple[str, str]:
    loc = tuple(err["loc"])
    kind = err["type"]
    if kind == "missing":
        return _path(loc), "missing"
    if kind == "invalid_key":
        return _path(loc[:-1]), f"field names must be strings, got {_show(loc[-1])}"
    if kind == "extra_forbidden":
        node = _node_at(root, loc[:-1])
        valid = list(node.model_fields) if _is_model(node) else []
        what = f"{getattr(node, 'kind', 'field')} field"
        return _path(loc), str(UnknownNameError(what, _clip(str(loc[-1])), valid))
    error = (err.get("ctx") or {}).get("error")
    if isinstance(error, _PathError):
        return _join(_path(loc), error.path), error.problem
    rule = _rule_at(root, loc)
    value = err.get("input")
    if rule is None:
        return _path(loc), f"{err['msg'][:1].lower()}{err['msg'][1:]}, got {_show(value)}"
    return _path(loc), f"must be {rule}, got {_show(value)}"


def _join(where: str, path: str) -> str:
    if not where:
        return path
    if not path:
        return where
    return where + path if path.startswith("[") else f"{where}.{path}"


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{_clip(repr(part))}]"
    return out


def _clip(text: str, n: int = 40) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def _show(value: Any) -> str:
    """A short, safe rendering of a bad value (never the whole of a huge one)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        digits = len(str(abs(value))) if value.bit_length() < 64 else _digits(value)
        return str(value) if digits <= 20 else f"a {digits}-digit integer"
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    if isinstance(value, str):
        return _clip(repr(value))
    if isinstance(value, bytes | bytearray):
        return f"{len(value)} bytes"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return f"a list of {len(value)}" if value else "an empty list"
    if isinstance(value, HugeInt):
        return repr(value)
    if isinstance(value, datetime.date):  # YAML reads 2026-01-01 as a date
        return f"the date {value.isoformat()}"
    return f"a value of type {type(value).__name__}"


def _digits(value: int) -> int:
    """Decimal digits of ``value`` without ``str`` (which refuses over 4300 digits)."""
    v = abs(value)
    d = max(1, math.floor((v.bit_length() - 1) * math.log10(2)) + 1)  # d or d + 1
    return d + 1 if v >= 10**d else d


def _is_model(node: Any) -> bool:
    return isinstance(node, type) and issubclass(node, BaseModel)


def _strip(ann: Any) -> tuple[Any, list[Any]]:
    """``ann`` without ``Optional`` and ``Annotated``, and the metadata they carried."""
    meta: list[Any] = []
    while True:
        origin = typing.get_origin(ann)
        if origin is Annotated:
            ann, *extra = typing.get_args(ann)
            meta.extend(extra)
        elif origin in (Union, types.UnionType):
            args = [a for a in typing.get_args(ann) if a is not type(None)]
            if len(args) != 1:
                return ann, meta
            ann = args[0]
        else:
            return ann, meta


def _node_at(root: Any, loc: tuple[Any, ...]) -> Any:
    """The type at ``loc`` under ``root`` (a model class or an annotated type)."""
    return _walk(root, loc)[0]


def _walk(root: Any, loc: tuple[Any, ...]) -> tuple[Any, list[Any]]:
    ann, meta = _strip(root)
    for part in loc:
        if _is_model(ann) and isinstance(part, str) and part in ann.model_fields:
            f = ann.model_fields[part]
            ann, meta = _strip(f.annotation)
            meta = [*f.metadata, *meta]
        elif isinstance(part, int) and typing.get_origin(ann) in (list, tuple):
            ann, meta = _strip(typing.get_args(ann)[0])
        else:
            return None, []
    return ann, meta


def _rule_at(root: Any, loc: tuple[Any, ...]) -> str | None:
    ann, meta = _walk(root, loc)
    for m in meta:
        if isinstance(m, Rule):
            return m.text
    if _is_model(ann):
        return str(ann.rule)
    return None


# ---------------------------------------------------------------------- checks of values
_ADAPTERS: dict[int, TypeAdapter[Any]] = {}


def check(path: str, kind: Any, value: Any) -> None:
    """Raise ``FieldError`` naming ``path`` unless ``value`` is a valid ``kind`` (one of the
    field types above): how the planner's dataclasses check what they are given."""
    adapter = _ADAPTERS.get(id(kind))
    if adapter is None:
        adapter = _ADAPTERS[id(kind)] = TypeAdapter(kind)
    try:
        adapter.validate_python(value, strict=True)
    except ValidationError as exc:
        raise field_error(exc, kind, path) from None


# ---------------------------------------------------------------------- JSON schemas
def param_schemas(model: type[BaseModel]) -> dict[str, dict[str, Any]]:
    """Per top-level field of ``model``: ``{"schema": ..., "description": ..., "default":
    ...}`` for an Airflow ``Param`` (self-contained JSON schemas: references inlined,
    ``anyOf [X, null]`` written as ``type: [.., "null"]`` for the trigger form).
    ``default`` is absent for a required field."""
    full = model.model_json_schema()
    defs = full.get("$defs", {})
    out: dict[str, dict[str, Any]] = {}
    for name, prop in full["properties"].items():
        schema = _simplify(_inline(prop, defs))
        entry: dict[str, Any] = {}
        if "description" in schema:
            entry["description"] = schema.pop("description")
        if "default" in schema:
            entry["default"] = schema.pop("default")
        entry["schema"] = schema
        out[name] = entry
    return out


def _inline(node: Any, defs: Mapping[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            target = defs[node["$ref"].rsplit("/", 1)[-1]]
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return _inline({**copy.deepcopy(target), **rest}, defs)
        return {k: _inline(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node


def _simplify(node: Any) -> Any:
    if isinstance(node, list):
        return [_simplify(v) for v in node]
    if not isinstance(node, dict):
        return node
    node = {k: _simplify(v) for k, v in node.items() if k != "title"}
    options = node.get("anyOf")
    if isinstance(options, list) and len(options) == 2 and {"type": "null"} in options:
        other = next(o for o in options if o != {"type": "null"})
        if isinstance(other.get("type"), str):
            del node["anyOf"]
            merged = {**other, **node, "type": [other["type"], "null"]}
            if "enum" in merged:
                merged["enum"] = [*merged["enum"], None]
            return merged
    return node
