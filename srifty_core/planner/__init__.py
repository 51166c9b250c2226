"""The planner: the best VM configuration (counts, local batches, markets) for a training
job under time and budget limits. ``plan(request, estimator) -> PlanResult``; requests in
``planner.request``, the searches in ``planner.search``."""
