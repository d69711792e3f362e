/* Sorting and selection along a dimension: sort, topk, kthvalue, median,
 * nanmedian and mode.
 *
 * Every element maps to an unsigned 64-bit key whose order is PyTorch's value
 * order (NaN above +inf, -0.0 tied with +0.0, integers by value). A slice is
 * loaded as (key, index) items. Stable sorts and the selections order them by
 * key, then by index: a total order, so equal values keep their original
 * order. sort(stable=False) orders by key alone with the introsort that
 * PyTorch's CPU kernel runs (the C++ library's std::sort scheme), so that
 * equal values come out in the same order as on CPU. Descending orders
 * invert the key, which puts NaN first. Independent slices run in parallel.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "kernels.h"

typedef struct {
  uint64_t key;
  int64_t idx;
} item_t;

#define KEY_NAN UINT64_MAX /* key of every float NaN */

static uint64_t key_of(const char* p, tpu_dtype_t dt) {
  if (tpu_dtype_is_float(dt)) {
    double v = tpu_load_f64(p, dt);
    if (v != v) return KEY_NAN;
    if (v == 0) v = 0; /* -0.0 ties with +0.0 */
    uint64_t u;
    memcpy(&u, &v, 8);
    /* sign-magnitude to an unsigned order: flip negatives, lift positives */
    return (u >> 63) ? ~u : (u | (1ull << 63));
  }
  /* uint64 loads as its bits, already in unsigned order; the other integers
   * (uint16 / uint32 included) fit int64: lift them by the sign bit */
  if (dt == TPU_U64) return (uint64_t)tpu_load_i64(p, dt);
  return (uint64_t)tpu_load_i64(p, dt) ^ (1ull << 63);
}

static inline bool item_less(item_t a, item_t b) {
  return a.key < b.key || (a.key == b.key && a.idx < b.idx);
}

static void insertion_sort(item_t* a, int64_t n) {
  for (int64_t i = 1; i < n; i++) {
    item_t x = a[i];
    int64_t j = i;
    for (; j > 0 && item_less(x, a[j - 1]); j--) a[j] = a[j - 1];
    a[j] = x;
  }
}

static void merge(const item_t* l, int64_t nl, const item_t* r, int64_t nr, item_t* dst) {
  int64_t i = 0, j = 0, o = 0;
  while (i < nl && j < nr) dst[o++] = item_less(r[j], l[i]) ? r[j++] : l[i++];
  while (i < nl) dst[o++] = l[i++];
  while (j < nr) dst[o++] = r[j++];
}

/* Bottom-up merge sort of a[0..n) with scratch tmp[0..n). */
static void sort_items(item_t* a, item_t* tmp, int64_t n) {
  const int64_t run = 32;
  for (int64_t b = 0; b < n; b += run) insertion_sort(a + b, n - b < run ? n - b : run);
  item_t *src = a, *dst = tmp;
  for (int64_t w = run; w < n; w *= 2) {
    for (int64_t lo = 0; lo < n; lo += 2 * w) {
      int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
      merge(src + lo, mid - lo, src + mid, hi - mid, dst + lo);
    }
    item_t* t = src;
    src = dst;
    dst = t;
  }
  if (src != a) memcpy(a, src, (size_t)n * sizeof(item_t));
}

static inline void swap_items(item_t* a, item_t* b) {
  item_t t = *a;
  *a = *b;
  *b = t;
}

/* ---- unstable sort by key alone ----
 * Introsort: median-of-three quicksort down to runs of INTRO_RUN items,
 * heapsort for a range once the depth budget (2 log2 n) is spent, then one
 * insertion pass over the whole slice. Each step (pivot choice, partition,
 * heap layout, insertion) follows the scheme of the C++ library's std::sort
 * that PyTorch's CPU sort uses, which fixes where equal keys end up. */
enum { INTRO_RUN = 16 };

static inline bool key_less(item_t a, item_t b) { return a.key < b.key; }

/* Moves the median of a, b and c to *result. */
static void median_to_first(item_t* result, item_t* a, item_t* b, item_t* c) {
  if (key_less(*a, *b)) {
    if (key_less(*b, *c)) swap_items(result, b);
    else if (key_less(*a, *c)) swap_items(result, c);
    else swap_items(result, a);
  } else if (key_less(*a, *c)) {
    swap_items(result, a);
  } else if (key_less(*b, *c)) {
    swap_items(result, c);
  } else {
    swap_items(result, b);
  }
}

/* Partitions [lo, hi) around *pivot (outside the range, before it); the
 * range holds an item >= and one <= the pivot, so the scans need no bounds. */
static item_t* partition_around(item_t* lo, item_t* hi, const item_t* pivot) {
  for (;;) {
    while (key_less(*lo, *pivot)) lo++;
    hi--;
    while (key_less(*pivot, *hi)) hi--;
    if (!(lo < hi)) return lo;
    swap_items(lo, hi);
    lo++;
  }
}

/* Sifts `value` into the max-heap a[0..len) from position `hole` down: the
 * hole moves to a leaf along larger children, then value rises from there. */
static void heap_adjust(item_t* a, int64_t hole, int64_t len, item_t value) {
  const int64_t top = hole;
  int64_t child = hole;
  while (child < (len - 1) / 2) {
    child = 2 * (child + 1);
    if (key_less(a[child], a[child - 1])) child--;
    a[hole] = a[child];
    hole = child;
  }
  if ((len & 1) == 0 && child == (len - 2) / 2) {
    child = 2 * (child + 1);
    a[hole] = a[child - 1];
    hole = child - 1;
  }
  int64_t parent = (hole - 1) / 2;
  while (hole > top && key_less(a[parent], value)) {
    a[hole] = a[parent];
    hole = parent;
    parent = (hole - 1) / 2;
  }
  a[hole] = value;
}

static void heap_make(item_t* a, int64_t len) {
  if (len < 2) return;
  for (int64_t parent = (len - 2) / 2;; parent--) {
    heap_adjust(a, parent, len, a[parent]);
    if (parent == 0) break;
  }
}

/* Moves the heap's top a[0] to *out and re-heaps a[0..len) with *out's item. */
static void heap_pop(item_t* a, int64_t len, item_t* out) {
  item_t v = *out;
  *out = a[0];
  heap_adjust(a, 0, len, v);
}

/* Sorts a heap a[0..len) in place. */
static void heap_unwind(item_t* a, int64_t len) {
  for (; len > 1; len--) heap_pop(a, len - 1, a + len - 1);
}

/* Leaves the mid smallest of a[0..n) in a[0..mid) as a heap. */
static void heap_select(item_t* a, int64_t mid, int64_t n) {
  heap_make(a, mid);
  for (int64_t i = mid; i < n; i++)
    if (key_less(a[i], a[0])) heap_pop(a, mid, a + i);
}

static void heap_sort(item_t* a, int64_t n) {
  heap_make(a, n);
  heap_unwind(a, n);
}

static void intro_loop(item_t* lo, item_t* hi, int depth) {
  while (hi - lo > INTRO_RUN) {
    if (depth == 0) {
      heap_sort(lo, hi - lo);
      return;
    }
    depth--;
    median_to_first(lo, lo + 1, lo + (hi - lo) / 2, hi - 1);
    item_t* cut = partition_around(lo + 1, hi, lo);
    intro_loop(cut, hi, depth);
    hi = cut;
  }
}

/* Inserts *p into the sorted run before it; an item not above it stops the
 * scan, so the caller makes sure one exists. */
static void insert_unguarded(item_t* p) {
  item_t v = *p;
  for (; key_less(v, p[-1]); p--) *p = p[-1];
  *p = v;
}

static void insertion_by_key(item_t* a, int64_t n) {
  for (int64_t i = 1; i < n; i++) {
    if (key_less(a[i], a[0])) {
      item_t v = a[i];
      memmove(a + 1, a, (size_t)i * sizeof(item_t));
      a[0] = v;
    } else {
      insert_unguarded(a + i);
    }
  }
}

static int floor_log2(int64_t n) {
  int lg = 0;
  while ((n >> (lg + 1)) > 0) lg++;
  return lg;
}

static void intro_sort(item_t* a, int64_t n) {
  if (n < 2) return;
  intro_loop(a, a + n, 2 * floor_log2(n));
  if (n > INTRO_RUN) {
    insertion_by_key(a, INTRO_RUN);
    for (int64_t i = INTRO_RUN; i < n; i++) insert_unguarded(a + i);
  } else {
    insertion_by_key(a, n);
  }
}

/* Puts into a[nth] the item sorting by key would put there, no greater key
 * before it, no smaller after (introselect, the library's nth_element). */
static void intro_select(item_t* a, int64_t n, int64_t nth) {
  if (n == 0 || nth >= n) return;
  item_t *lo = a, *hi = a + n, *pn = a + nth;
  int depth = 2 * floor_log2(n);
  while (hi - lo > 3) {
    if (depth == 0) {
      heap_select(lo, pn - lo + 1, hi - lo);
      swap_items(lo, pn);
      return;
    }
    depth--;
    median_to_first(lo, lo + 1, lo + (hi - lo) / 2, hi - 1);
    item_t* cut = partition_around(lo + 1, hi, lo);
    if (cut <= pn) lo = cut;
    else hi = cut;
  }
  insertion_by_key(lo, hi - lo);
}

/* The k first items by key in a[0..k), the way PyTorch's CPU topk picks
 * them: a heap for k at most 1/64 of the slice, else nth-element selection
 * and (sorted) a sort of the k - 1 before it. */
static void top_k(item_t* a, int64_t n, int64_t k, bool sorted) {
  if (k * 64 <= n) {
    heap_select(a, k, n);
    heap_unwind(a, k);
  } else {
    intro_select(a, n, k - 1);
    if (sorted) intro_sort(a, k - 1);
  }
}

/* kthvalue's selection on CPU: a quickselect whose pivot is the median of
 * the first, middle and last items, moved to the front; a[k] ends up with
 * the k-th smallest key (0-based). */
static void quick_select(item_t* a, int64_t n, int64_t k) {
  int64_t lo = 0, hi = n - 1;
  for (;;) {
    if (hi <= lo) return;
    if (hi == lo + 1) {
      if (key_less(a[hi], a[lo])) swap_items(&a[lo], &a[hi]);
      return;
    }
    swap_items(&a[lo + (hi - lo) / 2], &a[lo + 1]);
    if (key_less(a[hi], a[lo + 1])) swap_items(&a[lo + 1], &a[hi]);
    if (key_less(a[hi], a[lo])) swap_items(&a[lo], &a[hi]);
    if (key_less(a[lo], a[lo + 1])) swap_items(&a[lo + 1], &a[lo]);
    int64_t i = lo + 1, j = hi;
    const uint64_t pivot = a[lo].key;
    for (;;) {
      do i++;
      while (a[i].key < pivot);
      do j--;
      while (a[j].key > pivot);
      if (j < i) break;
      swap_items(&a[i], &a[j]);
    }
    swap_items(&a[lo], &a[j]);
    if (j <= k) lo = i;
    if (j >= k) hi = j - 1;
  }
}

/* Reorders a[0..n) so that a[nth] holds the item sorting would put there,
 * with no greater item before it and no smaller one after it (quickselect
 * with median-of-three pivots; sorts what is left after too many rounds). */
static void select_nth(item_t* a, item_t* tmp, int64_t n, int64_t nth) {
  int64_t lo = 0, hi = n - 1;
  for (int rounds = 0; hi - lo > 32 && rounds < 64; rounds++) {
    int64_t mid = lo + (hi - lo) / 2;
    if (item_less(a[mid], a[lo])) swap_items(&a[mid], &a[lo]);
    if (item_less(a[hi], a[lo])) swap_items(&a[hi], &a[lo]);
    if (item_less(a[hi], a[mid])) swap_items(&a[hi], &a[mid]);
    item_t pivot = a[mid];
    int64_t i = lo, j = hi;
    while (i <= j) {
      while (item_less(a[i], pivot)) i++;
      while (item_less(pivot, a[j])) j--;
      if (i <= j) swap_items(&a[i++], &a[j--]);
    }
    if (nth <= j) hi = j;
    else if (nth >= i) lo = i;
    else return; /* a[nth] is the pivot itself */
  }
  sort_items(a + lo, tmp, hi - lo + 1);
}

/* ---- slice geometry ---- */
typedef enum { K_SORT, K_TOPK, K_KTHVALUE, K_MEDIAN, K_MODE } kind_t;

typedef struct {
  char* data;
  int64_t outer[TPU_MAX_DIMS]; /* element strides over the outer index space */
  int64_t along;               /* element stride along the dimension */
} view_t;

typedef struct {
  kind_t kind;
  tpu_dtype_t dt;
  size_t esz;
  int64_t n;       /* slice length */
  int64_t k;       /* topk / kthvalue */
  bool descending; /* sort / topk(largest) */
  bool stable;     /* sort: equal values keep their order */
  bool sorted;     /* topk: the k results in order */
  bool ignore_nan; /* nanmedian */
  int nouter;
  int64_t outer_sizes[TPU_MAX_DIMS];
  int64_t nslices;
  view_t in, values, indices;
  bool has_indices;
  _Atomic int oom;
} job_t;

/* Describes output `t` over the job's slices. An output either keeps the
 * dimension (sort, topk, keepdim) with `len` entries, or drops it. */
static tpu_status_t view_output(const char* op, const job_t* j, const tpu_tensor_t* t,
                                const tpu_tensor_t* in, int dim, int64_t len, view_t* v) {
  int nd = in->ndim;
  bool keeps = t->ndim == nd;
  if (!keeps && t->ndim != nd - 1)
    return TPU_ERR(INVALID_ARGUMENT, "%s(): output has %d dims for an input with %d dims", op,
                   t->ndim, nd);
  v->data = t->data;
  v->along = (keeps && nd > 0) ? t->strides[dim] : 0;
  if (keeps && nd > 0 && t->sizes[dim] != len)
    return TPU_ERR(INVALID_ARGUMENT, "%s(): output size %lld at dimension %d, expected %lld", op,
                   (long long)t->sizes[dim], dim, (long long)len);
  for (int d = 0, o = 0; d < t->ndim; d++) {
    if (keeps && d == dim) continue;
    if (t->sizes[d] != j->outer_sizes[o])
      return TPU_ERR(INVALID_ARGUMENT, "%s(): output size %lld at dimension %d, expected %lld",
                     op, (long long)t->sizes[d], d, (long long)j->outer_sizes[o]);
    v->outer[o++] = t->strides[d];
  }
  return TPU_OK;
}

/* Sets up a job over `in` along `dim` (wrapped here); `len` is the length
 * the outputs that keep the dimension have along it (-1: the slice's). */
static tpu_status_t job_init(job_t* j, const char* op, kind_t kind, const tpu_tensor_t* in,
                             int64_t dim, const tpu_tensor_t* values, const tpu_tensor_t* indices,
                             int64_t len) {
  memset(j, 0, sizeof(*j));
  int nd = in->ndim > 0 ? in->ndim : 1;
  if (dim < -nd || dim >= nd)
    return TPU_ERR(OUT_OF_RANGE,
                   "%s(): Dimension out of range (expected to be in range of [%d, %d], but got "
                   "%lld)",
                   op, -nd, nd - 1, (long long)dim);
  if (dim < 0) dim += nd;
  if (!tpu_dtype_is_supported(in->dtype))
    return TPU_ERR(UNIMPLEMENTED, "%s(): dtype %d is not supported on tpu", op, (int)in->dtype);
  if (values->dtype != in->dtype)
    return TPU_ERR(INVALID_ARGUMENT, "%s(): expected values to be %s but got %s", op,
                   tpu_dtype_name(in->dtype), tpu_dtype_name(values->dtype));
  if (indices && indices->dtype != TPU_I64)
    return TPU_ERR(INVALID_ARGUMENT, "%s(): expected indices to be int64 but got %s", op,
                   tpu_dtype_name(indices->dtype));
  j->kind = kind;
  j->dt = in->dtype;
  j->esz = tpu_dtype_size(in->dtype);
  j->n = in->ndim > 0 ? in->sizes[dim] : 1;
  j->in.data = in->data;
  j->in.along = in->ndim > 0 ? in->strides[dim] : 0;
  j->nslices = 1;
  for (int d = 0; d < in->ndim; d++) {
    if (d == dim) continue;
    j->outer_sizes[j->nouter] = in->sizes[d];
    j->in.outer[j->nouter++] = in->strides[d];
    j->nslices *= in->sizes[d];
  }
  if (len < 0) len = j->n;
  if (kind == K_TOPK && len > j->n)
    return TPU_ERR(INVALID_ARGUMENT, "topk(): selected index k out of range (k=%lld, size=%lld)",
                   (long long)len, (long long)j->n);
  TPU_RETURN_IF_ERROR(view_output(op, j, values, in, (int)dim, len, &j->values));
  j->has_indices = indices != NULL;
  if (indices) TPU_RETURN_IF_ERROR(view_output(op, j, indices, in, (int)dim, len, &j->indices));
  return TPU_OK;
}

/* Copies element `it.idx` of the staged slice `raw` to position `pos` of
 * the outputs. */
static void put(const job_t* j, const char* raw, char* val, int64_t* ind, int64_t pos, item_t it) {
  memcpy(val + (size_t)(pos * j->values.along) * j->esz, raw + (size_t)it.idx * j->esz, j->esz);
  if (ind) ind[pos * j->indices.along] = it.idx;
}

/* Position in ascending item order of the (nan)median of a slice. */
static int64_t median_pos(const job_t* j, const item_t* items) {
  int64_t nans = 0;
  if (tpu_dtype_is_float(j->dt))
    for (int64_t i = 0; i < j->n; i++) nans += items[i].key == KEY_NAN;
  if (nans && !j->ignore_nan) return j->n - nans; /* median: the first NaN */
  int64_t m = j->n - nans;
  return m > 0 ? (m - 1) / 2 : 0; /* lower median; all-NaN gives the first NaN */
}

/* Mode: the smallest of the most frequent values, reported with the last
 * index it occurs at (items must be sorted). NaNs never equal each other,
 * as in PyTorch, so each counts once. */
static item_t mode_of(const job_t* j, const item_t* items, int64_t n) {
  bool nan_distinct = tpu_dtype_is_float(j->dt);
  item_t best = items[0];
  int64_t best_count = 0;
  for (int64_t b = 0; b < n;) {
    int64_t e = b + 1;
    bool is_nan = nan_distinct && items[b].key == KEY_NAN;
    while (e < n && !is_nan && items[e].key == items[b].key) e++;
    if (e - b > best_count) {
      best_count = e - b;
      best = items[e - 1];
    }
    b = e;
  }
  return best;
}

static void slice_range(void* arg, int64_t begin, int64_t end) {
  job_t* j = arg;
  int64_t n = j->n;
  /* items, merge scratch, and the slice's raw elements: outputs may alias
   * the input (sort(x, out=(x, i))), so values are copied from the stage */
  item_t* items = malloc((size_t)(2 * n) * sizeof(item_t) + (size_t)n * j->esz + 1);
  if (!items) {
    j->oom = 1;
    return;
  }
  item_t* tmp = items + n;
  char* raw = (char*)(items + 2 * n);
  for (int64_t s = begin; s < end; s++) {
    int64_t rem = s, oin = 0, oval = 0, oind = 0;
    for (int d = j->nouter - 1; d >= 0; d--) {
      int64_t i = rem % j->outer_sizes[d];
      rem /= j->outer_sizes[d];
      oin += i * j->in.outer[d];
      oval += i * j->values.outer[d];
      oind += i * j->indices.outer[d];
    }
    const char* src = j->in.data + (size_t)oin * j->esz;
    char* val = j->values.data + (size_t)oval * j->esz;
    int64_t* ind = j->has_indices ? (int64_t*)j->indices.data + oind : NULL;
    uint64_t flip = j->descending ? UINT64_MAX : 0;
    for (int64_t i = 0; i < n; i++) {
      char* e = raw + (size_t)i * j->esz;
      memcpy(e, src + (size_t)(i * j->in.along) * j->esz, j->esz);
      items[i].key = key_of(e, j->dt) ^ flip;
      items[i].idx = i;
    }
    switch (j->kind) {
      case K_SORT:
        if (j->stable) sort_items(items, tmp, n);
        else intro_sort(items, n);
        for (int64_t p = 0; p < n; p++) put(j, raw, val, ind, p, items[p]);
        break;
      case K_TOPK:
        if (j->k == 0) break;
        top_k(items, n, j->k, j->sorted);
        for (int64_t p = 0; p < j->k; p++) put(j, raw, val, ind, p, items[p]);
        break;
      case K_KTHVALUE:
        quick_select(items, n, j->k - 1);
        put(j, raw, val, ind, 0, items[j->k - 1]);
        break;
      case K_MEDIAN: {
        int64_t pos = median_pos(j, items);
        select_nth(items, tmp, n, pos);
        put(j, raw, val, ind, 0, items[pos]);
        break;
      }
      case K_MODE:
        sort_items(items, tmp, n);
        put(j, raw, val, ind, 0, mode_of(j, items, n));
        break;
    }
  }
  free(items);
}

static tpu_status_t job_run(const char* op, job_t* j) {
  if (j->nslices == 0) return TPU_OK;
  int64_t n = j->n > 0 ? j->n : 1;
  tpu_parallel_for(j->nslices, n >= 4096 ? 1 : 4096 / n, slice_range, j);
  if (j->oom)
    return TPU_ERR(RESOURCE_EXHAUSTED, "%s(): out of host memory for a slice of %lld elements", op,
                   (long long)j->n);
  return TPU_OK;
}

/* Reductions to one value per slice need a non-empty dimension. */
static tpu_status_t check_reduction(const char* op, const job_t* j, int64_t dim) {
  if (j->n == 0)
    return TPU_ERR(OUT_OF_RANGE, "%s(): Expected reduction dim %lld to have non-zero size.", op,
                   (long long)dim);
  return TPU_OK;
}

/* ---- kernels ---- */
static tpu_status_t sort_impl(const tpu_call_t* c, int dim_arg, bool stable) {
  int64_t dim = tpu_arg_i64(c, dim_arg, -1);
  job_t j;
  TPU_RETURN_IF_ERROR(job_init(&j, "sort", K_SORT, tpu_arg_tensor(c, 0), dim, &c->outs[0],
                               &c->outs[1], -1));
  j.descending = tpu_arg_bool(c, dim_arg + 1, false);
  j.stable = stable;
  return job_run("sort", &j);
}

/* sort(self, dim, descending) and sort.values(..., values, indices) */
tpu_status_t tpu_k_sort(const tpu_call_t* c) { return sort_impl(c, 1, false); }

/* sort.stable(self, *, stable, dim, descending) and sort.values_stable */
tpu_status_t tpu_k_sort_stable(const tpu_call_t* c) {
  return sort_impl(c, 2, !tpu_arg_is_none(c, 1) && tpu_arg_bool(c, 1, false));
}

/* topk(self, k, dim, largest, sorted) */
tpu_status_t tpu_k_topk(const tpu_call_t* c) {
  const tpu_tensor_t* in = tpu_arg_tensor(c, 0);
  int64_t k = tpu_arg_i64(c, 1, 0), dim = tpu_arg_i64(c, 2, -1);
  if (k < 0)
    return TPU_ERR(INVALID_ARGUMENT, "topk(): selected index k out of range (k=%lld)",
                   (long long)k);
  job_t j;
  TPU_RETURN_IF_ERROR(job_init(&j, "topk", K_TOPK, in, dim, &c->outs[0], &c->outs[1], k));
  /* A 0-d input gives 0-d outputs (one element) for k = 0 as for k = 1:
   * PyTorch's CPU kernel copies the value and writes index 0 whatever k is. */
  j.k = in->ndim == 0 ? 1 : k;
  j.descending = tpu_arg_bool(c, 3, true);
  j.sorted = tpu_arg_bool(c, 4, true);
  return job_run("topk", &j);
}

/* kthvalue(self, k, dim, keepdim): the k-th smallest (1-based). */
tpu_status_t tpu_k_kthvalue(const tpu_call_t* c) {
  const tpu_tensor_t* in = tpu_arg_tensor(c, 0);
  int64_t k = tpu_arg_i64(c, 1, 1), dim = tpu_arg_i64(c, 2, -1);
  job_t j;
  TPU_RETURN_IF_ERROR(job_init(&j, "kthvalue", K_KTHVALUE, in, dim, &c->outs[0], &c->outs[1], 1));
  TPU_RETURN_IF_ERROR(check_reduction("kthvalue", &j, dim));
  if (k < 1 || k > j.n)
    return TPU_ERR(INVALID_ARGUMENT,
                   "kthvalue(): selected number k out of range for dimension %lld (k=%lld, "
                   "size=%lld)",
                   (long long)dim, (long long)k, (long long)j.n);
  j.k = k;
  return job_run("kthvalue", &j);
}

static tpu_status_t median_dim(const tpu_call_t* c, const char* op, bool ignore_nan) {
  int64_t dim = tpu_arg_i64(c, 1, -1);
  job_t j;
  TPU_RETURN_IF_ERROR(job_init(&j, op, K_MEDIAN, tpu_arg_tensor(c, 0), dim, &c->outs[0],
                               &c->outs[1], 1));
  TPU_RETURN_IF_ERROR(check_reduction(op, &j, dim));
  j.ignore_nan = ignore_nan;
  return job_run(op, &j);
}

/* median / nanmedian over all elements (value only): runs on a contiguous
 * copy flattened to one slice. */
static tpu_status_t median_all(const tpu_call_t* c, const char* op, bool ignore_nan) {
  const tpu_tensor_t* in = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* out = &c->outs[0];
  int64_t numel = tpu_tensor_numel(in);
  if (numel == 0) { /* NaN, or what converting NaN gives int64 (as PyTorch) */
    if (tpu_dtype_is_float(out->dtype)) tpu_store_f64(out->data, out->dtype, NAN);
    else tpu_store_i64(out->data, out->dtype, INT64_MIN);
    return TPU_OK;
  }
  tpu_tensor_t flat;
  void* copy = NULL;
  if (tpu_tensor_is_contiguous(in)) {
    tpu_tensor_make_contig(&flat, in->data, in->dtype, 1, &numel);
  } else {
    copy = malloc((size_t)numel * tpu_dtype_size(in->dtype));
    if (!copy)
      return TPU_ERR(RESOURCE_EXHAUSTED, "%s(): out of host memory for %lld elements", op,
                     (long long)numel);
    tpu_tensor_make_contig(&flat, copy, in->dtype, in->ndim, in->sizes);
    tpu_status_t st = tpu_copy_strided(&flat, in);
    if (st) {
      free(copy);
      return st;
    }
    tpu_tensor_make_contig(&flat, copy, in->dtype, 1, &numel);
  }
  job_t j;
  tpu_status_t st = job_init(&j, op, K_MEDIAN, &flat, 0, out, NULL, 1);
  if (!st) {
    j.ignore_nan = ignore_nan;
    st = job_run(op, &j);
  }
  free(copy);
  return st;
}

/* median(self) and median.out; median.dim(self, dim, keepdim) and dim_values:
 * the lower median; NaN (at its first index) when the slice has a NaN. */
tpu_status_t tpu_k_median(const tpu_call_t* c) { return median_all(c, "median", false); }
tpu_status_t tpu_k_median_dim(const tpu_call_t* c) { return median_dim(c, "median", false); }
/* nanmedian: the lower median of the non-NaN values. */
tpu_status_t tpu_k_nanmedian(const tpu_call_t* c) { return median_all(c, "nanmedian", true); }
tpu_status_t tpu_k_nanmedian_dim(const tpu_call_t* c) { return median_dim(c, "nanmedian", true); }

/* mode(self, dim, keepdim) */
tpu_status_t tpu_k_mode(const tpu_call_t* c) {
  int64_t dim = tpu_arg_i64(c, 1, -1);
  job_t j;
  TPU_RETURN_IF_ERROR(
      job_init(&j, "mode", K_MODE, tpu_arg_tensor(c, 0), dim, &c->outs[0], &c->outs[1], 1));
  TPU_RETURN_IF_ERROR(check_reduction("mode", &j, dim));
  return job_run("mode", &j);
}
