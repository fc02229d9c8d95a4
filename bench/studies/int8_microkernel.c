/* int8_microkernel.c -- the AVX2 int8 register block alone, operands in L1, one core: the
 * shipped exact scheme (recentred activations, the sign moved onto the weight: vpsignb,
 * vpmaddubsw, vpmaddwd, vpaddd; qgemm_kernels.c's qg_imk_avx2) against vpmaddubsw straight on
 * u8 x s7 operands (the 7-bit-weight candidate of docs/performance.md: no vpsignb), and the
 * float32 FMA block of the same shape for scale. Not part of the package; prints products
 * (multiply-adds) per second, three rounds.
 *
 *   gcc -O3 -o /tmp/i8mk bench/studies/int8_microkernel.c && taskset -c 1 /tmp/i8mk */
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#define KC 256
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+1e-9*t.tv_nsec;}
static uint8_t xs[6*KC] __attribute__((aligned(64))), xa[6*KC] __attribute__((aligned(64))), xu[6*KC] __attribute__((aligned(64)));
static int8_t wp[KC*16*4] __attribute__((aligned(64)));
static float xf[6*KC] __attribute__((aligned(64))), wf[KC*16] __attribute__((aligned(64)));
static int32_t out[6*16];
__attribute__((target("avx2,fma"),noinline)) static void sign4(int reps){
  const __m256i ones=_mm256_set1_epi16(1);
  for(int t=0;t<reps;t++){ __m256i acc[4][2]; for(int r=0;r<4;r++)acc[r][0]=acc[r][1]=_mm256_setzero_si256();
    for(int k=0;k<KC;k+=4){ __m256i w0=_mm256_load_si256((const __m256i*)(wp+k*16)), w1=_mm256_load_si256((const __m256i*)(wp+k*16+32));
      for(int r=0;r<4;r++){int32_t s,a;memcpy(&s,xs+r*KC+k,4);memcpy(&a,xa+r*KC+k,4);__m256i sv=_mm256_set1_epi32(s),av=_mm256_set1_epi32(a);
        acc[r][0]=_mm256_add_epi32(acc[r][0],_mm256_madd_epi16(_mm256_maddubs_epi16(av,_mm256_sign_epi8(w0,sv)),ones));
        acc[r][1]=_mm256_add_epi32(acc[r][1],_mm256_madd_epi16(_mm256_maddubs_epi16(av,_mm256_sign_epi8(w1,sv)),ones));}}
    for(int r=0;r<4;r++){_mm256_storeu_si256((__m256i*)(out+r*16),acc[r][0]);_mm256_storeu_si256((__m256i*)(out+r*16+8),acc[r][1]);}}
}
#define STRAIGHT(MR) __attribute__((target("avx2,fma"),noinline)) static void straight##MR(int reps){ \
  const __m256i ones=_mm256_set1_epi16(1); \
  for(int t=0;t<reps;t++){ __m256i acc[MR][2]; for(int r=0;r<MR;r++)acc[r][0]=acc[r][1]=_mm256_setzero_si256(); \
    for(int k=0;k<KC;k+=4){ __m256i w0=_mm256_load_si256((const __m256i*)(wp+k*16)), w1=_mm256_load_si256((const __m256i*)(wp+k*16+32)); \
      for(int r=0;r<MR;r++){int32_t a;memcpy(&a,xu+r*KC+k,4);__m256i av=_mm256_set1_epi32(a); \
        acc[r][0]=_mm256_add_epi32(acc[r][0],_mm256_madd_epi16(_mm256_maddubs_epi16(av,w0),ones)); \
        acc[r][1]=_mm256_add_epi32(acc[r][1],_mm256_madd_epi16(_mm256_maddubs_epi16(av,w1),ones));}} \
    for(int r=0;r<MR;r++){_mm256_storeu_si256((__m256i*)(out+r*16),acc[r][0]);_mm256_storeu_si256((__m256i*)(out+r*16+8),acc[r][1]);}} }
STRAIGHT(4)
STRAIGHT(6)
__attribute__((target("avx2,fma"),noinline)) static void fma6(int reps){
  for(int t=0;t<reps;t++){ __m256 acc[6][2]; for(int r=0;r<6;r++)acc[r][0]=acc[r][1]=_mm256_setzero_ps();
#pragma GCC unroll 4
    for(int k=0;k<KC;k++){ __m256 w0=_mm256_load_ps(wf+k*16), w1=_mm256_load_ps(wf+k*16+8);
      for(int r=0;r<6;r++){__m256 a=_mm256_broadcast_ss(xf+r*KC+k); acc[r][0]=_mm256_fmadd_ps(a,w0,acc[r][0]); acc[r][1]=_mm256_fmadd_ps(a,w1,acc[r][1]);}}
    for(int r=0;r<6;r++){_mm256_storeu_ps((float*)out+r*16,acc[r][0]);_mm256_storeu_ps((float*)out+r*16+8,acc[r][1]);}}
}
int main(void){
  for(int i=0;i<6*KC;i++){xs[i]=i*7;xa[i]=(i*3)&127;xu[i]=i*5;xf[i]=i*1e-3f;}
  for(int i=0;i<KC*16*4;i++)wp[i]=(i*11)%63-31;
  for(int i=0;i<KC*16;i++)wf[i]=i*1e-4f;
  int reps=200000; double t;
  for(int round=0;round<3;round++){
  t=now();sign4(reps);t=now()-t;printf("sign 4x16:      %.1f Gprod/s\n",4.0*16*KC*reps/t/1e9);
  t=now();straight4(reps);t=now()-t;printf("straight 4x16:  %.1f Gprod/s\n",4.0*16*KC*reps/t/1e9);
  t=now();straight6(reps);t=now()-t;printf("straight 6x16:  %.1f Gprod/s\n",6.0*16*KC*reps/t/1e9);
  t=now();fma6(reps);t=now()-t;printf("fp32 fma 6x16:  %.1f Gmuladd/s\n",6.0*16*KC*reps/t/1e9);
  }
  return out[3]&1;
}
