/* The host target's custom C kernels (torch_tpu.kernels.c_op): compiled by the
 * system C compiler through the three-tier cache, run by one trampoline kernel
 * that hands the call to the user's entry function in the ABI of
 * tpu/kernel_abi.h. Private to the targets layer (runtime/targets/kernels.c). */
#ifndef TPU_TARGETS_HOST_CUSTOM_H_
#define TPU_TARGETS_HOST_CUSTOM_H_

#include <stddef.h>

#include "tpu/op.h"

/* A compiled kernel: what the op's tpu_op_custom_t.target_data points at. */
typedef struct tpu_host_kernel tpu_host_kernel_t;

/* Compiles (or finds in the cache) `source` with the ABI header included
 * first, loads it and resolves `entry`. cflags: extra compiler flags,
 * blank-separated, or NULL. On success *out_kernel is set (never freed), and
 * *out_tier is 0 when it was compiled now, else the cache tier it came from
 * (1, 2 or 3); *out_seconds is the compile's wall time. A compile error is
 * INVALID_ARGUMENT with the compiler's messages (file name `<file_name>`, the
 * user's line numbers); a missing entry is INVALID_ARGUMENT naming it;
 * no usable compiler is UNIMPLEMENTED. */
tpu_status_t tpu_host_kernel_compile(const char* op_name, const char* file_name,
                                     const char* source, const char* entry,
                                     const char* cflags, tpu_host_kernel_t** out_kernel,
                                     int* out_tier, double* out_seconds,
                                     char out_key[33]) TPU_MUST_USE;

/* The kernel of every custom C op: runs the op's compiled entry function on
 * the call (tpu_op_custom(call->op)->target_data). In Debug mode
 * (call->debug_checks) every tensor is staged in a copy between guard
 * regions: a write past an output's bounds, or into an input the op does not
 * declare as mutated, fails the call with a message naming the op. */
tpu_status_t tpu_host_kernel_run(const tpu_call_t* call);

#endif /* TPU_TARGETS_HOST_CUSTOM_H_ */
