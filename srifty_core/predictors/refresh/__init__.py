"""Refresh the bandwidth model: load probes -> tune and fit -> evaluate against the champion
-> register -> promote or not, one module per step (``data``, ``fit``, ``evaluate``,
``register``, ``promote``). The ``srifty fit-bandwidth`` command runs the steps in one
process (``pipeline``); the ``srifty_model_refresh`` DAG runs one per task, handing over a
staging folder (``staging``). ``config`` holds what a refresh is asked to do, ``report``
renders what it did.

Bad input (no rows, too few, missing columns, a schema mismatch) raises before anything is
logged or registered; a step that fails never moves the ``champion`` alias.
"""
