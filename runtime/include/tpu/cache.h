/* TorchTPU runtime: the three-tier cache of compiled executables.
 *
 * Compiled executables are shared objects built by the system C compiler.
 * The caller computes a key (16..64 lowercase hex characters) from everything
 * that determines the executable (graph, shapes, dtypes, precision, ISA,
 * runtime version) and looks it up in three tiers:
 *
 *   tier 1  process memory: key -> the caller's loaded executable (void*).
 *   tier 2  machine-local directory shared by the processes of one host,
 *           /dev/shm/torch_tpu_cache/<name>/ (TORCH_TPU_TIER2_COMPILATION_CACHE:
 *           <name>, an absolute directory, or "disabled"; default "default").
 *   tier 3  persistent directory <root>/<TPU_RUNTIME_VERSION>/
 *           (TORCH_TPU_TIER3_COMPILATION_CACHE_ROOT: <root> or "disabled";
 *           default $XDG_CACHE_HOME/torch_tpu, else $HOME/.cache/torch_tpu).
 *
 * An entry file "<dir>/<key>.so" is the shared object followed by a 32-byte
 * trailer (payload length, 64-bit checksum of the payload, magic "TPUXCACH",
 * trailer version). ELF loaders ignore trailing bytes, so the entry file is
 * dlopen()ed as it is. Entries are published atomically (temporary file in the
 * same directory, then rename). A lookup verifies the trailer and checksum; a
 * truncated or corrupted entry is deleted, counted, and reported as a miss.
 *
 * Failures to write a tier (read-only or full file system, directory owned by
 * someone else, noexec mount for tier 2) never abort: that tier is skipped,
 * store_failures counts it, and one warning per tier is queued for
 * tpu_cache_pop_warning(). Everything is thread-safe; the environment is read
 * on first use and again by tpu_cache_reload_config().
 */
#ifndef TPU_CACHE_H_
#define TPU_CACHE_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tpu/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef TPU_RUNTIME_VERSION
#define TPU_RUNTIME_VERSION "0.1.0"
#endif

/* Key length bounds (lowercase hex digits). */
#define TPU_CACHE_KEY_MIN 16
#define TPU_CACHE_KEY_MAX 64

typedef struct tpu_cache_stats {
  int64_t tier1_hits, tier2_hits, tier3_hits, misses, compiles, corrupt_entries,
      store_failures;
  double compile_seconds;
} tpu_cache_stats_t;

/* True when key is 16..64 characters of [0-9a-f]. */
bool tpu_cache_key_valid(const char* key);

/* The 64-bit checksum of entry payloads (XXH64 with seed 0); callers may use
 * it to hash their key material too. */
uint64_t tpu_cache_hash64(const void* data, size_t len, uint64_t seed);

/* A 32-digit key naming `what` (the generated program) built under `how`
 * (everything else the executable depends on: compiler, flags, platform,
 * versions), as two independent 64-bit hashes of both. */
void tpu_cache_make_key(const void* what, size_t what_len, const char* how, char out[33]);

/* ---- tier 1 ---- */
/* The value stored under key, or NULL; counts a tier-1 hit when found. */
void* tpu_cache_tier1_get(const char* key);
/* Stores value under key (replacing an earlier value, which is not freed);
 * a NULL value removes the key. */
void tpu_cache_tier1_put(const char* key, void* value);

/* ---- tiers 2 and 3 ---- */
/* Looks in tier 2, then tier 3. On a verified hit writes the path of a
 * loadable file to path (cap bytes), the tier the entry was found in (2 or 3)
 * to *tier (may be NULL), counts that tier's hit and returns true. A tier-3
 * hit is first copied atomically into tier 2 when tier 2 is on and writable,
 * and then the tier-2 path is returned (*tier is still 3). Returns false on a
 * miss, an invalid key, or a path longer than cap; a miss is not counted
 * (see tpu_cache_note_miss). The payload checksum is seeded with the key, so
 * an entry copied under another key's name is rejected as corrupt. */
bool tpu_cache_find(const char* key, char* path, size_t cap, int* tier);

/* Publishes the shared object at src_path under key into tier 2 and tier 3
 * (each that is on and writable), appending the trailer, and writes to path a
 * loadable copy's path: tier 2 preferred, else tier 3, else src_path itself.
 * Errors only for an invalid key, an unreadable source, or cap too small; a
 * tier that cannot be written is counted and warned about, not an error. */
tpu_status_t tpu_cache_publish(const char* key, const char* src_path, char* path,
                               size_t cap) TPU_MUST_USE;

/* The same two calls for entries that are data rather than shared objects
 * (serialized PJRT executables): tpu_cache_find_bytes returns a verified
 * hit's payload, without the trailer, in *data (malloc()ed; the caller frees
 * it) and its length in *len, counting the hit and promoting a tier-3 entry as
 * tpu_cache_find does. tpu_cache_publish_bytes stores len bytes at data under
 * key as tpu_cache_publish stores a file; it errors only for an invalid key or
 * an empty payload. */
bool tpu_cache_find_bytes(const char* key, void** data, size_t* len, int* tier);
tpu_status_t tpu_cache_publish_bytes(const char* key, const void* data,
                                     size_t len) TPU_MUST_USE;

/* A store that failed before reaching the tiers (the executable could not be
 * serialized): counted in store_failures, the message queued for
 * tpu_cache_pop_warning(). Callers warn once per cause. */
void tpu_cache_note_store_failure(const char* fmt, ...) TPU_PRINTF(1, 2);

/* Per-key inter-process lock: flock() on "<dir>/<key>.lock" in the tier-2
 * directory, else tier 3. Blocks while another process (or another thread of
 * this one) holds the key. Returns a handle, or -1 when no tier directory is
 * usable or the key is invalid (then compile without a lock). */
int tpu_cache_lock(const char* key);
/* tpu_cache_lock with a bound on the wait: timeout_ms < 0 waits as long as
 * it takes; otherwise TPU_CACHE_LOCK_BUSY when another holder kept the key
 * that long (a holder whose compile hangs). A lock whose holder died is
 * released by the kernel. */
#define TPU_CACHE_LOCK_BUSY (-2)
int tpu_cache_lock_wait(const char* key, int64_t timeout_ms);
void tpu_cache_unlock(int handle);

/* Deletes key's entries from tiers 2 and 3 (an entry that verified but does
 * not load, e.g. a broken compiler's output); counts each as corrupt. */
void tpu_cache_drop(const char* key);

/* ---- statistics ---- */
void tpu_cache_note_miss(void);
void tpu_cache_note_compile(double seconds);
void tpu_cache_get_stats(tpu_cache_stats_t* out);
void tpu_cache_reset_stats(void);

/* Clears tier 1, 2 or 3 (0: all). Tier 1 drops its map (values are not
 * freed). Tiers 2 and 3 delete the entry files of this module ("<key>.so")
 * and temporary files left by processes that no longer run; lock files stay
 * (deleting them would break the mutual exclusion of waiting processes). */
tpu_status_t tpu_cache_clear(int tier) TPU_MUST_USE;

/* The directory tier 2 or 3 uses, or NULL when that tier is off (disabled, or
 * found unusable). Valid until the next tpu_cache_reload_config(). */
const char* tpu_cache_dir(int tier);

/* The next queued warning, or NULL. The text stays valid until this thread's
 * next call. */
const char* tpu_cache_pop_warning(void);

/* Re-reads the environment variables; queues warnings afresh. Not meant to
 * race with lookups in other threads (tests call it between phases). */
void tpu_cache_reload_config(void);

#ifdef __cplusplus
}
#endif
#endif /* TPU_CACHE_H_ */
