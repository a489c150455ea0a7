/* The decoder layers of the llama/qwen2 family for a few rows at a time (decode, verification,
 * short prompt chunks), in one OpenMP region: the float32 twin of decoder.py's Block.forward
 * for models whose linear weights are all GGUF blocks that the kernels (matmul.c) read in
 * place.
 *
 * One Python call runs every layer: in Python each layer was ~60 small torch operations and
 * 7 kernel calls, whose overhead rivalled the products on 2 cores; here the threads stay
 * in one team and meet at barriers. A layer has nine steps, each ending at one: q/k/v's
 * quantization (with the residual addition and the attention norm before it), their products,
 * attention (with rope and the cache write where each row has a slot of its own), o's
 * quantization and product, gate/up's quantization (residual addition, ffn norm) and products,
 * down's quantization (silu) and product. The norms, additions and silu run in the products'
 * quantization step (tq_pre), each row by whichever thread quantizes it for a product (a norm
 * once per product of q, k, v: cheaper than a barrier at one row), so decoding waits at 9
 * barriers a layer instead of 14 (verification rows of one slot: 10, rope a step of its own).
 *
 * Row m of x is the token at position pos[m] of cache slot slots[m]. Its keys and values are
 * written there and it attends to positions 0..pos[m] of that slot, so several rows of one slot
 * (verification) see each other causally. Every row is computed by the same sequence of
 * operations whatever the other rows, M or the thread count (the matrix products are
 * batch-invariant, and norms, rope and attention are per row), so verifying k drafted tokens
 * gives bit for bit the hidden states that decoding them one at a time would.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "blocks.h"

/* the structs of tq.h as the compiler lays them out, for the ctypes mirror to check at load */
#define STRUCT(s) {#s, 0, sizeof(s)}
#define FIELD(s, f) {#s "." #f, offsetof(s, f), sizeof(((s *)0)->f)}
static const tq_field layout[] = {
    STRUCT(tq_linear), FIELD(tq_linear, type), FIELD(tq_linear, N), FIELD(tq_linear, K),
    FIELD(tq_linear, W), FIELD(tq_linear, bias), FIELD(tq_linear, bits), FIELD(tq_linear, ablock),
    STRUCT(tq_layer), FIELD(tq_layer, attn_norm), FIELD(tq_layer, ffn_norm),
    FIELD(tq_layer, q_norm), FIELD(tq_layer, k_norm), FIELD(tq_layer, post_attn_norm),
    FIELD(tq_layer, post_ffn_norm), FIELD(tq_layer, cos), FIELD(tq_layer, sin),
    FIELD(tq_layer, window),
    FIELD(tq_layer, wq), FIELD(tq_layer, wk), FIELD(tq_layer, wv), FIELD(tq_layer, wo),
    FIELD(tq_layer, gate), FIELD(tq_layer, up), FIELD(tq_layer, down),
    STRUCT(tq_model), FIELD(tq_model, n_layers), FIELD(tq_model, dim), FIELD(tq_model, n_heads),
    FIELD(tq_model, n_kv_heads), FIELD(tq_model, head_dim), FIELD(tq_model, ffn_dim),
    FIELD(tq_model, rope_len), FIELD(tq_model, rope_interleaved),
    FIELD(tq_model, prompt_rows), FIELD(tq_model, act), FIELD(tq_model, eps),
    FIELD(tq_model, attn_scale), FIELD(tq_model, cos),
    FIELD(tq_model, sin), FIELD(tq_model, layers),
    {NULL, 0, 0}};

const tq_field *tq_layout(void) { return layout; }

/* rotate each head of x (n_heads x hd) at one position: neox rotates the two halves,
 * interleaved (GPT-J) adjacent pairs */
static void rope(float *x, int64_t n_heads, int64_t hd, const float *c, const float *s, int inter) {
    const int64_t half = hd / 2;
    for (int64_t h = 0; h < n_heads; h++, x += hd) {
        for (int64_t i = 0; i < half; i++) {
            float *p = inter ? x + 2 * i : x + i, *q = inter ? x + 2 * i + 1 : x + i + half;
            const float a = *p, b = *q;
            *p = a * c[i] - b * s[i];
            *q = a * s[i] + b * c[i];
        }
    }
}

/* qwen3: each of n heads (hd values) of x RMS-normed with the head weights w, in place; before
 * rope, per row, so batch-invariant like the rest */
static void head_norm(float *x, int64_t n, int64_t hd, const float *w, float eps) {
    if (w)
        for (int64_t h = 0; h < n; h++, x += hd)
            rms_norm_row(x, w, hd, eps, x);
}

/* the four sums of a, b, c, d's lanes: [sum a, sum b, sum c, sum d] */
static inline __m128 hsum4x8(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    const __m256 t = _mm256_hadd_ps(ab, cd); /* per lane: a0+a1, b0+b1, c0+c1, d0+d1 */
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

#define KEY_BLOCK 64 /* keys whose K or V rows stay in L1 while every head of the group uses them */

/* The cache rows of a long context do not stay in L3 between tokens (28 layers of 2000
 * positions: 115 MB in float32), and each block of keys is read from memory once, by the first
 * heads' pass over it; the other heads' passes read it from L1. Left to the hardware, one
 * thread read them at a fraction of the memory's bandwidth (bench/results/decode-zen4). So the
 * next block's lines are prefetched spread over all the
 * passes over this one, the way the weight kernels' PF_BLOCK keeps one steady stream: `lines`
 * lines from p, in `iters` steps. */
typedef struct {
    const char *p;
    int64_t lines, iters, acc;
} spread_t;

static inline spread_t spread(const char *from, int64_t rows, int64_t row_bytes, int64_t iters) {
    return (spread_t){from, rows > 0 ? rows * row_bytes / 64 : 0, iters, 0};
}

static inline void spread_step(spread_t *f) { /* lines / iters lines a step, evenly */
    for (f->acc += f->lines; f->acc >= f->iters && f->iters > 0; f->acc -= f->iters) {
        _mm_prefetch(f->p, _MM_HINT_T0);
        f->p += 64;
    }
}

/* The cache holds each key (value) row as hd float32, or as hd IEEE halves (--cache-type-k /
 * --cache-type-v f16, the default: half the bytes every token reads). A half is widened to
 * float32 exactly (vcvtph2ps), so attention computes in float32 either way; what a row holds
 * is its float32 key rounded to the nearest half (vcvtps2ph, round to nearest even, as
 * PyTorch's .half() rounds). h: 1 for halves. */
static inline __m256 ld8(const char *row, int64_t i, int h) {
    return h ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 2 * i)))
             : _mm256_loadu_ps((const float *)row + i);
}

static inline void put_row(char *dst, const float *src, int64_t hd, int h) {
    if (!h) {
        memcpy(dst, src, sizeof(float) * hd);
        return;
    }
    for (int64_t i = 0; i < hd; i += 8)
        _mm_storeu_si128((__m128i *)(dst + 2 * i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
}

/* Attention of the G query heads that share one key/value head, for one row: o + g * hd =
 * softmax(q_g . K[0..n) * scale) V[0..n) for g < G (q_g = q + g * hd). sc: G * (n + 8) floats of
 * scratch. Keys are taken in blocks of KEY_BLOCK for all heads at once, so K and V are read from
 * memory once per row instead of once per head, and two heads at a time, so each key or value
 * vector loaded serves two. Each score is q_g . k_t summed over 8 lanes in dimension order, the
 * lanes added by hsum4x8; each output element sums its terms in key order t = 0, 1, ..., n - 1 in
 * one float32 accumulator: whichever heads share a pass, the sequence of operations of every
 * result depends only on n, and a row gets the same bits in any batch. */
static inline __attribute__((always_inline)) void
attend_t(const float *q, int64_t G, const char *K, const char *V, int64_t n, int64_t hd,
         float scale, float *sc, float *o, const int kh, const int vh) {
    const int64_t ld = n + 8, kb = hd * (kh ? 2 : 4), vb = hd * (vh ? 2 : 4); /* row bytes */
    const __m128 vscale = _mm_set1_ps(scale);
    const int64_t pairs = (G + 1) / 2;
    for (int64_t b0 = 0; b0 < n; b0 += KEY_BLOCK) {
        const int64_t b1 = b0 + KEY_BLOCK < n ? b0 + KEY_BLOCK : n;
        /* next: the next block of keys, or after the last one the first block of values */
        const int64_t nb = b1 + KEY_BLOCK < n ? KEY_BLOCK : n - b1;
        spread_t f = b1 < n ? spread(K + b1 * kb, nb, kb, pairs * ((b1 - b0) / 4))
                            : spread(V, n < KEY_BLOCK ? n : KEY_BLOCK, vb, pairs * ((b1 - b0) / 4));
        for (int64_t g = 0; g < G; g += 2) {
            const int two = g + 1 < G; /* heads g and g + 1, or g alone */
            const float *qa = q + g * hd, *qb = two ? qa + hd : qa;
            float *sa = sc + g * ld, *sb = sa + ld;
            int64_t t = b0;
            for (; t + 4 <= b1; t += 4) { /* four keys per pass over q */
                const char *k0 = K + t * kb;
                spread_step(&f);
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                __m256 c0 = a0, c1 = a0, c2 = a0, c3 = a0;
                for (int64_t i = 0; i < hd; i += 8) {
                    const __m256 qv = _mm256_loadu_ps(qa + i), qw = _mm256_loadu_ps(qb + i);
                    const __m256 k0v = ld8(k0, i, kh), k1v = ld8(k0 + kb, i, kh);
                    const __m256 k2v = ld8(k0 + 2 * kb, i, kh);
                    const __m256 k3v = ld8(k0 + 3 * kb, i, kh);
                    a0 = _mm256_fmadd_ps(qv, k0v, a0);
                    a1 = _mm256_fmadd_ps(qv, k1v, a1);
                    a2 = _mm256_fmadd_ps(qv, k2v, a2);
                    a3 = _mm256_fmadd_ps(qv, k3v, a3);
                    c0 = _mm256_fmadd_ps(qw, k0v, c0);
                    c1 = _mm256_fmadd_ps(qw, k1v, c1);
                    c2 = _mm256_fmadd_ps(qw, k2v, c2);
                    c3 = _mm256_fmadd_ps(qw, k3v, c3);
                }
                _mm_storeu_ps(sa + t, _mm_mul_ps(hsum4x8(a0, a1, a2, a3), vscale));
                if (two)
                    _mm_storeu_ps(sb + t, _mm_mul_ps(hsum4x8(c0, c1, c2, c3), vscale));
            }
            for (; t < b1; t++)
                for (int h = 0; h <= two; h++) {
                    const float *qg = qa + h * hd;
                    __m256 a0 = _mm256_setzero_ps();
                    for (int64_t i = 0; i < hd; i += 8)
                        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qg + i), ld8(K + t * kb, i, kh), a0);
                    sa[h * ld + t] = hsum8(a0) * scale;
                }
        }
    }
    for (int64_t g = 0; g < G; g++) { /* softmax numerators in place; 1 / sum kept at sg[n] */
        float *sg = sc + g * ld, mx = -INFINITY;
        for (int64_t t = 0; t < n; t++)
            mx = sg[t] > mx ? sg[t] : mx;
        const __m256 vmx = _mm256_set1_ps(mx);
        __m256 vs = _mm256_setzero_ps();
        int64_t t = 0;
        for (; t + 8 <= n; t += 8) {
            const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sg + t), vmx));
            _mm256_storeu_ps(sg + t, e);
            vs = _mm256_add_ps(vs, e);
        }
        float sum = hsum8(vs);
        for (; t < n; t++) {
            sg[t] = expf(sg[t] - mx);
            sum += sg[t];
        }
        sg[n] = 1.f / sum;
        memset(o + g * hd, 0, sizeof(float) * hd);
    }
    for (int64_t b0 = 0; b0 < n; b0 += KEY_BLOCK) {
        const int64_t b1 = b0 + KEY_BLOCK < n ? b0 + KEY_BLOCK : n;
        const int64_t nb = b1 + KEY_BLOCK < n ? KEY_BLOCK : n - b1;
        spread_t f = spread(V + b1 * vb, nb, vb, pairs * (hd / 32) * (b1 - b0));
        for (int64_t g = 0; g < G; g += 2) {
            const int two = g + 1 < G;
            const float *sa = sc + g * ld, *sb = two ? sa + ld : sa;
            float *oa = o + g * hd, *ob = oa + hd;
            int64_t d = 0;
            for (; d + 32 <= hd; d += 32) { /* 32 outputs of each head in registers */
                __m256 a0 = _mm256_loadu_ps(oa + d), a1 = _mm256_loadu_ps(oa + d + 8);
                __m256 a2 = _mm256_loadu_ps(oa + d + 16), a3 = _mm256_loadu_ps(oa + d + 24);
                __m256 c0 = a0, c1 = a1, c2 = a2, c3 = a3;
                if (two) {
                    c0 = _mm256_loadu_ps(ob + d), c1 = _mm256_loadu_ps(ob + d + 8);
                    c2 = _mm256_loadu_ps(ob + d + 16), c3 = _mm256_loadu_ps(ob + d + 24);
                }
                const char *v = V + b0 * vb;
                for (int64_t t = b0; t < b1; t++, v += vb) {
                    spread_step(&f);
                    const __m256 pa = _mm256_broadcast_ss(sa + t), pb = _mm256_broadcast_ss(sb + t);
                    const __m256 v0 = ld8(v, d, vh), v1 = ld8(v, d + 8, vh);
                    const __m256 v2 = ld8(v, d + 16, vh), v3 = ld8(v, d + 24, vh);
                    a0 = _mm256_fmadd_ps(pa, v0, a0);
                    a1 = _mm256_fmadd_ps(pa, v1, a1);
                    a2 = _mm256_fmadd_ps(pa, v2, a2);
                    a3 = _mm256_fmadd_ps(pa, v3, a3);
                    c0 = _mm256_fmadd_ps(pb, v0, c0);
                    c1 = _mm256_fmadd_ps(pb, v1, c1);
                    c2 = _mm256_fmadd_ps(pb, v2, c2);
                    c3 = _mm256_fmadd_ps(pb, v3, c3);
                }
                _mm256_storeu_ps(oa + d, a0);
                _mm256_storeu_ps(oa + d + 8, a1);
                _mm256_storeu_ps(oa + d + 16, a2);
                _mm256_storeu_ps(oa + d + 24, a3);
                if (two) {
                    _mm256_storeu_ps(ob + d, c0);
                    _mm256_storeu_ps(ob + d + 8, c1);
                    _mm256_storeu_ps(ob + d + 16, c2);
                    _mm256_storeu_ps(ob + d + 24, c3);
                }
            }
            for (; d < hd; d += 8)
                for (int h = 0; h <= two; h++) {
                    const float *sg = sa + h * ld;
                    float *og = oa + h * hd;
                    __m256 acc = _mm256_loadu_ps(og + d);
                    for (int64_t t = b0; t < b1; t++)
                        acc = _mm256_fmadd_ps(_mm256_broadcast_ss(sg + t), ld8(V + t * vb, d, vh), acc);
                    _mm256_storeu_ps(og + d, acc);
                }
        }
    }
    for (int64_t g = 0; g < G; g++) {
        const __m256 inv = _mm256_set1_ps(sc[g * ld + n]);
        for (int64_t d = 0; d < hd; d += 8)
            _mm256_storeu_ps(o + g * hd + d, _mm256_mul_ps(_mm256_loadu_ps(o + g * hd + d), inv));
    }
}

/* attend_t for the cache's row types (kt: bit 0 keys in halves, bit 1 values) */
static void attend(const float *q, int64_t G, const char *K, const char *V, int64_t n,
                   int64_t hd, float scale, float *sc, float *o, int kt) {
    switch (kt & 3) {
    case 0: attend_t(q, G, K, V, n, hd, scale, sc, o, 0, 0); break;
    case 1: attend_t(q, G, K, V, n, hd, scale, sc, o, 1, 0); break;
    case 2: attend_t(q, G, K, V, n, hd, scale, sc, o, 0, 1); break;
    default: attend_t(q, G, K, V, n, hd, scale, sc, o, 1, 1); break;
    }
}

static int linear_ok(const tq_linear *l, int64_t N, int64_t K) {
    return l->W && l->N == N && l->K == K && tq_matmul_check((int)l->type, K, (int)l->bits,
                                                                     (int)l->ablock);
}


/* Run every layer on x (M, dim), in place. kc, vc: the caches, (n_layers, n_slots, n_kv_heads,
 * max_len, head_dim), float32 or IEEE half (kv_types: TQ_K_F16 | TQ_V_F16). ends: NULL, or per
 * row the position its attention stops before (pos[m] + 1 is causal; an image's rows all see
 * the whole image: the rows up to ends[m] - 1 of its slot must be in this call or the cache).
 * cap: NULL, or (M, n_cap * dim): row m's input to layer cap_layers[c] copied at
 * cap + (m * n_cap + c) * dim, for an EAGLE-3 head (ids outside 0 .. n_layers - 1 are left
 * to the caller: the final output is x itself).
 * Returns 0; -1 for a shape the model or the kernels do not take or a position outside the
 * cache or the rope table; -2 when out of memory. */
int tq_forward(const tq_model *md, void *kc, void *vc, int64_t n_slots, int64_t max_len,
               float *x, int64_t M, const int64_t *slots, const int64_t *pos,
               const int64_t *ends, int nthreads, int kv_types,
               const int64_t *cap_layers, int64_t n_cap, float *cap) {
    const int64_t D = md->dim, H = md->n_heads, Hkv = md->n_kv_heads, hd = md->head_dim;
    const int64_t F = md->ffn_dim, QD = H * hd, KD = Hkv * hd;
    if (M <= 0 || D % 32 || hd % 8 || H % Hkv || (md->act != TQ_PRE_SILU && md->act != TQ_PRE_GELU))
        return -1;
    for (int64_t m = 0; m < M; m++)
        if (slots[m] < 0 || slots[m] >= n_slots || pos[m] < 0 || pos[m] >= max_len ||
            pos[m] >= md->rope_len || (ends && (ends[m] <= pos[m] || ends[m] > max_len)))
            return -1;
    for (int64_t l = 0; l < md->n_layers; l++) {
        const tq_layer *L = md->layers + l;
        if (!linear_ok(&L->wq, QD, D) || !linear_ok(&L->wk, KD, D) ||
            !linear_ok(&L->wv, KD, D) || !linear_ok(&L->wo, D, QD) ||
            !linear_ok(&L->gate, F, D) || !linear_ok(&L->up, F, D) ||
            !linear_ok(&L->down, D, F))
            return -1;
    }
    int64_t kmax = D > QD ? D : QD;
    kmax = kmax > F ? kmax : F;
    int vbytes = 2; /* the scratch's bytes a value: 4 where a float type takes float32 rows */
    for (int64_t l = 0; l < md->n_layers; l++) {
        const tq_linear *ls[7] = {&md->layers[l].wq, &md->layers[l].wk, &md->layers[l].wv,
                                  &md->layers[l].wo, &md->layers[l].gate, &md->layers[l].up,
                                  &md->layers[l].down};
        for (int i = 0; i < 7; i++)
            vbytes = type_f(ls[i]->type) || ls[i]->type == T_BF16D ? 4 : vbytes;
    }
    const int nth = nthreads < 1 ? 1 : nthreads;
    /* one scratch per product of a shared call (q, k, v: tq_matmul_team_n) */
    tq_scratch scr[3];
    /* xb: the residual stream's second buffer (the additions write the other one: a row's
     * sum is stored while another thread still reads its terms); tmp: each thread's row */
    float *xb = malloc(sizeof(float) * M * D), *q = malloc(sizeof(float) * M * QD);
    float *k = malloc(sizeof(float) * M * KD), *v = malloc(sizeof(float) * M * KD);
    float *o = malloc(sizeof(float) * M * QD), *t = malloc(sizeof(float) * M * D);
    float *g = malloc(sizeof(float) * M * F), *u = malloc(sizeof(float) * M * F);
    float *tmp = malloc(sizeof(float) * nth * 2 * kmax); /* tq_pre's: 2 K a thread */
    int rc = 0, ns = 0;
    while (ns < 3 && (rc = tq_scratch_alloc(&scr[ns], M, kmax, vbytes)) == 0)
        ns++;
    if (!xb || !q || !k || !v || !o || !t || !g || !u || !tmp || rc != 0) {
        free(xb); free(q); free(k); free(v); free(o); free(t); free(g); free(u); free(tmp);
        while (ns > 0)
            tq_scratch_free(&scr[--ns]);
        return -2;
    }
    const tq_scratch *s3[3] = {&scr[0], &scr[1], &scr[2]};
    const float scale = md->attn_scale;
    const int64_t half = hd / 2, group = H / Hkv;
    const int kh = (kv_types & TQ_K_F16) != 0, vh = (kv_types & TQ_V_F16) != 0;
    const int64_t kb = hd * (kh ? 2 : 4), vb = hd * (vh ? 2 : 4); /* bytes a cache row */
    /* every row in a slot of its own (decoding, one row per sequence): a row's rope and cache
     * write can go with its attention, which reads no other row's keys */
    int distinct = 1;
    for (int64_t m = 0; m < M && distinct && ends; m++) /* a row seeing later ones: write all first */
        distinct = ends[m] == pos[m] + 1;
    for (int64_t m = 0; m < M && distinct; m++)
        for (int64_t m2 = m + 1; m2 < M && distinct; m2++)
            distinct = slots[m] != slots[m2];
#pragma omp parallel num_threads(nth)
    {
        float *sc = malloc(sizeof(float) * group * (max_len + 9)); /* attention scores */
        float *mine = tmp + omp_get_thread_num() * 2 * kmax;
        float *cur = x, *alt = xb; /* the residual stream, and where the next sum goes */
        for (int64_t l = 0; l < md->n_layers; l++) {
            const tq_layer *L = md->layers + l;
            char *kl = (char *)kc + l * n_slots * Hkv * max_len * kb;
            char *vl = (char *)vc + l * n_slots * Hkv * max_len * vb;
            { /* q, k and v of the same activations: one call, one pair of barriers; first
               * the previous layer's residual addition (t: its down projection) and the norm */
                const tq_linear *qkv[3] = {&L->wq, &L->wk, &L->wv};
                float *const out[3] = {q, k, v};
                const tq_pre pre = {TQ_PRE_NORM, l > 0 ? t : NULL,
                                    l > 0 ? md->layers[l - 1].post_ffn_norm : NULL, alt,
                                    L->attn_norm, md->eps, NULL, mine};
                tq_matmul_team_n(3, qkv, out, s3, cur, &pre, M, md->prompt_rows);
                if (l > 0) {
                    float *const was = cur;
                    cur = alt, alt = was;
                }
            }
            for (int64_t c = 0; cap && c < n_cap; c++) /* the layer's input, for a head */
                if (cap_layers[c] == l) {
#pragma omp for schedule(static)
                    for (int64_t m = 0; m < M; m++)
                        memcpy(cap + (m * n_cap + c) * D, cur + m * D, sizeof(float) * D);
                }
            const float *lcos = L->cos ? L->cos : md->cos, *lsin = L->sin ? L->sin : md->sin;
            if (!distinct) {
#pragma omp for schedule(static)
                for (int64_t m = 0; m < M; m++) {
                    const float *c = lcos + pos[m] * half, *s = lsin + pos[m] * half;
                    head_norm(q + m * QD, H, hd, L->q_norm, md->eps);
                    head_norm(k + m * KD, Hkv, hd, L->k_norm, md->eps);
                    rope(q + m * QD, H, hd, c, s, (int)md->rope_interleaved);
                    rope(k + m * KD, Hkv, hd, c, s, (int)md->rope_interleaved);
                    for (int64_t j = 0; j < Hkv; j++) {
                        const int64_t at = (slots[m] * Hkv + j) * max_len + pos[m]; /* row */
                        put_row(kl + at * kb, k + m * KD + j * hd, hd, kh);
                        put_row(vl + at * vb, v + m * KD + j * hd, hd, vh);
                    }
                }
            }
            /* one row and one key/value head per item, taken by whichever thread is free: in
             * a prompt chunk a row's cost grows with its position (contiguous halves would leave
             * one thread with three quarters of the work), and on a shared machine one thread
             * may be slowed by another process */
#pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < M * Hkv; i++) {
                const int64_t m = i / Hkv, j = i % Hkv;
                const int64_t at = (slots[m] * Hkv + j) * max_len; /* the head's row 0 */
                float *qj = q + m * QD + j * group * hd;
                if (distinct) { /* this item's heads: rope, and the key and value cached */
                    const float *c = lcos + pos[m] * half, *s = lsin + pos[m] * half;
                    float *kj = k + m * KD + j * hd;
                    head_norm(qj, group, hd, L->q_norm, md->eps);
                    head_norm(kj, 1, hd, L->k_norm, md->eps);
                    rope(qj, group, hd, c, s, (int)md->rope_interleaved);
                    rope(kj, 1, hd, c, s, (int)md->rope_interleaved);
                    put_row(kl + (at + pos[m]) * kb, kj, hd, kh);
                    put_row(vl + (at + pos[m]) * vb, v + m * KD + j * hd, hd, vh);
                }
                /* a sliding-window layer: the last `window` positions, pos[m] included */
                const int64_t lo = L->window > 0 && pos[m] + 1 > L->window ? pos[m] + 1 - L->window : 0;
                const int64_t end = ends ? ends[m] : pos[m] + 1;
                if (sc)
                    attend(qj, group, kl + (at + lo) * kb, vl + (at + lo) * vb, end - lo,
                           hd, scale, sc, o + m * QD + j * group * hd, kv_types);
            }
            tq_matmul_team_n(1, (const tq_linear *[]){&L->wo}, (float *const[]){t}, s3, o,
                             NULL, M, md->prompt_rows);
            { /* gate and up; first the residual addition of t (the attention's output
               * projection) and the norm */
                const tq_linear *gu[2] = {&L->gate, &L->up};
                float *const out[2] = {g, u};
                const tq_pre pre = {TQ_PRE_NORM, t, L->post_attn_norm, alt, L->ffn_norm, md->eps,
                                    NULL, mine};
                tq_matmul_team_n(2, gu, out, s3, cur, &pre, M, md->prompt_rows);
                float *const was = cur;
                cur = alt, alt = was;
            }
            { /* silu(g) * u (gelu_tanh(g) * u), then the down projection */
                const tq_pre pre = {(int)md->act, NULL, NULL, NULL, NULL, 0.f, u, mine};
                tq_matmul_team_n(1, (const tq_linear *[]){&L->down}, (float *const[]){t}, s3,
                                 g, &pre, M, md->prompt_rows);
            }
        }
        /* the last layer's residual addition, into x (its FFN's output normed first: gemma3) */
        const float *last_norm = md->n_layers > 0 ? md->layers[md->n_layers - 1].post_ffn_norm : NULL;
#pragma omp for schedule(static)
        for (int64_t m = 0; m < M * (md->n_layers > 0); m++) {
            const float *add = t + m * D;
            if (last_norm) {
                rms_norm_row(add, last_norm, D, md->eps, mine);
                add = mine;
            }
            add_row(cur + m * D, add, D, x + m * D);
        }
        if (!sc) {
#pragma omp atomic write
            rc = -2;
        }
        free(sc);
    }
    free(xb); free(q); free(k); free(v); free(o); free(t); free(g); free(u); free(tmp);
    for (int i = 0; i < 3; i++)
        tq_scratch_free(&scr[i]);
    return rc;
}
