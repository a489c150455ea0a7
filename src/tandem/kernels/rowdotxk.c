/* Q2_K, Q3_K and IQ4_XS weights in 16-row groups (T_Q2_KX, T_Q3_KX, T_IQ4_XSX) against int8 activations, as
 * rowdotx.c's Q4_K: repacked once at load, the same bytes as the GGUF blocks, each 32-bit lane
 * of a vector one weight row, one float step per activation block for 16 rows, the same
 * integers and float steps in every build and at every number of activation rows.
 *
 * Q2_K, a group's super-block in 1344 bytes (16 x 84):
 *   [0, 32)      d, f16, rows 0..15           [32, 64)  dmin, f16
 *   [64, 320)    the GGUF scale bytes: byte 64 + 16k + r = sc_k | mn_k << 4, k = 0..15 (per 16)
 *   [320, 1344)  the quants: vector (c, p) (c, p = 0..3) at 320 + 64 (4c + p), byte 4r + i:
 *                bits 2s, 2s + 1 = q[64c + 16s + 4p + i], s = 0..3
 * Per weight row and activation row: S = sum_k sc_k sum_{i in k} q_i x8_i (each inner sum
 * <= 16 * 3 * 127: an int16 word, vpdpwssd / madd take it) and M = sum_k mn_k b_k (b_k the
 * per-16 activation sums); y = fma(float(S), d xs, y), y = fma(float(M), -dmin xs, y) at the
 * end of each activation block (P sub-blocks of 32), in order.
 *
 * Q3_K, 1760 bytes (16 x 110): d at [0, 32), the 6-bit scales sc6_k = sc_k + 32 (llama.cpp's
 * unpacking) at [32, 160) (byte 32 + 16 (k / 2) + r: the low nibbles of k even / odd) and
 * [160, 224) (byte 160 + 16 (k / 4) + r, bits 2 (k % 4): the high two), the low two bits of the
 * quants at [224, 1248) as Q2_K's, the high bits at [1248, 1760): vector (c, p) has four 64-bit
 * masks at 1248 + 32 (4c + p) + 8s, bit 4r + i that of q[64c + 16s + 4p + i]. With u = low |
 * high << 2 (0..7; the weight d sc_k (u - 4)): S = sum_k sc_k sum u x8 - 4 sum_k sc_k b_k and
 * y = fma(float(S), d xs, y) per activation block.
 *
 * IQ4_XS, a group's super-block in 2176 bytes (16 x 136):
 *   [0, 32)      d, f16                       [32, 96)  scales_l: byte 32 + 16t + r (t = 0..3)
 *   [96, 128)    scales_h: byte 96 + 16u + r = its byte u (u = 0..1)
 *   [128, 2176)  the quants: vector (j, p) at 128 + 64 (4j + p), byte 4r + i = qs[16j + 4p + i]
 *                (low nibble q[32j + 4p + i], high q[32j + 16 + 4p + i])
 * ls_j = scales_l's nibble j | (scales_h >> 2j & 3) << 4; per weight row and activation row
 * S = sum_j (ls_j - 32) sum_{i in j} T[q_i] x8_i, exact in int32 (T llama.cpp's kvalues_iq4nl);
 * y = fma(float(S), d xs, y) per activation block. AVX-512 sums (T + 128) x8 (vpdpbusd takes
 * one unsigned side) from -128 b_j (b_j the 32 activations' sum), i.e. sum T x8 per sub-block;
 * AVX2 sums |T| * (x8 signed by T) (maddubs: pairs <= 2 * 127 * 127). Both give S, so the same
 * bits. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "blocks.h"
#include "groups16.h"

#define XB2 1344 /* Q2_K: bytes of a group's super-block */
#define XB3 1760 /* Q3_K */
#define XBI 2176 /* IQ4_XS */
#define XPF PF_BYTES

int tq_repack_q2kx(const uint8_t *src, int64_t N, int64_t K, uint8_t *dst) {
    if (N % 16 || K % 256 || N <= 0)
        return -1;
    const int64_t nsb = K / 256, rb = nsb * 84;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < N / 16; g++)
        for (int64_t sb = 0; sb < nsb; sb++) {
            uint8_t *o = dst + (g * nsb + sb) * XB2;
            memset(o, 0, XB2);
            for (int r = 0; r < 16; r++) {
                const uint8_t *b = src + (16 * g + r) * rb + sb * 84, *qs = b + 16;
                memcpy(o + 2 * r, b + 80, 2);
                memcpy(o + 32 + 2 * r, b + 82, 2);
                for (int k = 0; k < 16; k++)
                    o[64 + 16 * k + r] = b[k];
                for (int w = 0; w < 256; w++) { /* weight w: qs[32 (w / 128) + w % 32], bits by w / 32 */
                    const int q = qs[32 * (w / 128) + w % 32] >> (2 * (w % 128 / 32)) & 3;
                    const int c = w / 64, s = w % 64 / 16, p = w % 16 / 4, i = w % 4;
                    o[320 + 64 * (4 * c + p) + 4 * r + i] |= q << 2 * s;
                }
            }
        }
    return 0;
}

int tq_repack_q3kx(const uint8_t *src, int64_t N, int64_t K, uint8_t *dst) {
    if (N % 16 || K % 256 || N <= 0)
        return -1;
    const int64_t nsb = K / 256, rb = nsb * 110;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < N / 16; g++)
        for (int64_t sb = 0; sb < nsb; sb++) {
            uint8_t *o = dst + (g * nsb + sb) * XB3;
            memset(o, 0, XB3);
            for (int r = 0; r < 16; r++) {
                const uint8_t *b = src + (16 * g + r) * rb + sb * 110, *hm = b, *qs = b + 32;
                memcpy(o + 2 * r, b + 108, 2);
                int16_t sc[16];
                q3k_scales(b + 96, sc);
                for (int k = 0; k < 16; k++) {
                    o[32 + 16 * (k / 2) + r] |= ((sc[k] + 32) & 15) << 4 * (k % 2);
                    o[160 + 16 * (k / 4) + r] |= ((sc[k] + 32) >> 4) << 2 * (k % 4);
                }
                for (int w = 0; w < 256; w++) { /* low bits as Q2_K's; the high bit hm[w % 32] bit w / 32 */
                    const int q = qs[32 * (w / 128) + w % 32] >> (2 * (w % 128 / 32)) & 3;
                    const int c = w / 64, s = w % 64 / 16, p = w % 16 / 4, bit = 4 * r + w % 4;
                    o[224 + 64 * (4 * c + p) + bit] |= q << 2 * s;
                    if (hm[w % 32] >> (w / 32) & 1)
                        o[1248 + 32 * (4 * c + p) + 8 * s + bit / 8] |= 1 << bit % 8;
                }
            }
        }
    return 0;
}

int tq_repack_iq4xsx(const uint8_t *src, int64_t N, int64_t K, uint8_t *dst) {
    if (N % 16 || K % 256 || N <= 0)
        return -1;
    const int64_t nsb = K / 256, rb = nsb * 136;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < N / 16; g++)
        for (int64_t sb = 0; sb < nsb; sb++) {
            uint8_t *o = dst + (g * nsb + sb) * XBI;
            for (int r = 0; r < 16; r++) {
                const uint8_t *b = src + (16 * g + r) * rb + sb * 136;
                memcpy(o + 2 * r, b, 2);
                for (int u = 0; u < 2; u++)
                    o[96 + 16 * u + r] = b[2 + u];
                for (int t = 0; t < 4; t++)
                    o[32 + 16 * t + r] = b[4 + t];
                for (int j = 0; j < 8; j++)
                    for (int p = 0; p < 4; p++)
                        memcpy(o + 128 + 64 * (4 * j + p) + 4 * r, b + 8 + 16 * j + 4 * p, 4);
            }
        }
    return 0;
}

#if TQ_AVX512
/* kvalues_iq4nl + 128 (vpdpbusd's unsigned side) */
static const uint8_t IQ4U[16] = {1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241};

/* the 16 rows' sc_k as dwords (high words 0: vpdpwssd's low word), k = 0..15, and the pairs
 * (Q2_K: mn_2u | mn_2u+1 << 16; Q3_K: sc_2u | sc_2u+1 << 16) that meet the per-16 sums */
static inline void qkx_scales(const uint8_t *w, int three, __m512i *sc, __m512i *pairs) {
    const __m512i m4 = _mm512_set1_epi32(15), m3 = _mm512_set1_epi32(3);
    for (int k = 0; k < 16; k++)
        if (three) {
            const __m512i lo = _mm512_srli_epi32(u8_epi32(w + 32 + 16 * (k / 2)), 4 * (k % 2));
            const __m512i hi = _mm512_srli_epi32(u8_epi32(w + 160 + 16 * (k / 4)), 2 * (k % 4));
            const __m512i v = _mm512_or_si512(_mm512_and_si512(lo, m4),
                                              _mm512_slli_epi32(_mm512_and_si512(hi, m3), 4));
            sc[k] = _mm512_and_si512(_mm512_sub_epi32(v, _mm512_set1_epi32(32)),
                                     _mm512_set1_epi32(0xFFFF));
        } else {
            sc[k] = _mm512_and_si512(u8_epi32(w + 64 + 16 * k), m4);
        }
    for (int u = 0; u < 8; u++)
        pairs[u] = three ? _mm512_or_si512(sc[2 * u], _mm512_slli_epi32(sc[2 * u + 1], 16))
                         : _mm512_or_si512(_mm512_srli_epi32(u8_epi32(w + 64 + 32 * u), 4),
                                           _mm512_slli_epi32(_mm512_srli_epi32(u8_epi32(w + 80 + 32 * u), 4), 16));
}

/* One 16-row Q2_K (Q3_K: three) group against activation rows [0, mr) */
static inline __attribute__((always_inline)) void qkx_p(const uint8_t *w, int64_t nsb,
                                                        const acts8_t *A, int mr,
                                                        float (*y)[16], const int P,
                                                        const int three) {
    __m512 acc[MR];
    for (int m = 0; m < mr; m++)
        acc[m] = _mm512_setzero_ps();
    const __m512i m3 = _mm512_set1_epi8(3), c4 = _mm512_set1_epi8(4);
    const int xb = three ? XB3 : XB2, qo = three ? 224 : 320;
    for (int64_t sb = 0; sb < nsb; sb++, w += xb) {
        for (int pf = 0; pf < qo; pf += 64) /* the header; the quants' lines below */
            _mm_prefetch((const char *)w + XPF + pf, _MM_HINT_T0);
        const __m512 d = f16_ps(w), ndmin = _mm512_sub_ps(_mm512_setzero_ps(), f16_ps(w + 32));
        __m512i sc[16], pairs[8];
        qkx_scales(w, three, sc, pairs);
        __m512i S[MR];
        for (int m = 0; m < mr; m++)
            S[m] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) { /* sub-block j: k = 2j, 2j + 1 */
            const uint8_t *v = w + qo + 256 * (j / 2);
            for (int pf = 0; pf < 128; pf += 64)
                _mm_prefetch((const char *)w + XPF + qo + 128 * j + pf, _MM_HINT_T0);
            if (three)
                _mm_prefetch((const char *)w + XPF + 1248 + 64 * j, _MM_HINT_T0);
            for (int h = 0; h < 2; h++) {
                const int k = 2 * j + h, s = 2 * (j % 2) + h;
                __m512i q[4];
                for (int p = 0; p < 4; p++) {
                    q[p] = _mm512_and_si512(_mm512_srli_epi16(_mm512_loadu_si512((const void *)(v + 64 * p)), 2 * s), m3);
                    if (three) {
                        uint64_t hb;
                        memcpy(&hb, w + 1248 + 32 * (4 * (j / 2) + p) + 8 * s, 8);
                        q[p] = _mm512_mask_add_epi8(q[p], (__mmask64)hb, q[p], c4);
                    }
                }
                for (int m = 0; m < mr; m++) {
                    const int8_t *x = A->q + m * A->K + 256 * sb + 16 * k;
                    __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[0], _mm512_set1_epi32(load32(x)));
                    for (int p = 1; p < 4; p++)
                        t = _mm512_dpbusd_epi32(t, q[p], _mm512_set1_epi32(load32(x + 4 * p)));
                    S[m] = _mm512_dpwssd_epi32(S[m], t, sc[k]);
                }
            }
            if ((j + 1) % P)
                continue;
            for (int m = 0; m < mr; m++) { /* the end of an activation block */
                const int16_t *bs = A->bs + m * (A->K / 16) + 16 * sb;
                __m512i M = _mm512_setzero_si512();
                for (int u = j + 1 - P; u <= j; u++)
                    M = _mm512_dpwssd_epi32(M, pairs[u], _mm512_set1_epi32(load32((const int8_t *)(bs + 2 * u))));
                const __m512 xs = _mm512_set1_ps(A->s[m * A->G + 8 * sb + j + 1 - P]);
                if (three) {
                    acc[m] = _mm512_fmadd_ps(cvt512_ps(_mm512_sub_epi32(S[m], _mm512_slli_epi32(M, 2))),
                                             _mm512_mul_ps(d, xs), acc[m]);
                } else {
                    acc[m] = _mm512_fmadd_ps(cvt512_ps(S[m]), _mm512_mul_ps(d, xs), acc[m]);
                    acc[m] = _mm512_fmadd_ps(cvt512_ps(M), _mm512_mul_ps(ndmin, xs), acc[m]);
                }
                S[m] = _mm512_setzero_si512();
            }
        }
    }
    for (int m = 0; m < mr; m++)
        _mm512_storeu_ps(y[m], acc[m]);
}

/* ls_j - 32 of the 16 rows as dwords */
static inline __m512i iq4x_scale(const uint8_t *w, int j) {
    const __m512i lo = _mm512_srli_epi32(u8_epi32(w + 32 + 16 * (j / 2)), 4 * (j % 2));
    const __m512i hi = _mm512_srli_epi32(u8_epi32(w + 96 + 16 * (j / 4)), 2 * (j % 4));
    return _mm512_sub_epi32(_mm512_or_si512(_mm512_and_si512(lo, _mm512_set1_epi32(15)),
                                            _mm512_slli_epi32(_mm512_and_si512(hi, _mm512_set1_epi32(3)), 4)),
                            _mm512_set1_epi32(32));
}

/* One 16-row IQ4_XS group against activation rows [0, mr). Each row's sum of 32 products starts
 * from -128 b_j (its activations' sum, loaded as a broadcast: no register copy), so that t is
 * sum T x8 itself and S = sum_j (ls_j - 32) t_j needs no correction at the block's end. */
static inline __attribute__((always_inline)) void iq4x_p(const uint8_t *w, int64_t nsb,
                                                         const acts8_t *A, int mr,
                                                         float (*y)[16], const int P) {
    __m512 acc[MR];
    for (int m = 0; m < mr; m++)
        acc[m] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(15);
    const __m512i tab = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)IQ4U));
    for (int64_t sb = 0; sb < nsb; sb++, w += XBI) {
        for (int pf = 0; pf < 128; pf += 64)
            _mm_prefetch((const char *)w + XPF + pf, _MM_HINT_T0);
        const __m512 d = f16_ps(w);
        int32_t off[MR][8]; /* -128 b_j: b_j = the sum of the row's 32 activations of sub-block j */
        for (int m = 0; m < mr; m++)
            _mm256_storeu_si256((__m256i *)off[m], _mm256_madd_epi16(
                _mm256_loadu_si256((const __m256i *)(A->bs + m * (A->K / 16) + 16 * sb)),
                _mm256_set1_epi16(-128)));
        __m512i S[MR];
        for (int m = 0; m < mr; m++)
            S[m] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            for (int pf = 0; pf < 256; pf += 64)
                _mm_prefetch((const char *)w + XPF + 128 + 256 * j + pf, _MM_HINT_T0);
            const __m512i sc = iq4x_scale(w, j);
            __m512i lo[4], hi[4];
            for (int p = 0; p < 4; p++) {
                const __m512i V = _mm512_loadu_si512((const void *)(w + 128 + 64 * (4 * j + p)));
                lo[p] = _mm512_shuffle_epi8(tab, _mm512_and_si512(V, m4));
                hi[p] = _mm512_shuffle_epi8(tab, _mm512_and_si512(_mm512_srli_epi16(V, 4), m4));
            }
            for (int m = 0; m < mr; m++) {
                const int8_t *x = A->q + m * A->K + 256 * sb + 32 * j;
                __m512i t = _mm512_set1_epi32(off[m][j]);
                for (int p = 0; p < 4; p++)
                    t = _mm512_dpbusd_epi32(t, lo[p], _mm512_set1_epi32(load32(x + 4 * p)));
                for (int p = 0; p < 4; p++)
                    t = _mm512_dpbusd_epi32(t, hi[p], _mm512_set1_epi32(load32(x + 16 + 4 * p)));
                S[m] = _mm512_add_epi32(S[m], _mm512_mullo_epi32(t, sc));
            }
            if ((j + 1) % P)
                continue;
            for (int m = 0; m < mr; m++) { /* one float step */
                const __m512 xs = _mm512_set1_ps(A->s[m * A->G + 8 * sb + j + 1 - P]);
                acc[m] = _mm512_fmadd_ps(cvt512_ps(S[m]), _mm512_mul_ps(d, xs), acc[m]);
                S[m] = _mm512_setzero_si512();
            }
        }
    }
    for (int m = 0; m < mr; m++)
        _mm512_storeu_ps(y[m], acc[m]);
}

/* iq4x_p with P and, for the default activation blocks (256 values: P = 8; the down
 * projection's 64: P = 2), mr as compile-time constants (each instance its own code: a
 * runtime mr keeps the row sums on the stack, ~10-20% slower; the other blocks take it so) */
static void iq4x_rows(const uint8_t *w, int64_t nsb, const acts8_t *A, int mr, float (*y)[16],
                      int P) {
#define IQ4_MR(p)                                                                                  \
    switch (mr) {                                                                                  \
    case 1: iq4x_p(w, nsb, A, 1, y, p); break;                                                     \
    case 2: iq4x_p(w, nsb, A, 2, y, p); break;                                                     \
    case 3: iq4x_p(w, nsb, A, 3, y, p); break;                                                     \
    case 4: iq4x_p(w, nsb, A, 4, y, p); break;                                                     \
    case 5: iq4x_p(w, nsb, A, 5, y, p); break;                                                     \
    case 6: iq4x_p(w, nsb, A, 6, y, p); break;                                                     \
    case 7: iq4x_p(w, nsb, A, 7, y, p); break;                                                     \
    case 8: iq4x_p(w, nsb, A, 8, y, p); break;                                                     \
    case 9: iq4x_p(w, nsb, A, 9, y, p); break;                                                     \
    default: iq4x_p(w, nsb, A, MR, y, p); break;                                                   \
    }
    _Static_assert(MR == 10, "a case for every mr up to MR");
    if (P == 8)
        IQ4_MR(8)
    else if (P == 2)
        IQ4_MR(2)
    else if (P == 4)
        iq4x_p(w, nsb, A, mr, y, 4);
    else
        iq4x_p(w, nsb, A, mr, y, 1);
#undef IQ4_MR
}

#else
#include "rowdotxk_avx2.h"
#endif

void xk_group(int type, const uint8_t *w, int64_t nsb, const acts8_t *A, int mr, float (*y)[16],
              int P) {
#if TQ_AVX512
    if (type == T_IQ4_XSX) {
        iq4x_rows(w, nsb, A, mr, y, P);
        return;
    }
#define XK_P(p) (type == T_Q3_KX ? qkx_p(w, nsb, A, mr, y, p, 1) : qkx_p(w, nsb, A, mr, y, p, 0))
#else
#define XK_P(p) (type == T_IQ4_XSX ? iq4x_p(w, nsb, A, mr, y, p)                              \
                 : type == T_Q3_KX ? qkx_p(w, nsb, A, mr, y, p, 1) : qkx_p(w, nsb, A, mr, y, p, 0))
#endif
    if (P == 8)
        XK_P(8);
    else if (P == 4)
        XK_P(4);
    else if (P == 2)
        XK_P(2);
    else
        XK_P(1);
#undef XK_P
}
