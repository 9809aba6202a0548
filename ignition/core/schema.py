"""Conversions between the core messages and the project's dataclasses, and the dtype tables.

``frontend_to_proto`` / ``frontend_from_proto`` and ``sampling_to_proto`` / ``sampling_from_proto``
round-trip :class:`FrontendSpec` and :class:`SamplingDefaults` exactly (equal dataclasses, same Python
types: ``top_k`` is an ``int``, every other sampling value and range bound a ``float``). Every field is
written explicitly, so a core never depends on the dataclass defaults in force when it is loaded; the
defaults an older core may lack come from the version table in ``versions.py``, not from the code.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

from ignition.recipes.base import SAMPLING_PARAMS, FrontendSpec, SamplingDefaults

from . import core_pb2 as pb
from .errors import CoreFormatError

# -- dtypes -------------------------------------------------------------------------------------------
#: DType enum value -> (safetensors header name, bytes per element)
DTYPES: dict[int, tuple[str, int]] = {
    pb.DTYPE_BF16: ("BF16", 2), pb.DTYPE_F16: ("F16", 2), pb.DTYPE_F32: ("F32", 4), pb.DTYPE_F64: ("F64", 8),
    pb.DTYPE_F8_E4M3: ("F8_E4M3", 1), pb.DTYPE_F8_E5M2: ("F8_E5M2", 1), pb.DTYPE_I8: ("I8", 1),
    pb.DTYPE_I16: ("I16", 2), pb.DTYPE_I32: ("I32", 4), pb.DTYPE_I64: ("I64", 8), pb.DTYPE_U8: ("U8", 1),
    pb.DTYPE_BOOL: ("BOOL", 1),
}
SAFETENSORS_DTYPES: dict[str, int] = {name: value for value, (name, _) in DTYPES.items()}


def dtype_name(value: int) -> str:
    return DTYPES[value][0] if value in DTYPES else f"<unknown dtype {value}>"


def _torch_dtypes() -> dict:
    import torch

    return {
        torch.bfloat16: pb.DTYPE_BF16, torch.float16: pb.DTYPE_F16, torch.float32: pb.DTYPE_F32,
        torch.float64: pb.DTYPE_F64, torch.float8_e4m3fn: pb.DTYPE_F8_E4M3, torch.float8_e5m2: pb.DTYPE_F8_E5M2,
        torch.int8: pb.DTYPE_I8, torch.int16: pb.DTYPE_I16, torch.int32: pb.DTYPE_I32, torch.int64: pb.DTYPE_I64,
        torch.uint8: pb.DTYPE_U8, torch.bool: pb.DTYPE_BOOL,
    }


def torch_dtype_to_proto(dtype) -> int:
    table = _torch_dtypes()
    if dtype not in table:
        raise ValueError(f"tensor dtype {dtype} has no core DType (supported: {sorted(str(d) for d in table)})")
    return table[dtype]


def proto_to_torch_dtype(value: int):
    for dtype, v in _torch_dtypes().items():
        if v == value:
            return dtype
    raise ValueError(f"core DType {dtype_name(value)} has no torch dtype")


# -- frontend -----------------------------------------------------------------------------------------
#: FrontendSpec fields that may be None: absent in the message exactly when None.
NULLABLE_FRONTEND_FIELDS = ("thinking_kwarg", "default_thinking", "image_token")
#: FrontendSpec fields that always have a value: always written; absent only in cores whose format version
#: defines a default for them (versions.py).
VALUED_FRONTEND_FIELDS = ("content_format", "developer_role", "reasoning_field", "text_joiner", "renders_tools",
                          "tool_arguments", "assistant_null_content")
CONTENT_FORMATS = ("string", "blocks")
TOOL_ARGUMENTS = ("object", "json")


def frontend_to_proto(spec: FrontendSpec, *, eos_token_ids: Iterable[int] = (),
                      special_token_variables: Mapping[str, str] | None = None,
                      renderer: int = pb.RENDERER_JINJA_TEXT, template_file: str = "",
                      tokenizer_file: str = "") -> pb.Frontend:
    """A ``Frontend`` message holding every field of ``spec`` plus the frontend's token settings.

    ``template_file`` / ``tokenizer_file`` are filled by :func:`export_core` when left empty.
    """
    names = {f.name for f in dataclasses.fields(FrontendSpec)}
    covered = set(NULLABLE_FRONTEND_FIELDS) | set(VALUED_FRONTEND_FIELDS)
    if names != covered:  # a FrontendSpec field added without a message field must not be dropped silently
        raise TypeError(f"FrontendSpec fields {sorted(names ^ covered)} have no Frontend message mapping")
    msg = pb.Frontend(renderer=renderer, template_file=template_file, tokenizer_file=tokenizer_file)
    msg.eos_token_ids.extend(int(t) for t in eos_token_ids)
    for key, value in (special_token_variables or {}).items():
        msg.special_token_variables[key] = value
    for name in VALUED_FRONTEND_FIELDS:
        value = getattr(spec, name)
        if value is None:
            raise ValueError(f"FrontendSpec.{name} must not be None")
        setattr(msg, name, value)
    for name in NULLABLE_FRONTEND_FIELDS:
        value = getattr(spec, name)
        if value is not None:
            setattr(msg, name, value)
    return msg


def frontend_from_proto(msg: pb.Frontend) -> FrontendSpec:
    """The :class:`FrontendSpec` a (migrated) ``Frontend`` message describes."""
    kwargs: dict[str, Any] = {}
    for name in VALUED_FRONTEND_FIELDS:
        if not msg.HasField(name):
            raise CoreFormatError(f"frontend.{name} is missing")
        kwargs[name] = getattr(msg, name)
    for name in NULLABLE_FRONTEND_FIELDS:
        kwargs[name] = getattr(msg, name) if msg.HasField(name) else None
    return FrontendSpec(**kwargs)


# -- sampling -----------------------------------------------------------------------------------------
INTEGER_SAMPLING_PARAMS = ("top_k",)


def _typed(name: str, value: float) -> int | float:
    if name in INTEGER_SAMPLING_PARAMS:
        if float(value) != int(value):
            raise ValueError(f"sampling {name} must be an integer, got {value!r}")
        return int(value)
    return float(value)


def sampling_to_proto(defaults: SamplingDefaults) -> pb.Sampling:
    msg = pb.Sampling(citation=defaults.citation, verified=defaults.verified)
    for name in SAMPLING_PARAMS:
        setattr(msg, name, _typed(name, defaults.values[name]))
    for name, (lo, hi) in defaults.ranges.items():
        msg.ranges.add(name=name, lo=lo, hi=hi)
    return msg


def sampling_from_proto(msg: pb.Sampling) -> SamplingDefaults:
    missing = [name for name in (*SAMPLING_PARAMS, "verified") if not msg.HasField(name)]
    if missing:
        raise CoreFormatError(f"sampling: {', '.join(missing)} missing")
    values = {name: _typed(name, getattr(msg, name)) for name in SAMPLING_PARAMS}
    ranges: dict[str, tuple[float, float]] = {}
    for r in msg.ranges:
        if r.name not in SAMPLING_PARAMS:
            raise CoreFormatError(f"sampling range for unknown parameter {r.name!r}")
        if r.name in ranges:
            raise CoreFormatError(f"sampling range for {r.name!r} given twice")
        ranges[r.name] = (_typed(r.name, r.lo), _typed(r.name, r.hi))
    try:
        return SamplingDefaults(values=values, citation=msg.citation, ranges=ranges, verified=msg.verified)
    except ValueError as e:
        raise CoreFormatError(f"sampling: {e}") from None
