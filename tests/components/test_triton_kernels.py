"""The Triton kernels behind the opaque ops, run by Triton's CPU interpreter (``TRITON_INTERPRET=1``) against
their PyTorch references.  Skipped where Triton is not installed (the CPU CI image has no Triton: these run
on the GPU image and wherever Triton is importable); the GPU conformance matrix runs them compiled."""

from __future__ import annotations

import os

import pytest
import torch

if torch.cuda.is_available():  # the interpreter would also take over Inductor's kernels in this process
    pytest.skip("interpreter tests run on CPU machines; the GPU matrix runs the compiled kernels",
                allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first import of triton
pytest.importorskip("triton", reason="Triton is not installed here")

from gemv_cases import _gated_input_tolerance, _gemv_inputs, _gemv_tolerance  # noqa: E402
from ignition.components.norms import rms_norm_reference  # noqa: E402


@pytest.mark.parametrize("shape", [(3, 64), (2, 5, 4, 128), (1, 1, 4096), (7, 1000)])
def test_rms_norm_triton_matches_the_reference_within_one_bf16_rounding(shape):
    from ignition.components.kernels.rms_norm import rms_norm_triton

    gen = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(shape, generator=gen) * 3).to(torch.bfloat16)
    w = (torch.rand(shape[-1], generator=gen) + 0.5).to(torch.bfloat16)
    got, ref = rms_norm_triton(x, w, 1e-6), rms_norm_reference(x, w, 1e-6)
    assert got.shape == ref.shape and got.dtype == ref.dtype and got.is_contiguous()
    # the fp32 sum order differs: the normalized value may round to the neighbouring bf16 (then the weight
    # product may too): at most 2 bf16 ulps of the result.  (Triton 3.6's interpreter converts fp32 -> bf16 by
    # truncation, not round-to-nearest-even as the GPU does, so bit identity is not asserted here.)
    ulp = 2.0 ** -7 * ref.float().abs().clamp(min=2.0 ** -126)
    assert ((got.float() - ref.float()).abs() <= 2 * ulp).all()


def test_rms_norm_triton_reads_strided_rows():
    from ignition.components.kernels.rms_norm import rms_norm_triton

    base = torch.randn(4, 3 * 128).to(torch.bfloat16)
    x = base[:, 128:256].view(4, 1, 128)  # a slice of a fused projection's output (row stride 384)
    w = torch.ones(128, dtype=torch.bfloat16)
    assert torch.equal(rms_norm_triton(x, w, 1e-6), rms_norm_triton(x.contiguous(), w, 1e-6))


# ---------------------------------------------------------------------------------------- fused GEMV (decode)

_GEMV_CASES = [  # (M, N weight rows, K, norm, gated, residual)
    (1, 2048, 1024, False, False, False),
    (3, 1024, 2048, False, False, False),
    (4, 1000, 64, False, False, False),
    (8, 1000, 64, False, False, False),
    (1, 1024, 2048, True, False, False),
    (4, 1000, 64, True, False, False),
    (8, 256, 1024, True, False, False),
    (1, 2048, 1024, False, True, False),
    (3, 2000, 64, False, True, False),
    (8, 512, 1024, False, True, False),
    (4, 2048, 1024, False, False, True),
    (3, 1000, 64, False, False, True),
    (4, 2000, 64, True, True, False),
    (1, 2048, 1024, True, True, False),
    (8, 256, 192, True, True, True),  # K not a multiple of BK: masked tail
    (17, 96, 64, True, False, True),  # more rows than one program holds: two row blocks
]


@pytest.mark.parametrize("m,n,k,norm,gated,residual", _GEMV_CASES)
def test_fused_linear_triton_matches_the_reference(m, n, k, norm, gated, residual):
    from ignition.components.fused_linear import fused_linear_reference
    from ignition.components.kernels.linear import fused_linear_triton

    x, w, nw, r = _gemv_inputs(m, n, k, norm=norm, gated=gated, residual=residual, seed=m * 7 + n + k)
    # The interpreter costs ~15 ms per program: wide outputs run with BN=32 (a quarter of the heuristic's
    # programs); the narrower cases -- and (4, 1000, 64) -- run the heuristic's own config.
    n_out = n // 2 if gated else n
    cfg = {"BN": 32} if n_out >= 1000 and (m, n, k) != (4, 1000, 64) else None
    got = fused_linear_triton(x, w, norm_weight=nw, eps=1e-6, residual=r, gated=gated, config=cfg)
    ref = fused_linear_reference(x, w, nw, 1e-6, r, gated)
    assert got.shape == ref.shape == (m, n // 2 if gated else n) and got.dtype == torch.bfloat16
    tol = _gemv_tolerance(x, w, nw, gated, ref)
    if r is not None:  # bf16(r + y): y's error, plus the final rounding may step one ulp of the sum
        y_ref = fused_linear_reference(x, w, nw, 1e-6, None, gated)
        tol = _gemv_tolerance(x, w, nw, gated, y_ref) + 2 * 2.0 ** -7 * ref.float().abs()
    err = (got.float() - ref.float()).abs()
    assert (err <= tol).all(), f"max excess {(err - tol).max().item()}"


def _narrow_measured_configs():
    """The measured one-row configs whose programs hold fewer than 4 output rows (the heuristic never picks those),
    of every card model's table (``none``: :data:`GEMV_MEASURED` alone), each config once."""
    from ignition.components.kernels.linear import GEMV_MEASURED_BY_CARD, gemv_measured

    out, seen = [], set()
    for card in ["none", *GEMV_MEASURED_BY_CARD]:
        for key, entry in gemv_measured(card).items():
            if key[0] == 1 and entry[0] < 4 and (key, entry) not in seen:
                seen.add((key, entry))
                out.append((card, *key))
    return out


@pytest.mark.parametrize("card,m,n,k,gated", _narrow_measured_configs())
def test_narrow_measured_gemv_configs_match_the_reference(monkeypatch, card, m, n, k, gated):
    """A measured one-row launch of 1- or 2-row programs (``GEMV_MEASURED``: Qwen3-8B's qkv, its gated gate/up; and
    each card model's own, ``GEMV_MEASURED_BY_CARD``), its exact config -- the whole K preloaded, the norm prologue as
    the step launches them -- on the first 64 output rows of the shape (the interpreter's cost is per program): within
    the reference's bound."""
    from ignition.components.fused_linear import fused_linear_reference
    from ignition.components.kernels.linear import fused_linear_triton, gemv_config, gemv_measured

    monkeypatch.setenv("FLARE_GEMV_CARD", card)
    cfg = gemv_config(m, n, k, gated)
    assert tuple(cfg.values()) == gemv_measured(card)[(m, n, k, gated)]
    x, w, nw, _ = _gemv_inputs(m, 64, k, norm=True, gated=gated, residual=False, seed=n + k)
    got = fused_linear_triton(x, w, norm_weight=nw, eps=1e-6, gated=gated, config=cfg)
    ref = fused_linear_reference(x, w, nw, 1e-6, None, gated)
    assert got.shape == ref.shape == (1, 32 if gated else 64)
    err = (got.float() - ref.float()).abs()
    tol = _gemv_tolerance(x, w, nw, gated, ref)
    assert (err <= tol).all(), f"{cfg}: max excess {(err - tol).max().item()}"


@pytest.mark.parametrize("m,n,k,residual", [(1, 1024, 2048, True), (4, 1000, 64, False), (3, 256, 192, True)])
def test_fused_linear_triton_gated_input_matches_the_reference(m, n, k, residual):
    """x = gate/up's packed output [M, 2K]; the kernel's prologue forms bf16(bf16(silu(gate)) * up).  Its bf16
    input may differ from the reference's by an ulp (exp, and the interpreter's truncation), which perturbs the sum
    like the norm prologue's: the same bound (``reorder_bound(norm=True)`` on the reference activation)."""
    import torch.nn.functional as F

    from ignition.components.fused_linear import fused_linear_reference
    from ignition.components.kernels.linear import fused_linear_triton

    gen = torch.Generator().manual_seed(m + n + k)
    x = (torch.randn(m, 2 * k, generator=gen) * 2).to(torch.bfloat16)
    w = (torch.randn(n, k, generator=gen) / k ** 0.5).to(torch.bfloat16)
    r = torch.randn(m, n, generator=gen).to(torch.bfloat16) if residual else None
    got = fused_linear_triton(x, w, residual=r, gated_input=True, config={"BN": 32} if n >= 1000 else None)
    ref = fused_linear_reference(x, w, None, 0.0, r, False, True)
    y = fused_linear_reference(F.silu(x[:, :k]) * x[:, k:], w)
    tol = _gated_input_tolerance(x, w, y)
    if r is not None:
        tol = tol + 2 * 2.0 ** -7 * ref.float().abs()
    err = (got.float() - ref.float()).abs()
    assert (err <= tol).all(), f"max excess {(err - tol).max().item()}"


@pytest.mark.parametrize("cfg", [{"BN": 4, "BK": 64}, {"BN": 16, "BK": 256}, {"BN": 32, "BK": 128, "num_warps": 8}])
def test_fused_linear_triton_configs_are_deterministic(cfg):
    from ignition.components.kernels.linear import fused_linear_triton

    x, w, nw, r = _gemv_inputs(3, 128, 256, norm=True, gated=True, residual=True, seed=5)
    a = fused_linear_triton(x, w, norm_weight=nw, eps=1e-6, residual=r, gated=True, config=cfg)
    b = fused_linear_triton(x.clone(), w.clone(), norm_weight=nw.clone(), eps=1e-6, residual=r.clone(), gated=True,
                            config=cfg)
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("tiles", [1, 2, 4])
def test_fused_linear_triton_preloaded_tiles_change_no_bit(monkeypatch, tiles):
    """``FLARE_GEMV_PRELOAD``: a one-row plain GEMV loads its first weight tiles before its wait and multiplies them
    first -- the same accumulation order, so the same bits as without (and within the reference's bound); with
    ``FLARE_GEMV_PRELOAD_PROLOGUE=0`` a GEMV with a prologue keeps none, nor does one of more rows or a ragged K."""
    from ignition.components.fused_linear import fused_linear_reference
    from ignition.components.kernels.linear import fused_linear_triton, gemv_preload_tiles

    x, w, _, r = _gemv_inputs(1, 64, 512, norm=False, gated=False, residual=True, seed=tiles)
    cfg = {"BN": 32, "BK": 128}  # 4 tiles of K
    monkeypatch.setenv("FLARE_GEMV_PRELOAD", "0")
    plain = fused_linear_triton(x, w, residual=r, config=cfg)
    monkeypatch.setenv("FLARE_GEMV_PRELOAD", str(tiles))
    assert gemv_preload_tiles(1, 512, 128, True) == tiles
    # a prologue: by default only when the tiles are the whole K (4 tiles here), forced on or off by the switch
    assert gemv_preload_tiles(1, 512, 128, False) == (4 if tiles == 4 else 0)
    monkeypatch.setenv("FLARE_GEMV_PRELOAD_PROLOGUE", "1")
    assert gemv_preload_tiles(1, 512, 128, False) == tiles
    monkeypatch.setenv("FLARE_GEMV_PRELOAD_PROLOGUE", "0")
    assert gemv_preload_tiles(1, 512, 128, False) == gemv_preload_tiles(2, 512, 128, True) == 0
    assert gemv_preload_tiles(1, 500, 128, True) == 0 and gemv_preload_tiles(1, 256, 128, True) == min(tiles, 2)
    got = fused_linear_triton(x, w, residual=r, config=cfg)
    assert torch.equal(got.view(torch.int16), plain.view(torch.int16))
    ref = fused_linear_reference(x, w, None, 0.0, r, False)
    y_ref = fused_linear_reference(x, w)
    tol = _gemv_tolerance(x, w, None, False, y_ref) + 2 * 2.0 ** -7 * ref.float().abs()
    assert ((got.float() - ref.float()).abs() <= tol).all()


def test_one_row_gemv_accumulator_shape_follows_the_preload_and_the_switches(monkeypatch):
    """``gemv_flat``: the 2-D accumulator for one row whose whole K is preloaded (``FLARE_GEMV_FLAT``, default on),
    or whose streamed tiles are pipelined (``FLARE_GEMV_STREAM_STAGES``, default 0); never for more rows; both
    accumulators within the reference's bound, a whole-K preload and a pipelined stream alike."""
    from ignition.components.fused_linear import fused_linear_reference
    from ignition.components.kernels.linear import fused_linear_triton, gemv_flat

    assert gemv_flat(1, 512, 128, 4) == (True, 0) and gemv_flat(1, 512, 128, 2) == (False, 0)
    assert gemv_flat(2, 512, 128, 4) == (False, 0)
    monkeypatch.setenv("FLARE_GEMV_STREAM_STAGES", "3")
    assert gemv_flat(1, 512, 128, 2) == (True, 3) and gemv_flat(1, 512, 128, 0) == (True, 3)
    assert gemv_flat(4, 512, 128, 0) == (False, 0)
    monkeypatch.setenv("FLARE_GEMV_FLAT", "0")
    assert gemv_flat(1, 512, 128, 4) == (False, 0) and gemv_flat(1, 512, 128, 2) == (True, 3)
    monkeypatch.setenv("FLARE_GEMV_STREAM_STAGES", "-1")
    with pytest.raises(ValueError, match="FLARE_GEMV_STREAM_STAGES"):
        gemv_flat(1, 512, 128, 0)

    x, w, nw, r = _gemv_inputs(1, 64, 512, norm=True, gated=False, residual=True, seed=11)
    ref = fused_linear_reference(x, w, nw, 1e-6, r, False)
    tol = (_gemv_tolerance(x, w, nw, False, fused_linear_reference(x, w, nw, 1e-6, None, False))
           + 2 * 2.0 ** -7 * ref.float().abs())
    monkeypatch.setenv("FLARE_GEMV_PRELOAD_PROLOGUE", "1")
    for flat, stages, cfg in (("1", "0", {"BN": 32, "BK": 128}),  # whole K preloaded (norm: 4 tiles = K)
                              ("0", "0", {"BN": 32, "BK": 128}),
                              ("1", "2", {"BN": 32, "BK": 64})):  # 8 tiles: 4 preloaded at most, the rest streamed
        monkeypatch.setenv("FLARE_GEMV_FLAT", flat)
        monkeypatch.setenv("FLARE_GEMV_STREAM_STAGES", stages)
        got = fused_linear_triton(x, w, norm_weight=nw, eps=1e-6, residual=r, config=cfg)
        assert ((got.float() - ref.float()).abs() <= tol).all(), (flat, stages)


@pytest.mark.parametrize("m,n,k,preload,stages", [(1, 64, 512, "0", "0"),  # Qwen3-8B's one-row down: every tile streamed
                                                   (1, 64, 512, "2", "0"),  # two tiles preloaded, two streamed
                                                   (1, 48, 500, "0", "0"),  # a ragged K: the last tile masked
                                                   (3, 64, 384, "0", "0"),  # three rows: the 3-D accumulator
                                                   (1, 64, 512, "0", "2")])  # the pipelined stream (2-D)
def test_gemv_input_one_tile_ahead_changes_no_bit(monkeypatch, m, n, k, preload, stages):
    """``FLARE_GEMV_X_AHEAD=1`` (:data:`linear.GEMV_X_AHEAD`): the streamed loop takes each input tile the previous
    iteration loaded -- the same tiles, values and order, so the same bits as without, within the reference's bound;
    a launch with a prologue (norm, gated input) keeps its own loop, bit for bit, with the switch on."""
    from ignition.components.fused_linear import fused_linear_reference
    from ignition.components.kernels.linear import fused_linear_triton

    x, w, nw, r = _gemv_inputs(m, n, k, norm=True, gated=False, residual=True, seed=m + k)
    cfg = {"BN": 16, "BK": 128}
    monkeypatch.setenv("FLARE_GEMV_PRELOAD", preload)
    monkeypatch.setenv("FLARE_GEMV_STREAM_STAGES", stages)
    launches, outs = _record_launches(monkeypatch), {}
    for ahead in ("0", "1"):
        monkeypatch.setenv("FLARE_GEMV_X_AHEAD", ahead)
        outs[ahead] = (fused_linear_triton(x, w, residual=r, config=cfg, dot=False),  # (3 rows: not tensor cores)
                       fused_linear_triton(x, w, norm_weight=nw, eps=1e-6, residual=r, config=cfg, dot=False),
                       fused_linear_triton(torch.cat([x, x.flip(-1)], dim=-1), w, residual=r, gated_input=True,
                                           config=cfg, dot=False))
    assert [kw["X_AHEAD"] for _, kw in launches] == [False] * 3 + [True, False, False]  # the plain input's only
    for a, b in zip(outs["0"], outs["1"]):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    ref = fused_linear_reference(x, w, None, 0.0, r, False)
    tol = _gemv_tolerance(x, w, None, False, fused_linear_reference(x, w)) + 2 * 2.0 ** -7 * ref.float().abs()
    assert ((outs["1"][0].float() - ref.float()).abs() <= tol).all()


@pytest.mark.parametrize("norm,gated,gated_input", [(True, False, False), (True, True, False), (False, False, True)])
def test_fused_linear_triton_preload_with_a_prologue_changes_no_bit(monkeypatch, norm, gated, gated_input):
    """The GEMVs with the norm prologue, a gated output or the gated input preload too where the tiles are their whole
    K (``FLARE_GEMV_PRELOAD_PROLOGUE``: 1 forces it, 0 never), and multiply the preloaded tiles with the loop's own
    input tiles: the same bits as without -- whole K (the default) and a partial preload (forced)."""
    from ignition.components.kernels.linear import fused_linear_triton, gemv_preload_tiles

    k = 384
    x, w, nw, r = _gemv_inputs(1, 64, k, norm=norm, gated=gated, residual=gated_input, seed=3)
    if gated_input:
        x = torch.cat([x, x.flip(-1)], dim=-1)  # [gate; up]
    cfg = {"BN": 16, "BK": 128}  # 3 tiles of K
    run = lambda: fused_linear_triton(x, w, norm_weight=nw, eps=1e-6, residual=r, gated=gated,  # noqa: E731
                                      gated_input=gated_input, config=cfg)
    monkeypatch.setenv("FLARE_GEMV_PRELOAD", "4")
    monkeypatch.setenv("FLARE_GEMV_PRELOAD_PROLOGUE", "0")
    assert gemv_preload_tiles(1, k, 128, False) == 0
    plain = run()
    monkeypatch.delenv("FLARE_GEMV_PRELOAD_PROLOGUE")
    assert gemv_preload_tiles(1, k, 128, False) == 3  # the default: 3 tiles are the whole K
    assert torch.equal(run().view(torch.int16), plain.view(torch.int16))
    monkeypatch.setenv("FLARE_GEMV_X_FIRST", "0")  # the inputs (and the row statistics) loaded per tile: same bits
    assert torch.equal(run().view(torch.int16), plain.view(torch.int16))
    monkeypatch.delenv("FLARE_GEMV_X_FIRST")
    monkeypatch.setenv("FLARE_GEMV_PRELOAD", "2")
    assert gemv_preload_tiles(1, k, 128, False) == 0  # 2 of 3 tiles: not by default
    monkeypatch.setenv("FLARE_GEMV_PRELOAD_PROLOGUE", "1")
    assert gemv_preload_tiles(1, k, 128, False) == 2
    assert torch.equal(run().view(torch.int16), plain.view(torch.int16))


def _mlp_inputs(hidden, inter, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(1, hidden, generator=gen) * 2).to(torch.bfloat16)
    wgu = (torch.randn(2 * inter, hidden, generator=gen) / hidden ** 0.5).to(torch.bfloat16)
    wd = (torch.randn(hidden, inter, generator=gen) / inter ** 0.5).to(torch.bfloat16)
    nw = (torch.rand(hidden, generator=gen) + 0.5).to(torch.bfloat16)
    r = torch.randn(1, hidden, generator=gen).to(torch.bfloat16)
    return x, wgu, wd, nw, r


@pytest.mark.parametrize("gated", [False, True])
def test_gemv_handoff_changes_no_bit_and_leaves_its_counts_at_zero(monkeypatch, gated):
    """The one-row MLP handoff (gate/up counting its finished activation tiles, down taking each tile once complete),
    packed (into down's gated input) or gated (its SiLU product into a plain down that preloads nothing): the same
    bits as the two launches without it, the device's counts back at zero after each pair, the canonical MLP within
    the gated-input bound; a consumer with no producer before it, or of the other form, raises, as does a producer at
    a config the consumer would not expect or at more than one row."""
    import torch.nn.functional as F

    from ignition.components.kernels import linear

    hidden, inter = 64, 2048  # the heuristic configs: gate/up 8 (gated: 4) -column blocks, down 1024-column tiles
    # down would preload its 2 tiles by default (their inputs read before any poll): not a consumer until named 0
    assert not linear.gemv_handoff_fits(hidden, inter, gated)
    monkeypatch.setenv("FLARE_GEMV_CONFIG", "1x64x2048=4/1024/8/2/0")
    assert linear.gemv_handoff_fits(hidden, inter, gated)
    assert linear.gemv_config(1, hidden, inter)["BK"] == 1024  # 2 tiles of the activation
    x, wgu, wd, nw, r = _mlp_inputs(hidden, inter, 5)

    producer, consumer = linear.HANDOFF_PRODUCER, linear.HANDOFF_CONSUMER

    def mlp(handoff):
        gu = linear.fused_linear_triton(x, wgu, norm_weight=nw, eps=1e-6, gated=gated, early=True,
                                        handoff=producer * handoff)
        return linear.fused_linear_triton(gu, wd, residual=r, gated_input=not gated, early=True,
                                          handoff=consumer * handoff), gu

    (plain, gu), (got, gu2) = mlp(False), mlp(True)
    assert torch.equal(gu2.view(torch.int16), gu.view(torch.int16))
    assert torch.equal(got.view(torch.int16), plain.view(torch.int16))
    flags = linear._HANDOFF_FLAGS[("cpu", -1)]
    assert not flags.any() and not linear._HANDOFF_PENDING
    again, _ = mlp(True)
    assert torch.equal(again.view(torch.int16), plain.view(torch.int16)) and not flags.any()
    if gated:  # the canonical MLP from the packed launch's gate and up (the gated launch sums them in its own order)
        gu = linear.fused_linear_triton(x, wgu, norm_weight=nw, eps=1e-6)
    y = F.linear(F.silu(gu[:, :inter]) * gu[:, inter:], wd)
    slack = (4 if gated else 2) * 2.0 ** -7 * y.abs()
    assert ((got.float() - (r + y).float()).abs() <= _gated_input_tolerance(gu, wd, y) + slack).all()
    act = gu2 if gated else gu
    with pytest.raises(ValueError, match="without its producer"):
        linear.fused_linear_triton(act, wd, residual=r, gated_input=not gated, handoff=consumer)
    linear.fused_linear_triton(x, wgu, norm_weight=nw, eps=1e-6, gated=gated, handoff=producer)
    # the producer alone: each activation tile counted exactly the consumer's target (a target above the count would
    # poll until the trap on a GPU; below it, read tiles still being stored), the consumer's ticket untouched
    spec = linear.gemv_handoff_constexprs(hidden, inter, consumer=True, gated=gated)
    tiles = spec["FLAG_TILES"]
    assert flags[:tiles].tolist() == [spec["FLAG_TARGET"]] * tiles and not flags[tiles:].any()
    other = torch.cat([act, act], dim=-1) if gated else act[:, :inter].contiguous()
    with pytest.raises(ValueError, match="input after a"):  # the other form's consumer
        linear.fused_linear_triton(other, wd, residual=r, gated_input=gated, handoff=consumer)
    assert not flags.any() and not linear._HANDOFF_PENDING
    with pytest.raises(ValueError, match="table configs"):
        linear.fused_linear_triton(x, wgu, norm_weight=nw, eps=1e-6, gated=gated, handoff=producer, config={"BN": 8})
    with pytest.raises(ValueError, match="table configs"):
        linear.fused_linear_triton(x.expand(2, -1).contiguous(), wgu, norm_weight=nw, eps=1e-6, gated=gated,
                                   handoff=producer, dot=False)
    assert not linear._HANDOFF_PENDING


_DOT_CASES = [  # (M, N weight rows, K, norm, gated, residual, gated input)
    (2, 96, 256, False, False, True, False),
    (4, 64, 192, True, False, False, False),  # K not a multiple of BK: masked tail
    (4, 128, 128, True, True, False, False),
    (8, 48, 128, False, False, True, True),
    (16, 64, 256, False, False, False, False),
    (3, 40, 64, True, False, True, False),  # N not a multiple of BN
    (1, 48, 192, False, False, True, False),  # one row (``uses_dot_one_row``: a long K's plain, ungated launch)
]


@pytest.mark.parametrize("m,n,k,norm,gated,residual,gated_input", _DOT_CASES)
def test_tensor_core_variant_matches_the_reference(monkeypatch, m, n, k, norm, gated, residual, gated_input):
    """The tensor-core variant, forced (``dot=True``: every prologue and epilogue it has): 2..16 rows through
    ``tl.dot`` (fp32 products of the bf16 values in the interpreter, as the MMA's are exact) -- within the
    elementwise kernel's bound, and the same bits on a second launch."""
    from ignition.components.fused_linear import fused_linear_reference
    from ignition.components.kernels.linear import fused_linear_triton

    x, w, nw, r = _gemv_inputs(m, n, k, norm=norm, gated=gated, residual=residual, seed=m + n + k)
    if gated_input:
        x = torch.cat([x, x.flip(-1)], dim=-1)
    cfg = {"BN": 16, "BK": 64}
    got = fused_linear_triton(x, w, norm_weight=nw, eps=1e-6, residual=r, gated=gated, gated_input=gated_input,
                              config=cfg, dot=True)
    again = fused_linear_triton(x, w, norm_weight=nw, eps=1e-6, residual=r, gated=gated, gated_input=gated_input,
                                config=cfg, dot=True)
    assert torch.equal(got.view(torch.int16), again.view(torch.int16))
    ref = fused_linear_reference(x, w, nw, 1e-6, r, gated, gated_input)
    y_ref = fused_linear_reference(x, w, nw, 1e-6, None, gated, gated_input)
    if gated_input:
        tol = _gated_input_tolerance(x, w, y_ref)
    else:
        tol = _gemv_tolerance(x, w, nw, gated, y_ref)
    if residual:
        tol = tol + 2 * 2.0 ** -7 * ref.float().abs()
    err = (got.float() - ref.float()).abs()
    assert got.shape == ref.shape and (err <= tol).all(), f"max excess {(err - tol).max().item()}"
    if norm:  # the norm prologue's pipelined row statistics and tiled norm weights: the plain loops' bits
        from ignition.components.kernels import linear

        monkeypatch.setattr(linear, "GEMM_ROWS_NORM_STAGES", 0)
        plain = fused_linear_triton(x, w, norm_weight=nw, eps=1e-6, residual=r, gated=gated, config=cfg, dot=True)
        assert torch.equal(plain.view(torch.int16), got.view(torch.int16))


@pytest.mark.parametrize("m,n,k,n1,gated", [(4, 96, 64, 64, True), (3, 40, 64, 48, False), (16, 64, 128, 32, True)])
def test_published_norm_feeds_the_next_launch(m, n, k, n1, gated):
    """``publish_norm`` (``GEMM_ROWS_PRENORM``): the tensor-core launch's output is the same bits with or without
    publishing; its ``xw`` is ``bf16(norm_weight * out)`` (one rounding) and its statistics each column block's sum of
    squares of the stored output (fp64 reference); the next launch on them (``norm_stats``) is within the reference's
    bound of the canonical norm + projection (two producer configs: blocks of 16 and 32 columns, N not a multiple of
    one), and it reads them: four times the sums halve rstd, so a linear output halves."""
    from ignition.components.fused_linear import fused_linear_reference
    from ignition.components.kernels.linear import fused_linear_triton

    x, w, _, r = _gemv_inputs(m, n, k, norm=False, gated=False, residual=True, seed=m + n)
    _, w1, nw, _ = _gemv_inputs(m, 2 * n1 if gated else n1, n, norm=True, gated=gated, residual=False, seed=n1)
    for bn in (16, 32):
        cfg = {"BN": bn, "BK": 64}
        out, xw, stats = fused_linear_triton(x, w, residual=r, config=cfg, dot=True, publish_norm=nw)
        plain = fused_linear_triton(x, w, residual=r, config=cfg, dot=True)
        assert torch.equal(out.view(torch.int16), plain.view(torch.int16))
        want = nw.float() * out.float()  # rounded once to bf16 (the interpreter truncates: within one ulp)
        assert xw.dtype == torch.bfloat16 and ((xw.float() - want).abs() <= 2.0 ** -7 * want.abs()).all()
        parts = -(-n // bn)
        assert stats.shape == (m, parts) and stats.dtype == torch.float32
        blocks = torch.nn.functional.pad(out.double(), (0, parts * bn - n)).view(m, parts, bn)
        assert torch.allclose(stats.double(), (blocks * blocks).sum(dim=-1), rtol=2.0 ** -20, atol=0.0)
        cfg1 = {"BN": 16, "BK": 64}
        got = fused_linear_triton(xw, w1, eps=1e-6, gated=gated, norm_stats=stats, config=cfg1, dot=True)
        ref = fused_linear_reference(out, w1, nw, 1e-6, None, gated)
        err = (got.float() - ref.float()).abs()
        tol = _gemv_tolerance(out, w1, nw, gated, ref)
        assert got.shape == ref.shape and (err <= tol).all(), f"max excess {(err - tol).max().item()}"
        if not gated:
            half = fused_linear_triton(xw, w1, eps=1e-6, norm_stats=stats * 4, config=cfg1, dot=True)
            assert ((half.float() - ref.float() / 2).abs() <= tol / 2).all()
            assert not torch.equal(half, got)


@pytest.mark.parametrize("rows,n,parts", [(4, 96, 6), (3, 40, 3), (1, 64, 1)])
def test_published_norm_of_an_input_no_launch_wrote(rows, n, parts):
    """``published_norm_triton`` (the first layer's, from the embeddings): the pair a publishing launch writes --
    ``bf16(nw * h)`` within the interpreter's truncation of one rounding and each column block's sum of squares (fp64
    reference), blocks of ``cdiv(N, parts)`` with a short last one; the CPU op computes the same."""
    from ignition.components.fused_linear import published_norm_op
    from ignition.components.kernels.linear import published_norm_triton

    gen = torch.Generator().manual_seed(rows + n)
    h = (torch.randn(rows, n, generator=gen) * 3).to(torch.bfloat16)
    nw = (torch.rand(n, generator=gen) + 0.5).to(torch.bfloat16)
    xw, stats = published_norm_triton(h, nw, parts)
    want = nw.float() * h.float()
    assert xw.dtype == torch.bfloat16 and ((xw.float() - want).abs() <= 2.0 ** -7 * want.abs()).all()
    width = -(-n // parts)
    blocks = torch.nn.functional.pad(h.double(), (0, parts * width - n)).view(rows, parts, width)
    assert stats.shape == (rows, parts)
    assert torch.allclose(stats.double(), (blocks * blocks).sum(dim=-1), rtol=2.0 ** -20, atol=0.0)
    cxw, cstats = published_norm_op(h, nw, parts)
    assert torch.equal(cxw, want.to(torch.bfloat16))
    assert torch.allclose(cstats.double(), stats.double(), rtol=2.0 ** -20, atol=0.0)


def test_tensor_core_residual_first_changes_no_bit(monkeypatch):
    """``FLARE_GEMM_ROWS_RES_FIRST=1`` (``GEMM_ROWS_RES_FIRST``): the residual tile loaded before the main loop instead
    of after it -- the same values, the same bits, with and without a published norm."""
    from ignition.components.kernels.linear import fused_linear_triton

    x, w, nw, r = _gemv_inputs(4, 96, 128, norm=True, gated=False, residual=True, seed=11)
    cfg = {"BN": 16, "BK": 64}
    outs = []
    for first in ("0", "1"):
        monkeypatch.setenv("FLARE_GEMM_ROWS_RES_FIRST", first)
        outs.append((fused_linear_triton(x, w, residual=r, config=cfg, dot=True),
                     *fused_linear_triton(x, w, residual=r, config=cfg, dot=True, publish_norm=nw[:96])))
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_published_norm_arguments_are_checked():
    """The published norm names what is wrong: the tensor-core kernel's only; the producer ungated with weights of its
    output width; the consumer's statistics fp32 rows of x and no second norm."""
    from ignition.components.kernels.linear import fused_linear_triton

    x, w, nw, _ = _gemv_inputs(4, 32, 64, norm=True, gated=False, residual=False, seed=5)
    stats = torch.ones(4, 2)
    with pytest.raises(ValueError, match="norm_stats"):
        fused_linear_triton(x, w, norm_weight=nw, norm_stats=stats, dot=True)
    with pytest.raises(ValueError, match="norm_stats"):
        fused_linear_triton(x, w, norm_stats=torch.ones(3, 2), dot=True)
    with pytest.raises(ValueError, match="norm_stats"):
        fused_linear_triton(x, w, norm_stats=stats.double(), dot=True)
    with pytest.raises(ValueError, match="one-row kernel"):
        fused_linear_triton(x[:1], w, publish_norm=torch.ones(32, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="one-row kernel"):
        fused_linear_triton(x, w, norm_stats=stats, dot=False)
    with pytest.raises(ValueError, match="publish_norm"):
        fused_linear_triton(x, w, publish_norm=torch.ones(31, dtype=torch.bfloat16), dot=True)


def test_tensor_core_variant_takes_plain_input_only_and_is_bounded(monkeypatch):
    """The tensor-core kernel (default; ``FLARE_GEMV_DOT=0`` turns it off) takes 2..16 rows of plain-input, ungated
    projections only -- the launches that beat cuBLAS in run 23; the narrow few-row rule and one row are unchanged."""
    from ignition.components.fused_linear import prefers_fused, uses_dot_kernel
    from ignition.components.kernels.linear import fused_linear_triton, gemm_rows_config

    wide, gated_w, narrow = torch.zeros(4096, 8), torch.zeros(2 * 12288, 8), torch.zeros(1024, 8)
    monkeypatch.setenv("FLARE_GEMV_DOT", "0")
    assert not uses_dot_kernel(4) and not prefers_fused(4, wide, False) and prefers_fused(4, narrow, False)
    monkeypatch.delenv("FLARE_GEMV_DOT")
    assert uses_dot_kernel(4) and uses_dot_kernel(16) and not uses_dot_kernel(1) and not uses_dot_kernel(17)
    assert not uses_dot_kernel(4, prologue=True) and uses_dot_kernel(4, gated=True)  # gated output: GEMM_ROWS_GATED
    assert prefers_fused(4, wide, False) and prefers_fused(8, wide, False)  # o_proj, down after the activation
    assert not prefers_fused(4, wide, False, prologue=True)  # qkv
    assert prefers_fused(4, narrow, False, prologue=True)  # the CUDA-core few-row rule, prologue or not
    # behind a norm only with GEMM_ROWS_NORM (FLARE_GEMM_ROWS_NORM=1); never with the gated input
    assert not uses_dot_kernel(4, prologue=True, norm=True) and not prefers_fused(4, wide, False, prologue=True,
                                                                                    norm=True)
    monkeypatch.setenv("FLARE_GEMM_ROWS_NORM", "1")
    assert uses_dot_kernel(4, prologue=True, norm=True) and prefers_fused(4, wide, False, prologue=True, norm=True)
    assert not uses_dot_kernel(4, prologue=True) and not uses_dot_kernel(1, prologue=True, norm=True)
    assert uses_dot_kernel(4, gated=True, prologue=True, norm=True)  # the gated gate/up's norm too (GEMM_ROWS_GATED)
    monkeypatch.setenv("FLARE_GEMM_ROWS_GATED", "0")
    assert not uses_dot_kernel(4, gated=True, prologue=True, norm=True)
    monkeypatch.delenv("FLARE_GEMM_ROWS_GATED")
    monkeypatch.delenv("FLARE_GEMM_ROWS_NORM")
    # the gated input (a prologue without a norm) only with GEMM_ROWS_GATED_IN (FLARE_GEMM_ROWS_GATED_IN=1): then
    # Qwen3-8B's down at 4 rows behind cuBLAS's packed gate/up is one tensor-core launch; a gated output only with
    # GEMM_ROWS_GATED
    monkeypatch.setenv("FLARE_GEMM_ROWS_GATED_IN", "1")
    assert uses_dot_kernel(4, prologue=True) and prefers_fused(4, wide, False, prologue=True)
    assert not uses_dot_kernel(4, prologue=True, norm=True) and not uses_dot_kernel(1, prologue=True)
    monkeypatch.setenv("FLARE_GEMM_ROWS_GATED", "0")  # a gated output only with GEMM_ROWS_GATED
    assert not uses_dot_kernel(4, gated=True, prologue=True)
    monkeypatch.delenv("FLARE_GEMM_ROWS_GATED")
    monkeypatch.delenv("FLARE_GEMM_ROWS_GATED_IN")
    # a gated output (SiLU gate in the epilogue) only with GEMM_ROWS_GATED (default on; FLARE_GEMM_ROWS_GATED=0 turns
    # it off), plain input only
    monkeypatch.setenv("FLARE_GEMM_ROWS_GATED", "0")
    assert not uses_dot_kernel(4, gated=True) and not prefers_fused(8, gated_w, True)
    monkeypatch.setenv("FLARE_GEMM_ROWS_GATED", "1")
    assert uses_dot_kernel(4, gated=True) and not uses_dot_kernel(1, gated=True)
    # ... for gated weights of at least GEMM_ROWS_GATED_MIN_ELEMENTS (2^26): Qwen3-8B's gate/up, not Qwen3-0.6B's
    assert uses_dot_kernel(8, gated=True, elements=24576 * 4096) and not uses_dot_kernel(8, gated=True,
                                                                                         elements=6144 * 1024)
    assert not prefers_fused(8, gated_w, True)  # 24576 x 8: below the bound
    monkeypatch.setenv("FLARE_GEMM_ROWS_GATED_MIN_ELEMENTS", "0")
    assert prefers_fused(8, gated_w, True) and uses_dot_kernel(8, gated=True, elements=6144 * 1024)
    assert not uses_dot_kernel(4, gated=True, prologue=True, norm=True) and not prefers_fused(4, gated_w, True,
                                                                                              prologue=True, norm=True)
    monkeypatch.delenv("FLARE_GEMM_ROWS_GATED_MIN_ELEMENTS")
    monkeypatch.delenv("FLARE_GEMM_ROWS_GATED")
    from ignition.components.kernels.linear import GEMV_PREFETCH_TILES, gemm_rows_prefetch_tiles

    assert gemm_rows_prefetch_tiles() == GEMV_PREFETCH_TILES == 2  # L2 prefetch before the wait: side-by-side switch
    monkeypatch.setenv("FLARE_GEMM_ROWS_PREFETCH", "8")
    assert gemm_rows_prefetch_tiles() == 8
    monkeypatch.setenv("FLARE_GEMM_ROWS_PREFETCH", "-1")
    with pytest.raises(ValueError, match="FLARE_GEMM_ROWS_PREFETCH"):
        gemm_rows_prefetch_tiles()
    monkeypatch.delenv("FLARE_GEMM_ROWS_PREFETCH")
    # a launch taking a published norm: fewer tiles (it competes with the stream before it), its own switch
    assert gemm_rows_prefetch_tiles(published=True) == 1
    monkeypatch.setenv("FLARE_GEMM_ROWS_PREFETCH", "0")
    assert gemm_rows_prefetch_tiles(published=True) == 0  # never more than the others'
    monkeypatch.setenv("FLARE_GEMM_ROWS_PREFETCH", "3")
    assert gemm_rows_prefetch_tiles(published=True) == 1
    monkeypatch.setenv("FLARE_GEMM_ROWS_PRENORM_PREFETCH", "0")
    assert (gemm_rows_prefetch_tiles(published=True), gemm_rows_prefetch_tiles()) == (0, 3)
    monkeypatch.setenv("FLARE_GEMM_ROWS_PRENORM_PREFETCH", "4")
    assert gemm_rows_prefetch_tiles(published=True) == 4
    monkeypatch.delenv("FLARE_GEMM_ROWS_PREFETCH")
    monkeypatch.delenv("FLARE_GEMM_ROWS_PRENORM_PREFETCH")
    assert gemm_rows_config(4, 6144, 4096) == {"BN": 64, "BK": 128, "num_warps": 4, "num_stages": 5}  # measured
    monkeypatch.setenv("FLARE_GEMM_ROWS_TABLE", "0")  # the heuristic, for side-by-side runs
    assert gemm_rows_config(4, 6144, 4096) == {"BN": 16, "BK": 128, "num_warps": 4, "num_stages": 4}
    monkeypatch.delenv("FLARE_GEMM_ROWS_TABLE")
    x, w, _, _ = _gemv_inputs(4, 32, 64, norm=False, gated=False, residual=False, seed=1)
    with pytest.raises(ValueError, match="BN, BK >= 16"):
        fused_linear_triton(x, w, config={"BN": 8, "BK": 64})
    with pytest.raises(ValueError, match="1..16 rows, got 17"):
        fused_linear_triton(torch.zeros(17, 64, dtype=x.dtype), w, dot=True)


def _record_launches(monkeypatch) -> list[tuple[str, dict]]:
    """The launcher's two projection kernels, wrapped: each launch appends ``(kernel name, keyword arguments)`` to
    the returned list, then runs."""
    from ignition.components.kernels import linear

    launches = []

    class Recorded:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((self.kernel.fn.__name__, kwargs))
                return self.kernel[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(linear, "_fused_gemm_rows_kernel", Recorded(linear._fused_gemm_rows_kernel))
    monkeypatch.setattr(linear, "_fused_gemv_kernel", Recorded(linear._fused_gemv_kernel))
    return launches


def test_one_row_takes_the_tensor_core_variant_from_its_least_k(monkeypatch):
    """``FLARE_GEMV_DOT_ONE_ROW_MIN_K`` (default :data:`fused_linear.DOT_ONE_ROW_MIN_K`): a one-row plain-input,
    ungated launch whose K reaches it runs the tensor-core kernel -- its bits, not the GEMV's -- and every other
    one-row launch (shorter K, a gated output or input, a norm prologue) stays on the GEMV; 0 turns it off."""
    from ignition.components import fused_linear
    from ignition.components.fused_linear import uses_dot_one_row
    from ignition.components.kernels import linear

    monkeypatch.setenv("FLARE_GEMV_DOT_ONE_ROW_MIN_K", "128")
    assert uses_dot_one_row(1, 128) and uses_dot_one_row(1, 12288) and not uses_dot_one_row(1, 64)
    assert not uses_dot_one_row(2, 128) and not uses_dot_one_row(1, 128, gated=True)
    assert not uses_dot_one_row(1, 128, prologue=True)
    monkeypatch.setenv("FLARE_GEMV_DOT", "0")
    assert not uses_dot_one_row(1, 128)
    monkeypatch.delenv("FLARE_GEMV_DOT")
    launches = _record_launches(monkeypatch)
    x, w, _, r = _gemv_inputs(1, 48, 192, norm=False, gated=False, residual=True, seed=7)
    cfg = {"BN": 16, "BK": 64}
    dot = linear.fused_linear_triton(x, w, residual=r, config=cfg, dot=True)
    routed = linear.fused_linear_triton(x, w, residual=r, config=cfg)
    assert [name for name, _ in launches] == ["_fused_gemm_rows_kernel"] * 2 and torch.equal(routed.view(torch.int16), dot.view(torch.int16))
    monkeypatch.setenv("FLARE_GEMV_DOT_ONE_ROW_MIN_K", "256")  # K 192 below it: the GEMV
    linear.fused_linear_triton(x, w, residual=r, config=cfg)
    linear.fused_linear_triton(x.expand(2, -1).contiguous(), w, norm_weight=w[0], eps=1e-6, config=cfg)  # 2 rows
    assert [name for name, _ in launches[2:]] == ["_fused_gemv_kernel"] * 2
    monkeypatch.setenv("FLARE_GEMV_DOT_ONE_ROW_MIN_K", "0")  # off
    assert not uses_dot_one_row(1, 1 << 20)
    monkeypatch.delenv("FLARE_GEMV_DOT_ONE_ROW_MIN_K")
    assert uses_dot_one_row(1, 12288) == (0 < fused_linear.DOT_ONE_ROW_MIN_K <= 12288)  # the default


def test_gemv_config_is_a_pure_function_of_the_shapes(monkeypatch):
    from ignition.components.kernels.linear import GEMV_ACC_BUDGET, GEMV_MEASURED, gemv_config

    monkeypatch.setenv("FLARE_GEMV_CARD", "none")  # the common table (a card model's: the next test)
    names = ("BN", "BK", "num_warps", "num_stages", "preload")
    for (m, n, k, gated), entry in GEMV_MEASURED.items():  # measured shapes: their table entry (a preload if named)
        assert len(entry) in (4, 5) and gemv_config(m, n, k, gated) == dict(zip(names, entry))
    for m in (1, 4, 8, 16):
        for n, k, gated in ((6144, 4096, False), (24576, 4096, True), (1024, 3072, False), (1000, 64, False)):
            cfg = gemv_config(m, n, k, gated)
            assert cfg == gemv_config(m, n, k, gated)
            measured = (m, n, k, gated) in GEMV_MEASURED  # the table may name 1- or 2-row programs
            rows = (1, 2, 4, 8, 16, 32) if measured else (2, 4, 8, 16, 32) if gated else (4, 8, 16, 32)
            assert cfg["BN"] in rows and cfg["BK"] & (cfg["BK"] - 1) == 0
            mp = 1 << (m - 1).bit_length()
            if not measured:  # the heuristic keeps its accumulator budget
                assert mp * cfg["BN"] * cfg["BK"] * (2 if gated else 1) <= GEMV_ACC_BUDGET


def test_gemv_config_takes_the_card_models_entries(monkeypatch):
    """``GEMV_MEASURED_BY_CARD``: on a card model it names (``FLARE_GEMV_CARD``, else the CUDA device's name) its
    entries replace ``GEMV_MEASURED``'s, every other shape keeps the common entry or the heuristic; an unnamed model,
    ``none`` or no CUDA take the common table; ``FLARE_GEMV_CONFIG`` still wins over both."""
    import torch

    from ignition.components.kernels import linear

    names = ("BN", "BK", "num_warps", "num_stages", "preload")
    probe = [(1, 6144, 4096, False), (1, 24576, 4096, True), (1, 4096, 4096, False), (1, 4096, 12288, False),
             (4, 4096, 4096, False), (1, 1000, 64, False)]
    monkeypatch.delenv("FLARE_GEMV_CONFIG", raising=False)
    monkeypatch.setenv("FLARE_GEMV_CARD", "none")
    common = {key: linear.gemv_config(*key) for key in probe}
    assert {key: common[key] for key in probe if key in linear.GEMV_MEASURED} == {
        key: dict(zip(names, linear.GEMV_MEASURED[key])) for key in probe if key in linear.GEMV_MEASURED}
    monkeypatch.setenv("FLARE_GEMV_CARD", "Some Other GPU")
    assert {key: linear.gemv_config(*key) for key in probe} == common
    if not torch.cuda.is_available():
        monkeypatch.delenv("FLARE_GEMV_CARD")
        assert linear.gemv_card() == "" and {key: linear.gemv_config(*key) for key in probe} == common
    assert linear.GEMV_MEASURED_BY_CARD, "no card model names its own configs"
    for card, entries in linear.GEMV_MEASURED_BY_CARD.items():
        monkeypatch.setenv("FLARE_GEMV_CARD", card)
        assert linear.gemv_card() == card
        for key in probe:
            want = dict(zip(names, entries[key])) if key in entries else common[key]
            assert linear.gemv_config(*key) == want, (card, key)
        assert any(entries[key] != linear.GEMV_MEASURED.get(key) for key in entries), f"{card}: no entry differs"
        shape = next(iter(entries))
        item = "x".join(map(str, shape[:3])) + ("g" if shape[3] else "") + "=16/512/8/3"
        monkeypatch.setenv("FLARE_GEMV_CONFIG", item)
        assert linear.gemv_config(*shape) == {"BN": 16, "BK": 512, "num_warps": 8, "num_stages": 3}
        monkeypatch.delenv("FLARE_GEMV_CONFIG")


# ---------------------------------------------------------------------------------------- q/k norm + rotary + KV write

@pytest.mark.parametrize("b,t,heads,kv_heads,d,norms", [(1, 1, 32, 8, 128, True), (3, 2, 6, 2, 16, True),
                                                        (2, 3, 4, 4, 8, False)])
def test_rope_write_triton_matches_the_reference(b, t, heads, kv_heads, d, norms):
    from test_rope_write import EPS, check_triton, make_case

    from ignition.components.kernels.rope_write import rope_write_triton

    case = make_case(b, t, heads, kv_heads, d, norms=norms, seed=b + t)
    q, k, v, qw, kw, cos, sin, kp, vp, slots = [x.clone() if isinstance(x, torch.Tensor) else x for x in case]
    got = rope_write_triton(q, k, v, qw, kw, EPS, cos, sin, kp, vp, slots)
    check_triton(got, kp, vp, case, rel=2.0 ** -4)  # the interpreter truncates (see check_triton)


@pytest.mark.parametrize("t,seq_lens", [(1, (40,)), (3, (40, 1, 17, 0))])
def test_rope_kernels_without_norms_round_as_transformers_under_round_to_nearest(monkeypatch, t, seq_lens):
    """The rotation's rounding points in the kernels' source are transformers': with the interpreter's fp32 -> bf16
    cast made round-to-nearest-even (the GPU's; Triton 3.6's interpreter truncates), the rope write and the fused
    decode writer at every ``FLARE_DECODE_V_FIRST`` equal the canonical modules bit for bit
    (:func:`test_rope_write.check_rope_without_norms_bitwise`; compiled: the GPU test of that name, where a compiler
    contraction would show)."""
    import numpy as np
    from test_rope_write import check_rope_without_norms_bitwise
    from triton.runtime import interpreter

    import triton.language as tl

    if not hasattr(interpreter, "_convert_float"):
        pytest.skip("this Triton's interpreter converts floats elsewhere")
    truncating = interpreter._convert_float

    def nearest(data, src, dst, rounding_mode):
        if src == tl.float32 and dst == tl.bfloat16:
            rounded = torch.from_numpy(np.ascontiguousarray(data).view(np.float32).copy()).to(torch.bfloat16)
            return rounded.view(torch.int16).numpy().view(np.uint16)
        return truncating(data, src, dst, rounding_mode)

    monkeypatch.setattr(interpreter, "_convert_float", nearest)
    check_rope_without_norms_bitwise(monkeypatch, "cpu", 8, 2, 32, t, seq_lens, 4)
    monkeypatch.setattr(interpreter, "_convert_float", truncating)  # the control: truncation differs somewhere
    with pytest.raises(AssertionError, match="the (queries|pools)"):
        check_rope_without_norms_bitwise(monkeypatch, "cpu", 8, 2, 32, t, seq_lens, 4)


def test_gemv_config_override_names_shapes_and_rejects_malformed_items(monkeypatch):
    """``FLARE_GEMV_CONFIG``: per-shape launch configs for side-by-side runs (``g``: the gated launch of the same
    shape is another key); a malformed item raises naming it; unset, the measured table."""
    from ignition.components.kernels.linear import GEMV_MEASURED, gemv_config

    table = dict(zip(("BN", "BK", "num_warps", "num_stages", "preload"), GEMV_MEASURED[(1, 4096, 4096, False)]))
    monkeypatch.delenv("FLARE_GEMV_CONFIG", raising=False)
    monkeypatch.setenv("FLARE_GEMV_CARD", "none")
    assert gemv_config(1, 4096, 4096) == table
    others = [gemv_config(4, 4096, 4096), gemv_config(1, 4096, 12288)]
    monkeypatch.setenv("FLARE_GEMV_CONFIG", " 1x4096x4096=16/512/8/3 ; 1x6144x1024g=4/1024/4/2")
    assert gemv_config(1, 4096, 4096) == {"BN": 16, "BK": 512, "num_warps": 8, "num_stages": 3}
    assert gemv_config(1, 6144, 1024, True) == {"BN": 4, "BK": 1024, "num_warps": 4, "num_stages": 2}
    assert gemv_config(1, 6144, 1024, False) != gemv_config(1, 6144, 1024, True)  # the ungated key is not named
    assert [gemv_config(4, 4096, 4096), gemv_config(1, 4096, 12288)] == others  # shapes not named: unchanged
    monkeypatch.setenv("FLARE_GEMV_CONFIG", "1x4096x12288=8/1024/4/2/0")  # the fifth field: that launch's preload
    assert gemv_config(1, 4096, 12288) == {"BN": 8, "BK": 1024, "num_warps": 4, "num_stages": 2, "preload": 0}
    for bad in ("1x4096=16/512/8/2", "1x4096x4096=16/512/8", "1x4096x4096=16,512,8,2", "1x4096x4096=0/512/8/2",
                "1x4096x4096=16/512/8/2/5", "1x4096x4096=16/512/8/2/-1", "1x4096x4096=16/512/8/2/1/1",
                "1x6144x4096=2/1024/4/2;1x4096x4096=4/1024/4/2;1x6144x4096=1/1024/4/2"):  # a shape named twice
        monkeypatch.setenv("FLARE_GEMV_CONFIG", bad)
        with pytest.raises(ValueError, match="FLARE_GEMV_CONFIG item"):
            gemv_config(1, 4096, 4096)


@pytest.mark.parametrize("gated_input", [False, True])
def test_gemv_config_preload_field_names_one_launch_and_changes_no_bit(monkeypatch, gated_input):
    """A ``FLARE_GEMV_CONFIG`` item's fifth field sets that one-row launch's preloaded tiles whatever its prologue
    (the gated input too, which preloads nothing by default at a partial K), leaves other shapes' preload to the
    defaults, and changes no bit; the tensor-core launch, which preloads nothing, refuses it."""
    from ignition.components.kernels.linear import fused_linear_triton, gemm_rows_config, gemv_preload_tiles

    k = 384  # 3 tiles of 128
    x, w, _, r = _gemv_inputs(1, 64, k, norm=False, gated=False, residual=True, seed=5)
    if gated_input:
        x = torch.cat([x, x.flip(-1)], dim=-1)  # [gate; up]
    run = lambda: fused_linear_triton(x, w, residual=r, gated_input=gated_input)  # noqa: E731
    monkeypatch.setenv("FLARE_GEMV_CONFIG", "1x64x384=16/128/4/2/0")
    plain = run()
    assert gemv_preload_tiles(1, k, 128, not gated_input, 2) == 2 and gemv_preload_tiles(4, k, 128, True, 2) == 0
    assert gemv_preload_tiles(1, k, 128, True, 4) == 3 and gemv_preload_tiles(1, 500, 128, True, 2) == 0
    monkeypatch.setenv("FLARE_GEMV_FLAT", "0")  # the whole K preloaded (4: all 3) keeps the 3-D accumulator's order
    for tiles in (1, 2, 4):
        monkeypatch.setenv("FLARE_GEMV_CONFIG", f"1x64x384=16/128/4/2/{tiles}")
        assert torch.equal(run().view(torch.int16), plain.view(torch.int16)), tiles
    monkeypatch.setenv("FLARE_GEMV_CONFIG", "4x4096x12288=16/512/4/3/2")
    with pytest.raises(ValueError, match="preloads no tiles"):
        gemm_rows_config(4, 4096, 12288)


def test_gemv_config_override_reaches_the_tensor_core_launch_by_row_count(monkeypatch):
    """``FLARE_GEMV_CONFIG`` names tensor-core launches too, keyed by their row count: the named count takes the
    override, other counts keep the measured table's entry."""
    from ignition.components.kernels.linear import GEMM_ROWS_MEASURED, gemm_rows_config

    table = dict(zip(("BN", "BK", "num_warps", "num_stages"), GEMM_ROWS_MEASURED[(4096, 12288, False)]))
    monkeypatch.delenv("FLARE_GEMV_CONFIG", raising=False)
    assert gemm_rows_config(4, 4096, 12288) == gemm_rows_config(8, 4096, 12288) == table
    monkeypatch.setenv("FLARE_GEMV_CONFIG", "4x4096x12288=16/512/4/3")
    assert gemm_rows_config(4, 4096, 12288) == {"BN": 16, "BK": 512, "num_warps": 4, "num_stages": 3}
    assert gemm_rows_config(8, 4096, 12288) == table


def test_programs_per_sm_follows_registers_shared_memory_and_warps():
    """sm90 residency: registers per warp rounded up to 256 (8 per thread), 65,536 per SM; shared memory with 1 KiB
    per program of 228 KiB; 64 warps; at most 32 programs -- the counts the measured launch notes rely on."""
    pytest.importorskip("triton")
    from ignition.components.kernels.decode_plan import programs_per_sm

    assert [programs_per_sm(r, 4) for r in (255, 176, 168, 154, 127, 128, 95, 84, 64)] == [2, 2, 3, 3, 4, 4, 5, 5, 8]
    assert programs_per_sm(122, 4, 147456) == 1  # shared memory binds (the tensor-core 32x512 tiles)
    assert programs_per_sm(76, 4, 73728) == 3 and programs_per_sm(105, 8) == 2
    assert programs_per_sm(16, 1) == 32 and programs_per_sm(32, 32) == 2  # the program and warp limits


@pytest.mark.parametrize("m,n,k,cfg", [(1, 256, 4096, {"BN": 4, "BK": 1024, "num_warps": 4, "num_stages": 2}),
                                       (3, 200, 192, None)])
def test_gemv_into_float32_logits_with_inactive_rows_is_the_widened_masked_result(m, n, k, cfg):
    """``out`` / ``active`` (the step's head, ``flare::fused_linear_logits_``): the launch's float32 rows are its bf16
    result widened, bit for bit, and zeros where the row is inactive -- the same launch without them, then
    ``.float().masked_fill(~active, 0)`` (the head's config at Qwen3-8B's K, the whole K preloaded; and a few rows);
    the arguments that do not fit name themselves."""
    from ignition.components.kernels.linear import fused_linear_triton

    x, w, nw, _ = _gemv_inputs(m, n, k, norm=True, gated=False, residual=False, seed=m * n + k)
    active = torch.tensor([True, False, True][:m])
    want = fused_linear_triton(x, w, norm_weight=nw, eps=1e-6, config=cfg, dot=False)
    want = want.float().masked_fill(~active[:, None], 0.0)
    out = torch.full((m, n), float("nan"))
    got = fused_linear_triton(x, w, norm_weight=nw, eps=1e-6, config=cfg, out=out, active=active)
    assert got is out and torch.equal(got.view(torch.int32), want.view(torch.int32))
    with pytest.raises(ValueError, match="active comes with out"):
        fused_linear_triton(x, w, norm_weight=nw, eps=1e-6, active=active)
    with pytest.raises(ValueError, match="out must be a float32"):
        fused_linear_triton(x, w, norm_weight=nw, eps=1e-6, out=out.double(), active=active)
    with pytest.raises(ValueError, match="out is for the one-row kernel"):
        fused_linear_triton(x, w, norm_weight=nw, eps=1e-6, out=out, residual=torch.zeros(m, n, dtype=x.dtype))
