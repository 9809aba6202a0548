"""Draft sources (``ignition.components.drafts``): prompt lookup against a reference written here, model
and self drafts (greedy continuation, sampled distribution, streams), static shapes and tracing."""

from __future__ import annotations

import pytest
import torch

from ignition.components.drafts import ModelDraft, PromptLookupDraft, SelfDraft
from ignition.components.sampling import SamplingTensors, advance, sample

ALPHA = 1e-4  # false-alarm rate of the chi-square test below


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Many tiny ops: OpenMP barriers on a 2-vCPU VM cost milliseconds each (restored afterwards)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _active_params(B, V=None, **kw):
    p = SamplingTensors.empty(B, vocab_size=V)
    p.active.fill_(True)
    p.seed.copy_(torch.arange(B) * 31 + 5)
    for name, value in kw.items():
        getattr(p, name).fill_(value)
    return p


# ----------------------------------------------------------------------------- prompt lookup

def _ref_lookup(seq: list[int], n: int, k: int, min_n: int) -> list[int]:
    """Plain-Python reference: longest n-gram first, most recent earlier occurrence, continuation up to
    ``k`` tokens and up to the end of the sequence."""
    for m in range(n, min_n - 1, -1):
        if len(seq) < m + 1:
            continue
        suffix = seq[-m:]
        for s in range(len(seq) - m - 1, -1, -1):
            if seq[s:s + m] == suffix:
                return seq[s + m:s + m + k]
    return []


def _lookup(history_rows, n, k, min_n=None, active=None, limit=None, L=None):
    B = len(history_rows)
    L = L or max(len(r) for r in history_rows) + 3
    hist = torch.full((B, L), 99, dtype=torch.int64)  # garbage past each row's length
    for b, r in enumerate(history_rows):
        hist[b, :len(r)] = torch.tensor(r, dtype=torch.int64)
    lengths = torch.tensor([len(r) for r in history_rows])
    params = _active_params(B)
    return PromptLookupDraft(n, k, min_n=min_n).propose(hist, lengths, params, active, limit)


def test_prompt_lookup_hand_cases():
    rows = [[1, 2, 3, 5, 1, 2, 3, 6, 7, 1, 2, 3],  # most recent earlier match wins: 6 7 1
            [1, 2, 3, 4, 1, 2, 3],  # continuation 4 1 2
            [1, 2, 3, 4, 5, 6],  # no earlier match
            [1, 2, 3],  # only the suffix itself
            [7, 7, 7, 7],  # overlapping match: 7 (the continuation runs into the suffix)
            [1, 2]]  # shorter than n
    tokens, probs, n = _lookup(rows, 3, 3)
    assert probs is None
    assert n.tolist() == [3, 3, 0, 0, 1, 0]
    assert tokens.tolist() == [[6, 7, 1], [4, 1, 2], [-1] * 3, [-1] * 3, [7, -1, -1], [-1] * 3]


def test_prompt_lookup_min_n_falls_back_to_shorter_grams():
    rows = [[4, 2, 3, 9, 8, 5, 3, 1, 2, 3]]  # no earlier 3-gram "1 2 3"; 2-gram "2 3" at 1 -> 9 8
    assert _lookup(rows, 3, 2)[2].tolist() == [0]
    tokens, _, n = _lookup(rows, 3, 2, min_n=2)
    assert n.tolist() == [2] and tokens.tolist() == [[9, 8]]
    tokens, _, n = _lookup(rows, 3, 2, min_n=1)
    assert tokens.tolist() == [[9, 8]]  # the longest match wins over the more recent 1-gram


@pytest.mark.parametrize("n,k,min_n", [(1, 1, 1), (2, 4, 2), (3, 5, 3), (3, 3, 1), (4, 7, 2)])
def test_prompt_lookup_matches_reference_on_random_histories(n, k, min_n):
    g = torch.Generator().manual_seed(n * 10 + k)
    rows = [torch.randint(0, 4, (int(torch.randint(1, 40, (1,), generator=g)),), generator=g).tolist()
            for _ in range(64)]
    tokens, _, got_n = _lookup(rows, n, k, min_n=min_n, L=48)
    for b, r in enumerate(rows):
        ref = _ref_lookup(r, n, k, min_n)
        assert got_n[b] == len(ref) and tokens[b, :len(ref)].tolist() == ref, (b, r)
        assert (tokens[b, len(ref):] == -1).all()


def test_prompt_lookup_limit_and_inactive_rows():
    rows = [[1, 2, 3, 4, 5, 1, 2]] * 3
    tokens, _, n = _lookup(rows, 2, 4, active=torch.tensor([True, True, False]), limit=torch.tensor([1, 9, 4]))
    assert n.tolist() == [1, 4, 0]
    assert tokens.tolist() == [[3, -1, -1, -1], [3, 4, 5, 1], [-1] * 4]


# ----------------------------------------------------------------------------- model and self drafts

class Table:
    """Toy model: logits from a fixed random table indexed by the last token; records its calls."""

    def __init__(self, V, seed, scale=2.0):
        self.table = torch.randn(V, V, generator=torch.Generator().manual_seed(seed)) * scale
        self.calls = []

    def __call__(self, tokens, lengths):
        self.calls.append((tokens.clone(), lengths.clone()))
        last = tokens.gather(1, (lengths - 1).clamp(0, tokens.shape[1] - 1)[:, None])[:, 0]
        return self.table[last.clamp(0, self.table.shape[0] - 1)]


def _row(**kw):
    base = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "presence_penalty": 0.0,
            "frequency_penalty": 0.0, "repetition_penalty": 1.0, "seed": 0}
    return {**base, **kw}


@pytest.mark.parametrize("cls", [ModelDraft, SelfDraft])
def test_greedy_proposals_equal_plain_greedy_decoding(cls):
    """Greedy rows (with penalties) propose exactly what plain greedy decoding of the same model emits."""
    V, K = 10, 6
    rows = [_row(temperature=0.0, seed=b, **kw) for b, kw in enumerate(
        [{}, {"repetition_penalty": 1.5}, {"frequency_penalty": 1.0, "presence_penalty": 0.5}, {}])]
    prompts = [[1, 2], [3, 3, 4], [5], [6, 7, 8, 9]]
    model = Table(V, 3)
    params = SamplingTensors.from_resolved(rows, 4, vocab_size=V, prompt_token_ids=prompts)
    hist = torch.zeros(4, 12, dtype=torch.int64)
    for b, p in enumerate(prompts):
        hist[b, :len(p)] = torch.tensor(p)
    lengths = torch.tensor([len(p) for p in prompts])
    tokens, probs, n = cls(model, K).propose(hist, lengths, params)
    assert n.tolist() == [K] * 4 and probs.shape == (4, K, V)
    ref_params = SamplingTensors.from_resolved(rows, 4, vocab_size=V, prompt_token_ids=prompts)
    last = hist.gather(1, (lengths - 1)[:, None])[:, 0]
    for j in range(K):
        t = sample(model.table[last], ref_params)
        advance(ref_params, t)
        assert torch.equal(tokens[:, j], t), j
        last = t
    assert torch.equal(params.output_counts, SamplingTensors.from_resolved(
        rows, 4, vocab_size=V, prompt_token_ids=prompts).output_counts), "propose must not mutate params"


def test_model_draft_calls_and_buffer():
    """K calls on one static [B, L + K] buffer, lengths growing by one per call for active rows only,
    each proposal written at its position; inactive rows propose nothing."""
    V, K = 6, 3
    model = Table(V, 1)
    params = _active_params(3, V, temperature=0.0)
    active = torch.tensor([True, False, True])
    hist = torch.tensor([[1, 2, 0, 0], [3, 0, 0, 0], [4, 5, 1, 0]])
    lengths = torch.tensor([2, 1, 3])
    tokens, probs, n = ModelDraft(model, K).propose(hist, lengths, params, active, torch.tensor([2, 3, 5]))
    assert n.tolist() == [2, 0, 3] and (tokens[1] == -1).all() and tokens[0, 2] == -1
    assert len(model.calls) == K
    for j, (buf, ln) in enumerate(model.calls):
        assert buf.shape == (3, 4 + K)
        assert ln.tolist() == [2 + j, 1, 3 + j]
        assert torch.equal(buf[:, :4][:, :2], hist[:, :2])
    final, _ = model.calls[-1]
    assert final[0, 2:4].tolist() == tokens[0, :2].tolist() and final[2, 3:5].tolist() == tokens[2, :2].tolist()
    assert torch.equal(final[1, :4], hist[1])  # the inactive row's buffer is untouched


def test_sampled_proposals_follow_their_probs_chi_square():
    """20,000 rows (distinct seeds), first proposal at temperature 0.8 with top-k 4: chi-square against
    softmax(logits / 0.8) restricted to the top 4 (computed here in float64), false-alarm rate 1e-4.
    The returned probs agree with it, and every proposal lies in the support of its probs."""
    V, B = 6, 20_000
    model = Table(V, 2)
    params = _active_params(B, V, temperature=0.8, top_k=4)
    hist = torch.full((B, 1), 2, dtype=torch.int64)
    tokens, probs, n = ModelDraft(model, 2).propose(hist, torch.ones(B, dtype=torch.int64), params)
    z = model.table[2].double() / 0.8
    z = torch.where(z >= torch.sort(z, descending=True).values[3], z, -torch.inf)
    ref = torch.softmax(z, dim=0)
    assert torch.allclose(probs[0, 0].double(), ref, atol=1e-6)
    assert (probs.gather(2, tokens[:, :, None]) > 0).all()
    assert torch.allclose(probs.sum(-1), torch.ones(B, 2))
    counts = torch.bincount(tokens[:, 0], minlength=V).double()
    support = ref > 0
    assert counts[~support].sum() == 0
    expected = ref[support] * B
    stat = ((counts[support] - expected) ** 2 / expected).sum()
    pvalue = torch.special.gammaincc(torch.tensor((int(support.sum()) - 1) / 2, dtype=torch.float64), stat / 2)
    assert pvalue > ALPHA
    # The draft stream is not the plain sampling stream: agreement with sample() is ~sum(p^2), not 1.
    same = (tokens[:, 0] == sample(model.table[hist[:, 0]], params)).double().mean()
    assert same < float((ref ** 2).sum()) + 0.05


def test_sampled_proposals_reproducible_and_batch_independent():
    V, B, K = 9, 6, 4
    model = Table(V, 4)
    params = _active_params(B, V, temperature=1.1, top_p=0.9)
    params.step.copy_(torch.arange(B) * 3)
    hist = torch.randint(0, V, (B, 5), generator=torch.Generator().manual_seed(0))
    lengths = torch.tensor([5, 3, 4, 1, 2, 5])
    a = ModelDraft(model, K).propose(hist, lengths, params)
    b = ModelDraft(model, K).propose(hist, lengths, params)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    for r in range(B):
        sub = SamplingTensors(**{k: (v[r:r + 1] if isinstance(v, torch.Tensor) else v)
                                 for k, v in vars(params).items()})
        one = ModelDraft(model, K).propose(hist[r:r + 1], lengths[r:r + 1], sub)
        assert torch.equal(one[0][0], a[0][r]) and torch.equal(one[1][0], a[1][r]), r


# ----------------------------------------------------------------------------- capturability

def test_drafts_capturable_on_meta_tensors():
    B, L, V, K = 3, 16, 32, 4
    params = SamplingTensors.empty(B, vocab_size=V, device="meta")
    hist = torch.empty(B, L, dtype=torch.int64, device="meta")
    lengths = torch.empty(B, dtype=torch.int64, device="meta")
    table = torch.empty(V, V, device="meta")
    fn = lambda t, ln: table[t.gather(1, (ln - 1).clamp(0, t.shape[1] - 1)[:, None])[:, 0]]  # noqa: E731
    for draft in (PromptLookupDraft(3, K, min_n=1), ModelDraft(fn, K), SelfDraft(fn, K)):
        tokens, probs, n = draft.propose(hist, lengths, params)
        assert tokens.shape == (B, K) and n.shape == (B,) and tokens.device.type == "meta"
        assert probs is None or probs.shape == (B, K, V)


def test_drafts_trace_without_graph_breaks():
    V, B, L, K = 8, 4, 12, 3
    model = Table(V, 6)
    fn = lambda t, ln: model.table[t.gather(1, (ln - 1).clamp(0, t.shape[1] - 1)[:, None])[:, 0]]  # noqa: E731
    hist = torch.randint(0, 3, (B, L), generator=torch.Generator().manual_seed(1))
    lengths = torch.tensor([12, 7, 3, 10])
    for draft in (PromptLookupDraft(2, K, min_n=1), ModelDraft(fn, K)):
        torch._dynamo.reset()
        params = _active_params(B, V, temperature=0.9, frequency_penalty=0.3)
        traced = torch.compile(draft.propose, fullgraph=True, dynamic=False, backend="eager")
        got, ref = traced(hist, lengths, params), draft.propose(hist, lengths, params)
        assert torch.equal(got[0], ref[0]) and torch.equal(got[2], ref[2])
