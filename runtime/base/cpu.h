/* Host CPU features: one detector for every ISA choice in the runtime.
 *
 * A feature counts only when CPUID lists it AND the operating system saves
 * the register state it needs (XGETBV: XCR0 bits 1-2 for YMM, bits 5-7 for
 * the AVX-512 opmask and ZMM registers); without the OS support the
 * instructions fault even where CPUID lists them.
 */
#ifndef TPU_BASE_CPU_H_
#define TPU_BASE_CPU_H_

#include <stdbool.h>

typedef struct tpu_cpu_features {
  bool avx;      /* AVX, YMM state saved */
  bool avx2;     /* AVX2, YMM state saved */
  bool fma;      /* FMA3, YMM state saved */
  bool avx512f;  /* AVX-512 Foundation, ZMM and opmask state saved */
  bool avx512bw; /* byte and word instructions */
  bool avx512dq; /* doubleword and quadword instructions */
  bool avx512vl; /* 128/256-bit forms of the AVX-512 instructions */
  bool avx512bf16; /* bfloat16 dot products and conversions (VDPBF16PS) */
} tpu_cpu_features_t;

/* The features of the CPU running the process, detected on first call; all
 * false on other architectures than x86. Thread-safe; never NULL. */
const tpu_cpu_features_t* tpu_cpu_features(void);

#endif /* TPU_BASE_CPU_H_ */
