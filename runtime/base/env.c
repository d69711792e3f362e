/* Environment variables (see env.h). */
#include "base/env.h"

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
