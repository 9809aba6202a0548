"""Opaque kernels as torch custom ops, so torch.compile orders them and keeps their lifetimes.

An opaque kernel (Triton launch, FlashInfer, b12x, a hand-written CUDA extension) is invisible to
Inductor.  Registered through :func:`opaque_op` it becomes ``<namespace>::<name>`` with a schema that
states what it reads (every tensor argument), what it writes (``mutates_args``) and what it returns.
Functionalization then threads the mutation through the graph: reads scheduled before the op see the
old contents, reads after it see the new ones, and the op is never dead-code-eliminated (an op that
mutates nothing and returns nothing *is* eliminated -- ``tests/components/test_custom_ops.py`` plants
exactly that lie and shows the compiled graph then differs from eager).

Conventions for kernels registered here:

- outputs and workspaces are caller-owned tensors passed in and declared in ``mutates_args``
  (``out=``/``workspace=`` style) and the op returns ``None``; a custom op may not return a tensor that
  aliases an input, so "return a view of my argument" is expressed as a mutation of a caller buffer;
- mixed-dtype aliases go through byte storage (``torch.uint8``) and are reinterpreted inside the op;
  aliases of one dtype use typed storage (seeds/004: "byte storage for mixed-dtype aliases");
- every op gets a fake (meta) implementation; ops returning ``None`` get one automatically.

Triton kernels that Inductor should see into can instead use ``torch.library.triton_op``; this module is
for the ones that must stay opaque.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch

NAMESPACE = "flare"

__all__ = [
    "NAMESPACE", "opaque_op", "op_effects", "poison_pattern", "scratch_fill_", "SENTINEL_BYTE",
]


def opaque_op(name: str, *, mutates_args: Iterable[str] | str, namespace: str = NAMESPACE,
              device_types: str | Iterable[str] | None = None,
              fake: Callable[..., Any] | None = None) -> Callable[[Callable[..., Any]], Any]:
    """Decorator registering ``fn`` as the custom op ``namespace::name``.

    ``mutates_args`` must name every argument the kernel writes ("unknown" is refused: an op whose
    writes are unknown cannot be ordered precisely).  ``fake`` is the meta implementation; when omitted
    and ``fn`` is annotated ``-> None`` a fake returning ``None`` is registered, otherwise the caller
    must call ``op.register_fake`` before the op is traced.
    """
    if mutates_args == "unknown":
        raise ValueError(f"{namespace}::{name}: declare the mutated arguments explicitly, not 'unknown'")
    mutated = (mutates_args,) if isinstance(mutates_args, str) else tuple(mutates_args)

    def wrap(fn: Callable[..., Any]):
        params = inspect.signature(fn).parameters
        unknown = [m for m in mutated if m not in params]
        if unknown:
            raise ValueError(f"{namespace}::{name}: mutates_args names no parameter: {unknown}")
        op = torch.library.custom_op(f"{namespace}::{name}", fn, mutates_args=mutated,
                                     device_types=device_types)
        if fake is not None:
            op.register_fake(fake)
        elif inspect.signature(fn).return_annotation in (None, "None"):
            op.register_fake(_fake_none)
        return op

    return wrap


def _fake_none(*args, **kwargs) -> None:
    return None


def op_effects(op: Any) -> dict[str, Any]:
    """What a registered op declares: tensor arguments read, arguments written, aliasing annotations.

    ``op`` is a ``torch.ops`` overload packet/overload or the object :func:`opaque_op` returned.
    """
    overload = getattr(op, "_opoverload", op)
    if hasattr(overload, "default"):
        overload = overload.default
    schema = overload._schema
    reads, writes, aliases = [], [], {}
    for arg in schema.arguments:
        if "Tensor" in str(arg.type):
            reads.append(arg.name)
        if arg.alias_info is not None:
            info = arg.alias_info
            aliases[arg.name] = ",".join(sorted(info.before_set)) + ("!" if info.is_write else "")
            if arg.alias_info.is_write:
                writes.append(arg.name)
    return {"name": schema.name, "schema": str(schema), "reads": reads, "writes": writes,
            "aliases": aliases, "returns": [str(r.type) for r in schema.returns]}


# ---------------------------------------------------------------- scratch_fill_ (used by ScratchArena)

#: Byte written over non-floating disposable storage: 0xA5 reads as -1515870811 in int32,
#: 165 in uint8, -91 in int8 -- values no index, count or length legitimately holds.
SENTINEL_BYTE = 0xA5
_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def poison_pattern(dtype: torch.dtype) -> tuple[int, int]:
    """``(value, width)`` for :func:`scratch_fill_`: a quiet NaN for floating dtypes that have one,
    else the sentinel byte.  ``value`` is the little-endian bit pattern as a signed integer."""
    if dtype.is_floating_point and dtype.itemsize in _INT_OF_WIDTH:
        nan = torch.full((1,), float("nan"), dtype=dtype)
        if torch.isnan(nan.float()).all():
            width = dtype.itemsize
            return int(nan.view(_INT_OF_WIDTH[width]).item()), width
    return SENTINEL_BYTE, 1


@opaque_op("scratch_fill_", mutates_args=("buf",))
def scratch_fill_(buf: torch.Tensor, offset: int, nbytes: int, value: int, width: int) -> None:
    """Fill bytes ``[offset, offset + nbytes)`` of contiguous ``buf`` with ``value`` repeated every
    ``width`` bytes (1, 2, 4 or 8; ``offset`` and ``nbytes`` multiples of ``width``).

    One fill kernel with a scalar argument: no host-to-device copy, so it is capturable.
    """
    if not buf.is_contiguous():
        raise ValueError("scratch_fill_: buffer must be contiguous")
    if width not in _INT_OF_WIDTH or offset % width or nbytes % width:
        raise ValueError(f"scratch_fill_: offset {offset} and nbytes {nbytes} must be multiples of width {width}")
    raw = buf.reshape(-1).view(torch.uint8)
    if offset < 0 or offset + nbytes > raw.numel():
        raise ValueError(f"scratch_fill_: [{offset}, {offset + nbytes}) outside a {raw.numel()}-byte buffer")
    if nbytes:
        raw[offset:offset + nbytes].view(_INT_OF_WIDTH[width]).fill_(value)
