"""GPU half (``-m gpu``): the compiled sampling step and scratch poison inside captured CUDA graphs."""

import pytest
import torch

from ignition.components.backends import BackendUnavailable, select
from ignition.components.sampling import SamplingTensors, advance, sample, sample_advance
from ignition.components.scratch import ScratchArena, ScratchPlan

pytestmark = pytest.mark.gpu
VOCAB = 151936  # Qwen3


def _step(logits, params):
    tokens = sample(logits, params)
    advance(params, tokens)
    return tokens


def _params(capacity, device):
    n = max(1, capacity - 1)  # the last row stays inactive where there is room
    rows = [{"temperature": [0.0, 0.6, 1.0, 1.3][b % 4], "top_k": [0, 20][b % 2], "top_p": [1.0, 0.95, 0.8][b % 3],
             "min_p": [0.0, 0.05][b % 2], "presence_penalty": 0.5, "frequency_penalty": 0.1,
             "repetition_penalty": 1.05, "seed": 100 + b} for b in range(n)]
    return SamplingTensors.from_resolved(rows, capacity, vocab_size=VOCAB, device=device,
                                         prompt_token_ids=[[b, 7, 9000 + b] for b in range(n)])


@pytest.mark.parametrize("kernels", ["0", "1"])
@pytest.mark.parametrize("capacity", [1, 8, 64])
def test_captured_sampling_step_replays_like_eager(monkeypatch, capacity, kernels):
    """The compiled sampling step captured in a graph replays the eager step's tokens and state: traced, and with the
    sampler's own kernels (``FLARE_SAMPLER_FRONT_KERNEL`` and ``FLARE_GUMBEL_KERNEL``, eager and compiled alike)."""
    monkeypatch.setenv("FLARE_GUMBEL_KERNEL", kernels)
    monkeypatch.setenv("FLARE_SAMPLER_FRONT_KERNEL", kernels)
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(capacity)
    logits = [torch.randn(capacity, VOCAB, device=dev, generator=g) * 4 for _ in range(8)]
    eager_p, graph_p = _params(capacity, dev), _params(capacity, dev)
    state = {k: getattr(graph_p, k).clone() for k in ("output_counts", "step")}
    step = torch.compile(_step, fullgraph=True, dynamic=False)
    static_logits = logits[0].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step(static_logits, graph_p)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_tokens = step(static_logits, graph_p)
    for k, v in state.items():  # warm-up and capture advanced the state: restore it
        getattr(graph_p, k).copy_(v)
    for i, x in enumerate(logits):
        if i == 4:  # host writes between replays reach the graph (fixed addresses)
            for p in (eager_p, graph_p):
                p.temperature[0] = 0.0
        static_logits.copy_(x)
        graph.replay()
        expected = _step(x, eager_p)
        assert torch.equal(static_tokens, expected), i
    torch.cuda.synchronize()
    for name in ("output_counts", "step"):
        assert torch.equal(getattr(eager_p, name), getattr(graph_p, name)), name
    # Replay time of the complete sampling step (report only; no threshold here).
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        graph.replay()
    start.record()
    for _ in range(50):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    print(f"\nsampling step capacity={capacity} vocab={VOCAB}: {start.elapsed_time(end) / 50 * 1000:.1f} us/replay")


@pytest.mark.parametrize("rows", ["mixed", "done", "done-early"])
@pytest.mark.parametrize("capacity", [1, 4, 64])
def test_sample_advance_into_captured_replays_like_the_separate_launches(monkeypatch, capacity, rows):
    """``flare::sample_advance_into_`` (``FLARE_SAMPLER_DONE_IN_FRONT``, the front ending the done rows and the later
    launches skipping them -- before their PDL wait when every row is done) compiled and captured, replayed 8 times
    with the host's writes between replays: the tokens, counts and steps of the separate launches it replaces, run
    eager (the switch off).  ``done``: every row greedy or without a filter (the replay's rows), the last inactive,
    captured with ``FLARE_SAMPLER_EARLY_SKIP=0``; ``done-early``: so, with it on (the skipping launches start during
    the front)."""
    monkeypatch.setenv("FLARE_SAMPLER_EARLY_SKIP", "1" if rows == "done-early" else "0")
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(capacity + len(rows))
    logits = [(torch.randn(capacity, VOCAB, device=dev, generator=g) * 4).to(torch.bfloat16) for _ in range(8)]

    def params():
        p = _params(capacity, dev)
        if rows.startswith("done"):
            p.top_k.zero_(), p.top_p.fill_(1.0), p.min_p.zero_()
        return p

    eager_p, graph_p = params(), params()
    active = eager_p.active.clone()

    def step(x, p, out):
        return sample_advance(x, p, active=active, pad_id=-1, out=out)

    state = {k: getattr(graph_p, k).clone() for k in ("output_counts", "step")}
    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    static_logits, static_out = logits[0].clone(), torch.full((capacity,), 12345, dtype=torch.int64, device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            compiled(static_logits, graph_p, static_out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        compiled(static_logits, graph_p, static_out)
    for k, v in state.items():  # warm-up and capture advanced the state: restore it
        getattr(graph_p, k).copy_(v)
    for i, x in enumerate(logits):
        if i == 4:  # host writes between replays reach the graph (fixed addresses)
            for p in (eager_p, graph_p):
                p.temperature[0] = 1.0 - p.temperature[0].clamp(max=1.0)
        static_logits.copy_(x)
        graph.replay()
        with monkeypatch.context() as m:
            m.setenv("FLARE_SAMPLER_DONE_IN_FRONT", "0")
            expected = step(x, eager_p, torch.empty_like(static_out))
        assert torch.equal(static_out, expected), i
    torch.cuda.synchronize()
    for name in ("output_counts", "step"):
        assert torch.equal(getattr(eager_p, name), getattr(graph_p, name)), name


def test_poison_between_replays_catches_read_before_write():
    dev = torch.device("cuda")
    arena = ScratchArena(dev)
    arena.register(ScratchPlan("prev", buf=((4096,), torch.float32)))
    arena.register(ScratchPlan("consumer", ws=((4096,), torch.float32)))
    ws = arena.bind("consumer")["ws"]
    x = torch.ones(4096, device=dev)

    def good():
        ws.copy_(x * 2)
        return ws.sum()

    def defective():
        ws.add_(x)  # reads scratch it never wrote
        return ws.sum()

    outs = {}
    for name, fn in (("good", good), ("defective", defective)):
        arena.bind("prev")["buf"].fill_(0.25)
        fn()  # warm-up
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs[name] = (graph, fn())
        arena.bind("prev")["buf"].fill_(0.25)  # plausible leftovers from the previous plan
        graph.replay()
        finite_before = bool(torch.isfinite(outs[name][1]))
        arena.poison("prev")  # after the previous plan's last permitted use
        graph.replay()
        outs[name] = (finite_before, bool(torch.isfinite(outs[name][1])))
    assert outs["good"] == (True, True)
    assert outs["defective"] == (True, False)  # only the poison exposes the plant


def test_poison_inside_a_captured_graph():
    dev = torch.device("cuda")
    arena = ScratchArena(dev)
    plan = arena.register(ScratchPlan("p", a=((1024,), torch.bfloat16), i=((256,), torch.int32)))
    b = arena.bind(plan)
    b["a"].zero_()
    b["i"].zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        arena.poison(plan)
    b["a"].fill_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.isnan(b["a"].float()).all() and (b["i"] == -1515870811).all()


def test_backend_selection_on_this_gpu():
    from conformance.gpu import detect_gpu_class

    gpu = detect_gpu_class()
    assert select("sampling", gpu).name == "torch"
    chosen = select("attention", gpu, {"dtype": torch.bfloat16, "features": {"paged_decode"}})
    print(f"\nattention backend on {gpu}: {chosen.name}")
    if gpu == "sm90":
        try:
            import flashinfer  # noqa: F401
        except ImportError:
            with pytest.raises(BackendUnavailable, match="flashinfer"):
                select("attention", gpu, prefer="flashinfer")
        with pytest.raises(BackendUnavailable, match="GPU class sm90 not supported"):
            select("attention", gpu, prefer="b12x")


# --- the Triton attention kernels compiled for this GPU, against fp64 (the interpreter tests' cases and bounds,
# with round-to-nearest u = 2**-8; realistic heads: Qwen3-8B 32/8 and Qwen3-0.6B 16/8, head_dim 128)

@pytest.mark.parametrize("heads,kv_heads", [(32, 8), (16, 8)])
def test_triton_decode_kernel_on_this_gpu_matches_fp64(heads, kv_heads):
    from test_triton_attention import check, make_case

    from ignition.components.kernels.paged_decode import paged_decode_attention_triton

    q, k, v, bt, lens = make_case(heads, kv_heads, 128, poison=True, seed=heads)
    got = paged_decode_attention_triton(*(x.cuda() for x in (q, k, v, bt, lens)), 128 ** -0.5)
    check(got.cpu(), q, k, v, bt, lens, 128 ** -0.5, 2.0 ** -8)


@pytest.mark.parametrize("heads,kv_heads", [(32, 8), (16, 8)])
def test_triton_prefill_kernel_on_this_gpu_matches_fp64(heads, kv_heads):
    from test_triton_attention import PF_ROWS, check_prefill, make_prefill_case

    from ignition.components.kernels.prefill_attention import paged_prefill_attention_triton

    case = make_prefill_case(heads, kv_heads, 128, 16, PF_ROWS, 20, seed=heads)
    got = paged_prefill_attention_triton(*(x.cuda() for x in case[:6]), 128 ** -0.5)
    check_prefill(got.cpu(), case, 2.0 ** -8)  # NaN-poisoned slots past seq_lens: a read past them shows


@pytest.mark.parametrize("b,t,heads,kv_heads", [(1, 1, 32, 8), (4, 1, 16, 8), (2, 7, 32, 8)])
def test_rope_write_kernel_on_this_gpu_matches_the_reference(b, t, heads, kv_heads):
    from test_rope_write import EPS, check_triton, make_case

    from ignition.components.kernels.rope_write import rope_write_triton

    case = make_case(b, t, heads, kv_heads, 128, pages=40, page=16, seed=heads + t)
    q, k, v, qw, kw, cos, sin, kp, vp, slots = [x.cuda() if isinstance(x, torch.Tensor) else x for x in case]
    got = rope_write_triton(q, k, v, qw, kw, EPS, cos, sin, kp, vp, slots)
    check_triton(got, kp, vp, case)


@pytest.mark.parametrize("t,heads,seq_lens", [(1, 32, (1000,)), (7, 32, (1000, 1)), (1, 16, (1000, 1, 517, 0))])
def test_rope_kernels_on_this_gpu_without_norms_rotate_as_transformers_bitwise(monkeypatch, t, heads, seq_lens):
    """:func:`test_rope_write.check_rope_without_norms_bitwise` compiled (Qwen3's head sizes): the rope write and the
    fused decode writer at every ``FLARE_DECODE_V_FIRST`` are transformers' rotation bit for bit -- a compiler fusing
    a rounded product into the sum (one rounding: ``rope_write._sum_rounded``) differs here.  The norms' statistics
    (fp32 order, ``rsqrt``) are bounded, not bitwise, in the tests above."""
    from test_rope_write import check_rope_without_norms_bitwise

    check_rope_without_norms_bitwise(monkeypatch, "cuda", heads, 8, 128, t, seq_lens, 80)


@pytest.mark.parametrize("heads,kv_heads,seq_lens", [(32, 8, (1000,)), (32, 8, (1000, 1, 517, 0)), (16, 8, (700, 33)),
                                                     (16, 8, (1000,))])
def test_fused_decode_kernel_on_this_gpu(monkeypatch, heads, kv_heads, seq_lens):
    """``flare::rope_decode_attention_``'s kernel, compiled:
    - several rows with the pre-wait K/V prefetch on (``FLARE_DECODE_KV_PREFETCH_ROWS``), a register cap, the
      key loop forced plain and forced pipelined (``FLARE_DECODE_PIPELINE``), the writer's loads first
      (``FLARE_DECODE_V_FIRST``), the timing probe: the bits of without;
    - one row of a 2-head group (Qwen3-0.6B's): the wide blocks (the default, ``FLARE_DECODE_WIDE=1``) are the bits
      of the explicit 32-key blocks with the plain loop and the same split count;
    - no program reads the new slot before its write: a second launch on pools that already hold the new K/V (the
      first launch's) gives the same bits (a read of the old value would differ; the rows of 1 and 33 keys give the
      new key a large weight);
    - the same bits over repeated launches and CUDA-graph replays;
    - the new key's partial from a program of its own (``FLARE_DECODE_NEW_KEY_APART=1``): the same pools, its own
      bits launch after launch (also on pools already holding the new K/V), within the bound below;
    - P V the other way (``FLARE_DECODE_PV_SPLIT`` flipped from its default: the tf32x3 product with V widened when the
      default takes P's bf16 pieces): the same pools, its own bits twice, within the bound;
    - the pools: values copied bit for bit, keys within the rope kernel's bound of transformers' modules, every
      other slot untouched;
    - a row of one key outputs its new value bit for bit, a row of none zeros (every variant); the attention's
      arithmetic against fp64 is :func:`test_fused_decode_attention_on_this_gpu_matches_fp64`'s."""
    from test_decode_attention import EPS, make_decode_case
    from test_rope_write import canonical

    from ignition.components.kernels import decode_plan, fused_decode, launch

    # 80 pages of 16 keys: the wide one-row launch's 40 blocks of 32 keys exceed its one-wave cap (33 splits on 132 SMs)
    cpu_case = make_decode_case(heads, kv_heads, 128, seq_lens, width=80, seed=heads + len(seq_lens))
    case = [x.cuda() if isinstance(x, torch.Tensor) else x for x in cpu_case]
    q, k, v, qw, kw, cos, sin, kp, vp, slots, bt, lens = case
    scaling = 128 ** -0.5

    def run(k_pool, v_pool):
        return fused_decode.rope_decode_attention_triton(q, k, v, qw, kw, EPS, cos, sin, k_pool, v_pool, slots, bt,
                                                         lens, scaling)

    def bits(a, b):
        return torch.equal(a.view(torch.int16), b.view(torch.int16))

    kp1, vp1 = kp.clone(), vp.clone()
    out = run(kp1, vp1)
    if len(seq_lens) > 1:  # the prefetch only reads ahead into L2: the same output and pools
        monkeypatch.setenv("FLARE_DECODE_KV_PREFETCH_ROWS", str(len(seq_lens)))
        assert decode_plan.decode_kv_prefetch_keys(len(seq_lens)) > 0
        kp3, vp3 = kp.clone(), vp.clone()
        assert bits(run(kp3, vp3), out) and bits(kp3, kp1) and bits(vp3, vp1), "the prefetch changed a bit"
        monkeypatch.setenv("FLARE_DECODE_KV_PREFETCH_LAST", "0")  # its lines without the evict-last priority
        kp3, vp3 = kp.clone(), vp.clone()
        assert bits(run(kp3, vp3), out) and bits(kp3, kp1) and bits(vp3, vp1), "the L2 priority changed a bit"
        monkeypatch.delenv("FLARE_DECODE_KV_PREFETCH_LAST")
        monkeypatch.delenv("FLARE_DECODE_KV_PREFETCH_ROWS")
    monkeypatch.setenv("FLARE_DECODE_MAXNREG", "64")  # a register cap moves values to local memory, no arithmetic
    assert decode_plan.fused_decode_launch_options()["maxnreg"] == 64
    kp4, vp4 = kp.clone(), vp.clone()
    assert bits(run(kp4, vp4), out) and bits(kp4, kp1) and bits(vp4, vp1), "the register cap changed a bit"
    monkeypatch.delenv("FLARE_DECODE_MAXNREG")
    monkeypatch.setenv("FLARE_DECODE_SMEM_KB", "120")  # reserved shared memory: placement only, no arithmetic
    kp4, vp4 = kp.clone(), vp.clone()
    assert bits(run(kp4, vp4), out) and bits(kp4, kp1) and bits(vp4, vp1), "the shared-memory padding changed a bit"
    monkeypatch.delenv("FLARE_DECODE_SMEM_KB")
    for trigger in ("1", "2"):  # the reduce's launch later in the kernel: order only
        monkeypatch.setenv("FLARE_DECODE_TRIGGER", trigger)
        kp4, vp4 = kp.clone(), vp.clone()
        assert bits(run(kp4, vp4), out) and bits(kp4, kp1) and bits(vp4, vp1), f"trigger {trigger} changed a bit"
    monkeypatch.delenv("FLARE_DECODE_TRIGGER")
    for level, pages in (("1", "0"), ("2", "0"), ("0", "1"), ("1", "1")):  # the writer's value and norm weights
        # loaded with its key / with the query rows; the first block's page ids with the query rows (plain loop only)
        monkeypatch.setenv("FLARE_DECODE_V_FIRST", level)
        monkeypatch.setenv("FLARE_DECODE_PAGES_FIRST", pages)
        kp4, vp4 = kp.clone(), vp.clone()
        assert bits(run(kp4, vp4), out) and bits(kp4, kp1) and bits(vp4, vp1), f"loads {level}/{pages} changed a bit"
    monkeypatch.delenv("FLARE_DECODE_PAGES_FIRST")
    monkeypatch.delenv("FLARE_DECODE_V_FIRST")
    # the reduce's L2 prefetch of another weight (an o_proj's; all of it, and its last 3 MiB + 5 bytes): no value read
    weight = torch.randn(heads * 128, heads * 128, device="cuda").to(torch.bfloat16)
    for nbytes in (1 << 30, (3 << 20) + 5):
        kp4, vp4 = kp.clone(), vp.clone()
        ahead = fused_decode.rope_decode_attention_triton(q, k, v, qw, kw, EPS, cos, sin, kp4, vp4, slots, bt, lens,
                                                          scaling, prefetch=(weight, nbytes))
        assert bits(ahead, out) and bits(kp4, kp1) and bits(vp4, vp1), f"the {nbytes}-byte prefetch changed a bit"
    # the key loop forced plain and forced software-pipelined (the default depends on the row count,
    # ``DECODE_PIPELINE_MIN_ROWS``) and the timing probe (stamps only): the same bits
    for pipelined in ("0", "1"):
        monkeypatch.setenv("FLARE_DECODE_PIPELINE", pipelined)
        kp5, vp5 = kp.clone(), vp.clone()
        assert bits(run(kp5, vp5), out) and bits(kp5, kp1) and bits(vp5, vp1), f"pipelined={pipelined} changed a bit"
    monkeypatch.delenv("FLARE_DECODE_PIPELINE")
    monkeypatch.setenv("FLARE_DECODE_WIDE", "1")
    if decode_plan.fused_decode_wide(len(seq_lens), heads // kv_heads):
        geo = decode_plan._decode_geometry("test", q, kp, vp, bt, None, fused=True)
        assert geo["BLOCK_N"] == 32 and geo["SPLITS"] <= decode_plan.fused_decode_wide_splits(1, kv_heads, q.device)
        kp7, vp7 = kp.clone(), vp.clone()
        wide = run(kp7, vp7)
        monkeypatch.setenv("FLARE_DECODE_BLOCK_N", "32")
        monkeypatch.setenv("FLARE_DECODE_PIPELINE", "0")
        monkeypatch.setenv("FLARE_DECODE_MAX_SPLITS", str(geo["SPLITS"]))  # the knobs' launch has no one-wave cap
        # nor its P V rule
        monkeypatch.setenv("FLARE_DECODE_PV_SPLIT", "1" if decode_plan.decode_pv_split(wide=True) else "0")
        kp8, vp8 = kp.clone(), vp.clone()
        assert bits(run(kp8, vp8), wide) and bits(kp8, kp7) and bits(vp8, vp7), "the wide blocks are not the knobs'"
        assert bits(kp7, kp1) and bits(vp7, vp1), "the wide blocks changed the pools"
        monkeypatch.delenv("FLARE_DECODE_BLOCK_N")
        monkeypatch.delenv("FLARE_DECODE_PIPELINE")
        monkeypatch.delenv("FLARE_DECODE_MAX_SPLITS")
        monkeypatch.delenv("FLARE_DECODE_PV_SPLIT")
    monkeypatch.delenv("FLARE_DECODE_WIDE")
    stamps = 2 * launch.PROBE_STAMPS.value
    probe = (torch.zeros(len(seq_lens) * kv_heads * 64, stamps, dtype=torch.int64, device="cuda"),
             torch.zeros(len(seq_lens) * heads, stamps, dtype=torch.int64, device="cuda"))
    kp6, vp6 = kp.clone(), vp.clone()
    got6 = fused_decode.rope_decode_attention_triton(q, k, v, qw, kw, EPS, cos, sin, kp6, vp6, slots, bt, lens, scaling,
                                                     probe=probe)
    assert bits(got6, out) and bits(kp6, kp1) and bits(vp6, vp1), "the timing probe changed a bit"
    assert (probe[0][:, 0] > 0).any() and (probe[1][:, 0] > 0).all(), "the probe wrote no stamps"
    assert bits(run(kp1.clone(), vp1.clone()), out), "a program read the new slot before its write"
    # the new key's partial from a program of its own (FLARE_DECODE_NEW_KEY_APART): the same pools, its own bits
    # launch after launch and on pools already holding the new K/V, within the bound below
    monkeypatch.setenv("FLARE_DECODE_NEW_KEY_APART", "1")
    kpa, vpa = kp.clone(), vp.clone()
    apart = run(kpa, vpa)
    assert bits(kpa, kp1) and bits(vpa, vp1), "the new key's own program changed the pools"
    assert bits(run(kpa.clone(), vpa.clone()), apart), "the new key's program read its slot before its write"
    assert bits(run(kp.clone(), vp.clone()), apart)
    monkeypatch.delenv("FLARE_DECODE_NEW_KEY_APART")
    # P V the other way (FLARE_DECODE_PV_SPLIT flipped from its default): the same pools, its own bits launch after
    # launch, within the bound below
    wide = decode_plan.fused_decode_wide(len(seq_lens), heads // kv_heads)
    pv_default = decode_plan.decode_pv_split(wide=wide)  # this launch's
    monkeypatch.setenv("FLARE_DECODE_PV_SPLIT", "0" if pv_default else "1")
    kps, vps = kp.clone(), vp.clone()
    other_pv = run(kps, vps)
    assert bits(kps, kp1) and bits(vps, vp1), "the other P V changed the pools"
    assert bits(run(kp.clone(), vp.clone()), other_pv)
    monkeypatch.delenv("FLARE_DECODE_PV_SPLIT")
    for _ in range(3):
        assert bits(run(kp.clone(), vp.clone()), out)
    kp_g, vp_g = kp.clone(), vp.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_g = run(kp_g, vp_g)
    for _ in range(5):
        kp_g.copy_(kp), vp_g.copy_(vp)
        graph.replay()
        torch.cuda.synchronize()
        assert bits(out_g, out) and bits(kp_g, kp1) and bits(vp_g, vp1)

    # the pools against transformers' modules
    q_c, k_c, v_c = canonical(*cpu_case[:10])
    kvh = kv_heads
    written = torch.zeros(kp.shape[0] * kp.shape[1], dtype=torch.bool)
    written[cpu_case[9]] = True
    got_k, want_k = kp1.cpu().view(-1, kvh, 128), k_c.view(-1, kvh, 128)
    assert bits(vp1.cpu(), v_c) and bits(got_k[~written], want_k[~written])
    new_k, ref_k = got_k[written].float(), want_k[written].float()
    assert ((new_k - ref_k).abs() <= 2.0 ** -6 * ref_k.abs().amax(-1, keepdim=True)).all()

    # a row of one key attends to its new value alone: each head of its group outputs that value bit for bit (its
    # probability is exactly 1, the other splits weigh 0), in every variant; a row without keys writes zeros.  The
    # arithmetic against fp64: test_fused_decode_attention_on_this_gpu_matches_fp64 (this test's former bound against
    # the three-launch path could not fail: q's own rounding there may move a score by 2^-6 of a head's magnitudes)
    value = cpu_case[2]  # [B, 1, KV, D]
    for got in (out, apart, other_pv):
        per_head = got.cpu().view(len(seq_lens), kv_heads, heads // kv_heads, 128)
        for row, n in enumerate(seq_lens):
            if n == 1:
                assert bits(per_head[row], value[row, 0][:, None, :].expand_as(per_head[row]))
            elif n == 0:
                assert not per_head[row].any()


@pytest.mark.parametrize("heads,kv_heads,seq_lens", [(32, 8, (1000,)), (32, 8, (1000, 1, 517, 0)), (16, 8, (700, 33)),
                                                     (16, 8, (1000,))])
def test_decode_combine_in_kernel_on_this_gpu(monkeypatch, heads, kv_heads, seq_lens):
    """The fused decode kernel combining its splits itself (``FLARE_DECODE_COMBINE_ROWS``: each group's last program,
    by an atomic ticket, instead of the reduce kernel): the pools the reduce path's bits, the output within a few ulps
    of its output (the same weights, the sums in split order), its own bits over ten launches queued back to back and
    over graph replays beside the reduce path's graph, the device's counts back at zero; a row of one key outputs its
    value bit for bit, a row of none zeros.  (A test of its own: a failure here does not switch
    ``scripts/h200_run.sh`` to the unfused path.)"""
    from test_decode_attention import EPS, make_decode_case

    from ignition.components.kernels import fused_decode, launch

    cpu_case = make_decode_case(heads, kv_heads, 128, seq_lens, width=80, seed=heads + len(seq_lens))
    q, k, v, qw, kw, cos, sin, kp, vp, slots, bt, lens = [x.cuda() if isinstance(x, torch.Tensor) else x
                                                          for x in cpu_case]

    def run(k_pool, v_pool):
        return fused_decode.rope_decode_attention_triton(q, k, v, qw, kw, EPS, cos, sin, k_pool, v_pool, slots, bt,
                                                         lens, 128 ** -0.5)

    def bits(a, b):
        return torch.equal(a.view(torch.int16), b.view(torch.int16))

    monkeypatch.setenv("FLARE_DECODE_COMBINE_ROWS", "0")
    kp1, vp1 = kp.clone(), vp.clone()
    out = run(kp1, vp1)
    # the splits combined in the kernel by each group's last program (FLARE_DECODE_COMBINE_ROWS): the same pools,
    # within a few ulps of the reduce kernel's output (the same weights, the sums in split order), its own bits over
    # ten launches queued back to back and over graph replays, the device's counts back at zero after each
    monkeypatch.setenv("FLARE_DECODE_COMBINE_ROWS", str(len(seq_lens)))
    kpc, vpc = kp.clone(), vp.clone()
    combined = run(kpc, vpc)
    assert bits(kpc, kp1) and bits(vpc, vp1), "the combine in the kernel changed the pools"
    torch.testing.assert_close(combined.float(), out.float(), rtol=2.0 ** -6, atol=2.0 ** -12)
    again = [run(kp.clone(), vp.clone()) for _ in range(10)]
    torch.cuda.synchronize()
    counts = fused_decode._COMBINE_COUNTS[launch.device_key(q.device)]
    assert all(bits(a, combined) for a in again) and not counts.any()
    variants_g = {}
    for name in ("0", str(len(seq_lens))):  # the reduce kernel's graph and the combining one
        monkeypatch.setenv("FLARE_DECODE_COMBINE_ROWS", name)
        kp_g, vp_g = kp.clone(), vp.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out_g = run(kp_g, vp_g)
        variants_g[name] = (graph, out_g, kp_g, vp_g)
    monkeypatch.delenv("FLARE_DECODE_COMBINE_ROWS")
    for _ in range(5):
        for name, (graph, out_g, kp_g, vp_g) in variants_g.items():
            kp_g.copy_(kp), vp_g.copy_(vp)
            graph.replay()
            torch.cuda.synchronize()
            assert bits(out_g, out if name == "0" else combined) and bits(kp_g, kp1) and bits(vp_g, vp1)
    assert not counts.any()
    per_head = combined.cpu().view(len(seq_lens), kv_heads, heads // kv_heads, 128)
    for row, n in enumerate(seq_lens):
        if n == 1:
            assert bits(per_head[row], cpu_case[2][row, 0][:, None, :].expand_as(per_head[row]))
        elif n == 0:
            assert not per_head[row].any()


@pytest.mark.parametrize("heads,kv_heads,seq_lens", [(32, 8, (1000,)), (32, 8, (1000, 1, 517, 0)), (16, 8, (700, 33)),
                                                     (16, 8, (1000,))])
def test_fused_decode_attention_on_this_gpu_matches_fp64(heads, kv_heads, seq_lens):
    """``test_decode_attention.fused_decode_plain_q_checks`` compiled for this GPU, round to nearest (2^-8): the bf16 scores, the
    softmax, P V (bf16 pieces or tf32x3), the splits and their reduce of the fused kernel against fp64 -- where
    :func:`test_fused_decode_kernel_on_this_gpu` relates the fused launches to each other bit for bit.  (A test of its
    own: a failure here does not switch ``scripts/h200_run.sh`` to the unfused path.)"""
    from test_decode_attention import fused_decode_plain_q_checks

    assert len(fused_decode_plain_q_checks(heads, kv_heads, seq_lens, "cuda", 2.0 ** -8)) == 4


# --- the decode GEMV (``flare::fused_linear``'s kernel) compiled for this GPU at the Qwen3 one-row shapes (their
# measured configs), against the reference within the interpreter tests' bound; the plain ones' inputs loaded
# together (the default) and one by one: the same bits; with the 3-D accumulator (``FLARE_GEMV_FLAT=0``) within the
# bound too, and there their weight tiles preloaded before the PDL wait or not: the same bits

@pytest.mark.parametrize("n,k,norm,residual,gated", [
    (4096, 4096, False, True, False), (1024, 2048, False, True, False), (1024, 3072, False, True, False),
    (6144, 4096, True, False, False), (4096, 1024, True, False, False), (6144, 1024, True, False, True),
    (24576, 4096, True, False, False),  # Qwen3-8B's packed gate/up with the norm (its default path)
    (VOCAB, 4096, True, False, False), (VOCAB, 1024, True, False, False)])  # the heads with the final norm
def test_decode_gemv_on_this_gpu(monkeypatch, n, k, norm, residual, gated):
    from gemv_cases import _gemv_inputs, _gemv_tolerance

    from ignition.components.fused_linear import fused_linear_reference
    from ignition.components.kernels.linear import fused_linear_triton, gemv_config, gemv_preload_tiles

    x, w, nw, r = _gemv_inputs(1, n, k, norm=norm, gated=gated, residual=residual, seed=n + k)
    cuda = [t.cuda() if t is not None else None for t in (x, w, nw, r)]

    def launch():
        return fused_linear_triton(cuda[0], cuda[1], norm_weight=cuda[2], eps=1e-6, residual=cuda[3],
                                   gated=gated).cpu()

    got = launch()
    ref = fused_linear_reference(x, w, nw, 1e-6, r, gated)
    y_ref = fused_linear_reference(x, w, nw, 1e-6, None, gated)
    tol = _gemv_tolerance(x, w, nw, gated, y_ref) + (2 * 2.0 ** -7 * ref.float().abs() if residual else 0)
    err = (got.float() - ref.float()).abs()
    assert (err <= tol).all(), f"max excess {(err - tol).max().item()}"
    if norm:  # the normed one-row shapes (both qkv, the gate/ups) preload their whole K: inputs loaded together
        bk = gemv_config(1, n, k, gated)["BK"]
        assert gemv_preload_tiles(1, k, bk, False) * bk == k
        with monkeypatch.context() as env:
            env.setenv("FLARE_GEMV_X_FIRST", "0")  # x loaded twice (the row statistics, then each tile): same bits
            assert torch.equal(launch().view(torch.int16), got.view(torch.int16))
        with monkeypatch.context() as env:
            env.setenv("FLARE_GEMV_NORM_L1", "1")  # the norm weights' lines into L1 before the wait: same bits
            assert torch.equal(launch().view(torch.int16), got.view(torch.int16))
    if not norm:
        bk = gemv_config(1, n, k)["BK"]
        assert gemv_preload_tiles(1, k, bk, True) * bk == k  # the default preloads these whole: the 2-D accumulator
        monkeypatch.setenv("FLARE_GEMV_X_FIRST", "0")  # the preloaded tiles' inputs loaded one by one: same bits
        per_tile = fused_linear_triton(cuda[0], cuda[1], residual=cuda[3]).cpu()
        assert torch.equal(per_tile.view(torch.int16), got.view(torch.int16))
        monkeypatch.delenv("FLARE_GEMV_X_FIRST")
        monkeypatch.setenv("FLARE_GEMV_PRELOAD_EVICT_FIRST", "0")  # an L2 priority only: same bits
        hinted = fused_linear_triton(cuda[0], cuda[1], residual=cuda[3]).cpu()
        assert torch.equal(hinted.view(torch.int16), got.view(torch.int16))
        monkeypatch.delenv("FLARE_GEMV_PRELOAD_EVICT_FIRST")
        # the 3-D accumulator (FLARE_GEMV_FLAT=0): its own final sum order, within the same bound; there, preloaded
        # tiles or none give the same bits
        monkeypatch.setenv("FLARE_GEMV_FLAT", "0")
        three_d = fused_linear_triton(cuda[0], cuda[1], residual=cuda[3]).cpu()
        assert ((three_d.float() - ref.float()).abs() <= tol).all()
        monkeypatch.setenv("FLARE_GEMV_PRELOAD", "0")
        plain = fused_linear_triton(cuda[0], cuda[1], residual=cuda[3]).cpu()
        assert torch.equal(plain.view(torch.int16), three_d.view(torch.int16))


def test_streamed_gemv_input_ahead_on_this_gpu_changes_no_bit(monkeypatch):
    """Qwen3-8B's one-row down as the step launches it (the plain input behind the gated gate/up: 8x1024, every tile
    streamed) compiled for this GPU: within the reference's bound, and ``FLARE_GEMV_X_AHEAD=1`` (each input tile
    loaded one iteration ahead, :data:`linear.GEMV_X_AHEAD`) gives the same bits, launch after launch."""
    from gemv_cases import _gemv_inputs, _gemv_tolerance

    from ignition.components.fused_linear import fused_linear_reference
    from ignition.components.kernels.linear import fused_linear_triton, gemv_config, gemv_preload_tiles

    x, w, _, r = _gemv_inputs(1, 4096, 12288, norm=False, gated=False, residual=True, seed=12288)
    cuda = [t.cuda() for t in (x, w, r)]
    cfg = gemv_config(1, 4096, 12288)
    assert gemv_preload_tiles(1, 12288, cfg["BK"], True, cfg.get("preload")) == 0  # every tile streamed
    outs = {}
    for ahead in ("0", "1", "1"):
        monkeypatch.setenv("FLARE_GEMV_X_AHEAD", ahead)
        outs.setdefault(ahead, []).append(fused_linear_triton(cuda[0], cuda[1], residual=cuda[2]).cpu())
    got = outs["0"][0]
    ref = fused_linear_reference(x, w, None, 0.0, r, False)
    tol = _gemv_tolerance(x, w, None, False, fused_linear_reference(x, w)) + 2 * 2.0 ** -7 * ref.float().abs()
    assert ((got.float() - ref.float()).abs() <= tol).all()
    assert _same_bits(outs["1"], got)


def _mlp_chain(hidden: int, inter: int):
    """Qwen3's one-row o_proj + residual then MLP (the packed or gated gate/up with the norm prologue, down with the
    residual) at ``hidden, inter`` on the GPU: ``chain(early, handoff=False, gated=False)`` launches the three GEMVs
    (``EARLY``: each letting the next launch before its own wait; ``handoff``: the MLP handoff between gate/up and
    down), and the ``FLARE_GEMV_CONFIG`` item of the handoff's configs (the gated gate/up 2x1024, whole K preloaded;
    down at its table config preloading nothing)."""
    from gemv_cases import _gemv_inputs

    from ignition.components.kernels import linear

    x, wo, _, r = _gemv_inputs(1, hidden, hidden, norm=False, gated=False, residual=True, seed=hidden)
    gen = torch.Generator().manual_seed(inter)
    wgu = (torch.randn(2 * inter, hidden, generator=gen) / hidden ** 0.5).to(torch.bfloat16).cuda()
    wd = (torch.randn(hidden, inter, generator=gen) / inter ** 0.5).to(torch.bfloat16).cuda()
    nw = (torch.rand(hidden, generator=gen) + 0.5).to(torch.bfloat16).cuda()
    x, wo, r = x.cuda(), wo.cuda(), r.cuda()

    def chain(early, handoff=False, gated=False):
        h = linear.fused_linear_triton(x, wo, residual=r, early=early)
        gu = linear.fused_linear_triton(h, wgu, norm_weight=nw, eps=1e-6, gated=gated, early=early,
                                        handoff=linear.HANDOFF_PRODUCER * handoff)
        return linear.fused_linear_triton(gu, wd, residual=h, gated_input=not gated, early=early,
                                          handoff=linear.HANDOFF_CONSUMER * handoff)

    assert linear.gemv_early_enabled(x.device, 1), "PDL's early launches are off on this GPU"
    down = linear.gemv_config(1, hidden, inter)
    named = (f"1x{2 * inter}x{hidden}g=2/1024/4/2;"
             f"1x{hidden}x{inter}={down['BN']}/{down['BK']}/{down['num_warps']}/{down['num_stages']}/0")
    return chain, named


def _same_bits(outs, plain) -> bool:
    return all(torch.equal(o.view(torch.int16), plain.view(torch.int16)) for o in outs)


@pytest.mark.parametrize("hidden,inter", [(4096, 12288), (1024, 3072)])
def test_early_gemv_chain_on_this_gpu_changes_no_bit(monkeypatch, hidden, inter):
    """The one-row GEMVs the recipe marks ``early`` (o_proj + residual, then the MLP, packed or gated -- Qwen3-8B's and
    Qwen3-0.6B's shapes), each letting the next launch before its own wait: the same bits as the chain launched
    without ``EARLY``, eager and captured in a CUDA graph (a kernel that read its predecessor's output before its wait
    would read stale values here).  The Triton GEMV's ``EARLY`` path, which no other test launches; down preloading
    nothing, as behind the gated gate/up."""
    chain, named = _mlp_chain(hidden, inter)
    monkeypatch.setenv("FLARE_GEMV_CONFIG", named)
    for gated in (False, True):
        plain, early = chain(False, gated=gated), chain(True, gated=gated)
        torch.cuda.synchronize()
        assert _same_bits([early], plain), gated
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = [chain(True, gated=gated) for _ in range(4)]  # four layers' chains in one graph
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        assert _same_bits(outs, plain), gated


@pytest.mark.xfail(strict=True, reason="known defect, the reason GEMV_HANDOFF is off: on an H100 (runs 169 and 170, "
                   "results/20261205T133434Z-sm90-run170) four packed handoff chains captured in one CUDA graph gave "
                   "other bits than the plain chain at both shapes (the 20 eager chains the same bits)")
@pytest.mark.parametrize("hidden,inter", [(4096, 12288), (1024, 3072)])
def test_mlp_handoff_chain_on_this_gpu_changes_no_bit(monkeypatch, hidden, inter):
    """The MLP handoff (``kernels.linear.GEMV_HANDOFF``) in both forms -- packed into the gated input, and gated (the
    gated gate/up 2x1024, whole K preloaded) into a plain down preloading nothing (``FLARE_GEMV_CONFIG``'s fifth
    field) -- in the early chain: the same bits as the plain chain, eager (20 chains queued back to back) and captured
    (four chains in one graph, replayed 50 times), the device's counts back at zero after each."""
    from ignition.components.kernels import launch, linear

    chain, named = _mlp_chain(hidden, inter)
    monkeypatch.setenv("FLARE_GEMV_CONFIG", named)
    for gated in (False, True):
        assert linear.gemv_handoff_fits(hidden, inter, gated)
        plain = chain(False, gated=gated)
        handed = [chain(True, True, gated) for _ in range(20)]
        torch.cuda.synchronize()
        flags = linear._HANDOFF_FLAGS[launch.device_key(plain.device)]
        assert _same_bits(handed, plain), gated
        assert not flags.any().item()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = [chain(True, True, gated) for _ in range(4)]
        for _ in range(50):
            graph.replay()
        torch.cuda.synchronize()
        assert _same_bits(outs, plain), gated
        assert not flags.any().item()


@pytest.mark.parametrize("rows,k", [(1, 64), (4, 20), (2, 1)])
def test_topk_values_on_this_gpu(monkeypatch, rows, k):
    """``flare::topk_values``' Triton kernels (``FLARE_TRITON_TOPK=1``) on vocabulary-sized rows (ties, a
    min-p-masked row): equal to ``torch.topk``'s values, eager and captured."""
    from test_topk import _rows

    from ignition.components.topk import topk_values

    monkeypatch.setenv("FLARE_TRITON_TOPK", "1")

    x = _rows(rows, VOCAB, k).cuda()
    want = torch.topk(x, k).values
    assert torch.equal(topk_values(x, k), want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = topk_values(x, k)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@pytest.mark.parametrize("penalties", [True, False])
def test_sampler_front_on_this_gpu(penalties):
    """``flare::sampler_front`` on vocabulary-sized rows (test_sampler_front.py's rows): the traced reference's greedy
    tokens and scaled logits bit for bit (IEEE divisions and libdevice's log on both sides), every row ticket back at
    zero, the same bits launch after launch."""
    from test_sampler_front import front_case

    from ignition.components.kernels import launch, sampler_front
    from ignition.components.sampling import sampler_front_op, sampler_front_reference

    case = [t.cuda() for t in front_case(VOCAB)]
    if not penalties:
        case[1] = case[2] = None
    greedy, scaled = sampler_front_op(*case)
    want_greedy, want_scaled = sampler_front_reference(*case)
    assert torch.equal(greedy, want_greedy)
    assert torch.equal(scaled.view(torch.int32), want_scaled.view(torch.int32))
    again = sampler_front_op(*case)
    torch.cuda.synchronize()
    assert torch.equal(again[0], greedy) and torch.equal(again[1].view(torch.int32), scaled.view(torch.int32))
    assert not sampler_front._COUNTS[launch.device_key(scaled.device)].any()


def test_gumbel_argmax_on_this_gpu():
    """``flare::gumbel_argmax`` on vocabulary-sized rows (test_gumbel_argmax.py's rows): the traced reference's
    tokens (torch's hash and logs on this GPU; a near tie of two noisy values within the logs' rounding would be the
    only way to differ), every row count back at zero, the same tokens launch after launch."""
    from test_gumbel_argmax import _rows

    from ignition.components.kernels import gumbel, launch
    from ignition.components.sampling import gumbel_argmax_op, gumbel_argmax_reference

    for step in range(8):
        y, cut, seeds, steps = (t.cuda() for t in _rows(VOCAB, seed=step))
        got = gumbel_argmax_op(y, cut, seeds, steps + step)
        assert torch.equal(got, gumbel_argmax_reference(y, cut, seeds, steps + step)), step
        assert torch.equal(gumbel_argmax_op(y, cut, seeds, steps + step), got)
    torch.cuda.synchronize()
    assert not gumbel._COUNTS[launch.device_key(y.device)].any()


@pytest.mark.parametrize("into", [False, True], ids=["draw_finish_", "draw_finish_into_"])
def test_draw_finish_on_this_gpu(into):
    """``flare::draw_finish_`` (and ``flare::draw_finish_into_``, its tokens into the first rows of a static buffer) on
    vocabulary-sized rows (test_gumbel_argmax.py's finishing rows): the tokens, counts and steps of the traced draw,
    choice and ``advance`` on this GPU, eager and compiled (its mutations through views of the state, as the catalog's
    sampler region makes them); the row counts back at zero."""
    from test_gumbel_argmax import _finish_reference, _finish_rows

    from ignition.components.kernels import gumbel, launch
    from ignition.components.sampling import draw_finish_into_op, draw_finish_op

    def finish(y, cut, seeds, steps, greedy, temperature, active, counts, out):
        if not into:
            return draw_finish_op(y, cut, seeds, steps[:6], greedy, temperature, active, counts[:6], -1)
        draw_finish_into_op(out[:6], y, cut, seeds, steps[:6], greedy, temperature, active, counts[:6], -1)
        return out[:6]

    compiled = torch.compile(finish, fullgraph=True, dynamic=False)
    for step in range(4):
        y, cut, seeds, steps, greedy, temperature, active, counts = (t.cuda() for t in _finish_rows(VOCAB, seed=step))
        want = _finish_reference(y, cut, seeds, steps, greedy, temperature, active, counts, -1)
        for fn in (finish, compiled):
            state_steps = torch.cat([steps, steps[:1]])  # a row beyond the view: untouched
            state_counts = torch.cat([counts, counts[:1]])
            out = torch.full((7,), 12345, dtype=torch.int64, device=y.device)  # the static tokens, one row more
            got = fn(y, cut, seeds, state_steps, greedy, temperature, active, state_counts, out)
            assert torch.equal(got, want[0]), (step, fn)
            assert (got.data_ptr() == out.data_ptr() and out[6] == 12345) if into else out.eq(12345).all(), (step, fn)
            assert torch.equal(state_counts[:6], want[1]) and torch.equal(state_counts[6], counts[0]), (step, fn)
            assert torch.equal(state_steps[:6], want[2]) and state_steps[6] == steps[0], (step, fn)
    torch.cuda.synchronize()
    assert not gumbel._COUNTS[launch.device_key(y.device)].any()


@pytest.mark.parametrize("op_name", ["sampling_cut", "sampling_cut_compact"])
def test_sampling_cut_on_this_gpu(op_name):
    """``flare::sampling_cut``'s sort-free kernel and ``flare::sampling_cut_compact``'s five launches on
    vocabulary-sized rows: the definition (``_cut64``, float64) up to top-p near ties, the sorting reference bit for
    bit where top-k alone cuts, eager and captured."""
    from test_sampling_cut import _assert_cuts, _rows

    from ignition.components import sampling_cut as ops
    from ignition.components.sampling_cut import sampling_cut_reference

    sampling_cut = getattr(ops, op_name)

    b = 10
    y = _rows(b, VOCAB, 5).cuda()
    top_k = torch.tensor([0, 20, 1000, 0, 1, 151935, 64, 0, 5000, 0], dtype=torch.int32, device="cuda")
    top_p = torch.tensor([0.95, 1.0, 1.0, 0.5, 0.9, 0.8, 0.999, 1.0, 0.3, 0.01], device="cuda")
    skip = torch.zeros(b, dtype=torch.bool, device="cuda")
    skip[7] = True
    got = sampling_cut(y, top_k, top_p, skip)
    _assert_cuts(y.cpu(), top_k.cpu(), top_p.cpu(), skip.cpu(), got.cpu())
    exact = (top_p >= 1.0) | skip
    assert torch.equal(got[exact], sampling_cut_reference(y, top_k, top_p, skip)[exact])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = sampling_cut(y, top_k, top_p, skip)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, got)


def test_sampling_cut_compact_window_of_flat_rows_on_this_gpu():
    """Flat vocabulary-sized rows (logits ~ N(0, sigma^2), sigma 0.5 to 2 nats), top_k off: the nucleus holds far
    more values than the compacted cut's buffer, yet the plan's window of possible cut values fits it (no row takes
    the whole-row search), and the cut is the definition where it is not a top-p near tie, else within TIE of it in
    mass (with ~1e5 values of ~1e-5 each, run 98 found every such row a near tie)."""
    from test_sampling_cut import _assert_window, _cut64, _top_p_cut_ok

    from ignition.components.sampling_cut import sampling_cut_reference
    from ignition.components.kernels.sampling_cut import SAMPLING_CUT_BUFFER, sampling_cut_compact_triton

    g = torch.Generator(device="cuda").manual_seed(9)
    b = 9
    y = torch.randn(b, VOCAB, device="cuda", generator=g) * torch.tensor([0.5, 1.0, 2.0] * 3, device="cuda")[:, None]
    top_k = torch.zeros(b, dtype=torch.int32, device="cuda")
    top_p = torch.tensor([0.9] * 3 + [0.95] * 3 + [0.99] * 3, device="cuda")
    skip = torch.zeros(b, dtype=torch.bool, device="cuda")
    plan = torch.zeros((b, 4), dtype=torch.int32, device="cuda")
    got = sampling_cut_compact_triton(y, top_k, top_p, skip, plan=plan).cpu()
    ref = sampling_cut_reference(y, top_k, top_p, skip).cpu()
    y, plan = y.cpu(), plan.cpu()
    for i in range(b):
        row = y[i].double().tolist()
        want, near = _cut64(row, 0, float(top_p[i]))
        assert got[i].item() == want if not near else _top_p_cut_ok(row, got[i].item(), float(top_p[i])), i
        _assert_window(y[i], plan[i], 0)
        assert int(plan[i, 1]) <= SAMPLING_CUT_BUFFER < int((y[i] >= ref[i]).sum()), (i, plan[i].tolist())


@pytest.mark.parametrize("route", ["prefix", "sort-free"])
def test_general_sampler_routes_agree_on_this_gpu(monkeypatch, route):
    """The general sampler's CUDA routes (``FLARE_SAMPLER_PREFIX=64``: top 64, the op for the other rows;
    ``FLARE_SAMPLER_SORT_FREE=1``: ``flare::sampling_cut_compact`` for every row) keep what the full sort keeps, up to
    top-p near ties, and draw the same tokens."""
    from test_sampling_cut import _cut64

    from ignition.components.sampling import apply_min_p, apply_temperature, filter_logits
    from ignition.components.sampling_cut import MEASURED_PREFIX

    b = 8
    g = torch.Generator(device="cuda").manual_seed(3)
    logits = torch.randn(b, VOCAB, device="cuda", generator=g) * 3
    rows = [{"temperature": [0.0, 0.8, 1.0, 0.6][r % 4], "top_k": [0, 20, 100, 64][r % 4],
             "top_p": [0.95, 0.9, 1.0, 0.5, 0.99][r % 5], "min_p": [0.0, 0.01][r % 2], "seed": r} for r in range(b)]
    params = SamplingTensors.from_resolved(rows, b, vocab_size=VOCAB, device="cuda")
    if route == "prefix":
        monkeypatch.setenv("FLARE_SAMPLER_PREFIX", str(MEASURED_PREFIX))
    else:
        monkeypatch.setenv("FLARE_SAMPLER_SORT_FREE", "1")
    _, routed = filter_logits(logits, params)
    tokens_routed = sample(logits, params)
    monkeypatch.setenv("FLARE_SAMPLER_PREFIX", "0")
    monkeypatch.setenv("FLARE_SAMPLER_SORT_FREE", "0")
    x, full = filter_logits(logits, params)
    y = apply_min_p(apply_temperature(x, params.temperature), params.min_p)  # what both routes cut
    for r in range(b):
        if not torch.equal(routed[r], full[r]):  # only a top-p near tie may differ
            assert _cut64(y[r].double().tolist(), rows[r]["top_k"], rows[r]["top_p"])[1], r
    assert torch.equal(sample(logits, params), tokens_routed)


def test_sorted_cut_kernel_agrees_with_the_traced_cut_on_this_gpu(monkeypatch):
    """``flare::sorted_cut`` (the default; one program per row after the sort): on vocabulary-sized
    rows the sampler keeps what the traced reference keeps, up to top-p near ties, and draws the same tokens -- the
    full sort and the bounded top-64 variant."""
    from test_sampling_cut import _cut64

    from ignition.components.sampling import apply_min_p, apply_temperature, filter_logits

    b = 8
    g = torch.Generator(device="cuda").manual_seed(5)
    logits = torch.randn(b, VOCAB, device="cuda", generator=g) * 3
    for bound in (None, 64):  # the bounded variant admits 1 <= top_k <= 64 only
        rows = [{"temperature": [0.0, 0.8, 1.0, 0.6][r % 4], "top_k": [0 if bound is None else 5, 20, 64, 1][r % 4],
                 "top_p": [0.95, 0.9, 1.0, 0.5, 0.99][r % 5], "min_p": [0.0, 0.01][r % 2], "seed": r}
                for r in range(b)]
        params = SamplingTensors.from_resolved(rows, b, vocab_size=VOCAB, device="cuda", max_top_k=bound)
        monkeypatch.setenv("FLARE_SORTED_CUT_KERNEL", "1")
        _, fused = filter_logits(logits, params)
        tokens = sample(logits, params)
        monkeypatch.setenv("FLARE_SORTED_CUT_KERNEL", "0")
        x, traced = filter_logits(logits, params)
        y = apply_min_p(apply_temperature(x, params.temperature), params.min_p)
        for r in range(b):
            if not torch.equal(fused[r], traced[r]):  # only a top-p near tie may differ
                assert _cut64(y[r].double().tolist(), rows[r]["top_k"], rows[r]["top_p"])[1], (bound, r)
        assert torch.equal(sample(logits, params), tokens), bound


@pytest.mark.parametrize("m,n,k,norm,gated,residual", [(1, 4096, 12288, False, False, True),  # one row: DOT_ONE_ROW
                                                         (4, 6144, 4096, True, False, False),
                                                         (4, 4096, 4096, False, False, True),
                                                         (4, 4096, 12288, False, False, True),
                                                         (8, 4096, 12288, False, False, True),
                                                         (8, 24576, 4096, True, True, False),
                                                         (4, 24576, 4096, False, True, False),
                                                         (4, 6144, 1024, False, True, False),
                                                         (16, 1024, 3072, False, False, True)])
def test_tensor_core_gemv_on_this_gpu(monkeypatch, m, n, k, norm, gated, residual):
    """The tensor-core variant (forced; the step takes it for plain inputs unless ``FLARE_GEMV_DOT=0``) at Qwen3
    shapes of a few rows -- the gated gate/up after the norm at both models' shapes (``FLARE_GEMM_ROWS_GATED=1``'s
    launches) among them --, against the reference within the interpreter tests' bound, and the same bits on a
    second launch; with the norm prologue the same bits as its plain (synchronous) loops."""
    from gemv_cases import _gemv_inputs, _gemv_tolerance

    from ignition.components.fused_linear import fused_linear_reference
    from ignition.components.kernels.linear import fused_linear_triton

    x, w, nw, r = _gemv_inputs(m, n, k, norm=norm, gated=gated, residual=residual, seed=m + n)
    cuda = [t.cuda() if t is not None else None for t in (x, w, nw, r)]
    run = lambda: fused_linear_triton(cuda[0], cuda[1], norm_weight=cuda[2], eps=1e-6, residual=cuda[3],  # noqa
                                      gated=gated, dot=True).cpu()
    got = run()
    assert torch.equal(got.view(torch.int16), run().view(torch.int16))
    ref = fused_linear_reference(x, w, nw, 1e-6, r, gated)
    y_ref = fused_linear_reference(x, w, nw, 1e-6, None, gated)
    tol = _gemv_tolerance(x, w, nw, gated, y_ref) + (2 * 2.0 ** -7 * ref.float().abs() if residual else 0)
    err = (got.float() - ref.float()).abs()
    assert (err <= tol).all(), f"max excess {(err - tol).max().item()}"
    if norm:
        from ignition.components.kernels import linear

        monkeypatch.setattr(linear, "GEMM_ROWS_NORM_STAGES", 0)
        assert torch.equal(run().view(torch.int16), got.view(torch.int16))


@pytest.mark.parametrize("m", [4, 8])
def test_published_norm_on_this_gpu(m):
    """``GEMM_ROWS_PRENORM``'s pair at Qwen3-8B's shapes: o_proj + residual publishing the post-attention norm of its
    output (the same output bits as without; ``xw`` = ``bf16(norm_weight * out)`` bit for bit; each column block's
    sum of squares against fp64), then the gated gate/up taking it -- within the reference's bound of the canonical
    norm + projection, the same bits on a second launch; and down + residual publishing for the next qkv."""
    from gemv_cases import _gemv_inputs, _gemv_tolerance

    from ignition.components.fused_linear import fused_linear_reference
    from ignition.components.kernels.linear import fused_linear_triton

    for (n, k), (n1, gated) in (((4096, 4096), (24576, True)), ((4096, 12288), (6144, False))):
        x, w, _, r = _gemv_inputs(m, n, k, norm=False, gated=False, residual=True, seed=m + k)
        _, w1, nw, _ = _gemv_inputs(m, n1, n, norm=True, gated=gated, residual=False, seed=m + n1)
        xc, wc, rc, w1c, nwc = (t.cuda() for t in (x, w, r, w1, nw))
        out, xw, stats = fused_linear_triton(xc, wc, residual=rc, dot=True, publish_norm=nwc)
        assert torch.equal(out.view(torch.int16), fused_linear_triton(xc, wc, residual=rc, dot=True).view(torch.int16))
        assert torch.equal(xw.view(torch.int16), (nwc.float() * out.float()).to(torch.bfloat16).view(torch.int16))
        parts = stats.shape[1]
        blocks = out.double().view(m, parts, -1)
        assert torch.allclose(stats.double(), (blocks * blocks).sum(dim=-1), rtol=2.0 ** -20, atol=0.0)
        run = lambda: fused_linear_triton(xw, w1c, eps=1e-6, gated=gated, norm_stats=stats, dot=True).cpu()  # noqa
        got = run()
        assert torch.equal(got.view(torch.int16), run().view(torch.int16))
        ref = fused_linear_reference(out.cpu(), w1, nw, 1e-6, None, gated)
        err = (got.float() - ref.float()).abs()
        tol = _gemv_tolerance(out.cpu(), w1, nw, gated, ref)
        assert (err <= tol).all(), f"max excess {(err - tol).max().item()}"


def test_published_block_count_follows_the_launch_on_this_gpu(monkeypatch):
    """``fused_linear_publish`` on CUDA at Qwen3-8B's o_proj (4 rows): the caller's ``parts`` (``_prenorm_parts``)
    equals the launch's column blocks under the table's config and under a ``FLARE_GEMV_CONFIG`` override keyed by
    the rows (run 158's entry that failed to compile); a graph traced for another count raises naming it."""
    from ignition.components.fused_linear import _prenorm_parts, fused_linear_publish

    gen = torch.Generator().manual_seed(9)
    x, r = (torch.randn(4, 1, 4096, generator=gen).to(torch.bfloat16).cuda() for _ in range(2))
    w = (torch.randn(4096, 4096, generator=gen) / 64).to(torch.bfloat16).cuda()
    nw = (torch.rand(4096, generator=gen) + 0.5).to(torch.bfloat16).cuda()
    counts = []
    for spec in ("", "4x4096x4096=16/512/4/4"):
        monkeypatch.setenv("FLARE_GEMV_CONFIG", spec)
        parts = _prenorm_parts(x, w)
        out, xw, stats = fused_linear_publish(x, w, r, nw, parts)
        assert stats.shape == (4, parts) and out.shape == xw.shape == (4, 1, 4096)
        counts.append(parts)
    assert counts == [128, 256]
    with pytest.raises(ValueError, match="parts=128"):
        fused_linear_publish(x, w, r, nw, 128)


@pytest.mark.parametrize("m,n,k", [(4, 4096, 12288), (4, 1024, 3072)])
def test_tensor_core_gated_input_on_this_gpu(m, n, k):
    """The tensor-core variant with the SiLU-gated input (the launch ``FLARE_GEMM_ROWS_GATED_IN=1`` gives Qwen3's down
    at a few rows) at both Qwen3 down shapes with the residual: within the interpreter test's bound of the reference
    (``silu(gate) * up`` rounded as Qwen3MLP, then the projection), the same bits on a second launch."""
    from gemv_cases import _gated_input_tolerance, _gemv_inputs

    from ignition.components.fused_linear import fused_linear_reference
    from ignition.components.kernels.linear import fused_linear_triton

    x, w, _, r = _gemv_inputs(m, n, 2 * k, norm=False, gated=False, residual=True, seed=m + n + k)
    w = w[:, :k].contiguous()  # x: the packed [gate; up] of 2 * K columns, w: [N, K]
    cuda = [t.cuda() for t in (x, w, r)]
    run = lambda: fused_linear_triton(cuda[0], cuda[1], residual=cuda[2], gated_input=True, dot=True).cpu()  # noqa
    got = run()
    assert torch.equal(got.view(torch.int16), run().view(torch.int16))
    ref = fused_linear_reference(x, w, None, 1e-6, r, False, True)
    y_ref = fused_linear_reference(x, w, None, 1e-6, None, False, True)
    tol = _gated_input_tolerance(x, w, y_ref) + 2 * 2.0 ** -7 * ref.float().abs()
    err = (got.float() - ref.float()).abs()
    assert (err <= tol).all(), f"max excess {(err - tol).max().item()}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape,rope", [((1, 1), "default"), ((8, 1), "default"), ((2, 4096), "default"),
                                        ((3, 33), "yarn")])
def test_rotary_kernel_on_this_gpu_equals_the_module_bitwise(monkeypatch, dtype, shape, rope):
    """``flare::rotary_cos_sin`` compiled for this GPU against transformers' ``Qwen3RotaryEmbedding`` on the same
    GPU: the same bits (positions across Qwen3's 40960, a decode step's rows and a prefill chunk; yarn's scaling),
    and the step's entry point (``position_embeddings``) takes the op there."""
    from test_rotary import positions_case, qwen3_rotary

    from ignition.components import rotary as rotary_mod

    params = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768} if rope == "yarn" else None
    rot = qwen3_rotary(rope_parameters=params).cuda()
    pos = positions_case(shape, seed=shape[-1]).cuda()
    x = torch.zeros(2, dtype=dtype, device="cuda")
    want = rot(x, pos)
    view = torch.int16 if dtype == torch.bfloat16 else torch.int32
    op = rotary_mod.rotary_cos_sin
    for g, w in zip(op(pos, rot.inv_freq, rot.attention_scaling, x), want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g.view(view), w.view(view)), \
            f"{int((g != w).sum())} values differ, max {float((g.float() - w.float()).abs().max())}"
    seen = []
    monkeypatch.setattr(rotary_mod, "rotary_cos_sin", lambda *args: seen.append(args) or op(*args))
    assert all(torch.equal(g, w) for g, w in zip(rotary_mod.position_embeddings(rot, x, pos), want))
    assert len(seen) == 1


@pytest.mark.parametrize("on", [True, False], ids=["active", "inactive"])
def test_head_logits_into_the_step_buffer_on_this_gpu_equal_the_widened_masked_head_bitwise(monkeypatch, on):
    """The step's one-row head writing its float32 logits into the step's buffer from its own launch
    (``head_logits_block`` with ``out``: ``flare::fused_linear_logits_``) against ``head_block`` widened and masked as
    before (``FLARE_HEAD_INTO=0``), on this GPU at Qwen3-8B's head (151,936 x 4096): the same bits, zeros for an
    inactive row, eager and compiled."""
    from torch import nn

    from ignition.components.fused_linear import head_logits_block
    from ignition.components.norms import RMSNorm
    from ignition.components.projections import UnquantizedProjection

    hidden, vocab = 4096, 151_936
    torch.manual_seed(5)
    norm = RMSNorm(nn.Parameter((torch.rand(hidden) + 0.5).to(torch.bfloat16), requires_grad=False), 1e-6).cuda()
    head = UnquantizedProjection(hidden, vocab).cuda()
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, hidden, device="cuda") / hidden ** 0.5)
    x = torch.randn(1, hidden, device="cuda").to(torch.bfloat16)
    active = torch.tensor([on], device="cuda")
    monkeypatch.setenv("FLARE_HEAD_INTO", "0")
    want = head_logits_block(x, head, norm, active, torch.empty(1, vocab, device="cuda"))
    monkeypatch.setenv("FLARE_HEAD_INTO", "1")

    def step_head(x, active, out):
        got = head_logits_block(x, head, norm, active, out)
        return got if got is out else out.copy_(got)

    for fn in (step_head, torch.compile(step_head, fullgraph=True, dynamic=False)):
        out = torch.full((1, vocab), float("nan"), device="cuda")
        got = fn(x, active, out)
        assert got.data_ptr() == out.data_ptr(), fn
        assert torch.equal(out.view(torch.int32), want.view(torch.int32)), fn
        assert bool((out == 0).all()) != on, fn


@pytest.mark.parametrize("shape", [(1, 1), (8, 1), (2, 4096)])
def test_embed_rotary_on_this_gpu_equals_the_modules_bitwise(monkeypatch, shape):
    """``flare::embed_rotary`` (the rotary launch also copying each token's embedding row) on this GPU against
    ``nn.Embedding`` and transformers' rotary module there: the same bits (Qwen3-8B's hidden size; a decode step's rows
    and a prefill chunk), and the step's entry point (``embed_position_embeddings``) takes the op."""
    from test_rotary import _embedding, positions_case, qwen3_rotary

    from ignition.components import rotary as rotary_mod

    rot, emb = qwen3_rotary().cuda(), _embedding(vocab=5000, hidden=4096, seed=shape[0]).cuda()
    pos = positions_case(shape, seed=shape[-1]).cuda()
    ids = torch.randint(0, 5000, shape, generator=torch.Generator().manual_seed(shape[-1])).cuda()
    want_h = emb(ids)
    want = (want_h, *rot(want_h, pos))
    op = rotary_mod.embed_rotary
    got = op(ids, emb.weight, pos, rot.inv_freq, rot.attention_scaling)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g.view(torch.int16), w.view(torch.int16))
    seen = []
    monkeypatch.setattr(rotary_mod, "embed_rotary", lambda *args: seen.append(args) or op(*args))
    hidden, (cos, sin) = rotary_mod.embed_position_embeddings(emb, rot, ids, pos)
    assert len(seen) == 1 and all(torch.equal(g, w) for g, w in zip((hidden, cos, sin), want))


@pytest.mark.parametrize("shape", [(1, 1), (4, 1), (8, 1), (2, 4096)])
def test_embed_rotary_batch_on_this_gpu_equals_its_definition(shape):
    """``flare::embed_rotary_batch`` on this GPU (the rotary launch also copying the embedding rows and writing the
    attention batch's slots, valid and lengths): the embedding and transformers' rotary module's bits, the batch by its
    definition element by element (padding slots, an inactive row, lengths past both ends); captured in a graph and
    replayed on new inputs, the same (a decode step's capacities; a prefill chunk)."""
    from test_rotary import _embedding, batch_case, batch_expected, positions_case, qwen3_rotary

    from ignition.components.rotary import embed_rotary_batch

    rot, emb = qwen3_rotary().cuda(), _embedding(vocab=5000, hidden=4096, seed=shape[0]).cuda()

    def inputs(seed):
        pos = positions_case(shape, seed=seed)
        ids = torch.randint(0, 5000, shape, generator=torch.Generator().manual_seed(seed))
        slot_mapping, active, seq_lens, sink, max_len = batch_case(shape, seed=seed, sink=70000, max_len=40960)
        return [x.cuda() for x in (ids, pos, slot_mapping, active, seq_lens)], (sink, max_len)

    def expected(ids, pos, slot_mapping, active, seq_lens, sink, max_len):
        h = emb(ids)
        batch = batch_expected(slot_mapping.cpu(), active.cpu(), seq_lens.cpu(), sink, max_len)
        return (h, *rot(h, pos), *(x.cuda() for x in batch))

    def run(ids, pos, slot_mapping, active, seq_lens, sink, max_len):
        return embed_rotary_batch(ids, emb.weight, pos, rot.inv_freq, rot.attention_scaling, slot_mapping, active,
                                  seq_lens, sink, max_len)

    def check(got, want):
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)

    static, consts = inputs(1)
    check(run(*static, *consts), expected(*static, *consts))
    out = run(*static, *consts)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run(*static, *consts)
    for seed in (2, 3):
        new, _ = inputs(seed)
        for s, n in zip(static, new):
            s.copy_(n)
        graph.replay()
        torch.cuda.synchronize()
        check(out, expected(*static, *consts))
