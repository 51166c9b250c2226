from __future__ import annotations

from pathlib import Path

import pytest

from srifty_core import paths


def test_data_dir_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(paths.ENV_VAR, str(tmp_path / "from-env"))
    assert paths.data_dir() == tmp_path / "from-env"
    assert paths.data_dir(tmp_path / "explicit") == tmp_path / "explicit"
    monkeypatch.delenv(paths.ENV_VAR)
    assert paths.data_dir() == paths.REPO_ROOT / "data"


def test_everything_lives_under_the_data_dir(data_dir: Path) -> None:
    root = paths.data_dir()
    assert root == data_dir
    for sub in (
        paths.probe_store_dir(),
        paths.profiles_dir(),
        paths.mlflow_dir(),
        paths.airflow_home(),
        paths.reports_dir(),
        paths.price_overlay_dir(),
    ):
        assert sub.parent == root


def test_shipped_data_is_in_the_package() -> None:
    assert (paths.CATALOG_DIR / "ec2_gpu_catalog.csv").is_file()
    assert (paths.REFERENCE_DIR / "nccl_tests_public.csv").is_file()
    assert (paths.REFERENCE_PROFILES_DIR / "resnet50.json").is_file()
    assert (paths.SHIPPED_DATA_DIR / "SOURCES.md").is_file()
