/* TorchTPU runtime: user kernels registered as ops at run time (targets
 * layer; the Python face is torch_tpu.kernels).
 *
 * A kernel is C source for the host target (the ABI of tpu/kernel_abi.h) or
 * StableHLO for a target that lowers graphs to StableHLO (pjrt). Defining
 * one compiles it where that applies (C: the system compiler, through the
 * three-tier cache, keyed by the source) and registers an op under its name
 * (tpu_op_register), so calls to it are ordinary calls: queued on streams,
 * traced in DeferAndFuse graphs as nodes of their own, run by the target.
 */
#ifndef TPU_KERNELS_H_
#define TPU_KERNELS_H_

#include <stddef.h>

#include "tpu/op.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tpu_kernel_lang {
  TPU_KERNEL_C = 0,         /* C source with an entry function (host target) */
  TPU_KERNEL_STABLEHLO = 1, /* func.func definitions (pjrt target) */
} tpu_kernel_lang_t;

/* What defines a kernel (zero-initialisable; every string is copied). */
typedef struct tpu_kernel_desc {
  const char* name;   /* the op's name, "mylib::scaled_add" */
  tpu_kernel_lang_t lang;
  const char* source; /* C: the translation unit; StableHLO: private func.func definitions */
  const char* entry;  /* C: the entry function; StableHLO: the symbol of the function called */
  const char* cflags; /* C: extra compiler flags, blank-separated; NULL: none */
} tpu_kernel_desc_t;

typedef struct tpu_kernel_info {
  int cache_tier;         /* C: 0 compiled now, 1..3 found in that cache tier; -1 no compile */
  double compile_seconds; /* C: getting the executable (lookup, compile, load) */
  char key[33];           /* C: its cache key; "" otherwise */
} tpu_kernel_info_t;

/* Defines a kernel and registers its op (*out_op, never freed). Errors:
 * INVALID_ARGUMENT for a compile error (the compiler's messages, with the
 * user's line numbers), a missing entry, or a name already taken;
 * UNIMPLEMENTED when the registered target cannot run the kernel's language
 * (C needs the host target, StableHLO a lowering target) or no compiler runs. */
tpu_status_t tpu_kernel_define(const tpu_kernel_desc_t* desc, const tpu_op_t** out_op,
                               tpu_kernel_info_t* out_info) TPU_MUST_USE;

/* The ABI header user C kernels include (its text, and its file name
 * "torch_tpu_kernel.h"). */
const char* tpu_kernel_abi_header(size_t* out_len, const char** out_name);

#ifdef __cplusplus
}
#endif
#endif /* TPU_KERNELS_H_ */
