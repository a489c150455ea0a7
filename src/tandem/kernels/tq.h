/* What qmatmul.c and forward.c share: matrix products callable inside an OpenMP team, and a
 * lane sum. */
#ifndef TQ_H
#define TQ_H
#include <immintrin.h>
#include <stdint.h>

/* the sum of v's eight lanes (the order every kernel uses, so results do not depend on which) */
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* quantized activations of M rows of K: int16 or int8 values, per-32 scales and float sums,
 * per-16 integer sums (int8 only) */
typedef struct {
    void *xq;
    float *xs, *xsum;
    int16_t *bs;
} tq_scratch;

int64_t tq_block_bytes(int type);
int tq_matmul_check(int type, int64_t K, int bits); /* 1 when tq_matmul takes these */
int64_t tq_set_prompt_rows(int64_t m); /* rows from which K-quant products take the prompt
                                         * path; returns the previous value */
int tq_scratch_alloc(tq_scratch *s, int64_t M, int64_t K);
void tq_scratch_free(tq_scratch *s);
void tq_matmul_team(int type, const uint8_t *W, int64_t N, int64_t K, const float *x, int64_t M,
                    float *y, const float *bias, int bits, const tq_scratch *s);
#endif
