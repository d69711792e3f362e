/* The pjrt target's program caches.
 *
 * Two tables with one implementation (pj_table_t: open addressing over a
 * 64-bit hash and the key's bytes, which the table owns):
 *
 *   module text -> executable: every composed module is compiled once per
 *       text and kept for the process;
 *   call key -> call plan: a graph keyed without printing it, so that a
 *       repeated Strict call or flushed trace skips composing its module
 *       and goes straight to its executable.
 *
 * A call key is the graph in canonical form: per node the op, argument
 * kinds and values, outputs, precision, Debug checks, mutated arguments and
 * visibility; per tensor its dtype, sizes, strides, flags and device, and
 * its address as (storage slot by first appearance, byte offset in the
 * storage, storage bytes, whether the storage holds a buffer yet). Memory
 * outside device memory is a host slot by first appearance; a CPU scalar is
 * its value (the printer embeds it as a constant). A floating number is a
 * host slot too (its address in the call), not its value: the printer reads
 * the numbers an op uses as values from parameters (lift_numbers), so one
 * program serves every learning rate; a number it held as a constant is in
 * the plan (baked), and a plan is used only where those values are the same
 * (pj_call_plan_matches; the key's other plans follow it, `next`). Two graphs with the same
 * key compose the same module with the same arguments up to the slots'
 * addresses, because the printer and the composer use addresses only for
 * equality, containment and overlap, which the canonical form keeps
 * (distinct storages never overlap; distinct host addresses closer than 8
 * bytes could, host values being 0-d, so such a graph is not keyed). A
 * random op's rng_seed and rng_offset are host slots too: the printer reads
 * them from parameters (lower/random.c), so repeated random calls share one
 * program.
 */
#ifndef TPU_TARGETS_PJRT_PROGCACHE_H_
#define TPU_TARGETS_PJRT_PROGCACHE_H_

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "exec/graph.h"
#include "targets/pjrt/compose.h"
#include "targets/pjrt/pjrt_client.h"
#include "targets/pjrt/storage.h"

typedef struct pj_table_entry {
  uint64_t hash; /* 0: empty */
  unsigned char* key;
  size_t len;
  void* value;
} pj_table_entry_t;

typedef struct pj_table {
  pj_table_entry_t* v;
  size_t n, cap; /* cap: a power of two */
} pj_table_t;

uint64_t pj_hash(const void* p, size_t n); /* never 0 */
void* pj_table_find(const pj_table_t* t, uint64_t h, const void* key, size_t len);
/* Adds (key, value); the table takes `key` (malloc'd) on success. False
 * when the host is out of memory (nothing is kept). */
bool pj_table_put(pj_table_t* t, uint64_t h, unsigned char* key, size_t len, void* value);
size_t pj_table_size(const pj_table_t* t);

typedef struct pj_call_key {
  unsigned char* bytes;
  size_t len, cap;
  uint64_t hash;
  pj_block_t* slots; /* the storages, by first appearance */
  int ns, slots_cap;
  const void** host; /* host addresses, by first appearance */
  int nh, host_cap;
  bool oom;
} pj_call_key_t;

/* Builds g's key into k (zeroed by the caller). False when the graph is not
 * keyed (host addresses that could overlap, host OOM); k is
 * to be freed either way. */
bool pj_call_key_build(const tpu_graph_t* g, pj_call_key_t* k);
void pj_call_key_free(pj_call_key_t* k);

/* How a keyed graph runs: its executable (owned by the text table), and
 * each execution argument and result by key slot. */
typedef struct pj_call_plan {
  tpu_pjrt_exe_t* exe;
  int nargs, nouts;
  int32_t* arg;       /* per argument: >= 0 a storage slot, < 0 host slot -1-arg */
  tpu_dtype_t* arg_dt; /* host arguments: the value's dtype */
  int32_t* out;       /* per result: the storage slot it replaces */
  int* out_arg;       /* per result: as pj_program_t.out_arg */
  int* out_donor;     /* per result: as pj_program_t.out_donor */
  int nbaked;
  int32_t* baked_slot; /* per number the text holds: its host slot */
  struct {
    size_t bytes;
    unsigned char v[16];
  } * baked_val;       /* and its value */
  pj_check_t* checks; /* as pj_program_t.checks */
  int nchecks;
  struct pj_call_plan* _Atomic next; /* the key's next plan (other baked values) */
} pj_call_plan_t;

/* The plan of a program composed for the graph keyed by k; NULL when an
 * argument or result is not one of k's slots, or on host OOM. */
pj_call_plan_t* pj_call_plan_make(const pj_call_key_t* k, const pj_program_t* prog, tpu_pjrt_exe_t* exe);
void pj_call_plan_free(pj_call_plan_t* p);
/* Whether the numbers p's program holds have the values k's graph passes. */
bool pj_call_plan_matches(const pj_call_plan_t* p, const pj_call_key_t* k);
/* The plan's arguments and results for the graph keyed by k (args has
 * plan->nargs entries, outs plan->nouts). */
void pj_call_plan_bind(const pj_call_plan_t* p, const pj_call_key_t* k, pj_arg_t* args, uintptr_t* outs);

#endif
