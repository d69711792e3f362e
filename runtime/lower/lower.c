/* The lowering tables: one per op family, each sorted by name, searched in
 * turn by binary search; the merged list (for tpu_lower_name and the check) is
 * walked by merging them. */
#include <string.h>

#include "lower/emit.h"

static const tpu_lower_table_t* const k_tables[] = {
    &tpu_lower_elementwise, &tpu_lower_shape, &tpu_lower_matmul,
    &tpu_lower_reduce,      &tpu_lower_nn,    &tpu_lower_index,  &tpu_lower_linalg, &tpu_lower_random,
};
#define NTABLES (sizeof k_tables / sizeof k_tables[0])

const tpu_lower_entry_t* tpu_lower_find(const char* base) {
  for (size_t t = 0; t < NTABLES; t++) {
    const tpu_lower_entry_t* v = k_tables[t]->entries;
    size_t lo = 0, hi = k_tables[t]->n;
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      int r = strcmp(base, v[mid].name);
      if (!r) return &v[mid];
      if (r < 0) hi = mid;
      else lo = mid + 1;
    }
  }
  return NULL;
}

bool tpu_lower_supports(const char* aten_name) {
  if (!aten_name) return false;
  char base[128];
  base_name(aten_name, base, sizeof base);
  return tpu_lower_find(base) != NULL;
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
    if (prev && strcmp(prev->name, x->name) >= 0) {
      if (out_name) *out_name = x->name;
      return k;
    }
    prev = x;
  }
  return 0;
}
