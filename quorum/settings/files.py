"""Settings files (TOML): reading one into a settings class, merging, and writing one back."""
from __future__ import annotations

import dataclasses
import json
import os
import tomllib
import typing
from typing import Any

from .model import PATH, ConfigError, build, field_info, is_model, table_model


def read(path: str) -> dict:
    """The TOML file's tables, or ``ConfigError`` naming the file (unreadable, not TOML)."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None


def load(cls: type, path: str) -> Any:
    """A ``cls`` from the TOML file at ``path``; relative paths in it are relative to its directory."""
    return build(cls, resolve_paths(cls, read(path), os.path.dirname(os.path.abspath(path))), source=path)


def _list_item_model(annotation: Any) -> type | None:
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation) or (None,)
        if typing.get_origin(item) is typing.Annotated:
            item = typing.get_args(item)[0]
        return item if is_model(item) else None
    return None


def resolve_paths(cls: type, raw: dict, base_dir: str) -> dict:
    """``raw`` with each path setting (marked ``PATH``, in tables too) joined to ``base_dir``."""
    out = dict(raw)
    for name, value in raw.items():
        if name not in cls.__pydantic_fields__:
            continue  # an unknown key: refused when built
        info = field_info(cls, name)
        sub, items = table_model(info), _list_item_model(info.annotation)
        if PATH in info.metadata and isinstance(value, str):
            out[name] = os.path.join(base_dir, value)
        elif sub is not None and isinstance(value, dict):
            out[name] = resolve_paths(sub, value, base_dir)
        elif items is not None and isinstance(value, list):
            out[name] = [resolve_paths(items, v, base_dir) if isinstance(v, dict) else v for v in value]
    return out


def merge(base: dict, over: dict) -> dict:
    """``base`` with ``over``'s keys in place of its own; tables are merged key by key."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


# ------------------------------------------------------------------------------------------ writing
def to_toml(obj: Any, first: dict | None = None, exclude: tuple[str, ...] = (), _table: str = "") -> str:
    """A TOML file that ``load`` reads back as ``obj``: ``first``'s keys, then every setting but
    ``exclude`` (an unset one, None, is left out: that is how the file says "unset"), then each
    table setting as ``[name]``, then each list of them as ``[[name]]``."""
    lines = [f"{k} = {toml_value(v)}" for k, v in (first or {}).items()]
    tables, arrays = [], []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.name in exclude or value is None:
            continue
        if is_model(type(value)):
            tables.append((f.name, value))
        elif _list_item_model(field_info(type(obj), f.name).annotation) is not None:
            arrays.append((f.name, value))
        else:
            lines.append(f"{f.name} = {toml_value(_typed(obj, f.name, value))}")
    for name, value in tables:
        lines += ["", f"[{_table}{name}]", *to_toml(value, _table=f"{_table}{name}.").splitlines()]
    for name, values in arrays:
        for value in values:
            lines += ["", f"[[{_table}{name}]]", *to_toml(value, _table=f"{_table}{name}.").splitlines()]
    return "\n".join(lines) + "\n"


def _typed(obj: Any, name: str, value: Any) -> Any:
    if field_info(type(obj), name).annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # keep a float a float in the file, even if assigned an int
    return value


def toml_value(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")  # a TOML basic string
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, float)):
        return repr(v)
    raise TypeError(f"no TOML form for {type(v).__name__} {v!r}")
