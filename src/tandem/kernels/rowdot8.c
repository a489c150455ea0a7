/* The row-by-row kernels with int8 activations.
 *
 * x~ = d * q8, d = max|x| / 127 per block of 256 (K-quants) or 32; u8 x s8 products on
 * _mm256_maddubs_epi16 (32 per instruction, no int16 widening of the weights), at llama.cpp's
 * precision (|x - x~| <= d / 2). Opt-in: --activations int8 (the draft's default). */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "blocks.h"

/* 32 bytes: 0x10 where bit i of `bits` is set (byte i), else 0 */
static inline __m256i bits_to_16(uint32_t bits) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i sel = _mm256_set1_epi64x(0x8040201008040201LL);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread); /* byte i/8 */
    b = _mm256_cmpeq_epi8(_mm256_and_si256(b, sel), sel);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x10));
}

static inline __m256i nibbles32(const uint8_t *qs) { /* 16 bytes -> 32 x u8: lo then hi */
    const __m128i b = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(0x0F);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(b, m)),
                                   _mm_and_si128(_mm_srli_epi16(b, 4), m), 1);
}

#define GROUP8(wq, wscale, woff, g)                                                           \
    do {                                                                                      \
        for (int m = 0; m < mr; m++) {                                                        \
            const __m256i xq = _mm256_loadu_si256((const __m256i *)(A->q + m * A->K + 32 * (g))); \
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wq, xq), ones);                \
            acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),                                    \
                                     _mm256_set1_ps((wscale) * A->s[m * A->G + (g)]), acc[m]); \
            off[m] += (woff) * A->sum[m * A->G + (g)];                                         \
        }                                                                                     \
    } while (0)

static inline __attribute__((always_inline)) void row_dot8(int type, const uint8_t *w,
                                                            const acts8_t *A, int mr, float *out) {
    __m256 acc[MR], offv[MR];
    __m256i isum[MR];
    float off[MR];
    for (int m = 0; m < MR; m++) {
        acc[m] = offv[m] = _mm256_setzero_ps();
        isum[m] = _mm256_setzero_si256();
        off[m] = 0.f;
    }
    const int64_t G = A->G, K = A->K;
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0x0F);
    switch (type) {
    case T_Q4_0:
    case T_Q4_1:
    case T_Q5_0:
    case T_Q5_1: {
        const int hasm = type == T_Q4_1 || type == T_Q5_1, five = type == T_Q5_0 || type == T_Q5_1;
        const int64_t bs = block_bytes(type);
        for (int64_t g = 0; g < G; g++, w += bs) {
            const float d = f16(w);
            const float woff = hasm ? f16(w + 2) : (five ? -16.f * d : -8.f * d);
            __m256i q = nibbles32(w + 2 + 2 * hasm + 4 * five);
            if (five) {
                uint32_t qh;
                memcpy(&qh, w + 2 + 2 * hasm, 4);
                q = _mm256_or_si256(q, bits_to_16(qh));
            }
            GROUP8(q, d, woff, g);
        }
        break;
    }
    case T_Q8_0:
        for (int64_t g = 0; g < G; g++, w += 34) {
            const float d = f16(w);
            const __m256i wq = _mm256_loadu_si256((const __m256i *)(w + 2));
            const __m256i aw = _mm256_sign_epi8(wq, wq); /* |w|, and x takes w's sign */
            for (int m = 0; m < mr; m++) {
                const __m256i xq = _mm256_loadu_si256((const __m256i *)(A->q + m * K + 32 * g));
                __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xq, wq)), ones);
                acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p),
                                         _mm256_set1_ps(d * A->s[m * G + g]), acc[m]);
            }
        }
        break;
    case T_Q4_K:
    case T_Q5_K: {
        const int five = type == T_Q5_K, bs = five ? 176 : 144;
        const __m256i one8 = _mm256_set1_epi8(1);
        for (int64_t sb = 0; sb < G / 8; sb++, w += bs) {
            const float d = f16(w), dmin = f16(w + 2);
            const uint8_t *qs = w + (five ? 48 : 16);
            __m256i sc16;
            __m256 mnv;
            k4_scales(w + 4, &sc16, &mnv);
            const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(w + 16))
                                    : _mm256_setzero_si256();
            for (int c = 0; c < 4; c++) {
                const __m256i q32 = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
                __m256i lo = _mm256_and_si256(q32, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q32, 4), m4);
                if (five) {
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(
                                                 _mm256_srli_epi16(qh, 2 * c), one8), 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(
                                                 _mm256_srli_epi16(qh, 2 * c + 1), one8), 4));
                }
                const __m256i s0 = word_bcast(sc16, 2 * c), s1 = word_bcast(sc16, 2 * c + 1);
                for (int m = 0; m < mr; m++) {
                    const int8_t *xq = A->q + m * K + 256 * sb + 64 * c;
                    __m256i p = _mm256_add_epi32(
                        _mm256_madd_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)xq)), s0),
                        _mm256_madd_epi16(_mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(xq + 32))), s1));
                    isum[m] = _mm256_add_epi32(isum[m], p);
                }
            }
            FLUSH(d, 8 * sb);
            const __m256 mnf = _mm256_mul_ps(_mm256_set1_ps(-dmin), mnv);
            for (int m = 0; m < mr; m++)
                offv[m] = _mm256_fmadd_ps(mnf, _mm256_loadu_ps(A->sum + m * G + 8 * sb), offv[m]);
        }
        break;
    }
    case T_Q6_K: {
        const __m256i m30 = _mm256_set1_epi8(0x30);
        for (int64_t sb = 0; sb < G / 8; sb++, w += 210) {
            const uint8_t *ql = w, *qh = w + 128;
            const int8_t *sc = (const int8_t *)(w + 192);
            const float d = f16(w + 208);
            const __m256i scw = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
            for (int h = 0; h < 2; h++, ql += 64, qh += 32) {
                const __m256i sch = h ? _mm256_permute2x128_si256(scw, scw, 0x11)
                                      : _mm256_permute2x128_si256(scw, scw, 0x00);
                const __m256i L0 = _mm256_loadu_si256((const __m256i *)ql);
                const __m256i L1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
                const __m256i H = _mm256_loadu_si256((const __m256i *)qh);
                __m256i q[4], sv[4];
                q[0] = _mm256_or_si256(_mm256_and_si256(L0, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30));
                q[1] = _mm256_or_si256(_mm256_and_si256(L1, m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30));
                q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L0, 4), m4), _mm256_and_si256(H, m30));
                q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L1, 4), m4),
                                       _mm256_and_si256(_mm256_srli_epi16(H, 2), m30));
                for (int i = 0; i < 4; i++) /* weights 0..15 of group i: sc[8h+2i], 16..31: +1 */
                    sv[i] = word_bcast2(sch, 2 * i, 2 * i + 1);
                for (int m = 0; m < mr; m++) {
                    const int8_t *xq = A->q + m * K + 256 * sb + 128 * h;
                    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(q[0], _mm256_loadu_si256((const __m256i *)xq)), sv[0]);
                    for (int i = 1; i < 4; i++)
                        p = _mm256_add_epi32(p, _mm256_madd_epi16(_mm256_maddubs_epi16(
                                                    q[i], _mm256_loadu_si256((const __m256i *)(xq + 32 * i))), sv[i]));
                    isum[m] = _mm256_add_epi32(isum[m], p);
                }
            }
            /* q - 32: subtract 32 * sum_j sc[j] * (sum of x8 over 16-group j) */
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
            for (int m = 0; m < mr; m++) {
                const __m256i b = _mm256_loadu_si256((const __m256i *)(A->bs + m * (K / 16) + 16 * sb));
                isum[m] = _mm256_sub_epi32(isum[m], _mm256_slli_epi32(_mm256_madd_epi16(sc16, b), 5));
            }
            FLUSH(d, 8 * sb);
        }
        break;
    }
    }
    finish_rows(acc, offv, off, mr, out);
}

ROW_DOT_TABLE(row_dot8, acts8_t, ROW_DOTS8);
