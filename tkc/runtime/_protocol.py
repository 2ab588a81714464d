"""The binary protocol between the loader (Python) and its compiled launch module (``_launch.c``).

Defined here once. tkc packs the launch contracts and plans with these codes at build time
(``tkc/pack.py``), the loader reads them from this module (it is copied into every package),
and ``tkc/native.py`` writes them as ``_protocol.h``, which ``_launch.c`` includes: every code
below is a ``#define`` of the same name there. Words are little-endian int64.
"""

from __future__ import annotations

import struct

# ---- contract: what check() compares a launcher's tensors with ----------------------------------
# [CONTRACT_VERSION, n_tensors, n_sizes, alignment - 1, device type, written mask,
#  per size (tensor slot, 0 shape | 1 stride, dim, limit or 0),
#  per tensor (dtype, ndim, layout, ndim shape expressions, and for LAYOUT_STRIDES ndim stride expressions),
#  n_requires, per requirement two expressions that must be equal (a spec's requires: "M % 64 == 0")]
CONTRACT_VERSION = 4
KDL_CUDA = 2  # DLDeviceType of CUDA memory
LAYOUT_STRIDES = 0  # strides given per dimension
LAYOUT_ROW_MAJOR = 1  # what Tensor.is_contiguous() accepts
LAYOUT_ANY = 2  # not checked

# Expressions of sizes: [count, then (op, operand) pairs in reverse Polish order].
OP_CONST = 1
OP_SIZE = 2
OP_ADD = 3
OP_SUB = 4
OP_MUL = 5
OP_FLOORDIV = 6
OP_MOD = 7
OP_MAX = 8
OP_MIN = 9

# ---- plan: run()'s launch after a passed check ----------------------------------------------------
# [PLAN_VERSION, n_arguments, n_tensors, argument position of each tensor, cooperative, block x y z,
#  dynamic shared memory, three grid expressions, n_values, per value (source, index, kind letter)]
PLAN_VERSION = 1
FROM_POINTER = 0  # the data pointer of tensor slot index
FROM_SIZE = 1  # runtime size index, as check() read it
FROM_ARGUMENT = 2  # the launcher's argument at position index (a scalar: int(...) or float(...))

# ---- dispatch(): an op's remembered call signatures ---------------------------------------------
# spec: [FAST_VERSION, n_inputs, outputs, per input the mask of its keyed dimensions]
FAST_VERSION = 1
FROM_INPUT = 0  # the op's tensor input at index (the call's leading arguments)
FROM_OUT = 1  # out's tensor at index (out itself when the op returns one tensor)
FROM_CONSTANT = 2  # the entry's constants tuple at index (a scalar or a placeholder tensor)
# Rules: (kind, a, i, b, j, k) over the launcher's arguments.
RULE_SAME_SIZE = 1  # shape[i] of argument a, times k, == shape[j] of argument b
RULE_SIZE_MULTIPLE = 2  # shape[i] of argument a % b == 0
RULE_SIZE_IS = 3  # shape[i] of argument a == b
RULE_STRIDE_BYTES = 4  # stride[i] of argument a, in bytes, % b == 0 where shape[i] > 1
# Call keys: per option a tag, then its value (the tag holds the exact type: 128 == 128.0 == True).
OPTION_NONE = 1
OPTION_FALSE = 2
OPTION_TRUE = 3
OPTION_INT = 4  # then the value (ints beyond 64 bits are not keyed)
OPTION_FLOAT = 5  # then the double's bits
OPTION_STR = 6  # then the UTF-8 length and the bytes, zero-padded to whole words
OPTION_TUPLE = 7  # then the length and the ints

# A dtype as check() reads it from a DLTensor: code | bits << 8 | lanes << 16 (DLPack 1.1 codes;
# a torch that exports a dtype otherwise only makes check() decline: the Python checks decide).
DLPACK_DTYPES = {
    "bfloat16": 4 | 16 << 8 | 1 << 16,
    "float16": 2 | 16 << 8 | 1 << 16,
    "float32": 2 | 32 << 8 | 1 << 16,
    "float64": 2 | 64 << 8 | 1 << 16,
    "float8_e4m3fn": 10 | 8 << 8 | 1 << 16,
    "float8_e5m2": 12 | 8 << 8 | 1 << 16,
    "int8": 0 | 8 << 8 | 1 << 16,
    "uint8": 1 | 8 << 8 | 1 << 16,
    "int16": 0 | 16 << 8 | 1 << 16,
    "int32": 0 | 32 << 8 | 1 << 16,
    "int64": 0 | 64 << 8 | 1 << 16,
    "bool": 6 | 8 << 8 | 1 << 16,
}


# ---- a kernel module's table: each variant's packed contract and plan ----------------------------
# b"TKCT", the count, then per entry its length (-1: none) and its words (tkc/pack.py writes it).
TABLE_MAGIC = b"TKCT"


def unpack_table(data: bytes) -> list[bytes | None]:
    """The entries of a ``_kernels/<kernel>.bin`` table, in order; ValueError for anything else."""
    if data[:4] != TABLE_MAGIC:
        raise ValueError("not a tkc table")
    (count,), offset = struct.unpack_from("<q", data, 4), 12
    entries: list[bytes | None] = []
    for _ in range(count):
        (length,) = struct.unpack_from("<q", data, offset)
        offset += 8
        entries.append(None if length < 0 else data[offset:offset + length])
        offset += max(length, 0)
    return entries
