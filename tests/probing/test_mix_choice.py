"""Which mixes a sweep probes (issue 52 item 1): recent plans' mixes first, then a small
design over GPUs per VM, rated links and VM counts, within the budget."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pandas as pd
import pytest

from srifty_core.cloud.base import InstanceSpec
from srifty_core.errors import ConfigError
from srifty_core.probing.mix_choice import (
    choose_mixes,
    configuration_mix,
    mixes_to_probe,
    stored_mixes,
)
from srifty_core.probing.store import write_partition
from tests.probing.rows import make_rows


def _spec(name: str, gpus: int, gbps: float) -> InstanceSpec:
    return InstanceSpec(name, "T4", gpus, 4 * gpus, gbps, gpus)


SMALL, BIG, TWIN, WIDE = (
    _spec("a.1", 1, 10.0), _spec("b.4", 4, 50.0), _spec("c.1", 1, 10.0), _spec("d.4", 4, 10.0)
)  # fmt: skip


def test_configuration_labels_give_their_mixes() -> None:
    assert configuration_mix("2xp3.8xlarge@512+8xg3.8xlarge@64+1xp3.8xlarge@8") == {
        "g3.8xlarge": 8,
        "p3.8xlarge": 3,
    }
    assert configuration_mix("4xp3.8xlarge@16") is None  # one type: no mix
    assert configuration_mix("garbage") is None


def test_recent_mixes_come_first_most_used_first_and_stored_ones_are_skipped() -> None:
    recent = ["1xa.1@8+1xc.1@8", "2xb.4@4+1xa.1@2", "1xc.1@8+1xa.1@8", "1xb.4@4+1xd.4@4"]
    got = choose_mixes(recent, [], ["mix_1xb.4_1xd.4"], budget=5)
    assert got == [{"a.1": 1, "c.1": 1}, {"a.1": 1, "b.4": 2}]
    assert choose_mixes(recent, [], [], budget=1) == [{"a.1": 1, "c.1": 1}]
    assert choose_mixes(recent, [SMALL, BIG], [], budget=0) == []


def test_the_design_covers_gpus_per_vm_and_links_before_vm_counts() -> None:
    got = choose_mixes([], [WIDE, TWIN, BIG, SMALL], [], budget=4)
    # GPUs per VM and links both differ, then GPUs alone, then links alone, then neither
    assert got == [{"a.1": 1, "b.4": 1}, {"a.1": 1, "d.4": 1}, {"b.4": 1, "d.4": 1},
                   {"a.1": 1, "c.1": 1}]  # fmt: skip
    more = choose_mixes([], [WIDE, TWIN, BIG, SMALL], [], budget=6)
    assert more[:4] == got and more[4] == {"a.1": 2, "b.4": 1}  # two VMs of the 1-GPU type
    assert choose_mixes([], [SMALL, BIG], [], budget=9) == [
        {"a.1": 1, "b.4": 1},
        {"a.1": 2, "b.4": 1},
    ]


def test_stored_mixes_reads_folder_names_within_the_window(data_dir: Path) -> None:
    label = "mix_1xa.1_1xb.4"
    for day in (date(2026, 3, 1), date(2026, 3, 20)):
        rows = make_rows(2, day=day, provider="local", instance_type=label, allocation_id="x+y")
        write_partition(pd.DataFrame(rows), day=day, provider="local", instance_type=label)
    assert stored_mixes("local", date(2026, 3, 10)) == {label}
    assert stored_mixes("local", date(2026, 3, 21)) == set()
    assert stored_mixes("ec2", date(2026, 1, 1)) == set()


def test_after_the_design_every_offered_type_joins_a_mix() -> None:
    many = [_spec(f"t{k}.1", 1, 10.0) for k in range(5)]  # one level combination only
    got = choose_mixes([], many, [], budget=10)
    assert got[:2] == [{"t0.1": 1, "t1.1": 1}, {"t0.1": 2, "t1.1": 1}]
    assert {t for m in got for t in m} == {s.name for s in many} and len(got) == 5


def test_a_sweep_probes_the_listed_mixes_then_chosen_ones_even_without_recent_plans(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def unreadable() -> list[str]:
        raise RuntimeError("MLflow is down")

    got = mixes_to_probe(["b.4:1,a.1:1"], [SMALL, BIG], "local", date(2026, 3, 1), 1, unreadable)
    assert got == [{"a.1": 1, "b.4": 1}, {"a.1": 2, "b.4": 1}]  # the listed one is not chosen again
    assert "recent plans unreadable (MLflow is down)" in capsys.readouterr().out
    recent = ["1xa.1@8+1xd.4@8"]
    assert mixes_to_probe([], [SMALL, BIG], "local", date(2026, 3, 1), 1, lambda: recent) == [
        {"a.1": 1, "d.4": 1}
    ]
    with pytest.raises(ConfigError, match=r"^mixes\[1\]: "):
        mixes_to_probe(["a.1:1,b.4:1", "a.1:1"], [], "local", date(2026, 3, 1), 0, list)
