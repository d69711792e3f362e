/* The targets of this build and the start-up choice among them
 * (tpu/targets.h). A new target adds one line to g_targets. */
#include <pthread.h>
#include <string.h>

#include "base/env.h"
#include "tpu/targets.h"

typedef const tpu_target_t* (*target_getter_t)(void);

static const struct {
  const char* name;
  target_getter_t get;
} g_targets[] = {
    {"host", tpu_host_target},
    {"pjrt", tpu_pjrt_target},
};
enum { NTARGETS = (int)(sizeof(g_targets) / sizeof(g_targets[0])) };

const tpu_target_t* tpu_targets_find(const char* name) {
  if (!name) return NULL;
  for (int i = 0; i < NTARGETS; i++)
    if (strcmp(g_targets[i].name, name) == 0) return g_targets[i].get();
  return NULL;
}

static char g_known[256];
static pthread_once_t g_known_once = PTHREAD_ONCE_INIT;

static void join_known(void) {
  size_t n = 0;
  for (int i = 0; i < NTARGETS; i++) {
    size_t len = strlen(g_targets[i].name);
    if (n + len + 3 > sizeof g_known) break;
    if (i) {
      memcpy(g_known + n, ", ", 2);
      n += 2;
    }
    memcpy(g_known + n, g_targets[i].name, len);
    n += len;
  }
  g_known[n] = 0;
}

const char* tpu_targets_known(void) {
  pthread_once(&g_known_once, join_known);
  return g_known;
}

tpu_status_t tpu_targets_select(const char* name) {
  const tpu_target_t* t = tpu_targets_find(name);
  if (!t)
    return TPU_ERR(INVALID_ARGUMENT, "'%s' is not a known target (known targets: %s)",
                   name ? name : "(null)", tpu_targets_known());
  return tpu_target_set(t);
}

tpu_status_t tpu_targets_select_from_env(void) {
  const char* name = tpu_env_str("TORCH_TPU_TARGET");
  if (!name || !*name) name = "host";
  if (!tpu_targets_find(name))
    return TPU_ERR(INVALID_ARGUMENT,
                   "TORCH_TPU_TARGET='%s' is not a known target (known targets: %s)", name,
                   tpu_targets_known());
  return tpu_targets_select(name);
}
