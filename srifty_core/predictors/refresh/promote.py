"""Step 5 of a refresh: move the ``champion`` alias to the registered version when the
evaluation's decision says so, and only if the champion is still the one it was compared
with; record the decision on the run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from srifty_core.predictors.refresh.staging import EVAL_FILE, REGISTERED_FILE


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
