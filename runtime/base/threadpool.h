/* Kernel thread pool start-up (the pool's calls are public: tpu/parallel.h). */
#ifndef TPU_BASE_THREADPOOL_H_
#define TPU_BASE_THREADPOOL_H_

#include "tpu/parallel.h"

/* Starts the pool's threads (TORCH_TPU_NUM_THREADS, TORCH_TPU_POOL_SPIN_US);
 * called once by runtime start-up. */
void tpu_threadpool_init(void);

#endif /* TPU_BASE_THREADPOOL_H_ */
