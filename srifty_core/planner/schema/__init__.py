"""What a user may send to the planner, checked field by field in one place.

``request_spec.RequestSpec`` is a ``srifty plan`` request file; ``job_conf.JobConf`` is the
conf of the ``srifty_plan_and_train`` DAG (the same planning fields plus the run's
settings); ``train_plan.TrainPlan`` is the PLAN.json every worker of a configuration
runs. All three are strict pydantic models (``strict.Strict``): numbers are numbers (no
booleans, no strings, no NaN or infinity), whole numbers are whole, every value is in its
range (``fields``), and an unknown key is an error that names it and the closest known one.
``parse`` turns every problem into a ``FieldError`` (a ``ConfigError``, ``field_errors``)
whose one-line message starts with the field's path::

    offers[1].quota: must be a whole number from 0 to 100000, got -2

The dataclasses the planner works on (``planner.request``) check their scalar fields with the
same types (``field_errors.check``), so the rules are written once. The DAG's trigger form
takes its per-field JSON schemas from ``JobConf`` (``trigger_form.param_schemas``).

Light to import: pydantic and the names of the zoo, no planner or simulator.
"""
