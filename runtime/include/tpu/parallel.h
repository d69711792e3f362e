/* TorchTPU runtime: the kernel thread pool and a clock (base layer). */
#ifndef TPU_PARALLEL_H_
#define TPU_PARALLEL_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Runs fn(ctx, begin, end) over [0, n) split in chunks of at least `grain`
 * across the kernel thread pool; runs inline when n <= grain. */
void tpu_parallel_for(int64_t n, int64_t grain,
                      void (*fn)(void* ctx, int64_t begin, int64_t end), void* ctx);
int tpu_num_threads(void);
/* CLOCK_MONOTONIC in nanoseconds (spin budgets, timings, the kernel profile). */
int64_t tpu_now_ns(void);

#ifdef __cplusplus
}
#endif
#endif /* TPU_PARALLEL_H_ */
