/* How fast this machine's threads read memory: the ceiling of a decode step, which reads every
 * weight once. Sums a 512 MiB buffer with 512-bit loads; each thread reads its half as CHUNKS
 * interleaved streams, with software prefetch DIST bytes ahead (0: none). Prints GB/s of 3
 * rounds after a warm-up.
 *
 *   gcc -O3 -mavx512f -fopenmp -o /tmp/read_bandwidth experiments/read_bandwidth.c
 *   OMP_NUM_THREADS=2 /tmp/read_bandwidth DIST [CHUNKS]
 */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include <stdint.h>
int main(int argc,char**argv){ size_t n=(size_t)512<<20; uint8_t*a=aligned_alloc(64,n); memset(a,1,n);
 int dist=atoi(argv[1]); int chunks=argc>2?atoi(argv[2]):1;
 for(int rep=0;rep<4;rep++){ double t=omp_get_wtime(); long long tot=0;
#pragma omp parallel reduction(+:tot)
 { __m512i acc=_mm512_setzero_si512();
   int nt=omp_get_num_threads(), id=omp_get_thread_num();
   /* each thread reads `chunks` interleaved streams of its half */
   size_t per=n/nt, base=per*id, sub=per/chunks;
   for(size_t i=0;i<sub;i+=256){ for(int c=0;c<chunks;c++){ const uint8_t*p=a+base+c*sub+i;
     if(dist) _mm_prefetch((const char*)p+dist,_MM_HINT_T0), _mm_prefetch((const char*)p+dist+64,_MM_HINT_T0),_mm_prefetch((const char*)p+dist+128,_MM_HINT_T0),_mm_prefetch((const char*)p+dist+192,_MM_HINT_T0);
     acc=_mm512_add_epi32(acc,_mm512_load_si512(p)); acc=_mm512_add_epi32(acc,_mm512_load_si512(p+64));acc=_mm512_add_epi32(acc,_mm512_load_si512(p+128));acc=_mm512_add_epi32(acc,_mm512_load_si512(p+192));}}
  tot+=_mm512_reduce_add_epi32(acc);}
 t=omp_get_wtime()-t; if(rep) printf("%d threads dist %d chunks %d: %.1f GB/s\n",omp_get_max_threads(),dist,chunks,n/t/1e9);}
}
