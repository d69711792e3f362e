/* The lowering tables (runtime/lower/): sorted and unique, the merged name list
 * in order and complete, and tpu_lower_supports on ops with and without a
 * lowering (the printer's custom_call fallback takes the latter). */
#include <string.h>

#include "lower/lower.h"
#include "test_util.h"
#include "tpu/op.h"

/* op ids: dense, sorted by family name, each name found again; overload names
 * map to their family */
static void test_op_ids(void) {
  CHECK(TPU_OPID_COUNT > 300);
  CHECK(tpu_op_id_name(TPU_OPID_NONE) == NULL);
  CHECK(tpu_op_id_name(TPU_OPID_COUNT) == NULL);
  for (int i = 1; i < TPU_OPID_COUNT; i++) {
    const char* name = tpu_op_id_name((tpu_op_id_t)i);
    CHECK(name != NULL);
    CHECK(tpu_op_id_lookup(name) == (tpu_op_id_t)i);
    if (i > 1) CHECK(strcmp(tpu_op_id_name((tpu_op_id_t)(i - 1)), name) < 0);
  }
  CHECK(!strcmp(tpu_op_id_name(TPU_OPID_add), "add"));
  CHECK(tpu_op_id_of("add.Tensor") == TPU_OPID_add);
  CHECK(tpu_op_id_of("add_.Tensor") == TPU_OPID_add);
  CHECK(tpu_op_id_of("add.out") == TPU_OPID_add);
  CHECK(tpu_op_id_of("_softmax") == TPU_OPID__softmax);
  CHECK(tpu_op_id_of("relu_") == TPU_OPID_relu);
  CHECK(tpu_op_id_of("not_an_op") == TPU_OPID_NONE);
  CHECK(tpu_op_id_lookup("") == TPU_OPID_NONE);
  CHECK(tpu_op_id_lookup(NULL) == TPU_OPID_NONE);
  char b[8];
  tpu_op_base_name("native_layer_norm.out", b, sizeof b);
  CHECK(!strcmp(b, "native"));
}

int main(void) {
  test_op_ids();
  /* sorted, unique, and every name a family with an op id (tools/gen_op_ids.py) */
  const char* bad = NULL;
  int pos = tpu_lower_check(&bad);
  if (pos)
    fprintf(stderr, "lowering tables out of order, or a name without an op id (make opids), at %d: %s\n",
            pos, bad ? bad : "?");
  CHECK(pos == 0);

  /* the listing: count names, strictly increasing, each one supported */
  const size_t n = tpu_lower_count();
  CHECK(n > 100);
  for (size_t i = 0; i < n; i++) {
    const char* name = tpu_lower_name(i);
    CHECK(name != NULL);
    CHECK(tpu_lower_supports(name));
    if (i) CHECK(strcmp(tpu_lower_name(i - 1), name) < 0);
  }
  CHECK(tpu_lower_name(n) == NULL);

  /* overload names, in-place forms and base names */
  const char* known[] = {"add.Tensor", "add_.Tensor", "mm", "mm.out", "sum.dim_IntList", "sum",
                         "_softmax", "convolution", "_convolution", "native_layer_norm",
                         "index.Tensor", "reflection_pad2d", "_to_copy", "neg", "eq.Scalar",
                         "uniform_", "normal.Tensor_Tensor", "bernoulli_.float", "random_.from",
                         "native_dropout", "native_dropout_backward", "geometric_", "cauchy_"};
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
    if (!tpu_lower_supports(known[i])) fprintf(stderr, "no lowering for %s\n", known[i]);
    CHECK(tpu_lower_supports(known[i]));
  }
  /* ops the printer leaves to custom_call (special_airy_ai) */
  const char* unknown[] = {"special_airy_ai", "special_airy_ai.default", "reflection_pad2d_backward",
                           "not_an_op", "ad", "addd", "", "zzz", "_", "."};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    if (tpu_lower_supports(unknown[i])) fprintf(stderr, "unexpected lowering for '%s'\n", unknown[i]);
    CHECK(!tpu_lower_supports(unknown[i]));
  }
  CHECK(!tpu_lower_supports(NULL));
  /* the random ops a target flags TPU_OP_RANDOM; dropout's backward draws nothing */
  const char* random[] = {"uniform_", "uniform.out", "normal_", "normal.float_float_out", "log_normal_",
                          "cauchy_", "exponential_", "geometric_", "bernoulli", "bernoulli_.Tensor",
                          "random_", "random_.to", "random.from_out", "native_dropout", "randperm.out",
                          "randperm.generator_out"};
  for (size_t i = 0; i < sizeof random / sizeof random[0]; i++) {
    if (!tpu_lower_is_random(random[i])) fprintf(stderr, "not flagged random: %s\n", random[i]);
    CHECK(tpu_lower_is_random(random[i]));
  }
  const char* not_random[] = {"native_dropout_backward", "add.Tensor", "randperm_x", "rand", ""};
  for (size_t i = 0; i < sizeof not_random / sizeof not_random[0]; i++) CHECK(!tpu_lower_is_random(not_random[i]));
  CHECK(!tpu_lower_is_random(NULL));
  printf("test_lower: %zu lowered names, ok\n", n);
  return 0;
}
