/* Exhaustive check: the "magic" e2m1 encode of templates/quant/{per_token_cast,per_block_cast}.py.j2
 * equals the shipped "compare" encode for all 2^32 fp32 bit patterns.
 *
 * The CUDA operations the templates lower to are emulated exactly: max / min of floats (PTX
 * max.f32 / min.f32) return the other operand when one is NaN, signalling NaNs included (glibc's
 * fmaxf returns a NaN for a signalling one, hence cuda_max / cuda_min below); fabsf clears the
 * sign bit; comparisons with NaN are false; float addition rounds to nearest even with
 * subnormals kept (tkc's nvcc flags have no -ftz / --use_fast_math). Build without fast-math and
 * without FMA contraction; it takes about 20 s on one core.
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

int main(void) {
    uint64_t mismatches = 0;
    for (uint64_t i = 0; i <= 0xFFFFFFFFull; ++i) {
        float v = value((uint32_t)i);
        int32_t want = compare_code(v), got = magic_code(v);
        if (want != got && mismatches++ < 10)
            printf("mismatch: bits 0x%08x (%g): compare %d, magic %d\n", (uint32_t)i, v, want, got);
    }
    printf("%llu mismatches over 2^32 fp32 bit patterns\n", (unsigned long long)mismatches);
    return mismatches != 0;
}
