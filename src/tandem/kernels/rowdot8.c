/* The row-by-row kernels with int8 activations.
 *
 * x~ = d * q8, d = max|x| / 127 per block of 256 (K-quants) or 32; u8 x s8 products on
 * _mm256_maddubs_epi16 (32 per instruction, no int16 widening of the weights), at llama.cpp's
 * precision (|x - x~| <= d / 2). Opt-in: --activations int8 (the draft's default). */
#include <immintrin.h>
#include <math.h>
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
            off[m] = fmaf((woff), A->sum[m * A->G + (g)], off[m]);                             \
        }                                                                                     \
    } while (0)

#if TQ_AVX512
/* AVX-512 VNNI: vpdpbusd sums four u8 x s8 products per int32 lane without the int16
 * saturation of maddubs; each such sum fits int16 (<= 4 * 63 * 127), so vpdpwssd against a
 * dword holding the sub-block scale in its low word and 0 in its high word adds exactly
 * scale * sum, which is the lane maddubs + madd(scale) gives in the AVX2 code. */
static inline __m512i scales_lo_words(__m128i sc8) { /* 16 x int8 -> 16 dwords, high word 0 */
    /* bytes (sc, 0) widened with sign: words (sc, 0) */
    return _mm512_cvtepi8_epi16(_mm256_cvtepu8_epi16(sc8));
}
#endif

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
#if TQ_AVX512
    __m512i isum5[MR]; /* the 512-bit integer sums, folded into isum once per super-block */
    for (int m = 0; m < MR; m++)
        isum5[m] = _mm512_setzero_si512();
#endif
    const int64_t G = A->G, K = A->K;
    const __m256i ones = _mm256_set1_epi16(1), m4 = _mm256_set1_epi8(0x0F);
    (void)m4;
    switch (type) {
    case T_Q4_0:
    case T_Q4_1:
    case T_Q5_0:
    case T_Q5_1: {
        const int hasm = type == T_Q4_1 || type == T_Q5_1, five = type == T_Q5_0 || type == T_Q5_1;
        const int64_t bs = block_bytes(type);
        int64_t g = 0;
#if TQ_AVX512
        /* two blocks (64 weights) per 512-bit vector: one vpdpbusd per activation row gives
         * both blocks' eight int32 lanes, the integers maddubs + madd give in the AVX2 code
         * (each lane the sum of four products, < 2^15); the float steps stay 256-bit and in
         * block order (block g's fma, then g + 1's), so every bit is the AVX2 code's. The
         * fifth bits are one 64-bit byte mask (bit j of qh is weight j, byte j here). */
        const __m512i m4z = _mm512_set1_epi8(0x0F), c16 = _mm512_set1_epi8(0x10);
        /* 128-bit lanes (block 0's bytes, again, block 1's, again) shifted by 0, 4, 0, 4 */
        const __m512i shz = _mm512_broadcast_i64x4(
            _mm256_inserti128_si256(_mm256_setzero_si256(), _mm_set1_epi16(4), 1));
        const int qo = 2 + 2 * hasm + 4 * five;
        for (; g + 1 < G; g += 2, w += 2 * bs) {
            const uint8_t *w1 = w + bs;
            const float d0 = f16(w), d1 = f16(w1);
            const float o0 = hasm ? f16(w + 2) : (five ? -16.f * d0 : -8.f * d0);
            const float o1 = hasm ? f16(w1 + 2) : (five ? -16.f * d1 : -8.f * d1);
            const __m512i b = _mm512_castsi256_si512(_mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(w + qo))),
                _mm_loadu_si128((const __m128i *)(w1 + qo)), 1));
            __m512i q = _mm512_and_si512(_mm512_srlv_epi16(_mm512_shuffle_i32x4(b, b, 0x50), shz),
                                         m4z);
            if (five) {
                uint32_t h0, h1;
                memcpy(&h0, w + 2 + 2 * hasm, 4);
                memcpy(&h1, w1 + 2 + 2 * hasm, 4);
                q = _mm512_mask_add_epi8(q, (__mmask64)h0 | (__mmask64)h1 << 32, q, c16);
            }
            for (int m = 0; m < mr; m++) {
                const __m512i p = _mm512_dpbusd_epi32(
                    _mm512_setzero_si512(), q, _mm512_loadu_si512((const void *)(A->q + m * K + 32 * g)));
                acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm512_castsi512_si256(p)),
                                         _mm256_set1_ps(d0 * A->s[m * G + g]), acc[m]);
                acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm512_extracti64x4_epi64(p, 1)),
                                         _mm256_set1_ps(d1 * A->s[m * G + g + 1]), acc[m]);
                off[m] = fmaf(o0, A->sum[m * G + g], off[m]);
                off[m] = fmaf(o1, A->sum[m * G + g + 1], off[m]);
            }
        }
#endif
        for (; g < G; g++, w += bs) {
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
            PF_BLOCK(w, bs, _MM_HINT_T0);
            const float d = f16(w), dmin = f16(w + 2);
            const uint8_t *qs = w + (five ? 48 : 16);
            __m256i sc16;
            __m256 mnv;
            k4_scales(w + 4, &sc16, &mnv);
            const __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(w + 16))
                                    : _mm256_setzero_si256();
#if TQ_AVX512
            /* chunks c and c + 1 in one vector: low nibbles (sub-blocks 2c, 2c + 2), then
             * high nibbles (2c + 1, 2c + 3), each against one 512-bit load of the activations
             * stored in pairs (quantize_row8) */
            uint8_t sm[16];
            k4_unpack(w + 4, sm);
            const __m512i scd = _mm512_castsi256_si512(
                _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)sm)));
            const __m512i m4z = _mm512_set1_epi8(0x0F), one8z = _mm512_set1_epi8(1);
            const __m512i qhz = _mm512_broadcast_i64x4(qh);
            (void)sc16;
            for (int c = 0; c < 4; c += 2) {
                const __m512i q = _mm512_loadu_si512((const void *)(qs + 32 * c));
                __m512i lo = _mm512_and_si512(q, m4z);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4z);
                if (five) { /* fifth bits: bit 2c (2c + 1) of qh for chunk c, + 2 for c + 1 */
                    const __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16(2 * c),
                                                          _mm256_set1_epi16(2 * c + 2), 1);
                    const __m512i b = _mm512_srlv_epi16(qhz, sh);
                    lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(b, one8z), 4));
                    hi = _mm512_or_si512(hi, _mm512_slli_epi16(
                                                 _mm512_and_si512(_mm512_srli_epi16(b, 1), one8z), 4));
                }
                /* the sub-block scales as dwords: 2c (2c + 1) in the low half, 2c + 2 (2c + 3)
                 * in the high half */
                const __m512i s0 = _mm512_permutexvar_epi32(_mm512_inserti64x4(
                    _mm512_set1_epi32(2 * c), _mm256_set1_epi32(2 * c + 2), 1), scd);
                const __m512i s1 = _mm512_permutexvar_epi32(_mm512_inserti64x4(
                    _mm512_set1_epi32(2 * c + 1), _mm256_set1_epi32(2 * c + 3), 1), scd);
                for (int m = 0; m < mr; m++) {
                    const int8_t *xq = A->q + m * K + 256 * sb + 64 * c;
                    const __m512i pl = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo,
                                                           _mm512_loadu_si512((const void *)xq));
                    const __m512i ph = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi,
                                                           _mm512_loadu_si512((const void *)(xq + 64)));
                    isum5[m] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(isum5[m], pl, s0), ph, s1);
                }
            }
            for (int m = 0; m < mr; m++) {
                isum[m] = fold512(isum5[m]);
                isum5[m] = _mm512_setzero_si512();
            }
            (void)one8;
#else
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
#endif
            FLUSH(d, 8 * sb);
            const __m256 mnf = _mm256_mul_ps(_mm256_set1_ps(-dmin), mnv);
            for (int m = 0; m < mr; m++)
                offv[m] = _mm256_fmadd_ps(mnf, _mm256_loadu_ps(A->sum + m * G + 8 * sb), offv[m]);
        }
        break;
    }
    case T_Q6_K: {
        const __m256i m30 = _mm256_set1_epi8(0x30);
        (void)m30;
        for (int64_t sb = 0; sb < G / 8; sb++, w += 210) {
            PF_BLOCK(w, 210, _MM_HINT_T0);
            const uint8_t *ql = w, *qh = w + 128;
            const int8_t *sc = (const int8_t *)(w + 192);
            const float d = f16(w + 208);
            const __m256i scw = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
#if TQ_AVX512
            /* q[0] | q[1] and q[2] | q[3] of a half in one vector each, against activations
             * 128h.. and 128h + 64..; the scales of their 16-weight groups as dwords */
            const __m512i m4z = _mm512_set1_epi8(0x0F), m30z = _mm512_set1_epi8(0x30);
            const __m512i sh01 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1);
            const __m512i sh23 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
            const __m128i scb = _mm_loadu_si128((const __m128i *)sc);
            (void)scw;
            for (int h = 0; h < 2; h++, ql += 64, qh += 32) {
                const __m512i L = _mm512_loadu_si512((const void *)ql);
                const __m512i H = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qh));
                const __m512i q01 = _mm512_or_si512(_mm512_and_si512(L, m4z),
                                                    _mm512_and_si512(_mm512_sllv_epi16(H, sh01), m30z));
                const __m512i q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(L, 4), m4z),
                                                    _mm512_and_si512(_mm512_srlv_epi16(H, sh23), m30z));
                const __m512i s01 = scales_lo_words(_mm_shuffle_epi8(scb, _mm_setr_epi8(
                    8 * h, 8 * h, 8 * h, 8 * h, 8 * h + 1, 8 * h + 1, 8 * h + 1, 8 * h + 1,
                    8 * h + 2, 8 * h + 2, 8 * h + 2, 8 * h + 2, 8 * h + 3, 8 * h + 3, 8 * h + 3, 8 * h + 3)));
                const __m512i s23 = scales_lo_words(_mm_shuffle_epi8(scb, _mm_setr_epi8(
                    8 * h + 4, 8 * h + 4, 8 * h + 4, 8 * h + 4, 8 * h + 5, 8 * h + 5, 8 * h + 5, 8 * h + 5,
                    8 * h + 6, 8 * h + 6, 8 * h + 6, 8 * h + 6, 8 * h + 7, 8 * h + 7, 8 * h + 7, 8 * h + 7)));
                for (int m = 0; m < mr; m++) {
                    const int8_t *xq = A->q + m * K + 256 * sb + 128 * h;
                    const __m512i p01 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q01,
                                                            _mm512_loadu_si512((const void *)xq));
                    const __m512i p23 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q23,
                                                            _mm512_loadu_si512((const void *)(xq + 64)));
                    isum5[m] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(isum5[m], p01, s01), p23, s23);
                }
            }
            for (int m = 0; m < mr; m++) {
                isum[m] = fold512(isum5[m]);
                isum5[m] = _mm512_setzero_si512();
            }
#else
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
#endif
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
