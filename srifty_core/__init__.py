"""Srifty: plan, run and re-plan distributed neural-network training on cloud VMs.

Importing this package stays light: it loads none of torch, xgboost, mlflow, pulp or
airflow. Each heavy dependency is imported inside the module that needs it.
"""

from srifty_core.errors import SriftyError

__all__ = ["SriftyError", "__version__"]

__version__ = "0.1.0"
