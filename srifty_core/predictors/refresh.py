"""Refresh the bandwidth model: load probes -> tune and fit -> evaluate against the champion
-> register -> promote or not. The ``srifty fit-bandwidth`` command runs the steps in one
process; the ``srifty_model_refresh`` DAG runs one per task, handing over a staging folder.

- **Data**: probe records from the store (``read_probes``: ok rows only, ``probed_at`` in
  ``[now - since, until)``), with age weights ``0.5 ** (age / half_life)`` in ``weight``:
  stale samples decay. ``data_version`` is a hash of the rows used.
- **Held-out allocations**: an allocation is held out when the hash of its id falls below
  ``holdout_fraction`` (per instance type; a type with >= 3 allocations and none below holds
  out its lowest-hash one; two always stay in training). The rule depends only on the id, so
  every fit holds out the same allocations and a champion never trained on the rows it is
  judged on. Rows of mixed-type rings (``probing.mix``) are never held out, tuned on or
  scored: they only give the fitted model its mixed-ring factor.
- **Tune and fit** on the other allocations: per size class, ``tuning.tune`` (grouped CV by
  allocation, MAPE, ``n_trials`` seeded Optuna trials each, so a rerun on the same data
  picks the same parameters), then the final fit with the best parameters.
  A size class with more than ``tune_rows`` rows is tuned on a sample of them
  (``tuning_sample``: the same share of every allocation, chosen by a hash of each row's
  content, so the same rows give the same sample in any order); the final fit uses all.
  XGBoost runs on ``n_jobs`` threads (default: one per idle core, ``idle_cores``; the
  fitted trees do not depend on it). The error table reports per size class and per
  instance type the out-of-fold MAPE of the best parameters beside the noise floor on the
  rows tuned on.
- **Decide**: the challenger is promoted when its held-out MAPE (all held-out rows,
  weighted) is no worse than the champion's on the same rows (or there is no champion, or
  the champion cannot be loaded, which the reason says).
- **Register** logs the run and a new version, unless the champion was fitted on the same
  data (its ``data_version``): with the same settings the fit would be the champion again
  (tuning is seeded), so nothing is registered (the outcome's ``registered`` is False and its
  reason says so). The data version hashes the rows only: other settings (more trials,
  another MTU) on the same rows make no new version either.
- **Staging**: the steps hand over files in a staging folder; ``refresh_bandwidth_model``
  removes it when it ends, done or failed (the DAG's teardown task does the same).

Bad input (no rows, too few, missing columns, a schema mismatch) raises before anything is
logged or registered; a step that fails never moves the ``champion`` alias.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from srifty_core import paths
from srifty_core.errors import ConfigError
from srifty_core.plotting import pyplot, save_figure
from srifty_core.predictors.bandwidth import BandwidthModel
from srifty_core.predictors.base import FEATURE_COLUMNS
from srifty_core.predictors.features import (
    DEFAULT_MTU,
    GROUP,
    LABEL,
    LARGE,
    SMALL,
    BandwidthDataError,
    check_training_data,
    feature_frame,
    size_masks,
)
from srifty_core.predictors.metrics import mape, noise_floor_predictions
from srifty_core.predictors.network import mix_mask, split_mixes
from srifty_core.predictors.tuning import DEFAULT_TRIALS
from srifty_core.probing.config import MIN_ALLOCATIONS

if TYPE_CHECKING:
    import pandas as pd

TUNE_ROWS = 10_000
"""Default most rows per size class that tuning runs on (``RefreshConfig.tune_rows``)."""
TRAIN_ALLOCATIONS = 2
"""Allocations of a type that always stay in training (grouped CV needs two groups)."""
"""Two to cross-validate on, one to hold out."""
SNAPSHOT = "probes.parquet"
FIT_FILE = "fit.json"
EVAL_FILE = "evaluation.json"
MODEL_DIR = "model"
REGISTERED_FILE = "registered.json"
PLOT_FILE = "busbw_vs_size.png"
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


# -- step 1: data --------------------------------------------------------------------------


def load_training_data(config: RefreshConfig, root: Path | None = None) -> pd.DataFrame:
    """Probe records for training, with ``weight``; checked (``BandwidthDataError``)."""
    from srifty_core.probing.store import read_probes

    now = config.now or datetime.now(UTC)
    df = read_probes(
        root,
        since=now - config.since if config.since is not None else None,
        until=config.until,
        providers=config.providers,
        instance_types=config.instance_types,
        half_life=config.half_life,
        now=now,
    )
    if config.half_life is None:
        df["weight"] = 1.0
    check_refresh_data(df, config.mtu)
    return df


def check_refresh_data(df: pd.DataFrame, mtu: int) -> None:
    check_training_data(df, mtu=mtu)
    n_alloc = split_mixes(df)[0][GROUP].nunique()
    if n_alloc < MIN_ALLOCATIONS:
        raise BandwidthDataError(
            f"need probes from >= {MIN_ALLOCATIONS} allocations (two to cross-validate on, one "
            f"to hold out), got {n_alloc}; run the sweep with more allocations"
        )


def data_version(df: pd.DataFrame) -> str:
    """A hash of the rows (order-independent): same rows, same version."""
    return hashlib.sha256(np.sort(row_hashes(df)).tobytes()).hexdigest()[:16]


def row_hashes(df: pd.DataFrame) -> np.ndarray:
    """A 64-bit hash of each row's content (every column but ``weight``), independent of
    the row's position: what ``data_version`` and ``tuning_sample`` read."""
    import pandas as pd

    cols = [c for c in df.columns if c != "weight"]
    return pd.util.hash_pandas_object(df[cols].astype(str), index=False).to_numpy()


def holdout_allocations(df: pd.DataFrame, fraction: float) -> list[str]:
    """The held-out allocation ids (rule: module docstring)."""
    out: list[str] = []
    for _, part in split_mixes(df)[0].groupby("instance_type", sort=True):
        ids = sorted(part[GROUP].astype(str).unique())
        h = {a: int(hashlib.sha256(a.encode()).hexdigest()[:12], 16) / 16**12 for a in ids}
        held = [a for a in ids if h[a] < fraction]
        if not held and len(ids) >= MIN_ALLOCATIONS:
            held = [min(ids, key=lambda a: h[a])]
        while held and len(ids) - len(held) < TRAIN_ALLOCATIONS:  # grouped CV needs two
            held.remove(max(held, key=lambda a: h[a]))
        out.extend(held)
    return sorted(out)


def stage_data(config: RefreshConfig, staging: Path, root: Path | None = None) -> dict[str, Any]:
    """Step 1: read, check and snapshot the training data into ``staging``."""
    df = load_training_data(config, root)
    staging.mkdir(parents=True, exist_ok=True)
    df.to_parquet(staging / SNAPSHOT, index=False)
    (staging / "config.json").write_text(json.dumps(config.to_json(), indent=1))
    return {
        "staging": str(staging),
        "rows": len(df),
        "allocations": int(df[GROUP].nunique()),
        "instance_types": sorted(df["instance_type"].unique().tolist()),
        "data_version": data_version(df),
    }


def read_snapshot(staging: Path) -> tuple[pd.DataFrame, RefreshConfig]:
    import pandas as pd

    df = pd.read_parquet(staging / SNAPSHOT)
    config = RefreshConfig.from_json(json.loads((staging / "config.json").read_text()))
    return df, config


# -- step 2: tune and fit ------------------------------------------------------------------


def idle_cores() -> int:
    """Cores not busy by the 1-minute load average, at least one: XGBoost's OpenMP threads
    spin waiting for a core another job holds (2 threads ran 13-35x slower than one on
    this 2-core host under load), so a refresh takes a second thread only when a core is
    free for it."""
    cores = os.cpu_count() or 1
    return max(1, min(cores, cores - round(os.getloadavg()[0])))


def tuning_sample(df: pd.DataFrame, max_rows: int | None) -> np.ndarray:
    """Which rows of ``df`` to tune on: all if there are at most ``max_rows`` (or it is
    None), else the rows whose content hash falls below ``max_rows / len(df)``, so every
    allocation keeps about that share of its rows (whole repeats of one probe go together
    only when their rows are identical) and the choice depends on the rows, not on their
    order."""
    if max_rows is None or len(df) <= max_rows:
        return np.ones(len(df), dtype=bool)
    return np.asarray(row_hashes(df) < np.uint64(max_rows / len(df) * 2.0**64), dtype=bool)


def error_rows(
    df: pd.DataFrame, predicted: np.ndarray, floor: np.ndarray, mtu: int, *, by_type: bool = True
) -> list[dict[str, Any]]:
    """MAPE vs noise floor per size class (and per instance type): rows of the error table."""
    y = df[LABEL].to_numpy(dtype=float)
    w = df["weight"].to_numpy(dtype=float) if "weight" in df.columns else np.ones(len(df))
    masks = size_masks(df, mtu)
    groups: list[tuple[str, np.ndarray]] = [("all", np.ones(len(df), dtype=bool))]
    if by_type:
        types = df["instance_type"].astype(str).to_numpy()
        groups += [(t, types == t) for t in sorted(set(types))]
    rows = []
    for label, gmask in groups:
        for cls in (SMALL, LARGE):
            m = gmask & masks[cls]
            covered = m & np.isfinite(floor)
            rows.append(
                {
                    "instance_type": label,
                    "size_class": cls,
                    "rows": int(m.sum()),
                    "allocations": int(df.loc[m, GROUP].nunique()),
                    "mape": mape(predicted[m], y[m], w[m]),
                    "mape_covered": mape(predicted[covered], y[covered], w[covered]),
                    "noise_floor": mape(floor[covered], y[covered], w[covered]),
                    "floor_coverage": float(covered.sum() / m.sum()) if m.any() else math.nan,
                }
            )
    return rows


def tune_and_fit(staging: Path) -> dict[str, Any]:
    """Step 2: tune each size class on the training allocations, fit the challenger, save it
    and the error table into ``staging``."""
    from srifty_core.predictors.tuning import tune

    t0 = time.monotonic()
    df, config = read_snapshot(staging)
    held = set(holdout_allocations(df, config.holdout_fraction))
    if not held:
        raise BandwidthDataError(
            f"no allocation to hold out: some instance type needs >= {MIN_ALLOCATIONS} allocations"
        )
    fitted = df[~df[GROUP].astype(str).isin(held)].reset_index(drop=True)
    check_training_data(fitted, mtu=config.mtu)
    train = fitted[~mix_mask(fitted)].reset_index(drop=True)  # mixes: only the final fit's
    w = train["weight"].to_numpy(dtype=float)
    masks = size_masks(train, config.mtu)
    n_jobs = config.n_jobs or idle_cores()
    oof = np.full(len(train), np.nan)
    tuned = np.zeros(len(train), dtype=bool)
    best: dict[str, dict[str, Any]] = {}
    tuning: dict[str, Any] = {}
    for i, cls in enumerate((SMALL, LARGE)):
        m = masks[cls].copy()
        m[m] = tuning_sample(train[m], config.tune_rows)
        result = tune(
            train[m].reset_index(drop=True),
            n_trials=config.n_trials,
            weight=w[m],
            n_splits=config.n_splits,
            seed=config.seed + i,
            n_jobs=n_jobs,
        )
        oof[m] = result.oof
        tuned |= m
        best[cls] = result.best_params
        tuning[cls] = {
            "best_params": result.best_params,
            "cv_mape": result.best_mape,
            "rows": int(masks[cls].sum()),
            "tuned_rows": int(m.sum()),
            "trials": len(result.trials),
            "pruned": sum(t.pruned for t in result.trials),
            "folds": result.n_splits,
            "seconds": result.seconds,
            "trial_log": [
                {"mape": t.mape, "seconds": t.seconds, "pruned": t.pruned, **t.params}
                for t in result.trials
            ],
        }
    floor = noise_floor_predictions(train, weight=w)  # on all rows: the sample splits repeats
    table = error_rows(train[tuned].reset_index(drop=True), oof[tuned], floor[tuned], config.mtu)
    model = BandwidthModel(
        mtu=config.mtu,
        small_params={**best[SMALL], "n_jobs": n_jobs},
        large_params={**best[LARGE], "n_jobs": n_jobs},
    )
    model.fit(fitted, sample_weight=fitted["weight"].to_numpy(dtype=float))
    model.save(staging / MODEL_DIR)
    fit = {
        "data_version": data_version(df),
        "rows": len(df),
        "train_rows": len(train),
        "allocations": int(df[GROUP].nunique()),
        "holdout_allocations": sorted(held),
        "tuning": tuning,
        "error_table": table,
        "caps": model.caps_.to_dict(),
        "n_jobs": n_jobs,
        "seconds": time.monotonic() - t0,
    }
    (staging / FIT_FILE).write_text(json.dumps(fit, indent=1, default=_json_default))
    return {
        "staging": str(staging),
        "cv_mape_small": tuning[SMALL]["cv_mape"],
        "cv_mape_large": tuning[LARGE]["cv_mape"],
        "trials": tuning[SMALL]["trials"] + tuning[LARGE]["trials"],
    }


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    return str(o)


# -- step 3: evaluate ----------------------------------------------------------------------


def holdout_metrics(model: BandwidthModel, holdout: pd.DataFrame, mtu: int) -> dict[str, float]:
    y = holdout[LABEL].to_numpy(dtype=float)
    w = holdout["weight"].to_numpy(dtype=float)
    p = model.predict(holdout)
    masks = size_masks(holdout, mtu)
    return {
        "all": mape(p, y, w),
        SMALL: mape(p[masks[SMALL]], y[masks[SMALL]], w[masks[SMALL]]),
        LARGE: mape(p[masks[LARGE]], y[masks[LARGE]], w[masks[LARGE]]),
    }


def decide(challenger: float, champion: float | None, reason_if_none: str) -> dict[str, Any]:
    """Promote when the challenger's held-out MAPE is no worse than the champion's."""
    if champion is None or not math.isfinite(champion):
        return {"promote": True, "reason": reason_if_none}
    if challenger <= champion:
        return {
            "promote": True,
            "reason": f"held-out MAPE {challenger:.2f}% <= champion's {champion:.2f}%",
        }
    return {
        "promote": False,
        "reason": f"held-out MAPE {challenger:.2f}% > champion's {champion:.2f}%: keep champion",
    }


def evaluate(staging: Path, tracking_uri: str | None = None) -> dict[str, Any]:
    """Step 3: the challenger and the current champion on the held-out allocations."""
    from srifty_core.predictors.registry import CHAMPION, alias_version, load_version

    df, config = read_snapshot(staging)
    fit = json.loads((staging / FIT_FILE).read_text())
    holdout = df[df[GROUP].astype(str).isin(set(fit["holdout_allocations"]))]
    holdout = holdout.reset_index(drop=True)
    challenger = BandwidthModel.load(staging / MODEL_DIR)
    ch = holdout_metrics(challenger, holdout, config.mtu)
    floor_all = noise_floor_predictions(df, weight=df["weight"].to_numpy(dtype=float))
    in_holdout = df[GROUP].astype(str).isin(set(fit["holdout_allocations"])).to_numpy()
    floor = floor_all[in_holdout]
    table = error_rows(holdout, challenger.predict(holdout), floor, config.mtu)
    champion_version = alias_version(CHAMPION, tracking_uri)
    champ: dict[str, float] | None = None
    reason_if_none = "no champion yet"
    if champion_version is not None:
        try:
            champ = holdout_metrics(
                load_version(champion_version, tracking_uri), holdout, config.mtu
            )
        except Exception as exc:  # a champion that cannot be used is no reason to keep it
            reason_if_none = f"champion v{champion_version} could not be evaluated ({exc})"
    decision = decide(ch["all"], champ["all"] if champ else None, reason_if_none)
    out = {
        "holdout_rows": len(holdout),
        "holdout_allocations": fit["holdout_allocations"],
        "challenger": ch,
        "champion": champ,
        "champion_version": champion_version,
        "holdout_table": table,
        "decision": {
            **decision,
            "challenger_holdout_mape": ch["all"],
            "champion_holdout_mape": champ["all"] if champ else None,
        },
    }
    (staging / EVAL_FILE).write_text(json.dumps(out, indent=1, default=_json_default))
    return out


# -- step 4: register ----------------------------------------------------------------------


def plot_fit(df: pd.DataFrame, model: BandwidthModel, path: Path) -> Path:
    """Observed busbw (points: per allocation medians) and predicted (lines) over buffer
    size, one panel per world size, one colour per instance type, at the lowest
    concurrency probed."""
    import pandas as pd

    plt = pyplot()
    df = split_mixes(df)[0]  # a mixed ring is no type's curve
    worlds = sorted(df["world_size"].unique())
    # every line's grid, predicted in one call (a call per line costs the model's set-up
    # each time: a minute at 100K probe rows)
    lowest = df.groupby(["world_size", "instance_type"])["concurrent"].transform("min")
    grid = df[df["concurrent"] == lowest]
    grid = grid.drop_duplicates(["world_size", "instance_type", "buffer_bytes"])
    grid = grid.sort_values("buffer_bytes", kind="stable").reset_index(drop=True)
    grid = grid.assign(predicted=model.predict(grid) if len(grid) else np.zeros(0))
    lines = {key: part for key, part in grid.groupby(["world_size", "instance_type"])}
    fig, axes = plt.subplots(
        1, len(worlds), figsize=(5 * len(worlds), 4), squeeze=False, sharey=True
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, n in zip(axes[0], worlds, strict=True):
        part = df[df["world_size"] == n]
        for i, (itype, sub) in enumerate(part.groupby("instance_type", sort=True)):
            color = colors[i % len(colors)]
            sub = sub[sub["concurrent"] == sub["concurrent"].min()]
            obs = sub.groupby([GROUP, "buffer_bytes"])[LABEL].median().reset_index()
            ax.scatter(obs["buffer_bytes"], obs[LABEL], s=10, alpha=0.5, color=color)
            line = lines.get((n, itype), pd.DataFrame(columns=["buffer_bytes", "predicted"]))
            ax.plot(line["buffer_bytes"], line["predicted"], "-", color=color, label=itype)
        ax.axvline(model.mtu, color="gray", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("buffer (bytes)")
        ax.set_title(f"world size {n}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("bus bandwidth (bytes/s)")
    fig.suptitle("observed (points, per-allocation medians) vs predicted (lines); MTU dotted")
    return save_figure(fig, path, dpi=100)


def register(staging: Path, tracking_uri: str | None = None) -> dict[str, Any]:
    """Step 4: log the run (params, metrics, data version, plot, tables) and register the
    challenger (alias ``challenger``) -- unless the champion was fitted on the same data
    (same ``data_version``): then nothing is logged or registered, ``version`` is None and
    ``skipped`` says why."""
    from srifty_core.predictors.registry import champion_data_version, log_fit

    fit = json.loads((staging / FIT_FILE).read_text())
    champion = champion_data_version(tracking_uri)
    if champion is not None and champion[1] == fit["data_version"]:
        skipped = {
            "run_id": None,
            "version": None,
            "skipped": f"champion v{champion[0]} was fitted on the same data (data version "
            f"{fit['data_version']}): nothing registered",
        }
        (staging / REGISTERED_FILE).write_text(json.dumps(skipped))
        return skipped
    df, config = read_snapshot(staging)
    ev = json.loads((staging / EVAL_FILE).read_text())
    model = BandwidthModel.load(staging / MODEL_DIR)
    plot = plot_fit(df, model, staging / PLOT_FILE)
    params: dict[str, Any] = {
        "mtu": config.mtu,
        "n_trials": config.n_trials,
        "since_days": config.since.total_seconds() / 86400 if config.since else None,
        "half_life_days": (config.half_life.total_seconds() / 86400 if config.half_life else None),
        "providers": config.providers,
        "instance_types": config.instance_types,
        "seed": config.seed,
        "n_splits": config.n_splits,
        "holdout_fraction": config.holdout_fraction,
        "data_version": fit["data_version"],
        "rows": fit["rows"],
        "train_rows": fit["train_rows"],
        "allocations": fit["allocations"],
        "holdout_allocations": ",".join(fit["holdout_allocations"]),
    }
    for cls in (SMALL, LARGE):
        params[f"{cls}_trials"] = fit["tuning"][cls]["trials"]
        for k, v in fit["tuning"][cls]["best_params"].items():
            params[f"{cls}_{k}"] = v
    metrics: dict[str, float] = {}
    for row in fit["error_table"]:
        suffix = "" if row["instance_type"] == "all" else f"/{row['instance_type']}"
        metrics[f"cv_mape_{row['size_class']}{suffix}"] = row["mape"]
        metrics[f"noise_floor_{row['size_class']}{suffix}"] = row["noise_floor"]
    for key, value in ev["challenger"].items():
        metrics[f"holdout_mape_{key}"] = value
    if ev["champion"]:
        for key, value in ev["champion"].items():
            metrics[f"champion_holdout_mape_{key}"] = value
    run_id, version = log_fit(
        model_dir=staging / MODEL_DIR,
        params=params,
        metrics=metrics,
        tags={"data_version": fit["data_version"]},
        artifacts={"plot": plot},
        json_artifacts={
            "error_table.json": fit["error_table"],
            "holdout_table.json": ev["holdout_table"],
            "tuning.json": fit["tuning"],
            "caps.json": fit["caps"],
            "evaluation.json": ev,
        },
        run_name=f"busbw-{fit['data_version']}",
        input_example=input_example(df),
        training_data=df,
        data_source=f"probe store {', '.join(config.providers or ['all providers'])}",
        tracking_uri=tracking_uri,
    )
    out = {"run_id": run_id, "version": version}
    (staging / REGISTERED_FILE).write_text(json.dumps(out))
    return out


def input_example(df: pd.DataFrame) -> pd.DataFrame:
    """The registered model's input example: per instance type, the feature rows of its
    smallest and largest buffer (no mixed rings; rows without missing values when there are
    any), with the dtypes of ``feature_frame`` (64-bit integers, as JSON input to a served
    model arrives)."""
    import pandas as pd

    features = split_mixes(df)[0][list(FEATURE_COLUMNS)]
    complete = features[features.notna().all(axis=1)]
    features = complete if len(complete) else features  # local types have no network_gbps
    features = features.sort_values(["instance_type", "buffer_bytes"], kind="stable")
    ends = [features.drop_duplicates("instance_type", keep=k) for k in ("first", "last")]
    out = pd.concat(ends).sort_values(["instance_type", "buffer_bytes"], kind="stable")
    return feature_frame(cast("list[dict[str, Any]]", out.to_dict("records")))


# -- step 5: promote -----------------------------------------------------------------------


def promote_or_not(staging: Path, tracking_uri: str | None = None) -> dict[str, Any]:
    """Step 5: move ``champion`` to the new version when the decision says so, and only if
    the champion is still the one it was compared with."""
    from srifty_core.predictors.registry import (
        CHAMPION,
        alias_version,
        promote,
        record_decision,
    )

    ev = json.loads((staging / EVAL_FILE).read_text())
    reg = json.loads((staging / REGISTERED_FILE).read_text())
    decision = dict(ev["decision"])
    current = alias_version(CHAMPION, tracking_uri)
    if reg["version"] is None:  # the champion's own data: nothing was registered
        return {
            **decision,
            "promote": False,
            "registered": False,
            "reason": reg["skipped"],
            "version": None,
            "run_id": None,
            "previous_champion": ev["champion_version"],
            "champion": current,
        }
    if decision["promote"] and current != ev["champion_version"]:
        decision = {
            **decision,
            "promote": False,
            "reason": f"champion changed to v{current} since the evaluation; not promoted",
        }
    if decision["promote"]:
        promote(reg["version"], tracking_uri)
    record_decision(reg["run_id"], reg["version"], decision, tracking_uri)
    return {
        **decision,
        "registered": True,
        "version": reg["version"],
        "run_id": reg["run_id"],
        "previous_champion": ev["champion_version"],
        "champion": reg["version"] if decision["promote"] else current,
    }


# -- all steps -----------------------------------------------------------------------------


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


def staging_dir(root: Path | None = None) -> Path:
    """A new staging folder under ``<data dir>/models/bandwidth/``."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
    return (root or paths.data_dir()) / "models" / "bandwidth" / stamp


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


def remove_staging(folder: Path) -> None:
    """Remove a staging folder (the DAG's last task does, once the run is done)."""
    shutil.rmtree(folder, ignore_errors=True)


def format_report(outcome: RefreshOutcome) -> str:
    """The error table (CV MAPE vs noise floor per size class and instance type; held-out
    MAPE of challenger and champion) and the decision."""

    def pct(v: Any) -> str:
        return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.1f}%"

    fit, ev, pr = outcome.fit, outcome.evaluation, outcome.promotion
    lines = [
        f"data version {fit['data_version']}: {fit['rows']} rows, {fit['allocations']} "
        f"allocations ({len(fit['holdout_allocations'])} held out); tuning "
        f"{fit['tuning'][SMALL]['trials']}+{fit['tuning'][LARGE]['trials']} trials",
        "",
        "grouped CV on the training allocations (out-of-fold, by allocation):",
        f"{'instance type':<22} {'size':<6} {'rows':>6} {'alloc':>5} {'MAPE':>8} "
        f"{'floor':>8} {'ratio':>6} {'cover':>6}",
    ]
    for r in fit["error_table"]:
        ratio = (
            r["mape_covered"] / r["noise_floor"]
            if r["noise_floor"] and math.isfinite(r["noise_floor"])
            else math.nan
        )
        cover = r["floor_coverage"]
        ratio_s = "-" if math.isnan(ratio) else f"{ratio:.2f}"
        cover_s = "-" if math.isnan(cover) else f"{cover:.0%}"
        size = "<=MTU" if r["size_class"] == SMALL else ">MTU"
        lines.append(
            f"{r['instance_type']:<22} {size:<6} {r['rows']:>6} {r['allocations']:>5} "
            f"{pct(r['mape']):>8} {pct(r['noise_floor']):>8} {ratio_s:>6} {cover_s:>6}"
        )
    champ = ev["champion"] or {}
    lines += [
        "",
        f"held-out allocations ({ev['holdout_rows']} rows): challenger MAPE "
        f"all {pct(ev['challenger']['all'])}, <=MTU {pct(ev['challenger'][SMALL])}, "
        f">MTU {pct(ev['challenger'][LARGE])}"
        + (
            f"; champion v{ev['champion_version']}: all {pct(champ.get('all'))}, "
            f"<=MTU {pct(champ.get(SMALL))}, >MTU {pct(champ.get(LARGE))}"
            if champ
            else ""
        ),
    ]
    if pr and not pr.get("registered", True):
        lines.append(f"no new version: {pr['reason']} (champion: {pr['champion'] or 'none'})")
    elif pr:
        verdict = "promoted to champion" if pr["promote"] else "not promoted"
        lines.append(
            f"model {pr['version']} registered as challenger; {verdict}: {pr['reason']} "
            f"(champion now: {pr['champion'] or 'none'})"
        )
    return "\n".join(lines)
