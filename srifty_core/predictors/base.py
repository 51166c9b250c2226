"""The contract between the bandwidth model and its users (the simulator, the planner).

A bandwidth predictor maps probe-record features to allreduce **bus bandwidth** in bytes/s
(``2*s*(n-1)/(n*t)``, see ``srifty_core.probing``), never a non-positive number, and knows
each instance type's total bus bandwidth cap (what one VM sustains across concurrent
transfers; the simulator shares it fairly among the transfers in flight).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    import pandas as pd

FEATURE_COLUMNS: tuple[str, ...] = (
    "provider",
    "cloud",
    "region",
    "zone",
    "instance_type",
    "gpu_model",
    "gpus_per_vm",
    "vcpus",
    "network_gbps",
    "placement_group",
    "world_size",
    "buffer_bytes",
    "concurrent",
    "backend",
)
"""The probe-record columns a predictor may use as features (names as in the probe store)."""


@runtime_checkable
class BandwidthPredictor(Protocol):
    """Anything that predicts bus bandwidth from probe-record features."""

    def predict(self, features: pd.DataFrame) -> NDArray[np.float64]:
        """Bus bandwidth (bytes/s, > 0) for each row of ``features`` (``FEATURE_COLUMNS``)."""
        ...

    def bandwidth_cap(self, instance_type: str, world_size: int) -> float:
        """Total bus bandwidth (bytes/s) one VM of ``instance_type`` sustains across
        concurrent allreduces at ``world_size``."""
        ...
