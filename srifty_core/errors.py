"""Domain exceptions. Each says what was wrong and what to change."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class SriftyError(Exception):
    """Base class of every error Srifty raises on purpose."""


class ConfigError(SriftyError, ValueError):
    """A setting or input field is invalid; the message names the field."""


class FieldError(ConfigError):
    """A field of a request or conf is invalid. ``path`` names it (``offers[1].quota``, the
    first when several are); the message is ``<path>: <problem>`` on one line."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}" if path else problem)


class UnknownNameError(SriftyError, LookupError):
    """A name (instance type, region, market, zone, ...) is not known.

    The message names the kind of thing and the bad value and lists the closest valid names.
    """

    def __init__(self, kind: str, name: str, valid: Iterable[str], context: str = "") -> None:
        self.kind = kind
        self.name = name
        self.valid = sorted(set(valid))
        self.suggestions = suggest(name, self.valid)
        where = f" {context}" if context else ""
        if self.suggestions:
            hint = "did you mean " + ", ".join(repr(s) for s in self.suggestions) + "?"
        else:
            shown = ", ".join(self.valid[:12]) + (", ..." if len(self.valid) > 12 else "")
            hint = f"valid: {shown}"
        super().__init__(f"unknown {kind} {name!r}{where}; {hint}")

    def __str__(self) -> str:  # LookupError would otherwise repr() the message
        return str(self.args[0])


def suggest(name: str, valid: Iterable[str], n: int = 3) -> list[str]:
    """The closest valid names to ``name`` (case-insensitive), best first."""
    by_lower: dict[str, str] = {}
    for v in valid:
        by_lower.setdefault(v.lower(), v)
    hits = difflib.get_close_matches(name.lower(), list(by_lower), n=n, cutoff=0.6)
    return [by_lower[h] for h in hits]
