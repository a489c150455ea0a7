/* Q4_K weights in 16-row groups (T_Q4_KX) against int8 activations: one layout and one set of
 * integers for every build and every number of activation rows.
 *
 * The row-major kernels (rowdot8.c) keep eight integer lanes per weight row and take a float
 * step per lane, per activation row, every 256 weights: with a few verification rows that step
 * and the per-row scale products cost as much as the products themselves. Here the blocks of
 * 16 weight rows are interleaved once, at load (tq_repack_q4kx), so that each 32-bit lane of
 * a vector is one weight row: 4 weights of 16 rows are one vpdpbusd (AVX-512) against the
 * activation's 4 bytes broadcast, each row's super-block sum is complete in its lane, and one
 * float step serves 16 rows. Same size as the GGUF blocks (144 bytes per row and super-block).
 *
 * The arithmetic, per weight row r and activation row (the same in every build, so the bits
 * are): S = sum_j sc_j * sum_{i in sub-block j} q_i x8_i and M = sum_j mn_j * sum_{i in j} x8_i,
 * exact in int32 (|S| <= 8 * 63 * 32 * 15 * 127 < 2^25); then y = fma(float(S), d * xs, y) and
 * y = fma(float(M), -dmin * xs, y) per super-block in order, xs the activations' scale; last
 * y + bias. Activations rounded per 32, 64 or 128 values (ablock: the down projection's input,
 * whose outliers would coarsen a whole block of 256) have a scale per P = ablock / 32
 * sub-blocks: S and M then sum those P sub-blocks and take their two float steps at the end of
 * each, in order (P = 8: the steps above). AVX2 computes the same integers with maddubs (pairs) + madd (the scale on both
 * words of a lane), AVX-512 with vpdpbusd + vpdpwssd (the scale in the low word).
 *
 * A 16-row group's super-block (2304 bytes):
 *   [0, 32)     d, f16, rows 0..15          [32, 64)   dmin, f16
 *   [64, 192)   L[j][r] = (sc_j & 15) | (mn_j & 15) << 4, sub-block j = 0..7
 *   [192, 256)  H[t][r] = sc_2t >> 4 | (sc_2t+1 >> 4) << 2 | (mn_2t >> 4) << 4 | (mn_2t+1 >> 4) << 6
 *   [256, 2304) the quants: vector (j, p) (p = 0..3) at 256 + 64 (4j + p), byte 4r + i:
 *               q[32j + 4p + i] in the low nibble, q[32j + 16 + 4p + i] in the high one
 * Group g's super-block sb is at (g * nsb + sb) * 2304: a group is 16 rows' bytes, in place of
 * those rows.
 *
 * Q5_K (T_Q5_KX, 2816 bytes = 16 x 176): the same 2304 bytes of its low four bits, then
 *   [2304, 2816) the fifth bits: vector (j, p) has two 64-bit masks (little-endian) at
 *               2304 + 16 (4j + p) + 8h, bit 4r + i the fifth bit of q[32j + 16h + 4p + i]
 * q = 0..31: sums of 16 products no longer fit the int16 word that vpdpwssd takes, so the
 * AVX-512 code sums a sub-block's 32 in int32 and multiplies by sc_j (vpmulld); the integers,
 * and so the bits, are those of AVX2's maddubs + madd. */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "blocks.h"

#define XB 2304 /* bytes of a group's super-block */
#define XBK(five) ((five) ? 2816 : XB) /* Q5_K's */
/* Prefetch PF_BYTES ahead, a sub-block's four lines at a time: one burst of a super-block's 36
 * lines (PF_BLOCK) was slower and less steady from memory than the lines spread out
 * (experiments/kernel_bench.c, Zen 4, 2 threads) */
#define XPF PF_BYTES

/* The GGUF Q4_K rows (N % 16 == 0, row_bytes each) into the layout above (dst: as many bytes).
 * Returns 0, or -1 when N is not a multiple of 16 or K of 256. */
static int repack_k45(const uint8_t *src, int64_t N, int64_t K, uint8_t *dst, int five) {
    if (N % 16 || K % 256 || N <= 0)
        return -1;
    const int bs = five ? 176 : 144, xb = XBK(five);
    const int64_t nsb = K / 256, rb = nsb * bs;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < N / 16; g++)
        for (int64_t sb = 0; sb < nsb; sb++) {
            uint8_t *o = dst + (g * nsb + sb) * xb;
            memset(o, 0, xb);
            for (int r = 0; r < 16; r++) {
                const uint8_t *b = src + (16 * g + r) * rb + sb * bs, *s = b + 4;
                const uint8_t *qh = b + 16, *qs = b + 16 + 32 * five;
                memcpy(o + 2 * r, b, 2);
                memcpy(o + 32 + 2 * r, b + 2, 2);
                uint8_t sc[8], mn[8];
                for (int j = 0; j < 4; j++) {
                    sc[j] = s[j] & 63;
                    mn[j] = s[j + 4] & 63;
                    sc[j + 4] = (s[j + 8] & 15) | (s[j] >> 6) << 4;
                    mn[j + 4] = (s[j + 8] >> 4) | (s[j + 4] >> 6) << 4;
                }
                for (int j = 0; j < 8; j++)
                    o[64 + 16 * j + r] = (sc[j] & 15) | (mn[j] & 15) << 4;
                for (int t = 0; t < 4; t++)
                    o[192 + 16 * t + r] = (sc[2 * t] >> 4) | (sc[2 * t + 1] >> 4) << 2 |
                                          (mn[2 * t] >> 4) << 4 | (mn[2 * t + 1] >> 4) << 6;
                uint8_t q[256]; /* weight w: chunk c = w / 64, byte 32c + w % 32, nibble by bit 5 */
                for (int w = 0; w < 256; w++) /* Q5_K's fifth bit: qh[w % 32] bit w / 32 */
                    q[w] = ((qs[32 * (w / 64) + w % 32] >> (w % 64 >= 32 ? 4 : 0)) & 15) |
                           (five ? (qh[w % 32] >> (w / 32) & 1) << 4 : 0);
                for (int j = 0; j < 8; j++)
                    for (int p = 0; p < 4; p++)
                        for (int i = 0; i < 4; i++) {
                            const int a = 32 * j + 4 * p + i, bit = 4 * r + i;
                            o[256 + 64 * (4 * j + p) + bit] = (q[a] & 15) | (q[a + 16] & 15) << 4;
                            for (int h = 0; h < 2 && five; h++)
                                if (q[a + 16 * h] >> 4)
                                    o[XB + 16 * (4 * j + p) + 8 * h + bit / 8] |= 1 << bit % 8;
                        }
            }
        }
    return 0;
}

int tq_repack_q4kx(const uint8_t *src, int64_t N, int64_t K, uint8_t *dst) {
    return repack_k45(src, N, K, dst, 0);
}

int tq_repack_q5kx(const uint8_t *src, int64_t N, int64_t K, uint8_t *dst) {
    return repack_k45(src, N, K, dst, 1);
}

/* Q6_K in 16-row groups (T_Q6_KX), a group's super-block in 3360 bytes (16 x 210):
 *   [0, 32)       d, f16, rows 0..15
 *   [32, 288)     sc[k][r], int8, the 16-weight group k = 0..15
 *   [288, 2336)   the low four bits: vector (j, p) at 288 + 64 (4j + p), byte 4r + i:
 *                 q[32j + 4p + i] & 15 | (q[32j + 16 + 4p + i] & 15) << 4
 *   [2336, 3360)  the high two bits: vector (j, h) at 2336 + 64 (2j + h), byte 4r + i: bits 2p,
 *                 2p + 1 the high bits of q[32j + 16h + 4p + i], p = 0..3
 * q unsigned (0..63); the weight is d * sc * (q - 32). */
#define XB6 3360

int tq_repack_q6kx(const uint8_t *src, int64_t N, int64_t K, uint8_t *dst) {
    if (N % 16 || K % 256 || N <= 0)
        return -1;
    const int64_t nsb = K / 256, rb = nsb * 210;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < N / 16; g++)
        for (int64_t sb = 0; sb < nsb; sb++) {
            uint8_t *o = dst + (g * nsb + sb) * XB6;
            memset(o, 0, XB6);
            for (int r = 0; r < 16; r++) {
                const uint8_t *b = src + (16 * g + r) * rb + sb * 210;
                memcpy(o + 2 * r, b + 208, 2);
                for (int k = 0; k < 16; k++)
                    o[32 + 16 * k + r] = b[192 + k];
                uint8_t q[256];
                for (int h = 0; h < 2; h++) {
                    const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
                    for (int l = 0; l < 32; l++) {
                        q[128 * h + l] = (ql[l] & 15) | (qh[l] & 3) << 4;
                        q[128 * h + l + 32] = (ql[l + 32] & 15) | (qh[l] >> 2 & 3) << 4;
                        q[128 * h + l + 64] = (ql[l] >> 4) | (qh[l] >> 4 & 3) << 4;
                        q[128 * h + l + 96] = (ql[l + 32] >> 4) | (qh[l] >> 6 & 3) << 4;
                    }
                }
                for (int j = 0; j < 8; j++)
                    for (int i = 0; i < 4; i++) {
                        for (int p = 0; p < 4; p++)
                            o[288 + 64 * (4 * j + p) + 4 * r + i] =
                                (q[32 * j + 4 * p + i] & 15) | (q[32 * j + 16 + 4 * p + i] & 15) << 4;
                        for (int h = 0; h < 2; h++) {
                            uint8_t v = 0;
                            for (int p = 0; p < 4; p++)
                                v |= (q[32 * j + 16 * h + 4 * p + i] >> 4) << 2 * p;
                            o[2336 + 64 * (2 * j + h) + 4 * r + i] = v;
                        }
                    }
            }
        }
    return 0;
}

/* Q5_0 and Q4_0 in 16-row groups (T_Q5_0X, T_Q4_0X), a group's 32-weight block in 16 x 22
 * (Q4_0: 16 x 18) bytes:
 *   [0, 32)     d, f16, rows 0..15
 *   [32, 288)   the low four bits: vector p (0..3) at 32 + 64p, byte 4r + i:
 *               q[4p + i] & 15 | (q[16 + 4p + i] & 15) << 4
 *   [288, 352)  Q5_0 only, the fifth bits: eight 64-bit masks (little-endian), mask 2p + h at
 *               288 + 8 (2p + h), its bit 4r + i the fifth bit of q[16h + 4p + i] of row r
 * q unsigned (Q5_0: 0..31, Q4_0: 0..15); the weight is d (q - 16) (Q4_0: d (q - 8)).
 *
 * The arithmetic, per weight row r, activation row and block (the same in every build): T =
 * sum q x8 - 16 (8) sum x8, exact in int32; then y = fma(float(T), d * xs, y) per block in
 * order, xs the block's activation scale. With a scale per 16 activations (ablock 16: the down
 * projection's input), T_lo over the first 16 weights (the low nibbles) and T_hi over the
 * last 16, each less 16 (8) times its half's sum: y = fma(float(T_lo), d * xs_lo, y), then
 * y = fma(float(T_hi), d * xs_hi, y). The GGUF blocks' row-major kernels (rowdot8.c) take
 * their float steps per lane instead, so the two layouts differ in the last bits; each tensor
 * is read through one of them (kernels.repack) for every row count. */
#define XB50(five) ((five) ? 352 : 288)

int tq_repack_q50x(const uint8_t *src, int64_t N, int64_t K, uint8_t *dst, int five) {
    if (N % 16 || K % 32 || N <= 0)
        return -1;
    const int bs = five ? 22 : 18, xb = XB50(five);
    const int64_t nb = K / 32, rb = nb * bs;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < N / 16; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = dst + (g * nb + b) * xb;
            memset(o, 0, xb);
            for (int r = 0; r < 16; r++) {
                const uint8_t *blk = src + (16 * g + r) * rb + b * bs, *qs = blk + 2 + 4 * five;
                uint32_t qh = 0;
                if (five)
                    memcpy(&qh, blk + 2, 4);
                memcpy(o + 2 * r, blk, 2);
                uint8_t q[32];
                for (int j = 0; j < 32; j++)
                    q[j] = (j < 16 ? qs[j] & 15 : qs[j - 16] >> 4) | ((qh >> j) & 1) << 4;
                for (int p = 0; p < 4; p++)
                    for (int i = 0; i < 4; i++) {
                        o[32 + 64 * p + 4 * r + i] = (q[4 * p + i] & 15) | (q[16 + 4 * p + i] & 15) << 4;
                        for (int h = 0; h < 2 && five; h++)
                            if (q[16 * h + 4 * p + i] >> 4)
                                o[288 + 8 * (2 * p + h) + (4 * r + i) / 8] |= 1 << ((4 * r + i) % 8);
                    }
            }
        }
    return 0;
}

#include "groups16.h"

#if TQ_AVX512
/* the byte vectors sc_j (j = 0..3 or 4..7 as 128-bit lanes) from L (four L[j]) and H (four H[t]) */
static inline __m512i x_scales(__m512i L, __m512i Hx, __m512i sh, int mins) {
    const __m512i m4 = _mm512_set1_epi8(15), m3 = _mm512_set1_epi8(3);
    const __m512i lo = mins ? _mm512_and_si512(_mm512_srli_epi16(L, 4), m4) : _mm512_and_si512(L, m4);
    const __m512i hb = _mm512_and_si512(_mm512_srlv_epi16(Hx, sh), m3);
    return _mm512_or_si512(lo, _mm512_slli_epi16(hb, 4));
}

/* One 16-row Q4_K (Q5_K: five) group (its first super-block at w) against activation rows
 * [0, mr): y[m][r] */
static inline __attribute__((always_inline)) void group_rows_p(const uint8_t *w, int64_t nsb,
                                                               const acts8_t *A, int mr,
                                                               float (*y)[16], const int P,
                                                               const int five) {
    __m512 acc[MR];
    for (int m = 0; m < mr; m++)
        acc[m] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(15), c16 = _mm512_set1_epi8(16);
    /* per 128-bit lane: H[t] of sub-blocks 2t (shift 0) and 2t + 1 (shift 2); +4: the mins */
    const __m512i sh = _mm512_set_epi64(0x0002000200020002LL, 0x0002000200020002LL, 0, 0,
                                        0x0002000200020002LL, 0x0002000200020002LL, 0, 0);
    const __m512i sh4 = _mm512_add_epi16(sh, _mm512_set1_epi16(4));
    for (int64_t sb = 0; sb < nsb; sb++, w += XBK(five)) {
        for (int pf = 0; pf < 256; pf += 64) /* the header's lines; each sub-block's below */
            _mm_prefetch((const char *)w + XPF + pf, _MM_HINT_T0);
        for (int pf = 0; pf < 512 * five; pf += 64) /* Q5_K's fifth bits */
            _mm_prefetch((const char *)w + XPF + XB + pf, _MM_HINT_T0);
        const __m512 d = f16_ps(w), dmin = f16_ps(w + 32);
        const __m512i L0 = _mm512_loadu_si512((const void *)(w + 64));
        const __m512i L1 = _mm512_loadu_si512((const void *)(w + 128));
        const __m512i H = _mm512_loadu_si512((const void *)(w + 192));
        const __m512i Hx = _mm512_shuffle_i32x4(H, H, 0x50), Hy = _mm512_shuffle_i32x4(H, H, 0xFA);
        uint8_t scb[8][16], mnb[8][16]; /* sub-block j's 16 scales / mins */
        _mm512_storeu_si512((void *)scb[0], x_scales(L0, Hx, sh, 0));
        _mm512_storeu_si512((void *)scb[4], x_scales(L1, Hy, sh, 0));
        _mm512_storeu_si512((void *)mnb[0], x_scales(L0, Hx, sh4, 1));
        _mm512_storeu_si512((void *)mnb[4], x_scales(L1, Hy, sh4, 1));
        __m512i mnp[4]; /* dword r: mn_2t | mn_2t+1 << 16 */
        for (int t = 0; t < 4; t++)
            mnp[t] = _mm512_or_si512(u8_epi32(mnb[2 * t]), _mm512_slli_epi32(u8_epi32(mnb[2 * t + 1]), 16));
        const __m512 ndmin = _mm512_sub_ps(_mm512_setzero_ps(), dmin);
        int32_t bp[MR][4];
        for (int m = 0; m < mr; m++)
            group_pairs(A->bs + m * (A->K / 16) + 16 * sb, bp[m]);
        __m512i S[MR];
        for (int m = 0; m < mr; m++)
            S[m] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            for (int pf = 0; pf < 256; pf += 64)
                _mm_prefetch((const char *)w + XPF + 256 + 256 * j + pf, _MM_HINT_T0);
            const __m512i sc = u8_epi32(scb[j]);
            __m512i lo[4], hi[4];
            for (int p = 0; p < 4; p++) {
                const __m512i P = _mm512_loadu_si512((const void *)(w + 256 + 64 * (4 * j + p)));
                lo[p] = _mm512_and_si512(P, m4);
                hi[p] = _mm512_and_si512(_mm512_srli_epi16(P, 4), m4);
                if (five) {
                    uint64_t ml, mh;
                    memcpy(&ml, w + XB + 16 * (4 * j + p), 8);
                    memcpy(&mh, w + XB + 16 * (4 * j + p) + 8, 8);
                    lo[p] = _mm512_mask_add_epi8(lo[p], (__mmask64)ml, lo[p], c16);
                    hi[p] = _mm512_mask_add_epi8(hi[p], (__mmask64)mh, hi[p], c16);
                }
            }
            for (int m = 0; m < mr && five; m++) { /* Q5_K: the 32 products in int32 */
                const int8_t *x = A->q + m * A->K + 256 * sb + 32 * j;
                __m512i t = _mm512_setzero_si512();
                for (int p = 0; p < 4; p++)
                    t = _mm512_dpbusd_epi32(t, lo[p], _mm512_set1_epi32(load32(x + 4 * p)));
                for (int p = 0; p < 4; p++)
                    t = _mm512_dpbusd_epi32(t, hi[p], _mm512_set1_epi32(load32(x + 16 + 4 * p)));
                S[m] = _mm512_add_epi32(S[m], _mm512_mullo_epi32(t, sc));
            }
            for (int m = 0; m < mr && !five; m++) {
                const int8_t *x = A->q + m * A->K + 256 * sb + 32 * j;
                __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[0], _mm512_set1_epi32(load32(x)));
                for (int p = 1; p < 4; p++)
                    t = _mm512_dpbusd_epi32(t, lo[p], _mm512_set1_epi32(load32(x + 4 * p)));
                S[m] = _mm512_dpwssd_epi32(S[m], t, sc);
                t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi[0], _mm512_set1_epi32(load32(x + 16)));
                for (int p = 1; p < 4; p++)
                    t = _mm512_dpbusd_epi32(t, hi[p], _mm512_set1_epi32(load32(x + 16 + 4 * p)));
                S[m] = _mm512_dpwssd_epi32(S[m], t, sc);
            }
            if ((j + 1) % P)
                continue;
            for (int m = 0; m < mr; m++) { /* the end of an activation block (P sub-blocks) */
                __m512i M = _mm512_setzero_si512();
                for (int t = (j + 1 - P) / 2; t <= j / 2; t++)
                    M = _mm512_dpwssd_epi32(M, mnp[t], _mm512_set1_epi32(pair_of(bp[m][t], j, P)));
                const __m512 xs = _mm512_set1_ps(A->s[m * A->G + 8 * sb + j + 1 - P]);
                acc[m] = _mm512_fmadd_ps(cvt512_ps(S[m]), _mm512_mul_ps(d, xs), acc[m]);
                acc[m] = _mm512_fmadd_ps(cvt512_ps(M), _mm512_mul_ps(ndmin, xs), acc[m]);
                S[m] = _mm512_setzero_si512();
            }
        }
    }
    for (int m = 0; m < mr; m++)
        _mm512_storeu_ps(y[m], acc[m]);
}
/* One 16-row Q6_K group against activation rows [0, mr): per 16-weight group k, T = sum q x
 * (vpdpbusd, q unsigned), S += T * sc_k (vpmulld); then S - 32 sum_k sc_k b_k (b_k the group's
 * activation sum, vpdpwssd on scale pairs) and one float step */
static inline __attribute__((always_inline)) void group_rows6_p(const uint8_t *w, int64_t nsb,
                                                                const acts8_t *A, int mr,
                                                                float (*y)[16], const int P) {
    __m512 acc[MR];
    for (int m = 0; m < mr; m++)
        acc[m] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(15), m30 = _mm512_set1_epi8(0x30);
    for (int64_t sb = 0; sb < nsb; sb++, w += XB6) {
        for (int pf = 0; pf < 320; pf += 64) /* d, the scales, and each sub-block's lines below */
            _mm_prefetch((const char *)w + XPF + pf, _MM_HINT_T0);
        const __m512 d = f16_ps(w);
        __m512i scp[8]; /* dword r: sc_2u | sc_2u+1 << 16 */
        for (int u = 0; u < 8; u++)
            scp[u] = _mm512_or_si512(_mm512_and_si512(i8_epi32(w + 32 + 32 * u), _mm512_set1_epi32(0xFFFF)),
                                     _mm512_slli_epi32(i8_epi32(w + 48 + 32 * u), 16));
        __m512i S[MR];
        for (int m = 0; m < mr; m++)
            S[m] = _mm512_setzero_si512();
        for (int j = 0; j < 8; j++) {
            for (int pf = 320; pf < 704; pf += 64) /* 6 of the 48 lines past the scales */
                _mm_prefetch((const char *)w + XPF + pf + 384 * j, _MM_HINT_T0);
            __m512i lo4[4]; /* the low four bits, both nibbles */
            for (int p = 0; p < 4; p++)
                lo4[p] = _mm512_loadu_si512((const void *)(w + 288 + 64 * (4 * j + p)));
            for (int h = 0; h < 2; h++) {
                const __m512i Q = _mm512_loadu_si512((const void *)(w + 2336 + 64 * (2 * j + h)));
                const __m512i sc = i8_epi32(w + 32 + 16 * (2 * j + h));
                __m512i q[4]; /* the high bits p: (Q >> 2p & 3) << 4 */
                const __m512i hb[4] = {_mm512_and_si512(_mm512_slli_epi16(Q, 4), m30),
                                       _mm512_and_si512(_mm512_slli_epi16(Q, 2), m30),
                                       _mm512_and_si512(Q, m30),
                                       _mm512_and_si512(_mm512_srli_epi16(Q, 2), m30)};
                for (int p = 0; p < 4; p++)
                    q[p] = _mm512_or_si512(h ? _mm512_and_si512(_mm512_srli_epi16(lo4[p], 4), m4)
                                             : _mm512_and_si512(lo4[p], m4), hb[p]);
                for (int m = 0; m < mr; m++) {
                    const int8_t *x = A->q + m * A->K + 256 * sb + 32 * j + 16 * h;
                    __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[0], _mm512_set1_epi32(load32(x)));
                    for (int p = 1; p < 4; p++)
                        t = _mm512_dpbusd_epi32(t, q[p], _mm512_set1_epi32(load32(x + 4 * p)));
                    S[m] = _mm512_add_epi32(S[m], _mm512_mullo_epi32(t, sc));
                }
            }
            if ((j + 1) % P)
                continue;
            for (int m = 0; m < mr; m++) { /* the end of an activation block */
                const int16_t *bs = A->bs + m * (A->K / 16) + 16 * sb;
                __m512i B = _mm512_setzero_si512();
                for (int u = j + 1 - P; u <= j; u++)
                    B = _mm512_dpwssd_epi32(B, scp[u], _mm512_set1_epi32(load32((const int8_t *)(bs + 2 * u))));
                const __m512 xs = _mm512_set1_ps(A->s[m * A->G + 8 * sb + j + 1 - P]);
                acc[m] = _mm512_fmadd_ps(cvt512_ps(_mm512_sub_epi32(S[m], _mm512_slli_epi32(B, 5))),
                                         _mm512_mul_ps(d, xs), acc[m]);
                S[m] = _mm512_setzero_si512();
            }
        }
    }
    for (int m = 0; m < mr; m++)
        _mm512_storeu_ps(y[m], acc[m]);
}
/* One 16-row Q5_0 / Q4_0 group against activation rows [0, mr): per block, the 32 products of
 * each row in its lane (eight vpdpbusd against the activations' bytes broadcast), less 16 (8)
 * times the activations' sum, and one float step for the 16 rows */
static inline __attribute__((always_inline)) void group_rows50_p(const uint8_t *w, int64_t nb,
                                                                 const acts8_t *A, int mr,
                                                                 float (*y)[16], const int five,
                                                                 const int half) {
    __m512 acc[MR];
    for (int m = 0; m < mr; m++)
        acc[m] = _mm512_setzero_ps();
    const __m512i m4 = _mm512_set1_epi8(15), c16 = _mm512_set1_epi8(16);
    const int xb = XB50(five), off = five ? 16 : 8;
    for (int64_t b = 0; b < nb; b++, w += xb) {
        for (int pf = 0; pf < xb; pf += 64)
            _mm_prefetch((const char *)w + XPF + pf, _MM_HINT_T0);
        const __m512 d = f16_ps(w);
        __m512i lo[4], hi[4];
        for (int p = 0; p < 4; p++) {
            const __m512i P = _mm512_loadu_si512((const void *)(w + 32 + 64 * p));
            lo[p] = _mm512_and_si512(P, m4);
            hi[p] = _mm512_and_si512(_mm512_srli_epi16(P, 4), m4);
            if (five) {
                uint64_t ml, mh;
                memcpy(&ml, w + 288 + 16 * p, 8);
                memcpy(&mh, w + 288 + 16 * p + 8, 8);
                lo[p] = _mm512_mask_add_epi8(lo[p], (__mmask64)ml, lo[p], c16);
                hi[p] = _mm512_mask_add_epi8(hi[p], (__mmask64)mh, hi[p], c16);
            }
        }
        for (int m = 0; m < mr; m++) {
            const int8_t *x = A->q + m * A->K + 32 * b;
            const int16_t *bs = A->bs + m * (A->K / 16) + 2 * b;
            if (half) { /* a scale per 16 activations: the low nibbles' sum, then the high's */
                __m512i tl = _mm512_setzero_si512(), th = _mm512_setzero_si512();
                for (int p = 0; p < 4; p++) {
                    tl = _mm512_dpbusd_epi32(tl, lo[p], _mm512_set1_epi32(load32(x + 4 * p)));
                    th = _mm512_dpbusd_epi32(th, hi[p], _mm512_set1_epi32(load32(x + 16 + 4 * p)));
                }
                const float *xs = A->s + m * A->G + 2 * b;
                tl = _mm512_sub_epi32(tl, _mm512_set1_epi32(off * (int32_t)bs[0]));
                th = _mm512_sub_epi32(th, _mm512_set1_epi32(off * (int32_t)bs[1]));
                acc[m] = _mm512_fmadd_ps(cvt512_ps(tl), _mm512_mul_ps(d, _mm512_set1_ps(xs[0])), acc[m]);
                acc[m] = _mm512_fmadd_ps(cvt512_ps(th), _mm512_mul_ps(d, _mm512_set1_ps(xs[1])), acc[m]);
                continue;
            }
            __m512i t = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[0], _mm512_set1_epi32(load32(x)));
            for (int p = 1; p < 4; p++)
                t = _mm512_dpbusd_epi32(t, lo[p], _mm512_set1_epi32(load32(x + 4 * p)));
            for (int p = 0; p < 4; p++)
                t = _mm512_dpbusd_epi32(t, hi[p], _mm512_set1_epi32(load32(x + 16 + 4 * p)));
            t = _mm512_sub_epi32(t, _mm512_set1_epi32(off * ((int32_t)bs[0] + bs[1])));
            const __m512 xs = _mm512_set1_ps(A->s[m * A->G + b]);
            acc[m] = _mm512_fmadd_ps(cvt512_ps(t), _mm512_mul_ps(d, xs), acc[m]);
        }
    }
    for (int m = 0; m < mr; m++)
        _mm512_storeu_ps(y[m], acc[m]);
}
#else
#include "rowdotx_avx2.h"
#endif

/* the kernels above for P = 1, 2, 4, 8 sub-blocks per activation block (a compile-time constant) */
static void group_rows(const uint8_t *w, int64_t nsb, const acts8_t *A, int mr, float (*y)[16],
                       int P, int five) {
#define GROUP_P(p) (five ? group_rows_p(w, nsb, A, mr, y, p, 1) : group_rows_p(w, nsb, A, mr, y, p, 0))
    if (P == 8)
        GROUP_P(8);
    else if (P == 4)
        GROUP_P(4);
    else if (P == 2)
        GROUP_P(2);
    else
        GROUP_P(1);
#undef GROUP_P
}

static void group_rows6(const uint8_t *w, int64_t nsb, const acts8_t *A, int mr, float (*y)[16],
                        int P) {
    if (P == 8)
        group_rows6_p(w, nsb, A, mr, y, 8);
    else if (P == 4)
        group_rows6_p(w, nsb, A, mr, y, 4);
    else if (P == 2)
        group_rows6_p(w, nsb, A, mr, y, 2);
    else
        group_rows6_p(w, nsb, A, mr, y, 1);
}

/* half: the activations' scale per 16 values (ablock 16), else per 32 */
static void group_rows50(const uint8_t *w, int64_t nb, const acts8_t *A, int mr, float (*y)[16],
                         int five, int half) {
    if (half)
        five ? group_rows50_p(w, nb, A, mr, y, 1, 1) : group_rows50_p(w, nb, A, mr, y, 0, 1);
    else
        five ? group_rows50_p(w, nb, A, mr, y, 1, 0) : group_rows50_p(w, nb, A, mr, y, 0, 0);
}

/* Weight rows [n0, n1) (multiples of 16; W the repacked tensor, rb = K / 256 * 144 bytes per
 * row) against the M activation rows of A, rounded per ablock = 16 (Q4_0 / Q5_0), 32, 64, 128 or 256 values
 * (quantize_row8's qb): y = dot + bias. Activation rows in blocks of MR per pass over a group,
 * whose bytes (16 rows) then stay in cache for the next block. */
void x_rows(int type, const uint8_t *W, int64_t rb, int64_t n0, int64_t n1, const acts8_t *A,
            int64_t M, float *y, int64_t N, const float *bias, int ablock) {
    const int64_t nsb = A->K / 256;
    const int per = ablock / 32;
    float out[MR][16];
    for (int64_t n = n0; n < n1; n += 16) {
        const uint8_t *w = W + n * rb;
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
            const int mr = M - m0 < MR ? (int)(M - m0) : MR;
            acts8_t B = {A->q + m0 * A->K, A->s + m0 * A->G, A->sum + m0 * A->G,
                         A->bs + m0 * (A->K / 16), A->K, A->G};
            if (type == T_Q5_0X || type == T_Q4_0X)
                group_rows50(w, A->K / 32, &B, mr, out, type == T_Q5_0X, ablock == 16);
            else if (type == T_Q6_KX)
                group_rows6(w, nsb, &B, mr, out, per);
            else if (type == T_Q2_KX || type == T_Q3_KX || type == T_IQ4_XSX)
                xk_group(type, w, nsb, &B, mr, out, per);
            else
                group_rows(w, nsb, &B, mr, out, per, type == T_Q5_KX);
            for (int m = 0; m < mr; m++)
                for (int r = 0; r < 16; r++)
                    y[(m0 + m) * N + n + r] = out[m][r] + (bias ? bias[n + r] : 0.f);
        }
    }
}
