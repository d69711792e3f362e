/* Pairwise distances: cdist between two sets of row vectors (batched, batch
 * dims broadcast) and pdist within one set (the condensed upper triangle),
 * forward and backward, for every p >= 0 (0: count of differing coordinates,
 * inf: largest coordinate difference). Inputs are staged in their compute
 * type (spatial.h); sums and powers run in double and the result is rounded
 * once on store. */
#include <math.h>

#include "spatial.h"

/* ---- the p-norm of a difference and its derivative ---- */

typedef enum { PN_ZERO, PN_ONE, PN_TWO, PN_INF, PN_LT2, PN_GT2 } pnorm_kind_t;

static pnorm_kind_t pnorm_kind(double p) {
  if (p == 0) return PN_ZERO;
  if (p == 1) return PN_ONE;
  if (p == 2) return PN_TWO;
  if (isinf(p)) return PN_INF;
  return p < 2 ? PN_LT2 : PN_GT2;
}

static inline double ld(const void* base, tpu_dtype_t dt, int64_t i) {
  return dt == TPU_F64 ? ((const double*)base)[i] : (double)((const float*)base)[i];
}
/* a - b as the compute type holds it (the inf-norm gradient compares it with
 * the stored distance) */
static inline double diff(double a, double b, tpu_dtype_t dt) {
  return dt == TPU_F64 ? a - b : (double)(float)(a - b);
}
static inline void st(void* base, tpu_dtype_t dt, int64_t i, double v) {
  if (dt == TPU_F64) ((double*)base)[i] = v;
  else ((float*)base)[i] = (float)v;
}

/* || a[0, m) - b[0, m) ||_p */
static double pnorm_dist(const void* a, int64_t ia, const void* b, int64_t ib, tpu_dtype_t dt,
                         int64_t m, double p, pnorm_kind_t k) {
  double acc = 0;
  for (int64_t c = 0; c < m; c++) {
    double d = fabs(diff(ld(a, dt, ia + c), ld(b, dt, ib + c), dt));
    switch (k) {
      case PN_ZERO: acc += d != 0; break;
      case PN_ONE: acc += d; break;
      case PN_TWO: acc += d * d; break;
      case PN_INF: acc = d > acc || d != d ? d : acc; break;
      default: acc += pow(d, p); break;
    }
  }
  switch (k) {
    case PN_TWO: return sqrt(acc);
    case PN_LT2: case PN_GT2: return pow(acc, 1 / p);
    default: return acc;
  }
}

/* d(dist)/d(diff) for one coordinate difference d of a pair at distance dist
 * (PyTorch's conventions: 0 where dist is 0) */
static inline double pnorm_grad(double d, double dist, double p, pnorm_kind_t k) {
  double s = (double)((d > 0) - (d < 0));
  switch (k) {
    case PN_ZERO: return 0;
    case PN_ONE: return s;
    case PN_TWO: return dist == 0 ? 0 : d / dist;
    case PN_INF: return s * (fabs(d) == dist);
    case PN_LT2:
      return dist == 0 || (d == 0 && p < 1) ? 0 : s * pow(fabs(d), p - 1) / pow(dist, p - 1);
    default: return dist == 0 ? 0 : d * pow(fabs(d), p - 2) / pow(dist, p - 1);
  }
}

/* ---- cdist ---- */

/* Linear batch index into t (batch dims = all but the last two, right-aligned
 * against out's nb batch dims, size-1 dims broadcast) of out's batch b. */
static int64_t bcast_batch(const tpu_tensor_t* t, const int64_t* osz, int nb, int64_t b) {
  int tb = t->ndim - 2;
  int64_t idx = 0, mul = 1;
  for (int d = nb - 1; d >= 0; d--) {
    int64_t i = b % osz[d];
    b /= osz[d];
    int td = d - (nb - tb);
    if (td < 0) continue;
    if (t->sizes[td] != 1) idx += i * mul;
    mul *= t->sizes[td];
  }
  return idx;
}

typedef struct {
  const tpu_tensor_t *x1, *x2, *out;
  const void *a, *b, *g, *dist; /* staged x1, x2 (and grad, cdist for the backward) */
  void* o;
  tpu_dtype_t dt;
  int nb;
  int64_t P, R, M;
  double p;
  pnorm_kind_t k;
} cdist_job_t;

/* items: (batch, row of x1) */
static void cdist_fwd_range(void* ctx, int64_t begin, int64_t end) {
  const cdist_job_t* j = ctx;
  for (int64_t it = begin; it < end; it++) {
    int64_t b = it / j->P, i = it % j->P;
    int64_t b1 = bcast_batch(j->x1, j->out->sizes, j->nb, b);
    int64_t b2 = bcast_batch(j->x2, j->out->sizes, j->nb, b);
    for (int64_t r = 0; r < j->R; r++)
      st(j->o, j->dt, it * j->R + r,
         pnorm_dist(j->a, (b1 * j->P + i) * j->M, j->b, (b2 * j->R + r) * j->M, j->dt, j->M, j->p,
                    j->k));
  }
}

static tpu_status_t check_p(const char* op, double p) {
  if (!(p >= 0))
    return TPU_ERR(INVALID_ARGUMENT, "%s: only supports non-negative p values, got p=%g", op, p);
  return TPU_OK;
}

static tpu_status_t check_rows(const char* op, const tpu_tensor_t* x1, const tpu_tensor_t* x2) {
  if (x1->ndim < 2 || x2->ndim < 2)
    return TPU_ERR(INVALID_ARGUMENT, "%s: only supports at least 2D tensors, got %dD and %dD", op,
                   x1->ndim, x2->ndim);
  if (x1->sizes[x1->ndim - 1] != x2->sizes[x2->ndim - 1])
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: X1 and X2 must have the same number of columns. X1: %lld X2: %lld", op,
                   (long long)x1->sizes[x1->ndim - 1], (long long)x2->sizes[x2->ndim - 1]);
  if (!tpu_dtype_is_float(x1->dtype) || !tpu_dtype_is_float(x2->dtype))
    return TPU_ERR(INVALID_ARGUMENT, "%s: only supports floating-point dtypes, got %s and %s", op,
                   tpu_dtype_name(x1->dtype), tpu_dtype_name(x2->dtype));
  return TPU_OK;
}

/* Fills j from x1 = args[i], x2 = args[i + 1], p = args[i + 2] and
 * out = (batch..., P, R or M). */
static tpu_status_t cdist_setup(const char* op, const tpu_call_t* call, int i, cdist_job_t* j) {
  *j = (cdist_job_t){.x1 = tpu_arg_tensor(call, i), .x2 = tpu_arg_tensor(call, i + 1),
                     .out = &call->outs[0], .p = tpu_arg_f64(call, i + 2, 2)};
  TPU_RETURN_IF_ERROR(check_rows(op, j->x1, j->x2));
  TPU_RETURN_IF_ERROR(check_p(op, j->p));
  j->k = pnorm_kind(j->p);
  j->dt = sp_compute_dtype(j->out->dtype);
  j->nb = j->out->ndim - 2;
  j->P = j->x1->sizes[j->x1->ndim - 2];
  j->R = j->x2->sizes[j->x2->ndim - 2];
  j->M = j->x1->sizes[j->x1->ndim - 1];
  return TPU_OK;
}

/* _cdist_forward(x1, x2, p, compute_mode) -> (batch..., P, R) */
tpu_status_t tpu_k_cdist_forward(const tpu_call_t* call) {
  const char* op = "cdist";
  cdist_job_t j;
  TPU_RETURN_IF_ERROR(cdist_setup(op, call, 0, &j));
  int64_t items = tpu_tensor_numel(j.out) / (j.R > 0 ? j.R : 1);
  if (tpu_tensor_numel(j.out) == 0) return TPU_OK;
  sp_stage_t s1, s2, so;
  TPU_RETURN_IF_ERROR(sp_stage_in(op, j.x1, j.dt, &s1));
  tpu_status_t rc = sp_stage_in(op, j.x2, j.dt, &s2);
  if (rc) {
    sp_stage_free(&s1);
    return rc;
  }
  rc = sp_stage_out(op, j.out, j.dt, false, &so);
  if (!rc) {
    j.a = s1.data;
    j.b = s2.data;
    j.o = so.data;
    sp_parallel(items, j.R * j.M, cdist_fwd_range, &j);
    rc = sp_stage_finish(&so, TPU_OK);
  }
  sp_stage_free(&s1);
  sp_stage_free(&s2);
  return rc;
}

/* items: (batch, row of x1); out = (batch..., P, M) */
static void cdist_bwd_range(void* ctx, int64_t begin, int64_t end) {
  const cdist_job_t* j = ctx;
  for (int64_t it = begin; it < end; it++) {
    int64_t b = it / j->P, i = it % j->P;
    int64_t b1 = bcast_batch(j->x1, j->out->sizes, j->nb, b);
    int64_t b2 = bcast_batch(j->x2, j->out->sizes, j->nb, b);
    int64_t ia = (b1 * j->P + i) * j->M;
    for (int64_t c = 0; c < j->M; c++) {
      double acc = 0, xa = ld(j->a, j->dt, ia + c);
      for (int64_t r = 0; r < j->R; r++) {
        double g = ld(j->g, j->dt, it * j->R + r);
        if (g == 0) continue;
        double d = diff(xa, ld(j->b, j->dt, (b2 * j->R + r) * j->M + c), j->dt);
        acc += g * pnorm_grad(d, ld(j->dist, j->dt, it * j->R + r), j->p, j->k);
      }
      st(j->o, j->dt, it * j->M + c, acc);
    }
  }
}

/* _cdist_backward(grad, x1, x2, p, cdist) -> gradient of x1 over the
 * broadcast batch: (batch..., P, M) */
tpu_status_t tpu_k_cdist_backward(const tpu_call_t* call) {
  const char* op = "cdist_backward";
  const tpu_tensor_t *grad = tpu_arg_tensor(call, 0), *dist = tpu_arg_tensor(call, 4);
  cdist_job_t j;
  TPU_RETURN_IF_ERROR(cdist_setup(op, call, 1, &j));
  int64_t items = j.M > 0 ? tpu_tensor_numel(j.out) / j.M : 0;
  if (tpu_tensor_numel(grad) != items * j.R || tpu_tensor_numel(dist) != items * j.R)
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: grad (%lld elements) and cdist (%lld elements) must hold %lld x %lld "
                   "distances",
                   op, (long long)tpu_tensor_numel(grad), (long long)tpu_tensor_numel(dist),
                   (long long)items, (long long)j.R);
  sp_stage_t s1, s2, sg, sd, so;
  bool zero = items == 0 || j.R == 0;
  tpu_status_t rc = sp_stage_out(op, j.out, j.dt, zero, &so);
  if (rc || zero) return sp_stage_finish(&so, rc);
  rc = sp_stage_in(op, j.x1, j.dt, &s1);
  if (!rc) {
    rc = sp_stage_in(op, j.x2, j.dt, &s2);
    if (!rc) {
      rc = sp_stage_in(op, grad, j.dt, &sg);
      if (!rc) {
        rc = sp_stage_in(op, dist, j.dt, &sd);
        if (!rc) {
          j.a = s1.data, j.b = s2.data, j.g = sg.data, j.dist = sd.data, j.o = so.data;
          sp_parallel(items, j.R * j.M, cdist_bwd_range, &j);
          sp_stage_free(&sd);
        }
        sp_stage_free(&sg);
      }
      sp_stage_free(&s2);
    }
    sp_stage_free(&s1);
  }
  return sp_stage_finish(&so, rc);
}

/* ---- pdist ---- */

typedef struct {
  const void *x, *g, *dist;
  void* o;
  tpu_dtype_t dt;
  int64_t N, M;
  double p;
  pnorm_kind_t k;
} pdist_job_t;

/* Position of pair (i, j), i < j, in the condensed order (row-major upper
 * triangle without the diagonal). */
static inline int64_t pair_index(int64_t N, int64_t i, int64_t j) {
  return i * N - i * (i + 1) / 2 + (j - i - 1);
}

/* items: rows i; each writes its pairs (i, j > i) */
static void pdist_fwd_range(void* ctx, int64_t begin, int64_t end) {
  const pdist_job_t* j = ctx;
  for (int64_t i = begin; i < end; i++)
    for (int64_t r = i + 1; r < j->N; r++)
      st(j->o, j->dt, pair_index(j->N, i, r),
         pnorm_dist(j->x, i * j->M, j->x, r * j->M, j->dt, j->M, j->p, j->k));
}

/* Fills j from self = args[i] (N, M) and p = args[i + 1]. */
static tpu_status_t pdist_setup(const char* op, const tpu_call_t* call, int i, pdist_job_t* j) {
  const tpu_tensor_t* x = tpu_arg_tensor(call, i);
  if (x->ndim != 2)
    return TPU_ERR(INVALID_ARGUMENT, "%s: only supports 2D tensors, got: %dD", op, x->ndim);
  if (!tpu_dtype_is_float(x->dtype))
    return TPU_ERR(INVALID_ARGUMENT, "%s: only supports floating-point dtypes, got %s", op,
                   tpu_dtype_name(x->dtype));
  *j = (pdist_job_t){.N = x->sizes[0], .M = x->sizes[1], .p = tpu_arg_f64(call, i + 1, 2)};
  TPU_RETURN_IF_ERROR(check_p(op, j->p));
  j->k = pnorm_kind(j->p);
  j->dt = sp_compute_dtype(call->outs[0].dtype);
  return TPU_OK;
}

/* _pdist_forward(self, p) -> (N (N - 1) / 2,) */
tpu_status_t tpu_k_pdist_forward(const tpu_call_t* call) {
  const char* op = "pdist";
  const tpu_tensor_t* x = tpu_arg_tensor(call, 0);
  pdist_job_t j;
  TPU_RETURN_IF_ERROR(pdist_setup(op, call, 0, &j));
  if (tpu_tensor_numel(&call->outs[0]) == 0) return TPU_OK;
  sp_stage_t sx, so;
  TPU_RETURN_IF_ERROR(sp_stage_in(op, x, j.dt, &sx));
  tpu_status_t rc = sp_stage_out(op, &call->outs[0], j.dt, false, &so);
  if (!rc) {
    j.x = sx.data;
    j.o = so.data;
    sp_parallel(j.N, j.N * j.M / 2 + 1, pdist_fwd_range, &j);
    rc = sp_stage_finish(&so, TPU_OK);
  }
  sp_stage_free(&sx);
  return rc;
}

/* items: rows i; row i gathers the gradient of every pair it is part of
 * (as the first member with +, as the second with -), so rows are
 * independent. */
static void pdist_bwd_range(void* ctx, int64_t begin, int64_t end) {
  const pdist_job_t* j = ctx;
  for (int64_t i = begin; i < end; i++)
    for (int64_t c = 0; c < j->M; c++) {
      double acc = 0, xi = ld(j->x, j->dt, i * j->M + c);
      for (int64_t r = 0; r < j->N; r++) {
        if (r == i) continue;
        int64_t q = r > i ? pair_index(j->N, i, r) : pair_index(j->N, r, i);
        double g = ld(j->g, j->dt, q);
        if (g == 0) continue;
        double d = diff(xi, ld(j->x, j->dt, r * j->M + c), j->dt); /* x_i - x_r */
        acc += g * pnorm_grad(d, ld(j->dist, j->dt, q), j->p, j->k);
      }
      st(j->o, j->dt, i * j->M + c, acc);
    }
}

/* _pdist_backward(grad, self, p, pdist) -> gradient of self (N, M) */
tpu_status_t tpu_k_pdist_backward(const tpu_call_t* call) {
  const char* op = "pdist_backward";
  const tpu_tensor_t *grad = tpu_arg_tensor(call, 0), *x = tpu_arg_tensor(call, 1);
  const tpu_tensor_t* dist = tpu_arg_tensor(call, 3);
  pdist_job_t j;
  TPU_RETURN_IF_ERROR(pdist_setup(op, call, 1, &j));
  int64_t pairs = j.N * (j.N - 1) / 2;
  if (tpu_tensor_numel(grad) != pairs || tpu_tensor_numel(dist) != pairs)
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: grad (%lld elements) and pdist (%lld elements) must hold %lld distances",
                   op, (long long)tpu_tensor_numel(grad), (long long)tpu_tensor_numel(dist),
                   (long long)pairs);
  sp_stage_t sx, sg, sd, so;
  bool zero = pairs == 0;
  tpu_status_t rc = sp_stage_out(op, &call->outs[0], j.dt, zero, &so);
  if (rc || zero) return sp_stage_finish(&so, rc);
  rc = sp_stage_in(op, x, j.dt, &sx);
  if (!rc) {
    rc = sp_stage_in(op, grad, j.dt, &sg);
    if (!rc) {
      rc = sp_stage_in(op, dist, j.dt, &sd);
      if (!rc) {
        j.x = sx.data, j.g = sg.data, j.dist = sd.data, j.o = so.data;
        sp_parallel(j.N, j.N * j.M, pdist_bwd_range, &j);
        sp_stage_free(&sd);
      }
      sp_stage_free(&sg);
    }
    sp_stage_free(&sx);
  }
  return sp_stage_finish(&so, rc);
}
