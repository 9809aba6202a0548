"""``ignition.components.switches``: the one parser of the ``FLARE_*`` side-by-side switches (``switch``, ``number``)."""

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


def test_number(monkeypatch):
    from ignition.components.switches import number

    monkeypatch.delenv("FLARE_TEST_NUMBER", raising=False)
    assert number("FLARE_TEST_NUMBER") is None and number("FLARE_TEST_NUMBER", 4) == 4
    monkeypatch.setenv("FLARE_TEST_NUMBER", " ")
    assert number("FLARE_TEST_NUMBER", 4) == 4
    monkeypatch.setenv("FLARE_TEST_NUMBER", "2.5")
    assert number("FLARE_TEST_NUMBER", 4) == 2.5
    monkeypatch.setenv("FLARE_TEST_NUMBER", "four")
    with pytest.raises(ValueError, match="FLARE_TEST_NUMBER='four'"):
        number("FLARE_TEST_NUMBER", 4)
