/* rowdotb.c: BF16 weights against activations rounded to bf16 (type T_BF16D; blocks.h). */
#ifndef TQ_BF16_H
#define TQ_BF16_H
#include <stdint.h>

#include "blocks.h"

/* one activation row of K (K % 32 == 0) of a product of M rows rounded to bf16 into out, in the
 * layout the kernel reads for M rows (at most 4 K bytes) */
TQ_HIDDEN void bf16_round_row(const float *x, int64_t K, int64_t M, void *out);
/* the bytes of one such row: row m of M starts at m * bf16_row_bytes(K, M) */
TQ_HIDDEN int64_t bf16_row_bytes(int64_t K, int64_t M);
/* weight rows [n0, n1) (rb bytes each) against the M rows bf16_round_row left at x:
 * y[m * N + n] = dot + bias[n], the same bits at every M, split and build */
TQ_HIDDEN void bf16_range(const uint8_t *W, int64_t rb, int64_t n0, int64_t n1, const void *x,
                          int64_t M, int64_t K, float *y, int64_t N, const float *bias);
/* 1 where this build runs vdpbf16ps itself for products of at most MR rows (the avx512bf16
 * build), 0 where it runs only the fma under DAZ / FTZ that gives its bits */
int tq_bf16_native(void);
/* lanes whose bits differ between this build's kernel and fmaf under DAZ / FTZ on probe
 * values (normal, denormal, overflowing); 0 on a CPU whose vdpbf16ps rounds as Intel's */
int tq_bf16_check(void);
#endif
