/* The OpenMP driver of the matrix products: scratch for the quantized activations, the
 * checks, and the choice between the row-by-row kernels (rowdot16.c, rowdot8.c) and the prompt
 * kernel (gemm.c) for each product: products of at least `prompt_rows` activation rows with
 * K-quant weights take the prompt kernel (int16 or int8 activations). Both give the same bits. */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "blocks.h"

#define MB 64 /* activation rows per block of the loop over weight rows */
#define TILE 32768 /* bytes of weight rows per tile */

int64_t tq_block_bytes(int type) { return block_bytes(type); }

int tq_scratch_alloc(tq_scratch *s, int64_t M, int64_t K, int vbytes) {
    s->xq = aligned_alloc(64, ((M * K * vbytes + 63) / 64) * 64); /* int16, int8 or float */
    s->xs = malloc(sizeof(float) * M * (K / 16)); /* ACT_GROUPS: up to K / 16 per row */
    s->xsum = malloc(sizeof(float) * M * (K / 16));
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

int tq_matmul_check(int type, int64_t K, int bits, int ablock) {
    return block_bytes(type) != 0 && K % block_weights(type) == 0 &&
           (bits == 8 || (bits == 16 && !type_x(type))) &&
           (ablock == 0 || (type_x(type) && block_weights(type) == 256 && bits == 8 &&
                            (ablock == 32 || ablock == 64 || ablock == 128)) ||
            ((type == T_Q4_0X || type == T_Q5_0X) && bits == 8 && ablock == 16));
}

#define GCH 32 /* weight rows per chunk of the prompt kernel's dynamic split */
/* The decode products' dynamic split, guided: each chunk is 1/(DCH_GUIDE * threads) of the
 * weight bytes still left in the call (all its products together), within DCH_MIN..DCH_MAX.
 * Large chunks first keep each thread's stream (and its prefetch, which stops at a chunk's
 * end) running long; small ones at the end leave the threads finishing together at the
 * barrier (with a fixed 1/8 per thread of ~0.5 MB, the thread that finished first waited half
 * a chunk, ~10 us, on average at each of the layer's four products) and let a thread slowed
 * by another process hand its share on. Which thread computes a row never changes its bits. */
#define DCH_MAX 524288
#define DCH_MIN 32768
#define DCH_GUIDE 4

#define DCH_TABLE 1024 /* at most this many decode chunks per call (then larger ones) */

/* weight rows [n0, n1) against every activation row with the row-by-row kernels. Rows of x in
 * blocks of MB (a prefill chunk has hundreds): each block's activations stay in cache while
 * every weight row passes over them, in tiles of <= 32 KiB that stay in cache while every
 * MR-row pass of the block goes over them */
static void row_range(int type, const uint8_t *W, int64_t row_bytes, int64_t n0, int64_t n1,
                      void *xq, float *xs, float *xsum, int16_t *bs, int64_t M, int64_t K,
                      float *y, int64_t N, const float *bias, int bits) {
    const int64_t G = K / 32;
    if (type == T_BF16D) { /* rowdotb.c: bf16 activations, its own row passes and tiles */
        bf16_range(W, row_bytes, n0, n1, xq, M, K, y, N, bias);
        return;
    }
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
                if (type_f(type)) { /* float32 activations, whatever bits says */
                    actsf_t A = {(const float *)xq + m0 * K, K};
                    ROW_DOTSF[mr](type, W, row_bytes, t0, t1, &A, y + m0 * N, N, bias);
                } else if (type_iq(type)) { /* rowdoti.c */
                    iq_rows(type, bits, mr, W, row_bytes, t0, t1,
                            (const char *)xq + m0 * K * (bits / 8), xs + m0 * G, K, y + m0 * N,
                            N, bias);
                } else if (type_n(type) && bits == 16) {
                    acts_t A = {(int16_t *)xq + m0 * K, xs + m0 * G, xsum + m0 * G, K, G};
                    ROW_DOTSN[mr](type, W, row_bytes, t0, t1, &A, y + m0 * N, N, bias);
                } else if (type_n(type)) {
                    acts8_t A = {(int8_t *)xq + m0 * K, xs + m0 * G, xsum + m0 * G,
                                 bs + m0 * (K / 16), K, G};
                    ROW_DOTSN8[mr](type, W, row_bytes, t0, t1, &A, y + m0 * N, N, bias);
                } else if (bits == 16) {
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
                      const tq_scratch *const *s, const float *x, const tq_pre *pre,
                      int64_t M, int64_t prompt_rows) {
    enum { GEMM, DECODE, SHARE, XPROMPT };
    int mode[TQ_MAX_PRODUCTS] = {0};
    int64_t rbs[TQ_MAX_PRODUCTS] = {0}, left = 0; /* row bytes; decode bytes in all */
    /* chunks: product j's are first[j]..first[j + 1] - 1; a decode chunk's first row is
     * start[c - first[j] + dfirst[j]], its end the next one's start or N */
    int64_t first[TQ_MAX_PRODUCTS + 1] = {0}, dfirst[TQ_MAX_PRODUCTS] = {0};
    int64_t start[DCH_TABLE + TQ_MAX_PRODUCTS];
    const int nt = omp_get_num_threads();
    int gemm = 0;
    for (int j = 0; j < n; j++) {
        const int type = (int)l[j]->type;
        rbs[j] = l[j]->K / block_weights(type) * block_bytes(type);
        if (type_x(type) && M > MR) { /* chunks of GCH rows (16-row groups), as free */
            mode[j] = XPROMPT;
        } else if (M >= prompt_rows && (gemm_type(type) || type_f(type) || type == T_BF16D)) {
            /* the prompt kernel: chunks of GCH weight rows handed out as threads come free, so
             * a thread slowed by another process (a shared machine) leaves its work to the
             * others instead of holding up the pass at the barrier */
            mode[j] = GEMM, gemm |= !type_f(type) && type != T_BF16D;
        } else if (M <= MR) { /* decode and verification: the guided split (DCH_*) */
            mode[j] = DECODE, left += l[j]->N * rbs[j];
        } else { /* row-by-row prompt chunks (types without the prompt kernel) */
            mode[j] = SHARE;
        }
    }
    /* every thread computes the same split */
    int64_t nd = 0;
    for (int j = 0; j < n; j++) {
        const int64_t N = l[j]->N;
        int64_t count = mode[j] == GEMM || mode[j] == XPROMPT ? (N + GCH - 1) / GCH : 0;
        dfirst[j] = nd;
        for (int64_t r0 = 0; mode[j] == DECODE && r0 < N; count++) {
            int64_t cb = left / (DCH_GUIDE * nt), rows;
            cb = cb > DCH_MAX ? DCH_MAX : cb < DCH_MIN ? DCH_MIN : cb;
            rows = nd >= DCH_TABLE ? N - r0 : rbs[j] >= cb ? 1 : cb / rbs[j];
            if (type_x(l[j]->type)) /* whole 16-row groups */
                rows = (rows + 15) / 16 * 16;
            rows = rows < N - r0 ? rows : N - r0;
            start[nd++] = r0;
            r0 += rows;
            left -= rows * rbs[j];
        }
        first[j + 1] = first[j] + count;
    }
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n * M; i++) {
        const int j = (int)(i / M);
        const int64_t m = i % M, K = l[j]->K, G = K / 32;
        const int type = (int)l[j]->type;
        const int qb = l[j]->ablock ? (int)l[j]->ablock : (int)block_weights(type);
        const float *in = x + m * K;
        if (pre && (pre->kind == TQ_PRE_SILU || pre->kind == TQ_PRE_GELU)) {
            (pre->kind == TQ_PRE_SILU ? silu_mul_row : gelu_mul_row)(in, pre->u + m * K, K,
                                                                     pre->tmp);
            in = pre->tmp;
        } else if (pre) { /* the norm; x + add stored by the row's first product, which all
                           * compute the same way */
            if (pre->add) {
                float *sum = j == 0 ? pre->sum + m * K : pre->tmp;
                const float *add = pre->add + m * K;
                if (pre->add_w) { /* the branch normed first, in the thread's second K */
                    rms_norm_row(add, pre->add_w, K, pre->eps, pre->tmp + K);
                    add = pre->tmp + K;
                }
                add_row(in, add, K, sum);
                in = sum;
            }
            rms_norm_row(in, pre->w, K, pre->eps, pre->tmp);
            in = pre->tmp;
        }
        if (type == T_BF16D) { /* rounded to bf16, in the layout of this build's kernel */
            bf16_round_row(in, K, M, (char *)s[j]->xq + m * bf16_row_bytes(K, M));
        } else if (type_f(type)) { /* the float types read the activations as they are */
            memcpy((float *)s[j]->xq + m * K, in, sizeof(float) * K);
        } else if (type_x(type)) {
            const int64_t Gx = ACT_GROUPS(K, qb);
            quantize_row8(in, K, qb, (int8_t *)s[j]->xq + m * K, s[j]->xs + m * Gx,
                          s[j]->xsum + m * Gx, s[j]->bs + m * (K / 16), 0);
        } else if (l[j]->bits == 16) { /* split 3: the AVX-512 row-by-row Q4_K/Q5_K kernel's order */
            quantize_row(in, K, qb,
                         type == T_Q4_K || type == T_Q5_K ? (TQ_AVX512 && mode[j] != GEMM ? 3 : 1) : 0,
                         (int16_t *)s[j]->xq + m * K, s[j]->xs + m * G, s[j]->xsum + m * G);
        } else if (mode[j] == GEMM) { /* int8 values, widened to int16 for the prompt kernel
                                       * unless it takes them as bytes (GEMM_BYTES) */
            int16_t *row = (int16_t *)s[j]->xq + m * K;
            quantize_row8(in, K, qb, (int8_t *)row + K, s[j]->xs + m * G,
                          s[j]->xsum + m * G, s[j]->bs + m * (K / 16), 0);
            if (type_n(type))
                gemm_widen8n(row, K);
            else if (!GEMM_BYTES(type))
                gemm_widen8(row, K);
        } else {
            quantize_row8(in, K, qb, (int8_t *)s[j]->xq + m * K, s[j]->xs + m * G,
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
        const int64_t K = L->K, N = L->N, rb = rbs[j], i = c - first[j];
        if (type_x(type)) {
            const int64_t r0 = mode[j] == XPROMPT ? i * GCH : start[dfirst[j] + i];
            const int64_t r1 = mode[j] == XPROMPT ? (N < r0 + GCH ? N : r0 + GCH)
                               : c + 1 < first[j + 1] ? start[dfirst[j] + i + 1] : N;
            const int qb = L->ablock ? (int)L->ablock : (int)block_weights(type);
            const acts8_t A = {(const int8_t *)s[j]->xq, s[j]->xs, s[j]->xsum, s[j]->bs, K,
                               ACT_GROUPS(K, qb)};
            x_rows(type, L->W, rb, r0, r1, &A, M, y[j], N, L->bias, qb);
        } else if (mode[j] == GEMM && type == T_BF16D) {
            const int64_t r0 = i * GCH, r1 = N < r0 + GCH ? N : r0 + GCH;
            bf16_range(L->W, rb, r0, r1, s[j]->xq, M, K, y[j], N, L->bias);
        } else if (mode[j] == GEMM && type_f(type)) {
            const int64_t r0 = i * GCH, r1 = N < r0 + GCH ? N : r0 + GCH;
            gemmf_range(type, L->W, rb, r0, r1, (const float *)s[j]->xq, M, K, y[j], N, L->bias);
        } else if (mode[j] == GEMM) {
            const int64_t r0 = i * GCH, r1 = N < r0 + GCH ? N : r0 + GCH;
            gemm_range(buf, type, L->W, rb, r0, r1, (const int16_t *)s[j]->xq, s[j]->xs,
                       s[j]->xsum, bits == 8 ? s[j]->bs : NULL, M, K, y[j], N, L->bias);
        } else {
            const int64_t r0 = start[dfirst[j] + i];
            const int64_t r1 = c + 1 < first[j + 1] ? start[dfirst[j] + i + 1] : N;
            row_range(type, L->W, rb, r0, r1, s[j]->xq, s[j]->xs, s[j]->xsum, s[j]->bs, M, K,
                      y[j], N, L->bias, bits);
        }
    }
    free(buf);
    /* the row-by-row prompt chunks: this thread's share of the weight rows, whose tiles stay
     * in cache across the activation blocks */
    const int it = omp_get_thread_num();
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
                    float *y, const float *bias, int bits, int ablock, const tq_scratch *s,
                    int64_t prompt_rows) {
    const tq_linear L = {type, N, K, W, bias, bits, ablock};
    const tq_linear *l = &L;
    tq_matmul_team_n(1, &l, &y, &s, x, NULL, M, prompt_rows);
}

/* y (M, N) = x (M, K) @ W (N, K)^T + bias. W: N rows of row_bytes; bits: 16 or 8, how the
 * activations are quantized, ablock per how many values (tq_matmul_check); prompt_rows: see the top of this file. Returns 0, or -1 for an
 * unsupported type, K or bits, -2 when out of memory. */
int tq_matmul(int type, const uint8_t *W, int64_t N, int64_t K, const float *x, int64_t M,
              float *y, const float *bias, int nthreads, int bits, int ablock, int64_t prompt_rows) {
    if (!tq_matmul_check(type, K, bits, ablock) || M <= 0)
        return -1;
    tq_scratch s;
    if (tq_scratch_alloc(&s, M, K, type_f(type) || type == T_BF16D ? 4 : 2) != 0)
        return -2;
#pragma omp parallel num_threads(nthreads < 1 ? 1 : nthreads)
    tq_matmul_team(type, W, N, K, x, M, y, bias, bits, ablock, &s, prompt_rows);
    tq_scratch_free(&s);
    return 0;
}
