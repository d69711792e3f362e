/* TorchTPU runtime: the targets that this build contains, and the choice of
 * one at start-up (targets layer; see tpu/target.h for the interface).
 *
 * The program above the runtime (the PyTorch bridge when its library loads,
 * a C test at its start) calls tpu_targets_select_from_env() once before it
 * uses the runtime: the target named by TORCH_TPU_TARGET (unset or empty:
 * "host") is registered with tpu_target_set.
 */
#ifndef TPU_TARGETS_H_
#define TPU_TARGETS_H_

#include "tpu/target.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The target called `name`, NULL when this build has none by that name. */
const tpu_target_t* tpu_targets_find(const char* name);
/* The names of the targets this build has, comma-separated ("host"). */
const char* tpu_targets_known(void);
/* Registers the target called `name`. INVALID_ARGUMENT naming `name` and the
 * known targets when there is none; INVALID_ARGUMENT when another target was
 * registered before (the choice is made once). */
tpu_status_t tpu_targets_select(const char* name) TPU_MUST_USE;
/* tpu_targets_select(TORCH_TPU_TARGET, default "host"); the error names the
 * variable. */
tpu_status_t tpu_targets_select_from_env(void) TPU_MUST_USE;

/* The host target: the runtime's own CPU kernels and fusion compiler over
 * host memory (runtime/targets/host/). */
const tpu_target_t* tpu_host_target(void);
/* The pjrt target: the devices of a PJRT plugin (TORCH_TPU_PJRT_PLUGIN). */
const tpu_target_t* tpu_pjrt_target(void);
/* Its program statistics, counted since the process started. */
typedef struct tpu_pjrt_target_stats {
  int64_t compiles;  /* modules compiled by the plugin */
  int64_t loads;     /* modules whose executable came from the cache's tier 2 or 3 */
  int64_t hits;      /* modules found in the process's own table by their text */
  int64_t call_hits; /* graphs found by their call key, without composing a module */
  int64_t runs;      /* executions */
  int64_t donated;   /* input buffers runs gave to their results (in-place updates) */
  double compile_seconds; /* getting the compiled modules (cache lookup, compile, store) */
  double load_seconds;    /* getting the loaded ones (lookup, read, verify, deserialize) */
} tpu_pjrt_target_stats_t;
void tpu_pjrt_target_stats(tpu_pjrt_target_stats_t* out);
/* The compilation-cache key of the module text[0..len) on this process's
 * plugin, or (tests) under another platform name or version where those are
 * not NULL. Errors when the plugin did not open. */
tpu_status_t tpu_pjrt_target_cache_key(const char* text, size_t len, const char* platform,
                                       const char* version, char key[33]) TPU_MUST_USE;

#ifdef __cplusplus
}
#endif
#endif /* TPU_TARGETS_H_ */
