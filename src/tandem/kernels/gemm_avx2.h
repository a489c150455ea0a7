/* The AVX2 build's micro-kernels of the prompt kernel (gemm.c includes this file once, after
 * its buffer layout: NR, ROWW, VEC): int16 values (micro_4x2), and int8 Q4_K / Q5_K as bytes
 * (unpack_k4_u8, micro8_4x2). */
#ifndef TQ_GEMM_AVX2_H
#define TQ_GEMM_AVX2_H

/* s[2r + i] += madd(vector j of row r, x_i[16j..]) for j < nv and the 4 rows: the inner loop in
 * assembly because gcc 12 compiles the same C into a copy of every accumulator per step and
 * runs markedly slower. w: the buffer at the first vector; x0, x1: activation rows. */
static inline void micro_4x2(const int16_t *w, const int16_t *x0, const int16_t *x1, int64_t nv,
                             __m256i s[8]) {
    __m256i s0 = s[0], s1 = s[1], s2 = s[2], s3 = s[3], s4 = s[4], s5 = s[5], s6 = s[6], s7 = s[7];
    __m256i a0, a1, wv, t;
    __asm__("1:\n\t"
            "vmovdqu (%[x0]), %[a0]\n\t"
            "vmovdqu (%[x1]), %[a1]\n\t"
            "vmovdqu (%[w]), %[wv]\n\t"
            "vpmaddwd %[wv], %[a0], %[t]\n\t"
            "vpaddd %[t], %[s0], %[s0]\n\t"
            "vpmaddwd %[wv], %[a1], %[t]\n\t"
            "vpaddd %[t], %[s1], %[s1]\n\t"
            "vmovdqu 32(%[w]), %[wv]\n\t"
            "vpmaddwd %[wv], %[a0], %[t]\n\t"
            "vpaddd %[t], %[s2], %[s2]\n\t"
            "vpmaddwd %[wv], %[a1], %[t]\n\t"
            "vpaddd %[t], %[s3], %[s3]\n\t"
            "vmovdqu 64(%[w]), %[wv]\n\t"
            "vpmaddwd %[wv], %[a0], %[t]\n\t"
            "vpaddd %[t], %[s4], %[s4]\n\t"
            "vpmaddwd %[wv], %[a1], %[t]\n\t"
            "vpaddd %[t], %[s5], %[s5]\n\t"
            "vmovdqu 96(%[w]), %[wv]\n\t"
            "vpmaddwd %[wv], %[a0], %[t]\n\t"
            "vpaddd %[t], %[s6], %[s6]\n\t"
            "vpmaddwd %[wv], %[a1], %[t]\n\t"
            "vpaddd %[t], %[s7], %[s7]\n\t"
            "add $32, %[x0]\n\t"
            "add $32, %[x1]\n\t"
            "add $128, %[w]\n\t"
            "dec %[n]\n\t"
            "jnz 1b\n\t"
            : [s0] "+x"(s0), [s1] "+x"(s1), [s2] "+x"(s2), [s3] "+x"(s3), [s4] "+x"(s4),
              [s5] "+x"(s5), [s6] "+x"(s6), [s7] "+x"(s7), [a0] "=&x"(a0), [a1] "=&x"(a1),
              [wv] "=&x"(wv), [t] "=&x"(t), [x0] "+r"(x0), [x1] "+r"(x1), [w] "+r"(w),
              [n] "+r"(nv)
            :
            : "memory", "cc");
    s[0] = s0; s[1] = s1; s[2] = s2; s[3] = s3; s[4] = s4; s[5] = s5; s[6] = s6; s[7] = s7;
}

/* AVX2, int8 activations, Q4_K / Q5_K (GEMM_BYTES): rowdot8's own pair of instructions,
 * vpmaddubsw of the quants as bytes against the activation bytes, then vpmaddwd against the
 * sub-block scale, so lane j of a 32-weight group holds its weights 4j..4j+3 as there, with 32
 * products an instruction instead of vpmaddwd's 16 on widened values. Group g (sub-block g of
 * the chunk) of a row: its 32 quants at VEC(out, 2g), its scale in all 16 words at
 * VEC(out, 2g + 1); d and mn as unpack_k4's. */
static void unpack_k4_u8(int five, const uint8_t *w, int64_t nsb, int16_t *out, float *d,
                         float (*mn)[8]) {
    const int bs = five ? 176 : 144;
    const __m256i m4 = _mm256_set1_epi8(0x0F), one8 = _mm256_set1_epi8(1);
    for (int64_t sb = 0; sb < nsb; sb++, w += bs) {
        __m256i sc16, qh;
        __m256 mnv;
        const uint8_t *qs = k4_head(five, w, &sc16, &mnv, &qh);
        d[sb * NR] = f16(w);
        _mm256_storeu_ps(mn[sb * NR], _mm256_mul_ps(_mm256_set1_ps(-f16(w + 2)), mnv));
        for (int c = 0; c < 4; c++) { /* rowdot8's chunk c */
            const __m256i q32 = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(q32, m4);
            __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q32, 4), m4);
            if (five) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(
                                             _mm256_srli_epi16(qh, 2 * c), one8), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(
                                             _mm256_srli_epi16(qh, 2 * c + 1), one8), 4));
            }
            const int64_t g = 8 * sb + 2 * c;
            _mm256_storeu_si256(VEC(out, 2 * g), lo);
            _mm256_storeu_si256(VEC(out, 2 * g + 1), word_bcast(sc16, 2 * c));
            _mm256_storeu_si256(VEC(out, 2 * g + 2), hi);
            _mm256_storeu_si256(VEC(out, 2 * g + 3), word_bcast(sc16, 2 * c + 1));
        }
    }
}

/* s[2r + i] += madd(maddubs(group j of row r, x_i[32j..]), its scale) for j < ng and the 4
 * rows (unpack_k4_u8's buffer at w: group j's quants of row r at byte 256j + 32r, its scale
 * at + 128); x0, x1: activation rows as bytes. In assembly for micro_4x2's reason: gcc keeps
 * the eight sums on the stack. */
static inline void micro8_4x2(const int16_t *w, const int8_t *x0, const int8_t *x1, int64_t ng,
                              __m256i s[8]) {
    __m256i s0 = s[0], s1 = s[1], s2 = s[2], s3 = s[3], s4 = s[4], s5 = s[5], s6 = s[6], s7 = s[7];
    __m256i a0, a1, q, t;
#define TQ_ROW8(off, sa, sb)                                                                  \
    "vmovdqu " #off "(%[w]), %[q]\n\t"                                                        \
    "vpmaddubsw %[a0], %[q], %[t]\n\t"                                                        \
    "vpmaddwd " #off "+128(%[w]), %[t], %[t]\n\t"                                             \
    "vpaddd %[t], %[" #sa "], %[" #sa "]\n\t"                                                 \
    "vpmaddubsw %[a1], %[q], %[t]\n\t"                                                        \
    "vpmaddwd " #off "+128(%[w]), %[t], %[t]\n\t"                                             \
    "vpaddd %[t], %[" #sb "], %[" #sb "]\n\t"
    __asm__("1:\n\t"
            "vmovdqu (%[x0]), %[a0]\n\t"
            "vmovdqu (%[x1]), %[a1]\n\t"
            TQ_ROW8(0, s0, s1) TQ_ROW8(32, s2, s3) TQ_ROW8(64, s4, s5) TQ_ROW8(96, s6, s7)
            "add $32, %[x0]\n\t"
            "add $32, %[x1]\n\t"
            "add $256, %[w]\n\t"
            "dec %[n]\n\t"
            "jnz 1b\n\t"
            : [s0] "+x"(s0), [s1] "+x"(s1), [s2] "+x"(s2), [s3] "+x"(s3), [s4] "+x"(s4),
              [s5] "+x"(s5), [s6] "+x"(s6), [s7] "+x"(s7), [a0] "=&x"(a0), [a1] "=&x"(a1),
              [q] "=&x"(q), [t] "=&x"(t), [x0] "+r"(x0), [x1] "+r"(x1), [w] "+r"(w),
              [n] "+r"(ng)
            :
            : "memory", "cc");
#undef TQ_ROW8
    s[0] = s0; s[1] = s1; s[2] = s2; s[3] = s3; s[4] = s4; s[5] = s5; s[6] = s6; s[7] = s7;
}

#endif
