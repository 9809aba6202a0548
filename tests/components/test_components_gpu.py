"""GPU half (``-m gpu``): the compiled sampling step and scratch poison inside captured CUDA graphs."""

import pytest
import torch

from ignition.components.backends import BackendUnavailable, select
from ignition.components.sampling import SamplingTensors, advance, sample
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


@pytest.mark.parametrize("capacity", [1, 8, 64])
def test_captured_sampling_step_replays_like_eager(capacity):
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

    from ignition.components.triton_kernels import paged_decode_attention_triton

    q, k, v, bt, lens = make_case(heads, kv_heads, 128, poison=True, seed=heads)
    got = paged_decode_attention_triton(*(x.cuda() for x in (q, k, v, bt, lens)), 128 ** -0.5)
    check(got.cpu(), q, k, v, bt, lens, 128 ** -0.5, 2.0 ** -8)


@pytest.mark.parametrize("heads,kv_heads", [(32, 8), (16, 8)])
def test_triton_prefill_kernel_on_this_gpu_matches_fp64(heads, kv_heads):
    from test_triton_attention import PF_ROWS, check_prefill, make_prefill_case

    from ignition.components.triton_kernels import paged_prefill_attention_triton

    case = make_prefill_case(heads, kv_heads, 128, 16, PF_ROWS, 20, seed=heads)
    got = paged_prefill_attention_triton(*(x.cuda() for x in case[:6]), 128 ** -0.5)
    check_prefill(got.cpu(), case, 2.0 ** -8)  # NaN-poisoned slots past seq_lens: a read past them shows


@pytest.mark.parametrize("b,t,heads,kv_heads", [(1, 1, 32, 8), (4, 1, 16, 8), (2, 7, 32, 8)])
def test_rope_write_kernel_on_this_gpu_matches_the_reference(b, t, heads, kv_heads):
    from test_rope_write import EPS, check_triton, make_case

    from ignition.components.triton_kernels import rope_write_triton

    case = make_case(b, t, heads, kv_heads, 128, pages=40, page=16, seed=heads + t)
    q, k, v, qw, kw, cos, sin, kp, vp, slots = [x.cuda() if isinstance(x, torch.Tensor) else x for x in case]
    got = rope_write_triton(q, k, v, qw, kw, EPS, cos, sin, kp, vp, slots)
    check_triton(got, kp, vp, case)


@pytest.mark.parametrize("heads,kv_heads,seq_lens", [(32, 8, (1000,)), (32, 8, (1000, 1, 517, 0)), (16, 8, (700, 33))])
def test_fused_decode_kernel_on_this_gpu_equals_the_two_kernels(heads, kv_heads, seq_lens):
    """``flare::rope_decode_attention_``'s kernel against rope_write + the two-pass decode kernels: output and pools
    bit for bit (so no split read the new slot before its write, and the last-program combine is the reduce
    kernel's), the same bits over repeated launches and CUDA-graph replays (the split counters reset), and within
    the fp64 decode bound."""
    from test_decode_attention import EPS, assert_same_bits, fused_vs_two_kernels, make_decode_case
    from test_triton_attention import check

    from ignition.components import triton_kernels as tk

    case = [x.cuda() if isinstance(x, torch.Tensor) else x for x in
            make_decode_case(heads, kv_heads, 128, seq_lens, width=64, seed=heads + len(seq_lens))]
    scaling = 128 ** -0.5
    fused, two = fused_vs_two_kernels(case, scaling, None)
    assert_same_bits(fused, two)
    for _ in range(3):
        assert_same_bits(fused_vs_two_kernels(case, scaling, None)[0], fused)
    assert not tk._COUNTERS[torch.device("cuda", torch.cuda.current_device())].any()

    q, k, v, qw, kw, cos, sin, kp, vp, slots, bt, lens = case
    kp_g, vp_g = kp.clone(), vp.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_g = tk.rope_decode_attention_triton(q, k, v, qw, kw, EPS, cos, sin, kp_g, vp_g, slots, bt, lens, scaling)
    for _ in range(5):
        kp_g.copy_(kp), vp_g.copy_(vp)
        graph.replay()
        torch.cuda.synchronize()
        assert_same_bits((out_g, kp_g, vp_g), fused)

    q_rot = tk.rope_write_triton(q, k, v, qw, kw, EPS, cos, sin, kp.clone(), vp.clone(), slots)
    check(fused[0].cpu(), q_rot.cpu(), fused[1].cpu(), fused[2].cpu(), bt.cpu(), lens.cpu(), scaling, 2.0 ** -8)
