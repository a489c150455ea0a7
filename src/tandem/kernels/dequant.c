/* Dequantization of GGUF blocks to float32. */
#include <stdint.h>
#include <string.h>

#include "blocks.h"

/* ---- dequantization to float32 (prefill expands weights per call; tests) ------------------ */

static void dequant_row(int type, const uint8_t *w, int64_t K, float *y) {
    switch (type) {
    case T_Q4_0:
    case T_Q4_1:
    case T_Q5_0:
    case T_Q5_1: {
        const int hasm = type == T_Q4_1 || type == T_Q5_1, five = type == T_Q5_0 || type == T_Q5_1;
        const int64_t bs = block_bytes(type);
        for (int64_t g = 0; g < K / 32; g++, w += bs, y += 32) {
            const float d = f16(w);
            const float mm = hasm ? f16(w + 2) : (five ? -16.f * d : -8.f * d);
            uint32_t qh = 0;
            if (five)
                memcpy(&qh, w + 2 + 2 * hasm, 4);
            const uint8_t *qs = w + 2 + 2 * hasm + 4 * five;
            for (int j = 0; j < 16; j++) {
                y[j] = d * (float)((qs[j] & 0xF) | (((qh >> j) & 1) << 4)) + mm;
                y[j + 16] = d * (float)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) + mm;
            }
        }
        break;
    }
    case T_Q8_0:
        for (int64_t g = 0; g < K / 32; g++, w += 34, y += 32) {
            const float d = f16(w);
            for (int j = 0; j < 32; j++)
                y[j] = d * (float)(int8_t)w[2 + j];
        }
        break;
    case T_Q4_K:
    case T_Q5_K: {
        const int five = type == T_Q5_K, bs = five ? 176 : 144;
        for (int64_t sb = 0; sb < K / 256; sb++, w += bs) {
            const float d = f16(w), dmin = f16(w + 2);
            const uint8_t *qh = w + 16, *qs = w + (five ? 48 : 16);
            uint8_t sm[16];
            k4_unpack(w + 4, sm);
            for (int c = 0; c < 4; c++, y += 64) {
                const float d0 = d * sm[2 * c], m0 = dmin * sm[8 + 2 * c];
                const float d1 = d * sm[2 * c + 1], m1 = dmin * sm[8 + 2 * c + 1];
                for (int l = 0; l < 32; l++) {
                    const int h0 = five ? ((qh[l] >> (2 * c)) & 1) << 4 : 0;
                    const int h1 = five ? ((qh[l] >> (2 * c + 1)) & 1) << 4 : 0;
                    y[l] = d0 * (float)((qs[32 * c + l] & 0xF) | h0) - m0;
                    y[l + 32] = d1 * (float)((qs[32 * c + l] >> 4) | h1) - m1;
                }
            }
        }
        break;
    }
    case T_Q6_K:
        for (int64_t sb = 0; sb < K / 256; sb++, w += 210) {
            const uint8_t *ql = w, *qh = w + 128;
            const int8_t *sc = (const int8_t *)(w + 192);
            const float d = f16(w + 208);
            for (int h = 0; h < 2; h++, ql += 64, qh += 32, sc += 8, y += 128) {
                for (int l = 0; l < 32; l++) {
                    const int is = l / 16;
                    y[l] = d * sc[is] * (float)(((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32);
                    y[l + 32] = d * sc[is + 2] *
                                (float)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                    y[l + 64] = d * sc[is + 4] * (float)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                    y[l + 96] = d * sc[is + 6] *
                                (float)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                }
            }
        }
        break;
    }
}

/* rowdotn.c's types, one row, as llama.cpp's dequantize_row_* computes them */
static void dequant_row_n(int type, const uint8_t *w, int64_t K, float *y) {
    switch (type) {
    case T_F16:
        for (int64_t k = 0; k < K; k++)
            y[k] = f16(w + 2 * k);
        break;
    case T_BF16:
        for (int64_t k = 0; k < K; k++) {
            const uint32_t u = (uint32_t)(w[2 * k] | (w[2 * k + 1] << 8)) << 16;
            memcpy(y + k, &u, 4);
        }
        break;
    case T_IQ4_NL:
        for (int64_t g = 0; g < K / 32; g++, w += 18, y += 32) {
            const float d = f16(w);
            for (int j = 0; j < 16; j++) {
                y[j] = d * IQ4NL[w[2 + j] & 0xF];
                y[j + 16] = d * IQ4NL[w[2 + j] >> 4];
            }
        }
        break;
    case T_IQ4_XS:
        for (int64_t sb = 0; sb < K / 256; sb++, w += 136) {
            const float d = f16(w);
            for (int b = 0; b < 8; b++, y += 32) {
                const float dl = d * (float)iq4xs_scale(w, b);
                const uint8_t *qs = w + 8 + 16 * b;
                for (int j = 0; j < 16; j++) {
                    y[j] = dl * IQ4NL[qs[j] & 0xF];
                    y[j + 16] = dl * IQ4NL[qs[j] >> 4];
                }
            }
        }
        break;
    case T_Q2_K:
        for (int64_t sb = 0; sb < K / 256; sb++, w += 84) {
            const float d = f16(w + 80), dmin = f16(w + 82);
            const uint8_t *sc = w, *q = w + 16;
            for (int h = 0, is = 0; h < 2; h++, q += 32)
                for (int j = 0; j < 4; j++)
                    for (int p = 0; p < 2; p++, is++, y += 16) {
                        const float dl = d * (float)(sc[is] & 0xF), ml = dmin * (float)(sc[is] >> 4);
                        for (int l = 0; l < 16; l++)
                            y[l] = dl * (float)((q[16 * p + l] >> 2 * j) & 3) - ml;
                    }
        }
        break;
    case T_Q3_K:
        for (int64_t sb = 0; sb < K / 256; sb++, w += 110) {
            int16_t sc[16]; /* minus 32 */
            q3k_scales(w + 96, sc);
            const float d = f16(w + 108);
            const uint8_t *hm = w, *q = w + 32;
            for (int h = 0, is = 0; h < 2; h++, q += 32)
                for (int j = 0; j < 4; j++)
                    for (int p = 0; p < 2; p++, is++, y += 16) {
                        const float dl = d * (float)sc[is];
                        for (int l = 0; l < 16; l++)
                            y[l] = dl * (float)(((q[16 * p + l] >> 2 * j) & 3) -
                                                ((hm[16 * p + l] >> (4 * h + j)) & 1 ? 0 : 4));
                    }
        }
        break;
    }
}

/* out (N, K) float32 = the weights of rows [0, N) of W. Returns 0, or -1 (type or K). */
int tq_dequantize(int type, const uint8_t *W, int64_t N, int64_t K, float *out, int nthreads) {
    const int64_t bb = block_bytes(type);
    if (bb == 0 || K % block_weights(type) != 0)
        return -1;
    const int64_t row_bytes = K / block_weights(type) * bb;
    if (nthreads < 1)
        nthreads = 1;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t n = 0; n < N; n++)
        (type_iq(type)                  ? dequant_row_iq /* rowdoti.c */
         : type_n(type) || type_f(type) ? dequant_row_n
                                        : dequant_row)(type, W + n * row_bytes, K, out + n * K);
    return 0;
}
