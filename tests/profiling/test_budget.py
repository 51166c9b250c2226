"""The profiler's budget (``profiling.budget``): one home for its defaults, from which the
``srifty profile`` flags and the profile DAG's Params are made. No profiling here."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from srifty_core.errors import ConfigError
from srifty_core.profiling.budget import (
    DEFAULT_BUDGET,
    KNOBS,
    SHARE_HOST_CPU,
    ProfilerBudget,
    add_budget_flags,
    budget_from_params,
    budget_params,
)


def _profile_parser() -> argparse.ArgumentParser:
    """``srifty profile``'s parser, as ``cli.parser.build_parser`` makes it."""
    from srifty_core.cli.parser import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["profile"]


def test_every_flag_is_made_from_its_field_default_and_help() -> None:
    parser = _profile_parser()
    defaults = vars(parser.parse_args(["--model", "resnet18"]))
    offered = {n for n, k in KNOBS.items() if k.flag != ""}
    assert offered == set(KNOBS)  # every field has a flag
    assert {n: defaults[n] for n in offered} == {n: getattr(DEFAULT_BUDGET, n) for n in offered}
    helps = {a.dest: a.help or "" for a in parser._actions}
    for name in offered:
        assert helps[name].startswith(KNOBS[name].help), name
    assert "(default: 4)" in helps["probes"] and "2 on a CPU" in helps["share_host"]
    args = parser.parse_args(["--model", "m", "--memory-cap", "1KiB", "--batch-sizes", "1,8"])
    assert args.memory_cap_bytes == 1024 and args.batch_sizes == (1, 8)


def test_a_field_the_flags_cannot_parse_is_named() -> None:
    with pytest.raises(TypeError, match="batch_sizes"):
        add_budget_flags(argparse.ArgumentParser())


def test_every_param_is_made_from_its_field_default_bounds_and_help() -> None:
    params = budget_params()
    assert set(params) == {
        "probes", "repeats", "memory_cap_mib", "max_batch", "threads", "refine", "share_host",
    }  # fmt: skip
    assert params["probes"] == {
        "default": 4,
        "type": "integer",
        "minimum": 2,
        "maximum": 32,
        "description": "Batch sizes to measure. Default: 4.",
    }
    assert params["share_host"]["type"] == ["null", "integer"]
    assert params["share_host"]["default"] is None and params["share_host"]["maximum"] == 64
    assert (
        params["memory_cap_mib"]["minimum"] == 1
        and "MiB" in params["memory_cap_mib"]["description"]
    )
    assert params["refine"]["minimum"] == 0 and params["repeats"]["minimum"] == 2


def test_a_triggers_params_become_the_budgets_fields_in_their_units() -> None:
    got = budget_from_params({"memory_cap_mib": 2, "probes": 3, "share_host": None, "x": 1})
    assert got == {"memory_cap_bytes": 2 * 2**20, "probes": 3, "share_host": None}
    assert ProfilerBudget(**got).memory_cap_bytes == 2**21


def test_share_host_defaults_to_two_workers_on_a_cpu_and_none_elsewhere() -> None:
    assert DEFAULT_BUDGET.shared_workers(cpu=True) == SHARE_HOST_CPU == 2
    assert DEFAULT_BUDGET.shared_workers(cpu=False) == 1
    assert ProfilerBudget(colocated=2).shared_workers(cpu=True) == 1  # profiled under load
    assert ProfilerBudget(share_host=3).shared_workers(cpu=True) == 3
    assert ProfilerBudget(share_host=3).shared_workers(cpu=False) == 1
    with pytest.raises(ConfigError, match="colocated and share_host"):
        ProfilerBudget(share_host=2, colocated=2)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("repeats", 1, "repeats must be >= 2, got 1"),
        ("warmup", -1, "warmup must be >= 0, got -1"),
        ("max_step_s", float("nan"), "max_step_s must be >= 0"),
        ("share_host", 0, "share_host must be >= 1, got 0"),
        ("memory_cap_bytes", 0, "memory_cap must be at least 1 byte, got 0"),
    ],
)
def test_a_value_below_its_fields_minimum_is_refused_naming_it(
    field: str, value: object, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(DEFAULT_BUDGET, **{field: value})
