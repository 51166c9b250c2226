"""What a cloud profiling run asks for (``CloudProfileRequest``: the model, its size and
training settings, the profiler's budget) and the checks of the run's provider, instance
types, market and EC2 settings before anything is launched (``check_cloud_request``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from srifty_core.catalog import Catalog
from srifty_core.catalog.types import Market
from srifty_core.cloud import provider_class
from srifty_core.errors import ConfigError, FieldError, SriftyError, UnknownNameError
from srifty_core.planner.schema.field_errors import field_error
from srifty_core.planner.schema.job_conf import Ec2Settings
from srifty_core.profiling.budget import DEFAULT_BUDGET, DEFAULT_SIZE, KNOBS
from srifty_core.training_settings import DEFAULT_SETTINGS, TrainingSettings
from srifty_core.trigger_models import registered_model
from srifty_core.workloads import SIZES, parse_model

CLOUD_PROVIDERS = ("ec2-emulated", "ec2")
"""Providers a profile can be taken on (``cloud.PROVIDERS`` less ``local``, whose
profiles the DAG's ``device_types`` take on the worker itself)."""


_BUDGET_FIELDS = ("probes", "repeats", "refine", "max_batch")
"""The budget a VM's profiler is given (the rest keeps the profiler's defaults)."""


@dataclass(frozen=True, slots=True)
class CloudProfileRequest:
    """What to profile on each VM: the model reference and size, the training settings,
    and the profiler's budget (``srifty profile``'s ``--probes``, ``--repeats``,
    ``--refine``, ``--max-batch``: none means the GPU's memory bounds B_max), defaults and
    bounds from ``ProfilerBudget``."""

    model: str
    size: str = DEFAULT_SIZE
    settings: TrainingSettings = DEFAULT_SETTINGS
    probes: int = DEFAULT_BUDGET.probes  # type: ignore[assignment]  # 4: never dense on a VM
    repeats: int = DEFAULT_BUDGET.repeats
    refine: int = DEFAULT_BUDGET.refine
    max_batch: int | None = DEFAULT_BUDGET.max_batch

    def __post_init__(self) -> None:
        try:
            parse_model(self.model)
        except ConfigError as exc:
            raise FieldError("model", str(exc)) from None
        if self.size not in SIZES:
            raise FieldError("size", f"one of {', '.join(SIZES)}, got {self.size!r}")
        for name in _BUDGET_FIELDS[:3]:
            value, low = getattr(self, name), KNOBS[name].minimum or 0
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise FieldError(name, f"an integer >= {low:g}, got {value!r}")
        if self.max_batch is not None and (
            isinstance(self.max_batch, bool) or not isinstance(self.max_batch, int)
            or self.max_batch < 1
        ):  # fmt: skip
            raise FieldError("max_batch", f"null or an integer >= 1, got {self.max_batch!r}")

    @classmethod
    def from_params(cls, p: Mapping[str, Any]) -> CloudProfileRequest:
        """From the profiling DAG's params (or any mapping with those keys): a trigger's,
        so the model must be registered (``trigger_models``: never a file path)."""
        try:
            model = registered_model(p["model"])
        except ConfigError as exc:
            raise FieldError("model", str(exc).removeprefix("model: ")) from None
        return cls(
            model=model,
            size=p.get("size", DEFAULT_SIZE),
            settings=TrainingSettings.from_dict(p),
            **{k: p[k] for k in _BUDGET_FIELDS if k in p},
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("settings")
        return {**d, **self.settings.to_dict()}

    def profiler_argv(self, out: str) -> list[str]:
        """The ``srifty`` command a GPU VM runs: the profiler on its CUDA device, with the
        training settings, the budget, no MLflow, the profile written to ``out``."""
        argv = ["profile", "--model", self.model, "--size", self.size, "--device", "cuda"]
        argv += ["--no-mlflow", "--precision", self.settings.precision]
        argv += ["--optimizer", self.settings.optimizer]
        if self.settings.compile:
            argv.append("--compile")
        if self.settings.channels_last:
            argv.append("--channels-last")
        if self.settings.tf32:
            argv.append("--tf32")
        argv += ["--probes", str(self.probes), "--repeats", str(self.repeats)]
        argv += ["--refine", str(self.refine)]
        if self.max_batch is not None:
            argv += ["--max-batch", str(self.max_batch)]
        return [*argv, "--out", out]


def check_cloud_request(
    provider: str,
    instance_types: Sequence[str],
    *,
    market: str = "on-demand",
    region: str = "us-east-1",
    ec2: Mapping[str, Any] | None = None,
    model: str | None = None,
) -> list[str]:
    """Check what a cloud profiling run needs before anything is launched; returns the
    instance types as the catalog names them. Each problem is a ``FieldError`` naming its
    field (``provider``, ``instance_types[1]``, ``market``, ``ec2.image_id``, ...)."""
    if provider not in CLOUD_PROVIDERS:
        raise FieldError("provider", f"one of {', '.join(CLOUD_PROVIDERS)}, got {provider!r}")
    if not instance_types:
        raise FieldError("instance_types", "give at least one catalog instance type")
    if len(set(instance_types)) != len(instance_types):
        raise FieldError("instance_types", f"each type once, got {list(instance_types)}")
    try:
        Market.parse(market)
    except (ConfigError, UnknownNameError, ValueError) as exc:
        raise FieldError("market", str(exc)) from None
    catalog = Catalog.load()
    try:
        catalog.check_region(region)
    except (ConfigError, UnknownNameError) as exc:
        raise FieldError("region", str(exc)) from None
    out = []
    for i, name in enumerate(instance_types):
        try:
            t = catalog.get(name, region)
        except (ConfigError, UnknownNameError) as exc:
            raise FieldError(f"instance_types[{i}]", str(exc)) from None
        if t.gpu is None or t.gpus_per_vm < 1:
            raise FieldError(f"instance_types[{i}]", f"{name} has no GPU to profile")
        try:  # a VM that cannot be billed is not launched
            if Market.parse(market) is Market.SPOT:
                catalog.cheapest_spot(t.name, region)
            else:
                catalog.price(t.name, Market.ON_DEMAND, region)
        except SriftyError as exc:
            raise FieldError(f"instance_types[{i}]", f"{name}: {exc}") from None
        out.append(t.name)
    if not provider_class(provider).simulated:  # a real VM: EC2's settings, a model it has
        ec2_settings(ec2 or {})
        if model is not None and parse_model(model).kind == "file":
            raise FieldError(
                "model",
                f"{model!r} is a file on this machine, not on the VM: profile a zoo name, "
                "hf:NAME or an installed package.module:factory on EC2",
            )
    return out


def ec2_settings(ec2: Mapping[str, Any]) -> dict[str, Any]:
    """The trigger's ``ec2`` block checked as the plan-and-train DAG's (no deployment
    settings, an AMI required)."""
    from pydantic import ValidationError

    try:
        settings = Ec2Settings.model_validate(dict(ec2))
    except ValidationError as exc:
        raise field_error(exc, Ec2Settings, "ec2") from None
    if not settings.image_id:
        raise FieldError("ec2.image_id", "the ec2 provider needs an AMI to launch")
    return settings.model_dump(exclude_none=True)
