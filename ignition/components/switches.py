"""Environment switches for side-by-side measurements (``FLARE_PDL``, ``FLARE_PDL_EARLY``,
``FLARE_DECODE_KV_PREFETCH``, ``FLARE_PACKED_GATE_UP``, ``FLARE_TRITON_TOPK``,
``FLARE_GEMV_PRELOAD_PROLOGUE``, ``FLARE_GEMV_DOT``, ``FLARE_FUSED_ROTARY``, ``FLARE_DECODE_PIPELINE``,
``FLARE_GEMV_X_FIRST``, ``FLARE_GEMV_EARLY``, ``FLARE_SORTED_CUT_KERNEL``, ``FLARE_DECODE_WIDE``,
``FLARE_SAMPLER_SORT_FREE``, ``FLARE_DECODE_ONE_ROW_BLOCKS``, ``FLARE_DECODE_KV_PREFETCH_LAST``,
``FLARE_GEMV_PRELOAD_EVICT_FIRST``, ``FLARE_GEMV_FLAT``, ``FLARE_GEMM_ROWS_NORM``, ``FLARE_GEMM_ROWS_GATED_IN``,
``FLARE_GEMM_ROWS_GATED``, ``FLARE_GEMM_ROWS_RES_FIRST``, ``FLARE_GEMM_ROWS_PRENORM``,
``FLARE_GEMM_ROWS_PRENORM_CARRY``, ``FLARE_DECODE_NEW_KEY_APART``, ``FLARE_DECODE_PV_SPLIT``,
``FLARE_DECODE_MULTI_ROW_BLOCKS``, ``FLARE_SAMPLER_PDL``, ``FLARE_ROTARY_PDL``,
``FLARE_DRAW_INTO``, ``FLARE_CUT_SKIP_IN_KERNEL``, ``FLARE_FUSED_EMBED_ROTARY``, ``FLARE_HEAD_INTO``,
``FLARE_SAMPLER_DONE_IN_FRONT``, ``FLARE_SAMPLER_EARLY_SKIP``, ``FLARE_FUSED_STEP_BATCH``;
numbers: ``FLARE_GEMV_STREAM_STAGES``, ``FLARE_GEMV_PREFETCH_MB``, ``FLARE_GEMV_PRELOAD``, ``FLARE_DECODE_BLOCK_N``,
``FLARE_DECODE_MAX_SPLITS``, ``FLARE_DECODE_PROGRAMS``, ``FLARE_DECODE_MAXNREG``, ``FLARE_DECODE_WIDE_PER_SM``,
``FLARE_SAMPLER_PREFIX``, ``FLARE_DECODE_KV_PREFETCH_MIN_MB``, ``FLARE_GATED_FUSED_MAX_ELEMENTS``,
``FLARE_GEMM_ROWS_GATED_MIN_ELEMENTS``, ``FLARE_GEMM_ROWS_PREFETCH``, ``FLARE_GEMM_ROWS_PRENORM_PREFETCH``,
``FLARE_PDL_EARLY_LARGE_MIN_MB``, ``FLARE_DECODE_WARPS``, ``FLARE_DECODE_SMEM_KB``, ``FLARE_DECODE_TRIGGER``,
``FLARE_DECODE_REDUCE_PREFETCH_MB``;
row counts: ``FLARE_DECODE_KV_PREFETCH_ROWS``, ``FLARE_PDL_EARLY_ROWS``, ``FLARE_PDL_EARLY_LARGE_ROWS``;
``FLARE_GEMM_ROWS_TABLE``; launch configs: ``FLARE_GEMV_CONFIG`` (``kernels.linear.gemv_config_override``);
README, "Side-by-side switches").
Each is read where a launch or a trace decides, so one process can measure both settings; every archived run records
the ``FLARE_*`` variables of its environment (``qualify.archive.environment``)."""

from __future__ import annotations

import os
from contextlib import contextmanager

_OFF = ("0", "false", "off", "no")


def switch(name: str, default: bool) -> bool:
    """The switch ``name``: unset or empty -> ``default``; ``0``/``false``/``off``/``no`` -> off; anything else on."""
    value = os.environ.get(name, "").strip().lower()
    return default if value == "" else value not in _OFF


def number(name: str, default: float | None = None) -> float | None:
    """The numeric switch ``name``: unset or empty -> ``default``; raises naming the variable when it is not a
    number."""
    value = os.environ.get(name, "").strip()
    if value == "":
        return default
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r}: expected a number") from None


def whole(name: str, default: int, *, low: int = 0, what: str = "") -> int:
    """The whole-number switch ``name``: unset or empty -> ``default``; raises naming the variable when it is not a
    whole number >= ``low``."""
    value = number(name, default)
    if value < low or value != int(value):
        raise ValueError(f"{name}={value:g}: expected a whole number{what} >= {low}")
    return int(value)


def mebibytes(name: str, default_bytes: int) -> int:
    """The size switch ``name``, given in MiB, as bytes: unset or empty -> ``default_bytes``; raises naming the
    variable when it is not a number >= 0."""
    value = number(name, default_bytes / (1 << 20))
    if value < 0:
        raise ValueError(f"{name}={value:g}: expected a size in MiB >= 0")
    return int(value * (1 << 20))


def rows(name: str, default: int) -> int:
    """The row-count switch ``name`` (the largest batch a behaviour applies to): unset or empty -> ``default``;
    raises naming the variable when it is not a whole number >= 0."""
    return whole(name, default, what=" of rows")


@contextmanager
def environment(env: dict[str, str]):
    """The process environment with ``env`` set inside the block, each variable restored (or removed) after."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
