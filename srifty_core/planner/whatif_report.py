"""A what-if report as a file: the base plan of a request, each scenario's plan and what it
changes, and (optionally) the marginal value of one more VM of each offered type
(``planner.whatif``), written to ``<data dir>/reports/what_if/<name>/report.{json,md}``.
What the ``srifty_what_if`` DAG runs, so that a user can ask from the Airflow UI what
``srifty plan --what-if`` answers in a shell."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from srifty_core.atomic import write_text_atomic
from srifty_core.catalog import Catalog
from srifty_core.errors import ConfigError
from srifty_core.paths import reports_dir
from srifty_core.planner import whatif
from srifty_core.planner.job import load_bandwidth_with_source, store_requests
from srifty_core.profiling.store import ProfileStore
from srifty_core.trigger_models import registered_model

_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def what_if_report(
    request: Mapping[str, Any],
    scenarios: Sequence[str],
    *,
    one_more_vm: bool = False,
    bandwidth: str = "champion",
    method: str = "auto",
    name: str = "latest",
) -> dict[str, Any]:
    """Plan ``request`` and every scenario with one simulator (simulations shared), write
    the report, and return its summary (paths included). Bad input (the request, a
    scenario) is a ``ConfigError`` naming it before anything is planned."""
    from srifty_core.simulator.calibration import for_request
    from srifty_core.simulator.estimator import Simulator

    if not isinstance(request, Mapping):
        raise ConfigError(f"request: a mapping of request fields, got {type(request).__name__}")
    if "model" in request:  # a trigger's: a registered model, never a file to import
        registered_model(request["model"])
    parsed = [whatif.parse_scenario(str(t)) for t in scenarios]  # bad input fails first
    if not parsed and not one_more_vm:
        raise ConfigError("scenarios: give at least one, or ask for one_more_vm")
    build = store_requests(Catalog.load(), ProfileStore())
    base = build(dict(request))  # the schema's checks, with the field named
    model, source = load_bandwidth_with_source(bandwidth, public_fallback=True)
    logging.getLogger(__name__).info("bandwidth model: %s", source["text"])
    calibration = for_request(base, model)
    estimator = Simulator(model, calibration=calibration)
    what = whatif.WhatIf(dict(request), estimator, build, {"method": method})
    answers = [what.ask(s) for s in parsed]
    marginal = what.marginal_values() if one_more_vm else []
    out = whatif.to_dict(what, answers, marginal) | {
        "bandwidth_model": source,
        "calibrated": calibration is not None,
    }
    folder = reports_dir() / "what_if" / (_NAME.sub("_", name).strip("._") or "latest")
    folder.mkdir(parents=True, exist_ok=True)
    json_path = write_text_atomic(folder / "report.json", json.dumps(out, indent=1) + "\n")
    md = f"# What-if report\n\n```\n{whatif.render(what, answers, marginal)}\n```\n"
    md_path = write_text_atomic(folder / "report.md", md)
    return {
        "feasible": what.base.feasible,
        "scenarios": len(answers),
        "one_more_vm": len(marginal),
        "simulations_run": what.memo.misses,
        "simulations_reused": what.memo.hits,
        "report_json": str(json_path),
        "report_md": str(md_path),
    }


def report_path(name: str, root: Path | None = None) -> Path:
    """Where ``what_if_report(..., name=name)`` writes its JSON."""
    base = reports_dir(root) / "what_if"
    return base / (_NAME.sub("_", name).strip("._") or "latest") / "report.json"
