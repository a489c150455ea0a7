/* The OpenMP driver of the matrix products: scratch for the quantized activations, the
 * checks, and the choice between the row-by-row kernels (rowdot16.c, rowdot8.c) and the prompt
 * kernel (gemm.c) for each product: products of at least `prompt_rows` activation rows with
 * K-quant weights take the prompt kernel (int16 or int8 activations). Both give the same bits. */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "blocks.h"

#define MB 64 /* activation rows per block of the loop over weight rows */
#define TILE 32768 /* bytes of weight rows per tile */

int64_t tq_block_bytes(int type) { return block_bytes(type); }

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
    return block_bytes(type) != 0 && K % block_weights(type) == 0 && (bits == 8 || bits == 16);
}

#define GCH 32 /* weight rows per chunk of the prompt kernel's dynamic split */
/* weight bytes per chunk of the decode products' dynamic split: large chunks keep each thread's
 * stream (and its prefetch, which stops at a chunk's end) running longer, but a product needs
 * several chunks per thread so that one slowed by another process hands its share on */
#define DCH_MAX 524288
#define DCH_MIN 32768
#define DCH_PER_THREAD 8

/* weight rows [n0, n1) against every activation row with the row-by-row kernels. Rows of x in
 * blocks of MB (a prefill chunk has hundreds): each block's activations stay in cache while
 * every weight row passes over them, in tiles of <= 32 KiB that stay in cache while every
 * MR-row pass of the block goes over them */
static void row_range(int type, const uint8_t *W, int64_t row_bytes, int64_t n0, int64_t n1,
                      void *xq, float *xs, float *xsum, int16_t *bs, int64_t M, int64_t K,
                      float *y, int64_t N, const float *bias, int bits) {
    const int64_t G = K / 32;
    /* one pass of at most MR rows (decode, verification) reads each weight row once: no
     * tiles, so the row loop's prefetch runs on across the whole share */
    const int64_t tile = M <= MR ? (n1 > n0 ? n1 - n0 : 1)
                                 : (row_bytes >= TILE ? 1 : TILE / row_bytes);
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
}

/* Called by every thread of an OpenMP team (inside a parallel region); returns after a barrier,
 * with every y[j] complete. n products of the same activations x (M rows; forward.c's q, k, v
 * and gate, up): y[j] (M, l[j]->N) = x @ l[j]->W^T + bias, each with its scratch s[j]
 * (tq_scratch_alloc for M rows of its K). The products share their two barriers (one after the
 * activations are quantized, one at the end) and their work: the chunks of all of them go to
 * whichever thread is free. Each row is computed as by that product alone: same bits. The
 * caller has checked every product with tq_matmul_check. */
void tq_matmul_team_n(int n, const tq_linear *const *l, float *const *y,
                      const tq_scratch *const *s, const float *x, int64_t M,
                      int64_t prompt_rows) {
    enum { GEMM, DECODE, SHARE };
    int mode[TQ_MAX_PRODUCTS] = {0};
    int64_t first[TQ_MAX_PRODUCTS + 1] = {0}, size[TQ_MAX_PRODUCTS] = {0}; /* chunks: j from first[j] */
    first[0] = 0;
    int gemm = 0;
    for (int j = 0; j < n; j++) {
        const int type = (int)l[j]->type, bits = (int)l[j]->bits;
        const int64_t rb = l[j]->K / block_weights(type) * block_bytes(type), N = l[j]->N;
        if (M >= prompt_rows && gemm_type(type)) {
            /* the prompt kernel: chunks of GCH weight rows handed out as threads come free, so
             * a thread slowed by another process (a shared machine) leaves its work to the
             * others instead of holding up the pass at the barrier */
            mode[j] = GEMM, size[j] = GCH, gemm = 1;
        } else if (M <= MR) {
            /* decode and verification: chunks of N * rb / (DCH_PER_THREAD * threads) bytes
             * of weight rows (DCH_MIN..DCH_MAX), handed out in the same way; a chunk is rows
             * n0..n1 of the row-by-row kernel */
            int64_t cb = N * rb / (DCH_PER_THREAD * omp_get_num_threads());
            cb = cb > DCH_MAX ? DCH_MAX : cb < DCH_MIN ? DCH_MIN : cb;
            mode[j] = DECODE, size[j] = rb >= cb ? 1 : cb / rb;
        } else { /* row-by-row prompt chunks (types without the prompt kernel) */
            mode[j] = SHARE, size[j] = N;
        }
        first[j + 1] = first[j] + (mode[j] == SHARE ? 0 : (N + size[j] - 1) / size[j]);
    }
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n * M; i++) {
        const int j = (int)(i / M);
        const int64_t m = i % M, K = l[j]->K, G = K / 32;
        const int type = (int)l[j]->type, qb = (int)block_weights(type);
        if (l[j]->bits == 16) { /* split 2: the AVX-512 row-by-row Q4_K/Q5_K kernel's byte planes */
            quantize_row(x + m * K, K, qb,
                         type == T_Q4_K || type == T_Q5_K ? 1 + (TQ_AVX512 && mode[j] != GEMM) : 0,
                         (int16_t *)s[j]->xq + m * K, s[j]->xs + m * G, s[j]->xsum + m * G);
        } else if (mode[j] == GEMM) { /* int8 values, widened to int16 for the prompt kernel */
            int16_t *row = (int16_t *)s[j]->xq + m * K;
            quantize_row8(x + m * K, K, qb, (int8_t *)row + K, s[j]->xs + m * G,
                          s[j]->xsum + m * G, s[j]->bs + m * (K / 16), 0);
            gemm_widen8(row, K);
        } else {
            quantize_row8(x + m * K, K, qb, (int8_t *)s[j]->xq + m * K, s[j]->xs + m * G,
                          s[j]->xsum + m * G, s[j]->bs + m * (K / 16),
                          TQ_AVX512 && (type == T_Q4_K || type == T_Q5_K));
        }
    }
    /* implicit barrier */
    /* the prompt kernel's buffer (where it cannot be allocated, gemm_range uses one on the
     * thread's stack) */
    void *buf = gemm ? gemm_buf_new() : NULL;
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t c = 0; c < first[n]; c++) {
        int j = 0;
        while (c >= first[j + 1])
            j++;
        const tq_linear *L = l[j];
        const int type = (int)L->type, bits = (int)L->bits;
        const int64_t K = L->K, N = L->N, rb = K / block_weights(type) * block_bytes(type);
        const int64_t r0 = (c - first[j]) * size[j], r1 = N < r0 + size[j] ? N : r0 + size[j];
        if (mode[j] == GEMM)
            gemm_range(buf, type, L->W, rb, r0, r1, (const int16_t *)s[j]->xq, s[j]->xs,
                       s[j]->xsum, bits == 8 ? s[j]->bs : NULL, M, K, y[j], N, L->bias);
        else
            row_range(type, L->W, rb, r0, r1, s[j]->xq, s[j]->xs, s[j]->xsum, s[j]->bs, M, K,
                      y[j], N, L->bias, bits);
    }
    free(buf);
    /* the row-by-row prompt chunks: this thread's share of the weight rows, whose tiles stay
     * in cache across the activation blocks */
    const int nt = omp_get_num_threads(), it = omp_get_thread_num();
    for (int j = 0; j < n; j++)
        if (mode[j] == SHARE) {
            const tq_linear *L = l[j];
            const int type = (int)L->type;
            const int64_t K = L->K, N = L->N, rb = K / block_weights(type) * block_bytes(type);
            row_range(type, L->W, rb, N * it / nt, N * (it + 1) / nt, s[j]->xq, s[j]->xs,
                      s[j]->xsum, s[j]->bs, M, K, y[j], N, L->bias, (int)L->bits);
        }
#pragma omp barrier
}

/* One product (see tq_matmul_team_n). */
void tq_matmul_team(int type, const uint8_t *W, int64_t N, int64_t K, const float *x, int64_t M,
                    float *y, const float *bias, int bits, const tq_scratch *s,
                    int64_t prompt_rows) {
    const tq_linear L = {type, N, K, W, bias, bits};
    const tq_linear *l = &L;
    tq_matmul_team_n(1, &l, &y, &s, x, M, prompt_rows);
}

/* y (M, N) = x (M, K) @ W (N, K)^T + bias. W: N rows of row_bytes; bits: 16 or 8, how the
 * activations are quantized; prompt_rows: see the top of this file. Returns 0, or -1 for an
 * unsupported type, K or bits, -2 when out of memory. */
int tq_matmul(int type, const uint8_t *W, int64_t N, int64_t K, const float *x, int64_t M,
              float *y, const float *bias, int nthreads, int bits, int64_t prompt_rows) {
    if (!tq_matmul_check(type, K, bits) || M <= 0)
        return -1;
    tq_scratch s;
    if (tq_scratch_alloc(&s, M, K) != 0)
        return -2;
#pragma omp parallel num_threads(nthreads < 1 ? 1 : nthreads)
    tq_matmul_team(type, W, N, K, x, M, y, bias, bits, &s, prompt_rows);
    tq_scratch_free(&s);
    return 0;
}
