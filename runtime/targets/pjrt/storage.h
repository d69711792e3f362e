/* The pjrt target's device memory: storages are PJRT buffers behind handle
 * addresses.
 *
 * buffer_alloc reserves an address range that the host cannot touch (an
 * inaccessible mapping: a stray host read faults instead of reading
 * garbage) and records a block for it. The runtime's tensors address that
 * range as on any target (data pointer = block base + offset, strides), so
 * views, storage offsets and aliasing need nothing special. A block's
 * contents are one PJRT buffer of `bytes` unsigned bytes, or none until
 * something writes it (it then reads as zeros). An op never edits a buffer:
 * it returns the block's next buffer (a functional update), which replaces
 * the old one; readers still running on the old one hold a reference.
 */
#ifndef TPU_TARGETS_PJRT_STORAGE_H_
#define TPU_TARGETS_PJRT_STORAGE_H_

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "targets/pjrt/pjrt_client.h"
#include "tpu/status.h"

/* A reference-counted PJRT buffer (the block holds one reference). */
typedef struct pj_buf {
  tpu_pjrt_buffer_t* b;
  tpu_dtype_t dt; /* its element type: 1-D, bytes / size(dt) elements */
  _Atomic int refs;
} pj_buf_t;

typedef struct pj_block {
  uintptr_t base;
  size_t bytes;
  int device;
  pj_buf_t* buf; /* NULL: never written, reads as zeros */
  tpu_dtype_t buf_dt; /* buf's element type (a copy the registry keeps) */
} pj_block_t;

/* The registry of blocks, sorted by base; its mutex also guards buf. */
tpu_status_t pj_storage_alloc(tpu_pjrt_t* p, int device, size_t bytes, void** out_ptr);
void pj_storage_free(tpu_pjrt_t* p, void* ptr);

/* The block holding [ptr, ptr + bytes), copied out; with `ref`, a reference
 * on its buffer is taken (release it with pj_buf_release), without, out->buf
 * only says whether it has one. False when no block holds the range. */
bool pj_storage_find(const void* ptr, size_t bytes, bool ref, pj_block_t* out);
/* Replaces the buffer of the block at `base` by `nb` (the call gives its
 * reference to the block) and releases the old one. */
void pj_storage_replace(tpu_pjrt_t* p, uintptr_t base, pj_buf_t* nb);
/* The same, only while the block's buffer is still `expected` (else nb is
 * released); true when it replaced it. */
bool pj_storage_replace_if(tpu_pjrt_t* p, uintptr_t base, const pj_buf_t* expected, pj_buf_t* nb);

/* NULL on host OOM (b is freed); dt: b's element type */
pj_buf_t* pj_buf_wrap(tpu_pjrt_t* p, tpu_pjrt_buffer_t* b, tpu_dtype_t dt);
void pj_buf_release(tpu_pjrt_t* p, pj_buf_t* b);

/* Synchronous byte copies between host memory and device memory (any range
 * inside one block). */
tpu_status_t pj_storage_write(tpu_pjrt_t* p, void* dst, const void* src, size_t bytes) TPU_MUST_USE;
tpu_status_t pj_storage_read(tpu_pjrt_t* p, void* dst, const void* src, size_t bytes) TPU_MUST_USE;

#endif
