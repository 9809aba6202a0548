"""KV pool size from free device memory (``flare run`` on CUDA without ``--kv-tokens``).

After the weights are loaded, and before the KV pool and the graphs exist::

    budget = fraction * total - (total - free) - reserve
    pages  = floor(budget / bytes_per_page) - 1          (the pool's sink page is one page more)

``fraction`` is ``--gpu-memory-fraction`` (default 0.90 of the device's total memory); ``total - free``
is what is already in use (weights, CUDA context, other processes); ``reserve`` is what the step graphs
will still need once the pool exists -- the graph pool and workspaces, see :func:`graph_reserve_bytes`.
The pool must hold at least one request of the full context, else the start fails naming the flag.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30
#: cuBLAS/Triton workspaces, allocator rounding and fragmentation: a fixed part of the reserve.
FIXED_RESERVE_BYTES = 1 * GiB
#: Headroom on the estimated transients of the largest step (estimates, not measurements).
TRANSIENT_SAFETY = 2


@dataclass(frozen=True)
class Geometry:
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    dtype_bytes: int = 2

    @classmethod
    def from_manifest(cls, g) -> "Geometry":
        return cls(g.num_layers, g.hidden_size, g.intermediate_size, g.num_attention_heads, g.num_kv_heads,
                   g.head_dim, g.vocab_size)

    def bytes_per_page(self, page_size: int) -> int:
        """K and V of every layer for ``page_size`` tokens."""
        return 2 * self.layers * page_size * self.kv_heads * self.head_dim * self.dtype_bytes


def graph_reserve_bytes(g: Geometry, steps: list[tuple[int, int]], max_context: int) -> int:
    """Memory the captured steps need besides weights and KV: ``FIXED_RESERVE_BYTES`` plus
    ``TRANSIENT_SAFETY`` x the largest step's transients (all graphs share one pool, so the largest
    counts).  For a step of ``rows x tokens`` over a context ``S = max_context``: the reference paged
    attention's gathered K/V (``2 rows S kv_heads head_dim``, bf16), its bf16 scores, fp32 softmax and bf16
    probabilities (``rows heads tokens S`` x 8 bytes), one layer's activations
    (``rows tokens (4 hidden + (heads + 2 kv_heads) head_dim + 3 intermediate)``, bf16) and the fp32
    logits with the sampler's copies (``3 rows vocab`` x 4 bytes)."""
    def transient(rows: int, tokens: int) -> int:
        b = g.dtype_bytes
        kv = 2 * rows * max_context * g.kv_heads * g.head_dim * b
        scores = rows * g.heads * tokens * max_context * (b + 4 + b)
        act = rows * tokens * (4 * g.hidden + (g.heads + 2 * g.kv_heads) * g.head_dim + 3 * g.intermediate) * b
        logits = 3 * rows * g.vocab * 4
        return kv + scores + act + logits

    return FIXED_RESERVE_BYTES + TRANSIENT_SAFETY * max((transient(r, t) for r, t in steps), default=0)


@dataclass(frozen=True)
class KVPlan:
    pages: int
    tokens: int
    reason: str


def validate_fraction(fraction: float) -> None:
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"--gpu-memory-fraction {fraction}: expected a fraction in (0, 1]")


def kv_plan_from_memory(*, free: int, total: int, fraction: float, reserve: int, bytes_per_page: int,
                        page_size: int, min_tokens: int) -> KVPlan:
    """Whole pages that fit the budget (module docstring); ``min_tokens``: one full-context request."""
    validate_fraction(fraction)
    used = total - free
    budget = int(fraction * total) - used - reserve
    pages = budget // bytes_per_page - 1 if budget > 0 else 0
    gib = lambda n: f"{n / GiB:.2f} GiB"  # noqa: E731
    reason = (f"{fraction:g} x {gib(total)} total - {gib(used)} in use - {gib(reserve)} reserved for the graph "
              f"pool and workspaces = {gib(max(budget, 0))} at {bytes_per_page} bytes per {page_size}-token page")
    if pages * page_size < min_tokens:
        raise ValueError(f"--gpu-memory-fraction {fraction:g} leaves room for {max(pages, 0) * page_size} KV tokens, "
                         f"fewer than one {min_tokens}-token request ({reason}); raise --gpu-memory-fraction, lower "
                         f"--max-context, or give --kv-tokens")
    return KVPlan(pages, pages * page_size, reason)
