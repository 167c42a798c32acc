"""Settings files written by a test and refused by a loader."""
from __future__ import annotations

import pytest

from quorum.settings import ConfigError


def refusal(path, text: str, load) -> str:
    """Write ``text`` to ``path`` (a pathlib.Path); the message of the ConfigError that ``load(str(path))``
    raises, checked to name the file first."""
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load(str(path))
    assert str(e.value).startswith(f"{path}: "), str(e.value)
    return str(e.value)
