"""Host-side token embeddings (``flare run --embedding-table-storage ram|disk``).

With ``ram`` the core's token-embedding table is read once into host memory (pinned on CUDA); with
``disk`` it stays a private memory map of the core's safetensors shard, so only the rows that tokens
touch are ever read.  Either way the table never occupies device memory for the lookup: the step driver
gathers the rows of each step's tokens here, on the host, into a staging buffer and hands them to the
step as its ``input_embeds`` static input -- on CUDA the staging buffer is pinned and the step's input copy
is ``non_blocking``, so the rows travel by asynchronous DMA ahead of the replay on the same stream
("asynchronous row delivery").  The driver calls :meth:`HostEmbeddings.enqueued` after the step's input
copies; the next gather waits on that event first (only for the copy, not the replay), so an in-flight
copy is never overwritten -- a prefill chunk that samples nothing leaves no other synchronization.

A tied ``lm_head`` (``tie_word_embeddings``) still needs the matrix on the device for the vocabulary
projection: the prepared model keeps that device copy for the head only; the gather stays host-side.
"""

from __future__ import annotations

import logging

import torch

log = logging.getLogger("flare.helios")

STORAGES = ("device", "ram", "disk")


class HostEmbeddings:
    """Rows of ``table [vocab, hidden]`` (CPU) gathered per step into a reusable staging buffer."""

    def __init__(self, table: torch.Tensor, max_tokens: int, pinned: bool):
        self.table = table
        self.staging = torch.empty(max_tokens, table.shape[1], dtype=table.dtype, pin_memory=pinned)
        self.pinned = pinned
        self._copied = None  # CUDA event after the last copy out of the staging buffer

    def enqueued(self) -> None:
        """The step's copy out of the staging buffer is enqueued (CUDA: mark it with an event)."""
        if self.pinned:
            self._copied = torch.cuda.Event()
            self._copied.record()

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids [B, T]`` -> ``[B, T, hidden]``: a view of the staging buffer (valid until the next call)."""
        if self._copied is not None:
            self._copied.synchronize()  # the previous step's rows have left the staging buffer
        flat = ids.reshape(-1)
        out = self.staging[:flat.numel()]
        torch.index_select(self.table, 0, flat, out=out)
        return out.view(*ids.shape, self.table.shape[1])


def host_embeddings(core, model, storage: str, max_tokens: int, device: str) -> tuple[HostEmbeddings, str]:
    """The host table of ``core`` for ``storage`` ("ram" or "disk") and a line saying where it lives."""
    if storage not in STORAGES[1:]:
        raise ValueError(f"--embedding-table-storage {storage!r}: expected one of {', '.join(STORAGES)}")
    name = model.embedding_weight_name
    cuda = device.startswith("cuda")
    if storage == "disk":
        table, where = core.map_tensor(name), "memory-mapped from the core on disk"
    else:
        table = core.get_tensor(name)
        table, where = (table.pin_memory(), "in pinned host RAM") if cuda else (table, "in host RAM")
    rows, hidden = table.shape
    line = f"token embeddings: {rows} x {hidden} table {where}; rows gathered on the host per step"
    if model.config.tie_word_embeddings:
        line += " (tied lm_head: a device copy of the matrix is kept for the vocabulary projection only)"
    else:
        line += " (no device copy)"
    return HostEmbeddings(table, max_tokens, pinned=cuda), line
