/* The kernels' interface: matrix products straight on GGUF blocks, callable alone (tq_matmul) or
 * inside an OpenMP team (tq_matmul_team, as forward.c does), dequantization, whole decoder
 * layers (tq_forward) and the layout of their structs (tq_layout, checked by the ctypes mirror
 * in __init__.py), plus a lane sum.
 *
 * Files: blocks.h (internal: block layouts and weight unpacking), activations.c (activation
 * rounding), rowdot16.c / rowdot8.c (the row-by-row kernels, int16 / int8 activations),
 * rowdotx.c / rowdotxk.c (int8 Q4_K, Q5_K, Q6_K, Q4_0, Q5_0 / Q2_K, Q3_K, IQ4_XS repacked in
 * 16-row groups: every row count), rowdotn.c (Q2_K, Q3_K,
 * IQ4_NL, IQ4_XS, F16, BF16 at every row count), gemm.c (the prompt kernel),
 * matmul.c (the OpenMP driver), dequant.c, forward.c (decoder layers). */
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

int64_t tq_block_bytes(int type); /* bytes per block of a ggml type id; 0: not taken here */
/* 1 when tq_matmul takes these. bits: the activations' rounding, 16 or 8; ablock: values per
 * activation block, 0 (the weights' block: 256 for K-quants, else 32) or, for int8 products of
 * the 16-row group types (112, 114), 64 or 128: finer steps for an input with outliers */
int tq_matmul_check(int type, int64_t K, int bits, int ablock);
/* vbytes: bytes per activation value, 2 (int16 or int8) or 4 (the float types' float32) */
int tq_scratch_alloc(tq_scratch *s, int64_t M, int64_t K, int vbytes);
void tq_scratch_free(tq_scratch *s);
/* prompt_rows: products of at least this many rows (K-quant weights) take
 * the prompt kernel (gemm.c), fewer the row-by-row kernels; both give the same bits */
int tq_matmul(int type, const uint8_t *W, int64_t N, int64_t K, const float *x, int64_t M,
              float *y, const float *bias, int nthreads, int bits, int ablock, int64_t prompt_rows);
void tq_matmul_team(int type, const uint8_t *W, int64_t N, int64_t K, const float *x, int64_t M,
                    float *y, const float *bias, int bits, int ablock, const tq_scratch *s,
                    int64_t prompt_rows);
/* Q4_K rows (N % 16 == 0) into the 16-row groups of type 112 (rowdotx.c): dst as many bytes;
 * 0, or -1 for N or K that do not fit */
int tq_repack_q4kx(const uint8_t *src, int64_t N, int64_t K, uint8_t *dst);
int tq_repack_q6kx(const uint8_t *src, int64_t N, int64_t K, uint8_t *dst); /* type 114 */
int tq_repack_q5kx(const uint8_t *src, int64_t N, int64_t K, uint8_t *dst); /* type 113 */
/* Q2_K, Q3_K and IQ4_XS rows into the 16-row groups of type 110 / 111 / 123 (rowdotxk.c) */
int tq_repack_q2kx(const uint8_t *src, int64_t N, int64_t K, uint8_t *dst);
int tq_repack_q3kx(const uint8_t *src, int64_t N, int64_t K, uint8_t *dst);
int tq_repack_iq4xsx(const uint8_t *src, int64_t N, int64_t K, uint8_t *dst);
/* Q5_0 (five = 1) or Q4_0 rows into the 16-row groups of type 106 / 102 (K % 32 == 0) */
int tq_repack_q50x(const uint8_t *src, int64_t N, int64_t K, uint8_t *dst, int five);
int tq_dequantize(int type, const uint8_t *W, int64_t N, int64_t K, float *out, int nthreads);

/* ---- whole decoder layers (forward.c); mirrored by _Linear, _Layer, _Model in __init__.py -- */

typedef struct {
    int64_t type, N, K;
    const uint8_t *W;
    const float *bias; /* N values or NULL */
    int64_t bits;      /* how tq_matmul rounds this product's activations: 16 or 8 */
    int64_t ablock;    /* and per how many values: 0, or 64 / 128 (tq_matmul_check) */
} tq_linear;

typedef struct {
    const float *attn_norm, *ffn_norm; /* dim values each */
    const float *q_norm, *k_norm;      /* head_dim values each, or NULL: qwen3's per-head norm */
    /* gemma3's norms of the attention's and the FFN's outputs (dim values each), or NULL */
    const float *post_attn_norm, *post_ffn_norm;
    const float *cos, *sin; /* this layer's rope tables (rope_len, head_dim / 2), NULL: the model's */
    int64_t window;         /* > 0: a row attends to its last `window` positions only */
    tq_linear wq, wk, wv, wo, gate, up, down;
} tq_layer;

typedef struct {
    int64_t n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim, rope_len;
    int64_t rope_interleaved;
    int64_t prompt_rows; /* tq_matmul's, for every product */
    int64_t act;         /* the gated FFN's activation: TQ_PRE_SILU or TQ_PRE_GELU (tanh) */
    float eps;
    float attn_scale;    /* the attention scores' scale */
    const float *cos, *sin; /* (rope_len, head_dim / 2) */
    const tq_layer *layers;
} tq_model;

/* What tq_matmul_team_n does to each activation row before it quantizes it: forward.c's norms,
 * residual additions and silu, done in the products' quantization step instead of a step (and
 * a barrier) of their own. Each thread passes its own (tmp). */
enum { TQ_PRE_NORM = 1, TQ_PRE_SILU = 2, TQ_PRE_GELU = 3 };
typedef struct {
    int kind;        /* TQ_PRE_NORM: rms_norm(x + add) * w; TQ_PRE_SILU: silu(x) * u;
                      * TQ_PRE_GELU: gelu_tanh(x) * u */
    const float *add; /* NORM: the residual branch added to x first (M rows of K), or NULL */
    const float *add_w; /* NORM with add: the branch is itself RMS-normed with these K weights
                         * before the addition (gemma3's post norms), or NULL */
    float *sum;       /* NORM with add: x + add is stored here (M rows of K) */
    const float *w;   /* NORM: the norm's K weights */
    float eps;
    const float *u;   /* SILU: M rows of K */
    float *tmp;       /* 2 K floats of the calling thread's own */
} tq_pre;

/* n <= TQ_MAX_PRODUCTS products of the same activations in one OpenMP team call (matmul.c);
 * pre: NULL, or what each row of x goes through first */
#define TQ_MAX_PRODUCTS 4
void tq_matmul_team_n(int n, const tq_linear *const *l, float *const *y,
                      const tq_scratch *const *s, const float *x, const tq_pre *pre, int64_t M,
                      int64_t prompt_rows);

/* kv_types: how the caches hold a row (float32 unless flagged: IEEE halves) */
#define TQ_K_F16 1
#define TQ_V_F16 2
int tq_forward(const tq_model *md, void *kc, void *vc, int64_t n_slots, int64_t max_len,
               float *x, int64_t M, const int64_t *slots, const int64_t *pos,
               const int64_t *ends, int nthreads, int kv_types,
               const int64_t *cap_layers, int64_t n_cap, float *cap);

/* One entry of tq_layout: a struct ("tq_model": offset 0, its sizeof) or one of its fields
 * ("tq_model.dim": offsetof, sizeof). */
typedef struct {
    const char *name;
    int64_t offset, size;
} tq_field;

const tq_field *tq_layout(void); /* every struct above and its fields; ends with name NULL */
#endif
