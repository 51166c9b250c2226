"""Learned performance models: piecewise-linear compute latency (``compute``); the XGBoost
allreduce bus-bandwidth model joins here. Import the submodule you need."""
