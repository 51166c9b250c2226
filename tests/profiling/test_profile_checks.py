"""Profiles are checked on read (issue 48): a stored profile with impossible numbers, or
under another device's name, is one line naming the file, never a plan made on it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from srifty_core.errors import ConfigError
from srifty_core.profiling.store import ProfileStore, read_profile
from tests.profiling.test_profile_contract import make_profile

SHIPPED = Path(__file__).resolve().parents[2] / "srifty_core" / "shipped" / "reference_profiles"


def _nan_slopes(d: dict[str, Any]) -> Any:
    d["fw_fit"]["slopes"] = [float("nan")] * len(d["fw_fit"]["slopes"])
    return d


def _negative_times(d: dict[str, Any]) -> Any:
    n = len(d["bw_fit"]["slopes"])
    d["bw_fit"]["slopes"], d["bw_fit"]["intercepts"] = [-1.0] * n, [-1.0] * n
    return d


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    def change(d: dict[str, Any]) -> Any:
        d[key] = value
        return d

    return change


def _bucket(**changes: Any) -> Callable[[dict[str, Any]], Any]:
    def change(d: dict[str, Any]) -> Any:
        d["buckets"][0] |= changes
        return d

    return change


def _stats(**changes: Any) -> Callable[[dict[str, Any]], Any]:
    def change(d: dict[str, Any]) -> Any:
        d["fw"] |= changes
        return d

    return change


@pytest.mark.parametrize(
    ("damage", "field"),
    [
        (_nan_slopes, "fw_fit.slopes"),
        (_negative_times, "bw_fit"),
        (_set("b_max", 0), "b_max"),
        (_set("buckets", []), "buckets"),
        (lambda d: [d], "JSON object"),
        (_set("b_max", "lots"), "wrong kind"),
        (_set("memory_per_sample_bytes", -1.0), "memory_per_sample_bytes"),
        (_set("gradient_bytes", 0), "gradient_bytes"),
        (_bucket(ready_fraction=2.0), r"buckets\[0\].ready_fraction"),
        (_bucket(index=3), r"buckets\[0\].index"),
        (_stats(mean_s=[-0.01, 0.01, 0.04, 0.3]), r"fw.mean_s"),
        (_stats(std_s=[float("inf")] * 4), r"fw.std_s"),
        (_set("optimizer_step_s", float("nan")), "optimizer_step_s"),
    ],
)
def test_a_stored_profile_with_impossible_numbers_is_one_line_naming_it(
    data_dir: Path, damage: Callable[[dict[str, Any]], Any], field: str
) -> None:
    store = ProfileStore()
    path = store.save(make_profile(device_type="T4"))
    path.write_text(json.dumps(damage(json.loads(path.read_text()))))
    with pytest.raises(ConfigError, match=field) as err:
        store.load("resnet18", "small", "T4")
    assert str(path) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=field):
        store.vm_spreads()  # every reader of the store checks


def test_a_profile_under_another_devices_name_is_refused(data_dir: Path) -> None:
    """A T4 profile copied to ``V100.json`` was used for V100 (the store trusted the name)."""
    store = ProfileStore()
    t4 = store.save(make_profile(device_type="T4"))
    v100 = t4.with_name("V100.json")
    shutil.copy(t4, v100)
    with pytest.raises(ConfigError, match=r"V100.json: holds the profile of resnet18/small/T4"):
        store.load("resnet18", "small", "V100")
    assert store.load("resnet18", "small", "T4").device_type == "T4"
    v100.write_text(make_profile(device_type="V100", size="full").to_json())
    with pytest.raises(ConfigError, match="size full"):
        store.load("resnet18", "small", "V100")


def test_files_that_are_no_json_are_named(tmp_path: Path) -> None:
    path = tmp_path / "cpu.json"
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match=r"cpu.json: not UTF-8"):
        read_profile(path)
    path.write_text('{"schema_version": 1, ')
    with pytest.raises(ConfigError, match=r"cpu.json: not valid JSON \(line 1"):
        read_profile(path)


def test_every_shipped_reference_profile_passes_the_checks() -> None:
    paths = sorted(SHIPPED.rglob("*.json"))
    profiles = [read_profile(p) for p in paths if not p.name.endswith(".meta.json")]
    assert len(profiles) >= 8 and all(p.b_max >= 1 for p in profiles)
