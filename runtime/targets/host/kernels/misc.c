/* Miscellaneous nn kernels: log-sigmoid, ELU backward, shrink activations,
 * PReLU, GLU, point-wise losses (MSE, Huber, smooth L1, binary cross
 * entropy) with their backward, and the view-only unfold with its
 * backward.
 *
 * Point-wise formulas run through the element-wise engine: one expression
 * per op generates float and double loop bodies (bf16/f16 compute in float
 * and round once on store). Reduced losses evaluate the point-wise loss in
 * double into a host scratch buffer and sum it in order, so the result does
 * not depend on the number of threads. */
#include <stdatomic.h>
#include <stdlib.h>

#include "kernels.h"

typedef struct {
  double s0, s1, s2; /* op scalars (lambda, delta, alpha, 1/N ...) */
  _Atomic int err;   /* set by a body that found an invalid input */
} misc_ctx_t;

/* ---- loop bodies ----
 * In EXPR: a, b, c, d are the current elements of in[0..3] (only the first
 * K are read); s0..s2 the context scalars and LIT(v) a constant, all in the
 * loop's type; cx the context. */
#define LIT(v) ((elem_t)(v))
#define MLOOP(FN, T, K, EXPR)                                                  \
  static void FN(void* c_, int64_t n, void* o_, const void* const* in) {      \
    typedef T elem_t; (void)sizeof(elem_t);                                    \
    misc_ctx_t* cx = c_;                                                       \
    T* o = o_;                                                                 \
    const T* x0 = in[0];                                                       \
    const T* x1 = K > 1 ? (const T*)in[1] : x0;                                \
    const T* x2 = K > 2 ? (const T*)in[2] : x0;                                \
    const T* x3 = K > 3 ? (const T*)in[3] : x0;                                \
    const T s0 = (T)cx->s0, s1 = (T)cx->s1, s2 = (T)cx->s2;                    \
    (void)s0; (void)s1; (void)s2;                                              \
    for (int64_t i = 0; i < n; i++) {                                          \
      const T a = x0[i], b = x1[i], c = x2[i], d = x3[i];                      \
      (void)a; (void)b; (void)c; (void)d;                                      \
      o[i] = (T)(EXPR);                                                        \
    }                                                                          \
  }
#define MOP(K, NAME, EXPR)                   \
  MLOOP(NAME##_f32, float, K, EXPR)          \
  MLOOP(NAME##_f64, double, K, EXPR)         \
  static const tpu_loop_set_t NAME##_loops = {NAME##_f32, NAME##_f64, NULL, NULL};

#define ABS(x) ((x) < 0 ? -(x) : (x))
#define SIGM(x) (1 / (1 + exp(-(x))))

/* log_sigmoid(x) = min(x, 0) - log1p(exp(-|x|)); the buffer is exp(-|x|) */
MOP(1, log_sigmoid, (a < 0 ? a : LIT(0)) - log1p(exp(-ABS(a))))
MOP(1, log_sigmoid_buffer, exp(-ABS(a)))
/* d/dx: 1 - sigmoid(x) = z / (1 + z) for x >= 0, 1 / (1 + z) for x < 0 */
MOP(2, log_sigmoid_backward,
    a * (b < 0 ? 1 / (1 + exp(-ABS(b))) : exp(-ABS(b)) / (1 + exp(-ABS(b)))))
/* elu_backward; s0 = alpha * scale, s1 = scale, s2 = input_scale; b is the
 * input (elu_backward_input) or the result (elu_backward_result) */
MOP(2, elu_backward_input, b <= 0 ? a * s2 * s0 * exp(b * s2) : a * s1)
MOP(2, elu_backward_result, b <= 0 ? a * s2 * (b + s0) : a * s1)
/* elu with scales (selu); s0 = alpha * scale, s1 = scale, s2 = input_scale */
MOP(1, elu_scaled, a > 0 ? a * s1 : s0 * (exp(a * s2) - 1))
MOP(1, hardshrink, (a >= -s0 && a <= s0) ? LIT(0) : a)
MOP(1, softshrink, a > s0 ? a - s0 : (a < -s0 ? a + s0 : a * 0))
/* shared by hardshrink_backward and softshrink_backward: a grad, b input */
MOP(2, shrink_backward, (b >= -s0 && b <= s0) ? LIT(0) : a)
MOP(2, prelu, a > 0 ? a : b * a)
/* prelu backward: a grad, b input, c weight */
MOP(3, prelu_grad_input, b > 0 ? a : c * a)
MOP(3, prelu_grad_weight, b > 0 ? LIT(0) : b * a)
MOP(2, glu, a * SIGM(b))
/* glu backward: a grad, b first half, c second half */
MOP(3, glu_grad_first, a * SIGM(c))
MOP(3, glu_grad_second, a * b * SIGM(c) * (1 - SIGM(c)))

/* point-wise losses of input a and target b; s0 = delta / beta */
MOP(2, mse, (a - b) * (a - b))
MOP(2, huber, ABS(a - b) < s0 ? LIT(0.5) * (a - b) * (a - b) : s0 * (ABS(a - b) - LIT(0.5) * s0))
MOP(2, smooth_l1, s0 == 0 ? ABS(a - b)
                  : (ABS(a - b) < s0 ? LIT(0.5) * (a - b) * (a - b) / s0 : ABS(a - b) - LIT(0.5) * s0))
/* binary cross entropy with weight c; logs clamp at -100 as PyTorch does */
MOP(3, bce, ((a < 0 || a > 1) ? (atomic_store(&cx->err, 1), LIT(0)) : LIT(0)) -
            c * (b * fmax(log(a), LIT(-100)) + (1 - b) * fmax(log1p(-a), LIT(-100))))
/* backward bodies: a grad, b input, c target (d weight); s1 = 1/N for mean */
MOP(3, mse_backward, 2 * (b - c) * a * s1)
MOP(3, huber_backward, (b - c < -s0 ? -s0 : (b - c > s0 ? s0 : b - c)) * a * s1)
MOP(3, smooth_l1_backward, (s0 == 0 ? (b - c > 0) - (b - c < 0)
                            : (b - c < -s0 ? LIT(-1) : (b - c > s0 ? LIT(1) : (b - c) / s0))) * a * s1)
MOP(4, bce_backward, a * d * (b - c) / fmax((1 - b) * b, LIT(1e-12)) * s1)

/* ---- helpers ---- */
static tpu_ctype_t ct_of(const tpu_tensor_t* const* ins, int n) {
  return tpu_ctype_of(tpu_result_type(ins, n));
}

static tpu_status_t pointwise(const char* op, const tpu_tensor_t* out, const tpu_tensor_t* const* ins,
                              int n, const tpu_loop_set_t* loops, misc_ctx_t* cx) {
  tpu_ctype_t ct = ct_of(ins, n);
  if (ct == TPU_CT_I64)
    return TPU_ERR(INVALID_ARGUMENT, "%s: not implemented for '%s'", op,
                   tpu_dtype_name(tpu_result_type(ins, n)));
  return tpu_elementwise_set(op, out, ins, n, ct, loops, cx);
}

/* A 0-d CPU scalar tensor holding v (double). */
static void scalar_tensor(tpu_tensor_t* t, double v) {
  memset(t, 0, sizeof *t);
  t->dtype = TPU_F64;
  t->flags = TPU_TENSOR_CPU_SCALAR;
  t->data = t->inline_value;
  memcpy(t->inline_value, &v, sizeof v);
}

/* Broadcast shape of a and b into t (sizes only); false when they do not
 * broadcast. */
static bool broadcast_shape(const tpu_tensor_t* a, const tpu_tensor_t* b, tpu_tensor_t* t) {
  int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
  t->ndim = nd;
  for (int i = 0; i < nd; i++) {
    int ia = i - (nd - a->ndim), ib = i - (nd - b->ndim);
    int64_t sa = ia >= 0 ? a->sizes[ia] : 1, sb = ib >= 0 ? b->sizes[ib] : 1;
    if (sa != sb && sa != 1 && sb != 1) return false;
    t->sizes[i] = sa == 1 ? sb : sa;
  }
  return true;
}

enum { REDUCTION_NONE = 0, REDUCTION_MEAN = 1, REDUCTION_SUM = 2 };

/* A point-wise loss over (input, target[, weight]) with reduction: 'none'
 * writes the element-wise loss to the output; 'mean'/'sum' evaluate it in
 * double into a scratch buffer and add it up in order. */
static tpu_status_t loss_forward(const char* op, const tpu_call_t* c, const tpu_tensor_t* const* ins,
                                 int n, int64_t reduction, const tpu_loop_set_t* loops,
                                 misc_ctx_t* cx) {
  const tpu_tensor_t* out = &c->outs[0];
  tpu_status_t st;
  if (reduction == REDUCTION_NONE) {
    st = pointwise(op, out, ins, n, loops, cx);
  } else {
    TPU_CHECK_ARG(reduction == REDUCTION_MEAN || reduction == REDUCTION_SUM,
                  "%s: %lld is not a valid value for reduction", op, (long long)reduction);
    tpu_tensor_t shape;
    TPU_CHECK_ARG(broadcast_shape(ins[0], ins[1], &shape),
                  "%s: the sizes of input and target do not broadcast", op);
    int64_t numel = tpu_tensor_numel(&shape);
    double* buf = malloc((size_t)(numel > 0 ? numel : 1) * sizeof(double));
    if (!buf) return TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory for %lld elements", op,
                             (long long)numel);
    tpu_tensor_t scratch;
    tpu_tensor_make_contig(&scratch, buf, TPU_F64, shape.ndim, shape.sizes);
    /* check the input dtypes with the loop's own type before computing in double */
    if (ct_of(ins, n) == TPU_CT_I64) {
      free(buf);
      return TPU_ERR(INVALID_ARGUMENT, "%s: not implemented for '%s'", op,
                     tpu_dtype_name(tpu_result_type(ins, n)));
    }
    st = tpu_elementwise_set(op, &scratch, ins, n, TPU_CT_F64, loops, cx);
    double total = 0;
    for (int64_t i = 0; i < numel; i++) total += buf[i];
    free(buf);
    if (reduction == REDUCTION_MEAN) total = numel > 0 ? total / (double)numel : NAN;
    if (!st) tpu_store_f64(out->data, out->dtype, total);
  }
  if (!st && atomic_load(&cx->err))
    return TPU_ERR(INVALID_ARGUMENT, "%s: all elements of input should be between 0 and 1", op);
  return st;
}

/* 1/N for 'mean' (N = elements of the gradient), else 1 */
static double mean_scale(const tpu_call_t* c, int64_t reduction) {
  int64_t numel = tpu_tensor_numel(&c->outs[0]);
  return reduction == REDUCTION_MEAN && numel > 0 ? 1.0 / (double)numel : 1.0;
}

/* ---- activations ---- */
/* log_sigmoid_forward(self) -> (output, buffer) */
tpu_status_t tpu_k_log_sigmoid_forward(const tpu_call_t* c) {
  misc_ctx_t cx = {0};
  const tpu_tensor_t* ins[1] = {tpu_arg_tensor(c, 0)};
  TPU_RETURN_IF_ERROR(pointwise("log_sigmoid_forward", &c->outs[0], ins, 1, &log_sigmoid_loops, &cx));
  const tpu_tensor_t* buffer = &c->outs[1];
  /* PyTorch's CPU kernel fills the buffer; an empty buffer is left alone */
  if (c->nouts < 2 || buffer->dtype == TPU_DTYPE_NONE || tpu_tensor_numel(buffer) == 0) return TPU_OK;
  return pointwise("log_sigmoid_forward", buffer, ins, 1, &log_sigmoid_buffer_loops, &cx);
}

/* log_sigmoid_backward(grad_output, self, buffer): recomputes from self, so
 * any buffer (also an empty one) works */
tpu_status_t tpu_k_log_sigmoid_backward(const tpu_call_t* c) {
  misc_ctx_t cx = {0};
  const tpu_tensor_t* ins[2] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1)};
  return pointwise("log_sigmoid_backward", &c->outs[0], ins, 2, &log_sigmoid_backward_loops, &cx);
}

/* elu_backward(grad_output, alpha, scale, input_scale, is_result, self_or_result) */
tpu_status_t tpu_k_elu_backward(const tpu_call_t* c) {
  misc_ctx_t cx = {0};
  double alpha = tpu_arg_f64(c, 1, 1), scale = tpu_arg_f64(c, 2, 1);
  cx.s0 = alpha * scale;
  cx.s1 = scale;
  cx.s2 = tpu_arg_f64(c, 3, 1);
  bool is_result = tpu_arg_bool(c, 4, false);
  TPU_CHECK_ARG(!is_result || alpha >= 0,
                "elu_backward: in-place elu backward with a negative alpha (%g) is not supported",
                alpha);
  const tpu_tensor_t* ins[2] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 5)};
  return pointwise("elu_backward", &c->outs[0], ins, 2,
                   is_result ? &elu_backward_result_loops : &elu_backward_input_loops, &cx);
}

/* elu(self, alpha, scale, input_scale) with scales other than 1 (selu and
 * celu-like uses); elementwise.c's elu handles the default scales */
tpu_status_t tpu_elu_scaled(const tpu_call_t* c) {
  misc_ctx_t cx = {0};
  double scale = tpu_arg_f64(c, 2, 1);
  cx.s0 = tpu_arg_f64(c, 1, 1) * scale;
  cx.s1 = scale;
  cx.s2 = tpu_arg_f64(c, 3, 1);
  const tpu_tensor_t* ins[1] = {tpu_arg_tensor(c, 0)};
  return pointwise("elu", &c->outs[0], ins, 1, &elu_scaled_loops, &cx);
}

static tpu_status_t shrink(const char* op, const tpu_call_t* c, const tpu_loop_set_t* loops) {
  misc_ctx_t cx = {0};
  cx.s0 = tpu_arg_f64(c, 1, 0.5);
  const tpu_tensor_t* ins[1] = {tpu_arg_tensor(c, 0)};
  return pointwise(op, &c->outs[0], ins, 1, loops, &cx);
}
tpu_status_t tpu_k_hardshrink(const tpu_call_t* c) { return shrink("hardshrink", c, &hardshrink_loops); }
tpu_status_t tpu_k_softshrink(const tpu_call_t* c) {
  TPU_CHECK_ARG(tpu_arg_f64(c, 1, 0.5) >= 0,
                "softshrink: lambda must be greater or equal to 0, but found to be %g",
                tpu_arg_f64(c, 1, 0.5));
  return shrink("softshrink", c, &softshrink_loops);
}

/* hardshrink_backward / softshrink_backward(grad, self, lambd) */
tpu_status_t tpu_k_shrink_backward(const tpu_call_t* c) {
  misc_ctx_t cx = {0};
  cx.s0 = tpu_arg_f64(c, 2, 0.5);
  const tpu_tensor_t* ins[2] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1)};
  return pointwise("shrink_backward", &c->outs[0], ins, 2, &shrink_backward_loops, &cx);
}

/* _prelu_kernel(self, weight): weight already broadcastable to self */
tpu_status_t tpu_k_prelu(const tpu_call_t* c) {
  misc_ctx_t cx = {0};
  const tpu_tensor_t* ins[2] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1)};
  return pointwise("_prelu_kernel", &c->outs[0], ins, 2, &prelu_loops, &cx);
}

/* _prelu_kernel_backward(grad, self, weight) -> (grad_input, grad_weight),
 * both of the broadcast shape (autograd sums grad_weight to weight's shape) */
tpu_status_t tpu_k_prelu_backward(const tpu_call_t* c) {
  misc_ctx_t cx = {0};
  const tpu_tensor_t* ins[3] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1), tpu_arg_tensor(c, 2)};
  TPU_RETURN_IF_ERROR(
      pointwise("_prelu_kernel_backward", &c->outs[0], ins, 3, &prelu_grad_input_loops, &cx));
  return pointwise("_prelu_kernel_backward", &c->outs[1], ins, 3, &prelu_grad_weight_loops, &cx);
}

/* The two halves of t along dim (views of the same memory). */
static void split_halves(const tpu_tensor_t* t, int dim, tpu_tensor_t* first, tpu_tensor_t* second) {
  *first = *t;
  first->sizes[dim] = t->sizes[dim] / 2;
  *second = *first;
  second->data = (char*)t->data + first->sizes[dim] * t->strides[dim] *
                                      (int64_t)tpu_dtype_size(t->dtype);
}

static tpu_status_t glu_dim(const char* op, const tpu_tensor_t* self, int64_t dim, int* out) {
  int nd = self->ndim;
  TPU_CHECK_ARG(nd > 0, "%s: glu does not support scalars because halving size must be even", op);
  if (dim < 0) dim += nd;
  TPU_CHECK_ARG(dim >= 0 && dim < nd, "%s: dim %lld out of range for a %d-D tensor", op,
                (long long)dim, nd);
  TPU_CHECK_ARG(self->sizes[dim] % 2 == 0,
                "%s: Halving dimension must be even, but dimension %lld is size %lld", op,
                (long long)dim, (long long)self->sizes[dim]);
  *out = (int)dim;
  return TPU_OK;
}

/* glu(self, dim) = first half * sigmoid(second half) */
tpu_status_t tpu_k_glu(const tpu_call_t* c) {
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  int dim;
  TPU_RETURN_IF_ERROR(glu_dim("glu", self, tpu_arg_i64(c, 1, -1), &dim));
  tpu_tensor_t a, b;
  split_halves(self, dim, &a, &b);
  misc_ctx_t cx = {0};
  const tpu_tensor_t* ins[2] = {&a, &b};
  return pointwise("glu", &c->outs[0], ins, 2, &glu_loops, &cx);
}

/* glu_backward(grad_output, self, dim) */
tpu_status_t tpu_k_glu_backward(const tpu_call_t* c) {
  const tpu_tensor_t* grad = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* self = tpu_arg_tensor(c, 1);
  int dim;
  TPU_RETURN_IF_ERROR(glu_dim("glu_backward", self, tpu_arg_i64(c, 2, -1), &dim));
  tpu_tensor_t a, b, ga, gb;
  split_halves(self, dim, &a, &b);
  split_halves(&c->outs[0], dim, &ga, &gb);
  misc_ctx_t cx = {0};
  const tpu_tensor_t* ins[3] = {grad, &a, &b};
  TPU_RETURN_IF_ERROR(pointwise("glu_backward", &ga, ins, 3, &glu_grad_first_loops, &cx));
  return pointwise("glu_backward", &gb, ins, 3, &glu_grad_second_loops, &cx);
}

/* ---- losses ---- */
/* mse_loss(self, target, reduction) */
tpu_status_t tpu_k_mse_loss(const tpu_call_t* c) {
  misc_ctx_t cx = {0};
  const tpu_tensor_t* ins[2] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1)};
  return loss_forward("mse_loss", c, ins, 2, tpu_arg_i64(c, 2, 1), &mse_loops, &cx);
}
/* huber_loss(self, target, reduction, delta) */
tpu_status_t tpu_k_huber_loss(const tpu_call_t* c) {
  misc_ctx_t cx = {0};
  cx.s0 = tpu_arg_f64(c, 3, 1);
  TPU_CHECK_ARG(cx.s0 > 0, "huber_loss: delta must be positive, but got %g", cx.s0);
  const tpu_tensor_t* ins[2] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1)};
  return loss_forward("huber_loss", c, ins, 2, tpu_arg_i64(c, 2, 1), &huber_loops, &cx);
}
/* smooth_l1_loss(self, target, reduction, beta) */
tpu_status_t tpu_k_smooth_l1_loss(const tpu_call_t* c) {
  misc_ctx_t cx = {0};
  cx.s0 = tpu_arg_f64(c, 3, 1);
  TPU_CHECK_ARG(cx.s0 >= 0, "smooth_l1_loss: beta must be non-negative, but got %g", cx.s0);
  const tpu_tensor_t* ins[2] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1)};
  return loss_forward("smooth_l1_loss", c, ins, 2, tpu_arg_i64(c, 2, 1), &smooth_l1_loops, &cx);
}
/* binary_cross_entropy(self, target, weight?, reduction) */
tpu_status_t tpu_k_binary_cross_entropy(const tpu_call_t* c) {
  misc_ctx_t cx = {0};
  tpu_tensor_t one;
  scalar_tensor(&one, 1.0);
  const tpu_tensor_t* ins[3] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1),
                                tpu_arg_is_none(c, 2) ? &one : tpu_arg_tensor(c, 2)};
  return loss_forward("binary_cross_entropy", c, ins, 3, tpu_arg_i64(c, 3, 1), &bce_loops, &cx);
}

/* *_loss_backward(grad_output, self, target, reduction[, delta/beta]) */
static tpu_status_t loss_backward(const char* op, const tpu_call_t* c, double s0,
                                  const tpu_loop_set_t* loops) {
  misc_ctx_t cx = {0};
  cx.s0 = s0;
  cx.s1 = mean_scale(c, tpu_arg_i64(c, 3, 1));
  const tpu_tensor_t* ins[3] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1), tpu_arg_tensor(c, 2)};
  return pointwise(op, &c->outs[0], ins, 3, loops, &cx);
}
tpu_status_t tpu_k_mse_loss_backward(const tpu_call_t* c) {
  return loss_backward("mse_loss_backward", c, 0, &mse_backward_loops);
}
tpu_status_t tpu_k_huber_loss_backward(const tpu_call_t* c) {
  return loss_backward("huber_loss_backward", c, tpu_arg_f64(c, 4, 1), &huber_backward_loops);
}
tpu_status_t tpu_k_smooth_l1_loss_backward(const tpu_call_t* c) {
  return loss_backward("smooth_l1_loss_backward", c, tpu_arg_f64(c, 4, 1),
                       &smooth_l1_backward_loops);
}
/* binary_cross_entropy_backward(grad_output, self, target, weight?, reduction) */
tpu_status_t tpu_k_binary_cross_entropy_backward(const tpu_call_t* c) {
  misc_ctx_t cx = {0};
  cx.s1 = mean_scale(c, tpu_arg_i64(c, 4, 1));
  tpu_tensor_t one;
  scalar_tensor(&one, 1.0);
  const tpu_tensor_t* ins[4] = {tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1), tpu_arg_tensor(c, 2),
                                tpu_arg_is_none(c, 3) ? &one : tpu_arg_tensor(c, 3)};
  return pointwise("binary_cross_entropy_backward", &c->outs[0], ins, 4, &bce_backward_loops, &cx);
}

/* ---- views ----
 * unfold returns a view: the bridge builds it from the meta result's
 * geometry and never calls a kernel for an all-view op; the table entry only
 * marks the op as served. */
tpu_status_t tpu_k_view_op(const tpu_call_t* c) { return TPU_OK; }

/* unfold_backward(grad_in, input_sizes, dim, size, step): grad_in has the
 * input's shape with dim replaced by the window count, plus a trailing
 * window dim; element (.., w, .., k) adds to input position w * step + k
 * along dim. Sums in double, stores once. A 0-d input has one 1-element
 * window, so its gradient is grad_in itself. */
tpu_status_t tpu_k_unfold_backward(const tpu_call_t* c) {
  const tpu_tensor_t* grad = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* out = &c->outs[0];
  int nd = out->ndim;
  if (nd == 0) {
    TPU_CHECK_ARG(tpu_tensor_numel(grad) == 1, "unfold_backward: expected a 1-element grad for a 0-d input");
    tpu_tensor_t g = *grad;
    g.ndim = 0;
    return tpu_copy_strided(out, &g);
  }
  int64_t dim = tpu_arg_i64(c, 2, 0), step = tpu_arg_i64(c, 4, 1);
  if (dim < 0) dim += nd;
  TPU_CHECK_ARG(dim >= 0 && dim < nd, "unfold_backward: dim %lld out of range for %d dims",
                (long long)tpu_arg_i64(c, 2, 0), nd);
  TPU_CHECK_ARG(step > 0, "unfold_backward: step is %lld but must be > 0", (long long)step);
  TPU_CHECK_ARG(grad->ndim == nd + 1, "unfold_backward: grad has %d dims, expected %d",
                (int)grad->ndim, nd + 1);
  int64_t n = tpu_tensor_numel(out);
  double* acc = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
  if (!acc) return TPU_ERR(RESOURCE_EXHAUSTED, "unfold_backward: out of host memory for %lld elements",
                           (long long)n);
  tpu_tensor_t src; /* contiguous double copy of the input's shape */
  tpu_tensor_make_contig(&src, acc, TPU_F64, nd, out->sizes);
  int gnd = grad->ndim;
  int64_t total = tpu_tensor_numel(grad);
  int64_t idx[TPU_MAX_DIMS + 1] = {0};
  size_t gsz = tpu_dtype_size(grad->dtype);
  tpu_status_t st = TPU_OK;
  for (int64_t e = 0; e < total; e++) {
    int64_t pos = idx[dim] * step + idx[gnd - 1];
    if (pos >= out->sizes[dim]) {
      st = TPU_ERR(OUT_OF_RANGE, "unfold_backward: index %lld is out of bounds for size %lld",
                   (long long)pos, (long long)out->sizes[dim]);
      break;
    }
    int64_t go = 0, io = pos * src.strides[dim];
    for (int d = 0; d < gnd; d++) go += idx[d] * grad->strides[d];
    for (int d = 0; d < nd; d++)
      if (d != dim) io += idx[d] * src.strides[d];
    acc[io] += tpu_load_f64((const char*)grad->data + go * (int64_t)gsz, grad->dtype);
    for (int d = gnd - 1; d >= 0; d--) {
      if (++idx[d] < grad->sizes[d]) break;
      idx[d] = 0;
    }
  }
  if (!st) st = tpu_copy_strided(out, &src);
  free(acc);
  return st;
}
