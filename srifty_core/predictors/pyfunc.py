"""The bandwidth model as an MLflow pyfunc, logged *as code* (MLflow's models from code).

``registry.log_fit`` passes this file's path as ``python_model``: MLflow copies the source
file into the logged model and pickles nothing. The code runs only where someone loads the
version with ``mlflow.pyfunc.load_model`` (``mlflow models serve``, ``mlflow.models.predict``;
srifty must be installed there) and then reads the ``predictor`` artifact with
``BandwidthModel.load``. Srifty itself never loads a version that way
(``registry.load_champion`` reads the artifact directly) and never imports this module:
running it hands the model object to ``mlflow.models.set_model``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pandas as pd

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    import mlflow.models
    import mlflow.pyfunc

from srifty_core.predictors.bandwidth import BandwidthModel
from srifty_core.predictors.registry import PREDICTOR_ARTIFACT


class BusbwPyfunc(mlflow.pyfunc.PythonModel):  # type: ignore[misc,name-defined]
    """``predict(DataFrame of FEATURE_COLUMNS) -> busbw bytes/s``; ``model`` is the full
    ``BandwidthModel`` (caps included)."""

    def load_context(self, context: Any) -> None:
        self.model = BandwidthModel.load(Path(context.artifacts[PREDICTOR_ARTIFACT]))

    def predict(
        self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> Any:
        return self.model.predict(model_input)


mlflow.models.set_model(BusbwPyfunc())
