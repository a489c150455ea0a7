/* The row-by-row kernels with int16 activations: one weight row against up to MR activation rows
 * per pass (decode, verification). */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "blocks.h"

/* ---- one group of 32 weights against `mr` activation rows ------------------------------- */

/* acc[m] += (wscale * s_m) * sum(w16 * xq_m) ; off[m] += woff * sum_m, for group g */
#define GROUP(w0, w1, wscale, woff, g)                                                        \
    do {                                                                                      \
        for (int m = 0; m < mr; m++) {                                                        \
            const int16_t *xq = A->q + m * A->K + 32 * (g);                                   \
            __m256i p = _mm256_add_epi32(                                                      \
                _mm256_madd_epi16(w0, _mm256_loadu_si256((const __m256i *)xq)),                \
                _mm256_madd_epi16(w1, _mm256_loadu_si256((const __m256i *)(xq + 16))));        \
            acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),                                    \
                                     _mm256_set1_ps((wscale) * A->s[m * A->G + (g)]), acc[m]); \
            off[m] += (woff) * A->sum[m * A->G + (g)];                                         \
        }                                                                                     \
    } while (0)

/* isum[m] += sum over 64 weights (four int16 x 16 vectors) at activation offset o */
#define DOT64(v0, v1, v2, v3, o)                                                              \
    do {                                                                                      \
        for (int m = 0; m < mr; m++) {                                                        \
            const __m256i *xq = (const __m256i *)(A->q + m * A->K + (o));                     \
            __m256i p = _mm256_add_epi32(_mm256_madd_epi16(v0, _mm256_loadu_si256(xq)),       \
                                         _mm256_madd_epi16(v1, _mm256_loadu_si256(xq + 1)));  \
            p = _mm256_add_epi32(p, _mm256_madd_epi16(v2, _mm256_loadu_si256(xq + 2)));       \
            p = _mm256_add_epi32(p, _mm256_madd_epi16(v3, _mm256_loadu_si256(xq + 3)));       \
            isum[m] = _mm256_add_epi32(isum[m], p);                                           \
        }                                                                                     \
    } while (0)

/* One weight row (its blocks at w) against up to MR activation rows: out[m] = dot.
 * Always inlined into the row loops for mr = 1..MR (ROW_DOT_TABLE) so that mr is a constant. */
static inline __attribute__((always_inline)) void row_dot(int type, const uint8_t *w, const acts_t *A, int mr, float *out) {
    __m256 acc[MR], offv[MR];
    __m256i isum[MR];
    float off[MR];
    for (int m = 0; m < MR; m++) {
        acc[m] = offv[m] = _mm256_setzero_ps();
        isum[m] = _mm256_setzero_si256();
        off[m] = 0.f;
    }
#if TQ_AVX512
    __m512i isum5[MR]; /* the 512-bit integer sums, folded into isum once per super-block */
    for (int m = 0; m < MR; m++)
        isum5[m] = _mm512_setzero_si512();
#endif
    const int64_t G = A->G;
    switch (type) {
    case T_Q4_0:
        for (int64_t g = 0; g < G; g++, w += 18) {
            const float d = f16(w);
            const __m128i b = _mm_loadu_si128((const __m128i *)(w + 2));
            __m256i w0 = lo16(b), w1 = hi16(b);
            GROUP(w0, w1, d, -8.f * d, g);
        }
        break;
    case T_Q4_1:
        for (int64_t g = 0; g < G; g++, w += 20) {
            const float d = f16(w), mm = f16(w + 2);
            const __m128i b = _mm_loadu_si128((const __m128i *)(w + 4));
            __m256i w0 = lo16(b), w1 = hi16(b);
            GROUP(w0, w1, d, mm, g);
        }
        break;
    case T_Q5_0:
    case T_Q5_1: {
        const int hasm = type == T_Q5_1, bs = hasm ? 24 : 22;
        for (int64_t g = 0; g < G; g++, w += bs) {
            const float d = f16(w), mm = hasm ? f16(w + 2) : -16.f * d;
            uint32_t qh;
            memcpy(&qh, w + 2 + 2 * hasm, 4);
            const __m128i b = _mm_loadu_si128((const __m128i *)(w + 6 + 2 * hasm));
            __m256i w0 = _mm256_or_si256(lo16(b), bit16(qh & 0xFFFF));
            __m256i w1 = _mm256_or_si256(hi16(b), bit16(qh >> 16));
            GROUP(w0, w1, d, mm, g);
        }
        break;
    }
    case T_Q8_0:
        for (int64_t g = 0; g < G; g++, w += 34) {
            const float d = f16(w);
            __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 2)));
            __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 18)));
            GROUP(w0, w1, d, 0.f, g);
        }
        break;
    case T_Q4_K:
    case T_Q5_K: {
        /* integer sums over the whole super-block: q * sc <= 31 * 63 and |x| <= 16383, so
         * 16 madd pairs per lane stay below 2^31; one float step per 256 weights */
        const int five = type == T_Q5_K, bs = five ? 176 : 144;
        for (int64_t sb = 0; sb < G / 8; sb++, w += bs) {
            PF_BLOCK(w, bs, _MM_HINT_T1);
            const float d = f16(w), dmin = f16(w + 2);
            __m256i sc16, qh;
            __m256 mnv;
            const uint8_t *qs = k4_head(five, w, &sc16, &mnv, &qh);
#if TQ_AVX512
            /* vpdpwssd on the quants times their sub-block scale (q * sc <= 31 * 63 fits
             * int16), made once per weight row and shared by every activation row: chunks c
             * and c + 1 side by side, words 0..15 of a vector chunk c's and 16..31 chunk
             * c + 1's, in k4_nibbles' order (v[0] the even weights of the low nibbles, v[1]
             * the odd ones, v[2] and v[3] the same of the high nibbles), against the
             * activations in quantize_row's split 3 order (per 128 values the 32 each vector
             * meets). A dword lane sums two products; the two 256-bit halves folded
             * (fold512) give the AVX2 kernel's lanes, four consecutive weights of every
             * sub-block each: the same integers, the same bits. One instruction per 32
             * products and row, where vpdpbusd on byte planes of the activations took two */
            const __m512i sc5 = _mm512_castsi256_si512(sc16); /* words j < 8: scale j */
            const __m512i m4w = _mm512_set1_epi16(0x000F), one16 = _mm512_set1_epi16(1);
            const __m512i qhz = _mm512_broadcast_i64x4(qh);
            for (int c = 0; c < 4; c += 2) {
                const __m512i q = _mm512_loadu_si512((const void *)(qs + 32 * c));
                __m512i v[4];
                v[0] = _mm512_and_si512(q, m4w);
                v[1] = _mm512_and_si512(_mm512_srli_epi16(q, 8), m4w);
                v[2] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4w);
                v[3] = _mm512_srli_epi16(q, 12);
                if (five) { /* bit b (chunk c) or b + 2 (chunk c + 1) of qh's words at bit 4,
                             * b = 2c, 8 + 2c, 2c + 1, 9 + 2c for v[0..3] (k4_nibbles) */
                    static const int bit[4] = {0, 8, 1, 9};
                    for (int i = 0; i < 4; i++) {
                        const __m512i sh = _mm512_inserti64x4(
                            _mm512_set1_epi16((short)(bit[i] + 2 * c)),
                            _mm256_set1_epi16((short)(bit[i] + 2 * c + 2)), 1);
                        v[i] = _mm512_or_si512(v[i], _mm512_slli_epi16(
                            _mm512_and_si512(_mm512_srlv_epi16(qhz, sh), one16), 4));
                    }
                }
                /* scales: sub-blocks 2c and 2c + 2 (low nibbles), 2c + 1 and 2c + 3 (high) */
                const __m512i s0 = _mm512_permutexvar_epi16(_mm512_inserti64x4(
                    _mm512_set1_epi16((short)(2 * c)), _mm256_set1_epi16((short)(2 * c + 2)), 1), sc5);
                const __m512i s1 = _mm512_permutexvar_epi16(_mm512_inserti64x4(
                    _mm512_set1_epi16((short)(2 * c + 1)), _mm256_set1_epi16((short)(2 * c + 3)), 1), sc5);
                v[0] = _mm512_mullo_epi16(v[0], s0);
                v[1] = _mm512_mullo_epi16(v[1], s0);
                v[2] = _mm512_mullo_epi16(v[2], s1);
                v[3] = _mm512_mullo_epi16(v[3], s1);
                for (int m = 0; m < mr; m++) {
                    const int16_t *xq = A->q + m * A->K + 256 * sb + 64 * c;
                    __m512i t = isum5[m];
                    for (int i = 0; i < 4; i++)
                        t = _mm512_dpwssd_epi32(t, v[i], _mm512_loadu_si512((const void *)(xq + 32 * i)));
                    isum5[m] = t;
                }
            }
            for (int m = 0; m < mr; m++) {
                isum[m] = fold512(isum5[m]);
                isum5[m] = _mm512_setzero_si512();
            }
#else
            for (int c = 0; c < 4; c++) {
                __m256i v[4];
                if (mr <= 2) { /* the scale after the sums: two 32-bit multiplies per row
                                * instead of four 16-bit ones per chunk (same integers) */
                    k4_nibbles(five, qs, qh, c, v);
                    const __m256i s0 = dword_bcast(sc16, 2 * c), s1 = dword_bcast(sc16, 2 * c + 1);
                    for (int m = 0; m < mr; m++) {
                        const __m256i *xq = (const __m256i *)(A->q + m * A->K + 256 * sb + 64 * c);
                        const __m256i p0 = _mm256_add_epi32(_mm256_madd_epi16(v[0], _mm256_loadu_si256(xq)),
                                                            _mm256_madd_epi16(v[1], _mm256_loadu_si256(xq + 1)));
                        const __m256i p1 = _mm256_add_epi32(_mm256_madd_epi16(v[2], _mm256_loadu_si256(xq + 2)),
                                                            _mm256_madd_epi16(v[3], _mm256_loadu_si256(xq + 3)));
                        isum[m] = _mm256_add_epi32(isum[m], _mm256_add_epi32(_mm256_mullo_epi32(p0, s0),
                                                                             _mm256_mullo_epi32(p1, s1)));
                    }
                } else {
                    k4_chunk(five, qs, qh, sc16, c, v);
                    DOT64(v[0], v[1], v[2], v[3], 256 * sb + 64 * c);
                }
            }
#endif
            FLUSH(d, 8 * sb);
            /* the offsets: -dmin * sum_j mn[j] * sum(x of group j) */
            const __m256 mnf = _mm256_mul_ps(_mm256_set1_ps(-dmin), mnv);
            for (int m = 0; m < mr; m++)
                offv[m] = _mm256_fmadd_ps(mnf, _mm256_loadu_ps(A->sum + m * G + 8 * sb), offv[m]);
        }
        break;
    }
    case T_Q6_K: {
        /* 8 madd pairs per lane per half stay < 2^31 */
        for (int64_t sb = 0; sb < G / 8; sb++, w += 210) {
            PF_BLOCK(w, 210, _MM_HINT_T1);
            const uint8_t *ql = w, *qh = w + 128;
            const int8_t *sc = (const int8_t *)(w + 192);
            const float d = f16(w + 208);
            const __m256i scw = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
#if TQ_AVX512
            /* parts 0 and 1 of q6_part side by side: vector i holds weights 32i .. 32i + 31
             * of the half, against 32 consecutive activations. The 6-bit values are put
             * together and made signed (q - 32) as bytes, 64 per instruction, then widened;
             * each vector's two sub-block scales come from one vpermw of all 16 */
            (void)scw;
            const __m512i m4b = _mm512_set1_epi8(0x0F), m30b = _mm512_set1_epi8(0x30),
                          k32b = _mm512_set1_epi8(32);
            /* per 256-bit half of a vector of qh: the shift that brings bits 2i, 2i + 1 of
             * each byte to bits 4, 5 (left 4 | left 2; right 0 | right 2) */
            const __m512i shl = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
            const __m512i shr = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
            const __m512i scz = _mm512_castsi256_si512(
                _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc)));
            for (int h = 0; h < 2; h++, ql += 64, qh += 32) {
                const __m512i Q = _mm512_loadu_si512((const void *)ql); /* ql 0..31 | 32..63 */
                const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh));
                /* weights 0..31 | 32..63 of the half, then 64..95 | 96..127 */
                const __m512i lo = _mm512_sub_epi8(_mm512_or_si512(
                    _mm512_and_si512(Q, m4b), _mm512_and_si512(_mm512_sllv_epi16(H, shl), m30b)), k32b);
                const __m512i hi = _mm512_sub_epi8(_mm512_or_si512(
                    _mm512_and_si512(_mm512_srli_epi16(Q, 4), m4b),
                    _mm512_and_si512(_mm512_srlv_epi16(H, shr), m30b)), k32b);
                __m512i v[4];
                v[0] = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(lo));
                v[1] = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(lo, 1));
                v[2] = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(hi));
                v[3] = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(hi, 1));
                for (int i = 0; i < 4; i++) /* words 8h + 2i (low half), 8h + 2i + 1 (high) */
                    v[i] = _mm512_mullo_epi16(v[i], _mm512_permutexvar_epi16(_mm512_inserti64x4(
                        _mm512_set1_epi16((short)(8 * h + 2 * i)),
                        _mm256_set1_epi16((short)(8 * h + 2 * i + 1)), 1), scz));
                for (int m = 0; m < mr; m++) {
                    const int16_t *xq = A->q + m * A->K + 256 * sb + 128 * h;
                    __m512i t = _mm512_setzero_si512();
                    for (int i = 0; i < 4; i++)
                        t = _mm512_dpwssd_epi32(t, v[i], _mm512_loadu_si512((const void *)(xq + 32 * i)));
                    isum[m] = fold512(t);
                }
                FLUSH(d, 8 * sb);
            }
#else
            for (int h = 0; h < 2; h++, ql += 64, qh += 32) {
                /* sc[8h .. 8h+7] as int16 in both lanes */
                const __m256i sch = h ? _mm256_permute2x128_si256(scw, scw, 0x11)
                                      : _mm256_permute2x128_si256(scw, scw, 0x00);
                /* lanes l = 0..15 and 16..31 of this half feed four groups of 32 weights */
                for (int part = 0; part < 2; part++) {
                    const int l = 16 * part;
                    __m256i q[4];
                    q6_part(ql, qh, sch, part, q);
                    const __m256i v0 = q[0], v1 = q[1], v2 = q[2], v3 = q[3];
                    /* weights l.., l+32.., l+64.., l+96.. of this half */
                    const int64_t o = 256 * sb + 128 * h + l;
                    for (int m = 0; m < mr; m++) {
                        const int16_t *xq = A->q + m * A->K + o;
                        __m256i p = _mm256_add_epi32(
                            _mm256_madd_epi16(v0, _mm256_loadu_si256((const __m256i *)xq)),
                            _mm256_madd_epi16(v1, _mm256_loadu_si256((const __m256i *)(xq + 32))));
                        p = _mm256_add_epi32(p, _mm256_madd_epi16(v2, _mm256_loadu_si256((const __m256i *)(xq + 64))));
                        p = _mm256_add_epi32(p, _mm256_madd_epi16(v3, _mm256_loadu_si256((const __m256i *)(xq + 96))));
                        isum[m] = _mm256_add_epi32(isum[m], p);
                    }
                }
                FLUSH(d, 8 * sb);
            }
#endif
        }
        break;
    }
    }
    finish_rows(acc, offv, off, mr, out);
}

ROW_DOT_TABLE(row_dot, acts_t, ROW_DOTS);
