"""Providers answer what the runtime used to look up by provider name (issue 49): the launch
and volume-detach overheads the planner charges come from the provider's class."""

from __future__ import annotations

import pytest

from srifty_core.cloud import PROVIDERS, provider_class
from srifty_core.errors import UnknownNameError
from srifty_core.jobs.job import JobSpec
from srifty_core.jobs.planning import job_request


@pytest.mark.parametrize("name", PROVIDERS)
def test_each_provider_names_itself_and_its_overheads(name: str) -> None:
    cls = provider_class(name)
    assert cls.name == name
    assert cls.launch_s >= 0.0 and cls.detach_s >= 0.0


def test_the_clouds_charge_a_launch_and_this_machine_does_not() -> None:
    assert provider_class("local").launch_s == provider_class("local").detach_s == 0.0
    for cloud in ("ec2", "ec2-emulated"):  # EC2: about 150 s to running workers, 5 s of EBS
        assert (provider_class(cloud).launch_s, provider_class(cloud).detach_s) == (150.0, 5.0)
    with pytest.raises(UnknownNameError, match="did you mean 'ec2'"):
        provider_class("ec3")


def test_a_job_is_charged_its_providers_launch_unless_it_states_one() -> None:
    base = {"model": "resnet18", "size": "tiny", "global_batch": 64, "iterations": 10,
            "provider": "ec2", "ec2": {"image_id": "ami-0123456789abcdef0"},
            "offers": [{"type": "g4dn.xlarge", "quota": 1}]}  # fmt: skip
    charged = job_request(JobSpec.from_params(base)).overheads.launch_s
    assert charged == provider_class("ec2").launch_s
    stated = job_request(JobSpec.from_params({**base, "overheads": {"launch_s": 30.0}}))
    assert stated.overheads.launch_s == 30.0


def test_this_hosts_processes_and_the_clouds_answer_the_runtimes_questions() -> None:
    local, emulated, ec2 = (provider_class(n) for n in ("local", "ec2-emulated", "ec2"))
    assert local.shares_host and not local.billed and local.reports_exit_codes
    assert local.starts_at_once and local.one_allocation_per_worker
    assert not local.interruptions_deplete_spot
    for cloud in (emulated, ec2):  # VMs, billed, spot capacity taken back is gone
        assert not cloud.shares_host and cloud.billed and cloud.interruptions_deplete_spot
        assert not (cloud.reports_exit_codes or cloud.starts_at_once)
    assert ec2.starts_workers_at_launch and not emulated.starts_workers_at_launch
    assert emulated.simulated and not (ec2.simulated or local.simulated)
