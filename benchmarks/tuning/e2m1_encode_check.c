/* Exhaustive check: the "magic" and "ffma" e2m1 encodes of templates/quant/{per_token_cast,per_block_cast}.py.j2
 * equal the "compare" encode (KERNELS.md's comparison chain) for all 2^32 fp32 bit patterns, and the
 * "ffma_cast" fast path (no NaN max, no cap) equals it for every |v| < 7 (what the cast modes feed it; a NaN
 * group's words are zeroed by the kernel instead).
 *
 * The CUDA operations the templates lower to are emulated exactly: max / min of floats (PTX
 * max.f32 / min.f32) return the other operand when one is NaN, signalling NaNs included (glibc's
 * fmaxf returns a NaN for a signalling one, hence cuda_max / cuda_min below); fabsf clears the
 * sign bit; comparisons with NaN are false; float addition rounds to nearest even with
 * subnormals kept (tkc's nvcc flags have no -ftz / --use_fast_math). Build without fast-math and
 * without FMA contraction; it takes about 60 s on one core. The ffma encodes are checked twice: with each
 * line as one fmaf (what nvcc's contraction gives) and as a multiply then an add (what it gives without).
 *
 *   gcc -O2 -ffp-contract=off -fno-fast-math -o /tmp/e2m1_check benchmarks/tuning/e2m1_encode_check.c -lm && /tmp/e2m1_check
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static inline uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float value(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline float cuda_max(float a, float b) { return isnan(a) ? b : isnan(b) ? a : (a > b ? a : b); }
static inline float cuda_min(float a, float b) { return isnan(a) ? b : isnan(b) ? a : (a < b ? a : b); }

/* The shipped encode (e2m1_code, encode "compare"). */
static inline int32_t compare_code(float v) {
    float a = fabsf(v);
    uint32_t m = bits(cuda_max(a, 1.0f));
    uint32_t rounded = (m + 0x1FFFFFu + ((m >> 22) & 1u)) >> 22;
    int32_t normal = (int32_t)(rounded < 259u ? rounded : 259u) - 254;
    int32_t magnitude = normal + (a > 0.25f) + (a >= 0.75f);
    return magnitude | (v < 0.0f ? 8 : 0);
}

/* The candidate (encode "magic"): the two comparisons below 1 replaced by one float add. */
static inline int32_t magic_code(float v) {
    float a = fabsf(v);
    uint32_t m = bits(cuda_max(a, 1.0f));
    uint32_t rounded = (m + 0x1FFFFFu + ((m >> 22) & 1u)) >> 22;
    uint32_t normal = rounded < 259u ? rounded : 259u;
    uint32_t sub = bits(cuda_min(cuda_max(a, 0.0f), 1.0f) + 4194304.0f);
    int32_t magnitude = (int32_t)(normal + sub - (254u + 0x4A800000u));
    return magnitude | (v < 0.0f ? 8 : 0);
}

/* The candidate "ffma" (e2m1_nibble_bits): the code as min(RNE(2a), RNE(a + 2), RNE(a / 2 + 4), 7), each line
 * one FFMA onto 2^23 (spacing 1 on [2^23, 2^24)), the three lines' minimum as a signed integer 3-way min of their
 * patterns (VIMNMX3), the sign's 8 as (float)(v < 0) * 8 added in the same domain; the result's pattern less
 * 2^23's is the nibble. fast: the cast modes' form (no NaN max, no cap). */
static inline int32_t imin3(int32_t a, int32_t b, int32_t c) { int32_t m = a < b ? a : b; return m < c ? m : c; }
static inline int32_t ffma_code(float v, int fused, int fast) {
    float a = fast ? fabsf(v) : cuda_max(fabsf(v), 0.0f);
    float l1 = fused ? fmaf(a, 2.0f, 8388608.0f) : a * 2.0f + 8388608.0f;
    float l2 = a + 8388610.0f;
    float l3 = fused ? fmaf(a, 0.5f, 8388612.0f) : a * 0.5f + 8388612.0f;
    if (!fast) l3 = cuda_min(l3, 8388615.0f);
    float lines = value((uint32_t)imin3((int32_t)bits(l1), (int32_t)bits(l2), (int32_t)bits(l3)));
    float sign = (float)(v < 0.0f);
    float nibble = fused ? fmaf(sign, 8.0f, lines) : sign * 8.0f + lines;
    return (int32_t)(bits(nibble) - 0x4B000000u);
}

int main(void) {
    uint64_t mismatches = 0, fast_checked = 0;
    for (uint64_t i = 0; i <= 0xFFFFFFFFull; ++i) {
        float v = value((uint32_t)i);
        int32_t want = compare_code(v);
        int32_t got[4] = {magic_code(v), ffma_code(v, 1, 0), ffma_code(v, 0, 0), want};
        if (fabsf(v) < 7.0f) {  /* false for NaN */
            got[3] = ffma_code(v, 1, 1) == ffma_code(v, 0, 1) ? ffma_code(v, 1, 1) : -1;
            ++fast_checked;
        }
        for (int k = 0; k < 4; ++k)
            if (got[k] != want && mismatches++ < 10)
                printf("mismatch: bits 0x%08x (%g): compare %d, candidate %d gives %d\n", (uint32_t)i, v, want, k, got[k]);
    }
    printf("%llu mismatches over 2^32 fp32 bit patterns (magic, ffma fused and not; ffma_cast on %llu with |v| < 7)\n",
           (unsigned long long)mismatches, (unsigned long long)fast_checked);
    return mismatches != 0;
}
