"""Settings: typed, validated configuration for the node and the broker (pydantic).

``quorum.settings.model``: settings classes (``@model``) and ``build``, bad values as a one-line ``ConfigError``;
``quorum.settings.files``: TOML files (read, load, merge, write); ``quorum.settings.flags``: click options made from a
settings class.  ``quorum.config`` (a node's file) and ``broker.config`` (a broker's file and flags) use it.
"""
from .files import load, merge, read, resolve_paths, to_toml, toml_value
from .model import PATH, BindAddress, ConfigError, HostPort, Table, UserPrincipal, build, describe, model, revalidate

__all__ = ["PATH", "BindAddress", "ConfigError", "HostPort", "Table", "UserPrincipal", "build", "describe", "load",
           "merge", "model", "read", "resolve_paths", "revalidate", "to_toml", "toml_value"]
