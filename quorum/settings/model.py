"""Settings classes: pydantic dataclasses with one configuration, and their errors as ``ConfigError``.

A settings class is declared with ``@model`` (a ``pydantic.dataclasses.dataclass``): it stays a
dataclass (``dataclasses.fields``, ``replace``, ``asdict``, positional and keyword construction,
attribute access and assignment all work), and construction validates it:

* types are strict: an ``int`` setting refuses ``True`` and ``"3"``, a ``float`` takes an ``int``;
* an unknown keyword (a key of a file) is refused;
* ranges and forms are ``Field`` constraints or the types below, rules across settings are
  ``@model_validator(mode="after")`` methods raising ``ValueError`` with a message that names them;
* a bare string under a setting is its description (``pidctl ... --help`` shows it).

A bad value raises pydantic's ``ValidationError`` (a ``ValueError``); ``build`` turns it into a
``ConfigError`` of one line that names the source, each bad key and what is wrong with it.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Annotated, Any, Callable

import pydantic
from pydantic import AfterValidator, ConfigDict
from pydantic.dataclasses import dataclass
from pydantic_core import core_schema


class ConfigError(ValueError):
    """A setting, file or combination of them that cannot be used: the message says which and why."""


CONFIG = ConfigDict(strict=True, extra="forbid", use_attribute_docstrings=True)

model = functools.partial(dataclass, config=CONFIG)
"""Declare a settings class (``@model``): a pydantic dataclass with the settings configuration."""


def is_model(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp) and hasattr(tp, "__pydantic_fields__")


@dataclasses.dataclass(frozen=True)
class Table:
    """Marks a setting given in a file as a ``[table]`` of another settings class.

    ``Annotated[RaftConfig, Table()]``: a dict (a TOML table) becomes a ``RaftConfig`` (its errors are
    reported under the setting's name); an instance is taken as it is.  ``Table(Model, convert)``:
    the table is a ``Model``, and the setting holds ``convert(model)`` (a run-time object with no
    file form of its own).
    """

    model: type | None = None
    convert: Callable[[Any], Any] | None = None

    def __get_pydantic_core_schema__(self, source: Any, handler: pydantic.GetCoreSchemaHandler):
        cls = self.model or source

        def from_table(value: Any) -> Any:
            if isinstance(value, dict):
                value = cls(**value)
            if self.convert is not None and isinstance(value, cls):
                value = self.convert(value)
            return value
        return core_schema.no_info_before_validator_function(from_table, handler(source))


class _Path:
    """Marks a file or directory setting: a relative one in a file is relative to that file's directory."""

    def __repr__(self) -> str:
        return "PATH"


PATH = _Path()


def _host_port(min_port: int) -> Callable[[str], str]:
    def check(value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not min_port <= int(port) < 65536:
            raise ValueError(f"expected host:port, got {value!r}")
        return value
    return check


HostPort = Annotated[str, AfterValidator(_host_port(1))]
"""``host:port``, port in 1..65535 (an address to connect to or to advertise)."""
BindAddress = Annotated[str, AfterValidator(_host_port(0))]
"""``host:port`` to listen on; port 0: any free port."""


def _user_principal(value: str) -> str:
    if not value.startswith("User:") or len(value) <= 5:
        raise ValueError(f"{value!r} is not User:<name>")
    return value


UserPrincipal = Annotated[str, AfterValidator(_user_principal)]
"""A Kafka principal ``User:<name>`` (as in ``super_users``)."""


# ---------------------------------------------------------------------------------------- errors
_QUIET = ("password", "secret")  # a bad value of these keys is not repeated in a message


def _where(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _problem(err: dict) -> str:
    kind, msg = err["type"], err["msg"]
    if kind in ("missing", "missing_argument", "missing_keyword_only_argument"):
        return "missing (required)"
    if kind in ("unexpected_keyword_argument", "extra_forbidden", "unexpected_positional_argument"):
        return "unknown key"
    if kind in ("dataclass_exact_type", "dataclass_type"):
        return f"expected a table, got {err['input']!r}"
    if kind in ("value_error", "assertion_error"):
        return msg.split(", ", 1)[1] if msg.startswith(("Value error, ", "Assertion failed, ")) else msg
    text = msg[len("Input "):] if msg.startswith("Input should") else msg[:1].lower() + msg[1:]
    if not any(q in str(part) for part in err["loc"] for q in _QUIET):
        text += f", got {err['input']!r}"
    return text


def describe(err: pydantic.ValidationError) -> str:
    """One line: ``key: problem; other.key: problem`` (a rule across keys: its message alone)."""
    parts = []
    for e in err.errors(include_url=False):
        where, problem = _where(e["loc"]), _problem(e)
        parts.append(f"{where}: {problem}" if where else problem)
    return "; ".join(parts)


def build(cls: type, raw: dict, source: str | None = None) -> Any:
    """``cls(**raw)``; a bad value, key or combination raises ``ConfigError`` naming ``source`` (a file)."""
    try:
        return cls(**raw)
    except pydantic.ValidationError as e:
        raise ConfigError(f"{source}: {describe(e)}" if source else describe(e)) from None


def revalidate(obj: Any) -> None:
    """Check a settings object again after its attributes were assigned (assignment does not check)."""
    build(type(obj), {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init})


def field_info(cls: type, name: str) -> pydantic.fields.FieldInfo:
    return cls.__pydantic_fields__[name]


def table_model(info: pydantic.fields.FieldInfo) -> type | None:
    """The settings class of a ``[table]`` setting, or None."""
    for m in info.metadata:
        if isinstance(m, Table):
            return m.model or info.annotation
    return info.annotation if is_model(info.annotation) else None
