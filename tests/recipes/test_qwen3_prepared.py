"""The prepared Qwen3 forward against transformers' canonical forward (CPU, tiny bf16 geometry).

Geometry: hidden 64, 2 layers, 4 query heads, 2 KV heads (GQA), head_dim 16, vocab 512, bf16 weights
with randomized norm weights.  Reference: ``Qwen3ForCausalLM.from_pretrained`` (eager attention,
``DynamicCache``), greedy, stepped token by token.

Logit bound.  bf16 has 8 significant bits, unit roundoff ``u = 2^-8``.  An implementation that keeps
the canonical rounding points but orders a reduction differently (another GEMM blocking, a fused
kernel, a longer masked softmax row) changes an intermediate by about one rounding; through the
final norm and the vocabulary projection that shows up in a logit as a few roundings of the logit's
own magnitude.  We allow ``|prepared - canonical| <= 4 * u * max|canonical logit|`` over all
steps (about 0.011 at this geometry, where max|logit| is about 0.7).  Measured on CPU: 0 (eager and
compiled are bit-identical here).  The bound is tight enough to matter: the planted defects in
``test_bound_catches_planted_defects`` (rotary from chunk-relative positions, one layer's q_norm
skipped, q_norm/k_norm swapped) each exceed it by more than 10x.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import AutoConfig
from transformers.models.qwen3 import modeling_qwen3

from ignition.components.norms import RMSNorm
from ignition.components.rotary import fused_rotary_applies
from ignition.graphs.catalog import GraphCatalog
from ignition.recipes.qwen3.model import PagedQwen3Attention, PreparedQwen3, PreparedQwen3DecoderLayer
from tiny_qwen3 import Row, canonical_greedy, logit_bound, make_checkpoint, prefill, prepared_greedy

PROMPT = [(i * 37 + 11) % 512 for i in range(20)]
STEPS = 32
PAGE = 8
PAGES = [11, 3, 7, 0, 14, 5, 9, 2]  # scattered, non-monotonic: block tables must be honoured
CATALOG = GraphCatalog(decode_capacities=(1, 2, 4), prefill_chunks=(8, 32))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("qwen3-tiny"), seed=0)


@pytest.fixture(scope="module")
def reference(ckpt):
    return canonical_greedy(ckpt, PROMPT, STEPS)


def prepare(ckpt, decode=(1, 4), prefill=(8, 32), page_size=PAGE, num_pages=32, max_context=128):
    model = PreparedQwen3.from_pretrained(ckpt)
    model.allocate_kv_cache(num_pages=num_pages, page_size=page_size, max_context=max_context)
    return model, CATALOG.prepare(model, decode=decode, prefill=prefill)


@pytest.fixture(scope="module")
def compiled_graphs(ckpt):
    # two shapes keep the cold Inductor compile inside the CPU budget; decode runs at capacity 2 with a
    # padding row, prefill at chunk 32 with 12 padding tokens
    model, graphs = prepare(ckpt, decode=(2,), prefill=(32,))
    return graphs.compile()


def assert_close(prepared_logits, reference_logits, bound):
    worst = max(float((p - r).abs().max()) for p, r in zip(prepared_logits, reference_logits))
    assert worst <= bound, f"max |prepared - canonical| logit {worst:.4g} exceeds the bf16 bound {bound:.4g}"
    return worst


@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_greedy_matches_canonical(mode, ckpt, reference, request):
    graphs = request.getfixturevalue("compiled_graphs") if mode == "compiled" else prepare(ckpt)[1]
    assert {s.mode for s in graphs.steps} == {mode}
    ref_tokens, ref_logits = reference
    tokens, logits = prepared_greedy(graphs, Row(list(PAGES), PAGE), PROMPT, STEPS, chunk=32)
    assert tokens == ref_tokens
    assert_close(logits, ref_logits, logit_bound(ref_logits))
    assert len(PROMPT) + STEPS > 6 * PAGE  # the run crossed six page boundaries


@pytest.mark.parametrize("packed_fused", [False, True], ids=["gate_up-cublas", "gate_up-packed-fused"])
def test_packed_gate_up_feeds_down_with_the_silu_gate_in_its_prologue(ckpt, reference, monkeypatch, packed_fused):
    """The Qwen3-8B decode path at one row (gate/up too large to fuse with its gate: its packed [gate; up] product
    from cuBLAS, or from one ungated fused launch with the norm prologue; down's launch forms silu(gate) * up from
    it) -- here forced by lowering the size threshold -- matches the canonical forward like the default path."""
    from ignition.components import fused_linear as fl

    calls = []  # (gated_input, norm weight given, weight rows) of every fused launch
    handoffs = []  # (gated_input, handoff) of every fused launch
    roles = []  # each launch's handoff role (0 none)
    real = fl.fused_linear

    def recording(*args, **kw):
        calls.append((args[6] if len(args) > 6 else False, args[2] is not None, args[1].shape[0]))
        handoffs.append((calls[-1][0], bool(kw.get("handoff", 0))))
        roles.append(kw.get("handoff", 0))
        return real(*args, **kw)

    monkeypatch.setattr(fl, "GATED_FUSED_MAX_ELEMENTS", 0)
    monkeypatch.setattr(fl, "PACKED_GATE_UP_FUSED", packed_fused)
    monkeypatch.delenv("FLARE_PACKED_GATE_UP", raising=False)
    monkeypatch.setattr(fl, "fused_linear", recording)
    # the MLP handoff's rule as on a GPU where it is on (kernels.linear.GEMV_HANDOFF): one row
    monkeypatch.setattr(fl, "mlp_handoff", lambda rows, gu_w, down_w, gated=False: rows == 1)
    ref_tokens, ref_logits = reference
    tokens, logits = prepared_greedy(prepare(ckpt)[1], Row(list(PAGES), PAGE), PROMPT, STEPS, chunk=32)
    assert any(gi for gi, _, _ in calls)  # down took gate/up's packed output
    gate_up_rows = 2 * AutoConfig.from_pretrained(ckpt).intermediate_size
    packed_launches = [c for c in calls if c == (False, True, gate_up_rows)]
    assert bool(packed_launches) == packed_fused  # the packed product in one fused launch exactly when asked
    # the handoff: exactly the one-row packed launches and the down launch right after each, as pairs
    pairs = [i for i, (gi, h) in enumerate(handoffs) if h and not gi]
    assert bool(pairs) == packed_fused
    assert all(handoffs[i + 1] == (True, True) for i in pairs)
    assert sum(h for _, h in handoffs) == 2 * len(pairs)
    assert all(roles[i] == fl.HANDOFF_PRODUCER and roles[i + 1] == fl.HANDOFF_CONSUMER for i in pairs)
    assert tokens == ref_tokens
    assert_close(logits, ref_logits, logit_bound(ref_logits))


def test_gated_mlp_handoff_pairs_the_gated_launch_with_a_plain_down(ckpt, reference, monkeypatch):
    """The MLP handoff's gated form (``fused_linear.mlp_handoff`` with ``gated``, as on a GPU where it is on and the
    configs line up): at one row the gate/up launch with its SiLU gate and the norm prologue and the plain down launch
    right after it take the handoff as a pair -- every one-row step's MLP, nothing else -- and the tokens and logits
    match the canonical forward."""
    from ignition.components import fused_linear as fl

    launches = []  # (gated, gated_input, norm weight given, handoff) of every fused launch
    roles = []  # each launch's handoff role (0 none)
    real = fl.fused_linear

    def recording(*args, **kw):
        launches.append((args[5], args[6] if len(args) > 6 else False, args[2] is not None, bool(kw.get("handoff", 0))))
        roles.append(kw.get("handoff", 0))
        return real(*args, **kw)

    monkeypatch.setattr(fl, "fused_linear", recording)
    monkeypatch.setattr(fl, "mlp_handoff", lambda rows, gu_w, down_w, gated=False: rows == 1 and gated)
    ref_tokens, ref_logits = reference
    tokens, logits = prepared_greedy(prepare(ckpt)[1], Row(list(PAGES), PAGE), PROMPT, STEPS, chunk=32)
    producers = [i for i, (g, _, _, h) in enumerate(launches) if h and g]
    assert producers and all(launches[i][2] for i in producers)  # behind the layer's norm
    assert all(launches[i + 1] == (False, False, False, True) for i in producers)  # a plain down right after
    assert sum(h for *_, h in launches) == 2 * len(producers)
    assert all(roles[i] == fl.HANDOFF_PRODUCER and roles[i + 1] == fl.HANDOFF_CONSUMER for i in producers)
    assert len(producers) % AutoConfig.from_pretrained(ckpt).num_hidden_layers == 0  # whole steps, every layer
    assert tokens == ref_tokens
    assert_close(logits, ref_logits, logit_bound(ref_logits))


@pytest.mark.parametrize("head_fused", [False, True], ids=["head-canonical", "head-fused"])
def test_one_row_head_is_one_fused_launch_with_the_final_norm(ckpt, reference, monkeypatch, head_fused):
    """The step's head at one row (``HEAD_FUSED``, ``FLARE_HEAD_FUSED``): the final norm and the vocabulary
    projection in one flare::fused_linear launch (norm weight given, vocabulary-wide weight) -- once per one-row
    step, prefill chunks included -- or none; a 4-row step keeps the canonical modules.  Greedy tokens and logits
    match the canonical forward either way."""
    from ignition.components import fused_linear as fl

    calls = []  # rows of every fused launch through the vocabulary-wide weight, with the norm weight given
    real = fl.fused_linear
    vocab = AutoConfig.from_pretrained(ckpt).vocab_size

    def recording(*args, **kw):
        if args[1].shape[0] == vocab:
            assert args[2] is not None  # the final norm in its prologue
            calls.append(args[0].numel() // args[0].shape[-1])
        return real(*args, **kw)

    monkeypatch.setattr(fl, "HEAD_FUSED", head_fused)
    monkeypatch.delenv("FLARE_HEAD_FUSED", raising=False)
    monkeypatch.setattr(fl, "fused_linear", recording)
    graphs = prepare(ckpt)[1]
    ref_tokens, ref_logits = reference
    tokens, logits = prepared_greedy(graphs, Row(list(PAGES), PAGE), PROMPT, STEPS, chunk=32)
    assert tokens == ref_tokens
    assert_close(logits, ref_logits, logit_bound(ref_logits))
    # one 32-token prefill chunk (20 prompt tokens), then STEPS one-row decode steps
    assert calls == ([1] * (1 + STEPS) if head_fused else [])
    calls.clear()
    row = Row(list(PAGES), PAGE)
    prefill(graphs, row, PROMPT[:8], chunk=8)
    calls.clear()
    graphs.step("decode", 4).run(**row.inputs([PROMPT[8]], graphs.steps[0].max_pages))
    assert calls == []  # four rows: the canonical norm and projection


@pytest.mark.parametrize("switch,prologue", [("FLARE_GEMM_ROWS_NORM", 1), ("FLARE_GEMM_ROWS_GATED_IN", 2),
                                             ("FLARE_GEMM_ROWS_GATED", 3)])
def test_prologue_chunks_take_one_tensor_core_launch_with_the_switch(ckpt, monkeypatch, switch, prologue):
    """``FLARE_GEMM_ROWS_NORM=1`` (``GEMM_ROWS_NORM``): an 8-token prefill chunk's qkv projection takes the norm in
    its fused launch (the tensor-core variant's prologue) instead of the norm module before a plain-input launch;
    ``FLARE_GEMM_ROWS_GATED_IN=1`` (``GEMM_ROWS_GATED_IN``): its down takes the packed gate/up output and the SiLU gate
    in its launch instead of the activation module before a plain-input launch; ``FLARE_GEMM_ROWS_GATED=1``
    (``GEMM_ROWS_GATED``): its gate/up is one launch after the norm with the SiLU gate in its epilogue instead of the
    packed product and the activation module.  Off, the norm and the activation run apart (the first two off by default;
    the gated output, on by default, is turned off for them -- with it the down's input is no longer the packed
    output).  o_proj is a plain-input launch either way.  The published norms (``FLARE_GEMM_ROWS_PRENORM``, on by
    default: the gated gate/up's norm from o_proj's launch) are off here -- their own test is
    ``test_published_norms_keep_the_canonical_greedy_run``."""
    from ignition.components import fused_linear as fl

    calls = []

    def counting(x, weight, norm_weight, eps, residual, gated, gated_input=False, early=False, *published, **kw):
        calls.append((x.numel() // x.shape[-1], norm_weight is not None, gated_input, gated))
        return real(x, weight, norm_weight, eps, residual, gated, gated_input, early, *published, **kw)

    real = fl.fused_linear
    monkeypatch.setattr(fl, "fused_linear", counting)
    monkeypatch.delenv("FLARE_GEMV_DOT", raising=False)
    monkeypatch.setenv("FLARE_GEMM_ROWS_PRENORM", "0")
    layers = AutoConfig.from_pretrained(ckpt).num_hidden_layers
    if switch != "FLARE_GEMM_ROWS_GATED":
        monkeypatch.setenv("FLARE_GEMM_ROWS_GATED", "0")
    else:  # this checkpoint's gate/up is below GEMM_ROWS_GATED_MIN_ELEMENTS
        monkeypatch.setenv("FLARE_GEMM_ROWS_GATED_MIN_ELEMENTS", "0")
    for on in (False, True):
        monkeypatch.setenv(switch, "1" if on else "0")
        graphs = prepare(ckpt, decode=(1,), prefill=(8,))[1]
        calls.clear()
        prefill(graphs, Row(list(PAGES), PAGE), PROMPT[:8], chunk=8)
        chunk = [c for c in calls if c[0] == 8]
        gate_up = on and switch == "FLARE_GEMM_ROWS_GATED"
        assert len(chunk) == (4 if gate_up else 3) * layers  # qkv, o_proj, down per layer (and gate/up)
        assert sum(1 for c in chunk if c[prologue]) == (layers if on else 0)  # the launches with the prologue
        assert not any(c[1] for c in chunk if c[3])  # a gated launch never takes the norm in its prologue


def test_gated_tensor_core_chunks_keep_the_canonical_greedy_run(ckpt, reference, monkeypatch):
    """``FLARE_GEMM_ROWS_GATED=1`` (the default, here with no size bound): 8-token prefill chunks with gate/up as one
    gated launch after the norm -- greedy tokens and logits within the bound of the canonical forward's."""
    monkeypatch.setenv("FLARE_GEMM_ROWS_GATED", "1")
    monkeypatch.setenv("FLARE_GEMM_ROWS_GATED_MIN_ELEMENTS", "0")  # this checkpoint's gate/up is below the bound
    tokens, logits = prepared_greedy(prepare(ckpt, decode=(1,), prefill=(8,))[1], Row(list(PAGES), PAGE), PROMPT,
                                     STEPS, chunk=8)
    ref_tokens, ref_logits = reference
    assert tokens == ref_tokens
    assert_close(logits, ref_logits, logit_bound(ref_logits))


@pytest.mark.parametrize("carry", [True, False], ids=["carried", "within-layer"])
def test_published_norms_keep_the_canonical_greedy_run(ckpt, reference, monkeypatch, carry):
    """``FLARE_GEMM_ROWS_PRENORM=1`` (``GEMM_ROWS_PRENORM``) with the gated gate/up launch (no size bound here): in
    8-token prefill chunks each layer's o_proj publishes the post-attention norm of its output
    (``fused_linear_publish``, with that norm's weights) and the gate/up launch takes it (no norm module); carried
    (``GEMM_ROWS_PRENORM_CARRY``, default) each layer's down publishes the next layer's input norm (the last layer's
    the final norm's) and the next qkv takes it (the first layer's from the embeddings); one-row steps publish nothing.
    Greedy tokens and logits match the canonical forward (the CPU path computes the canonical norm); off, nothing is
    published."""
    from ignition.components import fused_linear as fl

    published, taken = [], []
    real_publish, real = fl.fused_linear_publish, fl.fused_linear

    def publishing(x, weight, residual, next_norm, parts, early=False):
        published.append((x.numel() // x.shape[-1], weight.shape[0], next_norm.data_ptr()))
        assert parts == 1  # the CPU path: one whole row
        return real_publish(x, weight, residual, next_norm, parts, early)

    def taking(x, weight, norm_weight, eps, residual, gated, gated_input=False, early=False, xw=None,
               norm_stats=None, **kw):
        if norm_stats is not None:
            rows = x.numel() // x.shape[-1]
            assert norm_weight is not None and residual is None and norm_stats.shape[0] == rows
            assert xw.shape == x.shape
            taken.append((rows, gated, norm_weight.data_ptr()))
        return real(x, weight, norm_weight, eps, residual, gated, gated_input, early, xw, norm_stats, **kw)

    monkeypatch.setattr(fl, "fused_linear_publish", publishing)
    monkeypatch.setattr(fl, "fused_linear", taking)
    monkeypatch.setenv("FLARE_GEMM_ROWS_PRENORM", "1")
    monkeypatch.setenv("FLARE_GEMM_ROWS_PRENORM_CARRY", "1" if carry else "0")
    monkeypatch.setenv("FLARE_GEMM_ROWS_GATED", "1")
    monkeypatch.setenv("FLARE_GEMM_ROWS_GATED_MIN_ELEMENTS", "0")  # this checkpoint's gate/up is below the bound
    model, graphs = prepare(ckpt, decode=(1,), prefill=(8,))
    tokens, logits = prepared_greedy(graphs, Row(list(PAGES), PAGE), PROMPT, STEPS, chunk=8)
    ref_tokens, ref_logits = reference
    assert tokens == ref_tokens
    assert_close(logits, ref_logits, logit_bound(ref_logits))
    m = model.hf.model
    layers = list(m.layers)
    post = [layer.post_attention_layernorm.weight.data_ptr() for layer in layers]
    nxt = [layer.input_layernorm.weight.data_ptr() for layer in layers[1:]] + [m.norm.weight.data_ptr()]
    hidden = model.config.hidden_size
    per_chunk_pub = [p for i in range(len(layers)) for p in ([(8, hidden, post[i])]
                                                              + ([(8, hidden, nxt[i])] if carry else []))]
    per_chunk_take = [t for i in range(len(layers)) for t in (
        ([(8, False, layers[i].input_layernorm.weight.data_ptr())] if carry else []) + [(8, True, post[i])])]
    chunks = -(-len(PROMPT) // 8)
    assert published == per_chunk_pub * chunks
    assert taken == per_chunk_take * chunks
    monkeypatch.setenv("FLARE_GEMM_ROWS_PRENORM", "0")
    published.clear()
    taken.clear()
    prefill(prepare(ckpt, decode=(1,), prefill=(8,))[1], Row(list(PAGES), PAGE), PROMPT[:8], chunk=8)
    assert published == [] and taken == []


def test_triton_attention_backend_greedy_matches_canonical(ckpt, reference):
    """The "triton" attention backend through the whole model (eager, CPU: decode runs the CPU implementation
    of flare::paged_decode_attention -- fp32 softmax and P @ V, keys < seq_lens only -- prefill the reference
    op): logits within the same bf16 bound, greedy tokens equal to the canonical ones up to a near-tie.

    The decode numerics differ from the eager path (probabilities are not rounded to bf16), so a step whose
    canonical top-2 logits are within twice the bound may pick the other token (measured on CPU: step 30, whose
    top-2 gap is one bf16 ulp, 0.00195, flips); the comparison stops at the first such flip, after checking that
    it is one."""
    from ignition.components.attention import TritonPagedAttention

    model = PreparedQwen3.from_pretrained(ckpt, attention_backend=TritonPagedAttention(4, 2, 16, 16 ** -0.5))
    model.allocate_kv_cache(num_pages=32, page_size=PAGE, max_context=128)
    graphs = CATALOG.prepare(model, decode=(1,), prefill=(32,))
    ref_tokens, ref_logits = reference
    tokens, logits = prepared_greedy(graphs, Row(list(PAGES), PAGE), PROMPT, STEPS, chunk=32)
    bound = logit_bound(ref_logits)
    same = next((i for i, (a, b) in enumerate(zip(tokens, ref_tokens)) if a != b), STEPS)
    assert same >= STEPS // 2  # most of the run compared (past four page boundaries)
    assert_close(logits[:same + 1], ref_logits[:same + 1], bound)  # the flip step's logits too: same context
    if same < STEPS:
        top2 = ref_logits[same].topk(2).values
        assert float(top2[0] - top2[1]) <= 2 * bound, f"step {same}: a token flip that is not a near-tie"


def test_triton_backend_steps_skip_the_visibility_mask_with_the_same_bits(ckpt, monkeypatch):
    """The "triton" backend reads no ``visible`` mask: the model's prefill and decode steps build their batch without
    it (``step_needs_visible``), and their logits and tokens equal bit for bit those of the same steps with the mask
    built (``FLARE_BATCH_VISIBLE=1``); the reference backend's steps still build it."""
    from ignition.components.attention import AttentionBatch, TritonPagedAttention

    built = []
    build = AttentionBatch.build.__func__

    def spy(cls, *args, **kwargs):
        batch = build(cls, *args, **kwargs)
        built.append(batch.visible is not None)
        return batch

    monkeypatch.setattr(AttentionBatch, "build", classmethod(spy))

    def run(backend):
        model = PreparedQwen3.from_pretrained(ckpt, attention_backend=backend)
        model.allocate_kv_cache(num_pages=32, page_size=PAGE, max_context=128)
        graphs = CATALOG.prepare(model, decode=(1,), prefill=(8,))
        built.clear()
        tokens, logits = prepared_greedy(graphs, Row(list(PAGES), PAGE), PROMPT, 4, chunk=8)
        return tokens, torch.stack(logits), list(built)

    tokens, logits, masks = run(TritonPagedAttention(4, 2, 16, 16 ** -0.5))
    assert len(masks) == 3 + 4 and not any(masks)  # three prefill chunks, four decodes: none built
    monkeypatch.setenv("FLARE_BATCH_VISIBLE", "1")
    tokens_m, logits_m, masks_m = run(TritonPagedAttention(4, 2, 16, 16 ** -0.5))
    assert all(masks_m) and len(masks_m) == len(masks)
    assert tokens_m == tokens and torch.equal(logits_m, logits)
    monkeypatch.delenv("FLARE_BATCH_VISIBLE")
    assert all(run(None)[2])  # the reference backend reads it


class ChunkRelativeRotary(nn.Module):
    """Planted defect: rotary from positions relative to the step's first token."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x, positions):
        return self.inner(x, positions - positions[:, :1])


def _plant_rotary(model):
    model.hf.model.rotary_emb = ChunkRelativeRotary(model.hf.model.rotary_emb)


def _plant_skip_q_norm(model):
    model.hf.model.layers[1].self_attn.q_norm = nn.Identity()


def _plant_swap_norms(model):
    attn = model.hf.model.layers[0].self_attn
    attn.q_norm, attn.k_norm = attn.k_norm, attn.q_norm


@pytest.mark.parametrize("plant", [_plant_rotary, _plant_skip_q_norm, _plant_swap_norms],
                         ids=["rotary-chunk-relative", "q_norm-skipped", "q_norm-k_norm-swapped"])
def test_bound_catches_planted_defects(plant, ckpt, reference):
    ref_tokens, ref_logits = reference
    model, graphs = prepare(ckpt)
    plant(model)
    tokens, logits = prepared_greedy(graphs, Row(list(PAGES), PAGE), PROMPT, STEPS, chunk=32)
    bound = logit_bound(ref_logits)
    worst = max(float((p - r).abs().max()) for p, r in zip(logits, ref_logits))
    assert worst > 10 * bound, f"planted defect moved logits by only {worst:.4g} (bound {bound:.4g})"


def test_batch_rows_with_different_lengths_and_an_inactive_row(ckpt):
    """Capacity-4 decode: rows 0, 2, 3 live with contexts 5, 13 and 20; row 1 inactive with junk inputs
    aimed at row 0's page (its writes must land in the sink).  Each live row equals its own canonical run."""
    steps = 6
    prompts = {0: PROMPT[:5], 2: PROMPT[3:16], 3: PROMPT}
    pages = {0: [4, 20, 1], 2: [6, 13, 17], 3: [2, 9, 25, 8]}
    refs = {r: canonical_greedy(ckpt, p, steps) for r, p in prompts.items()}
    model, graphs = prepare(ckpt)
    width = graphs.steps[0].max_pages
    rows = {r: Row(pages[r], PAGE) for r in prompts}
    next_tok = {r: int(prefill(graphs, rows[r], prompts[r], chunk=8)[1]) for r in prompts}
    got = {r: ([], []) for r in prompts}
    step = graphs.step("decode", 3)
    assert step.shape.rows == 4  # 3 rows fall between capacities: padded to 4
    for _ in range(steps):
        batch = {r: rows[r].inputs([next_tok[r]], width) for r in prompts}
        junk = {"input_ids": torch.tensor([[7]]), "positions": torch.tensor([[1]]),
                "slot_mapping": torch.tensor([[pages[0][0] * PAGE + 1]]),
                "block_tables": rows[0].block_table(width)[None],
                "seq_lens": torch.tensor([2]), "active_rows": torch.tensor([False])}
        order = [batch[0], junk, batch[2], batch[3]]
        inputs = {k: torch.cat([o[k] for o in order]) for k in order[0]}
        logits, tokens = step.run(**inputs)
        assert int(tokens[1]) == -1 and not logits[1].any()
        for r in prompts:
            got[r][0].append(next_tok[r])
            got[r][1].append(logits[r].clone())
            next_tok[r] = int(tokens[r])
    for r in prompts:
        ref_tokens, ref_logits = refs[r]
        assert got[r][0] == ref_tokens, f"row {r}"
        # the first reference logits are the prefill's; compare the decode steps
        assert_close(got[r][1][: steps - 1], ref_logits[1:], logit_bound(ref_logits))


def test_chunked_prefill_equals_one_shot(ckpt):
    model, graphs = prepare(ckpt)
    one_shot = Row(list(PAGES[:4]), PAGE)
    chunked = Row([15, 16, 17, 18], PAGE)
    l1, t1 = prefill(graphs, one_shot, PROMPT, chunk=32)
    l2, t2 = prefill(graphs, chunked, PROMPT, chunk=8)  # chunks of 8, 8, 4 (the last one padded)
    assert int(t1) == int(t2)
    assert torch.equal(l1, l2) or float((l1 - l2).abs().max()) <= logit_bound([l1])
    cache = model.kv_cache
    for pa, pb in zip(one_shot.pages[:3], chunked.pages[:3]):  # the 20 prompt tokens' K and V
        n = min(PAGE, len(PROMPT) - one_shot.pages.index(pa) * PAGE)
        assert torch.equal(cache.k[:, pa, :n], cache.k[:, pb, :n])
        assert torch.equal(cache.v[:, pa, :n], cache.v[:, pb, :n])
    width = graphs.steps[0].max_pages
    a = graphs.step("decode", 1).run(**one_shot.inputs([int(t1)], width))[0].clone()
    b = graphs.step("decode", 1).run(**chunked.inputs([int(t2)], width))[0].clone()
    assert torch.equal(a, b)


def test_page_boundary_crossing_tied_sharded(tmp_path):
    """Page size 4, a prompt filling exactly two pages: the first decode opens a new page, later decodes cross
    more.  The checkpoint ties embeddings (like Qwen3-0.6B) and is sharded with an index."""
    ckpt = make_checkpoint(tmp_path / "tied", seed=1, tie_word_embeddings=True, max_shard_size="40KB")
    assert (ckpt / "model.safetensors.index.json").is_file()
    prompt, steps = PROMPT[:8], 10
    ref_tokens, ref_logits = canonical_greedy(ckpt, prompt, steps)
    model, graphs = prepare(ckpt, page_size=4, max_context=64)
    assert model.hf.lm_head.weight is model.hf.model.embed_tokens.weight
    tokens, logits = prepared_greedy(graphs, Row([9, 3, 12, 1, 30, 6], 4), prompt, steps, chunk=8)
    assert tokens == ref_tokens
    assert_close(logits, ref_logits, logit_bound(ref_logits))


def test_composition_is_instance_local(ckpt):
    forward_before = modeling_qwen3.Qwen3Attention.forward
    model, _ = prepare(ckpt)
    assert modeling_qwen3.Qwen3Attention.forward is forward_before
    for layer in model.hf.model.layers:
        assert type(layer) is PreparedQwen3DecoderLayer  # canonical residuals, norms handed to the projections
        assert isinstance(layer.self_attn, PagedQwen3Attention)
        norms = (layer.self_attn.q_norm, layer.self_attn.k_norm, layer.input_layernorm, layer.post_attention_layernorm)
        assert all(isinstance(n, RMSNorm) for n in norms)  # the opaque flare::rms_norm, canonical weights
        assert not hasattr(layer.self_attn, "q_proj") and not hasattr(layer.mlp, "gate_proj")
        assert layer.self_attn.qkv_proj.packed and layer.mlp.gate_up_proj.packed
    assert not any(t.is_meta for t in list(model.parameters()) + list(model.buffers()))
    assert isinstance(model.hf.model.norm, RMSNorm)
    # the canonical rotary module, which the step's flare::rotary_cos_sin reproduces on CUDA (fixed fp32 frequencies)
    assert type(model.hf.model.rotary_emb) is modeling_qwen3.Qwen3RotaryEmbedding
    assert fused_rotary_applies(model.hf.model.rotary_emb)
    fresh = modeling_qwen3.Qwen3ForCausalLM(model.config)
    assert type(fresh.model.layers[0]) is modeling_qwen3.Qwen3DecoderLayer
    assert type(fresh.model.layers[0].self_attn) is modeling_qwen3.Qwen3Attention
    assert type(fresh.model.layers[0].input_layernorm) is modeling_qwen3.Qwen3RMSNorm


def test_catalog_stages_and_capacities(ckpt):
    model, graphs = prepare(ckpt)
    with pytest.raises(KeyError, match="no prepared decode step holds 5 rows"):
        graphs.step("decode", 5)
    with pytest.raises(ValueError, match="not declared"):
        CATALOG.prepare(model, decode=(3,))
    row = Row([0], PAGE)
    with pytest.raises(ValueError, match="cannot hold"):
        graphs.step("prefill", 1, 8).run(**row.inputs(PROMPT[:8] * 5, graphs.steps[0].max_pages))
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs a CUDA model"):
            graphs.capture()
    assert graphs.tune().stage == "tuned" and all(s.example is None for s in graphs.steps)
    # the tuning run wrote nothing outside the sink page
    assert not model.kv_cache.k[:, :model.kv_cache.num_pages].any()


@pytest.mark.parametrize("reduce_prefetch_mb", ["", "8"])
def test_the_attention_is_told_the_qkv_projection_bytes(ckpt, monkeypatch, reduce_prefetch_mb):
    """Each layer's attention gets its QKV projection's weight bytes (``overlap_bytes``: the decode kernel's K/V
    prefetch is scheduled by it) -- checked against the size the checkpoint's config gives: (heads + 2 KV heads) x
    head_dim rows of hidden_size bf16 values; and, at decode steps with ``FLARE_DECODE_REDUCE_PREFETCH_MB`` set, its
    output projection's weight ([hidden, heads x head_dim]; the reduce kernel's L2 prefetch), none otherwise."""
    from ignition.components import attention

    monkeypatch.setenv("FLARE_DECODE_REDUCE_PREFETCH_MB", reduce_prefetch_mb)
    seen = []
    real = attention.PyTorchPagedAttention.rope_attend

    def recording(self, layer, q, k, v, q_norm, k_norm, eps, cos, sin, batch, overlap_bytes=None,
                  prefetch_weight=None):
        seen.append((q.shape[1], overlap_bytes, None if prefetch_weight is None else tuple(prefetch_weight.shape)))
        return real(self, layer, q, k, v, q_norm, k_norm, eps, cos, sin, batch, overlap_bytes, prefetch_weight)

    monkeypatch.setattr(attention.PyTorchPagedAttention, "rope_attend", recording)
    model, graphs = prepare(ckpt, decode=(1,), prefill=(8,))
    cfg = AutoConfig.from_pretrained(ckpt)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    qkv = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * head_dim * cfg.hidden_size * 2
    row = Row(list(PAGES), PAGE)
    prefill(graphs, row, PROMPT[:8], chunk=8)
    graphs.step("decode", 1).run(**row.inputs([PROMPT[8]], graphs.steps[0].max_pages))
    layers = cfg.num_hidden_layers
    o_proj = (cfg.hidden_size, cfg.num_attention_heads * head_dim) if reduce_prefetch_mb else None
    assert sorted(set(seen), key=str) == sorted([(1, qkv, o_proj), (8, qkv, None)], key=str)
    assert len(seen) == 2 * layers


def test_decode_rows_take_the_fused_projections_by_the_measured_rule(ckpt, monkeypatch):
    """One-row decode runs each layer's four projections as flare::fused_linear (norm + QKV, o_proj + residual,
    norm + gate/up + SiLU, down + residual); a 4-row decode fuses only the narrow ungated ones (QKV, o_proj, down
    and -- ``PACKED_GATE_UP_FUSED`` -- gate/up's packed product with the norm prologue: at most 1024 columns here),
    down then taking gate/up's packed output with the SiLU gate in its prologue; an 8-token prefill
    chunk, within the tensor-core variant's 2..16 rows (on unless ``FLARE_GEMV_DOT=0``), takes it for its
    plain-input projections (longer chunks fuse nothing).  The greedy-vs-canonical tests above check the results."""
    from ignition.components import fused_linear as fl

    monkeypatch.delenv("FLARE_GEMV_DOT", raising=False)
    monkeypatch.delenv("FLARE_PACKED_GATE_UP", raising=False)
    monkeypatch.delenv("FLARE_HEAD_FUSED", raising=False)
    assert fl.PACKED_GATE_UP_FUSED and fl.HEAD_FUSED

    calls = []
    real = fl.fused_linear

    def counting(x, weight, norm_weight, eps, residual, gated, gated_input=False, early=False, **kw):
        calls.append((x.numel() // x.shape[-1], norm_weight is not None, residual is not None, gated, gated_input,
                      early))
        return real(x, weight, norm_weight, eps, residual, gated, gated_input, early, **kw)

    monkeypatch.setattr(fl, "fused_linear", counting)
    model, graphs = prepare(ckpt, decode=(1, 4), prefill=(8,))
    layers = model.config.num_hidden_layers
    row = Row(list(PAGES), PAGE)
    prefill(graphs, row, PROMPT[:8], chunk=8)
    # an 8-token chunk is within the tensor-core kernel's 2..16 rows: its plain-input projections take it (qkv after
    # its norm, o_proj + residual, down + residual after the SiLU gate); gate/up stays cuBLAS (this checkpoint's is
    # below ``GEMM_ROWS_GATED_MIN_ELEMENTS``)
    # (the last field: ``early`` -- the qkv projection, whose successor is the attention, never; o_proj and the MLP's
    # launches always: their successors read only weights before their wait)
    # and the head: one row (the chunk's last token), the final norm in its prologue (``HEAD_FUSED``)
    assert len(calls) == 3 * layers + 1 and calls[-1] == (1, True, False, False, False, False)
    assert set(calls[:-1]) == {(8, False, False, False, False, False), (8, False, True, False, False, True)}
    calls.clear()
    width = graphs.steps[0].max_pages
    graphs.step("decode", 1).run(**row.inputs([PROMPT[8]], width))
    assert sorted(set(calls)) == sorted({(1, True, False, False, False, False), (1, False, True, False, False, True),
                                         (1, True, False, True, False, True)})
    assert len(calls) == 4 * layers + 1 and calls[-1] == (1, True, False, False, False, False)  # + the head
    calls.clear()
    graphs.step("decode", 4).run(**row.inputs([PROMPT[9]], width))  # one row loaded, four in the step
    # every ungated output here is narrow (<= 1024 columns): QKV, o_proj, down and the packed gate/up product
    # (ungated, the norm in its prologue) fuse; gate/up with its SiLU gate does not
    assert len(calls) == 4 * layers
    assert set(calls) == {(4, True, False, False, False, False), (4, False, True, False, False, True),
                          (4, True, False, False, False, True), (4, False, True, False, True, True)}
