/* Activation rows quantized per block, before the integer dot products: int16 (the default,
 * max|x| / 16383 steps) and int8 (llama.cpp's Q8_K / Q8_0 scheme, max|x| / 127). One call per
 * row, from the driver (matmul.c). Before them, the elementwise steps of a decoder layer that
 * the driver runs on a row first (tq_pre): rms norm, silu, the residual addition. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "blocks.h"

/* ---- the elementwise steps -------------------------------------------------------------- */

void rms_norm_row(const float *x, const float *w, int64_t n, float eps, float *out) {
    __m256 a = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        a = _mm256_fmadd_ps(v, v, a);
    }
    const __m256 r = _mm256_set1_ps(1.f / sqrtf(hsum8(a) / (float)n + eps));
    for (int64_t i = 0; i < n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), r),
                                                _mm256_loadu_ps(w + i)));
}

void silu_mul_row(const float *g, const float *u, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i += 8) { /* silu(g) * u = g / (1 + e^-g) * u */
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
        const __m256 sg = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.f), e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(sg, _mm256_loadu_ps(u + i)));
    }
}

/* gelu_tanh(g) * u: 0.5 g (1 + tanh(y)) with y = sqrt(2 / pi) (g + 0.044715 g^3), which is
 * g / (1 + e^(-2y)) (silu's form) */
void gelu_mul_row(const float *g, const float *u, int64_t n, float *out) {
    const __m256 c = _mm256_set1_ps(-2.f * 0.7978845608028654f), c3 = _mm256_set1_ps(0.044715f);
    for (int64_t i = 0; i < n; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        const __m256 y = _mm256_fmadd_ps(_mm256_mul_ps(c3, gv), _mm256_mul_ps(gv, gv), gv);
        const __m256 e = exp8(_mm256_mul_ps(c, y));
        const __m256 sg = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.f), e));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(sg, _mm256_loadu_ps(u + i)));
    }
}

void add_row(const float *a, const float *b, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
}

/* ---- activations: int16 per block of `qb` (32, or 256 for the K-quants) ---------------- */

/* max |x[i]| over n values (n a multiple of 8) */
static inline float block_amax(const float *x, int64_t n) {
    const __m256 signbit = _mm256_set1_ps(-0.0f);
    __m256 a = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8)
        a = _mm256_max_ps(a, _mm256_andnot_ps(signbit, _mm256_loadu_ps(x + i)));
    float am[8], amax = 0.f;
    _mm256_storeu_ps(am, a);
    for (int i = 0; i < 8; i++)
        amax = am[i] > amax ? am[i] : amax;
    return amax;
}

#define XQ_MAX 16383.f /* 15 bits: the K-quant integer sums below stay inside int32 */

/* q: K int16; s: K/32 scales (each 32-group gets its block's scale); sum: K/32 float sums.
 * split: each group of 32 stored as its 16 even-indexed values, then its 16 odd-indexed ones,
 * the order in which the Q4_K / Q5_K kernels take the weights apart (k4_nibbles). With
 * split == 3 (the AVX-512 row-by-row Q4_K / Q5_K kernel, two chunks per vector) those halves
 * of the four groups of each 128 values go in the order evens of group 0, of group 2, odds of
 * 0, of 2, evens of 1, of 3, odds of 1, of 3. */
void quantize_row(const float *x, int64_t K, int qb, int split, int16_t *q, float *s,
                  float *sum) {
    /* per 128-bit lane: words 0 2 4 6 1 3 5 7 */
    const __m256i evod = _mm256_broadcastsi128_si256(
        _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
    for (int64_t b0 = 0; b0 < K; b0 += qb) {
        const float amax = block_amax(x + b0, qb);
        const __m256 inv = _mm256_set1_ps(amax > 0.f ? XQ_MAX / amax : 0.f);
        for (int64_t g = b0 / 32; g < (b0 + qb) / 32; g++) {
            const float *xg = x + 32 * g;
            __m256 t = _mm256_setzero_ps();
            __m256i i32[4];
            for (int i = 0; i < 4; i++) {
                const __m256 v = _mm256_loadu_ps(xg + 8 * i);
                t = _mm256_add_ps(t, v);
                i32[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v, inv)); /* nearest even */
            }
            /* packs works per 128-bit lane: [a0..3 b0..3 a4..7 b4..7] -> fix the order */
            __m256i p0 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i32[0], i32[1]), 0xD8);
            __m256i p1 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i32[2], i32[3]), 0xD8);
            if (split) { /* [evens of p0 | odds of p0], the same for p1, then recombined */
                const __m256i e0 = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(p0, evod), 0xD8);
                const __m256i e1 = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(p1, evod), 0xD8);
                p0 = _mm256_permute2x128_si256(e0, e1, 0x20);
                p1 = _mm256_permute2x128_si256(e0, e1, 0x31);
            }
            if (split == 3) { /* the evens and odds of group r = g % 4 at their places */
                const int r = (int)(g % 4);
                int16_t *at = q + 128 * (g / 4) + 16 * ((r % 2) * 4 + r / 2);
                _mm256_storeu_si256((__m256i *)at, p0);
                _mm256_storeu_si256((__m256i *)(at + 32), p1);
            } else {
                _mm256_storeu_si256((__m256i *)(q + 32 * g), p0);
                _mm256_storeu_si256((__m256i *)(q + 32 * g + 16), p1);
            }
            float ts[8], tsum = 0.f;
            _mm256_storeu_ps(ts, t);
            for (int i = 0; i < 8; i++)
                tsum += ts[i];
            s[g] = amax / XQ_MAX;
            sum[g] = tsum;
        }
    }
}

/* ---- int8 per block of `qb` (llama.cpp's Q8_K / Q8_0; rowdot8.c takes them) -------------
 * x~ = d * q8, d = max|x| / 127 per block of 256 (K-quants) or 32, |x - x~| <= d / 2.
 * q: K int8 (see pairs); s: as quantize_row's; sum: per 32-group s * (sum of q); bs: K/16
 * sums of q (in the order of x, whatever pairs says). */

void quantize_row8(const float *x, int64_t K, int qb, int8_t *q, float *s, float *sum,
                   int16_t *bs, int pairs) {
    /* pairs: each 128 values stored as their 32-groups 0, 2, 1, 3: the AVX-512 Q4_K / Q5_K
     * kernel then reads the activations of two chunks' low nibbles (groups 0 and 2), and of
     * their high nibbles (1 and 3), with one 512-bit load each.
     * qb = 16 (the Q4_0 / Q5_0 groups' down projection): a scale per 16 values, s[2g + h] for
     * half h of 32-group g (the row then holds K / 16 scales); otherwise s[g], one per 32
     * values, the same for all 32-groups of a block of qb */
    static const int slot[4] = {0, 2, 1, 3};
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    const int step = qb < 32 ? 32 : qb;
    for (int64_t b0 = 0; b0 < K; b0 += step) {
        const float amax = qb < 32 ? 0.f : block_amax(x + b0, qb);
        for (int64_t g = b0 / 32; g < (b0 + step) / 32; g++) {
            const float *xg = x + 32 * g;
            float am[2] = {amax, amax};
            if (qb < 32) {
                am[0] = block_amax(xg, 16);
                am[1] = block_amax(xg + 16, 16);
            }
            const __m256 inv[2] = {_mm256_set1_ps(am[0] > 0.f ? 127.f / am[0] : 0.f),
                                   _mm256_set1_ps(am[1] > 0.f ? 127.f / am[1] : 0.f)};
            __m256i i32[4];
            for (int i = 0; i < 4; i++)
                i32[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xg + 8 * i), inv[i / 2]));
            for (int h = 0; h < 2; h++) { /* sums of the int8 values per 16 */
                int32_t v[8], acc = 0;
                _mm256_storeu_si256((__m256i *)v, _mm256_add_epi32(i32[2 * h], i32[2 * h + 1]));
                for (int i = 0; i < 8; i++)
                    acc += v[i];
                bs[2 * g + h] = (int16_t)acc;
            }
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i32[0], i32[1]),
                                           _mm256_packs_epi32(i32[2], i32[3]));
            const int64_t at = pairs ? g - g % 4 + slot[g % 4] : g;
            _mm256_storeu_si256((__m256i *)(q + 32 * at), _mm256_permutevar8x32_epi32(p, order));
            /* the sum of the rounded values, as llama.cpp's Q8 blocks carry it: the weights'
             * offsets (mins, Q4_0's -8 d, ...) then meet the same activations as the q do, and
             * their rounding errors cancel. With the float sum of x instead, a Q4_K product's
             * error was several times that of rounding x to Q8_K, and so was the target's
             * next-token KL divergence from float32 activations against llama.cpp's
             * (docs/numerics.md; bench/results/kl-divergence-mixed for today's) */
            if (qb < 32) {
                s[2 * g] = am[0] / 127.f;
                s[2 * g + 1] = am[1] / 127.f;
                sum[g] = s[2 * g] * (float)bs[2 * g] + s[2 * g + 1] * (float)bs[2 * g + 1];
            } else {
                s[g] = amax / 127.f;
                sum[g] = s[g] * (float)(bs[2 * g] + bs[2 * g + 1]);
            }
        }
    }
}

/* An int8 activation row at byte K of its 2K bytes, widened in place to K int16 in the
 * values' own order (the prompt kernel's rowdotn.c types; gemm_widen8 reorders for the others) */
void gemm_widen8n(int16_t *row, int64_t K) { /* gemm_widen8 without the reordering */
    const int8_t *src = (const int8_t *)row + K;
    for (int64_t g = 0; g < K / 32; g++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(src + 32 * g));
        const __m256i a = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
        const __m256i b = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1));
        _mm256_storeu_si256((__m256i *)(row + 32 * g), a);
        _mm256_storeu_si256((__m256i *)(row + 32 * g + 16), b);
    }
}
