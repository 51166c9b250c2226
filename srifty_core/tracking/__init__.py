"""Srifty's MLflow records, and the only place that imports MLflow.

- ``store``: the store's URI, experiments and clients (set-up);
- ``runs``: runs, their params, metrics, tags and artifacts, Srifty's tag names;
- ``registry``: registered models, their versions and aliases (writing a version logged
  from code, reading one's artifacts back);
- ``pyfunc``: the ``PythonModel`` that serves a model logged from code.

The modules above it (profiles, the bandwidth model, the job's record) call these typed
functions and never import MLflow; this package imports only the bottom layer (paths,
errors). Importing it, ``store``, ``runs`` or ``registry`` loads no MLflow: their functions
import it when called.
"""
