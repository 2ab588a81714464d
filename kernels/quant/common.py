"""Code shared by the quant templates: NaN-keeping clamps, power-of-two scales, the e2m1 encode, bf16 words,
fragment layouts and 16-byte stores.

A template imports what it uses (``from tkc_templates.quant.common import clamp_min_max``); tkc maps
``tkc_templates`` onto the templates folder while it lowers, and keys every variant that imports this module on
its source, so an edit here rebuilds exactly those variants.
"""

import tilelang.language as T

# The SwiGLU clamps keep NaN, as torch.clamp does in the reference (and as skipping the clamp does: a missing clamp
# is +inf): PTX min.NaN / max.NaN, one FMNMX.NAN each (sm_80 and later). T.min / T.max lower to fminf / fmaxf,
# which would turn a NaN x into the clamp bound. A kernel that clamps writes T.import_source(CLAMP_SOURCE) in its
# body.
CLAMP_SOURCE = r"""
__device__ __forceinline__ float tkc_min_nan(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
__device__ __forceinline__ float tkc_max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}
"""


def clamp_max(v, c):
    """min(v, c), NaN kept."""
    return T.call_pure_extern("float32", "tkc_min_nan", v, c)


def clamp_min_max(v, c):
    """min(max(v, -c), c), NaN kept."""
    return clamp_max(T.call_pure_extern("float32", "tkc_max_nan", v, -c), c)


def power_of_two_inverse(sf_bits):
    """1 / sf of a scale rounded up to 2^e (fp32 bits sf_bits): 2^-e exactly, the biased exponent
    negated; +0 for an Inf sf (an Inf amax), as 448 / Inf is without round_sf, where the plain
    negation would give -Inf (and codes of the wrong sign)."""
    return T.reinterpret(T.uint32(0x7F000000) - T.min(sf_bits, T.uint32(0x7F000000)), "float32")


def e2m1_nibble_bits(v, saturate=True, nan_to_zero=True):
    """fp32 pattern of 2^23 + the 4-bit e2m1 code of ``v`` (round to nearest even, saturate at 6).

    As a function of a = |v| the code is RNE(g(a)) capped at 7, where g = min(2a, a + 2, a / 2 + 4)
    is the concave line through the code points (0.5 apart below 2, 1 apart up to 4, 2 apart above)
    and RNE rounds to the nearest integer, ties to even: e2m1's ties are the half integers of g and
    its even codes the even integers. RNE is monotone, so RNE(min(...)) is the min of the three
    rounded lines, and each rounded line is one FFMA with the magic 2^23 (fp32 spacing 1 on
    [2^23, 2^24)): a * 2 + 2^23 rounds once, to 2^23 + RNE(2a). The min with 2^23 + 7 saturates
    (Inf included); max(|v|, 0) turns a NaN into 0 (max returns the other operand), so a NaN gives
    code 0; the sign bit adds 8 (so -0.0 gives 0x8, KERNELS.md), exactly, below 2^24. The magnitude
    is bit-identical to the comparison encode's for all 2^32 fp32 patterns
    (benchmarks/tuning/e2m1_encode_check.c), with or without FMA contraction (2a and a / 2 are
    exact). Float adds, multiplies and mins: most of it issues on the FMA pipes, where an integer
    rounding would take the half-rate ALU pipe.

    ``saturate=False``: the caller guarantees |v| < 7 or NaN, and the cap is left out.
    ``nan_to_zero=False``: a unit holding a NaN's code is dropped whole by the caller, and the max is left out
    too (|v| folds into the lines' operands).
    """
    a = T.max(T.abs(v), T.float32(0.0)) if nan_to_zero else T.abs(v)
    third = a * T.float32(0.5) + T.float32(8388612.0)
    if saturate:
        third = T.min(third, T.float32(8388615.0))
    # The three lines are positive floats, ordered as their patterns are: one 3-way integer min
    # (VIMNMX3, sm_90) instead of two float ones.
    lines = T.call_extern(
        "int32", "__vimin3_s32",
        T.reinterpret(a * T.float32(2.0) + T.float32(8388608.0), "int32"),
        T.reinterpret(a + T.float32(8388610.0), "int32"),
        T.reinterpret(third, "int32"),
    )
    # The sign bit of v adds 8 to the code (in the pattern's integer units, as 2^23's spacing is 1):
    # -0.0 and negatives that round to zero give 0x8, as TileKernels' encode does.
    return T.Cast("uint32", lines) + ((T.reinterpret(v, "uint32") >> T.uint32(28)) & T.uint32(8))


def x_value(x_words, i, e):
    """fp32 value of element e of row i of bf16 x read as 32-bit words of two values. Word w holds elements 2w
    (low half) and 2w + 1 (high half); a bf16 is the high half of its fp32 pattern, so the high value widens with
    one AND and the low one with one shift."""
    word = x_words[i, e // 2]
    return T.reinterpret(T.shift_left(word, T.uint32(16 - 16 * (e % 2))) & T.uint32(0xFFFF0000), "float32")


def max_abs_halves(halves, word):
    """Both halves' running max of |x| as bf16 bit patterns (which order as the fp32 ones: NaN > Inf > finite):
    one AND clears both signs, and __vimax3_u16x2 is one VIMNMX3.U16x2 (sm_90; the 0 its third operand)."""
    return T.call_extern("uint32", "__vimax3_u16x2", halves, word & T.uint32(0x7FFF7FFF), T.uint32(0))


def halves_amax_bits(halves):
    """The larger half of max_abs_halves' result moved up to its fp32 pattern (int32, for an integer max)."""
    return T.reinterpret(T.max(halves >> T.uint32(16), halves & T.uint32(0xFFFF)) << T.uint32(16), "int32")


def run_layout(width, run, threads):
    """Fragment layout over a tile of ``width`` units per row (values, words of two values, packed q units, amax
    units): flat unit f -> (thread, register slot), thread (f / run) % threads holding units f % run of every
    threads * run slab. Each fragment uses it with run = the thread's chunk in its own units, so a thread holds
    the same values in all of them: moving data between fragments (packing q, a word's halves, a unit's amax)
    needs no exchange."""

    def layout(i, j):
        f = i * width + j
        return f // run % threads, f // (run * threads) * run + f % run

    return layout


# A 16-byte global store as one st.global.v4.b32. nvcc (13.0) turns some `*(uint4*)(p + offset)` stores of
# TileLang's vectorized loops into four 4-byte stores when it cannot re-derive the address's 16-byte alignment from
# a long offset sum (the PTX already holds four st.global.u32): each then writes 4 bytes of 16 sectors per warp
# instruction instead of 16 whole sectors, which costs L2 bandwidth in write-bound kernels. A kernel that stores
# this way writes T.import_source(STORE_SOURCE) in its body; the caller guarantees the 16-byte alignment.
STORE_SOURCE = r"""
__device__ __forceinline__ void tkc_store_v4(void* p, unsigned a, unsigned b, unsigned c, unsigned d) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}
"""


def store_v4(address, a, b, c, d):
    """Store four uint32 words at ``address`` (T.address_of of a global element, 16-byte aligned)."""
    return T.call_extern("handle", "tkc_store_v4", address, a, b, c, d)
