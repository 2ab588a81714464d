"""What mhc_pre_norm_fn and mhc_pre_big_fuse share: their argument checks and the forward's split-K GEMM
(kernels/mhc/norm_fn_fwd.py.j2's ``weights`` stage, then ``mma`` on the tensor cores or ``dots`` on CUDA
cores), whose GEMM and split count both must choose alike (mhc_pre_big_fuse's outputs equal those of the
ops it fuses, bit for bit)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from .._args import not_built
from .._op import Empty, Plan, empty, launch, out, size
from .._runtime import get_kernel, sm_count

BUILT_MHC_MULT = (4,)  # kernel_specs/mhc_norm.yaml's grid

_weights = get_kernel("mhc_norm_fn_weights")
_dots = get_kernel("mhc_norm_fn_dots")
_mma = get_kernel("mhc_norm_fn_mma")

# The mma stage's Config.tile_tokens and tile_k: K must be a multiple of MMA_STEP (the spec requires it),
# and a split owns a whole number of steps.
MMA_TOKENS_PER_BLOCK = 128
MMA_STEP = 64

# The dots stage's token tile: Config.threads // Config.groups * Config.tokens (128 // 4 * 2), and the
# vectors of 8 or 4 bf16 a split should at least hold per lane group (8 steps of its 4 lanes).
DOTS_TOKENS_PER_BLOCK = 64
_DOTS_MIN_SPLIT_VECTORS = 4 * 8
# Blocks per SM the split count aims at: the dots stage's Config.min_blocks (2 for vec 8, 3 for vec 4).
_DOTS_BLOCKS_PER_SM = 2


def streams(residual: object, fn: object, name: str = "mhc_fn") -> tuple[torch.Tensor, torch.Tensor]:
    """residual (..., m, hidden) bf16 and its weights (m * (m + 2), m * hidden) fp32 checked, or a TypeError /
    ValueError / NotImplementedError naming the argument."""
    for arg, t in (("residual", residual), (name, fn)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{arg}: expected a torch.Tensor, got {type(t).__name__}")
    assert isinstance(residual, torch.Tensor) and isinstance(fn, torch.Tensor)
    if residual.dim() < 2:
        raise ValueError(f"residual: expected a tensor (..., mhc_mult, hidden), got shape {tuple(residual.shape)}")
    if residual.dtype != torch.bfloat16:
        raise TypeError(f"residual: expected bfloat16 (TileKernels asserts it), got {residual.dtype}")
    m, hidden = int(residual.shape[-2]), int(residual.shape[-1])
    want = (m * (m + 2), m * hidden)
    if fn.dim() != 2 or tuple(fn.shape) != want:
        raise ValueError(f"{name}: expected shape {want} = (mhc_mult * (mhc_mult + 2), mhc_mult * hidden) for "
                         f"residual of shape {tuple(residual.shape)}, got {tuple(fn.shape)}")
    if fn.dtype != torch.float32:
        raise TypeError(f"{name}: expected float32, got {fn.dtype}")
    if m not in BUILT_MHC_MULT:
        raise not_built("residual", f"mhc_mult = {m} (its dimension -2)", "mhc_norm_fn_dots")
    return residual, fn


def rows(residual: torch.Tensor) -> torch.Tensor:
    """The kernels' (num_tokens, mhc_mult * hidden) view of the streams."""
    return residual.reshape(-1, residual.shape[-2] * residual.shape[-1])


def dots_vec(mhc_hidden: int) -> int:
    """The dots stage's vector width: 16-byte bf16 vectors where K allows, else 8-byte ones."""
    return 8 if mhc_hidden % 8 == 0 else 4


def dots_splits(num_tokens: int, mhc_hidden: int, device: int) -> int:
    """The split count of the CUDA-core GEMM: enough blocks to fill the GPU for a small token count, each
    split long enough that its partial sums cost little beside its share of x."""
    if device < 0:
        return 1  # a tensor elsewhere: the launcher refuses it by name
    tiles = max(1, -(-num_tokens // DOTS_TOKENS_PER_BLOCK))
    wanted = -(-sm_count(device) * _DOTS_BLOCKS_PER_SM // tiles)
    return max(1, min(wanted, mhc_hidden // dots_vec(mhc_hidden) // _DOTS_MIN_SPLIT_VECTORS))


def mma_splits(num_tokens: int, mhc_hidden: int, device: int) -> int:
    """The split count of the tensor-core GEMM: the largest divisor of its K steps that keeps the grid
    within one block per SM (about one block an SM is as fast as more, and fewer leave SMs idle). A token
    count that fills the GPU alone gets one split, whose sums are TileKernels' to the bit."""
    if device < 0:
        return 1  # a tensor elsewhere: the launcher refuses it by name
    tiles = max(1, -(-num_tokens // MMA_TOKENS_PER_BLOCK))
    return _largest_divisor(mhc_hidden // MMA_STEP, max(1, sm_count(device) // tiles))


@functools.lru_cache(maxsize=1024)
def _largest_divisor(n: int, most: int) -> int:
    """The largest divisor of n that is at most ``most`` (cached: the op asks it on every call)."""
    return max(d for d in range(1, min(most, n) + 1) if n % d == 0)


def uses_mma(mhc_hidden: int) -> bool:
    """Whether the tensor-core GEMM tiles K (else the CUDA-core one runs)."""
    return mhc_hidden % MMA_STEP == 0 and mhc_hidden > 0


def gemm_plans(x: torch.Tensor, mhc_mult: int, fn: torch.Tensor, weight: torch.Tensor | None, fn_eff: int,
               dots: int, sqrsum: int, outputs: Sequence[Empty]) -> list[Plan]:
    """The GEMM's launches over x (num_tokens, K): the TF32 weights into output ``fn_eff`` (fn * weight
    where given), then the split partial sums into outputs ``dots`` and ``sqrsum``; ``outputs``: all the
    op's outputs (its plans launch into one set)."""
    placeholder = fn.reshape(-1)  # not read without a weight: any fp32 vector
    mhc_hidden = int(x.shape[1])
    gemm = _mma.variant("mma", mhc_mult) if uses_mma(mhc_hidden) else \
        _dots.variant("dots", mhc_mult, dots_vec(mhc_hidden))
    return [launch(_weights.variant("weights", mhc_mult), fn, placeholder if weight is None else weight,
                   out(fn_eff), int(weight is not None), outputs=outputs),
            launch(gemm, x, out(fn_eff), out(dots), out(sqrsum))]


def gemm_outputs(x: torch.Tensor, fn: torch.Tensor) -> tuple[Empty, Empty, Empty]:
    """The GEMM's outputs: fn_eff like fn, the (n_splits, num_tokens, m3) partial dots and (n_splits,
    num_tokens) partial sqrsums."""
    num_tokens, mhc_hidden = int(x.shape[0]), int(x.shape[1])
    choose = mma_splits if uses_mma(mhc_hidden) else dots_splits
    splits = choose(num_tokens, mhc_hidden, x.get_device())
    m3 = int(fn.shape[0])
    return (empty(torch.float32, size(fn, 0), size(fn, 1)), empty(torch.float32, splits, size(x, 0), m3),
            empty(torch.float32, splits, size(x, 0)))
