/* The row-by-row kernels of Q2_K, Q3_K, IQ4_NL, IQ4_XS, F16 and BF16 (decode, verification,
 * and the prompt chunks of IQ4_NL; those of Q2_K, Q3_K and IQ4_XS take gemm.c's prompt kernel
 * with the same bits), and F16 / BF16's own prompt kernel (gemmf_range):
 *
 *   Q2_K, Q3_K, IQ4_XS (256 weights a block) and IQ4_NL (32), with int16 or int8 activations:
 *   each block is taken apart into int16 values (the quant times its integer sub-scale), 16
 *   weights a vector in the weights' order, and each vector meets the activations on
 *   _mm256_madd_epi16 (int8 activations widened). A lane's integer sum over a block is exact and
 *   fits int32 (IQ4_XS, the largest: 32 products of |127 * 32| x 16383 < 2^31); the float step
 *   (FLUSH: once per block) and the final lane sum are blocks.h's, so every row has the same
 *   bits at every row count and thread count;
 *
 *   F16 and BF16, with float32 activations: the weights widened to float32 (exact) and summed
 *   by fma in two sets of eight lanes (even and odd groups of 8 weights), added, then hsum8.
 *   The AVX-512 build holds both sets in one 16-lane register and adds its halves: the same
 *   operations on every lane, so the same bits as the AVX2 build (which makes one pass for each
 *   set, so that ten rows' accumulators fit its sixteen registers).
 *
 * The AVX-512 build takes the 256-weight blocks apart 32 weights at a time and sums with
 * vpdpwssd; its integer sums fold to the AVX2 lanes' integers exactly (DOT256).
 *
 * Block layouts (ggml-common.h), each block's weights in 16-weight vectors i = 8h + 2j + p:
 *   Q2_K (84 B / 256): scales[16] (low nibble sc, high nibble mn), qs[64], d, dmin
 *        vector i: bits 2j of qs[32h + 16p + l]; w = d sc[i] q - dmin mn[i]
 *   Q3_K (110 B / 256): hmask[32], qs[64], scales[12] (16 x 6 bits), d
 *        vector i: q = bits 2j of qs[32h + 16p + l], minus 4 unless bit 4h + j of hmask[16p + l]
 *        is set; w = d (sc[i] - 32) q
 *   IQ4_NL (18 B / 32): d, qs[16]          w[l] = d T[lo(qs[l])], w[l + 16] = d T[hi(qs[l])]
 *   IQ4_XS (136 B / 256): d, scales_h (u16), scales_l[4], qs[128]: per 32 weights b, ls = 4 bits
 *        of scales_l | 2 bits of scales_h << 4 and the 16 bytes qs[16b..] as IQ4_NL's;
 *        w = d (ls - 32) T[q]
 * with T llama.cpp's kvalues_iq4nl. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "blocks.h"

/* isum[m] += the block's v[16] against row m's 256 activations at 256 sb. AVX-512: vectors i
 * and i + 1 side by side, against 32 activations, by vpdpwssd; the two halves of the sum
 * folded give the AVX2 lanes' integers exactly. */
#if TQ_AVX512
#define X16_5(m, o) _mm512_loadu_si512((const void *)(A->q + (m) * A->K + (o)))
#define X8_5(m, o) _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(A->q + (m) * A->K + (o))))
/* unpack256's vectors 2k and 2k + 1 side by side in v5[k], made 32 weights at a time: the
 * same int16 values (vector i = 8h + 2j + p: 2k = 8h + 2j takes p = 0 and 2k + 1 p = 1, whose
 * bytes are adjacent; IQ4_XS: block k's low and high nibbles) */
static inline __attribute__((always_inline)) void unpack512(int type, const uint8_t *w,
                                                            __m512i v5[8], int16_t mn[16],
                                                            float *d, float *dmin) {
    if (type == T_IQ4_XS) {
        const __m128i tab = _mm_loadu_si128((const __m128i *)IQ4NL), m4 = _mm_set1_epi8(0x0F);
        *d = f16(w);
        for (int b = 0; b < 8; b++) {
            const __m128i q = _mm_loadu_si128((const __m128i *)(w + 8 + 16 * b));
            const __m128i lo = _mm_shuffle_epi8(tab, _mm_and_si128(q, m4));
            const __m128i hi = _mm_shuffle_epi8(tab, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
            v5[b] = _mm512_mullo_epi16(
                _mm512_cvtepi8_epi16(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1)),
                _mm512_set1_epi16((short)iq4xs_scale(w, b)));
        }
        return;
    }
    const int three = type == T_Q3_K;
    int16_t sc[16];
    const uint8_t *qs = k23_head(type, w, sc, mn, d, dmin);
    const __m512i m3 = _mm512_set1_epi16(3), one = _mm512_set1_epi16(1),
                  four = _mm512_set1_epi16(4);
    const __m512i H = three ? widen_u8(_mm256_loadu_si256((const __m256i *)w)) : _mm512_setzero_si512();
    for (int h = 0; h < 2; h++) {
        const __m512i B = widen_u8(_mm256_loadu_si256((const __m256i *)(qs + 32 * h)));
        for (int j = 0; j < 4; j++) {
            __m512i q = _mm512_and_si512(_mm512_srl_epi16(B, _mm_cvtsi32_si128(2 * j)), m3);
            if (three)
                q = _mm512_sub_epi16(_mm512_or_si512(q, _mm512_slli_epi16(_mm512_and_si512(
                        _mm512_srl_epi16(H, _mm_cvtsi32_si128(4 * h + j)), one), 2)), four);
            const int i = 8 * h + 2 * j;
            v5[4 * h + j] = _mm512_mullo_epi16(q, _mm512_inserti64x4(
                _mm512_set1_epi16(sc[i]), _mm256_set1_epi16(sc[i + 1]), 1));
        }
    }
}
#define UNPACK_SB() __m512i v5[8]; unpack512(type, w, v5, mn, &d, &dmin)
#define DOT256(XLOAD)                                                                         \
    do {                                                                                      \
        for (int m = 0; m < mr; m++) {                                                        \
            __m512i t = _mm512_setzero_si512();                                               \
            for (int k = 0; k < 8; k++)                                                       \
                t = _mm512_dpwssd_epi32(t, v5[k], XLOAD##_5(m, 256 * sb + 32 * k));           \
            isum[m] = _mm256_add_epi32(isum[m], fold512(t));                                  \
        }                                                                                     \
    } while (0)
#else
#define UNPACK_SB() __m256i v[16]; unpack256(type, w, v, mn, &d, &dmin)
#define DOT256(XLOAD)                                                                         \
    do {                                                                                      \
        for (int i = 0; i < 16; i++)                                                          \
            for (int m = 0; m < mr; m++)                                                      \
                isum[m] = _mm256_add_epi32(isum[m],                                           \
                                           _mm256_madd_epi16(v[i], XLOAD(m, 256 * sb + 16 * i))); \
    } while (0)
#endif
/* Q2_K's sum of mins times row m's 16-value activation sums over super-block sb (an exact
 * integer): int16 activations summed here, int8 ones from quantize_row8's bs */
#define MINS16(m, sb) mins16(mn, A->q + (m) * A->K + 256 * (sb))
#define MINS8(m, sb) mins8(mn, A->bs + (m) * (A->K / 16) + 16 * (sb))

/* One weight row of an integer type against up to MR activation rows (acts: acts_t or acts8_t,
 * XLOAD: X16 or X8, MINS: MINS16 or MINS8): out[m] = dot. Q2_K's mins are a float sum of their
 * own, off[m] (one fmaf per super-block), added after the lane sum as finish_rows adds it. */
#define ROW_DOT_N(name, acts, XLOAD, MINS)                                                    \
    static inline __attribute__((always_inline)) void name(int type, const uint8_t *w,        \
                                                           const acts *A, int mr, float *out) { \
        __m256 acc[MR], offv[MR];                                                             \
        __m256i isum[MR];                                                                     \
        float off[MR];                                                                        \
        for (int m = 0; m < MR; m++) {                                                        \
            acc[m] = offv[m] = _mm256_setzero_ps();                                           \
            isum[m] = _mm256_setzero_si256();                                                 \
            off[m] = 0.f;                                                                     \
        }                                                                                     \
        if (type == T_IQ4_NL) {                                                               \
            const __m128i tab = _mm_loadu_si128((const __m128i *)IQ4NL);                      \
            for (int64_t g = 0; g < A->G; g++, w += 18) {                                     \
                const __m128i q = _mm_loadu_si128((const __m128i *)(w + 2));                  \
                const __m256i v0 = iq4_lo(tab, q), v1 = iq4_hi(tab, q);                       \
                for (int m = 0; m < mr; m++)                                                  \
                    isum[m] = _mm256_add_epi32(_mm256_madd_epi16(v0, XLOAD(m, 32 * g)),        \
                                               _mm256_madd_epi16(v1, XLOAD(m, 32 * g + 16))); \
                FLUSH(f16(w), g);                                                             \
            }                                                                                 \
        } else {                                                                              \
            const int64_t bb = block_bytes(type);                                             \
            for (int64_t sb = 0; sb < A->K / 256; sb++, w += bb) {                            \
                int16_t mn[16];                                                               \
                float d, dmin = 0.f;                                                          \
                UNPACK_SB();                                                                  \
                DOT256(XLOAD);                                                                \
                FLUSH(d, 8 * sb);                                                             \
                for (int m = 0; type == T_Q2_K && m < mr; m++) /* - dmin sum(mn x) */         \
                    off[m] = fmaf((float)MINS(m, sb), -dmin * A->s[m * A->G + 8 * sb], off[m]); \
            }                                                                                 \
        }                                                                                     \
        finish_rows(acc, offv, off, mr, out);                                                 \
    }

ROW_DOT_N(row_dotn16, acts_t, X16, MINS16)
ROW_DOT_N(row_dotn8, acts8_t, X8, MINS8)

/* 8 (16) weights of a float type at w, as float32 */
static inline __m256 wf8(int type, const uint8_t *w) {
    const __m128i h = _mm_loadu_si128((const __m128i *)w);
    return type == T_F16 ? _mm256_cvtph_ps(h)
                         : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#if TQ_AVX512
static inline __m512 wf16(int type, const uint8_t *w) {
#ifdef TQ_SIMDE /* SIMDe 0.7.4 has neither _mm512_cvtph_ps nor _mm512_cvtepu16_epi32 */
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(wf8(type, w))),
                                               _mm256_castps_pd(wf8(type, w + 16)), 1));
#else
    const __m256i h = _mm256_loadu_si256((const __m256i *)w);
    return type == T_F16 ? _mm512_cvtph_ps(h)
                         : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#endif
}

/* A 16-lane float sum as the AVX2 build's two 8-lane sets (lanes 0-7, 8-15) added, then hsum8 */
static inline float hsum16(__m512 a) {
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    return hsum8(_mm256_add_ps(_mm512_castps512_ps256(a), hi));
}
#endif

/* One weight row of F16 / BF16 against up to MR float32 activation rows: out[m] = dot */
static inline __attribute__((always_inline)) void row_dotf(int type, const uint8_t *w,
                                                           const actsf_t *A, int mr, float *out) {
    const int64_t K = A->K;
#if TQ_AVX512
    __m512 acc[MR];
    for (int m = 0; m < MR; m++)
        acc[m] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
        const __m512 wv = wf16(type, w + 2 * k);
        for (int m = 0; m < mr; m++)
            acc[m] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(A->x + m * K + k), acc[m]);
    }
    for (int m = 0; m < mr; m++)
        out[m] = hsum16(acc[m]);
#else
    __m256 a0[MR], a1[MR];
    for (int m = 0; m < MR; m++)
        a0[m] = a1[m] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) { /* the even groups of 8 */
        const __m256 wv = wf8(type, w + 2 * k);
        for (int m = 0; m < mr; m++)
            a0[m] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(A->x + m * K + k), a0[m]);
    }
    for (int64_t k = 8; k < K; k += 16) { /* the odd ones */
        const __m256 wv = wf8(type, w + 2 * k);
        for (int m = 0; m < mr; m++)
            a1[m] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(A->x + m * K + k), a1[m]);
    }
    for (int m = 0; m < mr; m++)
        out[m] = hsum8(_mm256_add_ps(a0[m], a1[m]));
#endif
}

/* NWF weight rows (rb bytes apart) against mr <= 2 activation rows (decode): out[i][m], each
 * output by row_dotf's steps. One row's fma chain alone waits on the fma latency (BF16 at
 * K = 8960 ran at half the rate of bf16 activations' chain of half the length); NWF rows'
 * chains interleaved keep the fma units busy. Prefetched in the loop, a line at a time. */
#if TQ_AVX512
#define NWF 8
#else
#define NWF 4
#endif
static inline __attribute__((always_inline)) void rows_dotf(int type, const uint8_t *w,
                                                            int64_t rb, const actsf_t *A,
                                                            int mr, float out[NWF][2]) {
    const int64_t K = A->K;
#if TQ_AVX512
    __m512 acc[NWF][2];
    for (int i = 0; i < NWF; i++)
        acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
        for (int i = 0; i < NWF; i++) {
            if (!(k & 31))
                _mm_prefetch((const char *)w + i * rb + 2 * k + PF_BYTES, _MM_HINT_T0);
            const __m512 wv = wf16(type, w + i * rb + 2 * k);
            for (int m = 0; m < mr; m++)
                acc[i][m] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(A->x + m * K + k), acc[i][m]);
        }
    }
    for (int i = 0; i < NWF; i++)
        for (int m = 0; m < mr; m++)
            out[i][m] = hsum16(acc[i][m]);
#else
    __m256 a[2][NWF][2];
    for (int p = 0; p < 2; p++) { /* the even groups of 8, then the odd ones */
        for (int i = 0; i < NWF; i++)
            a[p][i][0] = a[p][i][1] = _mm256_setzero_ps();
        for (int64_t k = 8 * p; k < K; k += 16)
            for (int i = 0; i < NWF; i++) {
                if (!p && !(k & 31))
                    _mm_prefetch((const char *)w + i * rb + 2 * k + PF_BYTES, _MM_HINT_T0);
                const __m256 wv = wf8(type, w + i * rb + 2 * k);
                for (int m = 0; m < mr; m++)
                    a[p][i][m] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(A->x + m * K + k), a[p][i][m]);
            }
    }
    for (int i = 0; i < NWF; i++)
        for (int m = 0; m < mr; m++)
            out[i][m] = hsum8(_mm256_add_ps(a[0][i][m], a[1][i][m]));
#endif
}

/* ---- F16 / BF16 prompt chunks: register tiles of weight rows x activation rows ----------
 * Each output's lanes take the same fma sequence as row_dotf's (k ascending, the even and
 * odd groups of 8 apart), so every row has the one-row product's bits. AVX-512: 4 weight rows
 * x 6 activation rows, 24 accumulators; AVX2: 2 x 3, each with its even and odd set. */
#if TQ_AVX512
#define NRF 4
#define MRF 6
#else
#define NRF 2
#define MRF 3
#endif

static inline __attribute__((always_inline)) void tilef(int type, const uint8_t *w, int64_t rb,
                                                        const float *x, int64_t K,
                                                        float out[NRF][MRF]) {
#if TQ_AVX512
    __m512 acc[NRF][MRF];
    for (int i = 0; i < NRF; i++)
        for (int m = 0; m < MRF; m++)
            acc[i][m] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
        __m512 wv[NRF];
        for (int i = 0; i < NRF; i++)
            wv[i] = wf16(type, w + i * rb + 2 * k);
        for (int m = 0; m < MRF; m++) {
            const __m512 xv = _mm512_loadu_ps(x + m * K + k);
            for (int i = 0; i < NRF; i++)
                acc[i][m] = _mm512_fmadd_ps(wv[i], xv, acc[i][m]);
        }
    }
    for (int i = 0; i < NRF; i++)
        for (int m = 0; m < MRF; m++)
            out[i][m] = hsum16(acc[i][m]);
#else
    __m256 a0[NRF][MRF], a1[NRF][MRF];
    for (int i = 0; i < NRF; i++)
        for (int m = 0; m < MRF; m++)
            a0[i][m] = a1[i][m] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
        __m256 w0[NRF], w1[NRF];
        for (int i = 0; i < NRF; i++) {
            w0[i] = wf8(type, w + i * rb + 2 * k);
            w1[i] = wf8(type, w + i * rb + 2 * k + 16);
        }
        for (int m = 0; m < MRF; m++) {
            const __m256 x0 = _mm256_loadu_ps(x + m * K + k), x1 = _mm256_loadu_ps(x + m * K + k + 8);
            for (int i = 0; i < NRF; i++) {
                a0[i][m] = _mm256_fmadd_ps(w0[i], x0, a0[i][m]);
                a1[i][m] = _mm256_fmadd_ps(w1[i], x1, a1[i][m]);
            }
        }
    }
    for (int i = 0; i < NRF; i++)
        for (int m = 0; m < MRF; m++)
            out[i][m] = hsum8(_mm256_add_ps(a0[i][m], a1[i][m]));
#endif
}

/* activation rows per block of gemmf_range: as many as fit ~512 KiB of L2 (a multiple of MRF) */
static int64_t gemmf_rows(int64_t K) {
    int64_t r = (512 * 1024) / (4 * K) / MRF * MRF;
    return r < MRF ? MRF : r > 96 ? 96 : r;
}

void gemmf_range(int type, const uint8_t *W, int64_t rb, int64_t n0, int64_t n1,
                 const float *x, int64_t M, int64_t K, float *y, int64_t N, const float *bias) {
    const int64_t mbs = gemmf_rows(K);
    for (int64_t mb = 0; mb < M; mb += mbs) {
        const int64_t me = M < mb + mbs ? M : mb + mbs, mfull = mb + (me - mb) / MRF * MRF;
        int64_t n = n0;
        for (; n + NRF <= n1; n += NRF) {
            for (int64_t m = mb; m < mfull; m += MRF) {
                float out[NRF][MRF];
                tilef(type, W + n * rb, rb, x + m * K, K, out);
                for (int i = 0; i < NRF; i++)
                    for (int j = 0; j < MRF; j++)
                        y[(m + j) * N + n + i] = out[i][j] + (bias ? bias[n + i] : 0.f);
            }
        }
        /* the edges (rows of either kind short of a tile) row by row: the same bits */
        const actsf_t A = {x + mfull * K, K}, B = {x + mb * K, K};
        if (me > mfull)
            ROW_DOTSF[me - mfull](type, W, rb, n0, n, &A, y + mfull * N, N, bias);
        for (int64_t m0 = mb; n < n1 && m0 < me; m0 += MR) {
            const actsf_t C = {B.x + (m0 - mb) * K, K};
            ROW_DOTSF[me - m0 < MR ? me - m0 : MR](type, W, rb, n, n1, &C, y + m0 * N, N, bias);
        }
    }
}

#define ROWSN_FN(fn, acts, mr)                                                                \
    static void fn##_rows_##mr(int t, const uint8_t *W, int64_t rb, int64_t n0, int64_t n1,  \
                               const acts *A, float *y, int64_t N, const float *bias) {      \
        switch (t) {                                                                          \
        case T_Q2_K: ROW_LOOP(fn, T_Q2_K, mr) break;                                          \
        case T_Q3_K: ROW_LOOP(fn, T_Q3_K, mr) break;                                          \
        case T_IQ4_NL: ROW_LOOP(fn, T_IQ4_NL, mr) break;                                      \
        case T_IQ4_XS: ROW_LOOP(fn, T_IQ4_XS, mr) break;                                      \
        }                                                                                     \
    }
/* decode (mr <= 2): NWF weight rows at a time, then the rest one by one (the same bits) */
#define ROWF_LOOP(fn, T, mr)                                                                  \
    for (; (mr) <= 2 && n0 + NWF <= n1; n0 += NWF) {                                          \
        float o[NWF][2];                                                                      \
        rows_dotf(T, W + n0 * rb, rb, A, mr, o);                                              \
        for (int i = 0; i < NWF; i++)                                                         \
            for (int m = 0; m < (mr); m++)                                                    \
                y[m * N + n0 + i] = o[i][m] + (bias ? bias[n0 + i] : 0.f);                    \
    }                                                                                         \
    ROW_LOOP(fn, T, mr)
#define ROWSF_FN(fn, acts, mr)                                                                \
    static void fn##_rows_##mr(int t, const uint8_t *W, int64_t rb, int64_t n0, int64_t n1,  \
                               const acts *A, float *y, int64_t N, const float *bias) {      \
        switch (t) {                                                                          \
        case T_F16: ROWF_LOOP(fn, T_F16, mr) break;                                           \
        case T_BF16: ROWF_LOOP(fn, T_BF16, mr) break;                                         \
        }                                                                                     \
    }

ROW_DOT_TABLE_OF(ROWSN_FN, row_dotn16, acts_t, ROW_DOTSN);
ROW_DOT_TABLE_OF(ROWSN_FN, row_dotn8, acts8_t, ROW_DOTSN8);
ROW_DOT_TABLE_OF(ROWSF_FN, row_dotf, actsf_t, ROW_DOTSF);
