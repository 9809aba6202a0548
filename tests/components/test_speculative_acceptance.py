"""Speculative acceptance (``ignition.components.speculative``): greedy equality with plain decoding,
the self-drafting probe, distribution preservation (chi-square), width-one parity, planted defects."""

from __future__ import annotations

import math

import pytest
import torch

from ignition.components import speculative
from ignition.components.drafts import ModelDraft, PromptLookupDraft, SelfDraft
from ignition.components.sampling import SamplingTensors, advance, sample
from ignition.components.speculative import accept, advance_accepted, full_acceptance_violations

ALPHA = 1e-4  # false-alarm rate of every chi-square test below


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Thousands of tiny ops: OpenMP barriers on a 2-vCPU VM cost milliseconds each; one thread is
    faster and steadier (restored afterwards)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _row(**kw):
    base = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "presence_penalty": 0.0,
            "frequency_penalty": 0.0, "repetition_penalty": 1.0, "seed": 0}
    return {**base, **kw}


def _chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit; p-value from the regularized upper incomplete gamma
    (``chi2.sf(x, df) = Q(df / 2, x / 2)``).  Cells with zero expected mass must have zero counts."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    support = probs > 0
    assert counts[~support].sum() == 0, "draws outside the target's support"
    n = counts.sum()
    expected = probs[support] / probs[support].sum() * n
    stat = ((counts[support] - expected) ** 2 / expected).sum()
    df = int(support.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


# ----------------------------------------------------------------------------- toy target and drivers

class Table:
    """Toy deterministic model: next-token logits are a fixed random table indexed by the last two tokens."""

    def __init__(self, V: int, seed: int, scale: float = 3.0):
        g = torch.Generator().manual_seed(seed)
        self.V, self.table = V, torch.randn(V, V, V, generator=g) * scale

    def __call__(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        L = tokens.shape[1]
        a = tokens.gather(1, (lengths - 2).clamp(0, L - 1)[:, None])[:, 0]
        b = tokens.gather(1, (lengths - 1).clamp(0, L - 1)[:, None])[:, 0]
        return self.table[a.clamp(0, self.V - 1), b.clamp(0, self.V - 1)]


def verification_logits(fn, history, lengths, proposals, n, W):
    """``[B, W, V]``: the target's logits after the pending token and proposals ``0..i-1``."""
    B, L = history.shape
    buf = torch.nn.functional.pad(history, (0, W))
    for i in range(W - 1):
        at = (lengths + i)[:, None]
        buf.scatter_(1, at, torch.where(i < n, proposals[:, i].clamp_min(0), 0)[:, None])
    return torch.stack([fn(buf, lengths + i) for i in range(W)], dim=1)


def plain_decode(fn, params, prompts, steps, L):
    """Reference: ``steps`` tokens per row with :func:`sample` / :func:`advance` (all rows active)."""
    B = len(prompts)
    hist = torch.zeros(B, L, dtype=torch.int64)
    lengths = torch.tensor([len(p) for p in prompts])
    for b, p in enumerate(prompts):
        hist[b, :len(p)] = torch.tensor(p)
    out = []
    for _ in range(steps):
        tok = sample(fn(hist, lengths), params)
        advance(params, tok)
        hist.scatter_(1, lengths[:, None], tok[:, None])
        lengths = lengths + 1
        out.append(tok)
    return torch.stack(out, dim=1)


def speculative_decode(fn, params, prompts, steps, W, draft, *, seed=0, p_active=0.8, check_self=False):
    """Rounds of width ``W`` until every row has ``>= steps`` tokens; random ragged limits and random
    inactive rows per round.  Returns the first ``steps`` tokens per row and the round records."""
    B = len(prompts)
    g = torch.Generator().manual_seed(seed)
    L = max(len(p) for p in prompts) + steps + 2 * W + 2
    hist = torch.zeros(B, L, dtype=torch.int64)
    lengths = torch.tensor([len(p) for p in prompts])
    start = lengths.clone()
    for b, p in enumerate(prompts):
        hist[b, :len(p)] = torch.tensor(p)
    rounds = []
    while bool(((lengths - start) < steps).any()):
        active = ((lengths - start) < steps) & (torch.rand(B, generator=g) < p_active)
        if W == 1:
            tokens, probs = torch.zeros(B, 0, dtype=torch.int64), None
            n = torch.zeros(B, dtype=torch.int64)
        else:
            limit = None if check_self else torch.randint(0, W, (B,), generator=g)
            tokens, probs, n = draft.propose(hist, lengths, params, active, limit)
            tokens, n = tokens[:, :W - 1], n.clamp(max=W - 1)
            probs = None if probs is None else probs[:, :W - 1]
        logits = verification_logits(fn, hist, lengths, tokens, n, W)
        emitted, n_emitted = accept(logits, tokens, probs, n, params, active)
        assert ((n_emitted >= 1) & (n_emitted <= n + 1) | ~active).all() and (n_emitted[~active] == 0).all()
        assert (emitted[~active] == -1).all()
        advance_accepted(params, emitted, n_emitted, active)
        for w in range(W):
            write = w < n_emitted
            at = (lengths + w).clamp(max=L - 1)[:, None]
            hist.scatter_(1, at, torch.where(write, emitted[:, w], hist.gather(1, at)[:, 0])[:, None])
        lengths = lengths + n_emitted
        rounds.append((n, n_emitted, active))
    out = torch.stack([hist[b, start[b]:start[b] + steps] for b in range(B)])
    return out, rounds


class RandomDraft:
    """Uniformly random proposals (deterministic proposer: ``probs=None``)."""

    def __init__(self, V, k, seed=0):
        self.V, self.k, self.g = V, k, torch.Generator().manual_seed(seed)

    def propose(self, history, lengths, params, active=None, limit=None):
        B = history.shape[0]
        n = torch.where(active, torch.full((B,), self.k), 0)
        if limit is not None:
            n = torch.minimum(n, limit)
        return torch.randint(0, self.V, (B, self.k), generator=self.g), None, n


class NoisyOracleDraft:
    """Proposes the reference continuation with a fraction of tokens corrupted: long accepted runs."""

    def __init__(self, reference, start, V, k, p_wrong=0.25, seed=0):
        self.ref, self.start, self.V, self.k, self.p = reference, start, V, k, p_wrong
        self.g = torch.Generator().manual_seed(seed)

    def propose(self, history, lengths, params, active=None, limit=None):
        B, S = self.ref.shape
        idx = (lengths - self.start)[:, None] + torch.arange(self.k)[None, :]
        tok = self.ref.gather(1, idx.clamp(0, S - 1))
        wrong = torch.rand(B, self.k, generator=self.g) < self.p
        tok = torch.where(wrong, (tok + torch.randint(1, self.V, (B, self.k), generator=self.g)) % self.V, tok)
        n = torch.where(active, torch.full((B,), self.k), 0)
        if limit is not None:
            n = torch.minimum(n, limit)
        return tok, None, n


V_TOY = 12
STEPS = 24


def _greedy_rows():
    """Greedy rows, some penalized (repetition, frequency, presence), plus two sampled rows."""
    pen = [dict(), dict(repetition_penalty=1.3), dict(frequency_penalty=0.7, presence_penalty=0.3),
           dict(repetition_penalty=0.8, presence_penalty=-0.5), dict(frequency_penalty=2.0)]
    rows = [_row(temperature=0.0, seed=b, **pen[b % len(pen)]) for b in range(6)]
    rows += [_row(temperature=0.9, top_k=5, seed=100), _row(temperature=1.2, top_p=0.8, seed=101)]
    prompts = [[(3 * b + j * j) % V_TOY for j in range(2 + b % 4)] for b in range(len(rows))]
    return rows, prompts


def _greedy_params(rows, prompts):
    return SamplingTensors.from_resolved(rows, len(rows), vocab_size=V_TOY, prompt_token_ids=prompts)


def _draft(kind, target, reference, start, W):
    k = max(W - 1, 1)
    return {"random": lambda: RandomDraft(V_TOY, k, seed=W),
            "oracle": lambda: NoisyOracleDraft(reference, start, V_TOY, k, seed=W),
            "lookup": lambda: PromptLookupDraft(n=2, k=k),
            "self": lambda: SelfDraft(target, k),
            "model": lambda: ModelDraft(Table(V_TOY, seed=77), k)}[kind]()


# ----------------------------------------------------------------------------- greedy equality

@pytest.mark.parametrize("W", range(1, 9))
@pytest.mark.parametrize("kind", ["random", "oracle", "lookup", "self", "model"])
def test_greedy_speculation_equals_plain_greedy(kind, W):
    """Every greedy row emits plain greedy decoding token for token, for any draft, width, ragged limits
    and random inactive rows (two sampled rows share the batch)."""
    target = Table(V_TOY, seed=5)
    rows, prompts = _greedy_rows()
    n_greedy = 6
    reference = plain_decode(target, _greedy_params(rows, prompts), prompts, STEPS + 2 * W, 64)
    start = torch.tensor([len(p) for p in prompts])
    params = _greedy_params(rows, prompts)
    got, rounds = speculative_decode(target, params, prompts, STEPS, W, _draft(kind, target, reference, start, W),
                                     seed=W)
    assert torch.equal(got[:n_greedy], reference[:n_greedy, :STEPS])
    if W > 1 and kind in ("oracle", "self"):  # the check really exercised long accepted runs
        assert max(int((ne - 1).max()) for _, ne, _ in rounds) >= min(W - 1, 3)


def _self_probe(W, rows, prompts, seed=0):
    target = Table(V_TOY, seed=5)
    params = SamplingTensors.from_resolved(rows, len(rows), vocab_size=V_TOY, prompt_token_ids=prompts)
    _, rounds = speculative_decode(target, params, prompts, STEPS, W, SelfDraft(target, W - 1), seed=seed,
                                   check_self=True)
    return [full_acceptance_violations(n, ne, act) for n, ne, act in rounds]


@pytest.mark.parametrize("W", [2, 5, 8])
def test_self_draft_greedy_accepts_everything(W):
    rows, prompts = _greedy_rows()
    rows, prompts = rows[:6], prompts[:6]
    violations = _self_probe(W, rows, prompts)
    assert len(violations) > 0 and not any(bool(v.any()) for v in violations)


def test_self_draft_sampled_accepts_everything():
    """With draft logits bitwise equal to verification logits, p = q and min(1, p/q) = 1 exactly."""
    rows = [_row(temperature=t, top_k=k, top_p=tp, min_p=mp, frequency_penalty=0.4, repetition_penalty=1.2,
                 seed=50 + b)
            for b, (t, k, tp, mp) in enumerate([(0.7, 0, 1.0, 0.0), (1.0, 4, 1.0, 0.0), (1.3, 0, 0.8, 0.05),
                                                (0.9, 6, 0.9, 0.1)])]
    prompts = [[1, 2], [3, 4, 5], [6, 7], [8, 9, 10, 11]]
    violations = _self_probe(5, rows, prompts)
    assert not any(bool(v.any()) for v in violations)


@pytest.mark.parametrize("defect", [
    lambda tok, g: tok != g[:, :-1],  # inverted rule
    lambda tok, g: tok == g[:, 1:],  # off by one position
])
def test_self_draft_probe_catches_planted_defects(monkeypatch, defect):
    rows, prompts = _greedy_rows()
    rows, prompts = rows[:6], prompts[:6]
    monkeypatch.setattr(speculative, "_greedy_match", defect)
    violations = _self_probe(4, rows, prompts)
    assert any(bool(v.any()) for v in violations)


def test_greedy_equality_catches_planted_defect(monkeypatch):
    monkeypatch.setattr(speculative, "_greedy_match", lambda tok, g: tok == g[:, 1:])
    with pytest.raises(AssertionError):
        test_greedy_speculation_equals_plain_greedy("oracle", 4)


def test_greedy_equality_catches_missing_conditional_penalties(monkeypatch):
    """Planted defect: verification positions penalized with the pre-round histogram only."""
    def stale(counts, proposals, valid, width):
        return counts.repeat_interleave(width, dim=0)
    monkeypatch.setattr(speculative, "_conditional_counts", stale)
    with pytest.raises(AssertionError):
        test_greedy_speculation_equals_plain_greedy("oracle", 4)


# ----------------------------------------------------------------------------- distribution

def _ref_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """float64 reference written here: softmax(logits / t) restricted to the top-k values."""
    z = logits.double() / temperature
    if top_k:
        kth = torch.sort(z, descending=True).values[top_k - 1]
        z = torch.where(z >= kth, z, -math.inf)
    return torch.softmax(z, dim=-1)


def _sampled_params(N, V, seed0=0, **kw):
    p = SamplingTensors.empty(N, vocab_size=V)
    p.active.fill_(True)
    p.seed.copy_(torch.arange(N) * 7919 + seed0)
    p.step.copy_(torch.arange(N) % 13)
    for name, value in kw.items():
        getattr(p, name).fill_(value)
    return p


N_DIST = 40_000
Z5 = torch.tensor([1.2, 0.3, -0.4, 0.8, -1.5])
Q5 = torch.tensor([0.05, 0.5, 0.3, 0.05, 0.1])


def _first_token_counts(q, *, deterministic=False, temperature=1.0, top_k=0, seed=0, fixed_token=None):
    V = Z5.numel()
    params = _sampled_params(N_DIST, V, seed0=seed, temperature=temperature, top_k=top_k)
    g = torch.Generator().manual_seed(seed)
    if deterministic:  # any proposals chosen independently of the verifier's randomness
        prop = torch.randint(0, V, (N_DIST, 1), generator=g) if fixed_token is None else \
            torch.full((N_DIST, 1), fixed_token)
        probs = None
    else:
        prop = torch.multinomial(q, N_DIST, replacement=True, generator=g)[:, None]
        probs = q.expand(N_DIST, 1, V)
    logits = Z5.expand(N_DIST, 2, V)
    emitted, n_emitted = accept(logits, prop, probs, torch.ones(N_DIST, dtype=torch.int64), params)
    assert ((n_emitted >= 1) & (n_emitted <= 2)).all()
    return torch.bincount(emitted[:, 0], minlength=V)


@pytest.mark.parametrize("case", [
    dict(q=Q5),
    dict(q=torch.tensor([0.0, 0.0, 0.5, 0.0, 0.5])),  # draft misses most of the target's support
    dict(q=_ref_probs(Z5)),  # q = p: everything accepted
    dict(q=Q5, temperature=0.6, top_k=3),  # q has mass where the filtered p has none
    dict(q=None, deterministic=True),  # deterministic proposer: q one-hot
    dict(q=None, deterministic=True, fixed_token=0),
    dict(q=None, deterministic=True, temperature=1.5, top_k=4),
])
def test_first_token_distribution_equals_target(case):
    """40,000 independent rows (distinct seeds), one proposal each; the emitted first token is
    chi-square tested against the target's filtered distribution (computed independently in float64)
    at a false-alarm rate of ALPHA = 1e-4 per case."""
    case = dict(case)
    t, k = case.pop("temperature", 1.0), case.pop("top_k", 0)
    counts = _first_token_counts(case.pop("q"), temperature=t, top_k=k, **case)
    assert _chi2_pvalue(counts, _ref_probs(Z5, t, k)) > ALPHA


@pytest.mark.parametrize("defect,deterministic", [
    ("residual_is_p", False),  # resample from p instead of max(0, p - q)
    ("residual_is_p", True),  # deterministic proposer: resample from p without removing the token
    ("always_accept", False),  # accept every proposal (emits q)
    ("accept_p", False),  # accept with probability p(t), ignoring q
])
def test_distribution_test_catches_planted_defects(monkeypatch, defect, deterministic):
    """The same chi-square test (alpha = 1e-4) rejects defective acceptance rules."""
    if defect == "residual_is_p":
        monkeypatch.setattr(speculative, "_residual", lambda p, q: p)
    elif defect == "always_accept":
        monkeypatch.setattr(speculative, "_accept_ratio", lambda p, q: torch.full_like(p, math.inf))
    else:
        monkeypatch.setattr(speculative, "_accept_ratio", lambda p, q: p)
    # A deterministic proposer must propose a fixed token here: with uniformly random proposals,
    # resampling from p happens to preserve the first-token marginal.
    counts = _first_token_counts(None if deterministic else Q5, deterministic=deterministic,
                                 fixed_token=0 if deterministic else None)
    assert _chi2_pvalue(counts, _ref_probs(Z5)) < ALPHA


def _two_token_counts(freq, presence, seed=3):
    """Rounds of width 3 (two proposals from a draft table) until every row has two tokens."""
    V = 5
    g = torch.Generator().manual_seed(seed)
    target = torch.randn(V, V, generator=g) * 1.2
    draft = torch.softmax(torch.randn(V, V, generator=g) * 1.5, dim=-1)
    B = N_DIST
    params = _sampled_params(B, V, seed0=seed, frequency_penalty=freq, presence_penalty=presence)
    pending = torch.full((B,), 2)
    out = torch.full((B, 2), -1)
    got = torch.zeros(B, dtype=torch.int64)
    while bool((got < 2).any()):
        active = got < 2
        d0 = torch.multinomial(draft[pending], 1, generator=g)[:, 0]
        d1 = torch.multinomial(draft[d0], 1, generator=g)[:, 0]
        probs = torch.stack([draft[pending], draft[d0]], dim=1)
        logits = torch.stack([target[pending], target[d0], target[d1]], dim=1)
        emitted, n_emitted = accept(logits, torch.stack([d0, d1], 1), probs, torch.full((B,), 2), params, active)
        advance_accepted(params, emitted, n_emitted, active)
        for w in range(3):
            put = active & (w < n_emitted) & (got < 2)
            out[put, got[put]] = emitted[put, w]
            got = got + put.to(torch.int64)
        last = emitted.gather(1, (n_emitted - 1).clamp_min(0)[:, None])[:, 0]
        pending = torch.where(active, last, pending)
    counts = torch.bincount(out[:, 0] * V + out[:, 1], minlength=V * V)
    # Reference, from the definitions: p(x0) p(x1 | x0) with x0 counted once in the output histogram.
    ref = torch.zeros(V, V, dtype=torch.float64)
    p0 = torch.softmax(target[2].double(), dim=-1)
    for x0 in range(V):
        z = target[x0].double().clone()
        z[x0] -= freq + presence
        ref[x0] = p0[x0] * torch.softmax(z, dim=-1)
    return counts, ref


def test_two_token_joint_distribution_across_rounds():
    """Joint of the first two emitted tokens over rounds (ragged continuation, advance_accepted, the
    conditional penalty histogram): chi-square, 24 degrees of freedom, false-alarm rate ALPHA = 1e-4."""
    counts, ref = _two_token_counts(freq=1.5, presence=0.5)
    assert _chi2_pvalue(counts, ref) > ALPHA


def test_joint_distribution_catches_stale_penalties(monkeypatch):
    monkeypatch.setattr(speculative, "_conditional_counts",
                        lambda counts, proposals, valid, width: counts.repeat_interleave(width, dim=0))
    counts, ref = _two_token_counts(freq=1.5, presence=0.5)
    assert _chi2_pvalue(counts, ref) < ALPHA


# ----------------------------------------------------------------------------- width one and state

def _mixed_params(B, V, max_top_k=None):
    temps = [0.0, 0.6, 1.0, 1.4]
    rows = [_row(temperature=temps[b % 4], top_k=[0, 20, 5][b % 3] if max_top_k is None else [20, 5][b % 2],
                 top_p=[1.0, 0.9, 0.7][b % 3], min_p=[0.0, 0.05][b % 2], presence_penalty=0.4 * (b % 2),
                 frequency_penalty=0.2, repetition_penalty=[1.0, 1.1, 0.9][b % 3], seed=1000 + 17 * b)
            for b in range(B - 3)]
    prompts = [[b, 2 * b % V, 77 % V] for b in range(B - 3)]
    p = SamplingTensors.from_resolved(rows, B, vocab_size=V, prompt_token_ids=prompts,
                                      max_top_k=max_top_k)
    p.step.copy_(torch.arange(B) * 5)
    return p


@pytest.mark.parametrize("max_top_k", [None, 32])
def test_width_one_equals_plain_sample_bytewise(max_top_k):
    """256 steps of width-one rounds vs sample/advance: tokens and state bytewise equal; a wider round
    with no proposals emits the same token as well."""
    B, V = 16, 300
    g = torch.Generator().manual_seed(9)
    plain, spec = _mixed_params(B, V, max_top_k), _mixed_params(B, V, max_top_k)
    spec.active[3] = plain.active[3] = False
    empty = torch.zeros(B, 0, dtype=torch.int64)
    for s in range(256):
        logits = torch.randn(B, V, generator=g) * 3
        ref = sample(logits, plain)
        emitted, n_emitted = accept(logits[:, None], empty, None, torch.zeros(B), spec)
        assert torch.equal(emitted[:, 0], ref) and torch.equal(n_emitted, spec.active.to(torch.int64))
        if s % 32 == 0:
            wide = torch.cat([logits[:, None], torch.randn(B, 3, V, generator=g)], dim=1)
            e4, n4 = accept(wide, torch.randint(0, V, (B, 3), generator=g), None, torch.zeros(B), spec)
            assert torch.equal(e4[:, 0], ref) and (e4[:, 1:] == -1).all() and torch.equal(n4, n_emitted)
        advance(plain, ref)
        advance_accepted(spec, emitted, n_emitted)
        for name in ("output_counts", "step"):
            assert torch.equal(getattr(plain, name), getattr(spec, name)), name


def test_advance_accepted_equals_repeated_advance():
    B, V, W = 6, 40, 5
    g = torch.Generator().manual_seed(1)
    a, b = _mixed_params(B, V), _mixed_params(B, V)
    emitted = torch.randint(0, V, (B, W), generator=g)
    emitted[0, 1] = emitted[0, 0]  # repeated token within a round counts twice
    n_emitted = torch.tensor([3, 5, 1, 0, 2, 4])
    active = torch.tensor([True, True, True, False, True, False])
    emitted = torch.where(torch.arange(W)[None] < n_emitted[:, None], emitted, -1)
    advance_accepted(a, emitted, n_emitted, active)
    for w in range(W):
        advance(b, emitted[:, w], active=active & (w < n_emitted))
    assert torch.equal(a.output_counts, b.output_counts) and torch.equal(a.step, b.step)


def test_rows_are_independent_of_batch_composition():
    B, V, W = 6, 50, 4
    g = torch.Generator().manual_seed(2)
    p = _mixed_params(B + 3, V)
    logits = torch.randn(B + 3, W, V, generator=g) * 2
    prop = torch.randint(0, V, (B + 3, W - 1), generator=g)
    q = torch.softmax(torch.randn(B + 3, W - 1, V, generator=g), dim=-1)
    n = torch.tensor([3, 2, 1, 0, 3, 3, 1, 2, 3])
    together = accept(logits, prop, q, n, p)
    for b in range(B):
        alone = p.rows(b + 1)
        sub = SamplingTensors(**{k: (v[b:b + 1] if isinstance(v, torch.Tensor) else v)
                                 for k, v in vars(alone).items()})
        e, ne = accept(logits[b:b + 1], prop[b:b + 1], q[b:b + 1], n[b:b + 1], sub)
        assert torch.equal(e[0], together[0][b]) and ne[0] == together[1][b], b


def test_capturable_on_meta_tensors():
    """No .item(), no host sync, no data-dependent shape: a round runs on the meta device."""
    B, W, V = 4, 4, 128
    p = SamplingTensors.empty(B, vocab_size=V, device="meta")
    logits = torch.empty(B, W, V, device="meta")
    prop = torch.empty(B, W - 1, dtype=torch.int64, device="meta")
    n = torch.empty(B, dtype=torch.int64, device="meta")
    for probs in (None, torch.empty(B, W - 1, V, device="meta")):
        emitted, n_emitted = accept(logits, prop, probs, n, p)
        advance_accepted(p, emitted, n_emitted)
        assert emitted.shape == (B, W) and n_emitted.shape == (B,) and emitted.device.type == "meta"


def test_fullgraph_trace_without_graph_breaks():
    """Dynamo traces a whole round (acceptance + state update) as one graph: no graph breaks."""
    torch._dynamo.reset()
    fn = torch.compile(lambda *a: _round(*a), fullgraph=True, dynamic=False, backend="eager")
    B, W, V = 5, 4, 64
    g = torch.Generator().manual_seed(4)
    p1, p2 = _mixed_params(B, V), _mixed_params(B, V)
    logits = torch.randn(B, W, V, generator=g)
    prop = torch.randint(0, V, (B, W - 1), generator=g)
    q = torch.softmax(torch.randn(B, W - 1, V, generator=g), dim=-1)
    n = torch.tensor([3, 0, 2, 1, 3])
    e1, c1 = _round(logits, prop, q, n, p1)
    e2, c2 = fn(logits, prop, q, n, p2)
    assert torch.equal(e1, e2) and torch.equal(c1, c2) and torch.equal(p1.output_counts, p2.output_counts)


def _round(logits, prop, q, n, params):
    emitted, n_emitted = accept(logits, prop, q, n, params)
    advance_accepted(params, emitted, n_emitted)
    return emitted, n_emitted
