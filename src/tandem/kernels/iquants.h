/* The i-quant and ternary types read by rowdoti.c: their ggml type ids, block bytes (256
 * weights a block) and the two entry points the driver (matmul.c) and dequant.c call.
 * Included by blocks.h (block_bytes, block_weights ask iq_block_bytes). */
#ifndef TQ_IQUANTS_H
#define TQ_IQUANTS_H
#include <stdint.h>

/* ggml type ids (macros, not an enum: compared with blocks.h's without -Wenum-compare) */
#define T_IQ2_XXS 16
#define T_IQ2_XS 17
#define T_IQ3_XXS 18
#define T_IQ1_S 19
#define T_IQ3_S 21
#define T_IQ2_S 22
#define T_IQ1_M 29
#define T_TQ1_0 34
#define T_TQ2_0 35

/* bytes per 256-weight block (ggml-common.h); 0 for another type */
static inline int64_t iq_block_bytes(int64_t type) {
    switch (type) {
    case T_IQ2_XXS: return 66;
    case T_IQ3_XXS: return 98;
    case T_IQ3_S: return 110;
    case T_IQ2_XS: return 74;
    case T_IQ2_S: return 82;
    case T_TQ2_0: return 66;
    case T_TQ1_0: return 54;
    case T_IQ1_S: return 50;
    case T_IQ1_M: return 56;
    }
    return 0;
}
static inline int type_iq(int64_t type) { return iq_block_bytes(type) != 0; }

/* Weight rows [n0, n1) (rb bytes each, from W) against mr <= MR activation rows: int16 ones
 * (bits 16: xq int16_t, quantize_row's) or int8 ones (bits 8: quantize_row8's), K values a
 * row, xs their per-32 scales (K / 32 a row); y[m * N + n] = dot + bias[n]. */
__attribute__((visibility("hidden"))) void iq_rows(int type, int bits, int mr, const uint8_t *W,
                                                   int64_t rb, int64_t n0, int64_t n1,
                                                   const void *xq, const float *xs, int64_t K,
                                                   float *y, int64_t N, const float *bias);
/* one row of K weights as float32, exactly as llama.cpp's dequantize_row_* gives them */
__attribute__((visibility("hidden"))) void dequant_row_iq(int type, const uint8_t *w, int64_t K,
                                                          float *y);
#endif
