/* Complex calls computed by a real kernel, part by part.
 *
 * An op that only moves and adds values with real weights (padding, im2col,
 * col2im) acts on the real and imaginary numbers of a complex tensor
 * independently: its kernel runs twice on real strided views, once over the
 * real parts and once over the imaginary parts of every complex operand.
 */
#include "kernels.h"

/* The real (part 0) or imaginary (part 1) numbers of complex tensor t as a
 * real strided view. */
static void part_view(const tpu_tensor_t* t, int part, tpu_tensor_t* v) {
  *v = *t;
  v->dtype = tpu_dtype_complex_part(t->dtype);
  for (int d = 0; d < t->ndim; d++) v->strides[d] = 2 * t->strides[d];
  v->data = (char*)t->data + (size_t)part * tpu_dtype_size(v->dtype);
}

#define PARTS_MAX_ARGS 16

tpu_status_t tpu_complex_by_parts(const tpu_call_t* c) {
  const char* op = c->op ? c->op->name : "complex op";
  if (c->nargs > PARTS_MAX_ARGS || c->nouts > PARTS_MAX_ARGS)
    return TPU_ERR(INTERNAL, "%s: too many arguments for a complex call by parts", op);
  for (int i = 0; i < c->nargs; i++)
    if (c->args[i].kind == TPU_ARG_COMPLEX)
      return TPU_ERR(UNIMPLEMENTED, "%s: a complex scalar argument is not implemented on tpu", op);
  tpu_arg_t args[PARTS_MAX_ARGS];
  tpu_tensor_t ins[PARTS_MAX_ARGS], outs[PARTS_MAX_ARGS];
  for (int part = 0; part < 2; part++) {
    memcpy(args, c->args, sizeof(tpu_arg_t) * (size_t)c->nargs);
    memcpy(outs, c->outs, sizeof(tpu_tensor_t) * (size_t)c->nouts);
    for (int i = 0; i < c->nargs; i++) {
      if (args[i].kind != TPU_ARG_TENSOR || !tpu_dtype_is_complex(args[i].v.t->dtype)) continue;
      part_view(c->args[i].v.t, part, &ins[i]);
      args[i].v.t = &ins[i];
    }
    for (int o = 0; o < c->nouts; o++)
      if (tpu_dtype_is_complex(outs[o].dtype)) part_view(&c->outs[o], part, &outs[o]);
    tpu_call_t c2 = *c;
    c2.args = args;
    c2.outs = outs;
    TPU_RETURN_IF_ERROR(c->op->fn(&c2));
  }
  return TPU_OK;
}
