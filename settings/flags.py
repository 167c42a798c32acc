"""Command-line flags made from a settings class: one ``click`` option per setting, tables included.

``@options(BrokerConfig)`` adds ``--<setting-name>`` for every setting (``_`` as ``-``), with the type,
range, choices and default of the setting and its description as help; a ``[table]`` setting's
settings get ``--<table-name>-<setting-name>``.  A bool setting is ``--x/--no-x``; a list one is given
once per item.  ``Annotated[..., Flag(...)]`` on a setting changes its flag (another name, a unit,
an environment variable, ...).  ``given(ctx, BrokerConfig)`` is what the command line (or the
environment) gave, as the nested dict a file would: merge it over the file's.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Callable, Iterator, Literal

import annotated_types
import click
from click.core import ParameterSource

from .model import PATH, field_info, table_model


@dataclasses.dataclass(frozen=True)
class Flag:
    """How a setting appears on the command line (all optional)."""

    name: str | None = None
    """The flag, e.g. ``"--partitions"`` (default ``--<setting-name>``)."""
    help: str | None = None
    """Instead of the setting's description."""
    envvar: str | None = None
    """An environment variable that gives the flag (and so overrides a file too)."""
    sep: str | None = None
    """A list setting given as one value, split at ``sep`` (``--quorum a:1,b:2``)."""
    scale: int | None = None
    """The flag is the setting times ``scale``, an int (1000: ``--x-ms`` for a setting in seconds)."""
    prefix: str | None = None
    """For a ``[table]`` setting: what its settings' flags start with (default ``<setting-name>-``)."""
    metavar: str | None = None


@dataclasses.dataclass(frozen=True)
class _Spec:
    param: str               # the click parameter name
    path: tuple[str, ...]    # where the value goes: ("pid_manager", "backoff_max_s")
    decls: tuple[str, ...]
    attrs: dict
    convert: Callable[[Any], Any]


def _flag(info) -> Flag:
    return next((m for m in info.metadata if isinstance(m, Flag)), Flag())


def _bounds(info) -> dict:
    out = {}
    for m in info.metadata:
        for key in ("ge", "gt", "le", "lt"):
            if isinstance(m, getattr(annotated_types, key.capitalize())):
                out[key] = getattr(m, key)
    return out


def _range(base: type, info, scale: int | None) -> click.ParamType:
    b = {k: v * scale if scale else v for k, v in _bounds(info).items()}
    if not b:
        return click.INT if base is int else click.FLOAT
    lo, hi = b.get("ge", b.get("gt")), b.get("le", b.get("lt"))
    if base is int:  # an int flag of a float setting (scaled) rounds the bounds inwards
        lo = None if lo is None else (int(lo) + 1 if "gt" in b and lo == int(lo) else -int(-lo // 1))
        hi = None if hi is None else (int(hi) - 1 if "lt" in b and hi == int(hi) else int(hi // 1))
        return click.IntRange(lo, hi)
    return click.FloatRange(lo, hi, min_open="gt" in b, max_open="lt" in b)


def _unwrap_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _item_type(tp: Any) -> Any:
    if typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _scalar(tp: Any, info, scale: int | None) -> click.ParamType | None:
    tp = _unwrap_optional(_item_type(tp))
    if typing.get_origin(tp) is Literal:
        return click.Choice([str(a) for a in typing.get_args(tp)])
    if tp is str:
        return click.Path() if PATH in info.metadata else click.STRING
    if tp is int:
        return _range(int, info, None)
    if tp is float:
        return _range(int, info, scale) if scale else _range(float, info, None)
    return None


def _same(value: Any) -> Any:
    return value


def _specs(cls: type, prefix: str = "", path: tuple[str, ...] = ()) -> Iterator[_Spec]:
    for name in cls.__pydantic_fields__:
        info = field_info(cls, name)
        flag, sub = _flag(info), table_model(info)
        if sub is not None:
            sub_prefix = flag.prefix if flag.prefix is not None else f"{name}-".replace("_", "-")
            yield from _specs(sub, prefix + sub_prefix, (*path, name))
            continue
        option = flag.name or f"--{prefix}{name}".replace("_", "-")
        param = "__".join((*path, name))
        attrs: dict = {"help": (flag.help or info.description or "").replace("``", ""), "envvar": flag.envvar,
                       "metavar": flag.metavar}
        convert: Callable[[Any], Any] = _same
        default = None if info.is_required() else info.get_default(call_default_factory=True)
        annotation = _unwrap_optional(info.annotation)
        sequence = typing.get_origin(annotation)
        decls = (option, param)
        if annotation is bool:
            decls = (f"{option}/--no-{option[2:]}", param)
        elif sequence in (list, tuple):
            attrs["type"] = _scalar(typing.get_args(annotation)[0], info, None)
            if attrs["type"] is None:
                continue  # a list of tables: no flag
            if flag.sep is not None:  # one value, split
                convert = functools.partial(_split, flag.sep, sequence)
                default = None if default is None else flag.sep.join(default)
            else:  # the flag once per item
                attrs["multiple"] = True
                convert = sequence
        else:
            attrs["type"] = _scalar(annotation, info, flag.scale)
            if attrs["type"] is None:
                continue  # a run-time object: no flag
            if flag.scale:
                convert = functools.partial(_unscale, flag.scale)
                default = None if default is None else round(default * flag.scale)
        if default is not None and default != ():
            attrs.update(default=default, show_default=True)
        yield _Spec(param, (*path, name), decls, attrs, convert)


def _split(sep: str, sequence: type, value: str) -> Any:
    return sequence(x.strip() for x in value.split(sep) if x.strip())


def _unscale(scale: int, value: Any) -> float:
    return value / scale


def options(cls: type) -> Callable[[Callable], Callable]:
    """A decorator adding a click option for each setting of ``cls`` (and of its tables)."""
    specs = list(_specs(cls))

    def decorate(fn: Callable) -> Callable:
        for spec in reversed(specs):
            fn = click.option(*spec.decls, **spec.attrs)(fn)
        return fn
    return decorate


def given(ctx: click.Context, cls: type) -> dict:
    """The settings the command line or the environment gave, nested as in a file; the others are
    left out (a file's value or the setting's default applies)."""
    out: dict = {}
    for spec in _specs(cls):
        value = ctx.params.get(spec.param)
        if ctx.get_parameter_source(spec.param) not in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT):
            continue
        table = out
        for key in spec.path[:-1]:
            table = table.setdefault(key, {})
        table[spec.path[-1]] = spec.convert(value)
    return out

