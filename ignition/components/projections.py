"""Linear projections behind one interface, and packing of projections that share an input.

``Projection`` computes ``out = x @ W^T (+ b)``.  Storage format and arithmetic are separate:

* ``UnquantizedProjection``: bf16 weight, ``F.linear`` (the exact op and rounding of ``nn.Linear``).
* ``BlockFP8Projection``: ``float8_e4m3fn`` weight ``[N, K]`` plus ``weight_scale_inv`` fp32
  ``[ceil(N/128), ceil(K/128)]`` (the Qwen3-FP8 / DeepSeek-V3 layout).  The reference path (CPU, and any
  device without a block-scaled GEMM backend) dequantizes blockwise in fp32 and rounds once to the
  activation dtype, like DeepSeek's ``weight_dequant`` followed by ``F.linear``.  Stored bytes and
  calibrated scales are never changed (no requantization, no rescaling).
* ``PackedProjection``: parts that share an input (Q/K/V, gate/up) in one storage allocated once; each
  checkpoint tensor is copied into its row slice by ``load_checkpoint_tensor`` as it is read.  FP8 parts
  are packed only when every part's rows are a multiple of the scale block (scale rows then concatenate
  unchanged); otherwise, or when the parts' formats differ, the parts stay separate projections.

The weight format is read from checkpoint metadata: ``quantization_from_config`` parses
``config.json`` ``quantization_config`` and ``format_for`` picks each projection's format from the
stored dtype of its weight under that declaration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

BF16 = "bf16"
FP8_BLOCK = "fp8_block"
FP8_BLOCK_SIZE = (128, 128)


class QuantizationConfigError(ValueError):
    """A ``config.json`` ``quantization_config`` this project does not serve; names the field."""


@dataclass(frozen=True)
class Quantization:
    """What ``config.json`` declares: ``method`` None (bf16 checkpoint) or ``"fp8"`` (block-scaled)."""

    method: str | None = None
    block_size: tuple[int, int] = FP8_BLOCK_SIZE

    @property
    def declared(self) -> bool:
        return self.method is not None


def quantization_from_config(config: Any) -> Quantization:
    """Parse ``quantization_config`` (a dict, a config object with that attribute, or None).

    Absent: bf16.  ``quant_method: fp8`` with ``weight_block_size [128, 128]``, ``fmt e4m3`` (if given)
    and dynamic activations (if given): FP8 block.  Anything else raises ``QuantizationConfigError``
    naming the field.
    """
    if config is not None and not isinstance(config, Mapping):
        config = getattr(config, "quantization_config", None)
    if config is None:
        return Quantization()
    if hasattr(config, "to_dict") and not isinstance(config, Mapping):
        config = config.to_dict()
    if not isinstance(config, Mapping):
        raise QuantizationConfigError(f"config.json quantization_config must be an object, got {type(config).__name__}")
    method = config.get("quant_method")
    if method != "fp8":
        raise QuantizationConfigError(
            f"config.json quantization_config.quant_method={method!r} is not supported "
            "(supported: absent for bf16, or 'fp8' with weight_block_size [128, 128])"
        )
    block = config.get("weight_block_size")
    if block is None or tuple(block) != FP8_BLOCK_SIZE:
        raise QuantizationConfigError(
            f"config.json quantization_config.weight_block_size={block!r} is not supported for quant_method 'fp8' "
            f"(supported: {list(FP8_BLOCK_SIZE)}; per-tensor FP8 is not served)"
        )
    fmt = config.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise QuantizationConfigError(
            f"config.json quantization_config.fmt={fmt!r} is not supported (supported: 'e4m3')")
    act = config.get("activation_scheme", "dynamic")
    if act != "dynamic":
        raise QuantizationConfigError(
            f"config.json quantization_config.activation_scheme={act!r} is not supported (supported: 'dynamic')"
        )
    return Quantization("fp8", FP8_BLOCK_SIZE)


def format_for(quant: Quantization, stored_dtype: torch.dtype | None, name: str) -> str:
    """The format of one projection from the stored dtype of its ``weight`` tensor (None: absent)."""
    if stored_dtype == torch.float8_e4m3fn:
        if quant.method != "fp8":
            raise QuantizationConfigError(
                f"tensor {name} is stored as float8_e4m3fn but config.json declares no fp8 quantization_config"
            )
        return FP8_BLOCK
    return BF16  # bf16 (or absent: geometry validation reports it against the bf16 expectation)


class Projection(nn.Module):
    """``out = x @ W^T (+ b)``; subclasses own their storage format.

    ``checkpoint_tensors()`` declares the checkpoint tensors the projection is loaded from, keyed by
    ``(suffix, shard)`` (shard None for an unpacked projection) with ``(shape, dtype)``;
    ``load_checkpoint_tensor(suffix, tensor, shard)`` copies one of them into place.
    """

    format: str = ""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features

    def checkpoint_tensors(self) -> dict[tuple[str, int | None], tuple[tuple[int, ...], torch.dtype]]:
        raise NotImplementedError

    def load_checkpoint_tensor(self, suffix: str, tensor: torch.Tensor, shard: int | None = None) -> None:
        param = getattr(self, suffix)
        _copy_checked(param.data, tensor, suffix)

    def plain_weight(self) -> torch.Tensor | None:
        """The ``[N, K]`` bf16 weight when the projection is exactly ``x @ W^T`` on it (no bias, no scales):
        what a fused kernel (``flare::fused_linear``) may read in its place; else None."""
        return None

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.format}"


def _copy_checked(dst: torch.Tensor, src: torch.Tensor, what: str) -> None:
    if dst.shape != src.shape or dst.dtype != src.dtype:
        raise ValueError(f"{what}: expected {list(dst.shape)} {dst.dtype}, got {list(src.shape)} {src.dtype}")
    dst.copy_(src)


class UnquantizedProjection(Projection):
    """bf16 weight ``[N, K]``; ``F.linear`` with the rounding of ``nn.Linear``.

    ``tied_weight``: share an existing parameter (tied embeddings); the projection then declares no
    checkpoint tensor of its own.
    """

    format = BF16

    def __init__(self, in_features: int, out_features: int, bias: bool = False, dtype=torch.bfloat16,
                 device=None, tied_weight: nn.Parameter | None = None):
        super().__init__(in_features, out_features)
        self.tied = tied_weight is not None
        if tied_weight is not None:
            if tuple(tied_weight.shape) != (out_features, in_features):
                raise ValueError(f"tied weight {list(tied_weight.shape)} != [{out_features}, {in_features}]")
            self.weight = tied_weight
        else:
            self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device),
                                       requires_grad=False)
        self.bias = (nn.Parameter(torch.empty(out_features, dtype=dtype, device=device), requires_grad=False)
                     if bias else None)

    def checkpoint_tensors(self):
        if self.tied:
            return {}
        out = {("weight", None): ((self.out_features, self.in_features), self.weight.dtype)}
        if self.bias is not None:
            out[("bias", None)] = ((self.out_features,), self.bias.dtype)
        return out

    def plain_weight(self) -> torch.Tensor | None:
        return self.weight if self.bias is None and self.weight.dtype == torch.bfloat16 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class BlockFP8Projection(Projection):
    """FP8 e4m3 weight ``[N, K]`` with fp32 ``weight_scale_inv`` ``[ceil(N/bn), ceil(K/bk)]``.

    ``W[n, k] = weight[n, k] * weight_scale_inv[n // bn, k // bk]``.  The reference forward dequantizes
    in fp32, rounds once to the activation dtype and calls ``F.linear``.
    """

    format = FP8_BLOCK

    def __init__(self, in_features: int, out_features: int, bias: bool = False, block_size=FP8_BLOCK_SIZE,
                 act_dtype=torch.bfloat16, device=None):
        super().__init__(in_features, out_features)
        self.block_size = tuple(block_size)
        bn, bk = self.block_size
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=torch.float8_e4m3fn, device=device),
                                   requires_grad=False)
        self.weight_scale_inv = nn.Parameter(
            torch.empty(math.ceil(out_features / bn), math.ceil(in_features / bk), dtype=torch.float32, device=device),
            requires_grad=False)
        self.bias = (nn.Parameter(torch.empty(out_features, dtype=act_dtype, device=device), requires_grad=False)
                     if bias else None)

    def checkpoint_tensors(self):
        out = {("weight", None): ((self.out_features, self.in_features), torch.float8_e4m3fn),
               ("weight_scale_inv", None): (tuple(self.weight_scale_inv.shape), torch.float32)}
        if self.bias is not None:
            out[("bias", None)] = ((self.out_features,), self.bias.dtype)
        return out

    def dequantized_weight(self, dtype: torch.dtype) -> torch.Tensor:
        n, k = self.out_features, self.in_features
        bn, bk = self.block_size
        nb, kb = self.weight_scale_inv.shape
        scale = self.weight_scale_inv[:, None, :, None].expand(nb, bn, kb, bk).reshape(nb * bn, kb * bk)[:n, :k]
        return (self.weight.to(torch.float32) * scale).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.dequantized_weight(x.dtype), self.bias)


def make_projection(fmt: str, in_features: int, out_features: int, *, bias: bool = False,
                    dtype=torch.bfloat16, device=None, block_size=FP8_BLOCK_SIZE) -> Projection:
    if fmt == BF16:
        return UnquantizedProjection(in_features, out_features, bias=bias, dtype=dtype, device=device)
    if fmt == FP8_BLOCK:
        return BlockFP8Projection(in_features, out_features, bias=bias, block_size=block_size, act_dtype=dtype,
                                  device=device)
    raise ValueError(f"unknown projection format {fmt!r}")


class PackedProjection(nn.Module):
    """Outputs of several projections of one input, packed into one projection where formats allow.

    ``forward(x)`` returns one output per part (column views of the packed output).  ``packed`` is True
    when one storage holds all parts; False when they run as separate projections (``parts``).
    """

    def __init__(self, in_features: int, part_sizes: Sequence[int], formats: Sequence[str] | str, *,
                 bias: bool = False, dtype=torch.bfloat16, device=None, block_size=FP8_BLOCK_SIZE):
        super().__init__()
        self.in_features = in_features
        self.part_sizes = tuple(int(s) for s in part_sizes)
        formats = (formats,) * len(self.part_sizes) if isinstance(formats, str) else tuple(formats)
        if len(formats) != len(self.part_sizes):
            raise ValueError(f"{len(formats)} formats for {len(self.part_sizes)} parts")
        self.formats = formats
        self.offsets = tuple(sum(self.part_sizes[:i]) for i in range(len(self.part_sizes)))
        self.packed = self.can_pack(self.part_sizes, formats, block_size)
        if self.packed:
            self.proj = make_projection(formats[0], in_features, sum(self.part_sizes), bias=bias, dtype=dtype,
                                        device=device, block_size=block_size)
            self.parts = None
        else:
            self.proj = None
            self.parts = nn.ModuleList(make_projection(f, in_features, n, bias=bias, dtype=dtype, device=device,
                                                       block_size=block_size)
                                       for f, n in zip(formats, self.part_sizes))

    @staticmethod
    def can_pack(part_sizes: Sequence[int], formats: Sequence[str], block_size=FP8_BLOCK_SIZE) -> bool:
        """One storage for all parts: same format, and for FP8 every part's rows aligned to scale blocks."""
        if len(set(formats)) != 1:
            return False
        if formats[0] == FP8_BLOCK:
            return all(n % block_size[0] == 0 for n in part_sizes)
        return True

    @property
    def format(self) -> str:
        return self.formats[0] if len(set(self.formats)) == 1 else "mixed"

    def checkpoint_tensors(self):
        out = {}
        for shard in range(len(self.part_sizes)):
            child = self.parts[shard] if self.parts is not None else None
            if child is not None:
                for (suffix, _), spec in child.checkpoint_tensors().items():
                    out[(suffix, shard)] = spec
                continue
            for (suffix, _), (shape, dtype) in self.proj.checkpoint_tensors().items():
                rows = self._rows(suffix, shard)
                out[(suffix, shard)] = ((rows.stop - rows.start, *shape[1:]), dtype)
        return out

    def _rows(self, suffix: str, shard: int) -> slice:
        start, size = self.offsets[shard], self.part_sizes[shard]
        if suffix == "weight_scale_inv":
            bn = self.proj.block_size[0]
            return slice(start // bn, (start + size) // bn)
        return slice(start, start + size)

    def load_checkpoint_tensor(self, suffix: str, tensor: torch.Tensor, shard: int | None = None) -> None:
        """The weight loader: copy one part's checkpoint tensor into its slice of the packed storage."""
        if shard is None or not 0 <= shard < len(self.part_sizes):
            raise ValueError(f"packed projection: shard {shard!r} out of range for {len(self.part_sizes)} parts")
        if self.parts is not None:
            self.parts[shard].load_checkpoint_tensor(suffix, tensor, None)
            return
        param = getattr(self.proj, suffix)
        _copy_checked(param.data[self._rows(suffix, shard)], tensor, f"{suffix}[shard {shard}]")

    def plain_weight(self) -> torch.Tensor | None:
        """The packed ``[sum(parts), K]`` bf16 weight (see :meth:`Projection.plain_weight`); None when unpacked."""
        return self.proj.plain_weight() if self.packed else None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.parts is not None:
            return tuple(p(x) for p in self.parts)
        return self.proj(x).split(self.part_sizes, dim=-1)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, parts={self.part_sizes}, packed={self.packed}"
