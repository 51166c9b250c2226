"""Which models a DAG trigger may name: model references from a trigger are data, not code.

Whoever may trigger a DAG may not thereby run code of their choosing in the Airflow
workers (which hold the deployment's connections and secrets). So the DAGs accept only a
registered model reference (``registered_model``):

- a zoo name (``resnet18``, ...) or a shipped Hugging Face config (``hf:gpt2``, ...);
- a factory of the package's ``REGISTERED_MODULES`` (the published benchmarks' networks);
- a reference the deployment lists in ``SRIFTY_TRIGGER_MODELS`` (comma-separated): a
  ``package.module:factory`` installed on the image, ``package.module:*`` for every
  factory of that module, or ``hf:PATH`` for a config of its own.

A file path (``path/to/file.py:factory``) is never accepted from a trigger, listed or not:
a job's own ``entrypoint`` could write that file first. Install the model as a module on
the image and list it instead. The shell (``srifty profile``, ``srifty plan``, ``srifty
train``) takes any reference: there the caller runs their own code; planning counts a
user's factory in a child process without the caller's secrets (``profiling.census``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from srifty_core.workloads import ModelRefError, model_key, parse_model, shipped_hf_configs

ENV_VAR = "SRIFTY_TRIGGER_MODELS"
"""Deployment setting: more model references a DAG trigger may name (see the module doc)."""
REGISTERED_MODULES: tuple[str, ...] = ("srifty_core.profiling.reference_models",)
"""Modules of the package whose factories every trigger may name."""

_HOW = (
    "a trigger may name only a registered model: a zoo model, a shipped hf: config, or a "
    f"module reference the deployment lists in {ENV_VAR}"
)


def allowed(env: Mapping[str, str] | None = None) -> frozenset[str]:
    """The deployment's list (``SRIFTY_TRIGGER_MODELS``), each entry normalised."""
    text = (os.environ if env is None else env).get(ENV_VAR, "")
    out = set()
    for entry in (e.strip() for e in text.split(",")):
        if entry.endswith(":*"):
            out.add(entry)
        elif entry:
            try:
                out.add(parse_model(entry).text)
            except ModelRefError:
                out.add(entry)  # never matches a reference: refused as unregistered
    return frozenset(out)


def registered_model(text: Any, env: Mapping[str, str] | None = None) -> str:
    """``text`` (normalised) when a trigger may name it, else a one-line ``ModelRefError``
    (``model: ...``) saying why. A plain name that is no reference (a model whose profiles
    are stored under that name: a what-if request's) is data and passes."""
    try:
        ref = parse_model(text)
    except ModelRefError:
        return model_key(text)  # a stored name passes, anything else raises as it is
    if ref.kind == "zoo" or (ref.kind == "hf" and ref.target in shipped_hf_configs()):
        return ref.text
    if ref.kind == "file":
        raise ModelRefError(f"{ref.text!r} is a file path: {_HOW} (install it as a module)")
    listed = allowed(env)
    if ref.base in listed:  # registered at any sequence length
        return ref.text
    if ref.kind == "module" and (ref.target in REGISTERED_MODULES or f"{ref.target}:*" in listed):
        return ref.text
    raise ModelRefError(f"{ref.text!r} is not registered: {_HOW}")
