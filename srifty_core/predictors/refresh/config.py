"""What a refresh is asked to do (``RefreshConfig``: which probes to train on, how hard to
tune), its JSON form handed between the steps, and the options of earlier versions that a
config or a DAG run conf may no longer use (``check_tuning_options``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from srifty_core.errors import ConfigError
from srifty_core.predictors.features import DEFAULT_MTU
from srifty_core.predictors.tuning import DEFAULT_TRIALS

TUNE_ROWS = 10_000
"""Default most rows per size class that tuning runs on (``RefreshConfig.tune_rows``)."""
REMOVED_OPTIONS: dict[str, str] = {
    "budget_s": "tuning no longer stops on a time budget; it runs n_trials seeded trials per "
    "size class, so the same data gives the same model. Set n_trials instead",
    "max_trials": "it is now n_trials (trials per size class)",
}
"""Tuning options of earlier versions, and what replaced them."""


@dataclass(frozen=True)
class RefreshConfig:
    """What to train on and how hard to tune."""

    since: timedelta | None = timedelta(days=30)
    until: datetime | None = None
    half_life: timedelta | None = timedelta(days=14)
    providers: tuple[str, ...] | None = None
    instance_types: tuple[str, ...] | None = None
    n_trials: int = DEFAULT_TRIALS
    """Tuning trials per size class."""
    tune_rows: int | None = TUNE_ROWS
    """Most rows per size class to tune on (``tuning_sample``); None: all."""
    n_jobs: int | None = None
    """XGBoost threads; None: one per idle core when tuning starts (``idle_cores``)."""
    mtu: int = DEFAULT_MTU
    seed: int = 0
    n_splits: int = 3
    """Grouped cross-validation folds of each tuning trial."""
    holdout_fraction: float = 0.2
    now: datetime | None = None

    def __post_init__(self) -> None:
        if isinstance(self.n_trials, bool) or not isinstance(self.n_trials, int):
            raise ConfigError(f"n_trials: must be an integer, got {self.n_trials!r}")
        if self.n_trials < 1:
            raise ConfigError(f"n_trials: must be >= 1, got {self.n_trials}")
        if self.mtu < 1:
            raise ConfigError(f"mtu: must be >= 1, got {self.mtu}")
        for name in ("tune_rows", "n_jobs"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ConfigError(f"{name}: must be an integer >= 1 or None, got {value!r}")
        if not 0 < self.holdout_fraction < 1:
            raise ConfigError(f"holdout_fraction: must be in (0, 1), got {self.holdout_fraction}")
        if self.n_splits < 2:
            raise ConfigError(f"n_splits: must be >= 2, got {self.n_splits}")
        for name in ("since", "half_life"):
            value = getattr(self, name)
            if value is not None and not value.total_seconds() > 0:
                raise ConfigError(f"{name}: must be a positive duration, got {value}")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("since", "half_life"):
            d[k] = d[k].total_seconds() if d[k] is not None else None
        for k in ("until", "now"):
            d[k] = d[k].isoformat() if d[k] is not None else None
        for k in ("providers", "instance_types"):
            d[k] = list(d[k]) if d[k] is not None else None
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RefreshConfig:
        d = dict(d)
        check_tuning_options(d, "refresh config")
        for k in ("since", "half_life"):
            d[k] = timedelta(seconds=d[k]) if d[k] is not None else None
        for k in ("until", "now"):
            d[k] = datetime.fromisoformat(d[k]) if d[k] is not None else None
        for k in ("providers", "instance_types"):
            d[k] = tuple(d[k]) if d[k] is not None else None
        return cls(**d)


def check_tuning_options(options: Mapping[str, Any], where: str) -> None:
    """Raise ``ConfigError`` if ``options`` (a config dict, DAG run conf) use a removed tuning
    option (``REMOVED_OPTIONS``), saying what replaced it."""
    for key, why in REMOVED_OPTIONS.items():
        if key in options:
            raise ConfigError(f"{where}: {key!r} was removed: {why}")


def parse_duration(text: str, what: str = "duration") -> timedelta:
    """``30d``, ``12h``, ``90m``, ``120s`` or a bare number of seconds."""
    units = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
    t = text.strip().lower()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise ConfigError(
            f"{what}: {text!r} is not a duration like 30d, 12h, 90m or 120s"
        ) from None
    if not value > 0 or not math.isfinite(value):
        raise ConfigError(f"{what}: must be positive, got {text!r}")
    return timedelta(seconds=value)
