"""The registry's sampled capacities for the costly matrices come from each recipe's own list."""

import pytest

from conformance.registry import speculative_cases, spread_capacities
from ignition.recipes.registry import all_recipes


def test_spread_takes_the_smallest_a_third_of_the_way_and_the_largest():
    assert spread_capacities((1, 2, 4, 8, 16, 32, 64)) == (1, 4, 64)
    assert spread_capacities((1, 2, 4, 8, 16, 32, 64), largest=False) == (1, 4)
    assert spread_capacities((128, 1, 8)) == (1, 8, 128)  # a recipe without 4 or 64 keeps its own largest
    assert spread_capacities((2,)) == (2,)
    with pytest.raises(ValueError, match="no graph capacities"):
        spread_capacities(())


def test_every_speculative_recipe_reaches_its_largest_capacity_on_a_gpu():
    ids = {p.id for p in speculative_cases()}
    for r in all_recipes():
        if any(i.startswith(f"{r.name}-") for i in ids):
            assert f"{r.name}-b{max(r.capacities)}-sm90" in ids and f"{r.name}-b{min(r.capacities)}-cpu" in ids
