"""All five refresh steps in one process (``srifty fit-bandwidth``):
``refresh_bandwidth_model`` runs them through a staging folder and returns what each said
(``RefreshOutcome``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from srifty_core.predictors.refresh.config import RefreshConfig
from srifty_core.predictors.refresh.data import stage_data
from srifty_core.predictors.refresh.evaluate import evaluate
from srifty_core.predictors.refresh.fit import tune_and_fit
from srifty_core.predictors.refresh.promote import promote_or_not
from srifty_core.predictors.refresh.register import register
from srifty_core.predictors.refresh.staging import FIT_FILE, remove_staging, staging_dir


@dataclass
class RefreshOutcome:
    """What each step said. ``staging`` is where the steps handed over their files (gone
    once ``refresh_bandwidth_model`` made it and returned); ``promotion["registered"]`` is
    False when the champion was fitted on the same data and nothing was registered."""

    staging: Path
    data: dict[str, Any]
    fit: dict[str, Any]
    evaluation: dict[str, Any]
    promotion: dict[str, Any] = field(default_factory=dict)


def refresh_bandwidth_model(
    config: RefreshConfig,
    *,
    tracking_uri: str | None = None,
    staging: Path | None = None,
    root: Path | None = None,
) -> RefreshOutcome:
    """All five steps in this process. The staging folder is removed when they end, done or
    failed, unless the caller gave it (``staging``)."""
    folder = staging or staging_dir()
    try:
        data = stage_data(config, folder, root)
        tune_and_fit(folder)
        evaluation = evaluate(folder, tracking_uri)
        register(folder, tracking_uri)
        promotion = promote_or_not(folder, tracking_uri)
        fit = json.loads((folder / FIT_FILE).read_text())
    finally:
        if staging is None:
            remove_staging(folder)
    return RefreshOutcome(folder, data, fit, evaluation, promotion)
