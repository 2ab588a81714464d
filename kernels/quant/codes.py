"""Decoding of the FP4 codes, shared by the kernels that read them: the cast back and the fused re-quantization.

Both must turn a code into the same fp32 value for the re-quantization to equal the cast back followed by the
fp32 cast bit for bit, so the decode lives here once. Imported by absolute name
(``from tkc_templates.quant.codes import e2m1_value``); its source is part of the importing variants' cache keys.
"""

import tilelang.language as T


def e2m1_value(code):
    """The fp32 value of the 4-bit e2m1 ``code`` (int32, 0..15), exactly.

    e2m1 is (sign, 2 exponent bits with bias 1, 1 mantissa bit). Placed at fp32 bit 31 (sign)
    and bits 22..24 (exponent, mantissa), the magnitude bits read as an fp32 whose exponent field
    is the e2m1 one: a normal number 2^(e - 127) (1 + m / 2) for e >= 1 and the subnormal
    m * 2^-127 for e = 0, i.e. the e2m1 value times 2^-126 in both cases (e2m1 subnormals line
    up with fp32 ones). Multiplying by 2^126 is then exact: codes 0..7 give 0, 0.5, 1, 1.5, 2,
    3, 4, 6 and 8 gives -0.0. Integer logic plus one multiply: no FP4 conversion instruction, and
    the fp32 subnormal 2^-127 needs nvcc's default -ftz=false (tkc never passes fast-math).
    """
    bits = ((code & 8) << 28) | ((code & 7) << 22)
    return T.reinterpret(T.Cast("uint32", bits), "float32") * T.float32(2.0**126)
