"""Locating the offline hub cache: a ``../shared/hub`` whose materialize script fails is an error naming it, never
taken for an absent hub (which would skip every hub case)."""

import pytest

from ignition import hub


@pytest.fixture
def shared(tmp_path, monkeypatch):
    monkeypatch.delenv("FLARE_TEST_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setattr(hub, "SHARED_HUB", tmp_path)
    hub.default_hub_cache.cache_clear()
    yield tmp_path
    hub.default_hub_cache.cache_clear()


def test_a_failing_materialize_script_is_named(shared):
    (shared / "materialize.py").write_text("import sys\nprint('disk full', file=sys.stderr)\nsys.exit(3)\n")
    with pytest.raises(hub.HubUnavailable, match=r"materialize.py exited 3 without a cache path: disk full"):
        hub.default_hub_cache()


def test_the_script_s_last_line_is_the_cache_and_no_script_is_no_hub(shared):
    assert hub.default_hub_cache() is None  # no ../shared/hub here
    hub.default_hub_cache.cache_clear()
    (shared / "materialize.py").write_text("print('unpacking...')\nprint('/some/cache')\n")
    assert hub.default_hub_cache() == "/some/cache"
