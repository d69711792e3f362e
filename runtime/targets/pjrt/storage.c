/* The pjrt target's storages (storage.h). */
#include "targets/pjrt/storage.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static struct {
  pthread_mutex_t mu;
  pj_block_t** v;
  size_t n, cap;
} g_reg = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0};

/* index of the first block with base > p (caller holds mu) */
static size_t reg_upper(uintptr_t p) {
  size_t lo = 0, hi = g_reg.n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (g_reg.v[mid]->base <= p) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* the block containing [p, p + bytes) (caller holds mu) */
static pj_block_t* reg_find(uintptr_t p, size_t bytes) {
  size_t i = reg_upper(p);
  if (i == 0) return NULL;
  pj_block_t* b = g_reg.v[i - 1];
  if (p - b->base > b->bytes || bytes > b->bytes - (p - b->base)) return NULL;
  return b;
}

pj_buf_t* pj_buf_wrap(tpu_pjrt_t* p, tpu_pjrt_buffer_t* b, tpu_dtype_t dt) {
  pj_buf_t* w = malloc(sizeof(*w));
  if (!w) {
    tpu_pjrt_buffer_free(p, b);
    return NULL;
  }
  w->b = b;
  w->dt = dt;
  atomic_init(&w->refs, 1);
  return w;
}

void pj_buf_release(tpu_pjrt_t* p, pj_buf_t* b) {
  if (!b || atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) != 1) return;
  tpu_pjrt_buffer_free(p, b->b);
  free(b);
}

tpu_status_t pj_storage_alloc(tpu_pjrt_t* p, int device, size_t bytes, void** out_ptr) {
  *out_ptr = NULL;
  /* an address range nothing on the host may touch */
  void* a = mmap(NULL, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  pj_block_t* b = a == MAP_FAILED ? NULL : calloc(1, sizeof(*b));
  if (!b) {
    if (a != MAP_FAILED) munmap(a, bytes);
    return TPU_ERR(RESOURCE_EXHAUSTED, "tpu:%d out of memory: no address range for a buffer of "
                   "%zu bytes", device, bytes);
  }
  b->base = (uintptr_t)a;
  b->bytes = bytes;
  b->device = device;
  pthread_mutex_lock(&g_reg.mu);
  if (g_reg.n == g_reg.cap) {
    size_t cap = g_reg.cap ? 2 * g_reg.cap : 256;
    pj_block_t** v = realloc(g_reg.v, cap * sizeof(*v));
    if (!v) {
      pthread_mutex_unlock(&g_reg.mu);
      munmap(a, bytes);
      free(b);
      return TPU_ERR(RESOURCE_EXHAUSTED, "tpu:%d out of memory: no host memory to track a "
                     "buffer of %zu bytes", device, bytes);
    }
    g_reg.v = v;
    g_reg.cap = cap;
  }
  size_t i = reg_upper(b->base);
  memmove(g_reg.v + i + 1, g_reg.v + i, (g_reg.n - i) * sizeof(*g_reg.v));
  g_reg.v[i] = b;
  g_reg.n++;
  pthread_mutex_unlock(&g_reg.mu);
  *out_ptr = a;
  return TPU_OK;
}

void pj_storage_free(tpu_pjrt_t* p, void* ptr) {
  pthread_mutex_lock(&g_reg.mu);
  size_t i = reg_upper((uintptr_t)ptr);
  pj_block_t* b = NULL;
  if (i > 0 && g_reg.v[i - 1]->base == (uintptr_t)ptr) {
    b = g_reg.v[i - 1];
    memmove(g_reg.v + i - 1, g_reg.v + i, (g_reg.n - i) * sizeof(*g_reg.v));
    g_reg.n--;
  }
  pthread_mutex_unlock(&g_reg.mu);
  if (!b) return;
  pj_buf_release(p, b->buf);
  munmap((void*)b->base, b->bytes);
  free(b);
}

bool pj_storage_find(const void* ptr, size_t bytes, bool ref, pj_block_t* out) {
  pthread_mutex_lock(&g_reg.mu);
  pj_block_t* b = reg_find((uintptr_t)ptr, bytes);
  if (b) {
    *out = *b;
    if (ref && b->buf) atomic_fetch_add_explicit(&b->buf->refs, 1, memory_order_relaxed);
  }
  pthread_mutex_unlock(&g_reg.mu);
  return b != NULL;
}

static bool replace(tpu_pjrt_t* p, uintptr_t base, bool any, const pj_buf_t* expected, pj_buf_t* nb) {
  pj_buf_t* old = nb; /* the block is gone or moved on: drop the new contents */
  pthread_mutex_lock(&g_reg.mu);
  size_t i = reg_upper(base);
  pj_block_t* b = i > 0 && g_reg.v[i - 1]->base == base ? g_reg.v[i - 1] : NULL;
  if (b && (any || b->buf == expected)) {
    old = b->buf;
    b->buf = nb;
    b->buf_dt = nb ? nb->dt : TPU_U8;
  }
  pthread_mutex_unlock(&g_reg.mu);
  pj_buf_release(p, old);
  return old != nb;
}

void pj_storage_replace(tpu_pjrt_t* p, uintptr_t base, pj_buf_t* nb) { replace(p, base, true, NULL, nb); }

bool pj_storage_replace_if(tpu_pjrt_t* p, uintptr_t base, const pj_buf_t* expected, pj_buf_t* nb) {
  return replace(p, base, false, expected, nb);
}

/* The block's contents in host memory (zeros when never written). */
static tpu_status_t block_to_host(tpu_pjrt_t* p, const pj_block_t* b, unsigned char* dst) {
  if (!b->buf) {
    memset(dst, 0, b->bytes);
    return TPU_OK;
  }
  return tpu_pjrt_buffer_to_host(p, b->buf->b, dst, b->bytes);
}

tpu_status_t pj_storage_write(tpu_pjrt_t* p, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return TPU_OK;
  pj_block_t b;
  if (!pj_storage_find(dst, bytes, true, &b))
    return TPU_ERR(INVALID_ARGUMENT, "pjrt: copy to %p (%zu bytes) is not inside device memory",
                   dst, bytes);
  const size_t off = (uintptr_t)dst - b.base;
  const bool whole = off == 0 && bytes == b.bytes;
  unsigned char* tmp = whole ? NULL : malloc(b.bytes);
  tpu_status_t st = TPU_OK;
  if (!whole && !tmp)
    st = TPU_ERR(RESOURCE_EXHAUSTED, "pjrt: cannot stage %zu bytes on the host", b.bytes);
  if (!st && !whole) st = block_to_host(p, &b, tmp); /* read, modify, write */
  if (!st && !whole) memcpy(tmp + off, src, bytes);
  tpu_pjrt_buffer_t* nb = NULL;
  /* the block keeps its element type (bytes when it has none yet) */
  const tpu_dtype_t dt = b.buf && b.bytes % tpu_dtype_size(b.buf_dt) == 0 ? b.buf_dt : TPU_U8;
  int64_t dims[1] = {(int64_t)(b.bytes / tpu_dtype_size(dt))};
  if (!st) st = tpu_pjrt_buffer_from_host(p, b.device, whole ? src : tmp, dt, 1, dims, &nb);
  free(tmp);
  pj_buf_release(p, b.buf);
  if (st) return st;
  pj_buf_t* w = pj_buf_wrap(p, nb, dt);
  if (!w) return TPU_ERR(RESOURCE_EXHAUSTED, "pjrt: out of host memory");
  pj_storage_replace(p, b.base, w);
  return TPU_OK;
}

tpu_status_t pj_storage_read(tpu_pjrt_t* p, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return TPU_OK;
  pj_block_t b;
  if (!pj_storage_find(src, bytes, true, &b))
    return TPU_ERR(INVALID_ARGUMENT, "pjrt: copy from %p (%zu bytes) is not inside device memory",
                   src, bytes);
  const size_t off = (uintptr_t)src - b.base;
  tpu_status_t st;
  if (off == 0 && bytes == b.bytes) {
    st = block_to_host(p, &b, dst);
  } else {
    unsigned char* tmp = malloc(b.bytes);
    st = tmp ? block_to_host(p, &b, tmp)
             : TPU_ERR(RESOURCE_EXHAUSTED, "pjrt: cannot stage %zu bytes on the host", b.bytes);
    if (!st) memcpy(dst, tmp + off, bytes);
    free(tmp);
  }
  pj_buf_release(p, b.buf);
  return st;
}
