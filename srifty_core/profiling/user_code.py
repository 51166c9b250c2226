"""When the model's own code fails in a training step: an exception from a model Srifty
did not write (a factory, an ``hf:`` config) becomes one line naming the model, the
exception and the model's own ``file:line`` (``user_steps``, ``step_failure``).
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from pathlib import Path

import torch

from srifty_core.errors import SriftyError
from srifty_core.workloads import ModelRefError, parse_model


@contextlib.contextmanager
def user_steps(name: str) -> Iterator[None]:
    """Where the steps of model ``name`` run: an exception the model's own code raises (a
    forward pass that fails, a loss without a gradient) is a ``ModelRefError`` naming the
    model, one line (``step_failure``). A zoo model's failure is Srifty's own bug and keeps
    its traceback; Srifty's errors pass as they are."""
    try:
        yield
    except SriftyError:
        raise
    except Exception as exc:
        if not user_model(name):
            raise
        raise ModelRefError(step_failure(name, exc)) from exc


def user_model(name: str) -> bool:
    """Whether ``name`` is a model Srifty did not write (a factory, an ``hf:`` config)."""
    try:
        return parse_model(name).kind != "zoo"
    except ModelRefError:
        return False


def step_failure(name: str, exc: BaseException) -> str:
    """``<model>: a training step raised <type>: <first line> (<file>:<line>, in <fn>)``:
    the innermost frame outside torch and Srifty (the model's code) where there is one,
    and what a loss without a gradient means."""
    lines = str(exc).strip().splitlines()
    text = f"{name}: a training step raised {type(exc).__name__}: "
    text += lines[0] if lines else "(no message)"
    ours = (Path(torch.__file__).parent, Path(__file__).parent.parent)
    theirs = [
        f
        for f, _ in traceback.walk_tb(exc.__traceback__)
        if not any(Path(f.f_code.co_filename).is_relative_to(d) for d in ours)
    ]
    if theirs:
        f = theirs[-1]
        text += f" ({Path(f.f_code.co_filename).name}:{f.f_lineno}, in {f.f_code.co_name})"
    if "does not require grad" in str(exc):
        text += (
            "; the loss must be computed from the module's output with gradients on (not "
            "detached, not under torch.no_grad)"
        )
    return text
