/* The AVX2 build's kernels of Q2_K, Q3_K and IQ4_XS in 16-row groups (rowdotxk.c includes this file
 * once): rows 8 h8 .. 8 h8 + 7 per half of a group, activation rows in blocks of 1 to 4
 * (XBLOCK), each row's integers and float steps those of the AVX-512 code. */
#ifndef TQ_ROWDOTXK_AVX2_H
#define TQ_ROWDOTXK_AVX2_H

/* Activation rows m0 .. m0 + R - 1 against rows 8 h8 .. 8 h8 + 7 of one Q2_K (Q3_K: three)
 * super-block: maddubs (four pairs in a word: <= 8 * 7 * 127) + madd with sc_k on both words */
static inline __attribute__((always_inline)) void qkx_block(const uint8_t *w, int64_t sb, int h8,
                                                            const acts8_t *A, int m0, const int R,
                                                            const int P, const __m256i *scw,
                                                            const __m256i *mnp, __m256 d,
                                                            __m256 ndmin, __m256 (*acc)[2],
                                                            const int three) {
    const __m256i m3 = _mm256_set1_epi8(3);
    const int qo = three ? 224 : 320;
    __m256i S[4];
    for (int i = 0; i < R; i++)
        S[i] = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        const uint8_t *v = w + qo + 256 * (j / 2) + 32 * h8;
        if (h8 == 0 && m0 == 0) {
            for (int pf = 0; pf < 128; pf += 64)
                _mm_prefetch((const char *)w + XPF + qo + 128 * j + pf, _MM_HINT_T0);
            if (three)
                _mm_prefetch((const char *)w + XPF + 1248 + 64 * j, _MM_HINT_T0);
        }
        for (int h = 0; h < 2; h++) {
            const int k = 2 * j + h, s = 2 * (j % 2) + h;
            __m256i q[4];
            for (int p = 0; p < 4; p++) {
                q[p] = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(v + 64 * p)), 2 * s), m3);
                if (three) { /* Q3_K's high bit: + 4 (0x10 >> 2) */
                    uint32_t hb;
                    memcpy(&hb, w + 1248 + 32 * (4 * (j / 2) + p) + 8 * s + 4 * h8, 4);
                    q[p] = _mm256_or_si256(q[p], _mm256_srli_epi16(x_bits16(hb), 2));
                }
            }
            for (int i = 0; i < R; i++) {
                const int8_t *x = A->q + (m0 + i) * A->K + 256 * sb + 16 * k;
                __m256i t = _mm256_maddubs_epi16(q[0], _mm256_set1_epi32(load32(x)));
                for (int p = 1; p < 4; p++)
                    t = _mm256_add_epi16(t, _mm256_maddubs_epi16(q[p], _mm256_set1_epi32(load32(x + 4 * p))));
                S[i] = _mm256_add_epi32(S[i], _mm256_madd_epi16(t, scw[k]));
            }
        }
        if ((j + 1) % P)
            continue;
        for (int i = 0; i < R; i++) { /* the end of an activation block */
            const int m = m0 + i;
            const int16_t *bs = A->bs + m * (A->K / 16) + 16 * sb;
            __m256i M = _mm256_setzero_si256();
            for (int u = j + 1 - P; u <= j; u++)
                M = _mm256_add_epi32(M, _mm256_madd_epi16(mnp[u], _mm256_set1_epi32(load32((const int8_t *)(bs + 2 * u)))));
            const __m256 xs = _mm256_set1_ps(A->s[m * A->G + 8 * sb + j + 1 - P]);
            if (three) { /* S - 4 sum_k sc_k b_k */
                acc[m][h8] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(S[i], _mm256_slli_epi32(M, 2))),
                                             _mm256_mul_ps(d, xs), acc[m][h8]);
            } else {
                acc[m][h8] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S[i]), _mm256_mul_ps(d, xs), acc[m][h8]);
                acc[m][h8] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(M), _mm256_mul_ps(ndmin, xs), acc[m][h8]);
            }
            S[i] = _mm256_setzero_si256();
        }
    }
}

/* the 8 rows' sc_k on both words of a lane (scw) and the pairs against the per-16 sums (mnp;
 * Q2_K: mn_2u | mn_2u+1 << 16, Q3_K: sc_2u | sc_2u+1 << 16) */
static inline void qkx_scales8(const uint8_t *w, int h8, int three, __m256i *scw, __m256i *mnp) {
    const __m256i m4 = _mm256_set1_epi32(15), m3 = _mm256_set1_epi32(3);
    __m256i sc[16];
    for (int k = 0; k < 16; k++) {
        if (three) {
            const __m256i lo = _mm256_srli_epi32(bytes8_epi32(w + 32 + 16 * (k / 2), h8), 4 * (k % 2));
            const __m256i hi = _mm256_srli_epi32(bytes8_epi32(w + 160 + 16 * (k / 4), h8), 2 * (k % 4));
            sc[k] = _mm256_and_si256(_mm256_sub_epi32(_mm256_or_si256(_mm256_and_si256(lo, m4),
                                                                      _mm256_slli_epi32(_mm256_and_si256(hi, m3), 4)),
                                                      _mm256_set1_epi32(32)), _mm256_set1_epi32(0xFFFF));
        } else {
            sc[k] = _mm256_and_si256(bytes8_epi32(w + 64 + 16 * k, h8), m4);
        }
        scw[k] = _mm256_or_si256(sc[k], _mm256_slli_epi32(sc[k], 16));
    }
    for (int u = 0; u < 8; u++)
        mnp[u] = three ? _mm256_or_si256(sc[2 * u], _mm256_slli_epi32(sc[2 * u + 1], 16))
                       : _mm256_or_si256(_mm256_srli_epi32(bytes8_epi32(w + 64 + 32 * u, h8), 4),
                                         _mm256_slli_epi32(_mm256_srli_epi32(bytes8_epi32(w + 80 + 32 * u, h8), 4), 16));
}

static inline __attribute__((always_inline)) void qkx_p(const uint8_t *w, int64_t nsb,
                                                        const acts8_t *A, int mr,
                                                        float (*y)[16], const int P,
                                                        const int three) {
    __m256 acc[MR][2];
    for (int m = 0; m < mr; m++)
        acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++, w += three ? XB3 : XB2) {
        for (int pf = 0; pf < (three ? 224 : 320); pf += 64)
            _mm_prefetch((const char *)w + XPF + pf, _MM_HINT_T0);
        for (int h8 = 0; h8 < 2; h8++) {
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 16 * h8)));
            const __m256 ndmin = _mm256_sub_ps(_mm256_setzero_ps(), _mm256_cvtph_ps(
                                                   _mm_loadu_si128((const __m128i *)(w + 32 + 16 * h8))));
            __m256i scw[16], mnp[8];
            qkx_scales8(w, h8, three, scw, mnp);
            for (int m0 = 0; m0 < mr;) {
                const int R = XBLOCK[mr][m0];
                if (R == 4)
                    qkx_block(w, sb, h8, A, m0, 4, P, scw, mnp, d, ndmin, acc, three);
                else if (R == 3)
                    qkx_block(w, sb, h8, A, m0, 3, P, scw, mnp, d, ndmin, acc, three);
                else if (R == 2)
                    qkx_block(w, sb, h8, A, m0, 2, P, scw, mnp, d, ndmin, acc, three);
                else
                    qkx_block(w, sb, h8, A, m0, 1, P, scw, mnp, d, ndmin, acc, three);
                m0 += R;
            }
        }
    }
    for (int m = 0; m < mr; m++) {
        _mm256_storeu_ps(y[m], acc[m][0]);
        _mm256_storeu_ps(y[m] + 8, acc[m][1]);
    }
}

/* Activation rows m0 .. m0 + R - 1 against rows 8 h8 .. 8 h8 + 7 of one IQ4_XS super-block:
 * |T| times the activations signed by T (maddubs, pairs <= 2 * 127 * 127), madd with ls_j - 32
 * on both words */
static inline __attribute__((always_inline)) void iq4x_block(const uint8_t *w, int64_t sb, int h8,
                                                             const acts8_t *A, int m0, const int R,
                                                             const int P, const __m256i *scw,
                                                             __m256 d, __m256 (*acc)[2]) {
    const __m256i m4 = _mm256_set1_epi8(15);
    const __m256i tab = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)IQ4NL));
    __m256i S[4];
    for (int i = 0; i < R; i++)
        S[i] = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        if (h8 == 0 && m0 == 0)
            for (int pf = 0; pf < 256; pf += 64)
                _mm_prefetch((const char *)w + XPF + 128 + 256 * j + pf, _MM_HINT_T0);
        for (int half = 0; half < 2; half++) {
            __m256i kv[4], akv[4];
            for (int p = 0; p < 4; p++) {
                const __m256i V = _mm256_loadu_si256((const __m256i *)(w + 128 + 64 * (4 * j + p) + 32 * h8));
                kv[p] = _mm256_shuffle_epi8(tab, _mm256_and_si256(half ? _mm256_srli_epi16(V, 4) : V, m4));
                akv[p] = _mm256_abs_epi8(kv[p]);
            }
            for (int i = 0; i < R; i++) {
                const int8_t *x = A->q + (m0 + i) * A->K + 256 * sb + 32 * j + 16 * half;
                __m256i t = _mm256_setzero_si256();
                for (int p = 0; p < 4; p++)
                    t = _mm256_add_epi32(t, _mm256_madd_epi16(_mm256_maddubs_epi16(
                        akv[p], _mm256_sign_epi8(_mm256_set1_epi32(load32(x + 4 * p)), kv[p])), scw[j]));
                S[i] = _mm256_add_epi32(S[i], t);
            }
        }
        if ((j + 1) % P)
            continue;
        for (int i = 0; i < R; i++) {
            const int m = m0 + i;
            const __m256 xs = _mm256_set1_ps(A->s[m * A->G + 8 * sb + j + 1 - P]);
            acc[m][h8] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S[i]), _mm256_mul_ps(d, xs), acc[m][h8]);
            S[i] = _mm256_setzero_si256();
        }
    }
}

static inline __attribute__((always_inline)) void iq4x_p(const uint8_t *w, int64_t nsb,
                                                         const acts8_t *A, int mr,
                                                         float (*y)[16], const int P) {
    __m256 acc[MR][2];
    for (int m = 0; m < mr; m++)
        acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < nsb; sb++, w += XBI) {
        for (int pf = 0; pf < 128; pf += 64)
            _mm_prefetch((const char *)w + XPF + pf, _MM_HINT_T0);
        for (int h8 = 0; h8 < 2; h8++) {
            const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + 16 * h8)));
            __m256i scw[8];
            for (int j = 0; j < 8; j++) {
                const __m256i lo = _mm256_srli_epi32(bytes8_epi32(w + 32 + 16 * (j / 2), h8), 4 * (j % 2));
                const __m256i hi = _mm256_srli_epi32(bytes8_epi32(w + 96 + 16 * (j / 4), h8), 2 * (j % 4));
                const __m256i s = _mm256_sub_epi32(
                    _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(15)),
                                    _mm256_slli_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(3)), 4)),
                    _mm256_set1_epi32(32));
                scw[j] = _mm256_or_si256(_mm256_and_si256(s, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(s, 16));
            }
            for (int m0 = 0; m0 < mr;) {
                const int R = XBLOCK[mr][m0];
                if (R == 4)
                    iq4x_block(w, sb, h8, A, m0, 4, P, scw, d, acc);
                else if (R == 3)
                    iq4x_block(w, sb, h8, A, m0, 3, P, scw, d, acc);
                else if (R == 2)
                    iq4x_block(w, sb, h8, A, m0, 2, P, scw, d, acc);
                else
                    iq4x_block(w, sb, h8, A, m0, 1, P, scw, d, acc);
                m0 += R;
            }
        }
    }
    for (int m = 0; m < mr; m++) {
        _mm256_storeu_ps(y[m], acc[m][0]);
        _mm256_storeu_ps(y[m] + 8, acc[m][1]);
    }
}

#endif
