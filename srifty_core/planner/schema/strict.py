"""The base of the request documents: strict types, finite floats, no unknown keys, and
``parse``, which raises one ``FieldError`` naming the bad field (``field_errors``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from srifty_core.planner.schema.field_errors import field_error

_M = TypeVar("_M", bound="Strict")


class Strict(BaseModel):
    """Strict types, finite floats, no unknown keys; ``parse`` raises ``FieldError``."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)
    kind: ClassVar[str] = "field"
    """What an unknown key is called in errors (``unknown offer field 'qouta'``)."""
    rule: ClassVar[str] = "a mapping"

    @classmethod
    def parse(cls: type[_M], data: Any, where: str = "") -> _M:
        """``data`` checked; ``where`` is the path of ``data`` in a larger document
        (``offers[2]``), put before the fields named in errors."""
        if isinstance(data, Mapping) and not isinstance(data, dict):
            data = dict(data)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise field_error(exc, cls, where) from None
