"""Run srifty_profile_model for real with dag.test() on the CPU with a tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from srifty_core.profiling.store import ProfileStore

pytestmark = pytest.mark.airflow


def test_profile_model_dag_writes_the_profile(dagbag: Any, data_dir: Path) -> None:
    dag = dagbag.get_dag("srifty_profile_model")
    run = dag.test(
        run_conf={
            "model": "resnet18",
            "size": "tiny",
            "device_types": ["cpu"],
            "probes": 3,
            "repeats": 2,
            "max_batch": 8,
        }
    )
    assert run.state == "success"
    profile = ProfileStore().load("resnet18", "tiny", "cpu")
    assert profile.b_max == 8 and len(profile.fw.batch_sizes) == 3 + len(profile.probe_checks)
    assert 1 <= len(profile.probe_checks) <= 3  # the DAG's default refine
    assert [k for k, _ in profile.shared_slowdown] == [2]  # share_host 2 on cpu
    assert (data_dir / "mlflow" / "mlflow.db").is_file()


def test_bad_model_names_the_field(dagbag: Any) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    dag = dagbag.get_dag("srifty_profile_model")
    with pytest.raises(ParamValidationError, match="model"):
        dag.test(run_conf={"model": "resnet19"})
    with pytest.raises(ParamValidationError, match="device_types"):
        dag.test(run_conf={"device_types": ["tpu"]})
