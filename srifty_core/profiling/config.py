"""How to profile (``ProfilerConfig``): the budget a user sets (``budget.ProfilerBudget``,
the one home of its defaults), the device, the training settings and the profiler's own
constants; and ``Progress``, the callback the profiler's stages report through.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from srifty_core.errors import ConfigError
from srifty_core.predictors.compute import DEFAULT_REFINE_TOLERANCE
from srifty_core.profiling.budget import DEFAULT_DEVICE, ProfilerBudget
from srifty_core.training_settings import DEFAULT_SETTINGS, TrainingSettings

DEFAULT_BUCKET_CAP_BYTES = 25 * 1024 * 1024
"""DDP's gradient bucket cap (its ``bucket_cap_mb=25``)."""
DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024
"""DDP's first, smaller bucket (torch's ``dist._DEFAULT_FIRST_BUCKET_BYTES``; a test checks
they agree). Both written here so that the profiler's settings import no torch."""

Progress = Callable[[str, int, int], None]
"""progress(stage, done, total)"""


@dataclass(frozen=True, slots=True)
class ProfilerConfig(ProfilerBudget):
    """How to profile: the budget (``ProfilerBudget``, the one home of the defaults that
    ``srifty profile`` and the profile DAG offer), the device, the training settings and
    the profiler's own constants."""

    device: str = DEFAULT_DEVICE
    min_batch: int = 1
    refine_tolerance: float = DEFAULT_REFINE_TOLERANCE
    """A check the fit misses by more than this (relative) is probed around further."""
    schedule_repeats: int = 3
    bucket_cap_bytes: int = DEFAULT_BUCKET_CAP_BYTES
    first_bucket_bytes: int = DEFAULT_FIRST_BUCKET_BYTES
    seed: int = 0
    settings: TrainingSettings = DEFAULT_SETTINGS
    """Precision, optimizer, compile and channels-last as the job trains
    (``training_settings``): the steps are timed that way and the profile records it."""

    def __post_init__(self) -> None:
        ProfilerBudget.__post_init__(self)  # slots: no zero-argument super()
        for name in ("min_batch", "schedule_repeats"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.refine_tolerance < 1:
            raise ConfigError(f"refine_tolerance must be in (0, 1), got {self.refine_tolerance}")
