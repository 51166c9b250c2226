"""The iteration simulator: slowest-VM compute under variance plus event-driven gradient
exchange. ``Simulator(bandwidth).estimate(workload, config) -> IterationEstimate``;
``ApmEstimator`` is the analytical baseline with the same interface."""
