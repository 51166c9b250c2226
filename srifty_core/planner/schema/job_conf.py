"""The conf of the ``srifty_plan_and_train`` DAG (``JobConf``: a ``RequestSpec`` plus the
run's settings: EC2 launch settings, where an earlier run stopped, ...) and a job file of
``srifty train --job`` (``ShellJobConf``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import Field, model_validator

from srifty_core.planner.schema.field_errors import PathError
from srifty_core.planner.schema.fields import (
    MAX_OFFERS,
    BandwidthSource,
    IterationsDone,
    JobProvider,
    LongText,
    ModelName,
    PositiveSeconds,
    Quota,
    Rule,
    RunId,
    Seconds,
    Seed,
    ShellJobProvider,
    Spent,
    Text,
)
from srifty_core.planner.schema.request_spec import OfferSpec, RequestSpec
from srifty_core.planner.schema.strict import Strict


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
    security_group_ids: Annotated[list[Text], Field(max_length=50)] = Field([])
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
                    raise PathError(
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
    depleted: Annotated[list[Text], Field(max_length=MAX_OFFERS)] = Field([])
    parent_run_id: RunId | None = None
    job_run_id: RunId | None = None
    allocations: Annotated[list[RunId], Field(max_length=MAX_OFFERS)] = Field([])
    """Allocations the parent run handed over (still running): the re-plan keeps those its
    configuration wants and releases the rest."""


class JobConf(RequestSpec):
    """The conf of the ``srifty_plan_and_train`` DAG: a planning request (``RequestSpec``:
    its fields, defaults and rules) plus the run's settings (``jobs.job.JobSpec``). A
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
            "(srifty_core.worker.user), e.g. ['python', 'train.py', '--lr', '0.1']; "
            "empty: the built-in worker."
        ),
    )
    resume: ResumeSpec | None = Field(
        None, description="Set by a re-plan: where the earlier run stopped."
    )

    @model_validator(mode="after")
    def _ec2_needs_an_image(self) -> JobConf:
        if self.provider == "ec2" and (self.ec2 is None or not self.ec2.image_id):
            raise PathError("ec2.image_id", "the ec2 provider needs an AMI to launch")
        return self


class ShellJobConf(JobConf):
    """A job file of ``srifty train --job``: the DAG's conf, whose ``provider`` may also be
    the emulated EC2 (``ec2-emulated``, alias ``emulated``), which lives in one process and
    so runs only from the shell (``jobs.emulated_job``), never as the DAG's tasks."""

    provider: ShellJobProvider | None = _request_field("provider")  # type: ignore[assignment]
