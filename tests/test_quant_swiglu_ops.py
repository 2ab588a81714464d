"""CPU tests of the swiglu op modules (templates/quant/swiglu_*.py) on a stub runtime.

The op modules are loaded into a throw-away package whose ``_runtime`` records variant
selections and launches instead of loading cubins (``_args`` is the real one), so the checks
of the non-tensor arguments and of the shapes tying tensors together run without a GPU:
every bad input must raise an error naming its argument before anything is launched.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
import torch

from tests.op_stub import stub_package

OPS = ("swiglu_forward_and_per_token_cast", "swiglu_backward_and_per_token_cast",
       "swiglu_forward_and_per_channel_cast_and_transpose")
@pytest.fixture(scope="module")
def stub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, ModuleType]]:
    """(the quant package of op modules, the stub _runtime)."""
    with stub_package(tmp_path_factory.mktemp("stub"), "swiglu_ops_stub", "quant", OPS) as (modules, runtime):
        yield _Namespace(modules), runtime


class _Namespace(ModuleType):
    def __init__(self, modules: dict[str, ModuleType]) -> None:
        super().__init__("quant")
        for op, module in modules.items():
            setattr(self, op, getattr(module, op))


def _launches(runtime: ModuleType) -> list[Any]:
    launches: list[Any] = runtime.LAUNCHES
    return launches


@pytest.fixture()
def quant(stub: tuple[ModuleType, ModuleType]) -> Any:
    stub[1].LAUNCHES.clear()
    return stub[0]


def _x(rows: int = 4, hidden: int = 2048) -> torch.Tensor:
    return torch.randn(rows, 2 * hidden).bfloat16()


# --- forward per-token ---------------------------------------------------------------------


def test_forward_selects_and_launches(quant: Any, stub: tuple[ModuleType, ModuleType]) -> None:
    pos = torch.tensor([0, 1, -1, 3], dtype=torch.int32)
    q, sf = quant.swiglu_forward_and_per_token_cast(_x(), "e4m3", 128, pos, torch.rand(2, 2), round_sf=True)
    assert q.shape == (4, 2048) and q.dtype == torch.float8_e4m3fn and sf.shape == (4, 16)
    ((name, values, args),) = _launches(stub[1])
    assert name == "swiglu_forward_and_per_token_cast"
    assert values == {"hidden": 2048, "npc": 128, "with_weights": True, "with_pos_to_expert": False}
    assert args[3] is pos and args[5].shape == (1,)  # pos_to_expert: a placeholder
    assert args[6] == math.inf and args[7] == 1  # no clamp = +inf; round_sf is a runtime 0/1 flag


def test_forward_per_row_scale_and_clamp(quant: Any, stub: tuple[ModuleType, ModuleType]) -> None:
    _, sf = quant.swiglu_forward_and_per_token_cast(_x(hidden=2560), "e4m3", 2560, swiglu_clamp_value=7)
    assert sf.shape == (4, 1)
    ((_, values, args),) = _launches(stub[1])
    assert values["npc"] == 2560 and values["with_weights"] is False and args[6:] == (7.0, 0)


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"x": "x"}, TypeError, "x"),
    ({"x": torch.zeros(4, 2, 4096).bfloat16()}, ValueError, "x"),
    ({"x": torch.zeros(4, 4096)}, TypeError, "x"),
    ({"x": torch.zeros(4, 300).bfloat16()}, ValueError, "x"),
    ({"fmt": "e2m1"}, ValueError, "fmt"),
    ({"num_per_channels": 64}, ValueError, "num_per_channels"),
    ({"num_per_channels": True}, ValueError, "num_per_channels"),
    ({"num_per_channels": 128.0}, TypeError, "num_per_channels"),
    ({"topk_weights": torch.rand(2, 2)}, ValueError, "pos_to_token_topk"),
    ({"pos_to_token_topk": torch.zeros(4, dtype=torch.int32)}, ValueError, "topk_weights"),
    ({"pos_to_token_topk": torch.zeros(5, dtype=torch.int32), "topk_weights": torch.rand(2, 2)}, ValueError,
     "pos_to_token_topk"),
    ({"pos_to_token_topk": torch.zeros(4, dtype=torch.int32), "topk_weights": torch.rand(4)}, ValueError,
     "topk_weights"),
    ({"pos_to_expert": torch.zeros(4, 1, dtype=torch.int32)}, ValueError, "pos_to_expert"),
    ({"swiglu_clamp_value": 0.0}, ValueError, "swiglu_clamp_value"),
    ({"swiglu_clamp_value": float("nan")}, ValueError, "swiglu_clamp_value"),
    ({"use_tma_aligned_col_major_sf": True}, NotImplementedError, "use_tma_aligned_col_major_sf"),
    ({"use_packed_ue8m0": True}, NotImplementedError, "use_packed_ue8m0"),
    ({"clamped_count": torch.zeros(3, dtype=torch.int64)}, NotImplementedError, "clamped_count"),
    ({"sf_clamp_min": 1e-3}, NotImplementedError, "sf_clamp_min"),
])
def test_forward_errors_name_the_argument_before_any_launch(
        quant: Any, stub: tuple[ModuleType, ModuleType], kwargs: dict[str, Any], error: type[Exception],
        name: str) -> None:
    args: dict[str, Any] = {"x": _x(), "fmt": "e4m3", "num_per_channels": 128}
    args.update(kwargs)
    with pytest.raises(error, match=rf"^{name}\b"):
        quant.swiglu_forward_and_per_token_cast(**args)
    assert _launches(stub[1]) == []


# --- backward ------------------------------------------------------------------------------


def _bwd_args(rows: int = 4, hidden: int = 2048, npc: int = 128) -> dict[str, Any]:
    data = torch.zeros(rows, 2 * hidden).to(torch.float8_e4m3fn)
    return {
        "x": (data, torch.ones(rows, 2 * hidden // npc)),
        "grad_out": torch.zeros(rows, hidden).bfloat16(),
        "weight": torch.rand(2, 2),
        "pos_to_token_topk": torch.tensor([0, 1, 2, 3], dtype=torch.int32)[:rows],
        "token_topk_to_pos": torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
        "num_per_channels": npc,
    }


def test_backward_selects_and_launches(quant: Any, stub: tuple[ModuleType, ModuleType]) -> None:
    out, (q, q_sf), x_grad, weight_grad = quant.swiglu_backward_and_per_token_cast(**_bwd_args(npc=32),
                                                                                  swiglu_clamp_value=0.5)
    assert out.shape == (4, 2048) and out.dtype == torch.bfloat16
    assert q.shape == (4, 4096) and q_sf.shape == (4, 128) and x_grad.shape == (4, 4096)
    assert weight_grad.shape == (2, 2) and weight_grad.dtype == torch.float32
    ((name, values, args),) = _launches(stub[1])
    assert name == "swiglu_backward_and_per_token_cast" and values == {"hidden": 2048, "npc": 32}
    assert len(args) == 13 and args[-2:] == (0.5, 0)


def test_backward_without_rows_zeroes_weight_grad(quant: Any) -> None:
    args = _bwd_args(rows=0)
    args["token_topk_to_pos"] = torch.full((2, 2), -1, dtype=torch.int32)
    *_, weight_grad = quant.swiglu_backward_and_per_token_cast(**args)
    assert torch.equal(weight_grad, torch.zeros(2, 2))


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"x": torch.zeros(4, 4096)}, TypeError, "x"),
    ({"x": (torch.zeros(4, 4096), torch.ones(4, 32))}, TypeError, "x"),
    ({"x": (torch.zeros(4, 1536).to(torch.float8_e4m3fn), torch.ones(4, 12))}, ValueError, "x"),
    ({"x": (torch.zeros(4, 4096).to(torch.float8_e4m3fn), torch.ones(4, 31))}, ValueError, "x_sf"),
    ({"num_per_channels": 64}, ValueError, "num_per_channels"),
    ({"grad_out": torch.zeros(4, 4096).bfloat16()}, ValueError, "grad_out"),
    ({"weight": torch.rand(4)}, ValueError, "weight"),
    ({"pos_to_token_topk": torch.zeros(3, dtype=torch.int32)}, ValueError, "pos_to_token_topk"),
    ({"token_topk_to_pos": torch.zeros(2, 3, dtype=torch.int32)}, ValueError, "token_topk_to_pos"),
    ({"swiglu_clamp_value": -0.5}, ValueError, "swiglu_clamp_value"),
])
def test_backward_errors_name_the_argument_before_any_launch(
        quant: Any, stub: tuple[ModuleType, ModuleType], kwargs: dict[str, Any], error: type[Exception],
        name: str) -> None:
    args = _bwd_args()
    args.update(kwargs)
    with pytest.raises(error, match=rf"^{name}\b"):
        quant.swiglu_backward_and_per_token_cast(**args)
    assert _launches(stub[1]) == []


# --- forward per-channel -------------------------------------------------------------------


def test_per_channel_selects_and_launches(quant: Any, stub: tuple[ModuleType, ModuleType]) -> None:
    q, sf = quant.swiglu_forward_and_per_channel_cast_and_transpose(_x(256), "e4m3", 32, round_sf=True)
    assert q.shape == (2048, 256) and sf.shape == (8, 2048)
    q, sf = quant.swiglu_forward_and_per_channel_cast_and_transpose(_x(256), "e4m3", 128, without_transpose=True)
    assert q.shape == (256, 2048) and sf.shape == (2, 2048)
    (_, first, _), (_, second, args) = _launches(stub[1])
    assert first == {"hidden": 2048, "npt": 32, "without_transpose": False}
    assert second == {"hidden": 2048, "npt": 128, "without_transpose": True}
    assert args[-2:] == (math.inf, 0)


def test_per_channel_without_tokens_launches_nothing(quant: Any, stub: tuple[ModuleType, ModuleType]) -> None:
    q, sf = quant.swiglu_forward_and_per_channel_cast_and_transpose(_x(0), "e4m3", 128)
    assert q.shape == (2048, 0) and sf.shape == (0, 2048) and _launches(stub[1]) == []


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"x": _x(100)}, ValueError, "x"),
    ({"x": torch.zeros(128, 4096)}, TypeError, "x"),
    ({"x": torch.zeros(128, 200).bfloat16()}, ValueError, "x"),
    ({"fmt": "e5m6"}, ValueError, "fmt"),
    ({"num_per_tokens": 64}, ValueError, "num_per_tokens"),
    ({"swiglu_clamp_value": -1}, ValueError, "swiglu_clamp_value"),
])
def test_per_channel_errors_name_the_argument_before_any_launch(
        quant: Any, stub: tuple[ModuleType, ModuleType], kwargs: dict[str, Any], error: type[Exception],
        name: str) -> None:
    args: dict[str, Any] = {"x": _x(128), "fmt": "e4m3", "num_per_tokens": 128}
    args.update(kwargs)
    with pytest.raises(error, match=rf"^{name}\b"):
        quant.swiglu_forward_and_per_channel_cast_and_transpose(**args)
    assert _launches(stub[1]) == []

