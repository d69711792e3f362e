/* Measured float32 FMA peak of this machine: every thread runs a register-
 * resident loop of independent 256-bit fused multiply-adds (AVX2+FMA), or
 * 512-bit ones with --avx512, or AVX-512 BF16 two-step dot products
 * (VDPBF16PS: two bfloat16 multiply-adds into each float32 lane, the
 * instruction the host target's matrix unit uses for one-bfloat16-pass
 * products at precision medium where the CPU has it) with --bf16dot. Prints
 * GFLOP/s (2 flops per multiply-add) summed over threads. Built and run by
 * bench/gemm.py and bench/peak.py:
 *
 *     gcc -O2 -mavx2 -mfma -pthread bench/fma_peak.c -o fma_peak
 *     ./fma_peak [threads] [seconds] [--avx512 | --bf16dot]
 */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { CHAINS = 12, ITERS = 1 << 20 };

typedef struct {
  double seconds;
  double flops;
  int avx512; /* 1: 512-bit FMAs, 2: bfloat16 dot products */
  float sink;
} worker_t;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* CHAINS independent accumulators hide the FMA latency; the multiplier and
 * addend stay in registers, so the loop issues nothing but FMAs. */
static float run_avx2(long iters) {
  __m256 acc[CHAINS];
#pragma GCC unroll 12
  for (int i = 0; i < CHAINS; i++) acc[i] = _mm256_set1_ps((float)i);
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  for (long it = 0; it < iters; it++) {
#pragma GCC unroll 12
    for (int i = 0; i < CHAINS; i++) acc[i] = _mm256_fmadd_ps(acc[i], x, y);
  }
  float s = 0;
#pragma GCC unroll 12
  for (int i = 0; i < CHAINS; i++) s += acc[i][0];
  return s;
}

__attribute__((target("avx512f"))) static float run_avx512(long iters) {
  __m512 acc[CHAINS];
#pragma GCC unroll 12
  for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_set1_ps((float)i);
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-7f);
  for (long it = 0; it < iters; it++) {
#pragma GCC unroll 12
    for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_fmadd_ps(acc[i], x, y);
  }
  float s = 0;
#pragma GCC unroll 12
  for (int i = 0; i < CHAINS; i++) s += acc[i][0];
  return s;
}

__attribute__((target("avx512f,avx512bf16"))) static float run_bf16dot(long iters) {
  __m512 acc[CHAINS];
#pragma GCC unroll 12
  for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_set1_ps((float)i);
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3380);
  for (long it = 0; it < iters; it++) {
#pragma GCC unroll 12
    for (int i = 0; i < CHAINS; i++) acc[i] = _mm512_dpbf16_ps(acc[i], x, y);
  }
  float s = 0;
#pragma GCC unroll 12
  for (int i = 0; i < CHAINS; i++) s += acc[i][0];
  return s;
}

static void* worker(void* arg) {
  worker_t* w = arg;
  /* multiply-adds per instruction */
  int lanes = w->avx512 == 2 ? 32 : w->avx512 ? 16 : 8;
  double start = now(), t = 0;
  long done = 0;
  while ((t = now() - start) < w->seconds) {
    w->sink += w->avx512 == 2 ? run_bf16dot(ITERS / 16)
               : w->avx512   ? run_avx512(ITERS / 16)
                             : run_avx2(ITERS / 16);
    done += ITERS / 16;
  }
  w->flops = (double)done * CHAINS * lanes * 2 / t;
  return NULL;
}

int main(int argc, char** argv) {
  long threads = sysconf(_SC_NPROCESSORS_ONLN);
  double seconds = 1.0;
  int avx512 = 0;
  int pos = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--avx512") == 0) avx512 = 1;
    else if (strcmp(argv[i], "--bf16dot") == 0) avx512 = 2;
    else if (pos++ == 0) threads = atol(argv[i]);
    else seconds = atof(argv[i]);
  }
  if (threads < 1) threads = 1;
  worker_t* w = calloc((size_t)threads, sizeof *w);
  pthread_t* tid = calloc((size_t)threads, sizeof *tid);
  if (!w || !tid) return 1;
  for (long i = 0; i < threads; i++) {
    w[i].seconds = seconds;
    w[i].avx512 = avx512;
    pthread_create(&tid[i], NULL, worker, &w[i]);
  }
  double total = 0;
  for (long i = 0; i < threads; i++) {
    pthread_join(tid[i], NULL);
    total += w[i].flops;
  }
  printf("%.1f\n", total / 1e9);
  return 0;
}
