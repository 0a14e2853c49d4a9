"""Typed policy parameters and the policy spec a campaign writes (pure).

Rules:

1. A policy declares its parameters as :class:`Param` (name, type, default, range or
   choices). A campaign sets them in the spec, ``NAME/field=value/field=value``
   (``mylease/lease_ms=500``), or in a ``[policies.NAME]`` table; the one positional
   form kept from before is ``NAME/K`` for policies with ``params`` (``metadata_sync/4``).
2. A bad value is one :class:`ParamError` line naming the field and what is allowed.
3. :func:`canonical_spec` writes a spec with its settings in declaration order and
   values in one form, so two spellings of one configuration are one cell.
4. A parameter may also accept a few words besides its kind's values (``named``: the
   budget ``b`` of ``planfence_budget`` is an integer >= 0 or ``all``); a word is kept
   as the string it is.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
KINDS = ("int", "float", "str", "bool")


class ParamError(ValueError):
    """A parameter value (or declaration) is not allowed; one line naming the field."""


@dataclass(frozen=True)
class Param:
    """One named, typed parameter of a policy."""

    name: str
    kind: str
    default: Any
    lo: float | None = None
    hi: float | None = None
    choices: tuple[Any, ...] = ()
    doc: str = ""
    #: Words allowed besides the kind's values (rule 4), e.g. ``("all",)``.
    named: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ParamError(f"parameter name {self.name!r}: need [a-z][a-z0-9_]{{0,39}}")
        if self.kind not in KINDS:
            raise ParamError(f"parameter {self.name}: kind {self.kind!r} not one of "
                             f"{', '.join(KINDS)}")
        object.__setattr__(self, "choices", tuple(self.choices))
        object.__setattr__(self, "named", tuple(self.named))
        if not all(isinstance(w, str) and _NAME_RE.match(w) for w in self.named):
            raise ParamError(f"parameter {self.name}: named values must be words "
                             f"[a-z][a-z0-9_]{{0,39}}")
        try:
            self.coerce(self.default)  # the default must itself be allowed
        except ParamError as exc:
            raise ParamError(f"default of {exc}") from None

    def allowed(self) -> str:
        words = "".join(f" or {w}" for w in self.named)
        return self._allowed_values() + words

    def _allowed_values(self) -> str:
        if self.choices:
            return ", ".join(map(format_value, self.choices))
        noun = {"int": "an integer", "float": "a number", "str": "a string",
                "bool": "true or false"}[self.kind]
        if self.lo is not None and self.hi is not None:
            return f"{noun} {format_value(self.lo)}..{format_value(self.hi)}"
        if self.lo is not None:
            return f"{noun} >= {format_value(self.lo)}"
        if self.hi is not None:
            return f"{noun} <= {format_value(self.hi)}"
        return noun

    def coerce(self, value: Any) -> Any:
        """The value as this parameter's type, or ParamError naming the field."""
        if isinstance(value, str) and value.strip() in self.named:
            return value.strip()
        out = _convert(self.kind, value)
        ok = out is not None
        if ok and self.choices:
            ok = out in self.choices
        if ok and self.kind in ("int", "float"):
            ok = (self.lo is None or out >= self.lo) and (self.hi is None or out <= self.hi)
        if not ok:
            shown = repr(value) if isinstance(value, str) else format_value(value)
            raise ParamError(f"{self.name}: {shown} is not allowed; allowed: "
                             f"{self.allowed()}")
        return out


def _convert(kind: str, value: Any) -> Any:
    if isinstance(value, str) and kind != "str":
        text = value.strip()
        if kind == "bool":
            return {"true": True, "false": False}.get(text.lower())
        try:
            value = int(text) if kind == "int" else float(text)
        except ValueError:
            return None
    if kind == "int":
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    if kind == "float":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return float(value) if ok and math.isfinite(value) else None
    if kind == "bool":
        return value if isinstance(value, bool) else None
    return value if isinstance(value, str) and value and "/" not in value \
        and "=" not in value else None


def format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value) if isinstance(value, int | float | str) else repr(value)


@dataclass(frozen=True)
class Spec:
    """A parsed policy spec: the name, the positional ``K`` and the named settings."""

    name: str
    positional: int | None
    given: tuple[tuple[str, str], ...]  # (field, raw value) in the order written


def split_spec(spec: str) -> Spec:
    """``name[/K][/field=value]...`` into its parts (no checks of the values)."""
    name, *parts = spec.split("/")
    positional: int | None = None
    given: list[tuple[str, str]] = []
    for i, part in enumerate(parts):
        field, eq, raw = part.partition("=")
        if eq:
            given.append((field, raw))
        elif i == 0 and part.isdigit() and str(int(part)) == part:
            positional = int(part)
        else:
            raise ParamError(f"{part!r}: expected field=value (or a leading /K)")
    return Spec(name, positional, tuple(given))


def resolve_settings(params: Sequence[Param], given: Sequence[tuple[str, Any]],
                     table: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every declared parameter's value: the spec's, else the table's, else the default."""
    declared = {p.name: p for p in params}
    out = {p.name: p.default for p in params}
    names = [field for field, _ in given]
    twice = [f for i, f in enumerate(names) if f in names[:i]]
    if twice:
        raise ParamError(f"{twice[0]}: given twice")
    for field, raw in [*(table or {}).items(), *given]:
        param = declared.get(field)
        if param is None:
            allowed = ", ".join(declared) or "none (this policy takes no parameters)"
            raise ParamError(f"{field}: unknown parameter; allowed: {allowed}")
        out[field] = param.coerce(raw)
    return out


def canonical_spec(name: str, positional: int | None, params: Sequence[Param],
                   settings: Mapping[str, Any]) -> str:
    """The one spelling of a configuration: settings that differ from their default,
    in declaration order."""
    parts = [name] + ([str(positional)] if positional is not None else [])
    parts += [f"{p.name}={format_value(settings[p.name])}" for p in params
              if settings.get(p.name, p.default) != p.default]
    return "/".join(parts)
