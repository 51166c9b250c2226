"""The bandwidth model as an MLflow pyfunc, logged *as code* (MLflow's models from code).

``registry.log_fit`` passes this file's path as the model's code: MLflow copies the source
file into the logged model and pickles nothing. The code runs only where someone loads the
version with ``mlflow.pyfunc.load_model`` (``mlflow models serve``, ``mlflow.models.predict``;
srifty must be installed there): ``predict(DataFrame of FEATURE_COLUMNS) -> busbw bytes/s``
from the full ``BandwidthModel`` (caps included), read from the ``predictor`` artifact with
``BandwidthModel.load`` (``tracking.pyfunc``). Srifty itself never loads a version that way
(``registry.load_champion`` reads the artifact directly) and never imports this module:
running it hands the model object to MLflow.
"""

from __future__ import annotations

from srifty_core.predictors.bandwidth import BandwidthModel
from srifty_core.predictors.registry import PREDICTOR_ARTIFACT
from srifty_core.tracking.pyfunc import set_model

set_model(BandwidthModel.load, PREDICTOR_ARTIFACT)
