"""Command-line flags made from a settings class: one ``click`` option per setting, tables included.

``@options(BrokerConfig)`` adds ``--<setting-name>`` for every setting (``_`` as ``-``), with the type,
range, choices and default of the setting and its description as help; a ``[table]`` setting's
settings get ``--<table-name>-<setting-name>``.  A bool setting is ``--x/--no-x``; a list one is given
once per item.  ``Annotated[..., Flag(...)]`` on a setting changes its flag (another name, a unit,
an environment variable, ...).  ``given(ctx, BrokerConfig)`` is what the command line (or the
environment) gave, as the nested dict a file would: merge it over the file's.

A secret (``Flag(secret=True)``: a password) is never a flag's value: any local user reads a process's
command line (``ps``, ``/proc/PID/cmdline``).  It comes from ``--<name>-file PATH`` (the file's text, one
trailing newline stripped; a warning if group or others may read it), from its environment variable,
or from the settings file; ``--<name>`` itself is refused with a usage error naming those ways
(``secret_options`` does the same for a command's own secret option).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import stat
import typing
from typing import Any, Callable, Iterator, Literal

import annotated_types
import click
from click.core import ParameterSource

from records.wire.bounds import unwrap_optional

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
    secret: bool = False
    """A password: given by ``--<name>-file PATH`` or ``envvar`` (or the file), never as ``--<name> VALUE``."""


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


def _item_type(tp: Any) -> Any:
    if typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _scalar(tp: Any, info, scale: int | None) -> click.ParamType | None:
    tp = unwrap_optional(_item_type(tp))
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
        if flag.secret:
            where = ".".join((*path, name))
            for decls, attrs in _secret_params(option, param, flag.envvar, flag.help or info.description or "",
                                               f"{where} in the --config file"):
                yield _Spec(decls[1], (*path, name), decls, attrs, _same)
            continue
        attrs: dict = {"help": (flag.help or info.description or "").replace("``", ""), "envvar": flag.envvar,
                       "metavar": flag.metavar}
        convert: Callable[[Any], Any] = _same
        default = None if info.is_required() else info.get_default(call_default_factory=True)
        annotation = unwrap_optional(info.annotation)
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


# ------------------------------------------------------------------------------------------ secrets
def read_secret_file(path: str, warn: Callable[[str], None] | None = None) -> str:
    """The secret held in the file at ``path``: its text with one trailing newline stripped.
    ``OSError`` if it cannot be read, ``ValueError`` if it is empty; ``warn(message)`` (default: a line
    on stderr) if group or others may read it."""
    with open(path, encoding="utf-8") as f:
        mode = os.fstat(f.fileno()).st_mode
        text = f.read()
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        (warn or _warn)(f"warning: {path} holds a secret but has mode {stat.S_IMODE(mode):04o}: "
                        f"group or others may read it (chmod 600 {path})")
    if text.endswith("\r\n"):
        text = text[:-2]
    elif text.endswith("\n"):
        text = text[:-1]
    if not text:
        raise ValueError(f"{path} is empty")
    return text


def _warn(message: str) -> None:
    click.echo(message, err=True)


def refused_message(option: str, envvar: str | None, file_key: str | None = None) -> str:
    """The one line that refuses a secret given as a flag's value, naming the ways that are not."""
    ways = [f"{option}-file PATH"]
    if envvar:
        ways.append(f"the environment variable {envvar}")
    if file_key:
        ways.append(file_key)
    use = ways[0] if len(ways) == 1 else f"{', '.join(ways[:-1])} or {ways[-1]}"
    return (f"{option} is refused: a secret on the command line is visible to every local user "
            f"(ps, /proc/PID/cmdline); use {use}")


def _refuse(message: str, ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if ctx.get_parameter_source(param.name) == ParameterSource.COMMANDLINE:
        raise click.UsageError(message, ctx=ctx)
    return value


def _from_file(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    if value is None:
        return None
    try:
        return read_secret_file(value)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        reason = getattr(e, "strerror", None) or str(e)
        raise click.BadParameter(f"cannot read {value}: {reason}", ctx=ctx, param=param) from None


def _secret_params(option: str, param: str, envvar: str | None, help: str,
                   file_key: str | None) -> list[tuple[tuple[str, str], dict]]:
    """The click parameters of a secret: ``option`` (hidden; its environment variable gives the value, the
    flag itself is refused) and ``option-file`` (the value read from that file)."""
    refused = refused_message(option, envvar, file_key)
    env = f" (or the environment variable {envvar})" if envvar else ""
    help = help.replace("``", "").strip()
    help = f"{help.rstrip('.')}: read from this file, one trailing newline stripped{env}. Never a flag's value."
    return [((option, param), {"type": click.STRING, "envvar": envvar, "hidden": True,
                               "callback": functools.partial(_refuse, refused), "help": refused}),
            ((f"{option}-file", f"{param}_file"), {"type": click.Path(dir_okay=False), "metavar": "PATH",
                                                    "callback": _from_file, "help": help})]


def secret_options(option: str, param: str, envvar: str | None = None, help: str = "",
                   file_key: str | None = None) -> Callable[[Callable], Callable]:
    """A decorator adding a secret option of a command (not a setting): ``param`` is the value of the
    environment variable ``envvar``, ``<param>_file`` the text of the file ``--<option>-file`` names (read
    already), and ``option VALUE`` on the command line is refused with a usage error naming those ways."""
    params = _secret_params(option, param, envvar, help, file_key)

    def decorate(fn: Callable) -> Callable:
        for decls, attrs in reversed(params):
            fn = click.option(*decls, **attrs)(fn)
        return fn
    return decorate


def secret_parameters(option: str, param: str, envvar: str | None = None, help: str = "",
                      file_key: str | None = None, hidden: bool = False) -> list[click.Option]:
    """``secret_options``' parameters as click Options, for a command built rather than decorated
    (``hidden``: the ``-file`` option too is left out of the help)."""
    return [click.Option(decls, **{**attrs, "hidden": attrs.get("hidden", False) or hidden})
            for decls, attrs in _secret_params(option, param, envvar, help, file_key)]


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

