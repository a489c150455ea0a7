/* BF16 weights against activations rounded to bf16 (type T_BF16D, "BF16d": the GGUF BF16
 * blocks in place), every row count, decode and prompt chunks alike. Not what BF16 files take
 * by default (rowdotn.c's float32 activations): not faster for prompts on the one CPU measured
 * (bench/results/gguf-types); kernels.matmul("BF16d", ...) reaches it.
 *
 * The numbers are those of AVX512_BF16's vdpbf16ps: per 32 weights (64 bytes), 16 float32
 * lanes, lane j taking the pair (2j, 2j + 1):
 *
 *     acc[j] = FTZ(RNE(acc[j] + w[2j+1] x[2j+1]));  acc[j] = FTZ(RNE(acc[j] + w[2j] x[2j]))
 *
 * with denormal inputs (weights, activations, acc) taken as zero: the odd product first (Intel's
 * pseudocode order), each product exact (a bf16 times a bf16 needs 16 significand bits) and
 * added with one rounding. That is an fma under MXCSR's DAZ and FTZ, which every build runs
 * where it does not run vdpbf16ps itself (the AVX2 build in two 8-lane sets: lanes 0-7, the
 * weights [0, 16) of a 32, then lanes 8-15). Checked on a Sapphire Rapids class Xeon against
 * 42 million random lane steps (normal, denormal and overflowing products and sums): the same
 * bits except the payload of a NaN; tq_bf16_check repeats a smaller such check whenever a
 * build loads, so a CPU whose vdpbf16ps rounds otherwise does not use it. The 16 lanes are
 * then summed as the float types' are (hsum8 of lanes 0-7 + lanes 8-15) and the bias added,
 * all under DAZ / FTZ (bf16_range sets MXCSR on entry and restores it on return): the same
 * bits in every build, at every row count and thread count.
 *
 * The activations are rounded to bf16 to nearest, ties to even (a NaN stays a quiet NaN),
 * once per row (bf16_round_row) and stored as the kernel reads them: the bf16 values where it
 * runs vdpbf16ps (native_rows), else as float32 with the odd and even values of each lane
 * apart. Prompt chunks are cut into blocks of K (tiles_b): the lanes are stored between blocks
 * and loaded back exactly, so the steps, and the bits, are the same. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "blocks.h"

#if TQ_AVX512 && !defined(TQ_SIMDE) && defined(__AVX512BF16__)
#define TQ_BF16 1 /* vdpbf16ps itself */
#else
#define TQ_BF16 0 /* the fma under DAZ / FTZ */
#endif

int tq_bf16_native(void) { return TQ_BF16; }

#define CSR_DAZ_FTZ 0x8040u

/* Products of at most MR rows (decode, verification) run vdpbf16ps where the build has it: a
 * row's chain of dependent steps is then half as long as the fma's. Wider ones (prompt chunks)
 * run the fma form in every build: on a Sapphire Rapids class Xeon its register tiles made
 * ~75 GMAC/s a core against vdpbf16ps' ~59 (a zmm vdpbf16ps issued at half a zmm fma's rate). */
static inline int native_rows(int64_t M) { return TQ_BF16 && M <= MR; }
static inline int64_t xrow_bytes(int64_t K, int64_t M) { return native_rows(M) ? 2 * K : 4 * K; }
int64_t bf16_row_bytes(int64_t K, int64_t M) { return xrow_bytes(K, M); }

static inline uint16_t bf16_rne(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) /* NaN: quiet, never rounded into an infinity */
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1)) >> 16);
}

static inline float bf16_f(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* 8 floats rounded to bf16 (bf16_rne's, lane by lane), as float32 */
static inline __m256 bf16_rne8(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF),
        _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
    const __m256i hi = _mm256_set1_epi32((int)0xFFFF0000u);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                           _mm256_set1_epi32(0x7F800000));
    const __m256i q = _mm256_or_si256(_mm256_and_si256(u, hi), _mm256_set1_epi32(0x00400000));
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_blendv_epi8(r, q, nan), hi));
}

/* shuffle_ps's a0 a1 b0 b1 | a2 a3 b2 b3 (64-bit pairs) as a0 a1 a2 a3 b0 b1 b2 b3 */
static inline __m256 in_order(__m256 v) {
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v), 0xD8));
}

void bf16_round_row(const float *x, int64_t K, int64_t M, void *out) {
    if (native_rows(M)) {
        uint16_t *o = out;
        for (int64_t k = 0; k < K; k++)
            o[k] = bf16_rne(x[k]);
        return;
    }
    /* lane j of 16: the pair (2j, 2j + 1) of each 32 values; AVX-512 a 16-lane register of the
     * odd values then one of the even ones, AVX2 one 8-lane set (j / 8) after the other */
    float *o = out;
    for (int64_t c = 0; c < K; c += 32, o += 32, x += 32) {
        __m256 odd[2], even[2];
        for (int h = 0; h < 2; h++) { /* values [16h, 16h + 16): lanes 8h .. 8h + 7 */
            const __m256 a = bf16_rne8(_mm256_loadu_ps(x + 16 * h));
            const __m256 b = bf16_rne8(_mm256_loadu_ps(x + 16 * h + 8));
            odd[h] = in_order(_mm256_shuffle_ps(a, b, 0xDD)); /* a1 a3 a5 a7 b1 b3 b5 b7 */
            even[h] = in_order(_mm256_shuffle_ps(a, b, 0x88));
        }
        _mm256_storeu_ps(o, odd[0]);
        _mm256_storeu_ps(o + (TQ_AVX512 ? 8 : 16), odd[1]);
        _mm256_storeu_ps(o + (TQ_AVX512 ? 16 : 8), even[0]);
        _mm256_storeu_ps(o + 24, even[1]);
    }
}

#if TQ_AVX512
/* lanes of 32 weights: the odd and even bf16 of each 32-bit lane, as float32 */
static inline __m512 wodd16(__m512i w) {
    return _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32((int)0xFFFF0000u)));
}
static inline __m512 weven16(__m512i w) { return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)); }
#define STEP512(acc, w, xp)                                                                   \
    acc = _mm512_fmadd_ps(weven16(w), _mm512_loadu_ps((const float *)(xp) + 16),              \
                          _mm512_fmadd_ps(wodd16(w), _mm512_loadu_ps(xp), acc))
#if TQ_BF16
#define STEP512_BF16(acc, w, xp)                                                              \
    acc = _mm512_dpbf16_ps(acc, (__m512bh)(w), (__m512bh)_mm512_loadu_si512(xp))
#else
#define STEP512_BF16(acc, w, xp) STEP512(acc, w, xp) /* not reached: native_rows is 0 */
#endif
/* the 16 lanes summed as the float types' (rowdotn.c's hsum16) */
static inline float hsum16b(__m512 a) {
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
    return hsum8(_mm256_add_ps(_mm512_castps512_ps256(a), hi));
}
#else
static inline __m256 wodd8(__m256i w) {
    return _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xFFFF0000u)));
}
static inline __m256 weven8(__m256i w) { return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)); }
#endif

/* One weight row against mr activation rows (x, row stride xs bytes; native: vdpbf16ps on
 * bf16 rows, else the fma on float32 ones): out[m] */
static inline __attribute__((always_inline)) void row_dotb(const uint8_t *w, const uint8_t *x,
                                                           int64_t xs, int64_t K, int mr,
                                                           float *out, const int native) {
#if TQ_AVX512
    __m512 acc[MR];
    for (int m = 0; m < MR; m++)
        acc[m] = _mm512_setzero_ps();
    for (int64_t c = 0; c < K; c += 32) {
        _mm_prefetch((const char *)w + 2 * c + PF_BYTES, _MM_HINT_T0);
        const __m512i wv = _mm512_loadu_si512((const void *)(w + 2 * c));
        for (int m = 0; m < mr; m++)
            if (native)
                STEP512_BF16(acc[m], wv, x + m * xs + 2 * c);
            else
                STEP512(acc[m], wv, x + m * xs + 4 * c);
    }
    for (int m = 0; m < mr; m++)
        out[m] = hsum16b(acc[m]);
#else
    __m256 a0[MR], a1[MR];
    for (int s = 0; s < 2; s++) { /* lanes 0-7, then 8-15 */
        __m256 *a = s ? a1 : a0;
        for (int m = 0; m < MR; m++)
            a[m] = _mm256_setzero_ps();
        for (int64_t c = 0; c < K; c += 32) {
            if (s == 0)
                _mm_prefetch((const char *)w + 2 * c + PF_BYTES, _MM_HINT_T0);
            const __m256i wv = _mm256_loadu_si256((const __m256i *)(w + 2 * c + 32 * s));
            const __m256 wo = wodd8(wv), we = weven8(wv);
            for (int m = 0; m < mr; m++) {
                const float *xp = (const float *)(x + m * xs) + c + 16 * s;
                a[m] = _mm256_fmadd_ps(we, _mm256_loadu_ps(xp + 8),
                                       _mm256_fmadd_ps(wo, _mm256_loadu_ps(xp), a[m]));
            }
        }
    }
    for (int m = 0; m < mr; m++)
        out[m] = hsum8(_mm256_add_ps(a0[m], a1[m]));
#endif
}

/* NWB weight rows (rb bytes apart) against mr <= 2 activation rows (decode): out[i][m], each
 * output by row_dotb's steps (so the same bits). One weight row's chain of dependent steps
 * alone waits on their latency; NWB rows' chains interleaved keep the units busy (rowdotn.c's
 * rows_dotf for F16 / BF16). Prefetched in the loop, a line (32 weights) a row at a time. */
#if TQ_AVX512
#define NWB 8
#else
#define NWB 4
#endif
static inline __attribute__((always_inline)) void rows_dotb(const uint8_t *w, int64_t rb,
                                                            const uint8_t *x, int64_t xs,
                                                            int64_t K, int mr,
                                                            float out[NWB][2], const int native) {
#if TQ_AVX512
    __m512 acc[NWB][2];
    for (int i = 0; i < NWB; i++)
        acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t c = 0; c < K; c += 32)
        for (int i = 0; i < NWB; i++) {
            _mm_prefetch((const char *)w + i * rb + 2 * c + PF_BYTES, _MM_HINT_T0);
            const __m512i wv = _mm512_loadu_si512((const void *)(w + i * rb + 2 * c));
            for (int m = 0; m < mr; m++)
                if (native)
                    STEP512_BF16(acc[i][m], wv, x + m * xs + 2 * c);
                else
                    STEP512(acc[i][m], wv, x + m * xs + 4 * c);
        }
    for (int i = 0; i < NWB; i++)
        for (int m = 0; m < mr; m++)
            out[i][m] = hsum16b(acc[i][m]);
#else
    (void)native;
    __m256 a[2][NWB][2];
    for (int s = 0; s < 2; s++) { /* lanes 0-7, then 8-15 */
        for (int i = 0; i < NWB; i++)
            a[s][i][0] = a[s][i][1] = _mm256_setzero_ps();
        for (int64_t c = 0; c < K; c += 32)
            for (int i = 0; i < NWB; i++) {
                if (s == 0)
                    _mm_prefetch((const char *)w + i * rb + 2 * c + PF_BYTES, _MM_HINT_T0);
                const __m256i wv = _mm256_loadu_si256((const __m256i *)(w + i * rb + 2 * c + 32 * s));
                const __m256 wo = wodd8(wv), we = weven8(wv);
                for (int m = 0; m < mr; m++) {
                    const float *xp = (const float *)(x + m * xs) + c + 16 * s;
                    a[s][i][m] = _mm256_fmadd_ps(we, _mm256_loadu_ps(xp + 8),
                                                 _mm256_fmadd_ps(wo, _mm256_loadu_ps(xp), a[s][i][m]));
                }
            }
    }
    for (int i = 0; i < NWB; i++)
        for (int m = 0; m < mr; m++)
            out[i][m] = hsum8(_mm256_add_ps(a[0][i][m], a[1][i][m]));
#endif
}

/* register tiles of NRB weight rows x MRB activation rows over the values [c0, c1), each
 * output's 16 lanes taking row_dotb's steps; the lanes live in st (NRB x MRB x 16 floats: lanes
 * 0-7 then 8-15) between calls, stored and loaded exactly, so a product may be cut into blocks
 * of K (KBLK values: the activation tile then stays in L1 across the weight tiles) with the
 * same bits */
#if TQ_AVX512
#define NRB 4
#define MRB 5
#else
#define NRB 2
#define MRB 4
#endif
#define KBLK 1024
#define NCH 32 /* weight rows per pass over a block of activation rows (NCH % NRB == 0) */

static inline __attribute__((always_inline)) void tileb(const uint8_t *w, int64_t rb,
                                                        const uint8_t *x, int64_t xs, int64_t c0,
                                                        int64_t c1, float *st) {
#if TQ_AVX512
    __m512 acc[NRB][MRB];
    for (int i = 0; i < NRB; i++)
        for (int m = 0; m < MRB; m++)
            acc[i][m] = _mm512_loadu_ps(st + 16 * (i * MRB + m));
    for (int64_t c = c0; c < c1; c += 32) {
        __m512i wv[NRB];
        for (int i = 0; i < NRB; i++)
            wv[i] = _mm512_loadu_si512((const void *)(w + i * rb + 2 * c));
        for (int m = 0; m < MRB; m++) { /* odd products first, as vdpbf16ps */
            const __m512 xo = _mm512_loadu_ps((const float *)(x + m * xs) + c);
            for (int i = 0; i < NRB; i++)
                acc[i][m] = _mm512_fmadd_ps(wodd16(wv[i]), xo, acc[i][m]);
        }
        for (int m = 0; m < MRB; m++) {
            const __m512 xe = _mm512_loadu_ps((const float *)(x + m * xs) + c + 16);
            for (int i = 0; i < NRB; i++)
                acc[i][m] = _mm512_fmadd_ps(weven16(wv[i]), xe, acc[i][m]);
        }
    }
    for (int i = 0; i < NRB; i++)
        for (int m = 0; m < MRB; m++)
            _mm512_storeu_ps(st + 16 * (i * MRB + m), acc[i][m]);
#else
    for (int s = 0; s < 2; s++) { /* lanes 0-7, then 8-15 */
        __m256 a[NRB][MRB];
        for (int i = 0; i < NRB; i++)
            for (int m = 0; m < MRB; m++)
                a[i][m] = _mm256_loadu_ps(st + 16 * (i * MRB + m) + 8 * s);
        for (int64_t c = c0; c < c1; c += 32) {
            __m256 wo[NRB], we[NRB];
            for (int i = 0; i < NRB; i++) {
                const uint8_t *wp = w + i * rb + 2 * c + 32 * s;
                const __m256i wv = _mm256_loadu_si256((const __m256i *)wp);
                wo[i] = wodd8(wv), we[i] = weven8(wv);
            }
            for (int m = 0; m < MRB; m++) {
                const float *xp = (const float *)(x + m * xs) + c + 16 * s;
                const __m256 xo = _mm256_loadu_ps(xp), xe = _mm256_loadu_ps(xp + 8);
                for (int i = 0; i < NRB; i++)
                    a[i][m] = _mm256_fmadd_ps(we[i], xe, _mm256_fmadd_ps(wo[i], xo, a[i][m]));
            }
        }
        for (int i = 0; i < NRB; i++)
            for (int m = 0; m < MRB; m++)
                _mm256_storeu_ps(st + 16 * (i * MRB + m) + 8 * s, a[i][m]);
    }
#endif
}

/* weight rows [n0, n1) against activation rows [m0, m1) of M one row pass at a time (MR rows) */
static void rows_b(const uint8_t *W, int64_t rb, int64_t n0, int64_t n1, const uint8_t *x,
                   int64_t m0, int64_t m1, int64_t M, int64_t K, float *y, int64_t N,
                   const float *bias) {
    const int64_t xs = xrow_bytes(K, M);
    for (int64_t mp = m0; mp < m1; mp += MR) {
        const int mr = m1 - mp < MR ? (int)(m1 - mp) : MR;
        int64_t n = n0;
        for (; mr <= 2 && n + NWB <= n1; n += NWB) { /* decode: NWB weight rows at a time */
            float o[NWB][2];
            if (native_rows(M))
                rows_dotb(W + n * rb, rb, x + mp * xs, xs, K, mr, o, 1);
            else
                rows_dotb(W + n * rb, rb, x + mp * xs, xs, K, mr, o, 0);
            for (int i = 0; i < NWB; i++)
                for (int m = 0; m < mr; m++)
                    y[(mp + m) * N + n + i] = o[i][m] + (bias ? bias[n + i] : 0.f);
        }
        for (; n < n1; n++) {
            float out[MR];
            if (native_rows(M))
                row_dotb(W + n * rb, x + mp * xs, xs, K, mr, out, 1);
            else
                row_dotb(W + n * rb, x + mp * xs, xs, K, mr, out, 0);
            const float b = bias ? bias[n] : 0.f;
            for (int m = 0; m < mr; m++)
                y[(mp + m) * N + n] = out[m] + b;
        }
    }
}

/* activation rows per block of the tiles: as many as fit ~512 KiB of L2 (a multiple of MRB) */
static int64_t tile_rows(int64_t K) {
    int64_t r = (512 * 1024) / xrow_bytes(K, MR + 1) / MRB * MRB;
    return r < MRB ? MRB : r > 96 ? 96 : r;
}

/* whole tiles: weight rows [n0, n1) (a multiple of NRB) x activation rows [m0, m1) (of MRB) */
static void tiles_b(const uint8_t *W, int64_t rb, int64_t n0, int64_t n1, const uint8_t *x,
                    int64_t m0, int64_t m1, int64_t K, float *y, int64_t N, const float *bias) {
    const int64_t xs = xrow_bytes(K, MR + 1); /* float32 rows */
    float st[NCH / NRB][NRB * MRB * 16];
    for (int64_t nc = n0; nc < n1; nc += NCH) {
        const int64_t ne = n1 < nc + NCH ? n1 : nc + NCH;
        for (int64_t m = m0; m < m1; m += MRB) {
            memset(st, 0, sizeof st);
            for (int64_t c0 = 0; c0 < K; c0 += KBLK)
                for (int64_t n = nc; n < ne; n += NRB)
                    tileb(W + n * rb, rb, x + m * xs, xs, c0, K < c0 + KBLK ? K : c0 + KBLK,
                          st[(n - nc) / NRB]);
            for (int64_t n = nc; n < ne; n += NRB)
                for (int i = 0; i < NRB; i++)
                    for (int j = 0; j < MRB; j++) {
                        const float *l = st[(n - nc) / NRB] + 16 * (i * MRB + j);
                        y[(m + j) * N + n + i] = hsum8(_mm256_add_ps(_mm256_loadu_ps(l),
                                                                     _mm256_loadu_ps(l + 8))) +
                                                 (bias ? bias[n + i] : 0.f);
                    }
        }
    }
}

void bf16_range(const uint8_t *W, int64_t rb, int64_t n0, int64_t n1, const void *xv, int64_t M,
                int64_t K, float *y, int64_t N, const float *bias) {
    const unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | CSR_DAZ_FTZ);
    const uint8_t *x = xv;
    if (M <= MR) { /* decode, verification: each weight row read once */
        rows_b(W, rb, n0, n1, x, 0, M, M, K, y, N, bias);
        _mm_setcsr(csr);
        return;
    }
    const int64_t mbs = tile_rows(K), nfull = n0 + (n1 - n0) / NRB * NRB;
    for (int64_t mb = 0; mb < M; mb += mbs) {
        const int64_t me = M < mb + mbs ? M : mb + mbs, mfull = mb + (me - mb) / MRB * MRB;
        tiles_b(W, rb, n0, nfull, x, mb, mfull, K, y, N, bias);
        /* the edges (rows of either kind short of a tile) row by row: the same bits */
        rows_b(W, rb, n0, nfull, x, mfull, me, M, K, y, N, bias);
        rows_b(W, rb, nfull, n1, x, mb, me, M, K, y, N, bias);
    }
    _mm_setcsr(csr);
}

/* ---- the check at load: this build's step against fmaf under DAZ / FTZ ------------------- */

static uint32_t lcg(uint32_t *s) {
    *s = *s * 1664525u + 1013904223u;
    return *s >> 8;
}

/* a bf16 of every kind: exponents near the denormal and overflow edges as well as normal */
static uint16_t probe_bf16(uint32_t *s) {
    const uint32_t r = lcg(s), kind = r % 4;
    const uint32_t exp = kind == 0 ? r >> 8 & 0xFF : kind == 1 ? (r >> 8) % 40
                         : kind == 2 ? 200 + (r >> 8) % 55 : 100 + (r >> 8) % 40;
    return (uint16_t)((lcg(s) & 0x807F) | (exp << 7));
}

int tq_bf16_check(void) {
    enum { K = 64, M = 2, N = 8, TRIALS = 64 };
    static __thread uint16_t w[N * K];
    static __thread float xf[M * K], y[M * N];
    static __thread uint8_t xr[M * K * 4];
    volatile uint32_t seed0 = 12345u; /* not folded at compile time: fmaf must run under MXCSR */
    uint32_t s = seed0;
    int bad = 0;
    for (int t = 0; t < TRIALS; t++) {
        for (int i = 0; i < N * K; i++)
            w[i] = probe_bf16(&s);
        for (int i = 0; i < M * K; i++)
            xf[i] = bf16_f(probe_bf16(&s));
        for (int m = 0; m < M; m++)
            bf16_round_row(xf + m * K, K, M, xr + m * xrow_bytes(K, M));
        bf16_range((const uint8_t *)w, 2 * K, 0, N, xr, M, K, y, N, NULL);
        const unsigned csr = _mm_getcsr();
        _mm_setcsr(csr | CSR_DAZ_FTZ);
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                float lane[16] = {0};
                for (int c = 0; c < K; c += 32)
                    for (int j = 0; j < 16; j++) {
                        const uint16_t *wr = w + n * K + c;
                        const float *xx = xf + m * K + c;
                        lane[j] = fmaf(bf16_f(wr[2 * j + 1]), xx[2 * j + 1], lane[j]);
                        lane[j] = fmaf(bf16_f(wr[2 * j]), xx[2 * j], lane[j]);
                    }
                __m256 lo = _mm256_loadu_ps(lane), hi = _mm256_loadu_ps(lane + 8);
                const float want = hsum8(_mm256_add_ps(lo, hi)), got = y[m * N + n];
                uint32_t a, b;
                memcpy(&a, &want, 4);
                memcpy(&b, &got, 4);
                bad += a != b && !(want != want && got != got); /* NaN payloads may differ */
            }
        _mm_setcsr(csr);
    }
    return bad;
}
