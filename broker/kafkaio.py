"""Version-agnostic construction of kio response entities.

Kafka's schemas differ per version only by fields appearing or disappearing,
so handlers describe a response once, as plain dicts and lists, and ``build``
makes the kio entity of whatever version the client asked for: fields the
version lacks are dropped, fields it has but the dict lacks keep their
schema default, nested entities and arrays are built recursively, error codes
and durations get kio's types.
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import typing
from typing import Any

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from records.wire.bounds import unwrap_optional


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, Any, str | None, bool, bool], ...]:
    """(name, element type, kafka_type, is_array, has_default) per field."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        hint = unwrap_optional(hints[f.name])
        array = typing.get_origin(hint) is tuple
        if array:
            hint = unwrap_optional(typing.get_args(hint)[0])
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        out.append((f.name, hint, f.metadata.get("kafka_type"), array, has_default))
    return tuple(out)


def _value(hint: Any, kafka_type: str | None, v: Any) -> Any:
    if v is None:
        return None
    if kafka_type is None and dataclasses.is_dataclass(hint):
        return build(hint, v) if isinstance(v, dict) else v
    if kafka_type == "error_code":
        return v if isinstance(v, ErrorCode) else ErrorCode(int(v))
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return v if isinstance(v, datetime.timedelta) else datetime.timedelta(milliseconds=max(0, int(v)))
    return v


def build(cls: type, data: dict[str, Any]) -> Any:
    kwargs: dict[str, Any] = {}
    for name, hint, kafka_type, array, has_default in _fields(cls):
        if name not in data:
            if not has_default:
                raise TypeError(f"{cls.__module__}.{cls.__qualname__}: no value for required field {name!r}")
            continue
        v = data[name]
        if array and v is not None:
            v = tuple(_value(hint, kafka_type, x) for x in v)
        else:
            v = _value(hint, kafka_type, v)
        kwargs[name] = v
    return cls(**kwargs)


def response(api_key: int, version: int, data: dict[str, Any]) -> Any:
    return build(load_response_schema(api_key, version), data)


def ms(td: datetime.timedelta | int | None) -> int:
    """Milliseconds of a kio duration field."""
    if td is None:
        return 0
    if isinstance(td, datetime.timedelta):
        return int(td.total_seconds() * 1000)
    return int(td)
