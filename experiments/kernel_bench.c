/* Timing of tq_matmul (src/tandem/kernels/, tq.h) on random blocks.
 *
 *   gcc -O3 -mavx2 -mfma -mf16c -fopenmp -o /tmp/kernel_bench experiments/kernel_bench.c \
 *       $(find src/tandem/kernels -name "*.c") -lm
 * (the AVX-512 build: add -mavx512f -mavx512bw -mavx512vl -mavx512vnni, as kernels.VARIANTS)
 *   /tmp/kernel_bench TYPE ROWS BITS [N K]     e.g. /tmp/kernel_bench 12 1 16 8960 1536
 *
 * TYPE is the ggml type id (8 Q8_0, 6 Q5_0, 12 Q4_K, 14 Q6_K) or 112 / 114 / 102 / 106 / 123 (Q4_K /
 * Q6_K / Q4_0 / Q5_0 / IQ4_XS in 16-row groups); ROWS activation rows; BITS 16 or
 * 8; THREADS=n in the environment runs n threads (default 1); PROMPT_ROWS=m the prompt kernel
 * from m rows (default 16, as kernels.PROMPT_ROWS; a huge m: the row-by-row kernel). Prints the
 * best of 200 calls (the weights then sit in the L3 cache when they fit: decoding a whole model
 * reads them from memory); CHECK=1 also prints a hash of the output's bits (the same inputs in
 * every run: two revisions' kernels compared bit for bit). Blocks are random bytes with every f16 scale set to 1.0 (random f16
 * bits could be NaN or subnormal). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../src/tandem/kernels/tq.h"

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s TYPE ROWS BITS [N K]\n", argv[0]);
        return 2;
    }
    const int xtype = atoi(argv[1]), M = atoi(argv[2]), bits = atoi(argv[3]);
    /* 112 / 114 / 102 / 106 / 123: Q4_K / Q6_K / Q4_0 / Q5_0 / IQ4_XS blocks repacked in 16-row
     * groups (rowdotx.c, rowdotxk.c) */
    const int type = xtype == 112 ? 12 : xtype == 114 ? 14 : xtype == 102 ? 2 : xtype == 106 ? 6
                   : xtype == 123 ? 23 : xtype;
    const int64_t N = argc > 4 ? atoll(argv[4]) : 8960, K = argc > 5 ? atoll(argv[5]) : 1536;
    const int64_t row_bytes = K / (type >= 12 ? 256 : 32) * tq_block_bytes(type);
    uint8_t *W = malloc(N * row_bytes);
    float *x = malloc(sizeof(float) * M * K), *y = malloc(sizeof(float) * M * N);
    for (int64_t i = 0; i < N * row_bytes; i++)
        W[i] = (uint8_t)rand();
    /* byte offsets of the f16 fields in each block (d, and dmin/m where the type has one) */
    const int64_t bb = tq_block_bytes(type);
    const int f16_at[2] = {type == 14 ? 208 : 0,
                           (type == 3 || type == 7 || (type >= 12 && type != 23)) ? 2 : -1};
    for (int64_t blk = 0; blk < N * row_bytes / bb; blk++)
        for (int j = 0; j < 2; j++)
            if (f16_at[j] >= 0 && !(type == 14 && j == 1)) {
                W[blk * bb + f16_at[j]] = 0x00;
                W[blk * bb + f16_at[j] + 1] = 0x3c;
            }
    for (int64_t i = 0; i < M * K; i++)
        x[i] = rand() / (float)RAND_MAX - 0.5f;
    if (xtype == 112 || xtype == 114 || xtype == 102 || xtype == 106 || xtype == 123) {
        uint8_t *P = malloc(N * row_bytes);
        if ((type == 12   ? tq_repack_q4kx(W, N, K, P)
             : type == 23 ? tq_repack_iq4xsx(W, N, K, P)
             : type == 14 ? tq_repack_q6kx(W, N, K, P)
                          : tq_repack_q50x(W, N, K, P, type == 6)) != 0) {
            fprintf(stderr, "tq_repack_q4kx refused N %lld, K %lld\n", (long long)N, (long long)K);
            return 1;
        }
        free(W);
        W = P;
    }
    const int threads = getenv("THREADS") ? atoi(getenv("THREADS")) : 1;
    const int64_t prompt_rows = getenv("PROMPT_ROWS") ? atoll(getenv("PROMPT_ROWS")) : 16;
    const int ablock = getenv("ABLOCK") ? atoi(getenv("ABLOCK")) : 0; /* 64 / 128: types 112, 114 */
    double best = 1e9;
    for (int r = 0; r < 200; r++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        if (tq_matmul(xtype, W, N, K, x, M, y, 0, threads, bits, ablock, prompt_rows) != 0) {
            fprintf(stderr, "tq_matmul refused type %d, K %lld\n", type, (long long)K);
            return 1;
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        const double t = (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9;
        best = t < best ? t : best;
    }
    if (getenv("CHECK")) { /* a hash of the output's bits: two builds of the kernels compared */
        uint64_t h = 1469598103934665603ULL;
        for (int64_t i = 0; i < M * N; i++) {
            uint32_t u;
            memcpy(&u, y + i, 4);
            h = (h ^ u) * 1099511628211ULL;
        }
        printf("bits %016llx\n", (unsigned long long)h);
    }
    printf("type %d, %d row(s), int%d, %lldx%lld: %.3f ms, %.1f GB/s of weights\n", type, M, bits,
           (long long)N, (long long)K, best * 1e3, N * row_bytes / best / 1e9);
    return 0;
}
