/* CPUID + XGETBV feature detection (see cpu.h). */
#include "base/cpu.h"

#include <pthread.h>
#include <stdint.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define TPU_CPU_X86 1
#endif

static tpu_cpu_features_t g_features;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

#ifdef TPU_CPU_X86
/* XCR0: the register state the OS saves across context switches. */
static uint64_t read_xcr0(void) {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return ((uint64_t)hi << 32) | lo;
}
#endif

static void detect(void) {
#ifdef TPU_CPU_X86
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return;
  const bool osxsave = (c & bit_OSXSAVE) != 0;
  const bool cpu_avx = (c & bit_AVX) != 0, cpu_fma = (c & bit_FMA) != 0;
  if (!osxsave) return; /* XGETBV itself is unavailable: no YMM/ZMM state */
  const uint64_t xcr0 = read_xcr0();
  const bool ymm = (xcr0 & 0x6) == 0x6;    /* SSE + AVX state */
  const bool zmm = (xcr0 & 0xe6) == 0xe6;  /* + opmask, ZMM_Hi256, Hi16_ZMM */
  unsigned b7 = 0, a71 = 0;
  if (__get_cpuid_max(0, NULL) >= 7) {
    unsigned a7, c7, d7;
    __cpuid_count(7, 0, a7, b7, c7, d7);
    if (a7 >= 1) { /* subleaf 1: EAX bit 5 is AVX512_BF16 */
      unsigned b71, c71, d71;
      __cpuid_count(7, 1, a71, b71, c71, d71);
      (void)b71, (void)c71, (void)d71;
    }
    (void)c7, (void)d7;
  }
  g_features.avx = ymm && cpu_avx;
  g_features.fma = ymm && cpu_avx && cpu_fma;
  g_features.avx2 = ymm && cpu_avx && (b7 & bit_AVX2);
  g_features.avx512f = zmm && (b7 & bit_AVX512F);
  g_features.avx512bw = g_features.avx512f && (b7 & bit_AVX512BW);
  g_features.avx512dq = g_features.avx512f && (b7 & bit_AVX512DQ);
  g_features.avx512vl = g_features.avx512f && (b7 & bit_AVX512VL);
  g_features.avx512bf16 = g_features.avx512f && (a71 & (1u << 5));
#endif
}

const tpu_cpu_features_t* tpu_cpu_features(void) {
  pthread_once(&g_once, detect);
  return &g_features;
}
