/* Environment variables (see env.h). */
#include "base/env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char* tpu_env_str(const char* name) {
  const char* v = getenv(name);
  return v && *v ? v : NULL;
}

int64_t tpu_env_int(const char* name, int64_t dflt) {
  const char* v = tpu_env_str(name);
  if (!v) return dflt;
  char* end = NULL;
  long long x = strtoll(v, &end, 10);
  if (end == v) return dflt;
  if (*end == 'K' || *end == 'k') x <<= 10;
  else if (*end == 'M' || *end == 'm') x <<= 20;
  else if (*end == 'G' || *end == 'g') x <<= 30;
  return x;
}

double tpu_env_double(const char* name, double dflt) {
  const char* v = tpu_env_str(name);
  if (!v) return dflt;
  char* end = NULL;
  double x = strtod(v, &end);
  return end == v ? dflt : x;
}

bool tpu_env_bool(const char* name, bool dflt) {
  const char* v = tpu_env_str(name);
  if (!v) return dflt;
  return strcmp(v, "0") != 0 && strcmp(v, "false") != 0;
}

tpu_status_t tpu_env_visible_devices(int total, int* out_map, int* out_n) {
  *out_n = 0;
  const char* v = tpu_env_str("TORCH_TPU_VISIBLE_DEVICES");
  if (!v) {
    for (int i = 0; i < total; i++) out_map[i] = i;
    *out_n = total;
    return TPU_OK;
  }
  const char* p = v;
  while (*p) {
    char* end = NULL;
    long d = strtol(p, &end, 10);
    if (end == p || d < 0 || d >= total)
      return TPU_ERR(INVALID_ARGUMENT,
                     "TORCH_TPU_VISIBLE_DEVICES=%s: expected device indices in [0, %d) separated "
                     "by commas",
                     v, total);
    for (int k = 0; k < *out_n; k++)
      if (out_map[k] == (int)d)
        return TPU_ERR(INVALID_ARGUMENT, "TORCH_TPU_VISIBLE_DEVICES=%s names device %ld twice", v,
                       d);
    out_map[(*out_n)++] = (int)d;
    p = end;
    if (*p == ',') p++;
    else if (*p)
      return TPU_ERR(INVALID_ARGUMENT,
                     "TORCH_TPU_VISIBLE_DEVICES=%s: expected device indices separated by commas", v);
  }
  if (*out_n == 0)
    return TPU_ERR(INVALID_ARGUMENT, "TORCH_TPU_VISIBLE_DEVICES is empty of devices");
  return TPU_OK;
}
