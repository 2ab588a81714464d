"""GPU tests of ``out=``: each op that takes it writes the caller's tensors in place, bit for bit
what the allocating call returns, and hands them back.

For every op: fresh random inputs, out poisoned (POISON_BYTE in every byte of its storage, so an
element the kernel skips shows), T in {0, 1, 4001}; then a CUDA graph captured with out= and
replayed on new inputs; torch.compile(fullgraph=True) of a function that passes out=; and the
errors for an out that overlaps an input or does not fit the kernel (naming the argument).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from tests.gpu.installed import installed_package
from tests.gpu.poison import POISON_BYTE
from tests.reference.quant_swiglu import expert_major_routing

tk, quant, errors, _ = installed_package()

pytestmark = pytest.mark.gpu

TOKENS = (0, 1, 4001)
Op = Callable[..., object]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _tuple(result: object) -> tuple[torch.Tensor, ...]:
    return result if isinstance(result, tuple) else (result,)  # type: ignore[return-value]


def _poison(outs: tuple[torch.Tensor, ...]) -> None:
    for t in outs:
        t.untyped_storage().fill_(POISON_BYTE)


def _routing(num_tokens: int, num_experts: int, num_topk: int) -> torch.Tensor:
    scores = torch.rand(num_tokens, num_experts, device="cuda")
    return scores.topk(num_topk, dim=1).indices


def _swiglu_backward(x: torch.Tensor, x_sf: torch.Tensor, grad_out: torch.Tensor, weight: torch.Tensor,
                     pos_to_token_topk: torch.Tensor, token_topk_to_pos: torch.Tensor,
                     out: tuple[torch.Tensor, ...] | None = None) -> tuple[torch.Tensor, ...]:
    """swiglu_backward_and_per_token_cast, its nested (out, (q, sf), x_grad, weight_grad) taken and
    returned as five flat tensors: the form the table's tests handle."""
    nested = None if out is None else (out[0], (out[1], out[2]), out[3], out[4])
    act, (q, q_sf), x_grad, weight_grad = quant.swiglu_backward_and_per_token_cast(
        (x, x_sf), grad_out, weight, pos_to_token_topk, token_topk_to_pos, 128, swiglu_clamp_value=0.5, out=nested)
    return act, q, q_sf, x_grad, weight_grad


def _cases(num_tokens: int) -> dict[str, tuple[Op, tuple[torch.Tensor, ...]]]:
    """name -> (op(inputs..., out=...) as a function of its tensor inputs, the inputs)."""
    x = torch.randn(num_tokens, 7168, device="cuda", dtype=torch.bfloat16) * 3
    q, sf = quant.per_token_cast(x, "e4m3", 128)
    q4, sf4 = quant.per_token_cast(x, "e2m1", 32, use_tma_aligned_col_major_sf=True)
    block_sf = quant.per_block_cast(x, "e4m3", (128, 128))[1]
    fp4_pair = quant.per_token_cast(x, "e2m1", 32, round_sf=True)  # power-of-two 1 x 32 scales
    e5m6_pair = quant.per_token_cast_e5m6(x, use_tma_aligned_col_major_sf=True)
    # The per-channel casts take whole groups of 128 tokens (0, 128, 384, 4096); the gathering
    # form any count, through pos_to_token rows (a multiple of 16, -1 and out of range: zero rows).
    x128 = torch.randn(-(-num_tokens // 128) * 128, 2560, device="cuda", dtype=torch.bfloat16) * 3
    pos_to_token = torch.randint(-1, num_tokens + 1, (-(-num_tokens // 16) * 16,), device="cuda", dtype=torch.int32)
    # SwiGLU forward (H 2048): weights through positions of T tokens x 2 (-1: weight 0, a zero row);
    # every row has an expert, since the kernel skips a row whose pos_to_expert is -1 (unspecified
    # with out= as without, so not comparable). The per-channel form takes 128-token groups.
    x_swiglu = torch.randn(num_tokens, 2 * 2048, device="cuda", dtype=torch.bfloat16) * 2
    x_swiglu128 = torch.randn(x128.shape[0], 2 * 2048, device="cuda", dtype=torch.bfloat16) * 2
    topk_pos = torch.randint(-1, 2 * num_tokens, (num_tokens,), device="cuda", dtype=torch.int32)
    topk_weights = torch.rand(num_tokens, 2, device="cuda")
    experts = torch.zeros(num_tokens, device="cuda", dtype=torch.int32)
    # SwiGLU backward: an expert-major routing of T tokens x 2 (rows padded with -1 to 16 per expert).
    _, bwd_pos, bwd_token_topk_to_pos = expert_major_routing(num_tokens, 2, seed=num_tokens)
    rows = bwd_pos.shape[0]
    bwd_q, bwd_sf = quant.per_token_cast(torch.randn(rows, 2 * 2048, device="cuda", dtype=torch.bfloat16), "e4m3", 128)
    bwd_inputs = (bwd_q, bwd_sf, torch.randn(rows, 2048, device="cuda", dtype=torch.bfloat16), topk_weights,
                  bwd_pos, bwd_token_topk_to_pos)
    scores = torch.rand(num_tokens, 256, device="cuda")
    weights = torch.rand(num_tokens, 8, device="cuda") + 0.1
    x_moe = torch.randn(num_tokens, 2048, device="cuda", dtype=torch.bfloat16)
    pos_to_expert, _, _, token_topk_to_pos, *_ = tk.moe.get_fused_mapping(
        _routing(num_tokens, 32, 8), 32, 0, 128, force_no_sync=True)
    fused = tk.moe.expand_to_fused(x_moe, token_topk_to_pos, pos_to_expert)
    return {
        "per_token_cast e4m3": (lambda t, out=None: quant.per_token_cast(t, "e4m3", 128, out=out), (x,)),
        "per_token_cast e2m1 col_major": (lambda t, out=None: quant.per_token_cast(
            t, "e2m1", 32, use_tma_aligned_col_major_sf=True, out=out), (x,)),
        "per_token_cast ue8m0": (lambda t, out=None: quant.per_token_cast(
            t, "e4m3", 128, round_sf=True, use_tma_aligned_col_major_sf=True, use_packed_ue8m0=True, out=out), (x,)),
        "per_token_cast strided rows": (lambda t, out=None: quant.per_token_cast(t[:, :4096], "e4m3", 128, out=out),
                                        (x,)),
        "per_token_cast_with_precomputed_sf": (lambda t, s, out=None: quant.per_token_cast_with_precomputed_sf(
            t, "e4m3", 128, s, out=out), (x, sf)),
        "per_block_cast e4m3 128x128": (lambda t, out=None: quant.per_block_cast(t, "e4m3", (128, 128), out=out),
                                        (x,)),
        "per_block_cast e2m1 32x128 round_sf": (lambda t, out=None: quant.per_block_cast(
            t, "e2m1", (32, 128), round_sf=True, out=out), (x,)),
        "per_block_cast_with_precomputed_sf": (lambda t, s, out=None: quant.per_block_cast_with_precomputed_sf(
            t, "e4m3", (128, 128), s, out=out), (x, block_sf)),
        "per_block_cast_lossless 128x128": (lambda a, s, out=None: quant.per_block_cast_lossless(
            (a, s), "e4m3", (1, 32), (128, 128), out=out), fp4_pair),
        "per_block_cast_lossless 1x128": (lambda a, s, out=None: quant.per_block_cast_lossless(
            (a, s), "e4m3", (1, 32), (1, 128), out=out), fp4_pair),
        "per_channel_cast": (lambda t, out=None: quant.per_channel_cast(t, "e4m3", 128, out=out), (x128,)),
        "per_channel_cast_fused fp8 gather round_sf": (lambda a, s, p, out=None: quant.per_channel_cast_fused(
            (a, s), "e4m3", 128, round_sf=True, num_per_channels=128, pos_to_token=p, out=out), (q, sf, pos_to_token)),
        "per_channel_cast_and_transpose": (lambda t, out=None: quant.per_channel_cast_and_transpose(
            t, "e4m3", 32, out=out), (x128,)),
        "swiglu_forward_and_per_token_cast weighted": (
            lambda t, p, w, e, out=None: quant.swiglu_forward_and_per_token_cast(
                t, "e4m3", 128, p, w, e, round_sf=True, swiglu_clamp_value=0.5, out=out),
            (x_swiglu, topk_pos, topk_weights, experts)),
        "swiglu_forward_and_per_token_cast per row": (
            lambda t, out=None: quant.swiglu_forward_and_per_token_cast(t, "e4m3", 2048, out=out), (x_swiglu,)),
        "swiglu_backward_and_per_token_cast": (_swiglu_backward, bwd_inputs),
        "swiglu_forward_and_per_channel_cast_and_transpose": (
            lambda t, out=None: quant.swiglu_forward_and_per_channel_cast_and_transpose(
                t, "e4m3", 32, round_sf=True, out=out), (x_swiglu128,)),
        "swiglu_forward_and_per_channel_cast without_transpose": (
            lambda t, out=None: quant.swiglu_forward_and_per_channel_cast_and_transpose(
                t, "e4m3", 128, without_transpose=True, out=out), (x_swiglu128,)),
        "per_token_cast_e5m6": (lambda t, out=None: quant.per_token_cast_e5m6(t, out=out), (x,)),
        "per_token_cast e5m6 col_major round_sf": (lambda t, out=None: quant.per_token_cast(
            t, "e5m6", 7168, use_tma_aligned_col_major_sf=True, round_sf=True, out=out), (x,)),
        "cast_back_e5m6": (lambda a, s, out=None: quant.cast_back_e5m6((a, s), "bf16", out=out), e5m6_pair),
        "cast_back e5m6 fp32": (lambda a, s, out=None: quant.cast_back((a, s), "fp32", (1, 7168), x_special_fmt="e5m6",
                                                                       out=out), e5m6_pair),
        "per_token_cast_back e4m3": (lambda a, s, out=None: quant.per_token_cast_back((a, s), "bf16", 128, out=out),
                                     (q, sf)),
        "cast_back e2m1 col_major": (lambda a, s, out=None: quant.cast_back((a, s), "fp32", (1, 32), out=out),
                                     (q4, sf4)),
        "batched_transpose": (lambda t, out=None: tk.transpose.batched_transpose(t, out=out),
                              (torch.randn(3, 128, 192, device="cuda", dtype=torch.bfloat16),)),
        "transpose": (lambda t, out=None: tk.transpose.transpose(t, out=out),
                      (torch.randn(128, 192, device="cuda").to(torch.float8_e4m3fn),)),
        "topk_gate": (lambda s, out=None: tk.moe.topk_gate(s, 8, out=out), (scores,)),
        "top2_sum_gate": (lambda s, b, out=None: tk.moe.top2_sum_gate(s, b, 8, 4, 8, False, 0, 2.5, 0, 1, 0, 1, "sigmoid",
                                                                      out=out), (scores, torch.randn(256, device="cuda"))),
        "normalize_weight": (lambda w, out=None: tk.moe.normalize_weight(w, out=out), (weights,)),
        "expand_to_fused": (lambda t, p, e, out=None: tk.moe.expand_to_fused(t, p, e, out=out),
                            (x_moe, token_topk_to_pos, pos_to_expert)),
        "reduce_fused": (lambda t, w, p, out=None: tk.moe.reduce_fused(t, w, p, out=out),
                         (fused, weights, token_topk_to_pos)),
    }


NAMES = list(_cases(1))


def _refresh(inputs: tuple[torch.Tensor, ...]) -> None:
    """New random values in the bf16 / fp32 inputs (codes and index tensors keep theirs)."""
    for t in inputs:
        if t.dtype in (torch.bfloat16, torch.float32):
            t.copy_(torch.randn_like(t))


@pytest.mark.parametrize("num_tokens", TOKENS)
@pytest.mark.parametrize("name", NAMES)
def test_out_is_written_in_place(name: str, num_tokens: int) -> None:
    op, inputs = _cases(num_tokens)[name]
    expected = _tuple(op(*inputs))
    out = _tuple(op(*inputs))  # what a caller keeps to reuse: the op's own layout (col-major sf included)
    for _ in range(2):  # the first call fills the op's variant cache, the second takes the cached path
        _poison(out)
        result = _tuple(op(*inputs, out=out[0] if len(out) == 1 else out))
        assert all(r is o for r, o in zip(result, out, strict=True))
        torch.cuda.synchronize()
        for got, want in zip(out, expected, strict=True):
            assert got.shape == want.shape and got.stride() == want.stride()
            assert torch.equal(_bits(got), _bits(want))


@pytest.mark.parametrize("name", NAMES)
def test_cuda_graph_replay_into_out(name: str) -> None:
    op, inputs = _cases(257)[name]
    out = _tuple(op(*inputs))  # also the warm-up: cubin loads stay out of the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        op(*inputs, out=out[0] if len(out) == 1 else out)
    for _ in range(2):
        _refresh(inputs)
        expected = _tuple(op(*inputs))
        _poison(out)
        graph.replay()
        torch.cuda.synchronize()
        for got, want in zip(out, expected, strict=True):
            assert torch.equal(_bits(got), _bits(want))


@pytest.mark.parametrize("name", ["per_token_cast e4m3", "per_token_cast e2m1 col_major", "topk_gate",
                                  "per_token_cast_back e4m3", "batched_transpose", "per_block_cast e4m3 128x128",
                                  "swiglu_forward_and_per_token_cast weighted", "swiglu_backward_and_per_token_cast"])
def test_torch_compile_fullgraph_with_out(name: str) -> None:
    op, inputs = _cases(257)[name]
    out = _tuple(op(*inputs))
    torch._dynamo.reset()
    compiled = torch.compile(lambda *args: op(*args, out=out[0] if len(out) == 1 else out), fullgraph=True)
    for _ in range(2):
        _refresh(inputs)
        expected = _tuple(op(*inputs))
        _poison(out)
        compiled(*inputs)
        torch.cuda.synchronize()
        for got, want in zip(out, expected, strict=True):
            assert torch.equal(_bits(got), _bits(want))


def test_out_errors_name_the_argument() -> None:
    wide = torch.randn(10, 2048, device="cuda", dtype=torch.bfloat16)
    x = wide[:5]
    q, sf = quant.per_token_cast(x, "e4m3", 128)
    in_x = wide.view(torch.float8_e4m3fn).view(20, 2048)[:5]  # contiguous, in x's first rows
    for _ in range(2):  # the first call takes the op's uncached path, the second its cached one
        with pytest.raises(errors.KernelArgumentError, match=r"^q: its memory overlaps x's"):
            quant.per_token_cast(x, "e4m3", 128, out=(in_x, sf))
    with pytest.raises(errors.KernelArgumentError, match=r"^q: its memory overlaps sf's"):  # the first written one
        quant.per_token_cast(x, "e4m3", 128, out=(q, q.view(torch.float32).view(-1)[:80].view(5, 16)))
    buffer = torch.empty(5 * 2048, dtype=torch.uint8, device="cuda")  # given scales in the first bytes of q
    given = buffer[: 5 * 16 * 4].view(torch.float32).view(5, 16).copy_(sf)
    with pytest.raises(errors.KernelArgumentError, match=r"^q: its memory overlaps sf's"):
        quant.per_token_cast_with_precomputed_sf(x, "e4m3", 128, given, out=buffer.view(torch.float8_e4m3fn).view(5, 2048))
    with pytest.raises(errors.KernelArgumentError, match=r"^q\b.*float8_e4m3fn"):
        quant.per_token_cast(x, "e4m3", 128, out=(q.view(torch.int8), sf))
    with pytest.raises(errors.KernelArgumentError, match=r"^sf\b"):
        quant.per_token_cast(x, "e4m3", 128, out=(q, sf[:4]))
    with pytest.raises(errors.KernelArgumentError, match=r"^q\b"):
        quant.per_token_cast(x, "e4m3", 128, out=(q.cpu(), sf))
    with pytest.raises(errors.KernelArgumentError, match=r"^sf\b"):
        quant.per_token_cast(x, "e4m3", 128, out=(q, sf.t().contiguous().t()))
    block_q, block_sf = quant.per_block_cast(x, "e4m3", (32, 128))  # sf (1, 16)
    with pytest.raises(errors.KernelArgumentError, match=r"^q: its memory overlaps x's"):
        quant.per_block_cast(x, "e4m3", (32, 128), out=(in_x, block_sf))
    with pytest.raises(errors.KernelArgumentError, match=r"^sf\b"):
        quant.per_block_cast(x, "e4m3", (32, 128), out=(block_q, block_sf[:, :8]))
    given = buffer[: 16 * 4].view(torch.float32).view(1, 16).copy_(block_sf)  # in the first bytes of q
    with pytest.raises(errors.KernelArgumentError, match=r"^q: its memory overlaps sf's"):
        quant.per_block_cast_with_precomputed_sf(x, "e4m3", (32, 128), given,
                                                 out=buffer.view(torch.float8_e4m3fn).view(5, 2048))
    xc = torch.randn(128, 2048, device="cuda", dtype=torch.bfloat16)
    qc, sfc = quant.per_channel_cast_and_transpose(xc, "e4m3", 32)
    with pytest.raises(errors.KernelArgumentError, match=r"^q\b"):
        quant.per_channel_cast_and_transpose(xc, "e4m3", 32, out=(qc.t(), sfc))  # (T, H): not the transposed q
    with pytest.raises(errors.KernelArgumentError, match=r"^q: its memory overlaps x's"):
        quant.per_channel_cast(xc, "e4m3", 128, out=(xc.view(torch.float8_e4m3fn).view(-1)[: 128 * 2048].view(128, 2048),
                                                     sfc[:1]))  # q in x's first half
    pair = quant.per_token_cast(x, "e2m1", 32, round_sf=True)
    lossless_q, lossless_sf = quant.per_block_cast_lossless(pair, "e4m3", (1, 32), (32, 32))
    with pytest.raises(errors.KernelArgumentError, match=r"^q\b.*float8_e4m3fn"):
        quant.per_block_cast_lossless(pair, "e4m3", (1, 32), (32, 32), out=(lossless_q.view(torch.uint8), lossless_sf))
    codes, scales = quant.per_token_cast_e5m6(x)
    with pytest.raises(errors.KernelArgumentError, match=r"^q: its memory overlaps x's"):
        quant.per_token_cast_e5m6(x, out=(wide.view(torch.uint8).view(-1)[: 5 * 3072].view(5, 3072), scales))
    with pytest.raises(errors.KernelArgumentError, match=r"^out\b"):  # fmt 'fp32' with a bf16 out
        quant.cast_back_e5m6((codes, scales), "fp32", out=torch.empty(5, 2048, device="cuda", dtype=torch.bfloat16))
    scores = torch.rand(5, 256, device="cuda")
    with pytest.raises(errors.KernelArgumentError, match=r"^topk_idx\b"):
        tk.moe.topk_gate(scores, 8, out=torch.empty(5, 6, dtype=torch.int64, device="cuda"))
    with pytest.raises(errors.KernelArgumentError, match=r"^topk_idx: its memory overlaps scores's"):
        tk.moe.topk_gate(scores, 8, out=scores.view(torch.int64).view(-1)[:40].view(5, 8))
    xt = torch.randn(2, 64, 128, device="cuda")
    with pytest.raises(errors.KernelArgumentError, match=r"^y\b"):
        tk.transpose.batched_transpose(xt, out=torch.empty(2, 64, 128, device="cuda"))
