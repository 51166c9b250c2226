"""Srifty: plan, run and re-plan distributed neural-network training on cloud VMs.

Importing this package stays light: it loads none of torch, xgboost, mlflow, pulp or
airflow. Each heavy dependency is imported inside the module that needs it.
"""

from typing import Any

from srifty_core.errors import SriftyError

__all__ = ["SriftyError", "__version__", "plan"]


def plan(request: Any, estimator: Any, **options: Any) -> Any:
    """``srifty_core.planner.search.plan``, imported on first use (keeps this import light)."""
    from srifty_core.planner.search import plan as _plan

    return _plan(request, estimator, **options)


__version__ = "0.1.0"
