"""Typed fields of the files a user writes (pydantic), with one-line errors.

The pieces every model of ``testbed.campaign.schema`` (and of the ``[command]`` table,
``testbed.campaign.command``) is made of:

1. A field is ``Annotated[Any, Check(check, schema)]``: CHECK validates the value as
   the file writes it (TOML types, no coercion: ``true`` is no integer) and raises
   :func:`not_allowed` / :func:`bad`; SCHEMA is the field's JSON Schema, for editors.
2. A :class:`Table` refuses unknown fields first, naming the allowed ones in order.
3. :func:`first_problem` turns a ``ValidationError`` into the one line the user reads:
   ``<path>: <message>``, the path written as the file writes it (``grid[1].rho``,
   ``command.run[0].on``). A message holding :data:`HERE` names its own path there (a
   check that mentions another field); one made by :func:`whole` is complete already
   (a parser of its own named the path).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import PydanticCustomError, core_schema

from testbed.errors import UserError

HERE = "\x00"  # in a message: the path of the field it is about (rule 3)
_WHOLE = "\x01"  # a message's first character: it names its path itself

NUMBER_GE0: dict[str, Any] = {"type": "number", "minimum": 0}
NUMBER_GT0: dict[str, Any] = {"type": "number", "exclusiveMinimum": 0}
BOOL: dict[str, Any] = {"type": "boolean"}
STRING: dict[str, Any] = {"type": "string"}
STRINGS: dict[str, Any] = {"type": "array", "items": STRING}


def enum(choices: Sequence[Any]) -> dict[str, Any]:
    return {"enum": list(choices)}


def int_schema(lo: int, hi: int | None = None) -> dict[str, Any]:
    return {"type": "integer", "minimum": lo, **({} if hi is None else {"maximum": hi})}


# --- errors ------------------------------------------------------------------------------


def bad(message: str) -> PydanticCustomError:
    """A field's error: MESSAGE follows its path (or holds it, rule 3)."""
    return PydanticCustomError("testbed", "{message}", {"message": message})


def whole(message: str) -> PydanticCustomError:
    """An error whose MESSAGE names its own path already."""
    return bad(_WHOLE + message)


def fmt_value(value: Any) -> str:
    """A value as the message shows it: numbers as a file writes them (4, not 4.0)."""
    if is_number(value) and math.isfinite(value):
        return str(int(value)) if float(value).is_integer() else repr(float(value))
    return repr(value)


def not_allowed(value: Any, allowed: str) -> PydanticCustomError:
    return bad(f"{fmt_value(value)} is not allowed; allowed: {allowed}")


def path_of(loc: Sequence[int | str], prefix: str = "") -> str:
    out = prefix
    for part in loc:
        out = f"{out}[{part}]" if isinstance(part, int) else f"{out}.{part}" if out else part
    return out


def first_problem(exc: ValidationError, prefix: str = "", *, top: str = "campaign") -> str:
    """The first error of EXC as one line naming its field (rule 3); TOP names the file
    where the path is empty."""
    err = exc.errors(include_url=False)[0]
    ctx = err.get("ctx") or {}
    path = path_of(err["loc"], prefix) or top
    if err["type"] == "testbed":
        message = str(ctx["message"])
        if message.startswith(_WHOLE):
            message = message.removeprefix(_WHOLE)
        elif HERE not in message:
            return f"{path}: {message}"
        return message.replace(HERE, path)
    if err["type"] == "missing":
        return f"{path}: missing"
    return f"{path}: {err['msg']}"


def message_of(exc: PydanticCustomError, where: str) -> str:
    """The line of an error raised outside validation (a cross-field check), at WHERE."""
    message = str((exc.context or {})["message"])
    if message.startswith(_WHOLE):
        return message.removeprefix(_WHOLE)
    return message.replace(HERE, where) if HERE in message else f"{where}: {message}"


def user_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """FUNC raises a UserError naming its path (a parser of its own): keep that line."""
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except UserError as exc:
            raise whole(str(exc)) from None
    return wrapped


# --- value checks ------------------------------------------------------------------------


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def choice(choices: Sequence[str]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if isinstance(value, str) and value in choices:
            return value
        raise not_allowed(value, ", ".join(choices))
    return check


def number(allowed: str, *, lo: float, lo_open: bool = False, hi: float | None = None
           ) -> Callable[[Any], float]:
    def check(value: Any) -> float:
        if is_number(value) and math.isfinite(value) and (
                value > lo if lo_open else value >= lo) and (hi is None or value <= hi):
            return float(value)
        raise not_allowed(value, allowed)
    return check


def integer(lo: int, hi: int, allowed: str) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if is_int(value) and lo <= value <= hi:
            return int(value)
        raise not_allowed(value, allowed)
    return check


def flag(allowed: str) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        if isinstance(value, bool):
            return value
        raise not_allowed(value, allowed)
    return check


def no_duplicates(values: Sequence[Any]) -> None:
    seen: set[Any] = set()
    for v in values:
        if v in seen:
            raise bad(f"{fmt_value(v)} is listed twice; list each value once")
        seen.add(v)


def context(info: ValidationInfo) -> Mapping[str, Any]:
    return info.context if isinstance(info.context, Mapping) else {}


class Check:
    """A field's type (rule 1): CHECK validates it, SCHEMA is its JSON Schema. CHECK
    takes the value, or the value and the ValidationInfo (WITH_INFO)."""

    def __init__(self, check: Callable[..., Any], schema: dict[str, Any], *,
                 with_info: bool = False) -> None:
        self.check, self.schema, self.with_info = check, schema, with_info

    def _run(self, value: Any, info: ValidationInfo) -> Any:
        return self.check(value, info) if self.with_info else self.check(value)

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler
                                     ) -> core_schema.CoreSchema:
        return core_schema.with_info_plain_validator_function(self._run)

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> dict[str, Any]:
        return self.schema


class Table(BaseModel):
    """A table with a fixed set of fields (rule 2)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)
    #: how the table is written, for "expected ..." (e.g. "an [options] table")
    written: ClassVar[str] = "a table"

    @classmethod
    def allowed_fields(cls, info: ValidationInfo) -> tuple[str, ...]:
        return tuple(cls.model_fields)

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, Mapping):
            raise bad(f"expected {cls.written}")
        allowed = cls.allowed_fields(info)
        unknown = [k for k in data if k not in allowed]
        if unknown:
            raise bad(f"unknown field {unknown[0]!r}; allowed: {', '.join(allowed)}")
        return data

    def given(self) -> dict[str, Any]:
        """The fields the file gave (those left out are None)."""
        return {k: getattr(self, k) for k in type(self).model_fields
                if getattr(self, k) is not None}
