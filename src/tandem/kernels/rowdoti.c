/* The row-by-row kernels of llama.cpp's i-quants and ternary types (iquants.h: decode,
 * verification and prompt chunks alike), and their dequantization, on the GGUF blocks in place.
 *
 * Each 256-weight block is taken apart (iq_unpack) into 16 vectors of 16 int16 values in the
 * weights' order and one float d, with weight = d * value exactly: the grid entry (the tables
 * of iq_grids.h, generated from the gguf package at build time), its sign and its integer
 * sub-scale multiplied together. Then as rowdotn.c: each vector meets the int16 (or int8,
 * widened) activations on _mm256_madd_epi16 (AVX-512: vpdpwssd, its two halves folded into the
 * AVX2 lanes' integers), one float step per block (FLUSH) and blocks.h's lane sum, so every
 * row has the same bits at every row count, thread count and build.
 *
 * The values, and the bound on a lane's integer sum over a block (32 products of int16
 * activations |x| <= 16383 and values |v| <= vmax: 32 * vmax * 16383), below 2^31 for every
 * type, so one float step a block:
 *   type                weight = d' * v                                     vmax   lane sum
 *   IQ2_XXS, _XS, _S    d/8 * (2 ls + 1) * grid * sign, grid 8, 25, 43      1333   < 2^30
 *   IQ3_XXS             d/4 * (2 ls + 1) * grid * sign, grid 4..62          1922   < 2^30
 *   IQ3_S               d * (2 s + 1) * grid * sign, grid 1..15             465    < 2^28
 *   IQ1_S, IQ1_M        d (2 s + 1) (grid +- 1/8) = d/8 * (2 s + 1) *       135    < 2^27
 *                       (8 grid +- 1), grid -1, 0, 1
 *   TQ1_0, TQ2_0        d * (q - 1), q 0..2 (0..3)                          2      < 2^21
 * with ls, s the integer sub-scales (per 32 weights; per 16 in IQ2_XS, IQ2_S, IQ1_M).
 *
 * dequant_row_iq gives d * value, which is llama.cpp's dequantize_row_* bit for bit: d (an
 * fp16, or one over a power of two times it) and value (at most 11 bits) multiply exactly in
 * float32, as the reference's products do.
 *
 * Block layouts (ggml-common.h), per 32 weights b (sub-block):
 *   IQ2_XXS (66 B): d, qs[64]: bytes 8b..8b+3 grid indices (8 weights each, 256 entries),
 *        8b+4..8b+7 a word: four 7-bit sign indices (KSIGNS) and ls in its top 4 bits
 *   IQ3_XXS (98 B): d, qs[64]: bytes 8b..8b+7 grid indices (4 weights each, 256 entries),
 *        then per b a word at 66 + 4b: four 7-bit sign indices (8 weights each) and ls
 *   IQ3_S (110 B): d, qs[64] at 2, qh[8] at 66, signs[32] at 74, scales[4] at 106: grid index
 *        k of b (4 weights each, 512 entries) = qs[8b + k] | bit k of qh[b] << 8; bit j of
 *        signs[4b + l] the sign of weight 8l + j; s = nibble b % 2 of scales[b / 2]
 *   IQ2_XS (74 B): d, qs[32] (16 bits: a 9-bit grid index, 8 weights each, and a 7-bit sign
 *        index), scales[8] at 66: ls of weights 32b..32b+15 the low nibble of scales[b], of
 *        32b+16..32b+31 the high one
 *   IQ2_S (82 B): d, qs[32] at 2, signs[32] at 34, qh[8] at 66, scales[8] at 74: grid index
 *        l of b (8 weights each, 1024 entries) = qs[4b + l] | (bits 2l, 2l + 1 of qh[b]) << 8,
 *        bit j of signs[4b + l] the sign of its weight j; ls as IQ2_XS's
 *   TQ2_0 (66 B): qs[64], d at 64: weight 128h + 32l + m in bits 2l of qs[32h + m]
 *   TQ1_0 (54 B): qs[48], qh[4] at 48, d at 52: five base-3 digits a byte, digit n of byte q
 *        t = ((q * 3^n mod 256) * 3) >> 8; weight 32n + m in qs[m] (m < 32), 160 + 16n + m in
 *        qs[32 + m] (m < 16), 240 + 4n + j in qh[j] (n < 4)
 *   IQ1_S (50 B): d, qs[32] at 2, qh[8] (16 bits) at 34: grid index l of b (8 weights each,
 *        values -1, 0, 1, 2048 entries) = qs[4b + l] | (bits 3l..3l+2 of qh[b]) << 8; s bits
 *        12-14 of qh[b], delta -1/8 where bit 15 is set, else 1/8
 *   IQ1_M (56 B): qs[32], qh[16] at 32, sc[4] (16 bits) at 48: grid index l of b = qs[4b + l]
 *        | (bits 0-2 of qh[2b + l/2], bits 4-6 for odd l) << 8, delta -1/8 where bit 3 (7) is
 *        set; s of weights 32b + 16h.. bits 6 (b % 2) + 3h of sc[b / 2]; d the fp16 whose
 *        nibble i is the top nibble of sc[i]
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "blocks.h"
#include "iq_grids.h"

/* v with lane j negated where bit j of bits (16 bits) is set */
static inline __m256i neg16(__m256i v, uint32_t bits) {
    const __m256i sel = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048,
                                          4096, 8192, 16384, (short)32768);
    const __m256i b = _mm256_set1_epi16((short)bits);
    const __m256i m = _mm256_cmpeq_epi16(_mm256_and_si256(b, sel), sel); /* -1 where set */
    return _mm256_sub_epi16(_mm256_xor_si256(v, m), m);
}

/* two 8-weight grid entries (i0: weights 0-7, i1: 8-15) as 16 int16 */
static inline __m256i grid8x2(const uint64_t *grid, uint32_t i0, uint32_t i1) {
    return _mm256_cvtepi8_epi16(_mm_set_epi64x((long long)grid[i1], (long long)grid[i0]));
}

/* four 4-weight grid entries (weights 0-3, 4-7, ...) as 16 int16 */
static inline __m256i grid4x4(const uint32_t *grid, uint32_t i0, uint32_t i1, uint32_t i2,
                              uint32_t i3) {
    return _mm256_cvtepi8_epi16(_mm_setr_epi32((int)grid[i0], (int)grid[i1], (int)grid[i2],
                                               (int)grid[i3]));
}

/* digit n of 16 bytes (widened) of TQ1_0, pow3 = 3^n: t - 1 */
static inline __m256i tern16(__m256i b, __m256i pow3) {
    const __m256i q = _mm256_and_si256(_mm256_mullo_epi16(b, pow3), _mm256_set1_epi16(255));
    return _mm256_sub_epi16(_mm256_srli_epi16(_mm256_mullo_epi16(q, _mm256_set1_epi16(3)), 8),
                            _mm256_set1_epi16(1));
}

/* the 16 sign bits of two 7-bit sign indices */
static inline uint32_t ksigns2(uint32_t s0, uint32_t s1) {
    return KSIGNS[s0 & 127] | (uint32_t)KSIGNS[s1 & 127] << 8;
}

/* (2 s + 1) q: an integer sub-scale s applied */
static inline __m256i odd_times(__m256i q, uint32_t s) {
    return _mm256_mullo_epi16(q, _mm256_set1_epi16((short)(2 * s + 1)));
}

/* (2 s + 1) q with lane j negated where bit j of signs is set */
static inline __m256i iq_vals(__m256i q, uint32_t signs, uint32_t s) {
    return odd_times(neg16(q, signs), s);
}

/* 8 grid + delta (IQ1_S, IQ1_M: grid -1, 0, 1 and delta +-1 / 8, times 8) */
static inline __m256i iq1_vals(__m256i grid, __m256i delta) {
    return _mm256_add_epi16(_mm256_slli_epi16(grid, 3), delta);
}

/* A 256-weight block at w as v[16] (vector i: weights 16 i .. 16 i + 15) and d: weight = d v */
static inline __attribute__((always_inline)) void iq_unpack(int type, const uint8_t *w,
                                                            __m256i v[16], float *d) {
    switch (type) {
    case T_IQ2_XXS:
        *d = f16(w) * 0.125f;
        for (int b = 0; b < 8; b++) {
            uint32_t g, s;
            memcpy(&g, w + 2 + 8 * b, 4);
            memcpy(&s, w + 6 + 8 * b, 4);
            for (int h = 0; h < 2; h++)
                v[2 * b + h] = iq_vals(grid8x2(IQ2XXS_GRID, (g >> 16 * h) & 255,
                                               (g >> (16 * h + 8)) & 255),
                                       ksigns2(s >> 14 * h, s >> (14 * h + 7)), s >> 28);
        }
        return;
    case T_IQ2_XS:
        *d = f16(w) * 0.125f;
        for (int b = 0; b < 8; b++) {
            uint16_t q[4];
            memcpy(q, w + 2 + 8 * b, 8);
            for (int h = 0; h < 2; h++)
                v[2 * b + h] = iq_vals(grid8x2(IQ2XS_GRID, q[2 * h] & 511, q[2 * h + 1] & 511),
                                       ksigns2(q[2 * h] >> 9, q[2 * h + 1] >> 9),
                                       (w[66 + b] >> 4 * h) & 15);
        }
        return;
    case T_IQ2_S: {
        const uint8_t *qs = w + 2, *sg = w + 34, *qh = w + 66;
        *d = f16(w) * 0.125f;
        for (int b = 0; b < 8; b++)
            for (int h = 0; h < 2; h++) {
                const int l = 4 * b + 2 * h;
                const __m256i g = grid8x2(IQ2S_GRID, qs[l] | ((qh[b] >> 4 * h) & 3) << 8,
                                          qs[l + 1] | ((qh[b] >> (4 * h + 2)) & 3) << 8);
                v[2 * b + h] = iq_vals(g, sg[l] | (uint32_t)sg[l + 1] << 8,
                                       (w[74 + b] >> 4 * h) & 15);
            }
        return;
    }
    case T_IQ3_XXS:
        *d = f16(w) * 0.25f;
        for (int b = 0; b < 8; b++) {
            const uint8_t *g = w + 2 + 8 * b;
            uint32_t s;
            memcpy(&s, w + 66 + 4 * b, 4);
            for (int h = 0; h < 2; h++, g += 4)
                v[2 * b + h] = iq_vals(grid4x4(IQ3XXS_GRID, g[0], g[1], g[2], g[3]),
                                       ksigns2(s >> 14 * h, s >> (14 * h + 7)), s >> 28);
        }
        return;
    case T_IQ3_S: {
        const uint8_t *qs = w + 2, *qh = w + 66, *sg = w + 74, *scales = w + 106;
        *d = f16(w);
        for (int b = 0; b < 8; b++)
            for (int h = 0; h < 2; h++) {
                uint32_t i[4];
                for (int k = 0; k < 4; k++)
                    i[k] = qs[8 * b + 4 * h + k] | ((qh[b] >> (4 * h + k)) & 1) << 8;
                v[2 * b + h] = iq_vals(grid4x4(IQ3S_GRID, i[0], i[1], i[2], i[3]),
                                       sg[4 * b + 2 * h] | (uint32_t)sg[4 * b + 2 * h + 1] << 8,
                                       (scales[b / 2] >> 4 * (b % 2)) & 15);
            }
        return;
    }
    case T_IQ1_S:
        *d = f16(w) * 0.125f;
        for (int b = 0; b < 8; b++) {
            const uint32_t qh = w[34 + 2 * b] | (uint32_t)w[35 + 2 * b] << 8;
            const __m256i delta = _mm256_set1_epi16(qh & 0x8000 ? -1 : 1);
            for (int h = 0; h < 2; h++) {
                const int l = 2 * h;
                const __m256i g = grid8x2(IQ1S_GRID, w[2 + 4 * b + l] | ((qh >> 3 * l) & 7) << 8,
                                          w[3 + 4 * b + l] | ((qh >> (3 * l + 3)) & 7) << 8);
                v[2 * b + h] = odd_times(iq1_vals(g, delta), (qh >> 12) & 7);
            }
        }
        return;
    case T_IQ1_M: {
        uint16_t sc[4];
        memcpy(sc, w + 48, 8);
        *d = _cvtsh_ss((unsigned short)((sc[0] >> 12) | ((sc[1] >> 8) & 0xF0) |
                                        ((sc[2] >> 4) & 0xF00) | (sc[3] & 0xF000))) * 0.125f;
        for (int b = 0; b < 8; b++)
            for (int h = 0; h < 2; h++) {
                const int l = 4 * b + 2 * h, qh = w[32 + 2 * b + h];
                const __m256i delta = _mm256_inserti128_si256( /* weights 0-7, 8-15 */
                    _mm256_castsi128_si256(_mm_set1_epi16(qh & 0x08 ? -1 : 1)),
                    _mm_set1_epi16(qh & 0x80 ? -1 : 1), 1);
                const __m256i g = grid8x2(IQ1S_GRID, w[l] | (qh & 7) << 8,
                                          w[l + 1] | ((qh >> 4) & 7) << 8);
                v[2 * b + h] = odd_times(iq1_vals(g, delta),
                                         (sc[b / 2] >> (6 * (b % 2) + 3 * h)) & 7);
            }
        return;
    }
    case T_TQ1_0: {
        const __m256i b0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)w));
        const __m256i b1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(w + 16)));
        const __m256i b2 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(w + 32)));
        int32_t qh;
        memcpy(&qh, w + 48, 4);
        *d = f16(w + 52);
        for (int n = 0, p = 1; n < 5; n++, p *= 3) {
            const __m256i pow3 = _mm256_set1_epi16((short)p);
            v[2 * n] = tern16(b0, pow3);
            v[2 * n + 1] = tern16(b1, pow3);
            v[10 + n] = tern16(b2, pow3);
        }
        v[15] = tern16(_mm256_cvtepu8_epi16(_mm_set1_epi32(qh)), /* lane 4n + j: qh[j] */
                       _mm256_setr_epi16(1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27));
        return;
    }
    case T_TQ2_0:
        *d = f16(w + 64);
        for (int h = 0; h < 2; h++)
            for (int p = 0; p < 2; p++) {
                const __m256i q = _mm256_cvtepu8_epi16(
                    _mm_loadu_si128((const __m128i *)(w + 32 * h + 16 * p)));
                for (int l = 0; l < 4; l++)
                    v[8 * h + 2 * l + p] = _mm256_sub_epi16(
                        _mm256_and_si256(_mm256_srli_epi16(q, 2 * l), _mm256_set1_epi16(3)),
                        _mm256_set1_epi16(1));
            }
        return;
    }
    *d = 0.f; /* not one of iquants.h's types: no weights */
    for (int i = 0; i < 16; i++)
        v[i] = _mm256_setzero_si256();
}

void dequant_row_iq(int type, const uint8_t *w, int64_t K, float *y) {
    const int64_t bb = iq_block_bytes(type);
    for (int64_t sb = 0; sb < K / 256; sb++, w += bb, y += 256) {
        __m256i v[16];
        int16_t q[256];
        float d;
        iq_unpack(type, w, v, &d);
        for (int i = 0; i < 16; i++)
            _mm256_storeu_si256((__m256i *)(q + 16 * i), v[i]);
        for (int k = 0; k < 256; k++)
            y[k] = d * (float)q[k];
    }
}

/* isum[m] += the block's v[16] against row m's 256 activations at 256 sb (AVX-512: vectors
 * 2k and 2k + 1 side by side against 32 activations, by vpdpwssd, folded to the AVX2 sums) */
#if TQ_AVX512
#define XI16_5(m, o) _mm512_loadu_si512((const void *)(A->q + (m) * A->K + (o)))
#define XI8_5(m, o)                                                                           \
    _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(A->q + (m) * A->K + (o))))
#define DOTI(XLOAD)                                                                           \
    do {                                                                                      \
        __m512i v5[8];                                                                        \
        for (int k = 0; k < 8; k++)                                                           \
            v5[k] = _mm512_inserti64x4(_mm512_castsi256_si512(v[2 * k]), v[2 * k + 1], 1);    \
        for (int m = 0; m < mr; m++) {                                                        \
            __m512i t = _mm512_setzero_si512();                                               \
            for (int k = 0; k < 8; k++)                                                       \
                t = _mm512_dpwssd_epi32(t, v5[k], XI##XLOAD##_5(m, 256 * sb + 32 * k));        \
            isum[m] = _mm256_add_epi32(isum[m], fold512(t));                                  \
        }                                                                                     \
    } while (0)
#else
#define DOTI(XLOAD)                                                                           \
    do {                                                                                      \
        for (int i = 0; i < 16; i++)                                                          \
            for (int m = 0; m < mr; m++)                                                      \
                isum[m] = _mm256_add_epi32(                                                   \
                    isum[m], _mm256_madd_epi16(v[i], X##XLOAD(m, 256 * sb + 16 * i)));        \
    } while (0)
#endif

/* One weight row against up to MR activation rows (acts_t or acts8_t, XLOAD 16 or 8) */
#define ROW_DOT_I(name, acts, XLOAD)                                                          \
    static inline __attribute__((always_inline)) void name(int type, const uint8_t *w,        \
                                                           const acts *A, int mr, float *out) { \
        __m256 acc[MR];                                                                       \
        __m256i isum[MR];                                                                     \
        for (int m = 0; m < MR; m++) {                                                        \
            acc[m] = _mm256_setzero_ps();                                                     \
            isum[m] = _mm256_setzero_si256();                                                 \
        }                                                                                     \
        const int64_t bb = iq_block_bytes(type);                                              \
        for (int64_t sb = 0; sb < A->K / 256; sb++, w += bb) {                                \
            __m256i v[16];                                                                    \
            float d;                                                                          \
            iq_unpack(type, w, v, &d);                                                        \
            DOTI(XLOAD);                                                                      \
            FLUSH(d, 8 * sb);                                                                 \
        }                                                                                     \
        for (int m = 0; m < mr; m++)                                                          \
            out[m] = hsum8(acc[m]);                                                           \
    }

ROW_DOT_I(row_doti16, acts_t, 16)
ROW_DOT_I(row_doti8, acts8_t, 8)

#define ROWSI_FN(fn, acts, mr)                                                                \
    static void fn##_rows_##mr(int t, const uint8_t *W, int64_t rb, int64_t n0, int64_t n1,  \
                               const acts *A, float *y, int64_t N, const float *bias) {      \
        switch (t) {                                                                          \
        case T_IQ2_XXS: ROW_LOOP(fn, T_IQ2_XXS, mr) break;                                    \
        case T_IQ2_XS: ROW_LOOP(fn, T_IQ2_XS, mr) break;                                      \
        case T_IQ2_S: ROW_LOOP(fn, T_IQ2_S, mr) break;                                        \
        case T_IQ3_XXS: ROW_LOOP(fn, T_IQ3_XXS, mr) break;                                    \
        case T_IQ3_S: ROW_LOOP(fn, T_IQ3_S, mr) break;                                        \
        case T_IQ1_S: ROW_LOOP(fn, T_IQ1_S, mr) break;                                        \
        case T_IQ1_M: ROW_LOOP(fn, T_IQ1_M, mr) break;                                        \
        case T_TQ1_0: ROW_LOOP(fn, T_TQ1_0, mr) break;                                        \
        case T_TQ2_0: ROW_LOOP(fn, T_TQ2_0, mr) break;                                        \
        }                                                                                     \
    }

ROW_DOT_TABLE_OF(ROWSI_FN, row_doti16, acts_t, ROW_DOTSI);
ROW_DOT_TABLE_OF(ROWSI_FN, row_doti8, acts8_t, ROW_DOTSI8);

void iq_rows(int type, int bits, int mr, const uint8_t *W, int64_t rb, int64_t n0, int64_t n1,
             const void *xq, const float *xs, int64_t K, float *y, int64_t N,
             const float *bias) {
    if (bits == 16) {
        const acts_t A = {(const int16_t *)xq, xs, NULL, K, K / 32};
        ROW_DOTSI[mr](type, W, rb, n0, n1, &A, y, N, bias);
    } else {
        const acts8_t A = {(const int8_t *)xq, xs, NULL, NULL, K, K / 32};
        ROW_DOTSI8[mr](type, W, rb, n0, n1, &A, y, N, bias);
    }
}
