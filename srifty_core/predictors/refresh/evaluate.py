"""Step 3 of a refresh: the challenger and the current champion on the held-out
allocations, and the decision. The challenger is promoted when its held-out MAPE (all
held-out rows, weighted) is no worse than the champion's on the same rows (or there is no
champion, or the champion cannot be loaded, which the reason says)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srifty_core.predictors.bandwidth import BandwidthModel
from srifty_core.predictors.features import GROUP, LABEL, LARGE, SMALL, size_masks
from srifty_core.predictors.metrics import mape, noise_floor_predictions
from srifty_core.predictors.refresh.fit import error_rows
from srifty_core.predictors.refresh.staging import (
    EVAL_FILE,
    FIT_FILE,
    MODEL_DIR,
    json_default,
    read_snapshot,
)

if TYPE_CHECKING:
    import pandas as pd


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
    (staging / EVAL_FILE).write_text(json.dumps(out, indent=1, default=json_default))
    return out
