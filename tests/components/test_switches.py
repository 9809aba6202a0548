"""``ignition.components.switches.switch``: the one parser of the ``FLARE_*`` side-by-side switches."""

from __future__ import annotations

import pytest

from ignition.components.switches import switch


@pytest.mark.parametrize("value,default,expected", [
    (None, True, True), (None, False, False), ("", True, True), ("  ", False, False),
    ("0", True, False), ("false", True, False), ("OFF", True, False), ("no", True, False),
    ("1", False, True), ("true", False, True), ("on", False, True)])
def test_switch(monkeypatch, value, default, expected):
    if value is None:
        monkeypatch.delenv("FLARE_TEST_SWITCH", raising=False)
    else:
        monkeypatch.setenv("FLARE_TEST_SWITCH", value)
    assert switch("FLARE_TEST_SWITCH", default) is expected
