/* The process's target (tpu/target.h): registered once from above, read by
 * the device and execution layers. */
#include <stdatomic.h>

#include "tpu/target.h"

static const tpu_target_t* _Atomic g_target;

/* The first required entry t leaves NULL, or NULL when it has them all. */
static const char* missing_entry(const tpu_target_iface_t* f) {
#define REQUIRED(e) \
  if (!f->e) return #e;
  REQUIRED(device_count)
  REQUIRED(device_props)
  REQUIRED(buffer_alloc)
  REQUIRED(buffer_free)
  REQUIRED(copy_h2d)
  REQUIRED(copy_d2h)
  REQUIRED(copy_d2d)
  REQUIRED(copy_h2d_async)
  REQUIRED(copy_d2h_async)
  REQUIRED(copy_d2d_async)
  REQUIRED(ops)
  REQUIRED(supports_op)
  REQUIRED(graph_prepare)
  REQUIRED(graph_run)
  REQUIRED(graph_release)
  REQUIRED(memory_stats)
#undef REQUIRED
  return NULL;
}

tpu_status_t tpu_target_set(const tpu_target_t* t) {
  if (!t || !t->iface || !t->iface->name)
    return TPU_ERR(INVALID_ARGUMENT, "target: registering a target without a name");
  const char* missing = missing_entry(t->iface);
  if (missing)
    return TPU_ERR(INVALID_ARGUMENT, "target '%s' cannot be registered: it has no %s entry",
                   t->iface->name, missing);
  const tpu_target_t* none = NULL;
  if (atomic_compare_exchange_strong(&g_target, &none, t)) return TPU_OK;
  if (none == t) return TPU_OK;
  return TPU_ERR(INVALID_ARGUMENT,
                 "target: the target is chosen once at start-up; '%s' is running, '%s' cannot "
                 "replace it", none->iface->name, t->iface->name);
}

const tpu_target_t* tpu_target_get(void) {
  return atomic_load_explicit(&g_target, memory_order_acquire);
}

const char* tpu_target_name(void) {
  const tpu_target_t* t = tpu_target_get();
  return t ? t->iface->name : NULL;
}

void tpu_target_wait_compiles(void) {
  const tpu_target_t* t = tpu_target_get();
  if (t && t->iface->wait_compiles) t->iface->wait_compiles(t->ctx);
}

const char* tpu_target_pop_warning(void) {
  const tpu_target_t* t = tpu_target_get();
  return t && t->iface->pop_warning ? t->iface->pop_warning(t->ctx) : NULL;
}
