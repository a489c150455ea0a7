/* Prototype: Q4_K weights x int8 activations on AMX tiles, with integer-complete numerics.
 *
 * Not part of Tandem's kernels. It measures what the prompt kernel could gain on CPUs with
 * AMX-INT8 (Sapphire Rapids and later) if the int8 K-quant numerics were changed so that every
 * super-block's integer sum is complete before any float step:
 *
 *   S  = sum_g sc_g * sum_{i<32} q[32g+i] * a[32g+i]        (exact int32)
 *   Mn = sum_g m_g * bsum_g                                  (exact int32, bsum_g = sum of a)
 *   acc = fma(d * da, (float)S, acc);  acc = fma(-dmin * da, (float)Mn, acc)   per super-block
 *
 * Today's kernels keep 8 (AVX2) integer lanes per super-block and round each lane to float, so
 * a tile engine, whose dot products run over whole 32- or 64-byte depths, cannot reproduce them.
 * With complete integer sums any exact method gives the same integers, and the float chain is
 * the same scalar sequence per output: the row-by-row kernel, the VNNI prompt kernel and an AMX
 * kernel would all give the same bits (batch invariance kept).
 *
 *   gcc -O3 -march=native -fopenmp -o /tmp/amx_q4k experiments/amx_q4k.c -lm
 *   /tmp/amx_q4k [N K M]     (default 8960 1536 512: ffn gate/up of the 1.5B target, 512 rows)
 *
 * Prints the AMX time (best of 20, one thread) against a plain C reference of the same
 * numerics (checked bit for bit on a corner of the output). Random Q4_K blocks, d = dmin = 1/64.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tilecfg;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* unpacked weights: q (N x K bytes, 0..15), sc, mn (N x K/32), d, dmin (N x K/256) */
typedef struct {
    uint8_t *q, *sc, *mn;
    float *d, *dmin;
} wts;
/* activations: a (M x K int8), da (M x K/256), bsum (M x K/32) */
typedef struct {
    int8_t *a;
    float *da;
    int32_t *bsum;
} acts;

static void reference(const wts *W, const acts *A, int64_t N, int64_t K, int64_t M, int64_t nn,
                      int64_t mm, float *y) {
    for (int64_t n = 0; n < nn; n++)
        for (int64_t m = 0; m < mm; m++) {
            float acc = 0.f;
            for (int64_t sb = 0; sb < K / 256; sb++) {
                int32_t S = 0, Mn = 0;
                for (int g = 0; g < 8; g++) {
                    int32_t s = 0;
                    const int64_t k0 = 256 * sb + 32 * g;
                    for (int i = 0; i < 32; i++)
                        s += (int32_t)W->q[n * K + k0 + i] * A->a[m * K + k0 + i];
                    S += W->sc[n * (K / 32) + k0 / 32] * s;
                    Mn += W->mn[n * (K / 32) + k0 / 32] * A->bsum[m * (K / 32) + k0 / 32];
                }
                const float da = A->da[m * (K / 256) + sb];
                acc = fmaf(W->d[n * (K / 256) + sb] * da, (float)S, acc);
                acc = fmaf(-W->dmin[n * (K / 256) + sb] * da, (float)Mn, acc);
            }
            y[m * N + n] = acc;
        }
    (void)M;
}

/* y (M x N) with AMX: weight tiles of 16 rows, activation tiles of 16 rows, one C tile per
 * sub-block, scaled and summed with AVX-512 into S, then the float step per super-block. */
static void amx(const wts *W, const acts *A, int64_t N, int64_t K, int64_t M, float *y,
                int8_t *bpack /* M x K, VNNI layout per 16-row tile and sub-block */) {
    tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    cfg.rows[4] = 16; cfg.colsb[4] = 32; /* A: 16 weight rows x 32 bytes */
    cfg.rows[5] = 8; cfg.colsb[5] = 64;  /* B: 8 rows of 16 activations x 4 bytes */
    cfg.rows[6] = 16; cfg.colsb[6] = 32;
    cfg.rows[7] = 8; cfg.colsb[7] = 64;
    _tile_loadconfig(&cfg);
    const int64_t G = K / 32, SB = K / 256;
    /* activations in VNNI layout: tile mt, group g: 8 rows of 64 bytes (16 act rows x 4) */
    for (int64_t mt = 0; mt < M / 16; mt++)
        for (int64_t g = 0; g < G; g++) {
            int8_t *dst = bpack + (mt * G + g) * 512;
            for (int k = 0; k < 8; k++)
                for (int r = 0; r < 16; r++)
                    memcpy(dst + k * 64 + 4 * r, A->a + (mt * 16 + r) * K + 32 * g + 4 * k, 4);
        }
    int32_t C[8][16][16] __attribute__((aligned(64)));
    for (int64_t nt = 0; nt < N / 16; nt++) {
        const uint8_t *wq = W->q + nt * 16 * K; /* 16 rows, row stride K */
        for (int64_t mt = 0; mt < M / 16; mt++) {
            __m512 acc[16];
            for (int r = 0; r < 16; r++)
                acc[r] = _mm512_setzero_ps();
            const __m512 da_all[1] = {_mm512_setzero_ps()};
            (void)da_all;
            for (int64_t sb = 0; sb < SB; sb++) {
                /* 8 sub-blocks: two at a time in tiles 0..3 (C), 4/6 (A), 5/7 (B) */
                for (int g = 0; g < 8; g += 2) {
                    const int64_t gg = sb * 8 + g;
                    _tile_zero(0);
                    _tile_zero(1);
                    _tile_loadd(4, wq + 32 * gg, K);
                    _tile_loadd(5, bpack + (mt * G + gg) * 512, 64);
                    _tile_loadd(6, wq + 32 * (gg + 1), K);
                    _tile_loadd(7, bpack + (mt * G + gg + 1) * 512, 64);
                    _tile_dpbusd(0, 4, 5);
                    _tile_dpbusd(1, 6, 7);
                    _tile_stored(0, C[g], 64);
                    _tile_stored(1, C[g + 1], 64);
                }
                const __m512 da = _mm512_loadu_ps(A->da + 0); /* placeholder, replaced below */
                (void)da;
                float dav[16] __attribute__((aligned(64)));
                for (int r = 0; r < 16; r++)
                    dav[r] = A->da[(mt * 16 + r) * SB + sb];
                const __m512 dam = _mm512_load_ps(dav);
                /* bsums of the 16 activation rows for the 8 groups: column per group */
                __m512i bs[8];
                for (int g = 0; g < 8; g++) {
                    int32_t t[16] __attribute__((aligned(64)));
                    for (int r = 0; r < 16; r++)
                        t[r] = A->bsum[(mt * 16 + r) * G + sb * 8 + g];
                    bs[g] = _mm512_load_si512(t);
                }
                for (int r = 0; r < 16; r++) { /* weight row r of the tile */
                    const int64_t n = nt * 16 + r;
                    const uint8_t *sc = W->sc + n * G + sb * 8, *mn = W->mn + n * G + sb * 8;
                    __m512i S = _mm512_mullo_epi32(_mm512_set1_epi32(sc[0]), _mm512_load_si512(C[0][r]));
                    __m512i Mn = _mm512_mullo_epi32(_mm512_set1_epi32(mn[0]), bs[0]);
                    for (int g = 1; g < 8; g++) {
                        S = _mm512_add_epi32(S, _mm512_mullo_epi32(_mm512_set1_epi32(sc[g]),
                                                                   _mm512_load_si512(C[g][r])));
                        Mn = _mm512_add_epi32(Mn, _mm512_mullo_epi32(_mm512_set1_epi32(mn[g]), bs[g]));
                    }
                    const float d = W->d[n * SB + sb], dmin = W->dmin[n * SB + sb];
                    acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(d), dam),
                                             _mm512_cvtepi32_ps(S), acc[r]);
                    acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(-dmin), dam),
                                             _mm512_cvtepi32_ps(Mn), acc[r]);
                }
            }
            /* acc[r] lane j: output (act row mt*16 + j, weight row nt*16 + r) */
            for (int r = 0; r < 16; r++) {
                float t[16];
                _mm512_storeu_ps(t, acc[r]);
                for (int j = 0; j < 16; j++)
                    y[(mt * 16 + j) * N + nt * 16 + r] = t[j];
            }
        }
    }
    _tile_release();
}

/* The same with the sub-block scales folded into the weights: sc * q (< 1024) = 64 h + l, two
 * u8 planes (l 0..63, h 0..14), and the mins as a third plane m (each weight's sub-block min), so
 * a super-block's S = 64 sum(h a) + sum(l a) and Mn = sum(m a) come out of the tiles whole,
 * accumulated over its 256 weights in the tile registers: 12 tile products per super-block and
 * 16 x 16 outputs, three stores, then the float step. Planes: per weight tile and super-block,
 * 3 x (16 rows x 256 bytes). */
static void fold_planes(const wts *W, int64_t N, int64_t K, uint8_t *planes) {
    const int64_t G = K / 32, SB = K / 256;
    for (int64_t nt = 0; nt < N / 16; nt++)
        for (int64_t sb = 0; sb < SB; sb++) {
            uint8_t *p = planes + (nt * SB + sb) * 3 * 4096;
            for (int r = 0; r < 16; r++) {
                const int64_t n = nt * 16 + r;
                for (int i = 0; i < 256; i++) {
                    const int g = i / 32;
                    const int v = W->sc[n * G + sb * 8 + g] * W->q[n * K + 256 * sb + i];
                    p[r * 256 + i] = (uint8_t)(v & 63);
                    p[4096 + r * 256 + i] = (uint8_t)(v >> 6);
                    p[8192 + r * 256 + i] = W->mn[n * G + sb * 8 + g];
                }
            }
        }
}

static void amx_folded(const wts *W, const acts *A, int64_t N, int64_t K, int64_t M, float *y,
                       const uint8_t *planes, int8_t *bpack) {
    tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
    const int64_t SB = K / 256;
    /* activations in VNNI layout: tile mt, 64-byte step s: 16 rows of 64 bytes */
    for (int64_t mt = 0; mt < M / 16; mt++)
        for (int64_t st = 0; st < K / 64; st++) {
            int8_t *dst = bpack + (mt * (K / 64) + st) * 1024;
            for (int k = 0; k < 16; k++)
                for (int r = 0; r < 16; r++)
                    memcpy(dst + k * 64 + 4 * r, A->a + (mt * 16 + r) * K + 64 * st + 4 * k, 4);
        }
    int32_t C[3][16][16] __attribute__((aligned(64)));
    for (int64_t nt = 0; nt < N / 16; nt++) {
        for (int64_t mt = 0; mt < M / 16; mt++) {
            __m512 acc[16];
            for (int r = 0; r < 16; r++)
                acc[r] = _mm512_setzero_ps();
            for (int64_t sb = 0; sb < SB; sb++) {
                const uint8_t *p = planes + (nt * SB + sb) * 3 * 4096;
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                for (int st = 0; st < 4; st++) {
                    _tile_loadd(7, bpack + (mt * (K / 64) + sb * 4 + st) * 1024, 64);
                    _tile_loadd(4, p + 64 * st, 256);
                    _tile_loadd(5, p + 4096 + 64 * st, 256);
                    _tile_loadd(6, p + 8192 + 64 * st, 256);
                    _tile_dpbusd(0, 4, 7);
                    _tile_dpbusd(1, 5, 7);
                    _tile_dpbusd(2, 6, 7);
                }
                _tile_stored(0, C[0], 64);
                _tile_stored(1, C[1], 64);
                _tile_stored(2, C[2], 64);
                float dav[16] __attribute__((aligned(64)));
                for (int r = 0; r < 16; r++)
                    dav[r] = A->da[(mt * 16 + r) * SB + sb];
                const __m512 dam = _mm512_load_ps(dav);
                for (int r = 0; r < 16; r++) {
                    const int64_t n = nt * 16 + r;
                    const __m512i S = _mm512_add_epi32(
                        _mm512_slli_epi32(_mm512_load_si512(C[1][r]), 6), _mm512_load_si512(C[0][r]));
                    const float d = W->d[n * SB + sb], dmin = W->dmin[n * SB + sb];
                    acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(d), dam),
                                             _mm512_cvtepi32_ps(S), acc[r]);
                    acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(-dmin), dam),
                                             _mm512_cvtepi32_ps(_mm512_load_si512(C[2][r])), acc[r]);
                }
            }
            for (int r = 0; r < 16; r++) {
                float t[16];
                _mm512_storeu_ps(t, acc[r]);
                for (int j = 0; j < 16; j++)
                    y[(mt * 16 + j) * N + nt * 16 + r] = t[j];
            }
        }
    }
    _tile_release();
}

int main(int argc, char **argv) {
    const int64_t N = argc > 1 ? atoll(argv[1]) : 8960, K = argc > 2 ? atoll(argv[2]) : 1536,
                  M = argc > 3 ? atoll(argv[3]) : 512;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) {
        fprintf(stderr, "AMX tile data not granted by the kernel\n");
        return 1;
    }
    srand(1);
    wts W = {malloc(N * K), malloc(N * K / 32), malloc(N * K / 32), malloc(4 * N * K / 256),
             malloc(4 * N * K / 256)};
    acts A = {malloc(M * K), malloc(4 * M * K / 256), malloc(4 * M * K / 32)};
    for (int64_t i = 0; i < N * K; i++)
        W.q[i] = rand() & 15;
    for (int64_t i = 0; i < N * K / 32; i++) {
        W.sc[i] = rand() & 63;
        W.mn[i] = rand() & 63;
    }
    for (int64_t i = 0; i < N * K / 256; i++) {
        W.d[i] = (1 + rand() % 64) / 4096.f;
        W.dmin[i] = (1 + rand() % 64) / 8192.f;
    }
    for (int64_t i = 0; i < M * K; i++)
        A.a[i] = (int8_t)(rand() % 255 - 127);
    for (int64_t i = 0; i < M * K / 256; i++)
        A.da[i] = (1 + rand() % 100) / 1000.f;
    for (int64_t m = 0; m < M; m++)
        for (int64_t g = 0; g < K / 32; g++) {
            int32_t s = 0;
            for (int i = 0; i < 32; i++)
                s += A.a[m * K + 32 * g + i];
            A.bsum[m * (K / 32) + g] = s;
        }
    float *y = malloc(4 * M * N), *yr = malloc(4 * M * N);
    int8_t *bpack = aligned_alloc(64, M * K);
    double best = 1e9;
    for (int it = 0; it < 20; it++) {
        const double t0 = now();
        amx(&W, &A, N, K, M, y, bpack);
        const double t = now() - t0;
        best = t < best ? t : best;
    }
    uint8_t *planes = aligned_alloc(64, 3 * N * K);
    double t0 = now();
    fold_planes(&W, N, K, planes);
    const double t_fold = now() - t0;
    float *y2 = malloc(4 * M * N);
    double best2 = 1e9;
    for (int it = 0; it < 20; it++) {
        t0 = now();
        amx_folded(&W, &A, N, K, M, y2, planes, bpack);
        const double t = now() - t0;
        best2 = t < best2 ? t : best2;
    }
    const int64_t cn = 64, cm = 64;
    reference(&W, &A, N, K, M, cn, cm, yr);
    int64_t bad = 0;
    for (int64_t m = 0; m < cm; m++)
        for (int64_t n = 0; n < cn; n++)
            bad += memcmp(&y[m * N + n], &yr[m * N + n], 4) != 0;
    printf("Q4_K-like %lldx%lld, %lld rows: AMX %.3f ms (one thread, best of 20), %.0f GMAC/s; "
           "%lld of %lld checked outputs differ from the reference bits\n",
           (long long)N, (long long)K, (long long)M, 1e3 * best, N * K * M / best / 1e9,
           (long long)bad, (long long)(cn * cm));
    int64_t bad2 = 0;
    for (int64_t m = 0; m < cm; m++)
        for (int64_t n = 0; n < cn; n++)
            bad2 += memcmp(&y2[m * N + n], &yr[m * N + n], 4) != 0;
    printf("scales folded into three u8 planes: AMX %.3f ms, %.0f GMAC/s (planes built once in "
           "%.1f ms, not counted); %lld of %lld checked outputs differ\n", 1e3 * best2,
           N * K * M / best2 / 1e9, 1e3 * t_fold, (long long)bad2, (long long)(cn * cm));
    return bad != 0 || bad2 != 0;
}
