/* The StableHLO printer on a hand-built graph: parameters in memory order,
 * views derived from their buffers, a partial in-place write as
 * dynamic_update_slice, results, and an unmapped op as a listed custom call.
 * (tests/test_stablehlo.py parses and runs the printer's output with jaxlib.) */
#include "exec/graph.h"
#include "exec/internal.h"
#include "test_util.h"

static tpu_call_t* node(const char* op, tpu_arg_t* args, int nargs, tpu_tensor_t* outs, int nouts,
                        uint64_t mutated) {
  tpu_call_t c = {0};
  c.op = tpu_op_lookup(op);
  CHECK(c.op != NULL);
  c.args = args;
  c.nargs = nargs;
  c.outs = outs;
  c.nouts = nouts;
  c.mutated_args = mutated;
  return tpu_call_clone(&c);
}

static bool has(const char* text, const char* what) {
  if (strstr(text, what)) return true;
  fprintf(stderr, "missing in printed graph: %s\n", what);
  return false;
}

int main(void) {
  static float x[16], w[32], b[4], y[8], z[8], s[8];
  const int64_t sx[2] = {2, 8}, sw[2] = {4, 8}, sb[1] = {4}, sy[2] = {2, 4}, row[1] = {4};
  tpu_tensor_t tx = tt_make(x, TPU_F32, 2, sx), tw = tt_make(w, TPU_F32, 2, sw);
  tpu_tensor_t tb = tt_make(b, TPU_F32, 1, sb), ty = tt_make(y, TPU_F32, 2, sy);
  tpu_tensor_t tz = tt_make(z, TPU_F32, 2, sy), ts = tt_make(s, TPU_F32, 2, sy);
  /* w.t(): 8x4 with strides (1, 8), a view no node produced */
  tpu_tensor_t twt = tw;
  twt.sizes[0] = 8;
  twt.sizes[1] = 4;
  twt.strides[0] = 1;
  twt.strides[1] = 8;
  /* z[1]: the second row of z */
  tpu_tensor_t tz1 = tt_make(z + 4, TPU_F32, 1, row);

  tpu_arg_t a0[5] = {ta_t(&tb), ta_t(&tx), ta_t(&twt), ta_i(1), ta_i(1)};
  tpu_arg_t a1[1] = {ta_t(&ty)};
  tpu_arg_t a2[2] = {ta_t(&tz1), ta_d(3.0)};
  tpu_arg_t a3[3] = {ta_t(&tz), ta_i(1), ta_none()};
  tpu_tensor_t o0 = ty, o1 = tz, o2 = tz1, o3 = ts;
  tpu_call_t* nodes[4] = {
      node("addmm", a0, 5, &o0, 1, 0),
      node("relu", a1, 1, &o1, 1, 0),
      node("mul_.Scalar", a2, 2, &o2, 1, 1),
      node("special_airy_ai", a3, 1, &o3, 1, 0),
  };
  for (int i = 0; i < 4; i++) CHECK(nodes[i] != NULL);
  /* y is dropped after relu: only z and s outlive the graph */
  uint32_t visible[4] = {0, 1, 1, 1};
  tpu_graph_t g = {nodes, 4, 0, NULL, visible};
  CHECK_OK(tpu_graph_verify(&g));

  char* text = NULL;
  size_t len = 0;
  FILE* f = open_memstream(&text, &len);
  CHECK(f != NULL);
  tpu_graph_print(&g, f);
  fclose(f);
  /* parameters: x, w in its own (memory) order, b */
  CHECK(has(text, "func.func @main(%arg0: tensor<2x8xf32> {tpu.buffer"));
  CHECK(has(text, "%arg1: tensor<4x8xf32> {tpu.buffer"));
  CHECK(has(text, "%arg2: tensor<4xf32> {tpu.buffer"));
  CHECK(!strstr(text, "%arg3"));
  CHECK(has(text, "\"stablehlo.transpose\"(%arg1) {permutation = array<i64: 1, 0>}"));
  CHECK(has(text, "lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]"));
  CHECK(has(text, "\"stablehlo.maximum\""));
  /* z[1] *= 3 updates z */
  CHECK(has(text, "\"stablehlo.dynamic_update_slice\""));
  CHECK(has(text, "start_indices = array<i64: 4>, limit_indices = array<i64: 8>"));
  /* special_airy_ai has no mapping: a typed custom call, listed on the module */
  CHECK(has(text, "module @tpu_graph attributes {tpu.custom_calls = [\"aten.special_airy_ai\"]}"));
  CHECK(has(text, "call_target_name = \"aten.special_airy_ai\""));
  CHECK(has(text, ": (tensor<2x4xf32>) -> tensor<2x4xf32>"));
  /* results: updated z and s; not y (dropped) nor the row view alone */
  CHECK(has(text, ") -> (tensor<2x4xf32> {tpu.buffer"));
  const char* ret = strstr(text, "\"func.return\"(");
  CHECK(ret != NULL);
  if (ret) {
    const char* end = strchr(ret, ')');
    int commas = 0;
    for (const char* p = ret; p < end; p++) commas += *p == ',';
    CHECK(commas == 1);
  }
  if (g_failures) fputs(text, stderr);
  free(text);
  for (int i = 0; i < 4; i++) free(nodes[i]);
  TEST_MAIN_END();
}
