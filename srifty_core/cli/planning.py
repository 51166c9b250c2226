"""The ``srifty plan`` command: a plan for a request file with the chosen estimator and
bandwidth model, its ``--what-if`` scenarios and ``--one-more-vm`` values, and its outputs
(``--write-plan``, the training plan ``srifty train`` runs; ``--frontier``, the plot).

``cmd_plan`` takes the parsed arguments and returns the exit code (1: nothing fits); the
planner and the simulator are imported inside it, so ``srifty --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from srifty_core import paths

if TYPE_CHECKING:
    from srifty_core.outputs import Output


def _import_xgboost_without_sklearn() -> None:
    """Import XGBoost without its scikit-learn wrapper when neither is loaded yet.

    ``import xgboost`` imports scikit-learn whenever it is installed (for ``XGBRegressor``
    and friends), and scikit-learn imports ``scipy.stats``: about 0.7 s of a 1-2 s ``srifty
    plan``. Srifty uses XGBoost's own API only (``DMatrix``, ``train``, ``Booster``), which
    does not need scikit-learn, so ``plan`` imports XGBoost with scikit-learn hidden for
    that moment. In this process XGBoost's scikit-learn wrapper then says scikit-learn is
    missing; nothing in ``srifty plan`` uses it. Only the ``plan`` command run as a program
    does this (``main()`` without ``argv``), never a caller of ``main([...])`` in its own
    process.
    """
    if "xgboost" in sys.modules or "sklearn" in sys.modules:
        return
    sys.modules["sklearn"] = None  # type: ignore[assignment]  # "import sklearn" fails
    try:
        import xgboost  # noqa: F401
    except ImportError:  # XGBoost missing: the model's own load says so
        pass
    finally:
        del sys.modules["sklearn"]


def cmd_plan(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from srifty_core.planner.job import (
        load_bandwidth_with_source,
        load_request,
        read_request_file,
        render,
    )
    from srifty_core.planner.search import plan

    outs = _PlanOutputs(args)  # a bad output path is named before any work
    report = outs.report
    data = read_request_file(Path(args.request))
    request = load_request(data)
    bandwidth: dict[str, object] | None = None
    calibration = None  # factors earlier runs of this model measured (simulator.calibration)
    if args.estimator == "apm":
        from srifty_core.simulator.apm import ApmEstimator

        estimator: object = ApmEstimator()
    else:
        from srifty_core.simulator.estimator import Simulator

        if args.bandwidth == "champion" and args.as_program:
            _import_xgboost_without_sklearn()
        model, bandwidth = load_bandwidth_with_source(
            args.bandwidth, refresh_model=args.refresh_model, public_fallback=True
        )
        if not args.no_calibration:
            from srifty_core.simulator.calibration import for_request

            calibration = for_request(request, model)
        estimator = Simulator(model, seed=args.seed, calibration=calibration)
    if args.what_if or args.one_more_vm:
        return _what_if(args, estimator, bandwidth, data, outs)
    result = plan(request, estimator, method=args.method)  # type: ignore[arg-type]
    if args.json:
        out = result.to_dict()
        if bandwidth is not None:
            out["bandwidth_model"] = bandwidth
        out["calibration"] = None if calibration is None else calibration.to_dict()
        print(json.dumps(out, indent=1), file=report)
    else:
        print(render(result, None if bandwidth is None else str(bandwidth["text"])), file=report)
        if calibration is not None:
            print(
                f"Calibrated by earlier runs of {request.workload.model} "
                "(--no-calibration to ignore): " + "; ".join(calibration.describe()),
                file=report,
            )
    _write_plan_outputs(args, data, result, outs)
    return 0 if result.feasible else 1


class _PlanOutputs:
    """``srifty plan``'s ``--write-plan`` and ``--frontier`` (``outputs``), checked before
    the plan is made; ``report``: where the answer goes (standard error where standard
    output carries one of them, ``-``)."""

    def __init__(self, args: argparse.Namespace) -> None:
        from srifty_core.outputs import answer_stream, output

        self.plan = output(args.write_plan, "--write-plan")
        self.frontier = output(args.frontier, "--frontier")
        self.report = answer_stream(self.plan, self.frontier)


def _write_plan_outputs(
    args: argparse.Namespace, data: Any, result: Any, outs: _PlanOutputs
) -> None:
    """The frontier plot and the training plan of ``result`` (the base plan of a
    ``--what-if``), where asked for."""
    if outs.frontier is not None:
        from srifty_core.planner.plot import plot_frontier

        where = outs.frontier.write_with(lambda p: plot_frontier(result, p))
        if not args.json:
            print(f"frontier plot: {where}", file=outs.report)
    if outs.plan is not None and result.best is not None:
        written = write_train_plan(
            data, result.request, result.best, args, outs.plan, strategy=result.strategy
        )
        if not args.json and not outs.plan.to_stdout:
            print(f"training plan: {written} (run it: srifty train {written})", file=outs.report)
    elif outs.plan is not None:
        print("no training plan written: nothing meets the limits", file=sys.stderr)


def write_train_plan(
    data: Any,
    request: Any,
    best: Any,
    args: argparse.Namespace,
    out: Output,
    *,
    strategy: str = "ddp",
) -> str:
    """``srifty plan --write-plan``: the best configuration as the plan ``srifty train``
    runs (one rank per GPU in launch order, the request's model, size and settings), the
    launches and the prediction kept in its ``extra``; written atomically to ``out``.
    Returns where it went."""
    import dataclasses
    import json

    from srifty_core.jobs.planning import launches_for, train_plan_for
    from srifty_core.planner.schema.request_spec import RequestSpec
    from srifty_core.training_settings import TrainingSettings
    from srifty_core.workloads import model_key

    spec = RequestSpec.parse(data)
    launches = launches_for(request, best.choice)
    run_dir = args.run_dir or str(paths.data_dir() / "runs" / model_key(spec.model))
    plan = train_plan_for(
        launches,
        model=spec.model,
        size=spec.size,
        global_batch=spec.global_batch,
        iterations=spec.iterations,
        run_dir=run_dir,
        checkpoint_every=spec.checkpoint_every,
        settings=TrainingSettings.from_dict(spec.model_dump()),
        extra={
            "launches": [dataclasses.asdict(x) for x in launches],
            "predicted": best.to_dict(request),
            "request": str(args.request),
        },
        strategy=strategy,
        micro_batches=best.estimate.micro_batches,
        sync_each_micro_batch=best.estimate.sync_each_micro_batch,
    )
    return out.write(json.dumps(plan.to_dict(), indent=1, default=str) + "\n")


def _what_if(
    args: argparse.Namespace, estimator: object, bandwidth: object, data: Any, outs: _PlanOutputs
) -> int:
    """``srifty plan --what-if ... --one-more-vm``: the base plan and each scenario's
    (``planner.whatif``), simulations shared; ``--write-plan`` and ``--frontier`` are the
    base plan's."""
    import json
    from pathlib import Path

    from srifty_core.catalog import Catalog
    from srifty_core.planner import whatif
    from srifty_core.planner.job import read_request_file, store_requests
    from srifty_core.profiling.store import ProfileStore

    build = store_requests(Catalog.load(), ProfileStore())
    scenarios = [whatif.parse_scenario(t) for t in args.what_if]  # bad input fails first
    what = whatif.WhatIf(
        read_request_file(Path(args.request)),
        estimator,  # type: ignore[arg-type]
        build,
        {"method": args.method},
    )
    answers = [what.ask(s) for s in scenarios]
    marginal = what.marginal_values() if args.one_more_vm else []
    report = outs.report
    if args.json:
        out = whatif.to_dict(what, answers, marginal)
        if bandwidth is not None:
            out["bandwidth_model"] = bandwidth
        print(json.dumps(out, indent=1), file=report)
    else:
        print(whatif.render(what, answers, marginal), file=report)
        print(
            f"simulations: {what.memo.misses} run, {what.memo.hits} reused from earlier searches",
            file=report,
        )
    _write_plan_outputs(args, data, what.base, outs)
    return 0 if what.base.feasible else 1
