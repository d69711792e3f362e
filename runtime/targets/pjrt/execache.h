/* The pjrt target's executables in the compilation cache (tpu/cache.h).
 *
 * The target's text table (progcache.h) is tier 1: a module compiled once
 * stays loaded for the process. Below it, tiers 2 and 3 hold serialized
 * PJRT executables (PJRT_Executable_Serialize) under a key of the module
 * text, the plugin's platform name and version, its PJRT C API version, the
 * kind of its first device, the compile options and the runtime version, so
 * that another process (or the next run) loads the executable instead of
 * compiling it. Entries carry the cache's checksummed trailer; an entry that
 * is corrupt or that the plugin will not load is dropped, counted
 * (corrupt_entries) and compiled again. A process compiling a key holds the
 * cache's lock on it, so processes starting together compile it once.
 * Failing to store (a plugin without serialization, a full disk) is a
 * warning of the cache (tpu_cache_pop_warning), never an error of the op.
 */
#ifndef TPU_TARGETS_PJRT_EXECACHE_H_
#define TPU_TARGETS_PJRT_EXECACHE_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "targets/pjrt/pjrt_client.h"
#include "tpu/status.h"

/* Everything besides the module text that the key of an executable holds. */
typedef struct pj_exe_ident {
  const char* platform; /* the plugin's platform name ("cpu", "tpu", "cuda") */
  const char* version;  /* the plugin's platform version */
  int api_major, api_minor; /* its PJRT C API version */
  const char* device_kind;  /* the kind of its first device */
  uint64_t options_hash;    /* of the serialized compile options */
} pj_exe_ident_t;

/* The identity of client's executables (its strings are the client's). */
void pj_exe_ident_of(tpu_pjrt_t* client, pj_exe_ident_t* out);

/* The cache key (32 hex digits) of module text[0..len) compiled under id,
 * with the runtime version; a NULL string of id counts as "". */
void pj_exe_cache_key(const pj_exe_ident_t* id, const char* text, size_t len, char key[33]);

/* The executable of the module text[0..len): loaded from tier 2 or 3, else
 * compiled (and stored); *compiled tells which. Errors are the compiler's. */
tpu_status_t pj_exe_load_or_compile(tpu_pjrt_t* client, const char* text, size_t len,
                                    tpu_pjrt_exe_t** out, bool* compiled) TPU_MUST_USE;

#endif /* TPU_TARGETS_PJRT_EXECACHE_H_ */
