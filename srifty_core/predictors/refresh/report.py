"""A refresh's report for the shell: the error table (CV MAPE vs noise floor per size class
and instance type; held-out MAPE of challenger and champion) and the decision."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from srifty_core.predictors.features import LARGE, SMALL

if TYPE_CHECKING:
    from srifty_core.predictors.refresh.pipeline import RefreshOutcome


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
