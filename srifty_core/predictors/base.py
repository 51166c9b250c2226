"""The contract between the bandwidth model and its users (the simulator, the planner).

A bandwidth predictor maps probe-record features to a collective's **bus bandwidth** in
bytes/s (nccl-tests' busbw: ``2*s*(n-1)/(n*t)`` for an allreduce, ``s*(n-1)/(n*t)`` for an
all-gather or reduce-scatter of ``s`` bytes in all, see ``srifty_core.probing``; the
``collective`` feature says which, and a frame without it asks about allreduces), never a
non-positive number, and knows
each instance type's total bus bandwidth cap (what one VM sustains across concurrent
transfers; the simulator shares it fairly among the transfers in flight).

A predictor may also have any of five optional methods, each its own protocol below
(``DomainAware``, ``SustainedRate``, ``LevelSpread``, ``MeanTimeFactors``,
``MixedRingFactors``); ``BandwidthExtras.of`` asks once which it has (the fitted
``BandwidthModel`` has all five, the probe table all but ``in_domain``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

from srifty_core.probing.config import ALL_REDUCE

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
    "collective",
)
"""The probe-record columns a predictor may use as features (names as in the probe store).
``collective`` (``COLLECTIVES``) may be missing from a query frame: its rows are allreduces
(``with_collective``)."""
COLLECTIVE = "collective"


def with_collective(features: pd.DataFrame) -> pd.DataFrame:
    """``features`` with a ``collective`` column: where it has none (frames built before the
    column existed), every row is an allreduce."""
    if COLLECTIVE in features.columns:
        return features
    return features.assign(**{COLLECTIVE: ALL_REDUCE})


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


@runtime_checkable
class DomainAware(Protocol):
    """A predictor that knows where its probes reach."""

    def in_domain(self, features: pd.DataFrame) -> NDArray[np.bool_]:
        """Per row of ``features``, whether it lies inside what the probes covered (the
        simulator widens the p90 of rings predicted outside by ``level_sigma``)."""
        ...


@runtime_checkable
class SustainedRate(Protocol):
    """A predictor that knows how much of a type's burst bandwidth a long job keeps."""

    def sustained_factor(self, instance_type: str, world_size: int) -> float:
        """Sustained over burst bus bandwidth of ``instance_type`` at ``world_size``."""
        ...


@runtime_checkable
class LevelSpread(Protocol):
    """A predictor that knows how a type's network level spreads across allocations."""

    def level_sigma(self, instance_type: str) -> float:
        """Spread (sd of log) of the network level across allocations of the type."""
        ...


@runtime_checkable
class MeanTimeFactors(Protocol):
    """A predictor that knows how much slower the mean transfer is than the typical one."""

    def mean_time_factors(
        self, instance_type: str, buffer_bytes: NDArray[np.float64]
    ) -> NDArray[np.float64]:
        """Per buffer size, the factor that turns the predicted (typical) bus bandwidth
        into the mean transfer's."""
        ...


@runtime_checkable
class MixedRingFactors(Protocol):
    """A predictor that knows what rings of several instance types measured."""

    def mixed_factors(
        self, buffer_bytes: NDArray[np.float64], features: NDArray[np.float64] | None = None
    ) -> NDArray[np.float64]:
        """Per buffer size, measured over composed bus bandwidth of a mixed-type ring with
        these ``mixed_rings.ring_features`` (none: any ring, the level alone)."""
        ...

    def mixed_bound(self, buffer_bytes: NDArray[np.float64]) -> NDArray[np.float64]:
        """Per buffer size, at least ``mixed_factors`` of any ring."""
        ...


@runtime_checkable
class MixCoverage(Protocol):
    """A predictor that knows which mixed-type rings its probes held."""

    def unprobed_mix_sigma(self, instance_types: Sequence[str]) -> float | None:
        """For a ring of these types never probed as one ring, the spread (sd of log) it
        adds to the network level; ``None`` for one type, a probed mix, or unknown."""
        ...


@dataclass(frozen=True, slots=True)
class BandwidthExtras:
    """The optional methods of one bandwidth predictor, each bound or ``None`` where it
    has none. ``of`` asks once (a check against a runtime protocol costs microseconds, too
    much for a hot path)."""

    in_domain: Callable[[pd.DataFrame], NDArray[np.bool_]] | None
    sustained_factor: Callable[[str, int], float] | None
    level_sigma: Callable[[str], float] | None
    mean_time_factors: Callable[[str, NDArray[np.float64]], NDArray[np.float64]] | None
    mixed_factors: (
        Callable[[NDArray[np.float64], NDArray[np.float64] | None], NDArray[np.float64]] | None
    )
    mixed_bound: Callable[[NDArray[np.float64]], NDArray[np.float64]] | None
    unprobed_mix_sigma: Callable[[Sequence[str]], float | None] | None

    @classmethod
    def of(cls, predictor: object) -> BandwidthExtras:
        return cls(
            in_domain=predictor.in_domain if isinstance(predictor, DomainAware) else None,
            sustained_factor=(
                predictor.sustained_factor if isinstance(predictor, SustainedRate) else None
            ),
            level_sigma=predictor.level_sigma if isinstance(predictor, LevelSpread) else None,
            mean_time_factors=(
                predictor.mean_time_factors if isinstance(predictor, MeanTimeFactors) else None
            ),
            mixed_factors=(
                predictor.mixed_factors if isinstance(predictor, MixedRingFactors) else None
            ),
            mixed_bound=(
                predictor.mixed_bound if isinstance(predictor, MixedRingFactors) else None
            ),
            unprobed_mix_sigma=(
                predictor.unprobed_mix_sigma if isinstance(predictor, MixCoverage) else None
            ),
        )
