/* The kernel timeline (tpu/observe.h): one event per counted kernel run,
 * appended under a mutex into a growing array while recording is on. The
 * submitting thread's tag travels with each queued call (exec/call.c), so a
 * kernel can be matched with the framework op that issued it. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "tpu/device.h"
#include "tpu/observe.h"

static _Atomic bool g_on;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static tpu_kernel_event_t* g_ev;
static size_t g_n, g_cap, g_head; /* events [g_head, g_n) not taken yet */
static _Atomic uint64_t g_dropped;
static _Thread_local uint64_t t_tag;

void tpu_profile_set_tag(uint64_t tag) { t_tag = tag; }
uint64_t tpu_profile_tag(void) { return t_tag; }

bool tpu_kernel_events_on(void) { return atomic_load_explicit(&g_on, memory_order_relaxed); }
bool tpu_kernel_events_recording(void) { return tpu_kernel_events_on(); }

void tpu_kernel_events_record(bool on) {
  pthread_mutex_lock(&g_mu);
  if (on) {
    g_n = g_head = 0;
    atomic_store(&g_dropped, 0);
  }
  atomic_store(&g_on, on);
  pthread_mutex_unlock(&g_mu);
}

void tpu_kernel_events_add(int entry, int device, int64_t start_ns, int64_t end_ns) {
  if (!tpu_kernel_events_on()) return;
  tpu_kernel_event_t e = {.entry = entry, .device = device, .stream = -1,
                          .start_ns = start_ns, .end_ns = end_ns, .tag = t_tag};
  struct tpu_stream* s = tpu_stream_running();
  if (s) {
    e.device = tpu_stream_device(s);
    e.stream = tpu_stream_id(s);
  }
  pthread_mutex_lock(&g_mu);
  if (g_n == g_cap) {
    size_t cap = g_cap ? 2 * g_cap : 4096;
    tpu_kernel_event_t* v = cap <= TPU_KERNEL_EVENTS_MAX ? realloc(g_ev, cap * sizeof(*v)) : NULL;
    if (!v) {
      pthread_mutex_unlock(&g_mu);
      atomic_fetch_add(&g_dropped, 1);
      return;
    }
    g_ev = v;
    g_cap = cap;
  }
  g_ev[g_n++] = e;
  pthread_mutex_unlock(&g_mu);
}

size_t tpu_kernel_events_take(tpu_kernel_event_t* out, size_t cap) {
  pthread_mutex_lock(&g_mu);
  size_t k = g_n - g_head;
  if (k > cap) k = cap;
  if (k) memcpy(out, g_ev + g_head, k * sizeof(*out));
  g_head += k;
  if (g_head == g_n) g_head = g_n = 0;
  pthread_mutex_unlock(&g_mu);
  return k;
}

uint64_t tpu_kernel_events_dropped(void) { return atomic_load(&g_dropped); }
