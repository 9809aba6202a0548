"""ScratchArena: one storage for the scratch every prepared plan declares.

A *plan* (a kernel plan, a tuned operator, a graph variant's workspace set) declares named scratch
requirements: bytes, or shape + dtype, each with an alignment.  The entries of one plan are live
together and get disjoint, aligned slots inside the plan's region.

- Plans registered with :meth:`ScratchArena.register` run one after another (serial layers, graph
  variants that replay one at a time): every such plan's region starts at offset 0, so they share bytes.
- Plans registered together with :meth:`ScratchArena.register_parallel` are live at the same time
  (branches on a side stream, producer/consumer pairs): their regions are laid out one after another
  and never overlap.  Groups are serial with respect to each other.
- :attr:`peak_bytes` is the largest group; the storage holds at least that.  :meth:`resize` replaces the
  storage (grow after a new plan, or "reserve the candidate envelope, then trim to the selected peak")
  and bumps the *generation*; bindings made before it are stale.  The old storage is overwritten with
  0xFF bytes (NaN in every float width) before it is dropped, so a stale raw view reads garbage.
- :meth:`bind` returns a :class:`ScratchBinding` of tensor views; indexing a stale binding raises
  :class:`StaleBindingError`, and every view carries its generation so :meth:`ScratchArena.check_view`
  can validate a tensor that escaped its binding.  :meth:`refresh` re-binds all live bindings.
- :meth:`poison` fills a plan's disposable storage after its last permitted use -- NaN for floating
  entries, the sentinel byte 0xA5 otherwise -- through the ``flare::scratch_fill_`` custom op, so a
  graph that reads scratch before writing it produces NaN / sentinel values that checks catch.

Device-agnostic: the storage is a ``torch.uint8`` tensor on ``device``; views are ``narrow().view(dtype)``.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from .custom_ops import SENTINEL_BYTE, poison_pattern, scratch_fill_

__all__ = ["ScratchRequest", "ScratchPlan", "ScratchArena", "ScratchBinding", "StaleBindingError",
           "ScratchError", "DEFAULT_ALIGNMENT", "contains_poison"]

#: 256 bytes: the CUDA caching allocator's granularity; covers TMA (128) and vector loads (16).
DEFAULT_ALIGNMENT = 256
#: Written over storage that is being dropped (resize, release): NaN in every IEEE float width
#: (fp64/32/16, bf16, fp8 e4m3fn/e5m2) and -1 in integers, so a stale raw view reads garbage.
INVALID_BYTE = 0xFF


class ScratchError(RuntimeError):
    """A scratch declaration or binding that cannot be honoured."""


class StaleBindingError(ScratchError):
    """A binding (or view) from an older generation of the arena was used after a resize."""


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


@dataclass(frozen=True)
class ScratchRequest:
    """One named scratch requirement: ``nbytes`` of bytes, or ``shape`` of ``dtype``."""

    name: str
    nbytes: int
    shape: tuple[int, ...] | None = None
    dtype: torch.dtype | None = None
    alignment: int = DEFAULT_ALIGNMENT

    @classmethod
    def tensor(cls, name: str, shape: Iterable[int], dtype: torch.dtype,
               alignment: int = DEFAULT_ALIGNMENT) -> "ScratchRequest":
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ScratchError(f"scratch {name!r}: negative dimension in {shape}")
        return cls(name, math.prod(shape) * dtype.itemsize, shape, dtype, alignment)

    @classmethod
    def bytes(cls, name: str, nbytes: int, alignment: int = DEFAULT_ALIGNMENT) -> "ScratchRequest":
        return cls(name, int(nbytes), None, None, alignment)

    def __post_init__(self):
        if self.nbytes < 0:
            raise ScratchError(f"scratch {self.name!r}: negative size {self.nbytes}")
        if self.alignment <= 0 or self.alignment & (self.alignment - 1):
            raise ScratchError(f"scratch {self.name!r}: alignment {self.alignment} is not a power of two")
        if self.dtype is not None and self.alignment % self.dtype.itemsize:
            raise ScratchError(f"scratch {self.name!r}: alignment {self.alignment} below {self.dtype} element size")


class ScratchPlan:
    """A named set of scratch requirements that are live together.

    ``ScratchPlan("attn.decode", q=((8, 128), torch.bfloat16), workspace=4096)``: a tuple value is
    ``(shape, dtype)`` or ``(shape, dtype, alignment)``, an int is a byte count; :class:`ScratchRequest`
    values are taken as they are.
    """

    def __init__(self, name: str, requests: Iterable[ScratchRequest] = (), **entries: Any):
        reqs = list(requests)
        for key, spec in entries.items():
            if isinstance(spec, ScratchRequest):
                reqs.append(spec)
            elif isinstance(spec, int):
                reqs.append(ScratchRequest.bytes(key, spec))
            else:
                reqs.append(ScratchRequest.tensor(key, *spec))
        names = [r.name for r in reqs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ScratchError(f"plan {name!r}: duplicate scratch names {dup}")
        self.name = name
        self.requests: tuple[ScratchRequest, ...] = tuple(reqs)
        # Slots inside the plan's region, in declaration order.
        self.offsets: dict[str, int] = {}
        end = 0
        for r in self.requests:
            off = _align(end, r.alignment)
            self.offsets[r.name] = off
            end = off + r.nbytes
        self.nbytes = end
        self.alignment = max((r.alignment for r in self.requests), default=1)

    def __repr__(self) -> str:
        return f"ScratchPlan({self.name!r}, {self.nbytes} B, {[r.name for r in self.requests]})"


@dataclass
class _Placement:
    plan: ScratchPlan
    group: int
    offset: int  # of the plan's region inside the arena


class ScratchBinding:
    """Tensor views of one plan's scratch, valid for one arena generation."""

    def __init__(self, arena: "ScratchArena", plan: ScratchPlan):
        self._arena, self.plan = arena, plan
        self._bind()

    def _bind(self) -> None:
        self.generation = self._arena.generation
        self._views = {r.name: self._arena._view(self.plan, r) for r in self.plan.requests}

    def _check(self) -> None:
        if self.generation != self._arena.generation:
            raise StaleBindingError(
                f"binding of plan {self.plan.name!r} is from arena generation {self.generation}, the arena "
                f"is at {self._arena.generation} (resized since); call refresh()")

    def __getitem__(self, name: str) -> torch.Tensor:
        self._check()
        return self._views[name]

    def __contains__(self, name: str) -> bool:
        return name in self._views

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        self._check()
        return dict(self._views)

    @property
    def stale(self) -> bool:
        return self.generation != self._arena.generation

    def refresh(self) -> "ScratchBinding":
        """Re-bind to the arena's current storage (after :meth:`ScratchArena.resize`)."""
        self._arena._placement(self.plan)  # still registered?
        self._bind()
        return self


def contains_poison(t: torch.Tensor) -> torch.Tensor:
    """Boolean tensor: does ``t`` hold poison (NaN for floating dtypes, the sentinel byte otherwise)?

    No host sync: the caller decides when to read the result.
    """
    if t.dtype.is_floating_point:
        return torch.isnan(t.float()).any()
    raw = t.contiguous().reshape(-1).view(torch.uint8)
    if t.dtype.itemsize == 1:
        return (raw == SENTINEL_BYTE).any()
    return (raw.view(-1, t.dtype.itemsize) == SENTINEL_BYTE).all(dim=-1).any()


class ScratchArena:
    """See the module docstring.  ``name`` appears in memory reports."""

    def __init__(self, device: torch.device | str = "cpu", name: str = "scratch"):
        self.device = torch.device(device)
        self.name = name
        self.generation = 0
        self._placements: dict[str, _Placement] = {}
        self._groups: list[list[str]] = []
        self._raw: torch.Tensor | None = None  # over-allocated for base alignment
        self._storage: torch.Tensor | None = None  # aligned view of capacity_bytes
        self._bindings: "weakref.WeakSet[ScratchBinding]" = weakref.WeakSet()

    # ------------------------------------------------------------------ declaration
    def register(self, plan: ScratchPlan) -> ScratchPlan:
        """A plan that runs alone: its region starts at 0 and is shared with every other group."""
        self.register_parallel(plan)
        return plan

    def register_parallel(self, *plans: ScratchPlan) -> tuple[ScratchPlan, ...]:
        """Plans that are live at the same time: disjoint regions, laid out in the order given."""
        if not plans:
            raise ScratchError("register_parallel needs at least one plan")
        names = [p.name for p in plans]
        clash = [n for n in names if n in self._placements or names.count(n) > 1]
        if clash:
            raise ScratchError(f"arena {self.name!r}: plan names already registered: {sorted(set(clash))}")
        group, end = len(self._groups), 0
        for p in plans:
            off = _align(end, p.alignment)
            self._placements[p.name] = _Placement(p, group, off)
            end = off + p.nbytes
        self._groups.append(names)
        return plans

    def unregister(self, plan: ScratchPlan | str) -> None:
        """Forget a plan (a tuning candidate not selected); its whole parallel group goes with it."""
        group = self._placement(plan).group
        for n in self._groups[group]:
            del self._placements[n]
        self._groups[group] = []

    def _placement(self, plan: ScratchPlan | str) -> _Placement:
        name = plan if isinstance(plan, str) else plan.name
        try:
            return self._placements[name]
        except KeyError:
            raise ScratchError(f"arena {self.name!r}: no plan {name!r} registered") from None

    # ------------------------------------------------------------------ sizes
    def _group_bytes(self, names: list[str]) -> int:
        return max((self._placements[n].offset + self._placements[n].plan.nbytes for n in names), default=0)

    @property
    def peak_bytes(self) -> int:
        """Bytes the registered plans need: the largest parallel group (serial groups share)."""
        return max((self._group_bytes(g) for g in self._groups), default=0)

    @property
    def declared_bytes(self) -> int:
        """Bytes without any reuse (sum of all plans): what separate allocations would cost."""
        return sum(p.plan.nbytes for p in self._placements.values())

    @property
    def capacity_bytes(self) -> int:
        return 0 if self._storage is None else self._storage.numel()

    @property
    def max_alignment(self) -> int:
        return max((p.plan.alignment for p in self._placements.values()), default=DEFAULT_ALIGNMENT)

    # ------------------------------------------------------------------ storage
    def resize(self, capacity_bytes: int | None = None, *, refresh: bool = False) -> None:
        """Replace the storage with ``capacity_bytes`` (default: exactly :attr:`peak_bytes`).

        Bumps the generation: existing bindings become stale (``refresh=True`` re-binds them all).
        The old storage is poisoned first so stale raw views read poison.  Never call during capture.
        """
        cap = self.peak_bytes if capacity_bytes is None else int(capacity_bytes)
        if cap < self.peak_bytes:
            raise ScratchError(f"arena {self.name!r}: capacity {cap} B below the declared peak {self.peak_bytes} B")
        if self._storage is not None:
            self._fill(0, self.capacity_bytes, INVALID_BYTE, 1)
        align = max(self.max_alignment, DEFAULT_ALIGNMENT)
        raw = torch.empty(cap + align, dtype=torch.uint8, device=self.device)
        base = (-raw.data_ptr()) % align
        self._raw, self._storage = raw, raw[base:base + cap]
        self.generation += 1
        if refresh:
            self.refresh()

    def reserve(self, capacity_bytes: int) -> None:
        """Grow to at least ``capacity_bytes`` (a tuning envelope); never shrinks."""
        if capacity_bytes > self.capacity_bytes or self._storage is None:
            self.resize(max(capacity_bytes, self.peak_bytes))

    def trim(self, *, refresh: bool = True) -> None:
        """Shrink to the selected peak and re-bind (after tuning has unregistered losing candidates)."""
        if self._storage is None or self.capacity_bytes != self.peak_bytes:
            self.resize(refresh=refresh)

    def release(self) -> None:
        """Drop the storage (poisoned first); bindings become stale."""
        if self._storage is not None:
            self._fill(0, self.capacity_bytes, INVALID_BYTE, 1)
        self._raw = self._storage = None
        self.generation += 1

    def refresh(self) -> None:
        """Re-bind every live binding to the current storage."""
        for b in list(self._bindings):
            if b.plan.name in self._placements:
                b.refresh()

    # ------------------------------------------------------------------ binding
    def bind(self, plan: ScratchPlan | str) -> ScratchBinding:
        """Views of ``plan``'s scratch in the current storage (allocated to the peak on first use)."""
        placement = self._placement(plan)
        if self._storage is None:
            self.resize()
        self._require_capacity()
        b = ScratchBinding(self, placement.plan)
        self._bindings.add(b)
        return b

    def _require_capacity(self) -> None:
        if self.capacity_bytes < self.peak_bytes:
            raise ScratchError(f"arena {self.name!r} holds {self.capacity_bytes} B but its plans need "
                               f"{self.peak_bytes} B: call resize() and refresh bindings")

    def _view(self, plan: ScratchPlan, req: ScratchRequest) -> torch.Tensor:
        start = self._placement(plan).offset + plan.offsets[req.name]
        raw = self._storage.narrow(0, start, req.nbytes)
        t = raw if req.dtype is None else raw.view(req.dtype).view(req.shape)
        t._flare_scratch = (id(self), self.generation, plan.name, req.name)
        return t

    def check_view(self, t: torch.Tensor) -> None:
        """Raise :class:`StaleBindingError` if ``t`` is a view of an older generation of this arena."""
        tag = getattr(t, "_flare_scratch", None)
        if tag is None or tag[0] != id(self):
            raise ScratchError("tensor is not a view of this scratch arena")
        if tag[1] != self.generation:
            raise StaleBindingError(f"view {tag[2]}.{tag[3]} is from arena generation {tag[1]}, "
                                    f"the arena is at {self.generation}")

    # ------------------------------------------------------------------ poison
    def _fill(self, offset: int, nbytes: int, value: int, width: int) -> None:
        scratch_fill_(self._storage, offset, nbytes, value, width)

    def poison(self, plan: ScratchPlan | str | None = None, names: Iterable[str] | None = None) -> None:
        """Fill ``plan``'s scratch (all plans when ``None``; only ``names`` when given) with poison:
        NaN for floating entries, the sentinel byte for byte and integer entries.

        Call it after the last permitted use; a consumer that reads before writing then sees poison.
        """
        if names is not None and plan is None:
            raise ScratchError("poison(names=...) needs the plan the names belong to")
        if self._storage is None:
            return
        placements = list(self._placements.values()) if plan is None else [self._placement(plan)]
        wanted = None if names is None else set(names)
        for pl in placements:
            unknown = (wanted or set()) - set(pl.plan.offsets)
            if unknown:
                raise ScratchError(f"plan {pl.plan.name!r} declares no scratch {sorted(unknown)}")
            for req in pl.plan.requests:
                if wanted is not None and req.name not in wanted:
                    continue
                value, width = (SENTINEL_BYTE, 1) if req.dtype is None else poison_pattern(req.dtype)
                self._fill(pl.offset + pl.plan.offsets[req.name], req.nbytes, value, width)

    # ------------------------------------------------------------------ reports
    def describe(self) -> dict[str, Any]:
        """Memory-report record: capacity, peak, the no-reuse total, and every plan's placement."""
        plans = []
        for gi, group in enumerate(self._groups):
            for n in group:
                pl = self._placements[n]
                plans.append({
                    "plan": n, "group": gi, "parallel": len(group) > 1, "offset": pl.offset,
                    "nbytes": pl.plan.nbytes,
                    "entries": [{"name": r.name, "offset": pl.offset + pl.plan.offsets[r.name],
                                 "nbytes": r.nbytes, "alignment": r.alignment,
                                 "shape": None if r.shape is None else list(r.shape),
                                 "dtype": None if r.dtype is None else str(r.dtype).removeprefix("torch.")}
                                for r in pl.plan.requests]})
        return {"arena": self.name, "device": str(self.device), "generation": self.generation,
                "capacity_bytes": self.capacity_bytes, "peak_bytes": self.peak_bytes,
                "declared_bytes": self.declared_bytes,
                "allocated_bytes": 0 if self._raw is None else self._raw.numel(),
                "plans": plans}

    def __repr__(self) -> str:
        return (f"ScratchArena({self.name!r}, {self.device}, capacity={self.capacity_bytes} B, "
                f"peak={self.peak_bytes} B, plans={len(self._placements)}, generation={self.generation})")
