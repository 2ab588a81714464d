"""mhc.mhc_multilayer_recompute: the layer inputs and residual streams of several layers rebuilt in one launch.

TileKernels' ``mhc_multilayer_recompute`` (``tile_kernels.mhc.multilayer_recompute_kernel``, re-exported by
``modeling.mhc.ops``): activation recomputation for the backward pass. From the first layer's streams and
each layer's saved mixes and sublayer output, it writes every layer's input (``mhc_pre_apply_mix``) and
every layer's output streams (``mhc_post``) into the caller's tensors, bit for bit what those ops return.
Kernel in kernels/mhc/multilayer_recompute.py.j2 (kernel_specs/mhc_recompute.yaml): the token count,
hidden and the layer count are runtime sizes; the per-layer tensors reach the kernel through an int64
table of their addresses, copied to the device for each call (as TileKernels does).

The op is in place and launches through ``_launch``, a module-level function of the caller's tensors:
the table is built from the real tensors at launch time, so that torch.compile, which traces the plan
with fake tensors, replays the same launch with the real ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .._op import Plan, launch, op
from .._runtime import get_kernel

__all__ = ["mhc_multilayer_recompute"]

_kernel = get_kernel("mhc_multilayer_recompute")
_CAPTURED_TABLES: list[torch.Tensor] = []


def _list(name: str, value: object) -> list[torch.Tensor]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in value):
        raise TypeError(f"{name}: expected a list of torch.Tensor, got {type(value).__name__}")
    return list(value)


def _check(name: str, t: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
    """A ValueError naming ``name`` unless t is a contiguous ``dtype`` tensor of ``shape`` on ``device``."""
    if tuple(t.shape) != shape or t.dtype != dtype or t.device != device or not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous {str(dtype).removeprefix('torch.')} tensor of shape "
                         f"{shape} on {device}, got {str(t.dtype).removeprefix('torch.')} {tuple(t.shape)} on "
                         f"{t.device}{'' if t.is_contiguous() else ' (not contiguous)'}")


def _launch(num_post: int, initial_residual: torch.Tensor, *tensors: torch.Tensor) -> None:
    """The launch over the real tensors: ``tensors`` are the pre mixes and layer inputs (num_layers each), then
    the layer outputs, post mixes, comb mixes and residuals (num_post each), as the plan orders them."""
    m, hidden = int(initial_residual.shape[-2]), int(initial_residual.shape[-1])
    if initial_residual.numel() == 0:
        return  # no tokens (or no columns): nothing to recompute, no table to copy
    num_layers = (len(tensors) - 4 * num_post) // 2
    addresses = [t.data_ptr() for t in tensors[:2 * num_layers]]
    for row in range(4):  # rows past num_post are never read
        start = 2 * num_layers + row * num_post
        addresses += [t.data_ptr() for t in tensors[start:start + num_post]] + [0] * (num_layers - num_post)
    device = initial_residual.device
    # A pinned host table copied on the launch's stream: the kernel reads it after the copy, and the pinned
    # block is not reused before the copy has run (torch records the copy's stream on it).
    table = torch.tensor(addresses, dtype=torch.int64, pin_memory=device.type == "cuda")
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # A CUDA graph replays the copy from this host memory: it must outlive the graph, whose lifetime the
        # op cannot see, so tables made under capture are kept (a few hundred bytes a capture).
        _CAPTURED_TABLES.append(table)
    table = table.view(6, num_layers).to(device, non_blocking=True)
    # 16-byte vectors need every tensor's start 16-byte aligned (hidden % 8 == 0 keeps the rows aligned).
    aligned = hidden % 8 == 0 and all(t.data_ptr() % 16 == 0 for t in (initial_residual, *tensors))
    _kernel.variant(m, 8 if aligned else 1)(initial_residual.view(-1, m, hidden), table, num_post)


@op(mutates=("layer_input_list", "residual_list"), out=False)
def mhc_multilayer_recompute(initial_residual: torch.Tensor, pre_mix_list: Sequence[torch.Tensor],
                             layer_output_list: Sequence[torch.Tensor], post_mix_list: Sequence[torch.Tensor],
                             comb_mix_list: Sequence[torch.Tensor], layer_input_list: Sequence[torch.Tensor],
                             residual_list: Sequence[torch.Tensor]) -> Plan:
    """Recompute the layer inputs and residual streams of ``num_layers`` consecutive mHC layers, in place.

    With ``r_0 = initial_residual``, for each layer i: ``layer_input_list[i] = mhc_pre_apply_mix(r_i,
    pre_mix_list[i])`` and, for i < num_post, ``residual_list[i] = r_{i+1} = mhc_post(layer_output_list[i],
    r_i, post_mix_list[i], comb_mix_list[i])``, each bit for bit what that op returns.

    Args:
        initial_residual: bfloat16 CUDA tensor (..., mhc_mult, hidden), contiguous: the first layer's streams.
        pre_mix_list: num_layers float32 tensors (..., mhc_mult, 1).
        layer_output_list: num_post bfloat16 tensors (..., hidden): the sublayers' outputs.
        post_mix_list: num_post float32 tensors (..., mhc_mult, 1).
        comb_mix_list: num_post float32 tensors (..., mhc_mult, mhc_mult).
        layer_input_list: num_layers bfloat16 tensors (..., hidden), written.
        residual_list: num_post bfloat16 tensors (..., mhc_mult, hidden), written.

    num_layers >= 1 and num_post is num_layers or num_layers - 1; every tensor contiguous, on
    initial_residual's device, its leading dimensions those of initial_residual.

    Returns:
        None: the results are in layer_input_list and residual_list.
    """
    if not isinstance(initial_residual, torch.Tensor):
        raise TypeError(f"initial_residual: expected a torch.Tensor, got {type(initial_residual).__name__}")
    if initial_residual.dim() < 2:
        raise ValueError(f"initial_residual: expected a tensor (..., mhc_mult, hidden), got shape "
                         f"{tuple(initial_residual.shape)}")
    *lead, m, h = (int(d) for d in initial_residual.shape)
    device = initial_residual.device
    _check("initial_residual", initial_residual, (*lead, m, h), torch.bfloat16, device)
    pre, inputs = _list("pre_mix_list", pre_mix_list), _list("layer_input_list", layer_input_list)
    outputs, posts = _list("layer_output_list", layer_output_list), _list("post_mix_list", post_mix_list)
    combs, residuals = _list("comb_mix_list", comb_mix_list), _list("residual_list", residual_list)
    num_layers, num_post = len(pre), len(outputs)
    if num_layers == 0:
        raise ValueError("pre_mix_list: expected at least one layer, got an empty list")
    if len(inputs) != num_layers:
        raise ValueError(f"layer_input_list: expected {num_layers} tensors (one per pre mix), got {len(inputs)}")
    for name, got in (("post_mix_list", posts), ("comb_mix_list", combs), ("residual_list", residuals)):
        if len(got) != num_post:
            raise ValueError(f"{name}: expected {num_post} tensors (one per layer output), got {len(got)}")
    if num_post not in (num_layers - 1, num_layers):
        raise ValueError(f"layer_output_list: expected num_layers ({num_layers}) or num_layers - 1 tensors, got "
                         f"{num_post}")
    lists = (("pre_mix_list", pre, (*lead, m, 1), torch.float32),
             ("layer_input_list", inputs, (*lead, h), torch.bfloat16),
             ("layer_output_list", outputs, (*lead, h), torch.bfloat16),
             ("post_mix_list", posts, (*lead, m, 1), torch.float32),
             ("comb_mix_list", combs, (*lead, m, m), torch.float32),
             ("residual_list", residuals, (*lead, m, h), torch.bfloat16))
    for name, tensors, shape, dtype in lists:
        for i, t in enumerate(tensors):
            _check(f"{name}[{i}]", t, shape, dtype, device)
    return launch(_launch, num_post, initial_residual, *pre, *inputs, *outputs, *posts, *combs, *residuals)
