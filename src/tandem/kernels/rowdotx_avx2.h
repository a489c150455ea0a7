/* The AVX2 build's kernels of Q4_K, Q5_K and Q6_K in 16-row groups (rowdotx.c includes this file
 * once, after its shared helpers: load32, group_pairs, pair_of; XB, XBK, XB6, XPF, MR). */
#ifndef TQ_ROWDOTX_AVX2_H
#define TQ_ROWDOTX_AVX2_H

/* A super-block's scales and mins as bytes, sc[j][r] and mn[j][r] (sub-block j, row r), two
 * sub-blocks per vector: L[2v], L[2v + 1] against H[v] (bits 0-1 / 2-3 the scales' high bits,
 * 4-5 / 6-7 the mins') */
static inline void x_scale_bytes(const uint8_t *w, uint8_t sc[8][16], uint8_t mn[8][16]) {
    const __m256i m4 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3);
    for (int v = 0; v < 4; v++) {
        const __m256i L = _mm256_loadu_si256((const __m256i *)(w + 64 + 32 * v));
        const __m256i H = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(w + 192 + 16 * v)));
        const __m256i hs = _mm256_blend_epi32(H, _mm256_srli_epi16(H, 2), 0xF0);
        const __m256i hm = _mm256_blend_epi32(_mm256_srli_epi16(H, 4), _mm256_srli_epi16(H, 6), 0xF0);
        _mm256_storeu_si256((__m256i *)sc[2 * v], _mm256_or_si256(
            _mm256_and_si256(L, m4), _mm256_slli_epi16(_mm256_and_si256(hs, m3), 4)));
        _mm256_storeu_si256((__m256i *)mn[2 * v], _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16(L, 4), m4), _mm256_slli_epi16(_mm256_and_si256(hm, m3), 4)));
    }
}

/* Activation rows m0 .. m0 + R - 1 (R a compile-time constant: S stays in registers) against
 * rows 8h .. 8h + 7 of one Q4_K super-block: the weights unpacked once per sub-block half for
 * the R rows, each row's integer sums and float steps exactly as for any other R */
static inline __attribute__((always_inline)) void q4_block(const uint8_t *w, int64_t sb, int h,
                                                           const acts8_t *A, int m0, const int R,
                                                           const int P, const __m256i *sc,
                                                           const __m256i *mnp, int32_t (*bp)[4],
                                                           __m256 d, __m256 ndmin,
                                                           __m256 (*acc)[2], const int five) {
    const __m256i m4 = _mm256_set1_epi8(15);
    __m256i S[4];
    for (int i = 0; i < R; i++)
        S[i] = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        if (h == 0 && m0 == 0)
            for (int pf = 0; pf < 256; pf += 64)
                _mm_prefetch((const char *)w + XPF + 256 + 256 * j + pf, _MM_HINT_T0);
        for (int half = 0; half < 2; half++) {
            __m256i q[4];
            for (int p = 0; p < 4; p++) {
                const __m256i P4 = _mm256_loadu_si256(
                    (const __m256i *)(w + 256 + 64 * (4 * j + p) + 32 * h));
                q[p] = half ? _mm256_and_si256(_mm256_srli_epi16(P4, 4), m4)
                            : _mm256_and_si256(P4, m4);
                if (five) { /* Q5_K: 8 products of <= 31 * 127 still fit a word */
                    uint64_t mb;
                    memcpy(&mb, w + XB + 16 * (4 * j + p) + 8 * half, 8);
                    q[p] = _mm256_or_si256(q[p], x_bits16((uint32_t)(mb >> 32 * h)));
                }
            }
            for (int i = 0; i < R; i++) {
                const int8_t *x = A->q + (m0 + i) * A->K + 256 * sb + 32 * j + 16 * half;
                __m256i t = _mm256_maddubs_epi16(q[0], _mm256_set1_epi32(load32(x)));
                for (int p = 1; p < 4; p++)
                    t = _mm256_add_epi16(t, _mm256_maddubs_epi16(
                                                q[p], _mm256_set1_epi32(load32(x + 4 * p))));
                S[i] = _mm256_add_epi32(S[i], _mm256_madd_epi16(t, sc[j]));
            }
        }
        if ((j + 1) % P)
            continue;
        /* the end of an activation block (P sub-blocks): its float steps */
        for (int i = 0; i < R; i++) {
            const int m = m0 + i;
            __m256i M = _mm256_setzero_si256();
            for (int t = (j + 1 - P) / 2; t <= j / 2; t++)
                M = _mm256_add_epi32(M, _mm256_madd_epi16(mnp[t], _mm256_set1_epi32(
                                                              pair_of(bp[m][t], j, P))));
            const __m256 xs = _mm256_set1_ps(A->s[m * A->G + 8 * sb + j + 1 - P]);
            acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S[i]), _mm256_mul_ps(d, xs), acc[m][h]);
            acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(M), _mm256_mul_ps(ndmin, xs), acc[m][h]);
            S[i] = _mm256_setzero_si256();
        }
    }
}

static inline __attribute__((always_inline)) void group_rows_p(const uint8_t *w, int64_t nsb,
                                                               const acts8_t *A, int mr,
                                                               float (*y)[16], const int P,
                                                               const int five) {
    __m256 acc[MR][2];
    for (int m = 0; m < mr; m++)
        acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++, w += XBK(five)) {
        for (int pf = 0; pf < 256 + 512 * five; pf += 64) /* the header, Q5_K's fifth bits */
            _mm_prefetch((const char *)w + XPF + (pf < 256 ? pf : XB + pf - 256), _MM_HINT_T0);
        int32_t bp[MR][4];
        for (int m = 0; m < mr; m++)
            group_pairs(A->bs + m * (A->K / 16) + 16 * sb, bp[m]);
        uint8_t scb[8][16], mnb[8][16];
        x_scale_bytes(w, scb, mnb);
        for (int h = 0; h < 2; h++) { /* rows 8h .. 8h + 7 */
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 16 * h)));
            const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 32 + 16 * h)));
            const __m256 ndmin = _mm256_sub_ps(_mm256_setzero_ps(), dmin);
            __m256i sc[8], mnp[4];
            for (int j = 0; j < 8; j++) { /* the scale on both words of a lane */
                const __m256i s = bytes8_epi32(scb[j], h);
                sc[j] = _mm256_or_si256(s, _mm256_slli_epi32(s, 16));
            }
            for (int t = 0; t < 4; t++)
                mnp[t] = _mm256_or_si256(bytes8_epi32(mnb[2 * t], h),
                                         _mm256_slli_epi32(bytes8_epi32(mnb[2 * t + 1], h), 16));
            for (int m0 = 0; m0 < mr;) {
                const int R = XBLOCK[mr][m0];
                if (R == 4)
                    q4_block(w, sb, h, A, m0, 4, P, sc, mnp, bp, d, ndmin, acc, five);
                else if (R == 3)
                    q4_block(w, sb, h, A, m0, 3, P, sc, mnp, bp, d, ndmin, acc, five);
                else if (R == 2)
                    q4_block(w, sb, h, A, m0, 2, P, sc, mnp, bp, d, ndmin, acc, five);
                else
                    q4_block(w, sb, h, A, m0, 1, P, sc, mnp, bp, d, ndmin, acc, five);
                m0 += R;
            }
        }
    }
    for (int m = 0; m < mr; m++) {
        _mm256_storeu_ps(y[m], acc[m][0]);
        _mm256_storeu_ps(y[m] + 8, acc[m][1]);
    }
}
/* Activation rows m0 .. m0 + R - 1 against rows 8 h8 .. 8 h8 + 7 of one Q6_K super-block (as
 * q4_block) */
static inline __attribute__((always_inline)) void q6_block(const uint8_t *w, int64_t sb, int h8,
                                                           const acts8_t *A, int m0, const int R,
                                                           const int P, const __m256i *scw16,
                                                           const __m256i *scp, __m256 d,
                                                           __m256 (*acc)[2]) {
    const __m256i m4 = _mm256_set1_epi8(15), m30 = _mm256_set1_epi8(0x30);
    __m256i S[4];
    for (int i = 0; i < R; i++)
        S[i] = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        if (h8 == 0 && m0 == 0)
            for (int pf = 320; pf < 704; pf += 64)
                _mm_prefetch((const char *)w + XPF + pf + 384 * j, _MM_HINT_T0);
        for (int h = 0; h < 2; h++) {
            const __m256i Q = _mm256_loadu_si256(
                (const __m256i *)(w + 2336 + 64 * (2 * j + h) + 32 * h8));
            __m256i q[4];
            const __m256i hb[4] = {_mm256_and_si256(_mm256_slli_epi16(Q, 4), m30),
                                   _mm256_and_si256(_mm256_slli_epi16(Q, 2), m30),
                                   _mm256_and_si256(Q, m30),
                                   _mm256_and_si256(_mm256_srli_epi16(Q, 2), m30)};
            for (int p = 0; p < 4; p++) {
                const __m256i P4 = _mm256_loadu_si256(
                    (const __m256i *)(w + 288 + 64 * (4 * j + p) + 32 * h8));
                q[p] = _mm256_or_si256(h ? _mm256_and_si256(_mm256_srli_epi16(P4, 4), m4)
                                         : _mm256_and_si256(P4, m4), hb[p]);
            }
            /* four products (<= 4 * 63 * 127) fit a word pair: madd with the scale on
             * both words sums sc * T, AVX-512's T * sc, without a 32-bit multiply */
            const __m256i scw = scw16[2 * j + h];
            for (int i = 0; i < R; i++) {
                const int8_t *x = A->q + (m0 + i) * A->K + 256 * sb + 32 * j + 16 * h;
                __m256i t = _mm256_madd_epi16(_mm256_maddubs_epi16(
                                                  q[0], _mm256_set1_epi32(load32(x))), scw);
                for (int p = 1; p < 4; p++)
                    t = _mm256_add_epi32(t, _mm256_madd_epi16(_mm256_maddubs_epi16(
                                                q[p], _mm256_set1_epi32(load32(x + 4 * p))), scw));
                S[i] = _mm256_add_epi32(S[i], t);
            }
        }
        if ((j + 1) % P)
            continue;
        for (int i = 0; i < R; i++) { /* the end of an activation block */
            const int m = m0 + i;
            const int16_t *bs = A->bs + m * (A->K / 16) + 16 * sb;
            __m256i B = _mm256_setzero_si256();
            for (int u = j + 1 - P; u <= j; u++)
                B = _mm256_add_epi32(B, _mm256_madd_epi16(
                                            scp[u], _mm256_set1_epi32(load32((const int8_t *)(bs + 2 * u)))));
            const __m256 xs = _mm256_set1_ps(A->s[m * A->G + 8 * sb + j + 1 - P]);
            acc[m][h8] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(_mm256_sub_epi32(S[i], _mm256_slli_epi32(B, 5))),
                _mm256_mul_ps(d, xs), acc[m][h8]);
            S[i] = _mm256_setzero_si256();
        }
    }
}

static inline __attribute__((always_inline)) void group_rows6_p(const uint8_t *w, int64_t nsb,
                                                                const acts8_t *A, int mr,
                                                                float (*y)[16], const int P) {
    __m256 acc[MR][2];
    for (int m = 0; m < mr; m++)
        acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++, w += XB6) {
        for (int pf = 0; pf < 320; pf += 64)
            _mm_prefetch((const char *)w + XPF + pf, _MM_HINT_T0);
        for (int h8 = 0; h8 < 2; h8++) { /* rows 8 h8 .. 8 h8 + 7 */
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 16 * h8)));
            __m256i sc[16], scp[8], scw16[16]; /* scw16: the scale on both words of a lane */
            for (int k = 0; k < 16; k++) {
                sc[k] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(w + 32 + 16 * k + 8 * h8)));
                scw16[k] = _mm256_or_si256(_mm256_and_si256(sc[k], _mm256_set1_epi32(0xFFFF)),
                                           _mm256_slli_epi32(sc[k], 16));
            }
            for (int u = 0; u < 8; u++)
                scp[u] = _mm256_or_si256(_mm256_and_si256(sc[2 * u], _mm256_set1_epi32(0xFFFF)),
                                         _mm256_slli_epi32(sc[2 * u + 1], 16));
            for (int m0 = 0; m0 < mr;) {
                const int R = XBLOCK[mr][m0];
                if (R == 4)
                    q6_block(w, sb, h8, A, m0, 4, P, scw16, scp, d, acc);
                else if (R == 3)
                    q6_block(w, sb, h8, A, m0, 3, P, scw16, scp, d, acc);
                else if (R == 2)
                    q6_block(w, sb, h8, A, m0, 2, P, scw16, scp, d, acc);
                else
                    q6_block(w, sb, h8, A, m0, 1, P, scw16, scp, d, acc);
                m0 += R;
            }
        }
    }
    for (int m = 0; m < mr; m++) {
        _mm256_storeu_ps(y[m], acc[m][0]);
        _mm256_storeu_ps(y[m] + 8, acc[m][1]);
    }
}

/* One 16-row Q5_0 / Q4_0 group, as the AVX-512 code (rowdotx.c): rows 8h .. 8h + 7 per half,
 * maddubs (four pairs in int16: |sum| <= 8 * 31 * 127) + madd give each row's lane the same
 * integers as vpdpbusd, and the float step is the same */
static inline __attribute__((always_inline)) void group_rows50_p(const uint8_t *w, int64_t nb,
                                                                 const acts8_t *A, int mr,
                                                                 float (*y)[16], const int five,
                                                                 const int half) {
    __m256 acc[MR][2];
    for (int m = 0; m < mr; m++)
        acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    const __m256i m4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const int xb = XB50(five), off = five ? 16 : 8;
    for (int64_t b = 0; b < nb; b++, w += xb) {
        for (int pf = 0; pf < xb; pf += 64)
            _mm_prefetch((const char *)w + XPF + pf, _MM_HINT_T0);
        for (int h = 0; h < 2; h++) {
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 16 * h)));
            __m256i lo[4], hi[4];
            for (int p = 0; p < 4; p++) {
                const __m256i P = _mm256_loadu_si256((const __m256i *)(w + 32 + 64 * p + 32 * h));
                lo[p] = _mm256_and_si256(P, m4);
                hi[p] = _mm256_and_si256(_mm256_srli_epi16(P, 4), m4);
                if (five) {
                    uint64_t ml, mh;
                    memcpy(&ml, w + 288 + 16 * p, 8);
                    memcpy(&mh, w + 288 + 16 * p + 8, 8);
                    lo[p] = _mm256_or_si256(lo[p], x_bits16((uint32_t)(ml >> 32 * h)));
                    hi[p] = _mm256_or_si256(hi[p], x_bits16((uint32_t)(mh >> 32 * h)));
                }
            }
            for (int m = 0; m < mr; m++) {
                const int8_t *x = A->q + m * A->K + 32 * b;
                __m256i tl = _mm256_maddubs_epi16(lo[0], _mm256_set1_epi32(load32(x)));
                __m256i th = _mm256_maddubs_epi16(hi[0], _mm256_set1_epi32(load32(x + 16)));
                for (int p = 1; p < 4; p++) {
                    tl = _mm256_add_epi16(tl, _mm256_maddubs_epi16(lo[p], _mm256_set1_epi32(load32(x + 4 * p))));
                    th = _mm256_add_epi16(th, _mm256_maddubs_epi16(hi[p], _mm256_set1_epi32(load32(x + 16 + 4 * p))));
                }
                const int16_t *bs = A->bs + m * (A->K / 16) + 2 * b;
                if (half) { /* rowdotx.c's per-16 steps: the low nibbles' sum, then the high's */
                    const float *xs = A->s + m * A->G + 2 * b;
                    const __m256i l32 = _mm256_sub_epi32(_mm256_madd_epi16(tl, ones),
                                                         _mm256_set1_epi32(off * (int32_t)bs[0]));
                    const __m256i h32 = _mm256_sub_epi32(_mm256_madd_epi16(th, ones),
                                                         _mm256_set1_epi32(off * (int32_t)bs[1]));
                    acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(l32),
                                                _mm256_mul_ps(d, _mm256_set1_ps(xs[0])), acc[m][h]);
                    acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(h32),
                                                _mm256_mul_ps(d, _mm256_set1_ps(xs[1])), acc[m][h]);
                    continue;
                }
                __m256i t = _mm256_add_epi32(_mm256_madd_epi16(tl, ones), _mm256_madd_epi16(th, ones));
                t = _mm256_sub_epi32(t, _mm256_set1_epi32(off * ((int32_t)bs[0] + bs[1])));
                const __m256 xs = _mm256_set1_ps(A->s[m * A->G + b]);
                acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(d, xs), acc[m][h]);
            }
        }
    }
    for (int m = 0; m < mr; m++) {
        _mm256_storeu_ps(y[m], acc[m][0]);
        _mm256_storeu_ps(y[m] + 8, acc[m][1]);
    }
}

#endif
