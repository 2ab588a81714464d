"""TileKernels' API beside the kernels: the SM-count knob, the quant types and the FP4 decoder, the
scoring enum; each under the module path TileKernels gives it."""

from __future__ import annotations

import importlib

import pytest
import torch

from tests.gpu.installed import installed_package

tile_kernels_aot, quant, errors, runtime = installed_package()
moe = importlib.import_module("tile_kernels_aot.moe")

pytestmark = pytest.mark.gpu


def _e2m1_value(code: int) -> float:
    """FP4 E2M1 by its definition: sign, 2 exponent bits (bias 1), 1 mantissa bit; exponent 0 is subnormal."""
    sign = -1.0 if code & 8 else 1.0
    exponent, mantissa = (code >> 1) & 3, code & 1
    magnitude = mantissa * 0.5 if exponent == 0 else (1 + mantissa / 2) * 2.0 ** (exponent - 1)
    return sign * magnitude


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_unpack_from_e2m1fn_x2_decodes_every_byte(device: str, dtype: torch.dtype, out_dtype: torch.dtype) -> None:
    codes = torch.arange(256, dtype=torch.int32).to(dtype).to(device).view(2, 4, 32)[:, :, torch.randperm(32)]
    got = quant.unpack_from_e2m1fn_x2(codes, out_dtype)
    assert got.shape == (2, 4, 64) and got.dtype == out_dtype and got.device == codes.device
    byte = codes.view(torch.uint8).to(torch.int64).cpu()
    want = torch.tensor([[_e2m1_value(int(b) & 15), _e2m1_value(int(b) >> 4)] for b in byte.flatten()])
    want = want.reshape(2, 4, 64).to(out_dtype)
    assert torch.equal(got.cpu().view(torch.int16 if out_dtype == torch.bfloat16 else torch.int32),
                       want.view(torch.int16 if out_dtype == torch.bfloat16 else torch.int32))  # -0.0 for code 8
    assert quant.common.unpack_from_e2m1fn_x2 is quant.unpack_from_e2m1fn_x2


def test_unpack_from_e2m1fn_x2_refuses_what_holds_no_codes() -> None:
    with pytest.raises(TypeError, match="x must be int8 or uint8"):
        quant.unpack_from_e2m1fn_x2(torch.zeros(4, dtype=torch.float32))
    with pytest.raises(ValueError, match="at least one dimension"):
        quant.unpack_from_e2m1fn_x2(torch.tensor(3, dtype=torch.uint8))
    with pytest.raises(TypeError, match="out_dtype must be a floating dtype"):
        quant.unpack_from_e2m1fn_x2(torch.zeros(4, dtype=torch.uint8), torch.int32)


def test_quant_tensor_and_scoring_func_are_tilekernels() -> None:
    assert quant.QuantTensor == tuple[torch.Tensor, torch.Tensor] and quant.types.QuantTensor is quant.QuantTensor
    scoring = moe.scoring.ScoringFunc
    assert [(str(f), int(f)) for f in scoring] == [("sigmoid", 0), ("sqrtsoftplus", 1), ("softmax", 2),
                                                   ("identity", 3)]
    assert scoring.from_str("Softmax") is scoring.SOFTMAX
    with pytest.raises(ValueError, match="'tanh' is not a valid ScoringFunc"):
        scoring.from_str("tanh")


def test_set_num_sms_caps_the_persistent_grids_and_changes_no_result() -> None:
    device_sms = tile_kernels_aot.get_device_num_sms()
    assert device_sms == torch.cuda.get_device_properties(0).multi_processor_count
    assert tile_kernels_aot.get_num_sms() == device_sms and tile_kernels_aot.config.get_num_sms() == device_sms
    topk_idx = torch.randint(-1, 32, (4001, 8), device="cuda")
    full = moe.get_fused_mapping(topk_idx, 32, 0, 128)
    try:
        for num_sms in (1, 7, device_sms - 20):
            tile_kernels_aot.set_num_sms(num_sms)
            assert tile_kernels_aot.get_num_sms() == num_sms and runtime.sm_count(0) == num_sms
            capped = moe.get_fused_mapping(topk_idx, 32, 0, 128)
            for a, b in zip(full, capped):
                assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
        for bad in (0, device_sms + 1, 2.0, True):
            with pytest.raises(ValueError, match=f"num_sms must be an int in 1..{device_sms}"):
                tile_kernels_aot.set_num_sms(bad)
    finally:
        tile_kernels_aot.set_num_sms(device_sms)
    assert tile_kernels_aot.get_num_sms() == device_sms
