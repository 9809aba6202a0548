"""The conformance matrix, generated from the recipe registry.

Every case is a (recipe, checkpoint/variant) for the frontend, or a (recipe, capacity, GPU class)
for graphs.  A new recipe adds registry lines, never test files.
"""

from __future__ import annotations

from dataclasses import dataclass

from ignition.recipes.registry import all_recipes
from .gpu import GPU_CLASSES


@dataclass(frozen=True)
class FrontendCase:
    recipe: str
    checkpoint: str  # repo id
    variant: str
    tokenizer_class: str

    @property
    def id(self) -> str:
        return f"{self.recipe}-{self.variant}-{self.checkpoint.split('/')[-1]}"


@dataclass(frozen=True)
class GraphCase:
    recipe: str
    capacity: int
    gpu_class: str

    @property
    def id(self) -> str:
        return f"{self.recipe}-b{self.capacity}-{self.gpu_class}"


def frontend_cases() -> list[FrontendCase]:
    return [
        FrontendCase(r.name, c.repo_id, c.variant, c.tokenizer_class)
        for r in all_recipes() for c in r.checkpoints
    ]


def variant_cases() -> list[tuple[str, str]]:
    """Every (recipe, template variant) pair."""
    return [(r.name, v.name) for r in all_recipes() for v in r.variants]


def graph_cases(gpu_classes=GPU_CLASSES[1:]) -> list[GraphCase]:
    return [GraphCase(r.name, cap, g) for r in all_recipes() for cap in r.capacities for g in gpu_classes]


def spread_capacities(capacities, largest: bool = True) -> tuple[int, ...]:
    """A recipe's capacities sampled for the costly matrices: the smallest, the one a third of the way up (Qwen3's
    1..64: 4) and, with ``largest``, the largest -- from the recipe's own list, so none is lost to a fixed guess."""
    caps = sorted(capacities)
    if not caps:
        raise ValueError("a recipe declares no graph capacities")
    return tuple(sorted({caps[0], caps[len(caps) // 3], *((caps[-1],) if largest else ())}))


def speculative_cases(cpu_capacities=None, gpu_capacities=None, gpu_classes=GPU_CLASSES[1:]):
    """Speculative-round cases: recipes with a prepared model and declared verification widths, on the CPU
    (eager prepared steps, unmarked: CI) and on each GPU class (compiled and captured, marked ``gpu``).
    Capacities are a subset of the recipe's (each case compiles and captures decode + every width,
    :func:`spread_capacities`): on the CPU the smallest and a middle one, on a GPU the largest too; given
    capacities are kept where the recipe has them."""
    import importlib

    import pytest

    out = []
    for r in all_recipes():
        module = importlib.import_module(f"ignition.recipes.{r.name}.recipe")
        if not (hasattr(module, "MODEL") and hasattr(module, "SPECULATIVE_WIDTHS")):
            continue
        cpu = spread_capacities(r.capacities, largest=False) if cpu_capacities is None else cpu_capacities
        gpu = spread_capacities(r.capacities) if gpu_capacities is None else gpu_capacities
        out += [pytest.param(GraphCase(r.name, c, "cpu"), id=f"{r.name}-b{c}-cpu")
                for c in cpu if c in r.capacities]
        out += [pytest.param(GraphCase(r.name, c, g), id=f"{r.name}-b{c}-{g}", marks=pytest.mark.gpu)
                for g in gpu_classes for c in gpu if c in r.capacities]
    return out
