/* Matrix products straight on GGUF quantized blocks, for x86-64 with AVX2 + FMA + F16C.
 *
 * y[m, n] = sum_k W[n, k] * x[m, k] (+ bias[n]) for a few rows m (decode, verification), with W
 * the tensor's bytes exactly as the GGUF file stores them (read in place from the memory map:
 * no repacking, no copy). Every GGUF block type handled here is, per group of 32 weights,
 *
 *     w = scale * q + offset,   q small integers (Q6_K: the 16-weight sub-scales folded into q),
 *
 * so a group's contribution is scale * sum(q * x) + offset * sum(x). The activations are
 * quantized to int16 per block of 32 (K-quants: 256) with scale max|x| / 16383 (error <=
 * 1/32766 of the block's largest value: 64 times finer than the bf16 activations of PyTorch's
 * int4 kernel; Q4_K / Q5_K store them split, see k4_nibbles), the integer dot products run on
 * _mm256_madd_epi16 (16 products per instruction), and everything after that is float32.
 * sum(x) uses the float values.
 *
 * Each output element is computed by the same sequence of operations whatever the number of
 * rows M, the other rows, or the thread count: results are batch-invariant bit for bit, so a
 * verification pass gives exactly the logits of one-token decoding.
 *
 * Block layouts (ggml-common.h; fp16 = IEEE half):
 *   Q4_0 (18 B / 32):  d, qs[16]            w[j] = d (lo(qs[j]) - 8),   w[j+16] = d (hi(qs[j]) - 8)
 *   Q4_1 (20 B / 32):  d, m, qs[16]         w = d q + m
 *   Q5_0 (22 B / 32):  d, qh[4], qs[16]     q = nibble | (bit j of qh) << 4, w = d (q - 16)
 *   Q5_1 (24 B / 32):  d, m, qh[4], qs[16]  w = d q + m
 *   Q8_0 (34 B / 32):  d, int8 qs[32]       w = d q
 *   Q4_K (144 B / 256): d, dmin, scales[12] (8 x 6-bit sc, 8 x 6-bit mn), qs[128]
 *        64-weight chunk c: bytes qs[32c..32c+31]; low nibbles = sub-block 2c, high = 2c+1;
 *        w = d sc[s] q - dmin mn[s]
 *   Q5_K (176 B / 256): d, dmin, scales[12], qh[32], qs[128]: as Q4_K, plus bit (2c) / (2c+1)
 *        of qh[l] as the fifth bit of weight l of sub-block 2c / 2c+1
 *   Q6_K (210 B / 256): ql[128], qh[64], int8 scales[16], d; per half h (128 weights):
 *        q = (4 bits of ql) | (2 bits of qh) << 4, w = d scales[16-weight group] (q - 32)
 */
#include <immintrin.h>
#include <omp.h>
#include "tq.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
       T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14 };  /* ggml type ids */

#define MR 10 /* activation rows per pass over a weight row: k = 8 or 9 drafted tokens verify in
                   * one pass (with 8, 9 rows cost an 8-row and a 1-row pass over the weights) */
#define MB 64 /* activation rows per block of the loop over weight rows */
#define TILE 32768 /* bytes of weight rows per tile */

int64_t tq_block_bytes(int type) {
    switch (type) {
    case T_Q4_0: return 18;
    case T_Q4_1: return 20;
    case T_Q5_0: return 22;
    case T_Q5_1: return 24;
    case T_Q8_0: return 34;
    case T_Q4_K: return 144;
    case T_Q5_K: return 176;
    case T_Q6_K: return 210;
    }
    return 0;
}

static int64_t block_weights(int type) { return type >= T_Q4_K ? 256 : 32; }

/* acc[m] + offv[m], summed across lanes, + off[m]: the end of every row's dot product */
static inline void finish_rows(const __m256 *acc, const __m256 *offv, const float *off, int mr,
                               float *out) {
    for (int m = 0; m < mr; m++)
        out[m] = hsum8(_mm256_add_ps(acc[m], offv[m])) + off[m];
}

static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* ---- activations: int16 per block of `qb` (32, or 256 for the K-quants) ---------------- */

/* max |x[i]| over n values (n a multiple of 8) */
static inline float block_amax(const float *x, int64_t n) {
    const __m256 signbit = _mm256_set1_ps(-0.0f);
    __m256 a = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8)
        a = _mm256_max_ps(a, _mm256_andnot_ps(signbit, _mm256_loadu_ps(x + i)));
    float am[8], amax = 0.f;
    _mm256_storeu_ps(am, a);
    for (int i = 0; i < 8; i++)
        amax = am[i] > amax ? am[i] : amax;
    return amax;
}

#define XQ_MAX 16383.f /* 15 bits: the K-quant integer sums below stay inside int32 */

/* q: K int16; s: K/32 scales (each 32-group gets its block's scale); sum: K/32 float sums.
 * split: each group of 32 stored as its 16 even-indexed values, then its 16 odd-indexed ones,
 * the order in which the Q4_K / Q5_K kernels take the weights apart (k4_nibbles). */
static void quantize_row(const float *x, int64_t K, int qb, int split, int16_t *q, float *s,
                         float *sum) {
    /* per 128-bit lane: words 0 2 4 6 1 3 5 7 */
    const __m256i evod = _mm256_broadcastsi128_si256(
        _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
    for (int64_t b0 = 0; b0 < K; b0 += qb) {
        const float amax = block_amax(x + b0, qb);
        const __m256 inv = _mm256_set1_ps(amax > 0.f ? XQ_MAX / amax : 0.f);
        for (int64_t g = b0 / 32; g < (b0 + qb) / 32; g++) {
            const float *xg = x + 32 * g;
            __m256 t = _mm256_setzero_ps();
            __m256i i32[4];
            for (int i = 0; i < 4; i++) {
                const __m256 v = _mm256_loadu_ps(xg + 8 * i);
                t = _mm256_add_ps(t, v);
                i32[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v, inv)); /* nearest even */
            }
            /* packs works per 128-bit lane: [a0..3 b0..3 a4..7 b4..7] -> fix the order */
            __m256i p0 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i32[0], i32[1]), 0xD8);
            __m256i p1 = _mm256_permute4x64_epi64(_mm256_packs_epi32(i32[2], i32[3]), 0xD8);
            if (split) { /* [evens of p0 | odds of p0], the same for p1, then recombined */
                const __m256i e0 = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(p0, evod), 0xD8);
                const __m256i e1 = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(p1, evod), 0xD8);
                p0 = _mm256_permute2x128_si256(e0, e1, 0x20);
                p1 = _mm256_permute2x128_si256(e0, e1, 0x31);
            }
            _mm256_storeu_si256((__m256i *)(q + 32 * g), p0);
            _mm256_storeu_si256((__m256i *)(q + 32 * g + 16), p1);
            float ts[8], tsum = 0.f;
            _mm256_storeu_ps(ts, t);
            for (int i = 0; i < 8; i++)
                tsum += ts[i];
            s[g] = amax / XQ_MAX;
            sum[g] = tsum;
        }
    }
}

/* ---- one group of 32 weights against `mr` activation rows ------------------------------- */

typedef struct {
    const int16_t *q; /* row m of the activations: q + m * K */
    const float *s, *sum;
    int64_t K, G; /* K and K / 32 */
} acts_t;

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

/* acc[m] += cvt(isum[m]) * (d * activation scale of the 32-group g); isum[m] = 0 */
#define FLUSH(d, g)                                                                           \
    do {                                                                                      \
        for (int m = 0; m < mr; m++) {                                                        \
            acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[m]),                              \
                                     _mm256_set1_ps((d) * A->s[m * A->G + (g)]), acc[m]);      \
            isum[m] = _mm256_setzero_si256();                                                 \
        }                                                                                     \
    } while (0)

static inline __m256i lo16(__m128i b) { /* 16 bytes -> 16 x int16 low nibbles */
    return _mm256_and_si256(_mm256_cvtepu8_epi16(b), _mm256_set1_epi16(0x0F));
}
static inline __m256i hi16(__m128i b) { /* 16 bytes -> 16 x int16 high nibbles */
    return _mm256_srli_epi16(_mm256_cvtepu8_epi16(b), 4);
}
/* 16 x int16 with 16 in lane j where bit j of `bits` (16 bits) is set */
static inline __m256i bit16(uint32_t bits) {
    const __m256i sel = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048,
                                          4096, 8192, 16384, (short)32768);
    __m256i b = _mm256_set1_epi16((short)bits);
    return _mm256_and_si256(_mm256_cmpeq_epi16(_mm256_and_si256(b, sel), sel),
                            _mm256_set1_epi16(16));
}

/* The eight 6-bit scales and mins of a Q4_K/Q5_K block (12 bytes at q), unpacked four at a
 * time: sm[0..7] = the scales, sm[8..15] = the mins. For j < 4: sc = q[j] & 63, mn = q[j+4] & 63;
 * for j >= 4: sc = (q[j+4] & 15) | (q[j-4] >> 6) << 4, mn = (q[j+4] >> 4) | (q[j] >> 6) << 4. */
static inline void k4_unpack(const uint8_t *q, uint8_t sm[16]) {
    uint32_t u[3], out[4];
    memcpy(u, q, 12);
    const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
    out[0] = u[0] & m6;                                       /* scales, j < 4 */
    out[1] = (u[2] & m4) | (((u[0] >> 6) & m2) << 4);         /* scales, j >= 4 */
    out[2] = u[1] & m6;                                       /* mins, j < 4 */
    out[3] = ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4);  /* mins, j >= 4 */
    memcpy(sm, out, 16);
}

/* The same as vectors: sc16 = the scales as int16, the same eight in both 128-bit lanes;
 * mnf = the mins as floats. */
static inline void k4_scales(const uint8_t *q, __m256i *sc16, __m256 *mnf) {
    uint8_t sm[16];
    k4_unpack(q, sm);
    const __m128i b = _mm_loadu_si128((const __m128i *)sm);
    *sc16 = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(b));
    *mnf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, 8)));
}

/* int16 word j (0..7) of each 128-bit lane of v, in every word of that lane */
static inline __m256i word_bcast(__m256i v, int j) {
    return _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(((2 * j + 1) << 8) | (2 * j))));
}
/* word j of the low lane in the low lane's words, word j2 of the high lane in the high lane's */
static inline __m256i word_bcast2(__m256i v, int j, int j2) {
    return _mm256_shuffle_epi8(v, _mm256_setr_m128i(_mm_set1_epi16((short)(((2 * j + 1) << 8) | (2 * j))),
                                                    _mm_set1_epi16((short)(((2 * j2 + 1) << 8) | (2 * j2)))));
}

/* The header of the Q4_K / Q5_K super-block at w: its scales and mins (k4_scales), its 32
 * fifth-bit bytes (qh; zero for Q4_K). Returns the quants. */
static inline __attribute__((always_inline)) const uint8_t *k4_head(int five, const uint8_t *w,
                                                                    __m256i *sc16, __m256 *mnv,
                                                                    __m256i *qh) {
    k4_scales(w + 4, sc16, mnv);
    *qh = five ? _mm256_loadu_si256((const __m256i *)(w + 16)) : _mm256_setzero_si256();
    return w + (five ? 48 : 16);
}

/* bit b of each int16 word of v at bit 4 (the fifth bit of a quant), other bits clear */
static inline __attribute__((always_inline)) __m256i bit_at4(__m256i v, int b) {
    const __m256i x = b > 4 ? _mm256_srli_epi16(v, b - 4) : _mm256_slli_epi16(v, 4 - b);
    return _mm256_and_si256(x, _mm256_set1_epi16(16));
}

/* Chunk c (64 weights, qs bytes 32c..32c+31) of a Q4_K / Q5_K super-block as int16 quants,
 * without widening: the 32 bytes read as 16 words, word k = bytes 2k, 2k+1, give
 *   v[0] = low nibbles of the even bytes  = weights 2k     of sub-block 2c,
 *   v[1] = low nibbles of the odd bytes   = weights 2k + 1 of sub-block 2c,
 *   v[2] = high nibbles of the even bytes = weights 2k     of sub-block 2c + 1,
 *   v[3] = high nibbles of the odd bytes  = weights 2k + 1 of sub-block 2c + 1,
 * which is why the activations of these types are stored split (quantize_row). Q5_K: bit 2c
 * (2c + 1) of qh byte l is the fifth bit of weight l of sub-block 2c (2c + 1). */
static inline __attribute__((always_inline)) void k4_nibbles(int five, const uint8_t *qs,
                                                             __m256i qh, int c, __m256i v[4]) {
    const __m256i m4 = _mm256_set1_epi16(0x000F);
    const __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
    v[0] = _mm256_and_si256(q, m4);
    v[1] = _mm256_and_si256(_mm256_srli_epi16(q, 8), m4);
    v[2] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    v[3] = _mm256_srli_epi16(q, 12);
    if (five) {
        v[0] = _mm256_or_si256(v[0], bit_at4(qh, 2 * c));
        v[1] = _mm256_or_si256(v[1], bit_at4(qh, 8 + 2 * c));
        v[2] = _mm256_or_si256(v[2], bit_at4(qh, 2 * c + 1));
        v[3] = _mm256_or_si256(v[3], bit_at4(qh, 9 + 2 * c));
    }
}

/* k4_nibbles times the sub-block scales (sc16: k4_scales'), for kernels that share one chunk
 * among several activation rows. q * sc <= 31 * 63 fits int16. */
static inline __attribute__((always_inline)) void k4_chunk(int five, const uint8_t *qs,
                                                           __m256i qh, __m256i sc16, int c,
                                                           __m256i v[4]) {
    k4_nibbles(five, qs, qh, c, v);
    const __m256i s0 = word_bcast(sc16, 2 * c), s1 = word_bcast(sc16, 2 * c + 1);
    v[0] = _mm256_mullo_epi16(v[0], s0);
    v[1] = _mm256_mullo_epi16(v[1], s0);
    v[2] = _mm256_mullo_epi16(v[2], s1);
    v[3] = _mm256_mullo_epi16(v[3], s1);
}

/* sub-block scale j (word j of sc16's lanes) as an int32 in every lane */
static inline __m256i dword_bcast(__m256i sc16, int j) {
    return _mm256_shuffle_epi8(sc16, _mm256_set1_epi32((int)(0x80800000u | ((2u * j + 1) << 8) | (2u * j))));
}

/* Part (0 or 1) of one half of a Q6_K super-block as int16 (q - 32) times its 16-weight scale:
 * v[i] = weights 16 part + 32 i .. + 15 of the half. ql, qh: the half's bytes; sch: its eight
 * scales as int16 in both lanes. (q - 32) * sc fits int16 (|.| <= 4096). */
static inline __attribute__((always_inline)) void q6_part(const uint8_t *ql, const uint8_t *qh,
                                                          __m256i sch, int part, __m256i v[4]) {
    const __m256i m4 = _mm256_set1_epi16(0x0F), m30 = _mm256_set1_epi16(0x30),
                  k32 = _mm256_set1_epi16(32);
    const int l = 16 * part;
    __m256i A0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(ql + l)));
    __m256i B0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(ql + l + 32)));
    __m256i H = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(qh + l)));
    __m256i v0 = _mm256_or_si256(_mm256_and_si256(A0, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30));
    __m256i v1 = _mm256_or_si256(_mm256_and_si256(B0, m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30));
    __m256i v2 = _mm256_or_si256(_mm256_srli_epi16(A0, 4), _mm256_and_si256(H, m30));
    __m256i v3 = _mm256_or_si256(_mm256_srli_epi16(B0, 4), _mm256_and_si256(_mm256_srli_epi16(H, 2), m30));
    v[0] = _mm256_mullo_epi16(_mm256_sub_epi16(v0, k32), word_bcast(sch, part));
    v[1] = _mm256_mullo_epi16(_mm256_sub_epi16(v1, k32), word_bcast(sch, 2 + part));
    v[2] = _mm256_mullo_epi16(_mm256_sub_epi16(v2, k32), word_bcast(sch, 4 + part));
    v[3] = _mm256_mullo_epi16(_mm256_sub_epi16(v3, k32), word_bcast(sch, 6 + part));
}

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
            const float d = f16(w), dmin = f16(w + 2);
            __m256i sc16, qh;
            __m256 mnv;
            const uint8_t *qs = k4_head(five, w, &sc16, &mnv, &qh);
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
            const uint8_t *ql = w, *qh = w + 128;
            const int8_t *sc = (const int8_t *)(w + 192);
            const float d = f16(w + 208);
            const __m256i scw = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
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
        }
        break;
    }
    }
    finish_rows(acc, offv, off, mr, out);
}

/* Weight rows [n0, n1) against mr activation rows: y[m * N + n] = dot + bias[n]. The type and
 * mr are compile-time constants inside each loop (row_dot is always inlined), so the switch and
 * the per-type constants sit outside the row loop: a K = 1536 row is only 6 super-blocks, and
 * per-row set-up cost as much as the products (measured with bench/kernel_bench.c). */
#define ROW_LOOP(fn, T, mr)                                                                   \
    for (int64_t n = n0; n < n1; n++) {                                                      \
        float out[MR];                                                                        \
        fn(T, W + n * rb, A, mr, out);                                                        \
        const float b = bias ? bias[n] : 0.f;                                                 \
        for (int m = 0; m < mr; m++)                                                          \
            y[m * N + n] = out[m] + b;                                                        \
    }
#define ROWS_FN(fn, acts, mr)                                                                 \
    static void fn##_rows_##mr(int t, const uint8_t *W, int64_t rb, int64_t n0, int64_t n1,  \
                               const acts *A, float *y, int64_t N, const float *bias) {      \
        switch (t) {                                                                          \
        case T_Q4_0: ROW_LOOP(fn, T_Q4_0, mr) break;                                          \
        case T_Q4_1: ROW_LOOP(fn, T_Q4_1, mr) break;                                          \
        case T_Q5_0: ROW_LOOP(fn, T_Q5_0, mr) break;                                          \
        case T_Q5_1: ROW_LOOP(fn, T_Q5_1, mr) break;                                          \
        case T_Q8_0: ROW_LOOP(fn, T_Q8_0, mr) break;                                          \
        case T_Q4_K: ROW_LOOP(fn, T_Q4_K, mr) break;                                          \
        case T_Q5_K: ROW_LOOP(fn, T_Q5_K, mr) break;                                          \
        case T_Q6_K: ROW_LOOP(fn, T_Q6_K, mr) break;                                          \
        }                                                                                     \
    }
/* fn_rows_1 .. fn_rows_10 (MR) and TABLE[mr] */
#define ROW_DOT_TABLE(fn, acts, TABLE)                                                        \
    ROWS_FN(fn, acts, 1) ROWS_FN(fn, acts, 2) ROWS_FN(fn, acts, 3) ROWS_FN(fn, acts, 4)       \
    ROWS_FN(fn, acts, 5) ROWS_FN(fn, acts, 6) ROWS_FN(fn, acts, 7) ROWS_FN(fn, acts, 8)       \
    ROWS_FN(fn, acts, 9) ROWS_FN(fn, acts, 10)                                                \
    static void (*const TABLE[MR + 1])(int, const uint8_t *, int64_t, int64_t, int64_t,       \
                                       const acts *, float *, int64_t, const float *) = {     \
        0, fn##_rows_1, fn##_rows_2, fn##_rows_3, fn##_rows_4,                                \
        fn##_rows_5, fn##_rows_6, fn##_rows_7, fn##_rows_8, fn##_rows_9, fn##_rows_10}

ROW_DOT_TABLE(row_dot, acts_t, ROW_DOTS);

/* ---- int8 activations (llama.cpp's scheme: Q8_K for the K-quants, Q8_0 otherwise) ------------
 * x~ = d * q8, d = max|x| / 127 per block of 256 (K-quants) or 32; u8 x s8 products on
 * _mm256_maddubs_epi16 (32 per instruction, no int16 widening of the weights), at llama.cpp's
 * precision (|x - x~| <= d / 2). Opt-in: --activations int8 (the draft's default). */

typedef struct {
    const int8_t *q;       /* row m: q + m * K */
    const float *s, *sum;  /* per 32-group: the block's scale; float sum of x */
    const int16_t *bs;     /* per 16-group: sum of q8 (Q6_K's -32) */
    int64_t K, G;
} acts8_t;

static void quantize_row8(const float *x, int64_t K, int qb, int8_t *q, float *s, float *sum,
                          int16_t *bs) {
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b0 = 0; b0 < K; b0 += qb) {
        const float amax = block_amax(x + b0, qb);
        const __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
        for (int64_t g = b0 / 32; g < (b0 + qb) / 32; g++) {
            const float *xg = x + 32 * g;
            __m256 t = _mm256_setzero_ps();
            __m256i i32[4];
            for (int i = 0; i < 4; i++) {
                const __m256 v = _mm256_loadu_ps(xg + 8 * i);
                t = _mm256_add_ps(t, v);
                i32[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v, inv));
            }
            for (int h = 0; h < 2; h++) { /* sums of the int8 values per 16 */
                int32_t v[8], acc = 0;
                _mm256_storeu_si256((__m256i *)v, _mm256_add_epi32(i32[2 * h], i32[2 * h + 1]));
                for (int i = 0; i < 8; i++)
                    acc += v[i];
                bs[2 * g + h] = (int16_t)acc;
            }
            __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i32[0], i32[1]),
                                           _mm256_packs_epi32(i32[2], i32[3]));
            _mm256_storeu_si256((__m256i *)(q + 32 * g), _mm256_permutevar8x32_epi32(p, order));
            float ts[8], tsum = 0.f;
            _mm256_storeu_ps(ts, t);
            for (int i = 0; i < 8; i++)
                tsum += ts[i];
            s[g] = amax / 127.f;
            sum[g] = tsum;
        }
    }
}

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
        const int64_t bs = tq_block_bytes(type);
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


/* ---- many activation rows (prompt chunks): K-quant weights unpacked once per block of rows --
 * row_dot re-derives each weight's int16 value (nibbles, fifth bit, sub-block scale) for every
 * MR = 10 activation rows, and its accumulators and the weights do not fit the 16 vector
 * registers (gcc spills). Here NR = 4 weight rows are unpacked once, KC weights at a time, into
 * an int16 buffer that stays in L1; a micro-kernel then runs 2 activation rows against the 4
 * rows at a time, 8 integer accumulators in registers, for every row of a block of activation
 * rows (up to 64 rows within 2 MiB: L2, or L3 for long rows).
 * Each output element gets exactly row_dot's result bit for bit: lane j of each integer sum
 * holds the same products (a vector's 16 weights in the order of the activations, words 2j
 * and 2j + 1), integer sums do not depend on their order, and the float steps (one fma per 256
 * weights, Q6_K per 128, then the same lane sum) are the same operations in the same order. So
 * rows stay batch-invariant whichever path a call takes. */

/* activation rows from which a K-quant product takes this path; tq_set_prompt_rows changes it
 * (TANDEM_PROMPT_KERNEL=0 turns the path off, for comparisons) */
static int64_t gemm_min = 16;
int64_t tq_set_prompt_rows(int64_t m) { /* returns the previous value */
    const int64_t was = gemm_min;
    gemm_min = m < 1 ? 1 : m;
    return was;
}
#define NR 4    /* weight rows per micro-kernel */
#define KC 2048 /* weights per unpacked chunk: NR x KC int16 = 16 KiB */
#define GMB 64  /* most activation rows per block */

typedef struct {
    /* q times its sub-block scale; vector v (the weights of activations 16v..16v+15 as they
     * are stored: split for Q4_K / Q5_K) of row r at w + (v*NR + r)*16, so the micro-kernel
     * reads one stream */
    int16_t w[KC * NR];
    float d[KC / 128][NR];     /* per flush group (256 weights; Q6_K 128): the block scale */
    float mn[NR][KC / 256][8]; /* Q4_K / Q5_K: -dmin times the eight mins, per super-block */
    float acc[NR][GMB][8], off[NR][GMB][8];
} gemm_buf;

#define VEC(out, v) ((__m256i *)((out) + (int64_t)(v) * NR * 16)) /* vector v of a row */

/* nsb super-blocks of one Q4_K / Q5_K row into out (row r: buffer + 16 r), d (flush group f
 * at d[f * NR]), mn */
static void unpack_k4(int five, const uint8_t *w, int64_t nsb, int16_t *out, float *d,
                      float (*mn)[8]) {
    const int bs = five ? 176 : 144;
    for (int64_t sb = 0; sb < nsb; sb++, w += bs) {
        __m256i sc16, qh;
        __m256 mnv;
        const uint8_t *qs = k4_head(five, w, &sc16, &mnv, &qh);
        d[sb * NR] = f16(w);
        _mm256_storeu_ps(mn[sb], _mm256_mul_ps(_mm256_set1_ps(-f16(w + 2)), mnv));
        for (int c = 0; c < 4; c++) {
            __m256i q[4];
            k4_chunk(five, qs, qh, sc16, c, q);
            for (int i = 0; i < 4; i++) /* in the order of the split activations */
                _mm256_storeu_si256(VEC(out, 16 * sb + 4 * c + i), q[i]);
        }
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

/* s[2r + i] += madd(vector j of row r, x_i[16j..]) for j < nv and the 4 rows: the inner loop in
 * assembly because gcc 12 compiles the same C into a copy of every accumulator per step and
 * runs 1.5x slower (measured). w: the buffer at the first vector; x0, x1: activation rows. */
static inline void micro_4x2(const int16_t *w, const int16_t *x0, const int16_t *x1, int64_t nv,
                             __m256i s[8]) {
    __m256i s0 = s[0], s1 = s[1], s2 = s[2], s3 = s[3], s4 = s[4], s5 = s[5], s6 = s[6], s7 = s[7];
    __m256i a0, a1, wv, t;
    __asm__("1:\n\t"
            "vmovdqu (%[x0]), %[a0]\n\t"
            "vmovdqu (%[x1]), %[a1]\n\t"
            "vmovdqu (%[w]), %[wv]\n\t"
            "vpmaddwd %[wv], %[a0], %[t]\n\t"
            "vpaddd %[t], %[s0], %[s0]\n\t"
            "vpmaddwd %[wv], %[a1], %[t]\n\t"
            "vpaddd %[t], %[s1], %[s1]\n\t"
            "vmovdqu 32(%[w]), %[wv]\n\t"
            "vpmaddwd %[wv], %[a0], %[t]\n\t"
            "vpaddd %[t], %[s2], %[s2]\n\t"
            "vpmaddwd %[wv], %[a1], %[t]\n\t"
            "vpaddd %[t], %[s3], %[s3]\n\t"
            "vmovdqu 64(%[w]), %[wv]\n\t"
            "vpmaddwd %[wv], %[a0], %[t]\n\t"
            "vpaddd %[t], %[s4], %[s4]\n\t"
            "vpmaddwd %[wv], %[a1], %[t]\n\t"
            "vpaddd %[t], %[s5], %[s5]\n\t"
            "vmovdqu 96(%[w]), %[wv]\n\t"
            "vpmaddwd %[wv], %[a0], %[t]\n\t"
            "vpaddd %[t], %[s6], %[s6]\n\t"
            "vpmaddwd %[wv], %[a1], %[t]\n\t"
            "vpaddd %[t], %[s7], %[s7]\n\t"
            "add $32, %[x0]\n\t"
            "add $32, %[x1]\n\t"
            "add $128, %[w]\n\t"
            "dec %[n]\n\t"
            "jnz 1b\n\t"
            : [s0] "+x"(s0), [s1] "+x"(s1), [s2] "+x"(s2), [s3] "+x"(s3), [s4] "+x"(s4),
              [s5] "+x"(s5), [s6] "+x"(s6), [s7] "+x"(s7), [a0] "=&x"(a0), [a1] "=&x"(a1),
              [wv] "=&x"(wv), [t] "=&x"(t), [x0] "+r"(x0), [x1] "+r"(x1), [w] "+r"(w),
              [n] "+r"(nv)
            :
            : "memory", "cc");
    s[0] = s0; s[1] = s1; s[2] = s2; s[3] = s3; s[4] = s4; s[5] = s5; s[6] = s6; s[7] = s7;
}

/* nr unpacked rows (chunk of kc weights from k0) against activation rows m and m + 1 (ma of
 * them), for every flush group of fw weights in the chunk: acc += cvt(int sum) * (d * x scale).
 * acc row mi + i: activation row m + i. The offsets (mins) are gemm_mins'. */
static void gemm_micro(gemm_buf *b, int nr, int ma, int fw, const int16_t *xq, const float *xs,
                       int64_t K, int64_t G, int64_t k0, int64_t kc, int64_t m, int64_t mi) {
    const int nv = fw / 16;
    for (int64_t f = 0; f < kc / fw; f++) {
        __m256i s[2 * NR];
        for (int i = 0; i < 2 * NR; i++)
            s[i] = _mm256_setzero_si256();
        const int16_t *x0 = xq + m * K + k0 + f * fw, *x1 = ma > 1 ? x0 + K : x0;
        const int16_t *w = b->w + (int64_t)f * nv * NR * 16;
        if (nr == NR) {
            micro_4x2(w, x0, x1, nv, s);
        } else { /* the last rows of a thread's share */
            for (int j = 0; j < nv; j++) {
                const __m256i a0 = _mm256_loadu_si256((const __m256i *)(x0 + 16 * j));
                const __m256i a1 = _mm256_loadu_si256((const __m256i *)(x1 + 16 * j));
                for (int r = 0; r < nr; r++) {
                    const __m256i wv = _mm256_loadu_si256(VEC(w + 16 * r, j));
                    s[2 * r] = _mm256_add_epi32(s[2 * r], _mm256_madd_epi16(wv, a0));
                    s[2 * r + 1] = _mm256_add_epi32(s[2 * r + 1], _mm256_madd_epi16(wv, a1));
                }
            }
        }
        const int64_t g = (k0 + f * fw) / 256 * 8; /* the super-block's activation scale */
        /* row_dot's scalar products d * x scale, four weight rows per multiply (the unused lanes
         * of a partial group hold zero or an earlier group's scale: multiplied, never read) */
        float ds[2][NR];
        const __m128 d4 = _mm_loadu_ps(b->d[f]);
        _mm_storeu_ps(ds[0], _mm_mul_ps(d4, _mm_set1_ps(xs[m * G + g])));
        _mm_storeu_ps(ds[1], _mm_mul_ps(d4, _mm_set1_ps(xs[(m + ma - 1) * G + g])));
        for (int i = 0; i < ma; i++)
            for (int r = 0; r < nr; r++) {
                float *a = b->acc[r][mi + i];
                _mm256_storeu_ps(a, _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[2 * r + i]),
                                                    _mm256_broadcast_ss(&ds[i][r]),
                                                    _mm256_loadu_ps(a)));
            }
    }
}

/* Q4_K / Q5_K offsets of the chunk's nsb super-blocks for activation rows [mb, me): off +=
 * mn * (x sums), lane by lane in super-block order, as row_dot's offv. Separate from the flush
 * so that each row's four sums stay in registers across the chunk. */
static void gemm_mins(gemm_buf *b, int nr, int64_t nsb, const float *xsum, int64_t G,
                      int64_t k0, int64_t mb, int64_t me) {
    for (int64_t m = mb; m < me; m++) {
        const float *xm = xsum + m * G + k0 / 32;
        if (nr == NR) {
            __m256 o0 = _mm256_loadu_ps(b->off[0][m - mb]), o1 = _mm256_loadu_ps(b->off[1][m - mb]),
                   o2 = _mm256_loadu_ps(b->off[2][m - mb]), o3 = _mm256_loadu_ps(b->off[3][m - mb]);
            for (int64_t sb = 0; sb < nsb; sb++) {
                const __m256 x = _mm256_loadu_ps(xm + 8 * sb);
                o0 = _mm256_fmadd_ps(_mm256_loadu_ps(b->mn[0][sb]), x, o0);
                o1 = _mm256_fmadd_ps(_mm256_loadu_ps(b->mn[1][sb]), x, o1);
                o2 = _mm256_fmadd_ps(_mm256_loadu_ps(b->mn[2][sb]), x, o2);
                o3 = _mm256_fmadd_ps(_mm256_loadu_ps(b->mn[3][sb]), x, o3);
            }
            _mm256_storeu_ps(b->off[0][m - mb], o0);
            _mm256_storeu_ps(b->off[1][m - mb], o1);
            _mm256_storeu_ps(b->off[2][m - mb], o2);
            _mm256_storeu_ps(b->off[3][m - mb], o3);
        } else {
            for (int r = 0; r < nr; r++) {
                __m256 o = _mm256_loadu_ps(b->off[r][m - mb]);
                for (int64_t sb = 0; sb < nsb; sb++)
                    o = _mm256_fmadd_ps(_mm256_loadu_ps(b->mn[r][sb]),
                                        _mm256_loadu_ps(xm + 8 * sb), o);
                _mm256_storeu_ps(b->off[r][m - mb], o);
            }
        }
    }
}

static int gemm_type(int type) { return type == T_Q4_K || type == T_Q5_K || type == T_Q6_K; }

/* Weight rows [n0, n1) against all M activation rows (int16, quantized): y = dot + bias */
static void gemm_rows(int type, const uint8_t *W, int64_t row_bytes, int64_t n0, int64_t n1,
                      const int16_t *xq, const float *xs, const float *xsum, int64_t M,
                      int64_t K, float *y, int64_t N, const float *bias, gemm_buf *b) {
    const int64_t G = K / 32, bb = tq_block_bytes(type);
    const int q6 = type == T_Q6_K, fw = q6 ? 128 : 256;
    /* a block of activation rows: at most 64, and at most 2 MiB of them. Half of L2 (512 KiB on
     * Zen 3) left only 14 rows of K = 8960 to share each unpacking of the weights, and Q6_K
     * 1536x8960 ran 10-15% slower than with 64 rows read from L3 (one thread) */
    int64_t mbs = 2097152 / (2 * K);
    mbs = mbs < 2 ? 2 : (mbs > GMB ? GMB : mbs & ~(int64_t)1);
    for (int64_t mb = 0; mb < M; mb += mbs) {
        const int64_t me = M < mb + mbs ? M : mb + mbs;
        for (int64_t n = n0; n < n1; n += NR) {
            const int nr = n1 - n < NR ? (int)(n1 - n) : NR;
            for (int r = 0; r < nr; r++) { /* the block's rows only */
                memset(b->acc[r], 0, sizeof b->acc[r][0] * (me - mb));
                memset(b->off[r], 0, sizeof b->off[r][0] * (me - mb));
            }
            for (int64_t k0 = 0; k0 < K; k0 += KC) {
                const int64_t kc = K - k0 < KC ? K - k0 : KC;
                for (int r = 0; r < nr; r++) {
                    const uint8_t *w = W + (n + r) * row_bytes + k0 / 256 * bb;
                    if (q6)
                        unpack_q6k(w, kc / 256, b->w + 16 * r, &b->d[0][r]);
                    else
                        unpack_k4(type == T_Q5_K, w, kc / 256, b->w + 16 * r, &b->d[0][r],
                                  b->mn[r]);
                }
                for (int64_t m = mb; m < me; m += 2)
                    gemm_micro(b, nr, me - m < 2 ? 1 : 2, fw, xq, xs, K, G, k0, kc, m, m - mb);
                if (!q6)
                    gemm_mins(b, nr, kc / 256, xsum, G, k0, mb, me);
            }
            for (int r = 0; r < nr; r++) {
                const float bias_n = bias ? bias[n + r] : 0.f;
                for (int64_t m = mb; m < me; m++) {
                    /* finish_rows' arithmetic, off = 0 */
                    const float out = hsum8(_mm256_add_ps(_mm256_loadu_ps(b->acc[r][m - mb]),
                                                          _mm256_loadu_ps(b->off[r][m - mb]))) + 0.f;
                    y[m * N + n + r] = out + bias_n;
                }
            }
        }
    }
}

int tq_scratch_alloc(tq_scratch *s, int64_t M, int64_t K) {
    s->xq = aligned_alloc(64, ((M * K * 2 + 63) / 64) * 64); /* int16 or int8 */
    s->xs = malloc(sizeof(float) * M * (K / 32));
    s->xsum = malloc(sizeof(float) * M * (K / 32));
    s->bs = malloc(sizeof(int16_t) * M * (K / 16));
    if (!s->xq || !s->xs || !s->xsum || !s->bs) {
        tq_scratch_free(s);
        return -2;
    }
    return 0;
}

void tq_scratch_free(tq_scratch *s) {
    free(s->xq); free(s->xs); free(s->xsum); free(s->bs);
    s->xq = NULL; s->xs = s->xsum = NULL; s->bs = NULL;
}

int tq_matmul_check(int type, int64_t K, int bits) {
    return tq_block_bytes(type) != 0 && K % block_weights(type) == 0 && (bits == 8 || bits == 16);
}

/* Called by every thread of an OpenMP team (inside a parallel region); returns after a barrier,
 * with y complete. s: scratch for M rows of K (tq_scratch_alloc). The caller has checked the
 * arguments with tq_matmul_check. */
void tq_matmul_team(int type, const uint8_t *W, int64_t N, int64_t K, const float *x, int64_t M,
                    float *y, const float *bias, int bits, const tq_scratch *s) {
    const int64_t row_bytes = K / block_weights(type) * tq_block_bytes(type), G = K / 32;
    const int qb = (int)block_weights(type); /* activation scale per weight block */
    void *xq = s->xq;
    float *xs = s->xs, *xsum = s->xsum;
    int16_t *bs = s->bs;
#pragma omp for schedule(static)
    for (int64_t m = 0; m < M; m++) {
        if (bits == 16)
            quantize_row(x + m * K, K, qb, type == T_Q4_K || type == T_Q5_K,
                         (int16_t *)xq + m * K, xs + m * G, xsum + m * G);
        else
            quantize_row8(x + m * K, K, qb, (int8_t *)xq + m * K, xs + m * G, xsum + m * G,
                          bs + m * (K / 16));
    }
    /* implicit barrier. Rows of x in blocks of MB (a prefill chunk has hundreds): each block's
     * activations stay in cache while every weight row passes over them. */
    const int nt = omp_get_num_threads(), it = omp_get_thread_num();
    /* this thread's share of the weight rows, in tiles of <= 32 KiB that stay in cache while
     * every MR-row pass of the block goes over them */
    const int64_t n0 = N * it / nt, n1 = N * (it + 1) / nt;
    if (bits == 16 && M >= gemm_min && gemm_type(type)) {
        gemm_buf *b = aligned_alloc(64, (sizeof(gemm_buf) + 63) / 64 * 64);
        if (b) {
            memset(b->d, 0, sizeof b->d); /* a partial group of rows multiplies unused lanes */
            gemm_rows(type, W, row_bytes, n0, n1, (const int16_t *)xq, xs, xsum, M, K, y, N,
                      bias, b);
            free(b);
#pragma omp barrier
            return;
        }
    }
    const int64_t tile = row_bytes >= TILE ? 1 : TILE / row_bytes;
    for (int64_t mb = 0; mb < M; mb += MB) {
        const int64_t me = M < mb + MB ? M : mb + MB;
        for (int64_t t0 = n0; t0 < n1; t0 += tile) {
            const int64_t t1 = t0 + tile < n1 ? t0 + tile : n1;
            for (int64_t m0 = mb; m0 < me; m0 += MR) {
                const int mr = me - m0 < MR ? (int)(me - m0) : MR;
                if (bits == 16) {
                    acts_t A = {(int16_t *)xq + m0 * K, xs + m0 * G, xsum + m0 * G, K, G};
                    ROW_DOTS[mr](type, W, row_bytes, t0, t1, &A, y + m0 * N, N, bias);
                } else {
                    acts8_t A = {(int8_t *)xq + m0 * K, xs + m0 * G, xsum + m0 * G,
                                 bs + m0 * (K / 16), K, G};
                    ROW_DOTS8[mr](type, W, row_bytes, t0, t1, &A, y + m0 * N, N, bias);
                }
            }
        }
    }
#pragma omp barrier
}

/* y (M, N) = x (M, K) @ W (N, K)^T + bias. W: N rows of row_bytes; bits: 16 or 8, how the
 * activations are quantized. Returns 0, or -1 for an unsupported type, K or bits, -2 when out
 * of memory. */
int tq_matmul(int type, const uint8_t *W, int64_t N, int64_t K, const float *x, int64_t M,
              float *y, const float *bias, int nthreads, int bits) {
    if (!tq_matmul_check(type, K, bits) || M <= 0)
        return -1;
    tq_scratch s;
    if (tq_scratch_alloc(&s, M, K) != 0)
        return -2;
#pragma omp parallel num_threads(nthreads < 1 ? 1 : nthreads)
    tq_matmul_team(type, W, N, K, x, M, y, bias, bits, &s);
    tq_scratch_free(&s);
    return 0;
}

/* ---- dequantization to float32 (prefill expands weights per call; tests) ------------------ */

static void dequant_row(int type, const uint8_t *w, int64_t K, float *y) {
    switch (type) {
    case T_Q4_0:
    case T_Q4_1:
    case T_Q5_0:
    case T_Q5_1: {
        const int hasm = type == T_Q4_1 || type == T_Q5_1, five = type == T_Q5_0 || type == T_Q5_1;
        const int64_t bs = tq_block_bytes(type);
        for (int64_t g = 0; g < K / 32; g++, w += bs, y += 32) {
            const float d = f16(w);
            const float mm = hasm ? f16(w + 2) : (five ? -16.f * d : -8.f * d);
            uint32_t qh = 0;
            if (five)
                memcpy(&qh, w + 2 + 2 * hasm, 4);
            const uint8_t *qs = w + 2 + 2 * hasm + 4 * five;
            for (int j = 0; j < 16; j++) {
                y[j] = d * (float)((qs[j] & 0xF) | (((qh >> j) & 1) << 4)) + mm;
                y[j + 16] = d * (float)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) + mm;
            }
        }
        break;
    }
    case T_Q8_0:
        for (int64_t g = 0; g < K / 32; g++, w += 34, y += 32) {
            const float d = f16(w);
            for (int j = 0; j < 32; j++)
                y[j] = d * (float)(int8_t)w[2 + j];
        }
        break;
    case T_Q4_K:
    case T_Q5_K: {
        const int five = type == T_Q5_K, bs = five ? 176 : 144;
        for (int64_t sb = 0; sb < K / 256; sb++, w += bs) {
            const float d = f16(w), dmin = f16(w + 2);
            const uint8_t *qh = w + 16, *qs = w + (five ? 48 : 16);
            uint8_t sm[16];
            k4_unpack(w + 4, sm);
            for (int c = 0; c < 4; c++, y += 64) {
                const float d0 = d * sm[2 * c], m0 = dmin * sm[8 + 2 * c];
                const float d1 = d * sm[2 * c + 1], m1 = dmin * sm[8 + 2 * c + 1];
                for (int l = 0; l < 32; l++) {
                    const int h0 = five ? ((qh[l] >> (2 * c)) & 1) << 4 : 0;
                    const int h1 = five ? ((qh[l] >> (2 * c + 1)) & 1) << 4 : 0;
                    y[l] = d0 * (float)((qs[32 * c + l] & 0xF) | h0) - m0;
                    y[l + 32] = d1 * (float)((qs[32 * c + l] >> 4) | h1) - m1;
                }
            }
        }
        break;
    }
    case T_Q6_K:
        for (int64_t sb = 0; sb < K / 256; sb++, w += 210) {
            const uint8_t *ql = w, *qh = w + 128;
            const int8_t *sc = (const int8_t *)(w + 192);
            const float d = f16(w + 208);
            for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, y += 128) {
                for (int l = 0; l < 32; l++) {
                    const int is = l / 16;
                    y[l] = d * sc[is] * (float)(((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32);
                    y[l + 32] = d * sc[is + 2] *
                                (float)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                    y[l + 64] = d * sc[is + 4] * (float)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                    y[l + 96] = d * sc[is + 6] *
                                (float)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                }
            }
        }
        break;
    }
}

/* out (N, K) float32 = the weights of rows [0, N) of W. Returns 0, or -1 (type or K). */
int tq_dequantize(int type, const uint8_t *W, int64_t N, int64_t K, float *out, int nthreads) {
    const int64_t bb = tq_block_bytes(type);
    if (bb == 0 || K % block_weights(type) != 0)
        return -1;
    const int64_t row_bytes = K / block_weights(type) * bb;
    if (nthreads < 1)
        nthreads = 1;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t n = 0; n < N; n++)
        dequant_row(type, W + n * row_bytes, K, out + n * K);
    return 0;
}
