/* The lowering tables: one per op family, each sorted by name. Their names are
 * resolved to op ids once (tpu/op.h), into an array indexed by id that the
 * printer dispatches through; the merged list (for tpu_lower_name and the
 * check) is walked by merging the tables. */
#include <pthread.h>
#include <string.h>

#include "lower/emit.h"

static const tpu_lower_table_t* const k_tables[] = {
    &tpu_lower_elementwise, &tpu_lower_shape, &tpu_lower_matmul,
    &tpu_lower_reduce,      &tpu_lower_nn,    &tpu_lower_index,  &tpu_lower_linalg,
    &tpu_lower_special,     &tpu_lower_random, &tpu_lower_fft,
};
#define NTABLES (sizeof k_tables / sizeof k_tables[0])

/* entry by op id, built once; an entry whose name has no id is left out (and
 * makes tpu_lower_check fail) */
static const tpu_lower_entry_t* g_by_id[TPU_OPID_COUNT];
static pthread_once_t g_by_id_once = PTHREAD_ONCE_INIT;

static void build_by_id(void) {
  for (size_t t = 0; t < NTABLES; t++)
    for (size_t k = 0; k < k_tables[t]->n; k++) {
      const tpu_op_id_t id = tpu_op_id_lookup(k_tables[t]->entries[k].name);
      if (id != TPU_OPID_NONE && !g_by_id[id]) g_by_id[id] = &k_tables[t]->entries[k];
    }
}

const tpu_lower_entry_t* tpu_lower_find_id(tpu_op_id_t id) {
  if (id <= TPU_OPID_NONE || id >= TPU_OPID_COUNT) return NULL;
  pthread_once(&g_by_id_once, build_by_id);
  return g_by_id[id];
}

const tpu_lower_entry_t* tpu_lower_find(const char* base) {
  return tpu_lower_find_id(tpu_op_id_lookup(base));
}

bool tpu_lower_supports(const char* aten_name) {
  if (!aten_name) return false;
  /* a base name as the tables spell it ("__lshift_", whose ATen name ends in "__") as is */
  return tpu_lower_find_id(tpu_op_id_of(aten_name)) != NULL || tpu_lower_find(aten_name) != NULL;
}

/* The next entry of the merged walk: the least head among the tables. */
static const tpu_lower_entry_t* merged_next(size_t* pos) {
  size_t best = NTABLES;
  for (size_t t = 0; t < NTABLES; t++) {
    if (pos[t] >= k_tables[t]->n) continue;
    if (best == NTABLES || strcmp(k_tables[t]->entries[pos[t]].name, k_tables[best]->entries[pos[best]].name) < 0)
      best = t;
  }
  if (best == NTABLES) return NULL;
  return &k_tables[best]->entries[pos[best]++];
}

size_t tpu_lower_count(void) {
  size_t n = 0;
  for (size_t t = 0; t < NTABLES; t++) n += k_tables[t]->n;
  return n;
}

const char* tpu_lower_name(size_t i) {
  size_t pos[NTABLES] = {0};
  const tpu_lower_entry_t* x = NULL;
  for (size_t k = 0; k <= i; k++)
    if (!(x = merged_next(pos))) return NULL;
  return x->name;
}

int tpu_lower_check(const char** out_name) {
  for (size_t t = 0; t < NTABLES; t++)
    for (size_t k = 1; k < k_tables[t]->n; k++)
      if (strcmp(k_tables[t]->entries[k - 1].name, k_tables[t]->entries[k].name) >= 0) {
        if (out_name) *out_name = k_tables[t]->entries[k].name;
        return (int)k + 1;
      }
  size_t pos[NTABLES] = {0};
  const tpu_lower_entry_t *prev = NULL, *x;
  for (int k = 1; (x = merged_next(pos)); k++) {
    if ((prev && strcmp(prev->name, x->name) >= 0) || tpu_lower_find_id(tpu_op_id_lookup(x->name)) != x) {
      if (out_name) *out_name = x->name;
      return k;
    }
    prev = x;
  }
  return 0;
}
