/* Margin losses, renorm and segment_reduce: multi_margin_loss and
 * multilabel_margin_loss (forward and backward), renorm (each slice along a
 * dim scaled down to a largest p-norm) and segment_reduce with its backward.
 *
 * These ops work on small rows (one sample's classes, one slice), so the
 * kernels stage their operands into contiguous double (int64 for class
 * indices) host buffers, compute in double in a fixed order and store each
 * result once in the output dtype. Invalid class indices and arguments are
 * reported as errors naming the op and the values; nothing aborts. */
#include <stdlib.h>

#include "kernels.h"

enum { RED_NONE = 0, RED_MEAN = 1, RED_SUM = 2 };

#define OOM(op) TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory", op)

/* the losses' dtypes: float32 and float64, as on CPU */
static tpu_status_t check_float(const char* op, const tpu_tensor_t* t) {
  if (t->dtype != TPU_F32 && t->dtype != TPU_F64)
    return TPU_ERR(UNIMPLEMENTED, "%s: not implemented for '%s'", op, tpu_dtype_name(t->dtype));
  return TPU_OK;
}

/* ---- renorm ---- */

/* renorm(self, p, dim, maxnorm): every slice self.select(dim, k) whose p-norm
 * exceeds maxnorm is scaled by maxnorm / (norm + 1e-7). */
tpu_status_t tpu_k_renorm(const tpu_call_t* c) {
  const char* op = "renorm";
  const tpu_tensor_t* self = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* out = &c->outs[0];
  double p = tpu_arg_f64(c, 1, 2), maxnorm = tpu_arg_f64(c, 3, 1);
  int64_t dim = tpu_arg_i64(c, 2, 0);
  TPU_CHECK_ARG(self, "%s: expected a tensor", op);
  const bool cx = tpu_dtype_is_complex(self->dtype);
  TPU_CHECK_ARG(tpu_dtype_is_float(self->dtype) || cx,
                "%s: Expected a floating point tensor as input. Got %s", op,
                tpu_dtype_name(self->dtype));
  TPU_CHECK_ARG(p > 0, "%s: non-positive-norm not supported (p=%g)", op, p);
  TPU_CHECK_ARG(maxnorm >= 0, "%s: expected maxnorm to be >= 0 but got %g", op, maxnorm);
  TPU_CHECK_ARG(self->ndim > 1, "%s: input needs at least 2 dimensions, got %d dimensions", op,
                self->ndim);
  if (dim < -self->ndim || dim >= self->ndim)
    return TPU_ERR(OUT_OF_RANGE,
                   "%s: Dimension out of range (expected to be in range of [%d, %d], but got %lld)",
                   op, -self->ndim, self->ndim - 1, (long long)dim);
  if (dim < 0) dim += self->ndim;
  int64_t n = tpu_tensor_numel(self);
  if (n == 0) return TPU_OK;
  /* complex input: the norms of the magnitudes, out = self * factor */
  double* x = cx ? tpu_complex_stage_abs(self) : tpu_stage_f64(self, false);
  if (!x) return OOM(op);
  int64_t D = self->sizes[dim], inner = 1;
  for (int d = (int)dim + 1; d < self->ndim; d++) inner *= self->sizes[d];
  int64_t outer = n / (D * inner);
  /* one pass in memory order: acc[k] gathers slice k's sum (or max) */
  double* acc = calloc((size_t)D, sizeof(double));
  if (!acc) {
    free(x);
    return OOM(op);
  }
  const bool pinf = isinf(p);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t k = 0; k < D; k++) {
      const double* r = x + (o * D + k) * inner;
      double s_ = acc[k];
      for (int64_t i = 0; i < inner; i++) {
        double a = fabs(r[i]);
        if (pinf) s_ = (a > s_ || a != a) ? a : s_;
        else if (p == 1) s_ += a;
        else if (p == 2) s_ += a * a;
        else s_ += pow(a, p);
      }
      acc[k] = s_;
    }
  for (int64_t k = 0; k < D; k++) {
    double norm = pinf || p == 1 ? acc[k] : (p == 2 ? sqrt(acc[k]) : pow(acc[k], 1 / p));
    /* the factor as PyTorch computes it: in float for float32 and below */
    double f = norm > maxnorm ? maxnorm / (norm + 1e-7) : 1.0;
    acc[k] = self->dtype != TPU_F64 && self->dtype != TPU_C128 ? (double)(float)f : f;
  }
  if (cx) {
    free(x);
    tpu_status_t s = tpu_complex_scale_slices(out, self, (int)dim, acc);
    free(acc);
    return s;
  }
  for (int64_t o = 0; o < outer; o++)
    for (int64_t k = 0; k < D; k++) {
      double* r = x + (o * D + k) * inner;
      for (int64_t i = 0; i < inner; i++) r[i] *= acc[k];
    }
  free(acc);
  tpu_status_t s = tpu_unstage_f64(out, x);
  free(x);
  return s;
}

/* ---- shared loss checks ---- */

/* (nframe, dim) of a margin loss input: 0-d and 1-d are one sample. */
static tpu_status_t frames_of(const char* op, const tpu_tensor_t* x, int64_t* nframe,
                              int64_t* dim) {
  if (x->ndim <= 1) {
    *nframe = 1;
    *dim = x->ndim == 0 ? 1 : x->sizes[0];
    TPU_CHECK_ARG(*dim > 0, "%s: Expected non-empty vector or matrix with optional 0-dim batch "
                  "size, but got: [0]", op);
  } else {
    TPU_CHECK_ARG(x->ndim == 2 && x->sizes[1] > 0,
                  "%s: Expected non-empty vector or matrix with optional 0-dim batch size, but "
                  "got %d dims with last size %lld", op, x->ndim,
                  (long long)x->sizes[x->ndim - 1]);
    *nframe = x->sizes[0];
    *dim = x->sizes[1];
  }
  return TPU_OK;
}

static tpu_status_t check_target(const char* op, const tpu_tensor_t* t) {
  TPU_CHECK_ARG(t, "%s: expected a target tensor", op);
  TPU_CHECK_ARG(t->dtype == TPU_I64, "%s: expected scalar type Long but found %s for target", op,
                tpu_dtype_name(t->dtype));
  return TPU_OK;
}

/* Checks a margin loss's input (float) and target (long) and reads its
 * frames: nframe samples of dim classes (a vector is one sample). */
static tpu_status_t loss_frames(const char* op, const tpu_tensor_t* self, const tpu_tensor_t* target,
                                int64_t* nframe, int64_t* dim) {
  TPU_CHECK_ARG(self, "%s: expected an input tensor", op);
  tpu_status_t s = check_float(op, self);
  if (!s) s = check_target(op, target);
  if (!s) s = frames_of(op, self, nframe, dim);
  return s;
}

static tpu_status_t check_reduction(const char* op, int64_t r) {
  TPU_CHECK_ARG(r == RED_NONE || r == RED_MEAN || r == RED_SUM,
                "%s: %lld is not a valid value for reduction", op, (long long)r);
  return TPU_OK;
}

/* The start of a margin loss backward: grad_output staged (go), a zeroed
 * grad_input (gi, nframe x dim), and whether grad_output has one value per
 * frame (reduction none) or one in all. On error nothing is left allocated. */
static tpu_status_t grad_begin(const char* op, const tpu_tensor_t* go_t, int64_t nframe, int64_t dim,
                               int64_t reduction, double** go, double** gi, bool* per_frame) {
  TPU_CHECK_ARG(go_t, "%s: expected a grad_output tensor", op);
  *go = tpu_stage_f64(go_t, false);
  *gi = calloc((size_t)(nframe * dim > 0 ? nframe * dim : 1), sizeof(double));
  if (!*go || !*gi) {
    free(*go);
    free(*gi);
    return OOM(op);
  }
  *per_frame = reduction == RED_NONE && go_t->ndim > 0;
  if (*per_frame && tpu_tensor_numel(go_t) != nframe) {
    int64_t got = tpu_tensor_numel(go_t);
    free(*go);
    free(*gi);
    return TPU_ERR(INVALID_ARGUMENT, "%s: grad_output has %lld elements, expected %lld", op,
                   (long long)got, (long long)nframe);
  }
  return TPU_OK;
}

/* 1 / dim, or 1 / (nframe * dim) for the mean: each term's share of a
 * margin loss's gradient before grad_output scales it. */
static double grad_unit(int64_t reduction, int64_t nframe, int64_t dim) {
  return reduction == RED_MEAN ? 1.0 / ((double)nframe * (double)dim) : 1.0 / (double)dim;
}

/* The end of a margin loss backward: each frame's row of gi scaled by its
 * grad_output value (or the single one), stored into out; go and gi freed. */
static tpu_status_t grad_end(const tpu_tensor_t* out, double* go, double* gi, bool per_frame,
                             int64_t nframe, int64_t dim) {
  for (int64_t i = 0; i < nframe; i++) {
    const double gs = per_frame ? go[i] : go[0];
    for (int64_t d = 0; d < dim; d++) gi[i * dim + d] *= gs;
  }
  tpu_status_t s = tpu_unstage_f64(out, gi);
  free(go);
  free(gi);
  return s;
}

/* Stores per-frame losses: all of them (reduction none on a batch), or
 * their sum or mean (the single loss of an unbatched none). */
static tpu_status_t store_loss(const tpu_tensor_t* out, const double* loss, int64_t nframe,
                               int64_t reduction) {
  if (reduction == RED_NONE && out->ndim > 0) return tpu_unstage_f64(out, loss);
  double total = 0;
  for (int64_t i = 0; i < nframe; i++) total += loss[i];
  if (reduction == RED_MEAN) total /= (double)nframe;
  else if (reduction == RED_NONE) total = loss[0];
  tpu_store_f64(out->data, out->dtype, total);
  return TPU_OK;
}

/* ---- multi_margin_loss ---- */

typedef struct {
  const char* op;
  int64_t nframe, dim, reduction;
  double p, margin;
  double *x, *w; /* staged input, weight (NULL when absent) */
  int64_t* y;    /* staged target */
} mm_t;

/* Stages and checks (self, target, p, margin, weight, reduction) starting at
 * argument `a0`. On success the caller frees m->x, m->w, m->y. */
static tpu_status_t mm_setup(const tpu_call_t* c, int a0, mm_t* m, const char* op) {
  memset(m, 0, sizeof *m);
  m->op = op;
  const tpu_tensor_t* self = tpu_arg_tensor(c, a0);
  const tpu_tensor_t* target = tpu_arg_tensor(c, a0 + 1);
  const tpu_tensor_t* weight = tpu_arg_tensor(c, a0 + 4);
  tpu_status_t s = loss_frames(op, self, target, &m->nframe, &m->dim);
  if (s) return s;
  m->p = tpu_arg_f64(c, a0 + 2, 1);
  m->margin = tpu_arg_f64(c, a0 + 3, 1);
  m->reduction = tpu_arg_i64(c, a0 + 5, RED_MEAN);
  if ((s = check_reduction(op, m->reduction))) return s;
  TPU_CHECK_ARG(m->p == 1 || m->p == 2, "%s: only p == 1 and p == 2 supported, got p=%g", op,
                m->p);
  TPU_CHECK_ARG(target->ndim <= 1 && tpu_tensor_numel(target) == m->nframe,
                "%s: inconsistent target size, expected %lld but got %lld elements in %d dims",
                op, (long long)m->nframe, (long long)tpu_tensor_numel(target), target->ndim);
  if (weight) {
    TPU_CHECK_ARG(weight->dtype == self->dtype,
                  "%s: expected scalar type %s but found %s for weight", op,
                  tpu_dtype_name(self->dtype), tpu_dtype_name(weight->dtype));
    TPU_CHECK_ARG(weight->ndim <= 1 && tpu_tensor_numel(weight) == m->dim,
                  "%s: inconsistent weight size, expected %lld but got %lld elements", op,
                  (long long)m->dim, (long long)tpu_tensor_numel(weight));
  }
  m->y = tpu_stage_f64(target, true);
  if (!m->y) return OOM(op);
  for (int64_t i = 0; i < m->nframe; i++)
    if (m->y[i] < 0 || m->y[i] >= m->dim) {
      int64_t bad = m->y[i];
      free(m->y);
      m->y = NULL;
      return TPU_ERR(INVALID_ARGUMENT, "%s: target out of range: target[%lld] = %lld is not in "
                     "[0, %lld)", op, (long long)i, (long long)bad, (long long)m->dim);
    }
  m->x = tpu_stage_f64(self, false);
  m->w = weight ? tpu_stage_f64(weight, false) : NULL;
  if (!m->x || (weight && !m->w)) {
    free(m->x); free(m->w); free(m->y);
    return OOM(op);
  }
  return TPU_OK;
}

static void mm_free(mm_t* m) {
  free(m->x);
  free(m->w);
  free(m->y);
}

tpu_status_t tpu_k_multi_margin_loss(const tpu_call_t* c) {
  mm_t m;
  tpu_status_t s = mm_setup(c, 0, &m, "multi_margin_loss");
  if (s) return s;
  const tpu_tensor_t* out = &c->outs[0];
  double* loss = malloc((size_t)(m.nframe > 0 ? m.nframe : 1) * sizeof(double));
  if (!loss) {
    mm_free(&m);
    return OOM(m.op);
  }
  for (int64_t i = 0; i < m.nframe; i++) {
    const double* x = m.x + i * m.dim;
    int64_t y = m.y[i];
    double wy = m.w ? m.w[y] : 1, sum = 0;
    for (int64_t d = 0; d < m.dim; d++) {
      if (d == y) continue;
      double z = m.margin - x[y] + x[d];
      if (z > 0) sum += (m.p == 1 ? z : z * z) * wy;
    }
    loss[i] = sum / (double)m.dim;
  }
  s = store_loss(out, loss, m.nframe, m.reduction);
  free(loss);
  mm_free(&m);
  return s;
}

/* multi_margin_loss_backward(grad_output, self, target, p, margin, weight,
 * reduction) -> grad_input */
tpu_status_t tpu_k_multi_margin_loss_backward(const tpu_call_t* c) {
  mm_t m;
  tpu_status_t s = mm_setup(c, 1, &m, "multi_margin_loss_backward");
  if (s) return s;
  const tpu_tensor_t* out = &c->outs[0];
  double *go, *gi;
  bool per_frame;
  if ((s = grad_begin(m.op, tpu_arg_tensor(c, 0), m.nframe, m.dim, m.reduction, &go, &gi, &per_frame))) {
    mm_free(&m);
    return s;
  }
  const double g = grad_unit(m.reduction, m.nframe, m.dim);
  for (int64_t i = 0; i < m.nframe; i++) {
    const double* x = m.x + i * m.dim;
    double* r = gi + i * m.dim;
    int64_t y = m.y[i];
    double wy = m.w ? m.w[y] : 1, ysum = 0;
    for (int64_t d = 0; d < m.dim; d++) {
      if (d == y) continue;
      double z = m.margin - x[y] + x[d];
      if (z > 0) {
        double h = (m.p == 1 ? g : 2 * g * z) * wy;
        r[d] = h;
        ysum += h;
      }
    }
    r[y] = -ysum;
  }
  s = grad_end(out, go, gi, per_frame, m.nframe, m.dim);
  mm_free(&m);
  return s;
}

/* ---- multilabel_margin_loss ---- */

typedef struct {
  const char* op;
  int64_t nframe, dim, reduction;
  double* x;
  int64_t* y;
} ml_t;

/* Stages and checks (self, target, reduction) from argument a0. Targets of
 * a sample are its leading entries up to the first -1. */
static tpu_status_t ml_setup(const tpu_call_t* c, int a0, ml_t* m, const char* op) {
  memset(m, 0, sizeof *m);
  m->op = op;
  const tpu_tensor_t* self = tpu_arg_tensor(c, a0);
  const tpu_tensor_t* target = tpu_arg_tensor(c, a0 + 1);
  tpu_status_t s = loss_frames(op, self, target, &m->nframe, &m->dim);
  if (s) return s;
  m->reduction = tpu_arg_i64(c, a0 + 2, RED_MEAN);
  if ((s = check_reduction(op, m->reduction))) return s;
  bool ok = self->ndim <= 1 ? (target->ndim <= 1 && tpu_tensor_numel(target) == m->dim)
                            : (target->ndim == 2 && target->sizes[0] == m->nframe &&
                               target->sizes[1] == m->dim);
  TPU_CHECK_ARG(ok, "%s: inconsistent target size: target has %d dims and %lld elements, input "
                "is %lld samples of %lld classes", op, target->ndim,
                (long long)tpu_tensor_numel(target), (long long)m->nframe, (long long)m->dim);
  m->y = tpu_stage_f64(target, true);
  if (!m->y) return OOM(op);
  for (int64_t i = 0; i < m->nframe * m->dim; i++)
    if (m->y[i] < -1 || m->y[i] >= m->dim) {
      int64_t bad = m->y[i];
      free(m->y);
      m->y = NULL;
      return TPU_ERR(INVALID_ARGUMENT, "%s: argument #2 'target' is out of range: %lld is not in "
                     "[-1, %lld)", op, (long long)bad, (long long)m->dim);
    }
  m->x = tpu_stage_f64(self, false);
  if (!m->x) {
    free(m->y);
    return OOM(op);
  }
  return TPU_OK;
}

/* is_target row of sample i into mark[0, dim) */
static void ml_mark(const ml_t* m, int64_t i, double* mark) {
  const int64_t* y = m->y + i * m->dim;
  memset(mark, 0, (size_t)m->dim * sizeof(double));
  for (int64_t j = 0; j < m->dim && y[j] >= 0; j++) mark[y[j]] = 1;
}

/* multilabel_margin_loss_forward(self, target, reduction) -> (output, is_target) */
tpu_status_t tpu_k_multilabel_margin_loss_forward(const tpu_call_t* c) {
  ml_t m;
  tpu_status_t s = ml_setup(c, 0, &m, "multilabel_margin_loss_forward");
  if (s) return s;
  const tpu_tensor_t* out = &c->outs[0];
  const tpu_tensor_t* ist = &c->outs[1];
  int64_t nd = m.nframe * m.dim;
  double* mark = malloc((size_t)(nd > 0 ? nd : 1) * sizeof(double));
  double* loss = malloc((size_t)(m.nframe > 0 ? m.nframe : 1) * sizeof(double));
  if (!mark || !loss) {
    free(mark); free(loss); free(m.x); free(m.y);
    return OOM(m.op);
  }
  for (int64_t i = 0; i < m.nframe; i++) {
    const double* x = m.x + i * m.dim;
    const int64_t* y = m.y + i * m.dim;
    double* mk = mark + i * m.dim;
    ml_mark(&m, i, mk);
    double sum = 0;
    for (int64_t j = 0; j < m.dim && y[j] >= 0; j++) {
      double xt = x[y[j]];
      for (int64_t d = 0; d < m.dim; d++) {
        if (mk[d] != 0) continue;
        double z = 1 - xt + x[d];
        if (z > 0) sum += z;
      }
    }
    loss[i] = sum / (double)m.dim;
  }
  s = store_loss(out, loss, m.nframe, m.reduction);
  if (!s) {
    TPU_CHECK_ARG(tpu_tensor_numel(ist) == nd, "%s: is_target has %lld elements, expected %lld",
                  m.op, (long long)tpu_tensor_numel(ist), (long long)nd);
    s = tpu_unstage_f64(ist, mark);
  }
  free(mark);
  free(loss);
  free(m.x);
  free(m.y);
  return s;
}

/* multilabel_margin_loss_backward(grad_output, self, target, reduction,
 * is_target) -> grad_input. The target marks are recomputed from target
 * (they are what the forward stored in is_target). */
tpu_status_t tpu_k_multilabel_margin_loss_backward(const tpu_call_t* c) {
  ml_t m;
  tpu_status_t s = ml_setup(c, 1, &m, "multilabel_margin_loss_backward");
  if (s) return s;
  const tpu_tensor_t* out = &c->outs[0];
  double *go, *gi;
  bool per_frame;
  double* mk = malloc((size_t)m.dim * sizeof(double));
  if (!mk) s = OOM(m.op);
  else s = grad_begin(m.op, tpu_arg_tensor(c, 0), m.nframe, m.dim, m.reduction, &go, &gi, &per_frame);
  if (s) {
    free(mk); free(m.x); free(m.y);
    return s;
  }
  const double g = grad_unit(m.reduction, m.nframe, m.dim);
  for (int64_t i = 0; i < m.nframe; i++) {
    const double* x = m.x + i * m.dim;
    const int64_t* y = m.y + i * m.dim;
    double* r = gi + i * m.dim;
    ml_mark(&m, i, mk);
    for (int64_t j = 0; j < m.dim && y[j] >= 0; j++) {
      double xt = x[y[j]];
      for (int64_t d = 0; d < m.dim; d++) {
        if (mk[d] != 0) continue;
        if (1 - xt + x[d] > 0) {
          r[y[j]] -= g;
          r[d] += g;
        }
      }
    }
  }
  s = grad_end(out, go, gi, per_frame, m.nframe, m.dim);
  free(mk);
  free(m.x);
  free(m.y);
  return s;
}

/* ---- segment_reduce ----
 * data viewed as (outer, n, inner) around `axis`; segments of the n axis
 * come from lengths (outer, S) or offsets (outer, S + 1). Each (outer,
 * segment, inner) result reduces its elements in order, in double:
 *   sum: initial + sum, prod: initial * prod, mean: (initial + sum) / len,
 *   max/min: over initial and the elements (NaN wins);
 * an empty segment gives initial, or without it 0, 1, NaN, -inf, +inf. */
typedef enum { SEG_SUM, SEG_PROD, SEG_MEAN, SEG_MAX, SEG_MIN } seg_op_t;

typedef struct {
  seg_op_t op;
  bool has_init;
  double init;
  int64_t outer, n, inner, nseg;
  int64_t* start; /* [outer][nseg + 1] element positions along the axis */
} seg_t;

static tpu_status_t seg_setup(const char* op, const tpu_call_t* c, const tpu_tensor_t* data,
                              const char* reduce, const tpu_tensor_t* lengths,
                              const tpu_tensor_t* offsets, int64_t axis, int init_arg,
                              bool check_sum, seg_t* s) {
  static const char* const names[] = {"sum", "prod", "mean", "max", "min"};
  memset(s, 0, sizeof *s);
  int k = 0;
  while (k < 5 && strcmp(reduce, names[k]) != 0) k++;
  if (k == 5)
    return TPU_ERR(INVALID_ARGUMENT, "%s: reduction '%s' is not one of sum, prod, mean, max, min",
                   op, reduce);
  s->op = (seg_op_t)k;
  if (!tpu_dtype_is_float(data->dtype))
    return TPU_ERR(UNIMPLEMENTED, "%s: not implemented for '%s'", op, tpu_dtype_name(data->dtype));
  if ((lengths == NULL) == (offsets == NULL))
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected exactly one of lengths or offsets", op);
  const tpu_tensor_t* seg = lengths ? lengths : offsets;
  if (seg->dtype != TPU_I64 && seg->dtype != TPU_I32)
    return TPU_ERR(INVALID_ARGUMENT, "%s: lengths and offsets must be int32 or int64, got %s", op,
                   tpu_dtype_name(seg->dtype));
  if (axis < 0) axis += data->ndim;
  if (data->ndim < 1 || axis < 0 || axis >= data->ndim || seg->ndim != axis + 1)
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: axis %lld must be the last dim of the %d-D %s for %d-D data", op,
                   (long long)axis, (int)seg->ndim, lengths ? "lengths" : "offsets",
                   (int)data->ndim);
  s->outer = 1;
  for (int d = 0; d < axis; d++) {
    if (seg->sizes[d] != data->sizes[d])
      return TPU_ERR(INVALID_ARGUMENT, "%s: %s has size %lld at dim %d, data %lld", op,
                     lengths ? "lengths" : "offsets", (long long)seg->sizes[d], d,
                     (long long)data->sizes[d]);
    s->outer *= data->sizes[d];
  }
  s->n = data->sizes[axis];
  s->inner = 1;
  for (int d = (int)axis + 1; d < data->ndim; d++) s->inner *= data->sizes[d];
  s->nseg = seg->sizes[axis] - (offsets ? 1 : 0);
  if (s->nseg < 0) return TPU_ERR(INVALID_ARGUMENT, "%s: offsets must not be empty", op);
  if (!tpu_arg_is_none(c, init_arg)) {
    s->has_init = true;
    s->init = tpu_arg_f64(c, init_arg, 0);
  }
  int64_t* raw = tpu_stage_f64(seg, true);
  s->start = malloc(sizeof(int64_t) * (size_t)(s->outer * (s->nseg + 1)));
  if (!raw || !s->start) {
    free(raw);
    free(s->start);
    s->start = NULL;
    return OOM(op);
  }
  tpu_status_t st = TPU_OK;
  for (int64_t o = 0; o < s->outer && !st; o++) {
    int64_t* b = s->start + o * (s->nseg + 1);
    const int64_t* r = raw + o * (s->nseg + (offsets ? 1 : 0));
    b[0] = offsets ? r[0] : 0;
    for (int64_t j = 0; j < s->nseg && !st; j++) {
      int64_t len = offsets ? r[j + 1] - r[j] : r[j];
      if (len < 0) st = TPU_ERR(INVALID_ARGUMENT, "%s: lengths contains negative value!", op);
      b[j + 1] = b[j] + len;
    }
    if (!st && (b[0] < 0 || b[s->nseg] > s->n))
      st = TPU_ERR(INVALID_ARGUMENT, "%s: segments cover [%lld, %lld), outside the %lld elements",
                   op, (long long)b[0], (long long)b[s->nseg], (long long)s->n);
    if (!st && check_sum && lengths && b[s->nseg] != s->n)
      st = TPU_ERR(INVALID_ARGUMENT,
                   "%s: Expected all rows of lengths along axis to sum to data.size(%lld) = "
                   "%lld when !unsafe, got %lld",
                   op, (long long)axis, (long long)s->n, (long long)b[s->nseg]);
  }
  free(raw);
  if (st) {
    free(s->start);
    s->start = NULL;
  }
  return st;
}

/* The reduction of segment j of outer o at inner position i (x: staged data). */
static double seg_value(const seg_t* s, const double* x, int64_t o, int64_t j, int64_t i) {
  const int64_t b = s->start[o * (s->nseg + 1) + j], e = s->start[o * (s->nseg + 1) + j + 1];
  const double* p = x + (o * s->n) * s->inner + i;
  double acc;
  switch (s->op) {
    case SEG_PROD: acc = s->has_init ? s->init : 1; break;
    case SEG_MAX: acc = s->has_init ? s->init : -INFINITY; break;
    case SEG_MIN: acc = s->has_init ? s->init : INFINITY; break;
    default: acc = s->has_init ? s->init : 0; break;
  }
  for (int64_t k = b; k < e; k++) {
    double v = p[k * s->inner];
    if (s->op == SEG_PROD) acc *= v;
    else if (s->op == SEG_MAX) acc = (v > acc || v != v || acc != acc) ? (acc != acc ? acc : v) : acc;
    else if (s->op == SEG_MIN) acc = (v < acc || v != v || acc != acc) ? (acc != acc ? acc : v) : acc;
    else acc += v;
  }
  if (s->op == SEG_MEAN) acc = e > b ? acc / (double)(e - b) : (s->has_init ? s->init : NAN);
  return acc;
}

/* segment_reduce(data, reduce, lengths?, indices?, offsets?, axis, unsafe, initial?) */
tpu_status_t tpu_k_segment_reduce(const tpu_call_t* c) {
  const char* op = "segment_reduce";
  const tpu_tensor_t* data = tpu_arg_tensor(c, 0);
  if (!tpu_arg_is_none(c, 3))
    return TPU_ERR(UNIMPLEMENTED, "%s: indices based reduction is not supported yet", op);
  seg_t s;
  TPU_RETURN_IF_ERROR(seg_setup(op, c, data, tpu_arg_str(c, 1, ""),
                                tpu_arg_is_none(c, 2) ? NULL : tpu_arg_tensor(c, 2),
                                tpu_arg_is_none(c, 4) ? NULL : tpu_arg_tensor(c, 4),
                                tpu_arg_i64(c, 5, 0), 7, !tpu_arg_bool(c, 6, false), &s));
  const tpu_tensor_t* out = &c->outs[0];
  double* x = tpu_stage_f64(data, false);
  double* y = malloc(sizeof(double) * (size_t)(s.outer * s.nseg * s.inner + 1));
  tpu_status_t st = TPU_OK;
  if (!x || !y) {
    st = OOM(op);
  } else {
    for (int64_t o = 0; o < s.outer; o++)
      for (int64_t j = 0; j < s.nseg; j++)
        for (int64_t i = 0; i < s.inner; i++)
          y[(o * s.nseg + j) * s.inner + i] = seg_value(&s, x, o, j, i);
    st = tpu_unstage_f64(out, y);
  }
  free(x);
  free(y);
  free(s.start);
  return st;
}

/* _segment_reduce_backward(grad, output, data, reduce, lengths?, offsets?,
 * axis, initial?): sum: grad; mean: grad / len; max/min: grad shared evenly
 * by the elements equal to the result; prod: grad * the product of the
 * others (and initial), from prefix and suffix products, so zeros in the
 * segment need no division. */
tpu_status_t tpu_k_segment_reduce_backward(const tpu_call_t* c) {
  const char* op = "_segment_reduce_backward";
  const tpu_tensor_t *grad = tpu_arg_tensor(c, 0), *output = tpu_arg_tensor(c, 1);
  const tpu_tensor_t* data = tpu_arg_tensor(c, 2);
  seg_t s;
  TPU_RETURN_IF_ERROR(seg_setup(op, c, data, tpu_arg_str(c, 3, ""),
                                tpu_arg_is_none(c, 4) ? NULL : tpu_arg_tensor(c, 4),
                                tpu_arg_is_none(c, 5) ? NULL : tpu_arg_tensor(c, 5),
                                tpu_arg_i64(c, 6, 0), 7, false, &s));
  const int64_t nout = s.outer * s.nseg * s.inner;
  if (tpu_tensor_numel(grad) != nout || tpu_tensor_numel(output) != nout) {
    free(s.start);
    return TPU_ERR(INVALID_ARGUMENT, "%s: grad and output must hold %lld elements", op,
                   (long long)nout);
  }
  double *x = tpu_stage_f64(data, false), *g = tpu_stage_f64(grad, false), *y = tpu_stage_f64(output, false);
  double* gx = calloc((size_t)(s.outer * s.n * s.inner + 1), sizeof(double));
  double* pre = malloc(sizeof(double) * (size_t)(s.n + 1)); /* prod: one segment's prefixes */
  tpu_status_t st = TPU_OK;
  if (!x || !g || !y || !gx || !pre) {
    st = OOM(op);
    goto done;
  }
  for (int64_t o = 0; o < s.outer; o++)
    for (int64_t j = 0; j < s.nseg; j++) {
      const int64_t b = s.start[o * (s.nseg + 1) + j], e = s.start[o * (s.nseg + 1) + j + 1];
      for (int64_t i = 0; i < s.inner; i++) {
        const int64_t oi = (o * s.nseg + j) * s.inner + i;
        const double gv = g[oi], yv = y[oi];
        const double* px = x + (o * s.n) * s.inner + i;
        double* pg = gx + (o * s.n) * s.inner + i;
        if (s.op == SEG_SUM || s.op == SEG_MEAN) {
          const double v = s.op == SEG_MEAN ? gv / (double)(e > b ? e - b : 1) : gv;
          for (int64_t k = b; k < e; k++) pg[k * s.inner] = v;
        } else if (s.op == SEG_MAX || s.op == SEG_MIN) {
          int64_t ties = 0;
          for (int64_t k = b; k < e; k++) {
            const double v = px[k * s.inner];
            ties += v == yv || (v != v && yv != yv);
          }
          for (int64_t k = b; k < e; k++) {
            const double v = px[k * s.inner];
            pg[k * s.inner] = (v == yv || (v != v && yv != yv)) ? gv / (double)ties : 0;
          }
        } else { /* prod: initial times the product of the others, zeros included:
                  * the product before k (kept in pre) times the one after it */
          double acc = s.has_init ? s.init : 1;
          for (int64_t k = b; k < e; k++) {
            pre[k - b] = acc;
            acc *= px[k * s.inner];
          }
          double after = 1;
          for (int64_t k = e - 1; k >= b; k--) {
            pg[k * s.inner] = gv * (pre[k - b] * after);
            after *= px[k * s.inner];
          }
        }
      }
    }
  st = tpu_unstage_f64(&c->outs[0], gx);
done:
  free(x);
  free(g);
  free(y);
  free(gx);
  free(pre);
  free(s.start);
  return st;
}
