/* The lowering tables (runtime/lower/): sorted and unique, the merged name list
 * in order and complete, and tpu_lower_supports on ops with and without a
 * lowering (the printer's custom_call fallback takes the latter). */
#include <string.h>

#include "lower/lower.h"
#include "test_util.h"

int main(void) {
  const char* bad = NULL;
  int pos = tpu_lower_check(&bad);
  if (pos) fprintf(stderr, "lowering tables out of order at %d: %s\n", pos, bad ? bad : "?");
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
