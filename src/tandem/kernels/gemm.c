/* The prompt kernel: K-quant weights against many int16 activation rows.
 *
 * row_dot re-derives each weight's int16 value (nibbles, fifth bit, sub-block scale) for every
 * MR = 10 activation rows, and its accumulators and the weights do not fit the 16 vector
 * registers (gcc spills). Here NR = 4 weight rows are unpacked once, KC weights at a time, into
 * an int16 buffer that stays in L1; a micro-kernel then runs MA activation rows against the 4
 * rows at a time (AVX2: 2 rows, 8 integer accumulators; AVX-512: 4 rows, 8 accumulators that
 * each hold two weight rows: vector v of rows 2p and 2p + 1 in one 512-bit register against
 * the activations broadcast to both halves, so no lanes need folding), for every row of
 * a block of activation rows (up to 64 rows within 2 MiB: L2, or L3 for long rows). The driver
 * (matmul.c) hands the weight rows out to the threads in chunks (gemm_range).
 * Each output element gets exactly row_dot's result bit for bit: lane j of each integer sum
 * holds the same products (a vector's 16 weights in the order of the activations, words 2j
 * and 2j + 1), integer sums do not depend on their order, and the float steps (one fma per 256
 * weights, Q6_K per 128, then the same lane sum) are the same operations in the same order. So
 * rows stay batch-invariant whichever path a call takes. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"

#define NR 4    /* weight rows per micro-kernel */
#if TQ_AVX512 /* activation rows per micro-kernel: 8 integer accumulators (two weight rows each)
                * and 8 float ones of 32 registers; MA 8 measured slower */
#define MA 4
#else /* 8 of 16 */
#define MA 2
#endif
#define KC 2048 /* weights per unpacked chunk: NR x KC int16 = 16 KiB */
#define GMB 64  /* most activation rows per block */

typedef struct {
    /* q times its sub-block scale; vector v (the weights of activations 16v..16v+15 as they
     * are stored: split for Q4_K / Q5_K, as quantize_row's split 1 in both builds) of row r
     * at w + (v*NR + r)*16, so the micro-kernel reads one stream (AVX-512: vector v of rows
     * 2p and 2p + 1 in one 512-bit load at w + v*NR*16 + 32p) */
    int16_t w[KC * NR];
    float d[KC / 32][NR];      /* per flush group (256 weights; Q6_K 128, Q8_0 32): the scale */
    float mn[KC / 256][NR][8]; /* Q4_K / Q5_K: -dmin times the eight mins, per super-block */
    int16_t sc6[KC / 256][NR][16]; /* int8 Q6_K: the 16 scales per super-block (the -32) */
    float acc[NR][GMB][8];
    float off[GMB][NR][8]; /* activation row m, weight row r: off[m][r] */
    int16_t mn2[KC / 256][NR][16]; /* Q2_K: the 16 mins per super-block */
    float dmin2[KC / 256][NR];     /* Q2_K: their scale */
    float offs[GMB][NR];           /* Q2_K: the mins' float sum (rowdotn.c's off) */
} gemm_buf;

/* vector v of the NR rows side by side (row r: buffer + ROWW r), so that one 512-bit load
 * meets vector v of rows 2p and 2p + 1 */
#define ROWW 16
#define VEC(out, v) ((__m256i *)((out) + (int64_t)(v) * NR * 16)) /* vector v of a row */

/* nsb super-blocks of one Q4_K / Q5_K row into out (row r: buffer + ROWW r), d (flush group f
 * at d[f * NR]), mn (super-block sb at mn[sb * NR]) */
static void unpack_k4(int five, const uint8_t *w, int64_t nsb, int16_t *out, float *d,
                      float (*mn)[8]) {
    const int bs = five ? 176 : 144;
    for (int64_t sb = 0; sb < nsb; sb++, w += bs) {
        __m256i sc16, qh;
        __m256 mnv;
        const uint8_t *qs = k4_head(five, w, &sc16, &mnv, &qh);
        d[sb * NR] = f16(w);
        _mm256_storeu_ps(mn[sb * NR], _mm256_mul_ps(_mm256_set1_ps(-f16(w + 2)), mnv));
        for (int c = 0; c < 4; c++) {
            __m256i q[4];
            k4_chunk(five, qs, qh, sc16, c, q);
            for (int i = 0; i < 4; i++) /* in the order of the split activations */
                _mm256_storeu_si256(VEC(out, 16 * sb + 4 * c + i), q[i]);
        }
    }
}

/* nsb super-blocks of one Q3_K / IQ4_XS row (unpack256: q times the 16- or 32-weight
 * sub-scale, in the activations' own order, int16 or int8 alike), d per super-block */
static void unpack_n(int type, const uint8_t *w, int64_t nsb, int16_t *out, float *d,
                     int16_t (*mn)[16], float *dmin) {
    const int64_t bb = block_bytes(type);
    for (int64_t sb = 0; sb < nsb; sb++, w += bb) {
        __m256i v[16];
        unpack256(type, w, v, mn[sb * NR], &d[sb * NR], &dmin[sb * NR]);
        for (int i = 0; i < 16; i++)
            _mm256_storeu_si256(VEC(out, 16 * sb + i), v[i]);
    }
}

/* nsb super-blocks of one Q6_K row: (q - 32) times the 16-weight scale; d per half */
static void unpack_q6k(const uint8_t *w, int64_t nsb, int16_t *out, float *d) {
    for (int64_t sb = 0; sb < nsb; sb++, w += 210) {
        const uint8_t *ql = w, *qh = w + 128;
        const int8_t *sc = (const int8_t *)(w + 192);
        d[2 * sb * NR] = d[(2 * sb + 1) * NR] = f16(w + 208);
        const __m256i scw = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
        for (int h = 0; h < 2; h++, ql += 64, qh += 32) {
            const __m256i sch = h ? _mm256_permute2x128_si256(scw, scw, 0x11)
                                  : _mm256_permute2x128_si256(scw, scw, 0x00);
            for (int part = 0; part < 2; part++) {
                __m256i q[4];
                q6_part(ql, qh, sch, part, q);
                /* weights 128h + 16 part + 32i of the super-block: vector 16 sb + 8h + part + 2i */
                for (int i = 0; i < 4; i++)
                    _mm256_storeu_si256(VEC(out, 16 * sb + 8 * h + part + 2 * i), q[i]);
            }
        }
    }
}

/* ---- int8 activations (--activations int8, mixed) -----------------------------------------
 * rowdot8.c's integer lane j of a 32-weight group holds its weights 4j..4j+3 (vpdpbusd /
 * maddubs + madd with the sub-block scale), where the int16 kernels' lane j holds weights 2j,
 * 2j + 1, 16 + 2j, 17 + 2j of their order. So the prompt kernel takes int8 activations widened
 * to int16 (the same integers) and weights q times their sub-block scale, both with each
 * 32-group stored as its even dwords (values 4k, 4k + 1) then its odd ones (4k + 2, 4k + 3):
 * the int16 micro-kernels' lane j then sums exactly rowdot8's products of lane j. One flush
 * per super-block, as rowdot8; Q6_K takes q unsigned, and its -32 (32 sc[2j] bs[2j] +
 * 32 sc[2j+1] bs[2j+1] in lane j, rowdot8's) comes off the integer sums before the flush. */

/* 32 int16 values in their order (a: 0..15, b: 16..31) -> even dwords, odd dwords */
static inline void store_pairs(__m256i a, __m256i b, __m256i *even, __m256i *odd) {
    const __m256 fa = _mm256_castsi256_ps(a), fb = _mm256_castsi256_ps(b);
    _mm256_storeu_si256(even, _mm256_permute4x64_epi64(
                                  _mm256_castps_si256(_mm256_shuffle_ps(fa, fb, 0x88)), 0xD8));
    _mm256_storeu_si256(odd, _mm256_permute4x64_epi64(
                                 _mm256_castps_si256(_mm256_shuffle_ps(fa, fb, 0xDD)), 0xD8));
}

/* One activation row of K int8 values, at byte K of the row's 2K bytes (quantize_row8 with
 * pairs 0), widened in place to K int16 in store_pairs' order. Group g reads bytes K + 32g..
 * and writes bytes 64g..64g + 63: never a later group's bytes. */
void gemm_widen8(int16_t *row, int64_t K) {
    const int8_t *src = (const int8_t *)row + K;
    for (int64_t g = 0; g < K / 32; g++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(src + 32 * g));
        const __m256i a = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v));
        const __m256i b = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1));
        store_pairs(a, b, (__m256i *)(row + 32 * g), (__m256i *)(row + 32 * g + 16));
    }
}

/* nb blocks of one Q8_0 row: int16 in the activations' order (int16 activations), or in
 * store_pairs' (int8: gemm_widen8's order, rowdot8's lanes of four); d per block */
static void unpack_q80(const uint8_t *w, int64_t nb, int16_t *out, float *d, int pairs) {
    for (int64_t g = 0; g < nb; g++, w += 34) {
        d[g * NR] = f16(w);
        const __m256i a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 2)));
        const __m256i b = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 18)));
        if (pairs) {
            store_pairs(a, b, VEC(out, 2 * g), VEC(out, 2 * g + 1));
        } else {
            _mm256_storeu_si256(VEC(out, 2 * g), a);
            _mm256_storeu_si256(VEC(out, 2 * g + 1), b);
        }
    }
}

/* nsb super-blocks of one Q4_K / Q5_K row, int8 order: q * sc, group g of the chunk as
 * vectors 2g, 2g + 1 (VEC); d and mn as unpack_k4's */
static void unpack_k4_8(int five, const uint8_t *w, int64_t nsb, int16_t *out, float *d,
                        float (*mn)[8]) {
    const int bs = five ? 176 : 144;
    const __m256i m4 = _mm256_set1_epi16(0x0F);
    for (int64_t sb = 0; sb < nsb; sb++, w += bs) {
        __m256i sc16, qh;
        __m256 mnv;
        const uint8_t *qs = k4_head(five, w, &sc16, &mnv, &qh);
        d[sb * NR] = f16(w);
        _mm256_storeu_ps(mn[sb * NR], _mm256_mul_ps(_mm256_set1_ps(-f16(w + 2)), mnv));
        const __m256i h0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(qh));
        const __m256i h1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(qh, 1));
        for (int c = 0; c < 4; c++) {
            const __m256i A = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(qs + 32 * c)));
            const __m256i B = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(qs + 32 * c + 16)));
            __m256i la = _mm256_and_si256(A, m4), lb = _mm256_and_si256(B, m4);
            __m256i ha = _mm256_srli_epi16(A, 4), hb = _mm256_srli_epi16(B, 4);
            if (five) {
                la = _mm256_or_si256(la, bit_at4(h0, 2 * c));
                lb = _mm256_or_si256(lb, bit_at4(h1, 2 * c));
                ha = _mm256_or_si256(ha, bit_at4(h0, 2 * c + 1));
                hb = _mm256_or_si256(hb, bit_at4(h1, 2 * c + 1));
            }
            const __m256i s0 = word_bcast(sc16, 2 * c), s1 = word_bcast(sc16, 2 * c + 1);
            const int64_t g = 8 * sb + 2 * c;
            store_pairs(_mm256_mullo_epi16(la, s0), _mm256_mullo_epi16(lb, s0), VEC(out, 2 * g),
                        VEC(out, 2 * g + 1));
            store_pairs(_mm256_mullo_epi16(ha, s1), _mm256_mullo_epi16(hb, s1),
                        VEC(out, 2 * g + 2), VEC(out, 2 * g + 3));
        }
    }
}

/* nsb super-blocks of one Q6_K row, int8 order: q (unsigned) times its 16-weight scale; d per
 * super-block; the scales in sc6 (super-block sb at sc6[sb * NR]) for the -32 */
static void unpack_q6k_8(const uint8_t *w, int64_t nsb, int16_t *out, float *d,
                         int16_t (*sc6)[16]) {
    const __m256i m4 = _mm256_set1_epi16(0x0F), m3 = _mm256_set1_epi16(3);
    for (int64_t sb = 0; sb < nsb; sb++, w += 210) {
        const int8_t *sc = (const int8_t *)(w + 192);
        d[sb * NR] = f16(w + 208);
        _mm256_storeu_si256((__m256i *)sc6[sb * NR],
                            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc)));
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w + 64 * h, *qh = w + 128 + 32 * h;
            for (int i = 0; i < 4; i++) { /* weights 128h + 32i + l of the super-block */
                __m256i q[2];
                for (int p = 0; p < 2; p++) { /* l = 16p .. 16p + 15 */
                    const __m256i L = _mm256_cvtepu8_epi16(
                        _mm_loadu_si128((const __m128i *)(ql + 32 * (i & 1) + 16 * p)));
                    const __m256i H = _mm256_cvtepu8_epi16(
                        _mm_loadu_si128((const __m128i *)(qh + 16 * p)));
                    const __m256i lo = i < 2 ? _mm256_and_si256(L, m4) : _mm256_srli_epi16(L, 4);
                    const __m256i hi = _mm256_slli_epi16(
                        _mm256_and_si256(_mm256_srli_epi16(H, 2 * i), m3), 4);
                    q[p] = _mm256_mullo_epi16(_mm256_or_si256(lo, hi),
                                              _mm256_set1_epi16(sc[8 * h + 2 * i + p]));
                }
                const int64_t g = 8 * sb + 4 * h + i;
                store_pairs(q[0], q[1], VEC(out, 2 * g), VEC(out, 2 * g + 1));
            }
        }
    }
}

#if !TQ_AVX512
#include "gemm_avx2.h"
#endif

/* rowdot8's Q6_K -32 for lane j: 32 (sc[2j] bs[2j] + sc[2j+1] bs[2j+1]) */
static inline __m256i q6_minus32(const int16_t *sc, const int16_t *bs) {
    return _mm256_slli_epi32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)sc),
                                               _mm256_loadu_si256((const __m256i *)bs)), 5);
}

#if TQ_AVX512
/* The AVX-512 micro-kernel: s[MA p + i] (16 int32 lanes: row 2p's eight, then row 2p + 1's)
 * += vector v of rows 2p and 2p + 1 (one 512-bit load) against x_i[16v..16v+15] in both halves
 * (one broadcast load), one vpdpwssd, for v < nv and np row pairs. Lane j of each half then
 * holds the sum the AVX2 micro-kernel's lane j holds for that row, with no fold; np pairs of
 * NR rows (a partial pair computes a row that is not kept). */
static inline __attribute__((always_inline)) void micro_512(const int16_t *w,
                                                            const int16_t *const x[MA],
                                                            int64_t nv, int np,
                                                            __m512i s[MA * NR / 2]) {
    for (int i = 0; i < MA * NR / 2; i++)
        s[i] = _mm512_setzero_si512();
    for (int64_t v = 0; v < nv; v++) {
        __m512i a[MA];
        for (int i = 0; i < MA; i++)
            a[i] = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(x[i] + 16 * v)));
        for (int p = 0; p < NR / 2; p++) {
            if (p < np) {
                const __m512i wv = _mm512_loadu_si512((const void *)(w + v * NR * 16 + 32 * p));
                for (int i = 0; i < MA; i++)
                    s[MA * p + i] = _mm512_dpwssd_epi32(s[MA * p + i], wv, a[i]);
            }
        }
    }
}
#endif


/* nr unpacked rows (chunk of kc weights from k0) against activation rows m and m + 1 (ma of
 * them), for every flush group of fw weights in the chunk: acc += cvt(int sum) * (d * x scale).
 * acc row mi + i: activation row m + i. The offsets (mins) are gemm_mins'. Always inlined into
 * gemm_rows: alone in this file gcc 12 keeps it out of line (large-stack-frame-growth), and
 * the prompt kernel ran slower so (Q4_K / Q6_K, 32-64 rows, experiments/kernel_bench.c). */
static inline __attribute__((always_inline)) void gemm_micro(gemm_buf *b, int nr, int ma, int fw,
                                                             const int16_t *xq, const float *xs,
                                                             int64_t K, int64_t G, int64_t k0,
                                                             int64_t kc, int64_t m, int64_t mi,
                                                             const int16_t *bs, int bytes) {
    /* bs: int8 Q6_K's per-16 sums of the activations (the -32), else NULL */
    const int nv = fw / 16;
#if TQ_AVX512
    /* The float sums, two weight rows per register: facc[NR/2 i + p] holds activation row
     * m + i against weight rows 2p (low half) and 2p + 1 (high half); each half takes the
     * same float steps as an AVX2 accumulator, and they stay in registers over the chunk. */
    __m512 facc[MA * NR / 2];
    for (int i = 0; i < MA; i++)
        for (int p = 0; p < NR / 2; p++) {
            const int r = 2 * p;
            /* the first chunk starts from zero (gemm_rows clears no float sums here) */
            const __m256 lo = k0 && i < ma && r < nr ? _mm256_loadu_ps(b->acc[r][mi + i])
                                                     : _mm256_setzero_ps();
            const __m256 hi = k0 && i < ma && r + 1 < nr ? _mm256_loadu_ps(b->acc[r + 1][mi + i])
                                                         : _mm256_setzero_ps();
            facc[NR / 2 * i + p] = _mm512_castpd_ps(_mm512_insertf64x4(
                _mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
        }
    for (int64_t f = 0; f < kc / fw; f++) {
        const int16_t *x[MA]; /* rows past the ma given repeat the first: computed, not kept */
        for (int i = 0; i < MA; i++)
            x[i] = xq + (m + (i < ma ? i : 0)) * K + k0 + f * fw;
        const int16_t *w = b->w + (int64_t)f * nv * NR * 16;
        __m512i s[MA * NR / 2]; /* s[MA p + i]: weight rows 2p, 2p + 1, activation row m + i */
        if (nr == NR)
            micro_512(w, x, nv, NR / 2, s);
        else
            micro_512(w, x, nv, (nr + 1) / 2, s);
        const int64_t g = (k0 + f * fw) / 32; /* the flush group's activation scale (a
                                               * 256-value block's is in each of its 32-groups) */
        __m512 dd[NR / 2]; /* [d of row 2p x 8 | d of row 2p + 1 x 8] */
        for (int p = 0; p < NR / 2; p++)
            dd[p] = _mm512_castpd_ps(_mm512_insertf64x4(
                _mm512_castps_pd(_mm512_castps256_ps512(_mm256_set1_ps(b->d[f][2 * p]))),
                _mm256_castps_pd(_mm256_set1_ps(b->d[f][2 * p + 1])), 1));
        for (int i = 0; i < MA; i++) {
            /* row_dot's d * x scale, two weight rows per register */
            const __m512 xv = _mm512_set1_ps(xs[(m + (i < ma ? i : 0)) * G + g]);
            for (int p = 0; p < NR / 2; p++) {
                const __m512 sc = _mm512_mul_ps(dd[p], xv);
                __m512i t = s[MA * p + i];
                if (bs) {
                    const int16_t *bm = bs + (m + (i < ma ? i : 0)) * (K / 16) + g * 2;
                    t = _mm512_sub_epi32(t, _mm512_inserti64x4(
                                                _mm512_castsi256_si512(q6_minus32(b->sc6[f][2 * p], bm)),
                                                q6_minus32(b->sc6[f][2 * p + 1], bm), 1));
                }
                facc[NR / 2 * i + p] = _mm512_fmadd_ps(cvt512_ps(t), sc,
                                                       facc[NR / 2 * i + p]);
            }
        }
    }
    for (int i = 0; i < ma; i++)
        for (int p = 0; p < NR / 2; p++) {
            const int r = 2 * p;
            if (r < nr)
                _mm256_storeu_ps(b->acc[r][mi + i], _mm512_castps512_ps256(facc[NR / 2 * i + p]));
            if (r + 1 < nr)
                _mm256_storeu_ps(b->acc[r + 1][mi + i], _mm256_castpd_ps(_mm512_extractf64x4_pd(
                                                            _mm512_castps_pd(facc[NR / 2 * i + p]), 1)));
        }
#else
    for (int64_t f = 0; f < kc / fw; f++) {
        __m256i s[MA * NR]; /* s[MA r + i]: weight row r, activation row m + i */
        for (int i = 0; i < MA * NR; i++)
            s[i] = _mm256_setzero_si256();
        const int16_t *x[MA]; /* rows past the ma given repeat the first: computed, not kept */
        for (int i = 0; i < MA; i++)
            x[i] = xq + (m + (i < ma ? i : 0)) * K + k0 + f * fw;
        const int16_t *w = b->w + (int64_t)f * nv * NR * 16;
        if (bytes) { /* unpack_k4_u8's groups against the rows' int8 values (byte K on) */
            const int8_t *x8[MA];
            for (int i = 0; i < MA; i++)
                x8[i] = (const int8_t *)(x[i] - k0 - f * fw) + K + k0 + f * fw;
            if (nr == NR) {
                micro8_4x2(w, x8[0], x8[1], fw / 32, s);
            } else {
                for (int64_t j = 0; j < fw / 32; j++) {
                    const __m256i a0 = _mm256_loadu_si256((const __m256i *)(x8[0] + 32 * j));
                    const __m256i a1 = _mm256_loadu_si256((const __m256i *)(x8[1] + 32 * j));
                    for (int r = 0; r < nr; r++) {
                        const __m256i q = _mm256_loadu_si256(VEC(w + ROWW * r, 2 * j));
                        const __m256i sc = _mm256_loadu_si256(VEC(w + ROWW * r, 2 * j + 1));
                        s[2 * r] = _mm256_add_epi32(s[2 * r], _mm256_madd_epi16(
                                                                  _mm256_maddubs_epi16(q, a0), sc));
                        s[2 * r + 1] = _mm256_add_epi32(s[2 * r + 1], _mm256_madd_epi16(
                                                                          _mm256_maddubs_epi16(q, a1), sc));
                    }
                }
            }
        } else if (nr == NR) {
            micro_4x2(w, x[0], x[1], nv, s);
        } else { /* the last rows of a thread's share */
            for (int j = 0; j < nv; j++) {
                const __m256i a0 = _mm256_loadu_si256((const __m256i *)(x[0] + 16 * j));
                const __m256i a1 = _mm256_loadu_si256((const __m256i *)(x[1] + 16 * j));
                for (int r = 0; r < nr; r++) {
                    const __m256i wv = _mm256_loadu_si256(VEC(w + 16 * r, j));
                    s[2 * r] = _mm256_add_epi32(s[2 * r], _mm256_madd_epi16(wv, a0));
                    s[2 * r + 1] = _mm256_add_epi32(s[2 * r + 1], _mm256_madd_epi16(wv, a1));
                }
            }
        }
        const int64_t g = (k0 + f * fw) / 32; /* the flush group's activation scale (a
                                               * 256-value block's is in each of its 32-groups) */
        if (bs)
            for (int i = 0; i < ma; i++)
                for (int r = 0; r < nr; r++)
                    s[MA * r + i] = _mm256_sub_epi32(
                        s[MA * r + i], q6_minus32(b->sc6[f][r], bs + (m + i) * (K / 16) + g * 2));
        /* row_dot's scalar products d * x scale, four weight rows per multiply (the unused lanes
         * of a partial group hold zero or an earlier group's scale: multiplied, never read) */
        float ds[MA][NR];
        const __m128 d4 = _mm_loadu_ps(b->d[f]);
        for (int i = 0; i < ma; i++)
            _mm_storeu_ps(ds[i], _mm_mul_ps(d4, _mm_set1_ps(xs[(m + i) * G + g])));
        for (int i = 0; i < ma; i++)
            for (int r = 0; r < nr; r++) {
                float *a = b->acc[r][mi + i];
                _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[MA * r + i]),
                                                    _mm256_broadcast_ss(&ds[i][r]),
                                                    _mm256_loadu_ps(a)));
            }
    }
#endif
}

/* Q4_K / Q5_K offsets of the chunk's nsb super-blocks for activation rows [mb, me): off +=
 * mn * (x sums), lane by lane in super-block order, as row_dot's offv. Separate from the flush
 * so that each row's four sums stay in registers across the chunk. */
static void gemm_mins(gemm_buf *b, int nr, int64_t nsb, const float *xsum, int64_t G,
                      int64_t k0, int64_t mb, int64_t me) {
    int64_t m = mb;
#if TQ_AVX512
    /* two weight rows per register (rows 2p and 2p + 1, each half the 8-lane sum of the AVX2
     * code) and two activation rows at a time */
    if (nr == NR)
        for (; m + 2 <= me; m += 2) {
            const float *xm = xsum + m * G + k0 / 32;
            __m512 o[2][NR / 2];
            for (int i = 0; i < 2; i++)
                for (int p = 0; p < NR / 2; p++) /* the first chunk starts from zero */
                    o[i][p] = k0 ? _mm512_loadu_ps(b->off[m + i - mb][2 * p])
                                 : _mm512_setzero_ps();
            for (int64_t sb = 0; sb < nsb; sb++) {
                const __m512 x0 = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(xm + 8 * sb))));
                const __m512 x1 = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(xm + G + 8 * sb))));
                for (int p = 0; p < NR / 2; p++) {
                    const __m512 mn = _mm512_loadu_ps(b->mn[sb][2 * p]);
                    o[0][p] = _mm512_fmadd_ps(mn, x0, o[0][p]);
                    o[1][p] = _mm512_fmadd_ps(mn, x1, o[1][p]);
                }
            }
            for (int i = 0; i < 2; i++)
                for (int p = 0; p < NR / 2; p++)
                    _mm512_storeu_ps(b->off[m + i - mb][2 * p], o[i][p]);
        }
#endif
    if (nr == NR) /* two activation rows at a time: eight independent chains of fmas */
        for (; m + 2 <= me; m += 2) {
            const float *xm = xsum + m * G + k0 / 32;
            __m256 o[2][NR];
            for (int i = 0; i < 2; i++)
                for (int r = 0; r < NR; r++) /* the first chunk starts from zero */
                    o[i][r] = k0 ? _mm256_loadu_ps(b->off[m + i - mb][r]) : _mm256_setzero_ps();
            for (int64_t sb = 0; sb < nsb; sb++) {
                const __m256 x0 = _mm256_loadu_ps(xm + 8 * sb), x1 = _mm256_loadu_ps(xm + G + 8 * sb);
                for (int r = 0; r < NR; r++) {
                    const __m256 mn = _mm256_loadu_ps(b->mn[sb][r]);
                    o[0][r] = _mm256_fmadd_ps(mn, x0, o[0][r]);
                    o[1][r] = _mm256_fmadd_ps(mn, x1, o[1][r]);
                }
            }
            for (int i = 0; i < 2; i++)
                for (int r = 0; r < NR; r++)
                    _mm256_storeu_ps(b->off[m + i - mb][r], o[i][r]);
        }
    for (; m < me; m++) {
        const float *xm = xsum + m * G + k0 / 32;
        for (int r = 0; r < nr; r++) {
            __m256 o = k0 ? _mm256_loadu_ps(b->off[m - mb][r]) : _mm256_setzero_ps();
            for (int64_t sb = 0; sb < nsb; sb++)
                o = _mm256_fmadd_ps(_mm256_loadu_ps(b->mn[sb][r]), _mm256_loadu_ps(xm + 8 * sb), o);
            _mm256_storeu_ps(b->off[m - mb][r], o);
        }
    }
}

/* One weight row's chunk of kc weights at w into the buffer as row r (int8: in that order) */
static void unpack_row(gemm_buf *b, int type, const uint8_t *w, int64_t kc, int r, int int8) {
    int16_t *out = b->w + ROWW * r;
    if (type == T_Q8_0)
        unpack_q80(w, kc / 32, out, &b->d[0][r], int8);
    else if (type_n(type))
        unpack_n(type, w, kc / 256, out, &b->d[0][r], &b->mn2[0][r], &b->dmin2[0][r]);
    else if (type == T_Q6_K && int8)
        unpack_q6k_8(w, kc / 256, out, &b->d[0][r], &b->sc6[0][r]);
    else if (type == T_Q6_K)
        unpack_q6k(w, kc / 256, out, &b->d[0][r]);
#if !TQ_AVX512
    else if (GEMM_BYTES(type) && int8)
        unpack_k4_u8(type == T_Q5_K, w, kc / 256, out, &b->d[0][r], &b->mn[0][r]);
#endif
    else if (int8)
        unpack_k4_8(type == T_Q5_K, w, kc / 256, out, &b->d[0][r], &b->mn[0][r]);
    else
        unpack_k4(type == T_Q5_K, w, kc / 256, out, &b->d[0][r], &b->mn[0][r]);
}

/* Q2_K's mins for activation rows [mb, me), as rowdotn.c's off: an fmaf per super-block of
 * mins x 16-value sums (int8: bs, else the block's s16; exact) by -dmin x activation scale */
static void gemm_q2k_offs(gemm_buf *b, int nr, int64_t nsb, const float *xs, int64_t G,
                          int64_t K, int64_t k0, int64_t mb, int64_t me, const int16_t *bs,
                          const int32_t *s16) {
    for (int64_t m = mb; m < me; m++)
        for (int64_t sb = 0; sb < nsb; sb++) {
            const int64_t j = (k0 + 256 * sb) / 16; /* the first 16-value group */
            for (int r = 0; r < nr; r++) {
                const int32_t im = bs ? mins8(b->mn2[sb][r], bs + m * (K / 16) + j)
                                      : mins32(b->mn2[sb][r], s16 + (m - mb) * (K / 16) + j);
                b->offs[m - mb][r] = fmaf((float)im, -b->dmin2[sb][r] *
                                          xs[m * G + (k0 / 256 + sb) * 8], b->offs[m - mb][r]);
            }
        }
}

/* Weight rows [n0, n1) against all M activation rows (int16, quantized): y = dot + bias */
static void gemm_rows(int type, const uint8_t *W, int64_t row_bytes, int64_t n0, int64_t n1,
                      const int16_t *xq, const float *xs, const float *xsum, const int16_t *bs,
                      int64_t M, int64_t K, float *y, int64_t N, const float *bias, gemm_buf *b) {
    /* bs: NULL for int16 activations; int8 (widened, gemm_widen8): quantize_row8's bs */
    const int64_t G = K / 32, bb = block_bytes(type);
    const int q6 = type == T_Q6_K, fw = type == T_Q8_0 ? 32 : q6 && !bs ? 128 : 256;
    const int mins = type == T_Q4_K || type == T_Q5_K;
    /* a block of activation rows: at most 64, and at most 2 MiB of them. Half of L2 (512 KiB on
     * Zen 3) left only 14 rows of K = 8960 to share each unpacking of the weights, and Q6_K
     * 1536x8960 ran slower than with 64 rows read from L3 (one thread) */
    int64_t mbs = 2097152 / (2 * K);
    mbs = mbs < 2 ? 2 : (mbs > GMB ? GMB : mbs & ~(int64_t)1);
    /* Q2_K: each activation row's sums of 16 values (exact), once per block of rows */
    const int sums = type == T_Q2_K && !bs; /* (int8 activations come with quantize_row8's) */
    int32_t *s16 = sums ? malloc(sizeof(int32_t) * mbs * (K / 16)) : NULL;
    int32_t spare[sums && !s16 ? 2 * (K / 16) : 1]; /* out of memory: 2 rows a block */
    const int own = s16 != NULL;
    if (sums && !own)
        s16 = spare, mbs = 2;
    for (int64_t mb = 0; mb < M; mb += mbs) {
        const int64_t me = M < mb + mbs ? M : mb + mbs;
        for (int64_t m = mb; sums && m < me; m++)
            for (int64_t j = 0; j < K / 16; j++)
                s16[(m - mb) * (K / 16) + j] = hsum_i32(_mm256_madd_epi16(
                    _mm256_loadu_si256((const __m256i *)(xq + m * K + 16 * j)), _mm256_set1_epi16(1)));
        for (int64_t n = n0; n < n1; n += NR) {
            const int nr = n1 - n < NR ? (int)(n1 - n) : NR;
            if (!TQ_AVX512) /* the block's rows only; the AVX-512 sums start from zero */
                for (int r = 0; r < nr; r++)
                    memset(b->acc[r], 0, sizeof b->acc[r][0] * (me - mb));
            if (!mins) /* no offsets; Q4_K / Q5_K's (gemm_mins) start from zero themselves */
                memset(b->off, 0, sizeof b->off[0] * (me - mb));
            memset(b->offs, 0, sizeof b->offs[0] * (me - mb));
            for (int64_t k0 = 0; k0 < K; k0 += KC) {
                const int64_t kc = K - k0 < KC ? K - k0 : KC;
                for (int r = 0; r < nr; r++)
                    unpack_row(b, type, W + (n + r) * row_bytes + k0 / block_weights(type) * bb,
                               kc, r, bs != NULL);
                for (int64_t m = mb; m < me; m += MA)
                    gemm_micro(b, nr, me - m < MA ? (int)(me - m) : MA, fw, xq, xs, K, G, k0, kc,
                               m, m - mb, q6 ? bs : NULL, GEMM_BYTES(type) && bs);
                if (mins)
                    gemm_mins(b, nr, kc / 256, xsum, G, k0, mb, me);
                if (type == T_Q2_K)
                    gemm_q2k_offs(b, nr, kc / 256, xs, G, K, k0, mb, me, bs, s16);
            }
            /* finish_rows' arithmetic (off = 0), hsum8 with four rows in the lanes: s = lo + hi,
             * then (s0 + s2) + (s1 + s3), the same additions in the same order for each row, and
             * the four results of activation row m stored together (a store per element, a
             * cache line apart for each, had cost a visible share of a 128-row product) */
            if (nr == NR) {
                const __m128 bias4 = bias ? _mm_loadu_ps(bias + n) : _mm_setzero_ps();
                for (int64_t m = mb; m < me; m++) {
                    __m128 t[NR];
                    for (int r = 0; r < NR; r++) {
                        const __m256 v = _mm256_add_ps(_mm256_loadu_ps(b->acc[r][m - mb]),
                                                       _mm256_loadu_ps(b->off[m - mb][r]));
                        t[r] = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
                    }
                    _MM_TRANSPOSE4_PS(t[0], t[1], t[2], t[3]); /* t[j]: lane j of rows 0..3 */
                    const __m128 out = _mm_add_ps(_mm_add_ps(_mm_add_ps(t[0], t[2]),
                                                             _mm_add_ps(t[1], t[3])),
                                                  _mm_loadu_ps(b->offs[m - mb]));
                    _mm_storeu_ps(y + m * N + n, _mm_add_ps(out, bias4));
                }
            } else {
                for (int64_t m = mb; m < me; m++)
                    for (int r = 0; r < nr; r++) {
                        const float out = hsum8(_mm256_add_ps(_mm256_loadu_ps(b->acc[r][m - mb]),
                                                              _mm256_loadu_ps(b->off[m - mb][r]))) + b->offs[m - mb][r];
                        y[m * N + n + r] = out + (bias ? bias[n + r] : 0.f);
                    }
            }
        }
    }
    if (own)
        free(s16);
}

void *gemm_buf_new(void) {
    gemm_buf *b = aligned_alloc(64, (sizeof(gemm_buf) + 63) / 64 * 64);
    if (b) { /* a partial group of rows multiplies unused lanes */
        memset(b->d, 0, sizeof b->d);
        memset(b->sc6, 0, sizeof b->sc6);
    }
    return b;
}

void gemm_range(void *buf, int type, const uint8_t *W, int64_t row_bytes, int64_t n0, int64_t n1,
                const int16_t *xq, const float *xs, const float *xsum, const int16_t *bs,
                int64_t M, int64_t K, float *y, int64_t N, const float *bias) {
    if (buf) {
        gemm_rows(type, W, row_bytes, n0, n1, xq, xs, xsum, bs, M, K, y, N, bias, (gemm_buf *)buf);
    } else { /* out of memory: ~35 KiB on this thread's stack */
        gemm_buf local;
        memset(local.d, 0, sizeof local.d);
        memset(local.sc6, 0, sizeof local.sc6);
        gemm_rows(type, W, row_bytes, n0, n1, xq, xs, xsum, bs, M, K, y, N, bias, &local);
    }
}
