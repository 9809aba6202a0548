"""Host-side driver for the speculative conformance cases: rows with their pages and committed lengths,
step inputs for decode and verification rounds, and the plain-decode reference.

One model and one KV pool serve every run of a case: the pool after the prompts' prefill and the rows'
sampling parameters are snapshotted once and restored before each run, so runs differ only by the steps
they take.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ignition.graphs.rounds import ROUND, prepare_rounds

PAGE = 8
POISON = 1.0e4  # finite: a masked key still contributes exactly 0 (0 * NaN would not)


@dataclass
class Rows:
    capacity: int
    pages_per_row: int
    inactive: frozenset = frozenset()
    length: list = field(default_factory=list)

    def __post_init__(self):
        self.length = [0] * self.capacity

    def pages(self, r: int) -> list[int]:
        return list(range(r * self.pages_per_row, (r + 1) * self.pages_per_row))

    def slot(self, r: int, pos: int) -> int:
        return self.pages(r)[pos // PAGE] * PAGE + pos % PAGE

    def inputs(self, tokens: list[list[int]], width: int, device) -> dict:
        """Row ``r`` feeds ``tokens[r]`` at positions ``length[r] ..`` (an empty list: inactive this step)."""
        b = self.capacity
        ids = torch.zeros(b, width, dtype=torch.long)
        pos = torch.zeros(b, width, dtype=torch.long)
        slots = torch.full((b, width), -1, dtype=torch.long)
        seq = torch.zeros(b, dtype=torch.long)
        act = torch.zeros(b, dtype=torch.bool)
        bt = torch.tensor([self.pages(r) for r in range(b)], dtype=torch.int32)
        for r, toks in enumerate(tokens):
            if not toks or r in self.inactive:
                continue
            for i, tok in enumerate(toks):
                ids[r, i], pos[r, i], slots[r, i] = tok, self.length[r] + i, self.slot(r, self.length[r] + i)
            seq[r], act[r] = self.length[r] + len(toks), True
        out = {"input_ids": ids, "positions": pos, "slot_mapping": slots, "block_tables": bt, "seq_lens": seq,
               "active_rows": act}
        return {k: v.to(device) for k, v in out.items()}


_PROBE_DIR: list = []


def shared_probe_checkpoint():
    """:func:`probe_checkpoint` in one temporary folder per process (every suite that decodes on it shares it)."""
    import tempfile
    from pathlib import Path

    if not _PROBE_DIR:
        _PROBE_DIR.append(Path(tempfile.mkdtemp(prefix="flare-probe-")) / "checkpoint")
    return probe_checkpoint(_PROBE_DIR[0])


def probe_checkpoint(path):
    """A seeded tiny Qwen3 checkpoint whose greedy continuations vary and depend on their context (the
    embedded default's tiny model falls into a one-token loop, which would hide KV defects)."""
    from pathlib import Path

    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = Path(path)
    if not (path / "config.json").is_file():
        torch.manual_seed(0)
        cfg = Qwen3Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=1024,
                          tie_word_embeddings=False)
        Qwen3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    return path


class Case:
    """A prepared catalog (decode ``capacity``, one prefill chunk, rounds ``capacity x widths``) with the
    rows prefilled; ``restore()`` returns to that state."""

    def __init__(self, model_cls, checkpoint, capacity: int, widths, steps: int, prompt_len: int = 13,
                 inactive=frozenset(), sampled_rows=frozenset(), device="cpu", compile=False):
        from ignition.graphs.catalog import GraphCatalog

        self.capacity, self.widths, self.steps = capacity, tuple(widths), steps
        context = prompt_len + steps + max(self.widths) + PAGE
        ppr = -(-context // PAGE)
        self.model = model_cls.from_pretrained(checkpoint, device=device)
        self.model.allocate_kv_cache(num_pages=capacity * ppr, page_size=PAGE, max_context=ppr * PAGE)
        chunk = 16 * (-(-prompt_len // 16))
        self.graphs = GraphCatalog(decode_capacities=(capacity,), prefill_chunks=(chunk,)).prepare(self.model)
        self.rounds = {r.width: r for r in prepare_rounds(self.graphs, (capacity,), self.widths)}
        self.graphs.ready(compile=compile)
        self.rows = Rows(capacity, ppr, frozenset(inactive))
        self.sampled = frozenset(sampled_rows)
        self.device = device
        vocab = self.model.vocab_size
        self.prompts = [[(r * 131 + j * 17) % (vocab - 8) + 4 for j in range(prompt_len)] for r in range(capacity)]
        self.first = [(r * 7 + 3) % (vocab - 8) + 4 for r in range(capacity)]
        for r in range(capacity):  # prefill each active row through the prefill step (its sampled token unused)
            if r in self.rows.inactive:
                continue
            rows1 = Rows(1, ppr)
            rows1.pages = lambda _r, r=r: self.rows.pages(r)  # noqa: E731 -- row r's pages, as a one-row batch
            self.graphs.step("prefill", 1, chunk).run(**rows1.inputs([self.prompts[r]], chunk, device))
        self.kv0 = (self.model.kv_cache.k.clone(), self.model.kv_cache.v.clone())

    def restore(self) -> list[int]:
        """KV pool, lengths and sampling state as after the prefill; returns the pending tokens."""
        self.model.kv_cache.k.copy_(self.kv0[0]), self.model.kv_cache.v.copy_(self.kv0[1])
        state = self.graphs.sampling
        for r in range(self.capacity):
            self.rows.length[r] = 0 if r in self.rows.inactive else len(self.prompts[r])
            params = {"temperature": 0.8, "top_p": 0.9, "top_k": 12, "presence_penalty": 0.3} \
                if r in self.sampled else {"temperature": 0.0}
            state.set_row(r, {**params, "seed": 4242 + r}, self.prompts[r])
        return list(self.first)

    def decode(self, steps: int):
        """Plain decode: per step ``(logits [B, V], tokens [B])`` clones; the pending tokens advance."""
        pending, out = self.restore(), []
        step = self.graphs.step("decode", self.capacity)
        for _ in range(steps):
            logits, tokens = step.run(**self.rows.inputs([[t] for t in pending], 1, self.device))
            out.append((logits.clone(), tokens.clone()))
            for r in range(self.capacity):
                if r not in self.rows.inactive:
                    self.rows.length[r] += 1
                    pending[r] = int(tokens[r])
        return out

    def round(self, width: int, pending: list[int], proposals: list[list[int]], commit=None):
        """One round: row ``r`` feeds ``pending[r]`` + ``proposals[r]``; commits ``n_emitted`` (or the
        planted ``commit(n_proposals, n_emitted)``); returns ``(logits, emitted, n_emitted)`` clones and the
        written-but-rejected ``(row, position)`` list."""
        rs = self.rounds[width]
        assert rs.shape.kind == ROUND and rs.width == width
        feeds = [[] if r in self.rows.inactive else [pending[r], *proposals[r]] for r in range(self.capacity)]
        n = torch.tensor([len(p) for p in proposals], dtype=torch.long)
        drafts = torch.zeros(self.capacity, max(width - 1, 0), dtype=torch.long)
        for r, p in enumerate(proposals):
            if p:
                drafts[r, :len(p)] = torch.tensor(p)
        logits, emitted, n_emitted = rs.run(draft_tokens=drafts.to(self.device), n_proposals=n.to(self.device),
                                            **self.rows.inputs(feeds, width, self.device))
        logits, emitted, n_emitted = logits.clone(), emitted.clone().cpu(), n_emitted.clone().cpu()
        rejected = []
        for r in range(self.capacity):
            if r in self.rows.inactive:
                continue
            k = int(n_emitted[r]) if commit is None else commit(len(proposals[r]), int(n_emitted[r]))
            start = self.rows.length[r]
            self.rows.length[r] = start + k
            rejected += [(r, p) for p in range(start + k, start + 1 + len(proposals[r]))]
        return logits, emitted, n_emitted, rejected

    def poison(self, positions) -> None:
        cache = self.model.kv_cache
        for r, p in positions:
            s = self.rows.slot(r, p)
            for pool in (cache.k, cache.v):
                pool.view(pool.shape[0], -1, *pool.shape[-2:])[:, s].fill_(POISON)
