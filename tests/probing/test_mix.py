"""Mixed-type rings in the probe store: the label (one canonical, partition-safe spelling),
its checks, and the worker sweep's refusal to fake a ring it cannot run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from srifty_core.errors import ConfigError
from srifty_core.probing.mix import is_mix, mix_label, parse_mix, parse_mix_spec
from srifty_core.probing.schema import ProbeSchemaError, conform
from srifty_core.probing.store import partition_dir, read_probes, write_partition
from tests.probing.rows import DAY, make_rows

LABEL = "mix_1xg4dn.12xlarge_3xg4dn.xlarge"


def test_label_is_canonical_and_parses_back() -> None:
    assert mix_label({"g4dn.xlarge": 3, "g4dn.12xlarge": 1}) == LABEL  # sorted by name
    assert parse_mix(LABEL) == {"g4dn.12xlarge": 1, "g4dn.xlarge": 3}
    assert is_mix(LABEL) and not is_mix("g4dn.xlarge") and not is_mix("local.cpu")
    partition_dir(DAY, "ec2-emulated", LABEL)  # names a partition folder as it is
    assert parse_mix_spec("g4dn.xlarge:3, g4dn.12xlarge:1") == parse_mix(LABEL)


@pytest.mark.parametrize(
    ("label", "match"),
    [
        ("mix_3xg4dn.xlarge_1xg4dn.12xlarge", "not canonical.*mix_1xg4dn.12xlarge_3xg4dn"),
        ("mix_1xg4dn.xlarge", "at least two instance types"),
        ("mix_0xg4dn.xlarge_1xp3.2xlarge", "member '0xg4dn.xlarge'"),
        ("mix_g4dn.xlarge*1+p3.2xlarge*1", "is not <count>x<instance type>"),
        ("mix_1xp3.2xlarge_2xp3.2xlarge", "names p3.2xlarge twice"),
        ("g4dn.xlarge", "not a mix label"),
    ],
)
def test_bad_labels_name_the_field(label: str, match: str) -> None:
    with pytest.raises(ConfigError, match=f"^instance_type: .*{match}"):
        parse_mix(label)


@pytest.mark.parametrize(
    ("counts", "match"),
    [
        ({"g4dn.xlarge": 3}, "at least two"),
        ({"g4dn.xlarge": 0, "p3.2xlarge": 1}, "VM count of g4dn.xlarge must be an integer >= 1"),
        ({"g4dn.xlarge": True, "p3.2xlarge": 1}, "integer >= 1, got True"),
        ({"g4dn_x": 1, "p3.2xlarge": 1}, "'g4dn_x' is not an instance type name"),
    ],
)
def test_bad_mixes_name_the_field(counts: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=f"^mix: .*{match}"):
        mix_label(counts)
    with pytest.raises(ConfigError, match=r"^--mix: "):
        parse_mix_spec("g4dn.xlarge=3")


def test_store_keeps_mix_rows_and_refuses_a_bad_label(data_dir: Path) -> None:
    rows = make_rows(3, provider="ec2-emulated", instance_type=LABEL, allocation_id="a+b")
    write_partition(pd.DataFrame(rows), day=DAY, provider="ec2-emulated", instance_type=LABEL)
    back = read_probes(instance_types=[LABEL])
    assert list(back["instance_type"].unique()) == [LABEL] and len(back) == 3
    bad = make_rows(2, instance_type="mix_3xg4dn.xlarge_1xg4dn.12xlarge")
    with pytest.raises(ProbeSchemaError, match=r"instance_type: .*not canonical"):
        conform(pd.DataFrame(bad))
