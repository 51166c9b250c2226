"""The ``PythonModel`` that serves a model logged from code: ``set_model(load, artifact)``.

A file logged as a model's code (MLflow's models from code) calls ``set_model`` with the
function that reads the model from its artifact folder; where someone loads the version
with ``mlflow.pyfunc.load_model`` (``mlflow models serve``, ``mlflow.models.predict``),
MLflow runs that file, then ``load_context`` reads the artifact and ``predict`` answers
with the model's ``predict``. Importing this module loads MLflow: only such a code file
imports it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    import mlflow.models
    import mlflow.pyfunc


class Predictor(Protocol):
    def predict(self, features: pd.DataFrame) -> Any: ...


class FolderModel(mlflow.pyfunc.PythonModel):  # type: ignore[misc,name-defined]
    """``predict(DataFrame) -> the model's predictions``; the model is ``load`` of the
    folder logged as artifact ``artifact``."""

    def __init__(self, load: Callable[[Path], Predictor], artifact: str) -> None:
        self._load = load
        self._artifact = artifact

    def load_context(self, context: Any) -> None:
        self.model = self._load(Path(context.artifacts[self._artifact]))

    def predict(
        self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> Any:
        return self.model.predict(model_input)


def set_model(load: Callable[[Path], Predictor], artifact: str) -> None:
    """Hand MLflow the model this code file logs (``mlflow.models.set_model``)."""
    mlflow.models.set_model(FolderModel(load, artifact))
