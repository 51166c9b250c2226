"""Step 4 of a refresh: log the run (params, metrics, data version, plot, tables) and
register the challenger, unless the champion was fitted on the same data (its
``data_version``): with the same settings the fit would be the champion again (tuning is
seeded), so nothing is registered (the outcome's ``registered`` is False and its reason says
so). The data version hashes the rows only: other settings (more trials, another MTU) on
the same rows make no new version either."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from srifty_core.plotting import pyplot, save_figure
from srifty_core.predictors.bandwidth import BandwidthModel
from srifty_core.predictors.base import FEATURE_COLUMNS, with_collective
from srifty_core.predictors.features import GROUP, LABEL, LARGE, SMALL, feature_frame
from srifty_core.predictors.mixed_rings import split_mixes
from srifty_core.predictors.refresh.staging import (
    EVAL_FILE,
    FIT_FILE,
    MODEL_DIR,
    PLOT_FILE,
    REGISTERED_FILE,
    read_snapshot,
)

if TYPE_CHECKING:
    import pandas as pd


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

    features = with_collective(split_mixes(df)[0])[list(FEATURE_COLUMNS)]
    complete = features[features.notna().all(axis=1)]
    features = complete if len(complete) else features  # local types have no network_gbps
    features = features.sort_values(["instance_type", "buffer_bytes"], kind="stable")
    ends = [features.drop_duplicates("instance_type", keep=k) for k in ("first", "last")]
    out = pd.concat(ends).sort_values(["instance_type", "buffer_bytes"], kind="stable")
    return feature_frame(cast("list[dict[str, Any]]", out.to_dict("records")))
