"""Unit tests for the settings layer (quorum/settings/): settings classes, files, flags; no processes."""
from __future__ import annotations

import dataclasses
from dataclasses import field
from typing import Annotated, Any, Literal

import click
import pytest
from click.testing import CliRunner
from pydantic import Field, ValidationError, model_validator

from quorum import settings
from quorum.settings import PATH, ConfigError, HostPort, Table
from quorum.settings.flags import Flag, given, options
from tests.support.config_files import refusal


@settings.model
class Inner:
    rate: Annotated[float, Field(gt=0, le=10)] = 1.0
    """How fast."""
    count: Annotated[int, Field(ge=1), Flag(name="--n")] = 3
    path: Annotated[str | None, PATH] = None


@settings.model
class Item:
    name: str
    address: HostPort


@settings.model
class Knob:
    level: int = 1


@settings.model
class Outer:
    ident: int
    flag: bool = False
    mode: Literal["a", "b"] = "a"
    names: Annotated[tuple[str, ...], Field(strict=False)] = ()
    addresses: Annotated[list[HostPort], Field(strict=False), Flag(sep=",")] = field(default_factory=list)
    wait_s: Annotated[float, Field(ge=0.01), Flag(name="--wait-ms", scale=1000)] = 1.0
    data: Annotated[str | None, PATH] = None
    api_secret: str | None = None
    inner: Annotated[Inner, Table()] = field(default_factory=Inner)
    items: Annotated[list[Annotated[Item, Table()]], Field(strict=False)] = field(default_factory=list)
    runtime: Annotated[Any, Table(Knob, lambda k: ("converted", k.level))] = None

    @model_validator(mode="after")
    def _check(self) -> "Outer":
        if self.flag and not self.names:
            raise ValueError("flag needs names")
        return self


# ------------------------------------------------------------------------------------------- models
def test_a_settings_class_stays_a_dataclass():
    o = Outer(7, names=["x"], items=[Item("i", "h:1")])
    assert [f.name for f in dataclasses.fields(Outer)][:3] == ["ident", "flag", "mode"]
    assert dataclasses.replace(o, ident=8).ident == 8 and dataclasses.asdict(o)["inner"]["count"] == 3
    assert o.names == ("x",) and o == Outer(ident=7, names=("x",), items=[Item(name="i", address="h:1")])
    assert [f.default for f in dataclasses.fields(Inner)] == [1.0, 3, None]  # the values, not pydantic's FieldInfo
    o.ident = 9  # assignment is not checked (as with a plain dataclass); revalidate checks
    o.mode = "z"
    with pytest.raises(ConfigError, match="mode: should be 'a' or 'b', got 'z'"):
        settings.revalidate(o)


@pytest.mark.parametrize("kwargs,message", [
    ({"ident": "7"}, "ident: should be a valid integer, got '7'"),
    ({"ident": True}, "ident: should be a valid integer, got True"),
    ({"ident": 1, "flag": 1}, "flag: should be a valid boolean, got 1"),
    ({"ident": 1, "bogus": 2}, "bogus: unknown key"),
    ({}, "ident: missing (required)"),
    ({"ident": 1, "flag": True}, "flag needs names"),
    ({"ident": 1, "inner": {"rate": 0}}, "inner.rate: should be greater than 0, got 0"),
    ({"ident": 1, "inner": {"zz": 0}}, "inner.zz: unknown key"),
    ({"ident": 1, "inner": 5}, "inner: expected a table, got 5"),
    ({"ident": 1, "items": [{"name": "a", "address": "h:1"}, {"name": "b", "address": "h"}]},
     "items[1].address: expected host:port, got 'h'"),
    ({"ident": 1, "addresses": ["h:0"]}, "addresses[0]: expected host:port, got 'h:0'"),
    ({"ident": 1, "api_secret": 5}, "api_secret: should be a valid string"),  # its value not repeated
])
def test_a_bad_setting_names_its_key_and_why(kwargs, message):
    with pytest.raises(ValidationError):  # a ValueError, as a plain dataclass's __post_init__ raised
        Outer(**kwargs)
    with pytest.raises(ConfigError) as e:
        settings.build(Outer, kwargs, source="x.toml")
    assert str(e.value) == f"x.toml: {message}"


def test_several_problems_are_one_line():
    with pytest.raises(ConfigError) as e:
        settings.build(Outer, {"ident": "1", "mode": "c", "bogus": 1})
    text = str(e.value)
    assert "\n" not in text and text.count("; ") == 2 and "bogus: unknown key" in text


def test_tables_become_their_classes_and_a_converted_one_its_value():
    o = Outer(1, inner={"rate": 2}, items=[{"name": "a", "address": "h:1"}], runtime={"level": 5})
    assert o.inner == Inner(rate=2.0) and o.items == [Item("a", "h:1")] and o.runtime == ("converted", 5)
    assert Outer(1, inner=Inner(count=4)).inner.count == 4


# -------------------------------------------------------------------------------------------- files
def test_a_file_is_loaded_with_its_paths_relative_to_it(tmp_path):
    (tmp_path / "conf").mkdir()
    path = tmp_path / "conf" / "x.toml"
    path.write_text('ident = 1\ndata = "d"\n[inner]\npath = "/abs"\n[[items]]\nname = "a"\naddress = "h:1"\n')
    o = settings.load(Outer, str(path))
    assert o.data == str(tmp_path / "conf" / "d") and o.inner.path == "/abs" and o.items == [Item("a", "h:1")]


@pytest.mark.parametrize("text,message", [
    ("ident = 1\nbogus = 2\n", "bogus: unknown key"),
    ("ident = 1\n[inner]\ncount = 0\n", "inner.count: should be greater than or equal to 1, got 0"),
    ('ident = "1"\n', "ident: should be a valid integer, got '1'"),
    ("ident = \n", "invalid TOML"),
])
def test_a_bad_file_is_named_in_the_error(tmp_path, text, message):
    assert message in refusal(tmp_path / "x.toml", text, lambda path: settings.load(Outer, path))


def test_an_unreadable_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=f"^{tmp_path}/none.toml: No such file or directory$"):
        settings.load(Outer, str(tmp_path / "none.toml"))


def test_merge_replaces_keys_and_merges_tables():
    assert settings.merge({"a": 1, "t": {"x": 1, "y": 2}, "l": [1]}, {"a": 2, "t": {"y": 3}, "l": [2]}) == \
        {"a": 2, "t": {"x": 1, "y": 3}, "l": [2]}


def test_to_toml_round_trips(tmp_path):
    o = Outer(5, flag=True, mode="b", names=("n1", 'q"uote'), addresses=["h:1"], wait_s=2, data="/d",
              inner=Inner(rate=3, count=4), items=[Item("a", "h:1"), Item("b", "h:2")])
    text = settings.to_toml(o, exclude=("runtime",))
    assert "wait_s = 2.0" in text and "[inner]" in text and text.count("[[items]]") == 2
    path = tmp_path / "x.toml"
    path.write_text(text)
    assert settings.load(Outer, str(path)) == o


# -------------------------------------------------------------------------------------------- flags
def _command():
    seen = {}

    @click.command()
    @options(Outer)
    @click.pass_context
    def cmd(ctx, **_):
        seen.update(given(ctx, Outer))
    return cmd, seen


def test_each_setting_is_a_flag_of_its_type_range_and_default():
    cmd, _ = _command()
    params = {p.name: p for p in cmd.params}
    assert set(params) == {"ident", "flag", "mode", "names", "addresses", "wait_s", "data", "api_secret",
                           "inner__rate", "inner__count", "inner__path", "runtime__level"}  # a list of tables: none
    assert params["flag"].opts == ["--flag"] and params["flag"].secondary_opts == ["--no-flag"]
    assert params["mode"].type.choices == ("a", "b") and params["names"].multiple
    assert params["wait_s"].opts == ["--wait-ms"] and params["wait_s"].type.min == 10
    assert params["wait_s"].default == 1000
    assert params["inner__rate"].opts == ["--inner-rate"] and params["inner__rate"].help == "How fast."
    assert params["inner__count"].opts == ["--n"] and params["inner__count"].default == 3
    assert params["runtime__level"].opts == ["--runtime-level"]  # a converted setting: its table's flags


def test_only_the_flags_given_are_settings():
    cmd, seen = _command()
    r = CliRunner().invoke(cmd, ["--ident", "3", "--no-flag", "--names", "a", "--names", "b",
                                 "--addresses", "h:1, h:2", "--wait-ms", "250", "--inner-rate", "2"])
    assert r.exit_code == 0, r.output
    assert seen == {"ident": 3, "flag": False, "names": ("a", "b"), "addresses": ["h:1", "h:2"], "wait_s": 0.25,
                    "inner": {"rate": 2.0}}
    seen.clear()
    r = CliRunner().invoke(cmd, ["--inner-rate", "11"])
    assert r.exit_code == 2 and "11" in r.output and "0<x<=10" in r.output  # the setting's range
    r = CliRunner().invoke(cmd, [])
    assert r.exit_code == 0 and seen == {}
