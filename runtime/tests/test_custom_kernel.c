/* Custom C kernels (tpu/kernels.h, targets/host/custom.c) without Python:
 * definition through the compiler and the cache, a run with the ABI's
 * arguments, Debug mode's guard regions, compile errors, duplicate names. */
#include <unistd.h>

#include "test_util.h"
#include "tpu/cache.h"
#include "tpu/kernels.h"

static const char* k_axpy =
    "int axpy(const tpuk_call_t* call) {\n"
    "  const float* x = call->in[0].data;\n"
    "  float* y = call->in[1].data;                 /* mutated */\n"
    "  float* n = call->out[0].data;\n"
    "  float a = (float)call->num[0];\n"
    "  for (int64_t i = 0; i < call->in[0].numel; i++) y[i] += a * x[i];\n"
    "  n[0] = (float)call->in[0].numel;\n"
    "  return call->inum[1] == 7 ? 0 : tpuk_fail(call, \"expected 7, got %lld\", (long long)call->inum[1]);\n"
    "}\n";

static const char* k_overrun =
    "int overrun(const tpuk_call_t* call) {\n"
    "  float* n = call->out[0].data;\n"
    "  n[0] = 1.0f;\n"
    "  n[1] = 2.0f;  /* one past the end */\n"
    "  return 0;\n"
    "}\n";

static tpu_status_t run(const tpu_op_t* op, float* x, float* y, float* n, double a, int64_t seven,
                        bool debug) {
  const int64_t sz4[1] = {4}, sz1[1] = {1};
  tpu_tensor_t tx = tt_make(x, TPU_F32, 1, sz4), ty = tt_make(y, TPU_F32, 1, sz4);
  tpu_tensor_t tn = tt_make(n, TPU_F32, 1, sz1);
  tpu_arg_t args[4] = {ta_t(&tx), ta_t(&ty), ta_d(a), ta_i(seven)};
  tpu_call_t c = {0};
  c.op = op;
  c.args = args;
  c.nargs = 4;
  c.outs = &tn;
  c.nouts = 1;
  c.debug_checks = debug;
  c.mutated_args = 1u << 1;
  return tpu_call_run(&c);
}

int main(void) {
  if (access("/usr/bin/cc", X_OK) != 0 && !getenv("TORCH_TPU_CC")) {
    printf("test_custom_kernel: no C compiler, skipped\n");
    return 0;
  }
  char name[64];
  snprintf(name, sizeof name, "ctest::axpy_%ld", (long)getpid());
  tpu_kernel_desc_t d = {.name = name, .lang = TPU_KERNEL_C, .source = k_axpy, .entry = "axpy"};
  const tpu_op_t* op = NULL;
  tpu_kernel_info_t info;
  CHECK_OK(tpu_kernel_define(&d, &op, &info));
  CHECK(op && tpu_op_lookup(name) == op && tpu_op_custom(op) != NULL);
  CHECK(info.cache_tier >= 0 && strlen(info.key) == 32);
  /* the same name again: refused */
  const tpu_op_t* op2 = NULL;
  tpu_status_t st = tpu_kernel_define(&d, &op2, &info);
  CHECK(st && tpu_status_code(st) == TPU_CODE_INVALID_ARGUMENT && !op2);
  tpu_status_free(st);
  /* the same source under another name: tier 1 */
  char name2[80];
  snprintf(name2, sizeof name2, "%s_again", name);
  d.name = name2;
  CHECK_OK(tpu_kernel_define(&d, &op2, &info));
  CHECK(info.cache_tier == 1);
  if (op) {
    for (int debug = 0; debug < 2; debug++) {
      float x[4] = {1, 2, 3, 4}, y[4] = {10, 20, 30, 40}, n[1] = {0};
      CHECK_OK(run(op, x, y, n, 0.5, 7, debug));
      CHECK(y[0] == 10.5f && y[3] == 42.0f && n[0] == 4.0f);
      st = run(op, x, y, n, 0.5, 8, debug);
      CHECK(st && strstr(tpu_status_message(st), "expected 7, got 8"));
      tpu_status_free(st);
    }
  }
  /* an out-of-bounds write is caught in Debug mode, and nothing is written back */
  snprintf(name2, sizeof name2, "ctest::overrun_%ld", (long)getpid());
  tpu_kernel_desc_t o = {.name = name2, .lang = TPU_KERNEL_C, .source = k_overrun, .entry = "overrun"};
  const tpu_op_t* bad = NULL;
  CHECK_OK(tpu_kernel_define(&o, &bad, &info));
  if (bad) {
    float x[4] = {0}, y[4] = {0}, n[2] = {0, -1};
    st = run(bad, x, y, n, 1, 7, true);
    CHECK(st && strstr(tpu_status_message(st), "wrote out of bounds of output 0"));
    tpu_status_free(st);
    CHECK(n[0] == 0 && n[1] == -1);
  }
  /* a compile error carries the compiler's message with the user's line */
  snprintf(name2, sizeof name2, "ctest::broken_%ld", (long)getpid());
  tpu_kernel_desc_t b = {.name = name2, .lang = TPU_KERNEL_C, .source = "int f(void) {\n  return +;\n}\n",
                         .entry = "f"};
  st = tpu_kernel_define(&b, &bad, &info);
  CHECK(st && strstr(tpu_status_message(st), "compilation failed") &&
        strstr(tpu_status_message(st), ".c:2:"));
  tpu_status_free(st);
  /* StableHLO needs a lowering target */
  tpu_kernel_desc_t h = {.name = "ctest::hlo", .lang = TPU_KERNEL_STABLEHLO,
                         .source = "func.func private @f() { return }", .entry = "f"};
  st = tpu_kernel_define(&h, &bad, &info);
  CHECK(st && tpu_status_code(st) == TPU_CODE_UNIMPLEMENTED);
  tpu_status_free(st);
  if (g_failures) return 1;
  printf("test_custom_kernel: ok\n");
  return 0;
}
