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


def test_mebibytes(monkeypatch):
    """A size switch given in MiB comes back in bytes; the default is in bytes; a negative or non-number names it."""
    from ignition.components.switches import mebibytes

    monkeypatch.delenv("FLARE_TEST_MB", raising=False)
    assert mebibytes("FLARE_TEST_MB", 24 << 20) == 24 << 20
    monkeypatch.setenv("FLARE_TEST_MB", "1.5")
    assert mebibytes("FLARE_TEST_MB", 0) == 3 << 19
    monkeypatch.setenv("FLARE_TEST_MB", "0")
    assert mebibytes("FLARE_TEST_MB", 24 << 20) == 0
    for bad in ("-1", "lots"):
        monkeypatch.setenv("FLARE_TEST_MB", bad)
        with pytest.raises(ValueError, match="FLARE_TEST_MB"):
            mebibytes("FLARE_TEST_MB", 0)
