/* TorchTPU runtime: the Philox4x32-10 counter-based generator (Salmon,
 * Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3",
 * SC 2011) and the counter contract between the bridge and random kernels.
 *
 * Contract: an op flagged TPU_OP_RANDOM receives call->rng_seed and
 * call->rng_offset. Element i of its output (row-major logical index) uses
 * the block with key = rng_seed and counter = (rng_offset + i) in the low 64
 * bits, 0 in the high 64 bits; it may consume the block's 4 words. After the
 * call the bridge advances the generator's offset by
 * tpu_random_counters_used(numel(output)). Results depend only on the seed,
 * the offset and i, never on how the work is split across threads.
 */
#ifndef TPU_PHILOX_H_
#define TPU_PHILOX_H_

#include <math.h>
#include <stdint.h>

#include "tpu/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpu_philox_block {
  uint32_t w[4];
} tpu_philox_block_t;

/* Philox4x32-10 of the 128-bit counter (ctr_hi:ctr_lo) under a 64-bit key;
 * word 0 of the counter is the lowest 32 bits of ctr_lo, word 0 of the key
 * the lowest 32 bits of key. */
static inline tpu_philox_block_t tpu_philox4x32_10(uint64_t ctr_lo, uint64_t ctr_hi,
                                                   uint64_t key) {
  const uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u; /* round multipliers */
  const uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u; /* key schedule */
  uint32_t c0 = (uint32_t)ctr_lo, c1 = (uint32_t)(ctr_lo >> 32);
  uint32_t c2 = (uint32_t)ctr_hi, c3 = (uint32_t)(ctr_hi >> 32);
  uint32_t k0 = (uint32_t)key, k1 = (uint32_t)(key >> 32);
  for (int round = 0; round < 10; round++) {
    if (round > 0) {
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    uint64_t p0 = (uint64_t)kMul0 * c0, p1 = (uint64_t)kMul1 * c2;
    uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
    uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
  }
  tpu_philox_block_t b;
  b.w[0] = c0;
  b.w[1] = c1;
  b.w[2] = c2;
  b.w[3] = c3;
  return b;
}

/* The block for output element i of a call with this seed and offset. */
static inline tpu_philox_block_t tpu_philox_element(uint64_t seed, uint64_t offset, int64_t i) {
  return tpu_philox4x32_10(offset + (uint64_t)i, 0, seed);
}

/* Counters a random op consumes for an output of numel elements: the amount
 * by which the bridge advances the generator's offset after the call. */
static inline uint64_t tpu_random_counters_used(int64_t numel) {
  return numel > 0 ? (uint64_t)numel : 0;
}

/* random_: the values dt can hold, as doubles (floats: lowest .. max) */
static inline void tpu_random_dtype_bounds(tpu_dtype_t dt, double* lo, double* hi) {
  switch (dt) {
    case TPU_BOOL: *lo = 0; *hi = 1; break;
    case TPU_U8: *lo = 0; *hi = 255; break;
    case TPU_I8: *lo = -128; *hi = 127; break;
    case TPU_I16: *lo = -32768; *hi = 32767; break;
    case TPU_I32: *lo = -2147483648.0; *hi = 2147483647.0; break;
    case TPU_I64: *lo = -0x1p63; *hi = 0x1p63; break;
    case TPU_F16: *lo = -65504; *hi = 65504; break;
    case TPU_BF16: *lo = -0x1.fep127; *hi = 0x1.fep127; break;
    case TPU_F32: *lo = -0x1.fffffep127; *hi = 0x1.fffffep127; break;
    default: *lo = -INFINITY; *hi = INFINITY; break;
  }
}

/* random_ without `to`: the largest value it draws, 2^digits for floats (every
 * integer up to it is exact), the dtype's maximum for integers */
static inline int64_t tpu_random_default_to_inc(tpu_dtype_t dt) {
  switch (dt) {
    case TPU_BOOL: return 1;
    case TPU_U8: return 255;
    case TPU_I8: return 127;
    case TPU_I16: return 32767;
    case TPU_I32: return 2147483647;
    case TPU_I64: return INT64_MAX;
    case TPU_F64: return (int64_t)1 << 53;
    case TPU_F32: return (int64_t)1 << 24;
    case TPU_F16: return (int64_t)1 << 11;
    default: return (int64_t)1 << 8; /* bfloat16 */
  }
}

#ifdef __cplusplus
}
#endif
#endif /* TPU_PHILOX_H_ */
