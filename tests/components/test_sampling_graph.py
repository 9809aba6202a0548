"""In-graph sampling against references written here (vLLM semantics), statistics and compilation."""

import math

import pytest
import torch

from ignition.components.sampling import (SamplingTensors, advance, apply_penalties, filter_logits, make_sampler,
                                          sample, uniform_noise)
from ignition.recipes.registry import all_recipes

# Chi-square critical values at a false-alarm rate of 1e-3 (scipy.stats.chi2.ppf(0.999, df)).
CHI2_999 = {2: 13.8155, 4: 18.4668, 15: 37.6973}


def _row(**kw):
    base = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "presence_penalty": 0.0,
            "frequency_penalty": 0.0, "repetition_penalty": 1.0, "seed": 0}
    return {**base, **kw}


def _params(rows, capacity=None, vocab_size=None, prompts=None):
    return SamplingTensors.from_resolved(rows, capacity or len(rows), vocab_size=vocab_size,
                                         prompt_token_ids=prompts)


def _kept(logits, **kw) -> set[int]:
    _, filtered = filter_logits(torch.tensor([logits], dtype=torch.float32), _params([_row(**kw)]))
    return set(torch.isfinite(filtered[0]).nonzero().flatten().tolist())


PROBS = [0.4, 0.3, 0.15, 0.1, 0.05]
LOGITS = [math.log(p) for p in PROBS]


# ----------------------------------------------------------------------------- filters on hand-built logits

def test_greedy_is_argmax():
    torch.manual_seed(0)
    logits = torch.randn(16, 300) * 4
    p = _params([_row(temperature=0.0, top_k=5, top_p=0.3, min_p=0.2, seed=i) for i in range(16)])
    assert torch.equal(sample(logits, p), logits.argmax(dim=-1))
    p.step += 7  # the random stream is irrelevant to greedy rows
    assert torch.equal(sample(logits, p), logits.argmax(dim=-1))


@pytest.mark.parametrize("kw,expected", [
    ({}, {0, 1, 2, 3, 4}),
    ({"top_k": 1}, {0}),
    ({"top_k": 2}, {0, 1}),
    ({"top_k": 99}, {0, 1, 2, 3, 4}),
    ({"top_p": 0.3}, {0}),
    ({"top_p": 0.5}, {0, 1}),
    ({"top_p": 0.75}, {0, 1, 2}),
    ({"top_p": 0.9}, {0, 1, 2, 3}),  # mass above token 3 is 0.85 < 0.9
    ({"min_p": 0.3}, {0, 1, 2}),  # p >= 0.12
    ({"min_p": 0.5}, {0, 1}),  # p >= 0.2
    ({"top_k": 2, "top_p": 0.55}, {0}),  # top-p on probabilities renormalized after top-k: 0.571 >= 0.55
    # min-p 0.2 drops only 0.05 (p >= 0.08); renormalized mass above token 2 is 0.7/0.95 = 0.737 >= 0.72
    ({"min_p": 0.2, "top_p": 0.72}, {0, 1}),
    ({"top_p": 0.72}, {0, 1, 2}),  # without min-p the mass above token 2 is 0.7 < 0.72
    ({"temperature": 4.0, "top_p": 0.6}, {0, 1, 2}),  # temperature flattens before top-p
])
def test_filters_keep_exactly_the_expected_tokens(kw, expected):
    assert _kept(LOGITS, **kw) == expected


def test_cut_boundary_ties_are_kept():
    tied = [3.0, 2.0, 2.0, 2.0, 0.0]
    assert _kept(tied, top_k=2) == {0, 1, 2, 3}
    assert _kept(tied, top_p=0.5) == {0, 1, 2, 3}  # 3.0 holds < 0.5 of the mass, the 2.0s tie


def _ref_kept(z: list[float], t: float, min_p: float, top_k: int, top_p: float) -> set[int]:
    """Straightforward float64 reference of vLLM's order: temperature, min-p, top-k, top-p."""
    z = [x / t for x in z]
    m = max(z)
    w = [math.exp(x - m) for x in z]
    keep = {v for v in range(len(z)) if w[v] / sum(w) >= min_p * max(w) / sum(w)}
    if 0 < top_k < len(keep):
        kth = sorted((z[v] for v in keep), reverse=True)[top_k - 1]
        keep = {v for v in keep if z[v] >= kth}
    if top_p < 1:
        mass = sum(w[v] for v in keep)
        above, kept = 0.0, []
        for v in sorted(keep, key=lambda v: -z[v]):
            if above < top_p:
                kept.append(v)
            above += w[v] / mass
        keep = {v for v in keep if z[v] >= min(z[v] for v in kept)}
    return keep


def test_filters_match_reference_on_random_rows():
    g = torch.Generator().manual_seed(1)
    B, V = 48, 64
    logits = torch.randn(B, V, generator=g) * 2.5
    choice = lambda xs: xs[int(torch.randint(len(xs), (1,), generator=g))]  # noqa: E731
    rows = [_row(temperature=choice([0.5, 1.0, 1.7]), min_p=choice([0.0, 0.05, 0.2]),
                 top_k=choice([0, 1, 5, 20]), top_p=choice([1.0, 0.5, 0.9]), seed=i) for i in range(B)]
    _, filtered = filter_logits(logits, _params(rows))
    for b, r in enumerate(rows):
        got = set(torch.isfinite(filtered[b]).nonzero().flatten().tolist())
        assert got == _ref_kept(logits[b].double().tolist(), r["temperature"], r["min_p"], r["top_k"], r["top_p"]), b


def test_bounded_top_k_variant_equals_full_sort():
    """``max_top_k`` swaps the full sort for topk(K); with every row's top_k in 1..K it is exact."""
    g = torch.Generator().manual_seed(4)
    B, V, K = 32, 300, 24
    logits = torch.randn(B, V, generator=g) * 3
    rows = [_row(temperature=[0.0, 0.6, 1.3][b % 3], top_k=1 + b % K, top_p=[1.0, 0.8, 0.5, 0.95][b % 4],
                 min_p=[0.0, 0.02][b % 2], presence_penalty=0.3, seed=b) for b in range(B)]
    full = SamplingTensors.from_resolved(rows, B, vocab_size=V)
    bounded = SamplingTensors.from_resolved(rows, B, vocab_size=V, max_top_k=K)
    for name in ("output_counts", "step"):
        getattr(full, name).copy_(torch.randint(3, getattr(full, name).shape, generator=g))
        getattr(bounded, name).copy_(getattr(full, name))
    assert torch.equal(filter_logits(logits, full)[1], filter_logits(logits, bounded)[1])
    assert torch.equal(sample(logits, full), sample(logits, bounded))
    with pytest.raises(ValueError, match="max_top_k"):
        SamplingTensors.from_resolved([_row(top_k=0)], 1, max_top_k=K)
    with pytest.raises(ValueError, match="max_top_k"):
        SamplingTensors.from_resolved([_row(top_k=K + 1)], 1, max_top_k=K)


# ----------------------------------------------------------------------------- penalties

def test_penalties_match_reference():
    g = torch.Generator().manual_seed(2)
    B, V = 6, 40
    logits = torch.randn(B, V, generator=g) * 3
    prompts = [torch.randint(V, (5,), generator=g).tolist() for _ in range(B)]
    rows = [_row(presence_penalty=[0.0, 0.5, -0.3, 1.5, 0.0, 2.0][b], frequency_penalty=[0.0, 0.2, 0.7, -0.4, 0.0, 1.0][b],
                 repetition_penalty=[1.0, 1.3, 0.8, 1.0, 2.0, 1.1][b], seed=b) for b in range(B)]
    p = _params(rows, vocab_size=V, prompts=prompts)
    outputs = [torch.randint(V, (int(torch.randint(12, (1,), generator=g)),), generator=g).tolist() for _ in range(B)]
    for b, out in enumerate(outputs):
        for tok in out:
            p.output_counts[b, tok] += 1
    got = apply_penalties(logits, p)
    for b, r in enumerate(rows):
        for v in range(V):
            x, count = float(logits[b, v]), outputs[b].count(v)
            if count or v in prompts[b]:  # repetition: prompt or output tokens
                x = x / r["repetition_penalty"] if x > 0 else x * r["repetition_penalty"]
            x -= r["frequency_penalty"] * count + r["presence_penalty"] * (count > 0)  # output tokens only
            assert got[b, v].item() == pytest.approx(x, rel=1e-6, abs=1e-5), (b, v)


def test_advance_counts_active_rows_only():
    V = 10
    p = _params([_row(seed=1), _row(seed=2)], capacity=4, vocab_size=V, prompts=[[1, 2], [3]])
    p.step[2] = 5  # state on an inactive row must survive
    p.output_counts[3, 4] = 9
    before = (p.output_counts.clone(), p.step.clone(), p.prompt_mask.clone())
    tokens = sample(torch.randn(4, V), p, pad_id=-7)
    assert tokens[2:].tolist() == [-7, -7] and (tokens[:2] >= 0).all()
    advance(p, tokens)
    assert torch.equal(p.output_counts[2:], before[0][2:]) and torch.equal(p.step[2:], before[1][2:])
    assert p.step[:2].tolist() == [1, 1] and torch.equal(p.prompt_mask, before[2])
    for b in range(2):
        assert p.output_counts[b].sum() == 1 and p.output_counts[b, tokens[b]] == 1


def test_make_sampler_follows_the_step_active_mask():
    V = 50
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(5))
    rows = [_row(seed=s, presence_penalty=0.5) for s in (1, 2, 3)]
    p, ref = _params(rows, vocab_size=V), _params(rows, vocab_size=V)
    hook = make_sampler(p)  # the prepared forward's (logits, active) -> tokens signature
    tokens = hook(logits, torch.tensor([True, False, True]))
    expected = sample(logits, ref)
    assert tokens[1] == -1 and tokens[0] == expected[0] and tokens[2] == expected[2]
    assert p.step.tolist() == [1, 0, 1] and p.output_counts[1].sum() == 0 and p.output_counts.sum() == 2


# ----------------------------------------------------------------------------- randomness

def test_same_seed_same_tokens_different_seed_differs():
    logits = torch.zeros(1, 1000)
    draw = lambda seed: torch.cat([sample(logits, _stepped(seed, s)) for s in range(64)])  # noqa: E731
    a, b, c = draw(123), draw(123), draw(124)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert len(set(a.flatten().tolist())) > 50  # 64 draws from 1000 uniform tokens rarely repeat
    big = draw(2**64 - 1)  # seeds are taken modulo 2**64; the top bit matters
    assert not torch.equal(big, draw(2**63 - 1))


def _stepped(seed, step):
    p = _params([_row(seed=seed)])
    p.step.fill_(step)
    return p


def test_rows_are_independent_of_their_batch():
    g = torch.Generator().manual_seed(3)
    B, V = 8, 200
    logits = torch.randn(B, V, generator=g) * 2
    rows = [_row(temperature=0.9, top_k=[0, 10][b % 2], top_p=[1.0, 0.8][b % 3 == 0], min_p=0.01, seed=1000 + b,
                 presence_penalty=0.3) for b in range(B)]
    p = _params(rows, vocab_size=V, prompts=[[b, b + 1] for b in range(B)])
    p.step.copy_(torch.arange(B) * 3)
    together = sample(logits, p)
    for b in range(B):
        alone = _params([rows[b]], vocab_size=V, prompts=[[b, b + 1]])
        alone.step.fill_(3 * b)
        assert sample(logits[b:b + 1], alone).item() == together[b].item(), b
    # Changing every other row's logits and parameters leaves row 0 alone.
    other = logits.clone()
    other[1:] = torch.randn(B - 1, V, generator=g)
    p.temperature[1:] = 0.3
    p.seed[1:] += 1
    assert sample(other, p)[0] == together[0]


def test_temperature_sampling_matches_softmax_chi_square():
    """20,000 draws (1,000 seeds x 20 steps, fixed): chi-square at a 1e-3 false-alarm rate."""
    z = torch.tensor([1.0, 0.5, 0.0, -0.5, -1.5])

    def stat(sample_temperature, expected_temperature, top_k=0):
        n_rows, n_steps = 1000, 20
        p = _params([_row(temperature=sample_temperature, top_k=top_k, seed=7000 + i) for i in range(n_rows)])
        counts = torch.zeros(5)
        for s in range(n_steps):
            p.step.fill_(s)
            counts += torch.bincount(sample(z.expand(n_rows, 5), p), minlength=5)
        probs = torch.softmax(z.double() / expected_temperature, dim=0)
        if top_k:
            assert counts[top_k:].sum() == 0
            counts, probs = counts[:top_k], probs[:top_k] / probs[:top_k].sum()
        expected = probs * n_rows * n_steps
        return float(((counts - expected) ** 2 / expected).sum())

    assert stat(0.7, 0.7) < CHI2_999[4]
    assert stat(1.3, 1.3, top_k=3) < CHI2_999[2]
    # Planted defect: a sampler that applies the temperature twice (0.7 -> 0.49) must be caught.
    assert stat(0.49, 0.7) > CHI2_999[4]


def test_uniform_noise_is_uniform_and_pairwise_independent():
    seeds = torch.arange(200, dtype=torch.int64) * 7919
    u = torch.cat([uniform_noise(seeds, torch.full((200,), s), 500) for s in range(5)])  # 500,000 values
    assert (u > 0).all() and (u < 1).all()
    n = u.numel()
    hist = torch.bincount((u * 16).long().flatten(), minlength=16).double()
    assert float(((hist - n / 16) ** 2 / (n / 16)).sum()) < CHI2_999[15]
    pairs = ((u[:, :-1] * 4).long() * 4 + (u[:, 1:] * 4).long()).flatten()  # neighbouring vocabulary ids
    m = pairs.numel()
    hist = torch.bincount(pairs, minlength=16).double()
    assert float(((hist - m / 16) ** 2 / (m / 16)).sum()) < CHI2_999[15]


# ----------------------------------------------------------------------------- construction

def test_from_resolved_fills_rows_from_every_recipe_default():
    resolved = [c.sampling.resolve({"seed": i}) for r in all_recipes() for i, c in enumerate(r.checkpoints)]
    p = SamplingTensors.from_resolved(resolved, len(resolved) + 3, vocab_size=32)
    for i, r in enumerate(resolved):
        assert p.active[i] and p.seed[i] == r["seed"] and p.top_k[i] == r["top_k"]
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            assert getattr(p, name)[i].item() == pytest.approx(r[name])
    assert not p.active[len(resolved):].any()


def test_from_resolved_rejects_and_defaults():
    with pytest.raises(ValueError, match="capacity"):
        SamplingTensors.from_resolved([_row()] * 3, 2)
    with pytest.raises(ValueError, match="top_p"):
        SamplingTensors.from_resolved([_row(top_p=0.0)], 1)
    with pytest.raises(ValueError, match="temperature"):
        SamplingTensors.from_resolved([_row(temperature=-1.0)], 1)
    with pytest.raises(ValueError, match="vocab_size"):
        SamplingTensors.from_resolved([_row(presence_penalty=0.5)], 1)
    p = SamplingTensors.from_resolved([_row(seed=None)], 1, default_seed=lambda: 2**64 - 5)
    assert p.seed.item() == -5
    p.clear_row(0)
    assert not p.active[0] and p.temperature[0] == 1.0


def test_capturable_on_meta_tensors():
    """No .item(), no host sync, no data-dependent shape: the step runs on the meta device."""
    p = SamplingTensors.empty(4, vocab_size=128, device="meta")
    p.set_row(0, _row(top_k=5, presence_penalty=0.5, seed=1), [3, 4])
    tokens = sample(torch.empty(4, 128, device="meta"), p)
    advance(p, tokens)
    assert tokens.shape == (4,) and tokens.dtype == torch.int64 and tokens.device.type == "meta"


# ----------------------------------------------------------------------------- compilation

def _step(logits, params):
    tokens = sample(logits, params)
    advance(params, tokens)
    return tokens


@pytest.fixture(scope="module")
def compiled_step():
    torch._dynamo.reset()
    return torch.compile(_step, fullgraph=True, dynamic=False)


def _batch(seed_base):
    g = torch.Generator().manual_seed(seed_base)
    B, V = 8, 512
    rows = [_row(temperature=[0.0, 0.6, 1.0, 1.4][b % 4], top_k=[0, 20][b % 2], top_p=[1.0, 0.9, 0.7][b % 3],
                 min_p=[0.0, 0.05][b % 2], presence_penalty=0.4, frequency_penalty=0.2, repetition_penalty=1.1,
                 seed=seed_base + b) for b in range(B - 2)]
    p = _params(rows, capacity=B, vocab_size=V, prompts=[[b, 2 * b, 77] for b in range(B - 2)])
    return [torch.randn(B, V, generator=g) * 3 for _ in range(6)], p


def test_compiled_equals_eager_bytewise(compiled_step):
    logits, eager_p = _batch(40)
    _, comp_p = _batch(40)
    for x in logits:
        e, c = _step(x, eager_p), compiled_step(x, comp_p)
        assert torch.equal(e, c)
    for name in ("output_counts", "step", "prompt_mask", "seed", "active"):
        assert torch.equal(getattr(eager_p, name), getattr(comp_p, name)), name


def test_compiled_step_does_not_recompile_for_new_values(compiled_step):
    logits, p = _batch(41)
    compiled_step(logits[0], p)
    logits, q = _batch(99)
    q.temperature.fill_(0.8)
    q.active[-1] = True
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled_step(logits[0], q)


@pytest.mark.parametrize("vocab", [100, 2048, 2049, 5000, 151936])
def test_two_stage_argmax_is_torch_argmax_first_maximum_included(vocab):
    from ignition.components.sampling import argmax_last

    gen = torch.Generator().manual_seed(vocab)
    x = torch.randn(4, vocab, generator=gen)
    x[1, vocab // 3] = x[1, vocab - 1] = 100.0  # a tie across blocks: the first wins
    x[2] = float("-inf")  # an all -inf row: index 0, like torch.argmax
    x[3] = torch.randint(0, 3, (vocab,), generator=gen).float()  # ties everywhere
    assert torch.equal(argmax_last(x), x.argmax(dim=-1))
    assert torch.equal(torch.compile(argmax_last)(x), x.argmax(dim=-1))
