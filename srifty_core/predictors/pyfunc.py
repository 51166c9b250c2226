"""The MLflow pyfunc wrapper of the bandwidth model (imports mlflow: load it lazily).

A module-level class, so the logged model pickles it by reference and loading it does not
re-create the class."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    import mlflow.pyfunc

from srifty_core.predictors.bandwidth import BandwidthModel

PREDICTOR_ARTIFACT = "predictor"

with warnings.catch_warnings():
    # MLflow asks for type hints on predict to infer a signature; this model logs none.
    warnings.simplefilter("ignore", UserWarning)

    class BusbwPyfunc(mlflow.pyfunc.PythonModel):  # type: ignore[misc,name-defined]
        """``predict(DataFrame of FEATURE_COLUMNS) -> busbw bytes/s``; ``model`` is the full
        ``BandwidthModel`` (caps included)."""

        def load_context(self, context: Any) -> None:
            self.model = BandwidthModel.load(Path(context.artifacts[PREDICTOR_ARTIFACT]))

        def predict(self, context, model_input, params=None):  # type: ignore[no-untyped-def]
            return self.model.predict(model_input)
