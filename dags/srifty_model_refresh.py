"""Refresh the allreduce bus-bandwidth model: once per new probes.

Runs when ``srifty_probe_sweep`` (nightly) updates the probe-store Asset, so the model is
fitted once per new data (a time schedule on top would fit it again on the same rows).
Tasks, each handing a staging folder (``<data dir>/models/bandwidth/<stamp>/``) to the
next, never data in XCom:

1. ``load_data``: probe records from the store (``since``, ``providers``, ``instance_types``),
   age weights with ``half_life_days``; checked (empty, too small or malformed data fails
   here and nothing is registered); snapshot + data version.
2. ``tune_and_fit``: per size class (<= / > MTU), ``n_trials`` seeded Optuna (TPE) trials
   scored by MAPE with CV grouped by allocation (the same data gives the same model), on at
   most ``tune_rows`` rows (the same share of every allocation); fit the two XGBoost
   regressors and the caps on every row.
3. ``evaluate``: challenger and current champion on the same held-out allocations.
4. ``register``: MLflow run (params, MAPE vs noise floor per size class and instance type,
   data version, plot) and a new version of ``srifty-busbw`` with alias ``challenger``;
   nothing when the champion was fitted on the same data (same data version).
5. ``promote``: moves ``champion`` to it only if its held-out MAPE is no worse; the decision
   and its numbers are printed here and put on the run and the version as tags/metrics.
6. ``remove_staging`` (teardown of ``load_data``): removes the staging folder once the
   other tasks are done, succeeded or failed (a failed run is run again from the start).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import Param, dag, task

# Shared policy (plugins/): the probe-store Asset, start date, task defaults.
from srifty_policy import PROBE_STORE, START_DATE, default_args, fails_fast

DEFAULT_ARGS = default_args(retry_delay=timedelta(minutes=1))


@dag(
    dag_id="srifty_model_refresh",
    schedule=PROBE_STORE,  # once per new data: the nightly sweep's update, never twice
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["srifty", "models"],
    doc_md=__doc__,
    params={
        "since_days": Param(
            30, type=["number", "null"], exclusiveMinimum=0, description="Probes this recent."
        ),
        "half_life_days": Param(
            14,
            type=["number", "null"],
            exclusiveMinimum=0,
            description="Sample weight halves every ... days (null: equal weights).",
        ),
        "n_trials": Param(
            30, type="integer", minimum=1, maximum=1000, description="Tuning trials per size class."
        ),
        "tune_rows": Param(
            10_000,
            type=["integer", "null"],
            minimum=1,
            description="Tune on at most this many rows per size class, the same share of "
            "every allocation (null: all); the final fit uses every row.",
        ),
        "providers": Param(
            None, type=["array", "null"], items={"type": "string"}, description="All if null."
        ),
        "instance_types": Param(
            None, type=["array", "null"], items={"type": "string"}, description="All if null."
        ),
        "mtu": Param(9001, type="integer", minimum=1, description="Size-class split, bytes."),
        "seed": Param(0, type="integer", minimum=0),
    },
)
def srifty_model_refresh() -> None:
    @task(multiple_outputs=True)
    @fails_fast
    def load_data() -> dict[str, Any]:
        from airflow.sdk import get_current_context

        from srifty_core.predictors.refresh.config import RefreshConfig, check_tuning_options
        from srifty_core.predictors.refresh.data import stage_data
        from srifty_core.predictors.refresh.staging import staging_dir

        context = get_current_context()
        p = context["params"]
        check_tuning_options(context["dag_run"].conf or {}, "run conf")
        config = RefreshConfig(
            since=timedelta(days=p["since_days"]) if p["since_days"] else None,
            half_life=timedelta(days=p["half_life_days"]) if p["half_life_days"] else None,
            providers=tuple(p["providers"]) if p["providers"] else None,
            instance_types=tuple(p["instance_types"]) if p["instance_types"] else None,
            n_trials=int(p["n_trials"]),
            tune_rows=int(p["tune_rows"]) if p.get("tune_rows") is not None else None,
            mtu=int(p["mtu"]),
            seed=int(p["seed"]),
        )
        info = stage_data(config, staging_dir())
        print(
            f"{info['rows']} rows from {info['allocations']} allocations of "
            f"{', '.join(info['instance_types'])}; data version {info['data_version']}"
        )
        return info

    @task
    @fails_fast
    def tune_and_fit(info: dict[str, Any]) -> str:
        from pathlib import Path

        from srifty_core.predictors.refresh.fit import tune_and_fit as fit

        out = fit(Path(info["staging"]))
        print(
            f"{out['trials']} trials; grouped-CV MAPE <=MTU {out['cv_mape_small']:.2f}%, "
            f">MTU {out['cv_mape_large']:.2f}%"
        )
        return str(out["staging"])

    @task
    @fails_fast
    def evaluate(staging: str) -> str:
        from pathlib import Path

        from srifty_core.predictors.refresh.evaluate import evaluate as run_evaluation

        ev = run_evaluation(Path(staging))
        champion = "none" if not ev["champion"] else f"{ev['champion']['all']:.2f}%"
        print(
            f"held-out MAPE: challenger {ev['challenger']['all']:.2f}%, champion {champion}; "
            f"decision: {ev['decision']['reason']}"
        )
        return staging

    @task
    @fails_fast
    def register(staging: str) -> str:
        from pathlib import Path

        from srifty_core.predictors.refresh.register import register as log_and_register

        out = log_and_register(Path(staging))
        if out["version"] is None:
            print(out["skipped"])
        else:
            print(f"MLflow run {out['run_id']}; model version {out['version']} is challenger")
        return staging

    @task(multiple_outputs=True)
    @fails_fast
    def promote(staging: str) -> dict[str, Any]:
        from pathlib import Path

        from srifty_core.predictors.refresh.promote import promote_or_not

        out = promote_or_not(Path(staging))
        if not out["registered"]:
            print(f"no new version: {out['reason']}; champion: {out['champion']}")
            return out
        verdict = "PROMOTED to champion" if out["promote"] else "NOT promoted"
        print(f"version {out['version']} {verdict}: {out['reason']}; champion: {out['champion']}")
        return out

    @task
    @fails_fast
    def remove_staging(info: dict[str, Any]) -> None:
        from pathlib import Path

        from srifty_core.predictors.refresh.staging import remove_staging as remove

        remove(Path(info["staging"]))

    info = load_data()
    done = promote(register(evaluate(tune_and_fit(info))))
    done >> remove_staging(info).as_teardown(setups=info)


srifty_model_refresh()
