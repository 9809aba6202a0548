"""Streaming safetensors writer: seeded values generated block by block, written as they are made.

A shard file is written in one pass: its header is computed from the tensor specs alone (names,
shapes, dtypes), then each tensor's bytes are produced in blocks of at most :data:`BLOCK_ELEMENTS`
elements and written immediately.  Peak memory is one block (fp32 values plus their cast), however
large the tensor, the shard or the checkpoint.

The file layout is byte-identical to ``safetensors.torch.save_file(tensors, path, metadata)``:
8-byte little-endian header length, compact JSON header (``__metadata__`` first, then tensors in
data order), padded with spaces to a multiple of 8, then the data, ordered by decreasing dtype
alignment and then by name.  ``tests/checkpoints`` checks this against ``save_file``.

Values
------
Each block ``b`` of tensor ``name`` (elements ``[b * BLOCK_ELEMENTS, (b + 1) * BLOCK_ELEMENTS)`` of
the flattened tensor) is drawn from its own CPU ``torch.Generator`` seeded with the first 63 bits of
``sha256("flare-synth/1", seed, name, b)``; blocks are independent, so values do not depend on
the shard layout, on the order of generation or on the thread count.  ``normal`` draws
``normal_(0, std)`` in fp32 and casts to the tensor's dtype; ``ones``/``zeros`` need no generator.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

import torch

from ignition.durability import sync_file

#: Elements per independently seeded block (4 MiB of fp32).  Changing it changes every value:
#: bump :data:`VALUE_FORMAT` with it.
BLOCK_ELEMENTS = 1 << 20
#: Version of the value derivation (seed hash, block size, distributions).
VALUE_FORMAT = "flare-synth/1"

_DTYPE_NAMES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}
INITS = ("normal", "ones", "zeros", "constant")


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the checkpoint and how its values are made.

    ``init``: ``normal`` (mean 0, standard deviation ``value``), ``ones``, ``zeros`` or ``constant``
    (every element ``value``).  ``clamp``: optional symmetric bound applied in fp32 before the cast
    (used for float8 payloads, whose range is finite).
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    init: str = "normal"
    value: float = 0.02
    clamp: float | None = None

    def __post_init__(self):
        if self.dtype not in _DTYPE_NAMES:
            raise ValueError(f"tensor {self.name}: dtype {self.dtype} has no safetensors name")
        if self.init not in INITS:
            raise ValueError(f"tensor {self.name}: unknown init {self.init!r} (one of {INITS})")

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


def block_seed(seed: int, name: str, block: int) -> int:
    """Stable 63-bit seed of one block (independent of Python's ``hash`` and of the process)."""
    digest = hashlib.sha256(f"{VALUE_FORMAT}\0{seed}\0{name}\0{block}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def block_values(spec: TensorSpec, seed: int, block: int) -> torch.Tensor:
    """The values of one block of ``spec``, flattened, already cast to ``spec.dtype``."""
    start = block * BLOCK_ELEMENTS
    count = min(BLOCK_ELEMENTS, spec.numel - start)
    if spec.init == "ones":
        return torch.ones(count, dtype=spec.dtype)
    if spec.init == "zeros":
        return torch.zeros(count, dtype=spec.dtype)
    if spec.init == "constant":
        return torch.full((count,), spec.value, dtype=torch.float32).to(spec.dtype)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(block_seed(seed, spec.name, block))
    values = torch.empty(count, dtype=torch.float32).normal_(0.0, spec.value, generator=gen)
    if spec.clamp is not None:
        values.clamp_(-spec.clamp, spec.clamp)
    return values.to(spec.dtype)


def num_blocks(spec: TensorSpec) -> int:
    return max(1, -(-spec.numel // BLOCK_ELEMENTS)) if spec.numel else 0


def data_order(specs: Iterable[TensorSpec]) -> list[TensorSpec]:
    """safetensors' data order: decreasing dtype alignment (item size), then name."""
    return sorted(specs, key=lambda s: (-s.itemsize, s.name))


def header_bytes(specs: Sequence[TensorSpec], metadata: dict[str, str] | None) -> bytes:
    """The length prefix and padded JSON header of a file holding ``specs`` (in :func:`data_order`)."""
    header: dict = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for spec in specs:
        header[spec.name] = {"dtype": _DTYPE_NAMES[spec.dtype], "shape": list(spec.shape),
                             "data_offsets": [offset, offset + spec.nbytes]}
        offset += spec.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _as_bytes(values: torch.Tensor) -> memoryview:
    flat = values.reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else memoryview(b"")


def default_workers() -> int:
    return max(1, min(os.cpu_count() or 1, 8))


def iter_blocks(specs: Sequence[TensorSpec], seed: int, workers: int = 1) -> Iterator[torch.Tensor]:
    """Every block of ``specs`` in file order.  With ``workers > 1`` blocks are generated by a thread
    pool (torch releases the GIL) at most ``2 * workers`` blocks ahead of the consumer, so memory
    stays bounded at that many blocks; the values do not depend on ``workers``."""
    jobs = ((spec, block) for spec in specs for block in range(num_blocks(spec)))
    if workers <= 1:
        for spec, block in jobs:
            yield block_values(spec, seed, block)
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="synth") as pool:
        window: deque = deque()
        for spec, block in jobs:
            window.append(pool.submit(block_values, spec, seed, block))
            if len(window) >= 2 * workers:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()


def write_shard(
    path: str | os.PathLike,
    specs: Sequence[TensorSpec],
    seed: int,
    metadata: dict[str, str] | None = None,
    on_bytes: Callable[[int], None] | None = None,
    workers: int = 1,
) -> str:
    """Write one safetensors file of ``specs`` block by block; returns the file's SHA-256.

    At most ``2 * workers`` blocks (one with ``workers=1``) are in memory at any time; the file
    is flushed and fsynced before return (unless ``ignition.durability.without_fsync``).
    """
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: duplicate tensor names")
    ordered = data_order(specs)
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        head = header_bytes(ordered, metadata)
        f.write(head)
        digest.update(head)
        for values in iter_blocks(ordered, seed, workers):
            data = _as_bytes(values)
            del values
            f.write(data)
            digest.update(data)
            if on_bytes is not None:
                on_bytes(len(data))
            del data
        sync_file(f)
    return digest.hexdigest()


def split_shards(specs: Sequence[TensorSpec], max_shard_size: int) -> list[list[TensorSpec]]:
    """Greedy split in declaration order, as ``huggingface_hub.split_torch_state_dict_into_shards``:
    a tensor starts a new shard when it would push the current one past ``max_shard_size``; a tensor
    larger than the limit gets a shard of its own."""
    if max_shard_size <= 0:
        raise ValueError(f"shard size must be positive, got {max_shard_size}")
    shards: list[list[TensorSpec]] = []
    current: list[TensorSpec] = []
    size = 0
    for spec in specs:
        if current and size + spec.nbytes > max_shard_size:
            shards.append(current)
            current, size = [], 0
        current.append(spec)
        size += spec.nbytes
    if current:
        shards.append(current)
    return shards


def shard_filenames(count: int) -> list[str]:
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def write_index(folder: Path, shards: Sequence[Sequence[TensorSpec]], filenames: Sequence[str]) -> Path:
    """``model.safetensors.index.json`` as transformers writes it (``total_size`` in bytes)."""
    weight_map = {spec.name: fname for fname, shard in zip(filenames, shards) for spec in shard}
    total_size = sum(spec.nbytes for shard in shards for spec in shard)
    total_params = sum(spec.numel for shard in shards for spec in shard)
    index = {"metadata": {"total_parameters": total_params, "total_size": total_size},
             "weight_map": dict(sorted(weight_map.items()))}
    path = Path(folder) / "model.safetensors.index.json"
    path.write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return path
