"""The grid of the quant templates' (row tile, column slice) blocks, in memory order (see tile_grid).

Its own module: a template imports it (``from tkc_templates.quant.grid import tile_grid, tile_of``) and is keyed on
its source alone, so an edit here rebuilds only the templates that take their grid from it.
"""

import tilelang.language as T


MAX_GRID_Y = 65535  # CUDA's limit on gridDim.y and gridDim.z


def tile_grid(row_tiles, k_tiles, runtime_k):
    """``T.Kernel`` extents of a grid of (row tile, column slice) blocks in memory order: a row's slices in
    consecutive blocks, so that the blocks resident at one time cover one contiguous stretch of the rows.

    A tile count known at parse time takes one dimension (block b: row tile b / k_tiles, slice b % k_tiles).
    A runtime count (``runtime_k``: hidden is a runtime size) takes the slices down x and the row tiles down y
    and z (at most 65535 each): a block index divided by a runtime count is inlined into every index that uses
    it, each copy a 64-bit division, and a local holding it instead hides the bounds that keep the accesses
    vectorized. Blocks past the last row tile (the last z slab) find every row past num_tokens."""
    if runtime_k:
        return k_tiles, T.min(row_tiles, MAX_GRID_Y), T.ceildiv(row_tiles, MAX_GRID_Y)
    return (row_tiles * k_tiles,)


def tile_of(block, k_tiles, runtime_k):
    """(row tile, column slice) of the block ``T.Kernel(*tile_grid(...))`` gave."""
    if runtime_k:
        pid_k, low, high = block
        return high * MAX_GRID_Y + low, pid_k
    return block // k_tiles, block % k_tiles
