import pytest

from ignition.hub import default_hub_cache


@pytest.fixture(scope="session")
def hub_cache():
    return default_hub_cache()
