/* Internal to the kernels (not part of tq.h's interface): the GGUF block layouts, the type ids,
 * and the always-inline helpers that take a block's weights apart, shared by the row-by-row
 * kernels (rowdot16.c, rowdot8.c), the prompt kernel (gemm.c) and dequant.c; the row-loop
 * macros; the functions one kernel file calls in another.
 *
 * The helpers stay static inline here: gcc -mfma contracts a * b + c into an fma across inlined
 * code, so moving one out of line could change the last bits of a result.
 *
 * Matrix products straight on GGUF quantized blocks, for x86-64 with AVX2 + FMA + F16C:
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
 *   Q2_K, Q3_K, IQ4_NL, IQ4_XS, F16, BF16: rowdotn.c's header; IQ1-3_*, TQ*: rowdoti.c's.
 */
#ifndef TQ_BLOCKS_H
#define TQ_BLOCKS_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "iquants.h"
#include "tq.h"

/* The AVX-512 variant (built where the CPU has AVX512F/BW/VL and VNNI; kernels/__init__.py):
 * the same integer sums in 512-bit registers with vpdpwssd. Each 512-bit integer sum holds two
 * 256-bit ones, which are added together before anything is converted to float, so every
 * int32 lane the AVX2 code converts holds the same integer and every result has the same
 * bits. TQ_SIMDE compiles that variant with SIMDe's portable AVX-512 (libsimde-dev), so that
 * an AVX2-only machine can run it, slowly, and test it against the AVX2 variant. */
#if defined(TQ_SIMDE)
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#define TQ_AVX512 1
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    defined(__AVX512VNNI__)
#define TQ_AVX512 1
#else
#define TQ_AVX512 0
#endif

#if TQ_AVX512
/* 32 unsigned bytes -> 32 words (SIMDe 0.7.4 has no _mm512_cvtepu8_epi16) */
static inline __m512i widen_u8(__m256i b) {
#ifdef TQ_SIMDE
    return _mm512_and_si512(_mm512_cvtepi8_epi16(b), _mm512_set1_epi16(0xFF));
#else
    return _mm512_cvtepu8_epi16(b);
#endif
}

/* int32 -> float, lane by lane (SIMDe 0.7.4 has no _mm512_cvtepi32_ps: two 256-bit halves) */
static inline __m512 cvt512_ps(__m512i v) {
#ifdef TQ_SIMDE
    const __m256 lo = _mm256_cvtepi32_ps(_mm512_castsi512_si256(v));
    const __m256 hi = _mm256_cvtepi32_ps(_mm512_extracti64x4_epi64(v, 1));
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)),
                                               _mm256_castps_pd(hi), 1));
#else
    return _mm512_cvtepi32_ps(v);
#endif
}

/* the two 256-bit halves of a 512-bit integer sum, added: the sum the AVX2 code holds */
static inline __m256i fold512(__m512i s) {
    return _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64(s, 1));
}
#endif

#define TQ_HIDDEN __attribute__((visibility("hidden"))) /* shared between the kernel files only */

enum { T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
       T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14,  /* ggml type ids */
       /* read by rowdotn.c's kernels (row by row at every row count) */
       T_F16 = 1, T_Q2_K = 10, T_Q3_K = 11, T_IQ4_NL = 20, T_IQ4_XS = 23, T_BF16 = 30,
       /* Q4_K, Q5_K, Q6_K, Q4_0, Q5_0 (rowdotx.c), Q2_K, Q3_K, IQ4_XS (rowdotxk.c) in 16-row
        * groups, int8 activations only */
       T_Q4_KX = 112, T_Q5_KX = 113, T_Q6_KX = 114, T_Q4_0X = 102, T_Q5_0X = 106,
       T_Q2_KX = 110, T_Q3_KX = 111, T_IQ4_XSX = 123, T_BF16D = 130 /* BF16, bf16 acts */ };
/* rowdotn.c's types: integer (int16 or int8 activations) and float (float32 activations) */
static inline int type_n(int64_t type) {
    return type == T_Q2_K || type == T_Q3_K || type == T_IQ4_NL || type == T_IQ4_XS;
}
static inline int type_f(int64_t type) { return type == T_F16 || type == T_BF16; }
static inline int type_x(int64_t type) {
    return type == T_Q4_KX || type == T_Q5_KX || type == T_Q6_KX || type == T_Q4_0X ||
           type == T_Q5_0X || type == T_Q2_KX || type == T_Q3_KX || type == T_IQ4_XSX;
}

/* The row-by-row loops prefetch the weight bytes PF_BYTES ahead of the row they compute.
 * Decoding streams every weight from memory once, and with the hardware prefetcher alone each
 * thread waited on memory: a decode pass of the default target's layers ran clearly faster
 * with 4 KiB ahead than without, and at least as fast as with 1 or 16 KiB (AVX-512 Xeon,
 * 2 threads, interleaved). Numerics are untouched. */
#ifndef PF_BYTES
#define PF_BYTES 4096
#endif
/* The K-quant kernels prefetch as they go: each super-block's lines PF_BYTES ahead of it. The
 * row loop's burst of a whole row's prefetches at the row's start (79 lines for a K = 8960 row
 * of Q4_K) stalled on the Zen 4: more lines than the core's miss buffers hold, and the loads
 * behind them waited (the rates before and after: bench/results/decode-zen4). Other types'
 * rows (one block of 32 per 18-34 bytes) keep the row loop's prefetch. The int16 kernels
 * prefetch into L2 only (hint T1): a row of their activations takes twice the L1 of an int8
 * one (17.5 KiB at K = 8960), and the streamed weights then no longer evict it. The int8
 * kernels keep T0, which an AVX-512 Xeon's tuning above used. */
#define PF_BLOCK(w, bs, hint)                                                                 \
    for (int pf = 0; pf < (bs); pf += 64)                                                     \
        _mm_prefetch((const char *)(w) + PF_BYTES + pf, hint)
/* int8 activations of a prompt chunk that the prompt kernel takes as bytes (AVX2, Q4_K / Q5_K:
 * gemm.c's byte micro-kernel); every other int8 prompt product widens them to int16 */
#define GEMM_BYTES(T) (!TQ_AVX512 && ((T) == T_Q4_K || (T) == T_Q5_K))
#define PF_IN_KERNEL(T) ((T) == T_Q4_K || (T) == T_Q5_K || (T) == T_Q6_K)
#define MR 10 /* activation rows per pass over a weight row: k = 8 or 9 drafted tokens verify in
                   * one pass (with 8, 9 rows cost an 8-row and a 1-row pass over the weights) */

/* bytes per block of a type id; 0 for one the kernels do not take */
static inline int64_t block_bytes(int type) {
    switch (type) {
    case T_Q4_0: case T_Q4_0X: case T_IQ4_NL: return 18;
    case T_Q4_1: return 20;
    case T_Q5_0: case T_Q5_0X: return 22;
    case T_Q5_1: return 24;
    case T_Q8_0: return 34;
    /* K-quants; their 16-row group types take the bytes per row (a group: 16 rows' bytes) */
    case T_Q4_K: case T_Q4_KX: return 144;
    case T_Q5_K: case T_Q5_KX: return 176;
    case T_Q6_K: case T_Q6_KX: return 210;
    case T_Q2_K: case T_Q2_KX: return 84;
    case T_Q3_K: case T_Q3_KX: return 110;
    case T_IQ4_XS: case T_IQ4_XSX: return 136;
    case T_F16: case T_BF16: case T_BF16D: return 64; /* float types: 32 halves (K % 32 == 0) */
    }
    return iq_block_bytes(type); /* iquants.h's types (rowdoti.c), or 0 */
}

static inline int64_t block_weights(int type) {
    switch (type) {
    case T_Q4_K: case T_Q5_K: case T_Q6_K: case T_Q4_KX: case T_Q5_KX: case T_Q6_KX:
    case T_Q2_K: case T_Q3_K: case T_IQ4_XS: case T_Q2_KX: case T_Q3_KX: case T_IQ4_XSX:
        return 256;
    }
    return type_iq(type) ? 256 : 32;
}

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

/* ---- activations, quantized per block (activations.c) ----------------------------------- */

/* int16 activations (rowdot16.c, gemm.c) */
typedef struct {
    const int16_t *q; /* row m of the activations: q + m * K (for the AVX-512 row-by-row
                       * Q4_K / Q5_K kernel in quantize_row's split 3 order) */
    const float *s, *sum;
    int64_t K, G; /* K and K / 32 */
} acts_t;

/* int8 activations (rowdot8.c) */
typedef struct {
    const int8_t *q;       /* row m: q + m * K */
    const float *s, *sum;  /* per 32-group (qb 16: s[2g + h]): scale; sum of the rounded x */
    const int16_t *bs;     /* per 16-group: sum of q8 (Q6_K's -32) */
    int64_t K, G;          /* G: scales per row, ACT_GROUPS(K, qb) (one per 32, or per 16) */
} acts8_t;
#define ACT_GROUPS(K, qb) ((qb) == 16 ? (K) / 16 : (K) / 32)

/* one activation row of K: int16 (16383 steps per block of qb = 32 or 256; split: the order of
 * the Q4_K / Q5_K kernels) or int8 (127 steps per qb = 16 .. 256 values, and per-16 sums bs) */
TQ_HIDDEN void quantize_row(const float *x, int64_t K, int qb, int split, int16_t *q, float *s,
                            float *sum);
TQ_HIDDEN void quantize_row8(const float *x, int64_t K, int qb, int8_t *q, float *s, float *sum,
                             int16_t *bs, int pairs);
/* the elementwise steps of a decoder layer (n % 8 == 0): out = x / rms(x) * w; out = silu(g) *
 * u; out = a + b (out may be x, g or a) */
TQ_HIDDEN void rms_norm_row(const float *x, const float *w, int64_t n, float eps, float *out);
TQ_HIDDEN void silu_mul_row(const float *g, const float *u, int64_t n, float *out);
TQ_HIDDEN void gelu_mul_row(const float *g, const float *u, int64_t n, float *out);
TQ_HIDDEN void add_row(const float *a, const float *b, int64_t n, float *out);

/* e^x for 8 floats (Cephes' expf: x = n ln2 + r, degree-5 polynomial in r; relative error
 * ~2e-7). Inputs are clamped to [-87.3, 88.3]. */
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654f)), _mm256_set1_ps(88.37626f));
    __m256 fx = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f),
                                                _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx),
                                                         _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* ---- the float step after a run of integer sums (rowdot16.c, rowdot8.c) ----------------- */

/* acc[m] += cvt(isum[m]) * (d * activation scale of the 32-group g); isum[m] = 0 */
#define FLUSH(d, g)                                                                           \
    do {                                                                                      \
        for (int m = 0; m < mr; m++) {                                                        \
            acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[m]),                              \
                                     _mm256_set1_ps((d) * A->s[m * A->G + (g)]), acc[m]);      \
            isum[m] = _mm256_setzero_si256();                                                 \
        }                                                                                     \
    } while (0)

/* ---- weights: what every kernel reads from a block -------------------------------------- */

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

/* ---- rowdotn.c's integer types taken apart (also the prompt kernel's, gemm.c) ----------- */

static const int8_t IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                 1,    13,   25,  38,  53,  69,  89,  113};

/* 16 bytes of IQ4 nibbles -> T[low nibbles], T[high nibbles] as int16 */
static inline __m256i iq4_lo(__m128i tab, __m128i b) {
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(tab, _mm_and_si128(b, _mm_set1_epi8(0x0F))));
}
static inline __m256i iq4_hi(__m128i tab, __m128i b) {
    return _mm256_cvtepi8_epi16(
        _mm_shuffle_epi8(tab, _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F))));
}

/* IQ4_XS: the 6-bit scale of 32-weight block b of the super-block at w (4 bits of scales_l,
 * 2 of scales_h), minus 32 */
static inline int iq4xs_scale(const uint8_t *w, int b) {
    const int sh = w[2] | (w[3] << 8);
    return (((w[4 + b / 2] >> 4 * (b % 2)) & 0xF) | (((sh >> 2 * b) & 3) << 4)) - 32;
}

/* Q3_K's sixteen 6-bit scales (12 bytes) as llama.cpp unpacks them, minus 32 */
static inline void q3k_scales(const uint8_t *s12, int16_t sc[16]) {
    const uint32_t m2 = 0x03030303, m4 = 0x0f0f0f0f;
    uint32_t a[4];
    memcpy(a, s12, 12);
    const uint32_t t = a[2];
    a[2] = ((a[0] >> 4) & m4) | (((t >> 4) & m2) << 4);
    a[3] = ((a[1] >> 4) & m4) | (((t >> 6) & m2) << 4);
    a[0] = (a[0] & m4) | ((t & m2) << 4);
    a[1] = (a[1] & m4) | (((t >> 2) & m2) << 4);
    uint8_t b[16];
    memcpy(b, a, 16);
    for (int i = 0; i < 16; i++)
        sc[i] = (int16_t)(b[i] - 32);
}

/* The head of a Q2_K / Q3_K block at w: its 16 sub-scales (Q3_K's minus 32), Q2_K's mins,
 * the scales d (and dmin); returns the quants */
static inline const uint8_t *k23_head(int type, const uint8_t *w, int16_t sc[16],
                                      int16_t mn[16], float *d, float *dmin) {
    if (type == T_Q3_K) {
        q3k_scales(w + 96, sc);
        *d = f16(w + 108);
        return w + 32;
    }
    for (int i = 0; i < 16; i++) {
        sc[i] = w[i] & 0xF;
        mn[i] = w[i] >> 4;
    }
    *d = f16(w + 80);
    *dmin = f16(w + 82);
    return w + 16;
}

/* A 256-weight block of Q2_K, Q3_K or IQ4_XS at w as v[16] (16 int16 each, the weights'
 * order); *d its scale; Q2_K: mn[i] the mins, *dmin their scale */
static inline __attribute__((always_inline)) void unpack256(int type, const uint8_t *w,
                                                            __m256i v[16], int16_t mn[16],
                                                            float *d, float *dmin) {
    const __m256i m3 = _mm256_set1_epi16(3), one = _mm256_set1_epi16(1);
    if (type == T_IQ4_XS) {
        const __m128i tab = _mm_loadu_si128((const __m128i *)IQ4NL);
        *d = f16(w);
        for (int b = 0; b < 8; b++) {
            const __m256i s = _mm256_set1_epi16((short)iq4xs_scale(w, b));
            const __m128i q = _mm_loadu_si128((const __m128i *)(w + 8 + 16 * b));
            v[2 * b] = _mm256_mullo_epi16(iq4_lo(tab, q), s);
            v[2 * b + 1] = _mm256_mullo_epi16(iq4_hi(tab, q), s);
        }
        return;
    }
    const int three = type == T_Q3_K;
    int16_t sc[16];
    const uint8_t *qs = k23_head(type, w, sc, mn, d, dmin);
    for (int h = 0; h < 2; h++)
        for (int p = 0; p < 2; p++) {
            const __m256i B = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(qs + 32 * h + 16 * p)));
            const __m256i H = three ? _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(w + 16 * p)))
                                    : _mm256_setzero_si256();
            for (int j = 0; j < 4; j++) {
                const int i = 8 * h + 2 * j + p;
                __m256i q = _mm256_and_si256(_mm256_srli_epi16(B, 2 * j), m3);
                if (three) /* q - 4, or q where the high bit is set */
                    q = _mm256_sub_epi16(_mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(
                                                 _mm256_srli_epi16(H, 4 * h + j), one), 2)),
                                         _mm256_set1_epi16(4));
                v[i] = _mm256_mullo_epi16(q, _mm256_set1_epi16(sc[i]));
            }
        }
}

/* int16 activations of row m at offset o (16 values); int8 ones widened */
#define X16(m, o) _mm256_loadu_si256((const __m256i *)(A->q + (m) * A->K + (o)))
#define X8(m, o) _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(A->q + (m) * A->K + (o))))

/* Q2_K: the sum over the 16 sub-blocks of mn[i] times the sum of their 16 activations: from
 * int16 x in their order (mins16), from the int8 sums bs (quantize_row8's) or from int32
 * sums: the same integer */
static inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}
static inline int32_t mins16(const int16_t mn[16], const int16_t *x) {
    __m256i t = _mm256_setzero_si256();
    for (int i = 0; i < 16; i++)
        t = _mm256_add_epi32(t, _mm256_madd_epi16(_mm256_set1_epi16(mn[i]),
                                                  _mm256_loadu_si256((const __m256i *)(x + 16 * i))));
    return hsum_i32(t);
}
static inline int32_t mins8(const int16_t mn[16], const int16_t *bs) {
    return hsum_i32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)mn),
                                      _mm256_loadu_si256((const __m256i *)bs)));
}
static inline int32_t mins32(const int16_t mn[16], const int32_t *s) {
    const __m128i *m = (const __m128i *)mn;
    return hsum_i32(_mm256_add_epi32(
        _mm256_mullo_epi32(_mm256_cvtepi16_epi32(_mm_loadu_si128(m)), _mm256_loadu_si256((const __m256i *)s)),
        _mm256_mullo_epi32(_mm256_cvtepi16_epi32(_mm_loadu_si128(m + 1)),
                           _mm256_loadu_si256((const __m256i *)(s + 8)))));
}

/* ---- the row-by-row kernels: a function per (type, mr) in a table ----------------------- */

/* Weight rows [n0, n1) against mr activation rows: y[m * N + n] = dot + bias[n]. The type and
 * mr are compile-time constants inside each loop (row_dot is always inlined), so the switch and
 * the per-type constants sit outside the row loop: a K = 1536 row is only 6 super-blocks, and
 * per-row set-up cost as much as the products (measured with experiments/kernel_bench.c). */
#define ROW_LOOP(fn, T, mr)                                                                   \
    for (int64_t n = n0; n < n1; n++) {                                                      \
        float out[MR];                                                                        \
        for (int64_t o = n * rb + PF_BYTES;                                                   \
             !PF_IN_KERNEL(T) && o < (n + 1) * rb + PF_BYTES && o < n1 * rb;                  \
             o += 64) /* the bytes PF_BYTES ahead of this row */                              \
            _mm_prefetch((const char *)W + o, _MM_HINT_T0);                                   \
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
/* fn_rows_1 .. fn_rows_10 (MR) and TABLE[mr], the row loops made by ROWS (ROWS_FN: the types
 * above; rowdotn.c has its own) */
#define ROW_DOT_TABLE(fn, acts, TABLE) ROW_DOT_TABLE_OF(ROWS_FN, fn, acts, TABLE)
#define ROW_DOT_TABLE_OF(ROWS, fn, acts, TABLE)                                               \
    ROWS(fn, acts, 1) ROWS(fn, acts, 2) ROWS(fn, acts, 3) ROWS(fn, acts, 4)                   \
    ROWS(fn, acts, 5) ROWS(fn, acts, 6) ROWS(fn, acts, 7) ROWS(fn, acts, 8)                   \
    ROWS(fn, acts, 9) ROWS(fn, acts, 10)                                                      \
    TQ_HIDDEN void (*const TABLE[MR + 1])(int, const uint8_t *, int64_t, int64_t, int64_t,    \
                                          const acts *, float *, int64_t, const float *) = {  \
        0, fn##_rows_1, fn##_rows_2, fn##_rows_3, fn##_rows_4,                                \
        fn##_rows_5, fn##_rows_6, fn##_rows_7, fn##_rows_8, fn##_rows_9, fn##_rows_10}

/* rowdot16.c: int16 activations (acts_t); rowdot8.c: int8 (acts8_t). ROW_DOTS[mr] (mr = 1..MR)
 * runs weight rows [n0, n1) (rb bytes each, from W) against mr activation rows */
extern TQ_HIDDEN void (*const ROW_DOTS[MR + 1])(int, const uint8_t *, int64_t, int64_t, int64_t,
                                                const acts_t *, float *, int64_t, const float *);
extern TQ_HIDDEN void (*const ROW_DOTS8[MR + 1])(int, const uint8_t *, int64_t, int64_t, int64_t,
                                                 const acts8_t *, float *, int64_t, const float *);

/* rowdotn.c: the same for its types (type_n: int16 or int8 activations; type_f: float32
 * activations, rows of K at x) */
typedef struct {
    const float *x; /* row m: x + m * K */
    int64_t K;
} actsf_t;
extern TQ_HIDDEN void (*const ROW_DOTSN[MR + 1])(int, const uint8_t *, int64_t, int64_t, int64_t,
                                                 const acts_t *, float *, int64_t, const float *);
extern TQ_HIDDEN void (*const ROW_DOTSN8[MR + 1])(int, const uint8_t *, int64_t, int64_t, int64_t,
                                                  const acts8_t *, float *, int64_t, const float *);
extern TQ_HIDDEN void (*const ROW_DOTSF[MR + 1])(int, const uint8_t *, int64_t, int64_t, int64_t,
                                                 const actsf_t *, float *, int64_t, const float *);

/* rowdotn.c: F16 / BF16 weight rows [n0, n1) against M float32 activation rows (a prompt
 * chunk), register-tiled: y = dot + bias, the row-by-row kernels' bits */
TQ_HIDDEN void gemmf_range(int type, const uint8_t *W, int64_t rb, int64_t n0, int64_t n1,
                           const float *x, int64_t M, int64_t K, float *y, int64_t N,
                           const float *bias);

/* rowdotx.c: weight rows [n0, n1) of a 16-row group tensor (type_x; multiples of 16) against M
 * int8 activation rows (quantize_row8 per ablock = 64, 128 or 256 values, pairs 0): y = dot +
 * bias, the same bits in every build */
TQ_HIDDEN void x_rows(int type, const uint8_t *W, int64_t rb, int64_t n0, int64_t n1, const acts8_t *A,
                      int64_t M, float *y, int64_t N, const float *bias, int ablock);
/* rowdotxk.c: a Q2_K / Q3_K / IQ4_XS group (w) against activation rows [0, mr): y[m][r] */
TQ_HIDDEN void xk_group(int type, const uint8_t *w, int64_t nsb, const acts8_t *A, int mr,
                        float (*y)[16], int P);

/* ---- the prompt kernel (gemm.c) --------------------------------------------------------- */

static inline int gemm_type(int type) {
    return type == T_Q4_K || type == T_Q5_K || type == T_Q6_K || type == T_Q2_K || type == T_Q3_K ||
           type == T_IQ4_XS || type == T_Q8_0;
}

/* The prompt kernel's buffer (NULL when out of memory; free() it), and weight rows [n0, n1)
 * against all M activation rows with it: y = dot + bias, bit for bit the row-by-row kernels'
 * result. int16 activations: xq, xs, xsum as quantize_row leaves them, bs NULL; int8: as
 * quantize_row8 (pairs 0) leaves them, each row then widened by gemm_widen8 (the row's 2K
 * bytes, its int8 values in the last K). */
TQ_HIDDEN void *gemm_buf_new(void);
TQ_HIDDEN void gemm_range(void *buf, int type, const uint8_t *W, int64_t row_bytes, int64_t n0,
                          int64_t n1, const int16_t *xq, const float *xs, const float *xsum,
                          const int16_t *bs, int64_t M, int64_t K, float *y, int64_t N,
                          const float *bias);
TQ_HIDDEN void gemm_widen8(int16_t *row, int64_t K);
/* the same in the values' own order (the prompt kernel's rowdotn.c types) */
TQ_HIDDEN void gemm_widen8n(int16_t *row, int64_t K);
#endif
