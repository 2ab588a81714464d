"""GPU tests of dispatch(): the compiled fast path of calls whose signature an op has seen.

tests/gpu/test_out.py already calls every op with out= twice (the second call is a dispatch()
hit where the op remembers the signature) and compares the bytes with the allocating call.
Here: that the second call really took dispatch() (counted through the op module's name for
it), that a hit gives those same bytes for token counts the first call did not have, and that
a call dispatch() declines on a remembered signature (a bad tensor, a size the rules refuse)
still raises the op's error naming the argument, having launched nothing. Allocating calls are
signatures of their own: dispatch() allocates their outputs as the op's Python path does.
"""

from __future__ import annotations

import importlib

import pytest
import torch

from tests.gpu.installed import installed_package
from tests.gpu.test_out import _bits, _cases, _poison, _tuple

tk, quant, errors, runtime = installed_package()

pytestmark = pytest.mark.gpu

# The out= cases of test_out.py that dispatch() takes from their second call; the others keep the
# op's Python path (a launcher view of out's or the inputs' storage, several launches, a pair input).
DISPATCHED = (
    "per_token_cast e4m3", "per_token_cast strided rows", "per_block_cast e4m3 128x128",
    "per_block_cast e2m1 32x128 round_sf", "per_channel_cast", "per_channel_cast_and_transpose",
    "swiglu_forward_and_per_token_cast weighted", "swiglu_forward_and_per_token_cast per row",
    "swiglu_forward_and_per_channel_cast_and_transpose", "swiglu_forward_and_per_channel_cast without_transpose",
    "per_token_cast_back e4m3", "batched_transpose", "topk_gate", "top2_sum_gate", "normalize_weight",
    "expand_to_fused", "reduce_fused",
)


def _counted(op_function: object, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each dispatch() call of the ops launched (True) or declined (False): every op's public
    function reads dispatch from the op layer's _PUBLIC namespace."""
    public = importlib.import_module(f"{tk.__name__}._op")._PUBLIC
    real, seen = public["dispatch"], []

    def counted(*args: object) -> object:
        result = real(*args)
        seen.append(result is not None)
        return result

    monkeypatch.setitem(public, "dispatch", counted)
    return seen


def _op_function(name: str) -> object:
    """The public op a case of test_out.py calls (its first word, found in quant, transpose or moe)."""
    op = name.split()[0]
    if op == "swiglu_forward_and_per_channel_cast":  # the case name shortens it
        op = "swiglu_forward_and_per_channel_cast_and_transpose"
    for family in (quant, tk.transpose, tk.moe):
        if hasattr(family, op):
            return getattr(family, op)
    raise AssertionError(name)


def test_dispatch_is_compiled_into_the_wheel() -> None:
    assert runtime.NATIVE_DISPATCH  # else every case below would only test the Python path


@pytest.mark.parametrize("name", DISPATCHED)
def test_later_calls_take_dispatch_and_write_the_same_bytes(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _counted(_op_function(name), monkeypatch)
    first_op, first_inputs = _cases(257)[name]
    first_out = _tuple(first_op(*first_inputs))
    first_op(*first_inputs, out=first_out[0] if len(first_out) == 1 else first_out)  # remembers the signature
    for num_tokens in (4001, 1, 257):  # other sizes, the same signature
        op, inputs = _cases(num_tokens)[name]
        expected = _tuple(op(*inputs))
        out = _tuple(op(*inputs))
        _poison(out)
        seen.clear()
        result = _tuple(op(*inputs, out=out[0] if len(out) == 1 else out))
        assert seen == [True], f"{name} at {num_tokens} tokens did not take dispatch()"
        assert all(r is o for r, o in zip(result, out, strict=True))
        torch.cuda.synchronize()
        for got, want in zip(out, expected, strict=True):
            assert torch.equal(_bits(got), _bits(want))


def test_declined_calls_still_name_the_argument(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _counted(quant.per_token_cast, monkeypatch)
    wide = torch.randn(10, 2052, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(10, 2048, device="cuda", dtype=torch.bfloat16)
    q, sf = quant.per_token_cast(x, "e4m3", 128)
    quant.per_token_cast(x, "e4m3", 128, out=(q, sf))
    quant.per_token_cast(x, "e4m3", 128, out=(q, sf))
    assert seen[-1] is True
    # Rows 4104 bytes apart: the contract takes any row stride, the rule (and the op) a multiple of 16 bytes.
    with pytest.raises(errors.KernelArgumentError, match=r"^x: the row stride \(2052 elements\)"):
        quant.per_token_cast(wide[:, :2048], "e4m3", 128, out=(q, sf))
    with pytest.raises(errors.KernelArgumentError, match=r"^q\b.*float8_e4m3fn"):
        quant.per_token_cast(x, "e4m3", 128, out=(q.view(torch.int8), sf))
    with pytest.raises(errors.KernelArgumentError, match=r"^q: its memory overlaps x's"):
        quant.per_token_cast(x, "e4m3", 128, out=(x.view(torch.float8_e4m3fn).view(-1)[: 10 * 2048].view(10, 2048), sf))
    with pytest.raises(errors.KernelArgumentError, match=r"^sf\b"):
        quant.per_token_cast(x, "e4m3", 128, out=(q, sf[:9]))
    with pytest.raises(TypeError, match=r"^num_per_channels: expected an int, got float"):
        quant.per_token_cast(x, "e4m3", 128.0, out=(q, sf))  # == 128, another type: never a hit
    assert seen[-5:] == [False] * 5

    seen = _counted(tk.transpose.batched_transpose, monkeypatch)
    xt = torch.randn(2, 128, 192, device="cuda", dtype=torch.bfloat16)
    yt = tk.transpose.batched_transpose(xt)
    tk.transpose.batched_transpose(xt, out=yt)
    tk.transpose.batched_transpose(xt, out=yt)
    assert seen[-1] is True
    odd = torch.randn(2, 96, 192, device="cuda", dtype=torch.bfloat16)  # M not a multiple of 64: the rule
    with pytest.raises(errors.KernelArgumentError, match=r"multiples of 64"):
        tk.transpose.batched_transpose(odd, out=torch.empty(2, 192, 96, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(errors.KernelArgumentError, match=r"^y\b"):
        tk.transpose.batched_transpose(xt, out=yt.transpose(1, 2))
    assert seen[-2:] == [False, False]

    seen = _counted(quant.swiglu_forward_and_per_token_cast, monkeypatch)
    xs = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    positions = torch.arange(8, device="cuda", dtype=torch.int32)
    weights = torch.rand(4, 2, device="cuda")
    experts = torch.zeros(8, device="cuda", dtype=torch.int32)
    args = (xs, "e4m3", 128, positions, weights, experts)
    q, sf = quant.swiglu_forward_and_per_token_cast(*args)
    quant.swiglu_forward_and_per_token_cast(*args, out=(q, sf))
    quant.swiglu_forward_and_per_token_cast(*args, out=(q, sf))
    assert seen[-1] is True
    with pytest.raises(ValueError, match=r"^pos_to_token_topk: expected shape \(8,\)"):  # the rule's size
        quant.swiglu_forward_and_per_token_cast(xs, "e4m3", 128, positions[:7], weights, experts, out=(q, sf))
    with pytest.raises(ValueError, match=r"^pos_to_expert: expected shape \(8,\)"):
        quant.swiglu_forward_and_per_token_cast(xs, "e4m3", 128, positions, weights, experts[:7], out=(q, sf))
    assert seen[-2:] == [False, False]


def _declining(*args: object) -> None:
    return None


@pytest.mark.parametrize("name", DISPATCHED)  # their allocating calls: signatures of their own
def test_later_allocating_calls_take_dispatch_and_return_what_python_returns(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """From the second allocating call of a signature on, dispatch() allocates and launches; its outputs
    have the dtype, shape, strides and bytes of the op's Python path, for sizes the first call did not have."""
    op_function = _op_function(name)
    public = importlib.import_module(f"{tk.__name__}._op")._PUBLIC
    seen = _counted(op_function, monkeypatch)
    first_op, first_inputs = _cases(257)[name]
    first_op(*first_inputs)  # the Python path: remembers the allocating signature
    for num_tokens in (4001, 1, 0, 257):
        op, inputs = _cases(num_tokens)[name]
        seen.clear()
        got = _tuple(op(*inputs))
        assert seen == [True], f"{name} at {num_tokens} tokens did not take dispatch()"
        with monkeypatch.context() as python_only:
            python_only.setitem(public, "dispatch", _declining)
            want = _tuple(op(*inputs))
        torch.cuda.synchronize()
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert (g.dtype, g.shape, g.stride(), g.device) == (w.dtype, w.shape, w.stride(), w.device)
            assert torch.equal(_bits(g), _bits(w))
