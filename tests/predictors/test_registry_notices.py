"""MLflow prints its notices ("Successfully registered model ...") to stderr, which an
Airflow task logs as errors: registering a bandwidth model logs them at INFO instead."""

from __future__ import annotations

import logging

import pytest

from srifty_core.tracking.registry import _notices_as_info

LOGGER = "srifty_core.tracking.registry"


def test_mlflow_notices_become_info_lines(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    from mlflow.utils.logging_utils import eprint

    with caplog.at_level(logging.INFO, logger=LOGGER), _notices_as_info():
        eprint("Successfully registered model 'srifty-busbw'.")
    assert capsys.readouterr().err == ""
    (record,) = [r for r in caplog.records if "Successfully registered" in r.getMessage()]
    assert record.levelno == logging.INFO
    assert record.getMessage() == "MLflow: Successfully registered model 'srifty-busbw'."
