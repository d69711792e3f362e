/* Status objects: code + heap message. */
#include "tpu/status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tpu_status_s {
  tpu_status_code_t code;
  char* message;
};

static struct tpu_status_s tpu_status_oom = {TPU_CODE_RESOURCE_EXHAUSTED,
                                             (char*)"out of host memory while reporting an error"};

tpu_status_t tpu_status_make(tpu_status_code_t code, const char* fmt, ...) {
  if (code == TPU_CODE_OK) return TPU_OK;
  struct tpu_status_s* st = malloc(sizeof(*st));
  if (!st) return &tpu_status_oom;
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  st->message = malloc((size_t)(len < 0 ? 0 : len) + 1);
  if (!st->message) {
    free(st);
    return &tpu_status_oom;
  }
  va_start(ap, fmt);
  vsnprintf(st->message, (size_t)len + 1, fmt, ap);
  va_end(ap);
  st->code = code;
  return st;
}

tpu_status_t tpu_status_annotate(tpu_status_t st, const char* prefix) {
  if (st == TPU_OK || st == &tpu_status_oom) return st;
  size_t a = strlen(prefix), b = strlen(st->message);
  char* m = malloc(a + b + 3);
  if (!m) return st;
  memcpy(m, prefix, a);
  memcpy(m + a, ": ", 2);
  memcpy(m + a + 2, st->message, b + 1);
  free(st->message);
  st->message = m;
  return st;
}

tpu_status_code_t tpu_status_code(tpu_status_t st) { return st ? st->code : TPU_CODE_OK; }
const char* tpu_status_message(tpu_status_t st) { return st ? st->message : ""; }

void tpu_status_free(tpu_status_t st) {
  if (!st || st == &tpu_status_oom) return;
  free(st->message);
  free(st);
}
