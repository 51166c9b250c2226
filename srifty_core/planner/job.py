"""The planning job behind ``srifty plan``: read a request file, load what the estimator
needs (profiles, a bandwidth model), plan, and render the answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from srifty_core.errors import ConfigError
from srifty_core.planner.request import PlanRequest, request_from_dict
from srifty_core.planner.result import PlanResult
from srifty_core.predictors.base import BandwidthPredictor


def read_request_file(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"request file not found: {path}")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        data = json.loads(text)
    else:
        import yaml

        data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a request is a mapping of fields (model, global_batch, ...)")
    return data


def load_request(data: dict[str, Any], profiles_root: Path | None = None) -> PlanRequest:
    from srifty_core.catalog import Catalog
    from srifty_core.profiling.store import ProfileStore

    store = ProfileStore(profiles_root)
    return request_from_dict(data, catalog=Catalog.load(), load_profile=store.load)


def load_bandwidth(source: str, probe_root: Path | None = None) -> BandwidthPredictor:
    """``champion``: the MLflow champion of the XGBoost bus-bandwidth model (``srifty
    fit-bandwidth`` or the srifty_model_refresh DAG makes one); ``probes``: the
    measured-table model over the probe store (no learning, only probed types)."""
    if source == "champion":
        from srifty_core.predictors.registry import load_champion

        return load_champion()
    if source == "probes":
        from srifty_core.predictors.table import ProbeTableBandwidth
        from srifty_core.probing.store import read_probes

        probes = read_probes(root=probe_root)
        if len(probes) == 0:
            raise ConfigError(
                "the probe store is empty: run `srifty probe` or the srifty_probe_sweep DAG"
            )
        return ProbeTableBandwidth().fit(probes)
    raise ConfigError(f"bandwidth: {source!r} is not one of champion, probes")


def render(result: PlanResult) -> str:
    lines = list(result.explanation())
    lines.append(
        f"({result.method} search: {result.evaluated} configurations evaluated of "
        f"{result.space_size}{'+' if result.method == 'ilp' else ''}, {result.solve_s:.2f} s)"
    )
    if result.frontier:
        lines.append("")
        lines.append(f"{'frontier':48s} {'time s':>9s} {'cost $':>9s} {'t_iter ms':>10s}")
        for c in result.frontier[:12]:
            mark = "*" if result.best is not None and c.choice == result.best.choice else " "
            note = "" if c.feasible else f"  ({', '.join(c.violations)})"
            lines.append(
                f"{mark}{c.label[:47]:47s} {c.time_s:9.0f} {c.cost_usd:9.2f} "
                f"{c.estimate.t_iter * 1e3:10.1f}{note}"
            )
    return "\n".join(lines)
