/* Minimal C test helpers: CHECK records failures, tests return nonzero. */
#ifndef TPU_TEST_UTIL_H_
#define TPU_TEST_UTIL_H_
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "targets/host/kernels/kernels.h"
#include "tpu/device.h"
#include "tpu/targets.h"

static int g_failures;

/* Every test runs on the host target, chosen before main (as the bridge
 * chooses when its library loads). A test of the choice itself
 * (test_target.c) defines TT_NO_TARGET and makes it. */
#ifndef TT_NO_TARGET
__attribute__((constructor)) static void tt_choose_host_target(void) {
  tpu_status_t st = tpu_targets_select("host");
  if (st) {
    fprintf(stderr, "test start-up: %s\n", tpu_status_message(st));
    exit(1);
  }
}
#endif
#define CHECK(cond)                                                         \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      g_failures++;                                                         \
    }                                                                       \
  } while (0)
#define CHECK_NEAR(a, b, tol) CHECK(fabs((double)(a) - (double)(b)) <= (tol))
#define CHECK_OK(expr)                                                      \
  do {                                                                      \
    tpu_status_t st_ = (expr);                                              \
    if (st_) {                                                              \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #expr,  \
              tpu_status_message(st_));                                     \
      tpu_status_free(st_);                                                 \
      g_failures++;                                                         \
    }                                                                       \
  } while (0)

/* Builds a contiguous descriptor over caller memory. */
static inline tpu_tensor_t tt_make(void* data, tpu_dtype_t dt, int ndim, const int64_t* sizes) {
  tpu_tensor_t t;
  tpu_tensor_make_contig(&t, data, dt, ndim, sizes);
  return t;
}

/* Runs an op by ATen overload name with the given args/outs, synchronously,
 * with the call's other fields (precision, RNG seed/offset...) from `base`
 * (NULL: all zero, with Debug checks on). */
static inline tpu_status_t tt_run_with(const char* name, tpu_arg_t* args, int nargs,
                                       tpu_tensor_t* outs, int nouts, const tpu_call_t* base) {
  const tpu_op_t* op = tpu_op_lookup(name);
  if (!op) return tpu_status_make(TPU_CODE_UNIMPLEMENTED, "no op %s", name);
  tpu_call_t c = {0};
  if (base) c = *base;
  else c.debug_checks = true;
  c.op = op;
  c.args = args;
  c.nargs = nargs;
  c.outs = outs;
  c.nouts = nouts;
  return tpu_call_run(&c);
}

static inline tpu_status_t tt_run(const char* name, tpu_arg_t* args, int nargs, tpu_tensor_t* outs,
                                  int nouts) {
  return tt_run_with(name, args, nargs, outs, nouts, NULL);
}

static inline tpu_arg_t ta_t(tpu_tensor_t* t) { tpu_arg_t a = {0}; a.kind = TPU_ARG_TENSOR; a.v.t = t; return a; }
static inline tpu_arg_t ta_i(int64_t v) { tpu_arg_t a = {0}; a.kind = TPU_ARG_INT; a.v.i = v; return a; }
static inline tpu_arg_t ta_d(double v) { tpu_arg_t a = {0}; a.kind = TPU_ARG_DOUBLE; a.v.d = v; return a; }
static inline tpu_arg_t ta_b(bool v) { tpu_arg_t a = {0}; a.kind = TPU_ARG_BOOL; a.v.b = v; return a; }
static inline tpu_arg_t ta_s(const char* s) { tpu_arg_t a = {0}; a.kind = TPU_ARG_STRING; a.v.s = s; return a; }
static inline tpu_arg_t ta_none(void) { tpu_arg_t a = {0}; a.kind = TPU_ARG_NONE; return a; }
static inline tpu_arg_t ta_il(const int64_t* v, int n) { tpu_arg_t a = {0}; a.kind = TPU_ARG_INTLIST; a.v.ilist = v; a.n = n; return a; }

#define TEST_MAIN_END()                                  \
  do {                                                   \
    if (g_failures) {                                    \
      fprintf(stderr, "%d check(s) failed\n", g_failures); \
      return 1;                                          \
    }                                                    \
    printf("ok\n");                                      \
    return 0;                                            \
  } while (0)
#endif
