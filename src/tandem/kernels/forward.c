/* The decoder layers of the llama/qwen2 family for a few rows at a time (decode, verification,
 * short prompt chunks), in one OpenMP region: the float32 twin of decoder.py's Block.forward
 * for models whose linear weights are all GGUF blocks that the kernels (matmul.c) read in
 * place.
 *
 * One Python call runs every layer: in Python each layer was ~60 small torch operations and
 * 7 kernel calls (~1 ms of overhead per layer on this 2-core machine); here the threads stay
 * in one team and meet at barriers.
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

#include "tq.h"

/* the structs of tq.h as the compiler lays them out, for the ctypes mirror to check at load */
#define STRUCT(s) {#s, 0, sizeof(s)}
#define FIELD(s, f) {#s "." #f, offsetof(s, f), sizeof(((s *)0)->f)}
static const tq_field layout[] = {
    STRUCT(tq_linear), FIELD(tq_linear, type), FIELD(tq_linear, N), FIELD(tq_linear, K),
    FIELD(tq_linear, W), FIELD(tq_linear, bias), FIELD(tq_linear, bits),
    STRUCT(tq_layer), FIELD(tq_layer, attn_norm), FIELD(tq_layer, ffn_norm),
    FIELD(tq_layer, wq), FIELD(tq_layer, wk), FIELD(tq_layer, wv), FIELD(tq_layer, wo),
    FIELD(tq_layer, gate), FIELD(tq_layer, up), FIELD(tq_layer, down),
    STRUCT(tq_model), FIELD(tq_model, n_layers), FIELD(tq_model, dim), FIELD(tq_model, n_heads),
    FIELD(tq_model, n_kv_heads), FIELD(tq_model, head_dim), FIELD(tq_model, ffn_dim),
    FIELD(tq_model, rope_len), FIELD(tq_model, rope_interleaved),
    FIELD(tq_model, prompt_rows), FIELD(tq_model, eps), FIELD(tq_model, cos),
    FIELD(tq_model, sin), FIELD(tq_model, layers),
    {NULL, 0, 0}};

const tq_field *tq_layout(void) { return layout; }

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

/* out = x / rms(x) * w over n values (n % 8 == 0) */
static void rms_norm(const float *x, const float *w, int64_t n, float eps, float *out) {
    __m256 a = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        a = _mm256_fmadd_ps(v, v, a);
    }
    const __m256 r = _mm256_set1_ps(1.f / sqrtf(hsum8(a) / (float)n + eps));
    for (int64_t i = 0; i < n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), r),
                                                _mm256_loadu_ps(w + i)));
}

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

/* the four sums of a, b, c, d's lanes: [sum a, sum b, sum c, sum d] */
static inline __m128 hsum4x8(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 ab = _mm256_hadd_ps(a, b), cd = _mm256_hadd_ps(c, d);
    const __m256 t = _mm256_hadd_ps(ab, cd); /* per lane: a0+a1, b0+b1, c0+c1, d0+d1 */
    return _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
}

#define KEY_BLOCK 64 /* keys whose K or V rows stay in L1 while every head of the group uses them */

/* Attention of the G query heads that share one key/value head, for one row: o + g * hd =
 * softmax(q_g . K[0..n) * scale) V[0..n) for g < G (q_g = q + g * hd). sc: G * (n + 8) floats of
 * scratch. Keys are taken in blocks of KEY_BLOCK for all heads at once, so K and V are read from
 * memory once per row instead of once per head. Each output element still sums its terms in
 * key order t = 0, 1, ..., n - 1 in one float32 accumulator, and the sequence of operations
 * depends only on n: a row gets the same bits in any batch. */
static void attend(const float *q, int64_t G, const float *K, const float *V, int64_t n,
                   int64_t hd, float scale, float *sc, float *o) {
    const int64_t ld = n + 8;
    for (int64_t b0 = 0; b0 < n; b0 += KEY_BLOCK) {
        const int64_t b1 = b0 + KEY_BLOCK < n ? b0 + KEY_BLOCK : n;
        for (int64_t g = 0; g < G; g++) {
            const float *qg = q + g * hd;
            float *sg = sc + g * ld;
            int64_t t = b0;
            for (; t + 4 <= b1; t += 4) { /* four keys per pass over q */
                const float *k0 = K + t * hd;
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (int64_t i = 0; i < hd; i += 8) {
                    const __m256 qv = _mm256_loadu_ps(qg + i);
                    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), a0);
                    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + hd + i), a1);
                    a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * hd + i), a2);
                    a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * hd + i), a3);
                }
                _mm_storeu_ps(sg + t, _mm_mul_ps(hsum4x8(a0, a1, a2, a3), _mm_set1_ps(scale)));
            }
            for (; t < b1; t++) {
                __m256 a0 = _mm256_setzero_ps();
                for (int64_t i = 0; i < hd; i += 8)
                    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qg + i), _mm256_loadu_ps(K + t * hd + i), a0);
                sg[t] = hsum8(a0) * scale;
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
        for (int64_t g = 0; g < G; g++) {
            const float *sg = sc + g * ld;
            float *og = o + g * hd;
            int64_t d = 0;
            for (; d + 32 <= hd; d += 32) { /* 32 outputs in registers over this key block */
                __m256 o0 = _mm256_loadu_ps(og + d), o1 = _mm256_loadu_ps(og + d + 8);
                __m256 o2 = _mm256_loadu_ps(og + d + 16), o3 = _mm256_loadu_ps(og + d + 24);
                const float *v = V + b0 * hd + d;
                for (int64_t t = b0; t < b1; t++, v += hd) {
                    const __m256 p = _mm256_broadcast_ss(sg + t);
                    o0 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v), o0);
                    o1 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 8), o1);
                    o2 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 16), o2);
                    o3 = _mm256_fmadd_ps(p, _mm256_loadu_ps(v + 24), o3);
                }
                _mm256_storeu_ps(og + d, o0);
                _mm256_storeu_ps(og + d + 8, o1);
                _mm256_storeu_ps(og + d + 16, o2);
                _mm256_storeu_ps(og + d + 24, o3);
            }
            for (; d < hd; d += 8) {
                __m256 acc = _mm256_loadu_ps(og + d);
                for (int64_t t = b0; t < b1; t++)
                    acc = _mm256_fmadd_ps(_mm256_broadcast_ss(sg + t), _mm256_loadu_ps(V + t * hd + d), acc);
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

static int linear_ok(const tq_linear *l, int64_t N, int64_t K) {
    return l->W && l->N == N && l->K == K && tq_matmul_check((int)l->type, K, (int)l->bits);
}

#define MATMUL(l, in, out, rows)                                                              \
    tq_matmul_team((int)(l).type, (l).W, (l).N, (l).K, in, rows, out, (l).bias, (int)(l).bits, \
                   &scr[0], md->prompt_rows)

/* Run every layer on x (M, dim), in place. kc, vc: the caches, (n_layers, n_slots, n_kv_heads,
 * max_len, head_dim) float32. Returns 0; -1 for a shape the model or the kernels do not take or
 * a position outside the cache or the rope table; -2 when out of memory. */
int tq_forward(const tq_model *md, float *kc, float *vc, int64_t n_slots, int64_t max_len,
               float *x, int64_t M, const int64_t *slots, const int64_t *pos, int nthreads) {
    const int64_t D = md->dim, H = md->n_heads, Hkv = md->n_kv_heads, hd = md->head_dim;
    const int64_t F = md->ffn_dim, QD = H * hd, KD = Hkv * hd;
    if (M <= 0 || D % 32 || hd % 8 || H % Hkv)
        return -1;
    for (int64_t m = 0; m < M; m++)
        if (slots[m] < 0 || slots[m] >= n_slots || pos[m] < 0 || pos[m] >= max_len ||
            pos[m] >= md->rope_len)
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
    /* one scratch per product of a shared call (q, k, v: tq_matmul_team_n) */
    tq_scratch scr[3];
    float *h = malloc(sizeof(float) * M * kmax), *q = malloc(sizeof(float) * M * QD);
    float *k = malloc(sizeof(float) * M * KD), *v = malloc(sizeof(float) * M * KD);
    float *o = malloc(sizeof(float) * M * QD), *t = malloc(sizeof(float) * M * D);
    float *g = malloc(sizeof(float) * M * F), *u = malloc(sizeof(float) * M * F);
    int rc = 0, ns = 0;
    while (ns < 3 && (rc = tq_scratch_alloc(&scr[ns], M, kmax)) == 0)
        ns++;
    if (!h || !q || !k || !v || !o || !t || !g || !u || rc != 0) {
        free(h); free(q); free(k); free(v); free(o); free(t); free(g); free(u);
        while (ns > 0)
            tq_scratch_free(&scr[--ns]);
        return -2;
    }
    const tq_scratch *s3[3] = {&scr[0], &scr[1], &scr[2]};
    const float scale = 1.f / sqrtf((float)hd);
    const int64_t half = hd / 2, group = H / Hkv;
#pragma omp parallel num_threads(nthreads < 1 ? 1 : nthreads)
    {
        float *sc = malloc(sizeof(float) * group * (max_len + 9)); /* attention scores */
        for (int64_t l = 0; l < md->n_layers; l++) {
            const tq_layer *L = md->layers + l;
            float *kl = kc + l * n_slots * Hkv * max_len * hd;
            float *vl = vc + l * n_slots * Hkv * max_len * hd;
#pragma omp for schedule(static)
            for (int64_t m = 0; m < M; m++)
                rms_norm(x + m * D, L->attn_norm, D, md->eps, h + m * D);
            { /* q, k and v of the same activations: one call, one pair of barriers */
                const tq_linear *qkv[3] = {&L->wq, &L->wk, &L->wv};
                float *const out[3] = {q, k, v};
                tq_matmul_team_n(3, qkv, out, s3, h, M, md->prompt_rows);
            }
#pragma omp for schedule(static)
            for (int64_t m = 0; m < M; m++) {
                const float *c = md->cos + pos[m] * half, *s = md->sin + pos[m] * half;
                rope(q + m * QD, H, hd, c, s, (int)md->rope_interleaved);
                rope(k + m * KD, Hkv, hd, c, s, (int)md->rope_interleaved);
                for (int64_t j = 0; j < Hkv; j++) {
                    const int64_t at = ((slots[m] * Hkv + j) * max_len + pos[m]) * hd;
                    memcpy(kl + at, k + m * KD + j * hd, sizeof(float) * hd);
                    memcpy(vl + at, v + m * KD + j * hd, sizeof(float) * hd);
                }
            }
            /* one row and one key/value head per item, taken by whichever thread is free: in
             * a prompt chunk a row's cost grows with its position (contiguous halves would leave
             * one thread with three quarters of the work), and on a shared machine one thread
             * may be slowed by another process */
#pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < M * Hkv; i++) {
                const int64_t m = i / Hkv, j = i % Hkv;
                const int64_t at = (slots[m] * Hkv + j) * max_len * hd;
                if (sc)
                    attend(q + m * QD + j * group * hd, group, kl + at, vl + at, pos[m] + 1, hd,
                           scale, sc, o + m * QD + j * group * hd);
            }
            MATMUL(L->wo, o, t, M);
#pragma omp for schedule(static)
            for (int64_t m = 0; m < M; m++) {
                for (int64_t i = 0; i < D; i++)
                    x[m * D + i] += t[m * D + i];
                rms_norm(x + m * D, L->ffn_norm, D, md->eps, h + m * D);
            }
            {
                const tq_linear *gu[2] = {&L->gate, &L->up};
                float *const out[2] = {g, u};
                tq_matmul_team_n(2, gu, out, s3, h, M, md->prompt_rows);
            }
#pragma omp for schedule(static)
            for (int64_t m = 0; m < M; m++) {
                float *gm = g + m * F, *um = u + m * F;
                int64_t i = 0;
                for (; i + 8 <= F; i += 8) { /* silu(g) * u = g / (1 + e^-g) * u */
                    const __m256 gv = _mm256_loadu_ps(gm + i);
                    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv));
                    const __m256 sg = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.f), e));
                    _mm256_storeu_ps(gm + i, _mm256_mul_ps(sg, _mm256_loadu_ps(um + i)));
                }
                for (; i < F; i++)
                    gm[i] = gm[i] / (1.f + expf(-gm[i])) * um[i];
            }
            MATMUL(L->down, g, t, M);
#pragma omp for schedule(static)
            for (int64_t m = 0; m < M; m++)
                for (int64_t i = 0; i < D; i++)
                    x[m * D + i] += t[m * D + i];
        }
        if (!sc) {
#pragma omp atomic write
            rc = -2;
        }
        free(sc);
    }
    free(h); free(q); free(k); free(v); free(o); free(t); free(g); free(u);
    for (int i = 0; i < 3; i++)
        tq_scratch_free(&scr[i]);
    return rc;
}
