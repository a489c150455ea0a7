/* The helpers of the 16-row group kernels (rowdotx.c: Q4_K, Q5_K, Q6_K, Q4_0, Q5_0; rowdotxk.c:
 * Q2_K, IQ4_XS), included once by each after blocks.h. */
#ifndef TQ_GROUPS16_H
#define TQ_GROUPS16_H

static inline int32_t load32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* the four dwords (b_2t | b_2t+1 << 16), t = 0..3, of one super-block's 32-group sums b_j of the
 * int8 activations (from the 16 per-16 sums at bs) */
static inline void group_pairs(const int16_t *bs, int32_t out[4]) {
    const __m256i b8 = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)bs),
                                         _mm256_set1_epi16(1)); /* b_0..b_7 */
    int32_t b[8];
    _mm256_storeu_si256((__m256i *)b, b8);
    for (int t = 0; t < 4; t++)
        out[t] = (int32_t)(((uint32_t)b[2 * t] & 0xFFFF) | (uint32_t)b[2 * t + 1] << 16);
}

/* the activation sums of a pair (b_2t | b_2t+1 << 16) that the block ending at sub-block j
 * takes: both, or with one sub-block per block (P = 1) only b_j, the other word zero */
static inline int32_t pair_of(int32_t bp, int j, int P) {
    return P > 1 ? bp : (int32_t)((uint32_t)bp & (j % 2 ? 0xFFFF0000u : 0xFFFFu));
}

#if TQ_AVX512
/* 16 unsigned bytes -> 16 dwords, and 16 f16 -> 16 floats (SIMDe 0.7.4 has neither at 512 bits:
 * two 256-bit halves, the same values) */
static inline __m512i u8_epi32(const uint8_t *p) {
#ifdef TQ_SIMDE
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepu8_epi32(b)),
                              _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)), 1);
#else
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
#endif
}

static inline __m512i i8_epi32(const uint8_t *p) { /* 16 signed bytes -> 16 dwords */
#ifdef TQ_SIMDE
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepi8_epi32(b)),
                              _mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)), 1);
#else
    return _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p));
#endif
}

static inline __m512 f16_ps(const uint8_t *p) {
#ifdef TQ_SIMDE
    const __m256 lo = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    const __m256 hi = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)));
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)),
                                               _mm256_castps_pd(hi), 1));
#else
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#endif
}

#else
/* XBLOCK[mr][m0]: how many of mr activation rows, from row m0, one pass over a super-block's
 * unpacked weights takes (16 vector registers: blocks of 1 to 4 rows, each size a compile-time
 * constant so that its sums stay in registers). The blocking moves no bits: each row's sums
 * and float steps are the same in any block. Against the earlier fixed blocks of 3 the row
 * counts that split unevenly (4, 7, 8, 10) gained most; blocks of 5 or 4 + 2 were no better
 * (bench/results/verify-row-blocks). */
#ifndef XBLOCK_TABLE
#define XBLOCK_TABLE {{0}, {1}, {2}, {3}, {4}, {3, 0, 0, 2}, {3, 0, 0, 3}, {4, 0, 0, 0, 3}, \
                      {4, 0, 0, 0, 4}, {3, 0, 0, 3, 0, 0, 3}, {4, 0, 0, 0, 3, 0, 0, 3}}
#endif
_Static_assert(MR == 10, "XBLOCK has a row for every mr up to MR");
static const int8_t XBLOCK[MR + 1][MR] = XBLOCK_TABLE;

/* 32 bytes: 0x10 where bit i of `bits` is set (byte i), else 0 */
static inline __m256i x_bits16(uint32_t bits) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i sel = _mm256_set1_epi64x(0x8040201008040201LL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), spread);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* rows 8h..8h + 7 of 16 bytes as dwords */
static inline __m256i bytes8_epi32(const uint8_t *b, int h) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + 8 * h)));
}
#endif

#endif
