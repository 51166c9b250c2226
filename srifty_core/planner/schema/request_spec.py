"""A planning request: ``RequestSpec`` (a ``srifty plan`` request file, and the planning part
of a job's conf), its offers (``OfferSpec``) and its overheads (``OverheadsSpec``). Each
field and its default is defined here once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, model_validator

from srifty_core.planner.schema.field_errors import PathError
from srifty_core.planner.schema.fields import (
    DEFAULT_OBJECTIVE,
    DEFAULT_RISK_QUANTILE,
    DEFAULT_STRATEGY,
    LOCAL_TYPE,
    MAX_OFFERS,
    Flag,
    GlobalBatch,
    Granularity,
    Iterations,
    Limit,
    MarketName,
    MinBatch,
    MonthlyShare,
    ObjectiveName,
    OptimizerName,
    PrecisionName,
    Quota,
    RiskQuantile,
    Rule,
    Seconds,
    ShellJobProvider,
    SizeName,
    SpotPricing,
    StoredModel,
    StrategyName,
    Text,
)
from srifty_core.planner.schema.strict import Strict

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
            raise PathError(
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
    tf32: Flag = False
    """Training settings (``training_settings``): the profiles read are those taken with
    them; ``tf32``: matrix products and convolutions in TF32 on GPUs that have it."""
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
    strategy: StrategyName = Field(
        DEFAULT_STRATEGY,
        description=(
            "How the ranks hold the model: auto (the planner chooses the fastest or "
            "cheapest of ddp, fsdp and hsdp per configuration), or ddp (every rank a whole "
            "replica), fsdp (state sharded over every rank) or hsdp (sharded inside a VM, "
            "replicated across VMs) pinned."
        ),
    )
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
