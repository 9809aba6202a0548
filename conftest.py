"""Root pytest configuration: the conformance results plugin archives every run under results/."""

import os

pytest_plugins = ["conformance.plugin"]

# No network at test time: model files come from the offline hub cache only.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_configure(config):
    # Unpack ../shared/hub once, in the controller, before xdist workers start (they inherit it).
    if not hasattr(config, "workerinput") and not os.environ.get("FLARE_TEST_HUB_CACHE"):
        from ignition.hub import default_hub_cache

        cache = default_hub_cache()
        if cache:
            os.environ["FLARE_TEST_HUB_CACHE"] = cache
