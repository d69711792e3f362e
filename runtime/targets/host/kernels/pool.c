/* Pooling kernels: max pooling with indices, average pooling, adaptive
 * average and max pooling, for 2 and 3 spatial dims (1-d pooling reaches
 * the backend as 2-d), fractional max pooling, and their backward.
 *
 * Inputs are (N, C, spatial...) or (C, spatial...); every (n, c) plane is
 * pooled independently from staged contiguous planes (spatial.h), planes in
 * parallel. Windows follow PyTorch's CPU kernels exactly: max pooling takes
 * the first maximum, or the last NaN; average pooling divides the window sum
 * by divisor_override, the padded window size (count_include_pad) or the
 * number of input elements; adaptive windows are [floor(o * in / out),
 * ceil((o + 1) * in / out)). Values are compared and summed in float
 * (float32, bfloat16, float16), double (float64) or int64 (integers, where
 * averages divide like C integers).
 */
#include "matmul.h"
#include "spatial.h"

typedef enum { P_MAX, P_AVG, P_ADAPTIVE_AVG, P_ADAPTIVE_MAX } pool_kind_t;

typedef struct {
  pool_kind_t kind;
  int64_t in[3], out[3], k[3], s[3], p[3], d[3];
  int64_t in_len, out_len, lanes;
  bool count_include_pad;
  int64_t divisor; /* 0: none */
} pool_geo_t;

/* Input positions of one output coordinate along one dim: first + i * step
 * for i < count; `size` is the padded window length (average pooling). */
typedef struct {
  int64_t first, count, step, size;
} win_t;

static win_t window(const pool_geo_t* g, int dim, int64_t o) {
  win_t w;
  int64_t in = g->in[dim];
  if (g->kind == P_ADAPTIVE_AVG || g->kind == P_ADAPTIVE_MAX) {
    int64_t out = g->out[dim];
    w.first = o * in / out;
    w.count = ((o + 1) * in + out - 1) / out - w.first;
    w.step = 1;
    w.size = w.count;
    return w;
  }
  int64_t start = o * g->s[dim] - g->p[dim];
  if (g->kind == P_AVG) {
    int64_t end = start + g->k[dim] < in + g->p[dim] ? start + g->k[dim] : in + g->p[dim];
    w.size = end - start;
    w.first = start > 0 ? start : 0;
    w.count = (end < in ? end : in) - w.first;
    w.step = 1;
  } else { /* dilated positions start + j * d, j < k, inside [0, in) */
    int64_t d = g->d[dim];
    int64_t jlo = start >= 0 ? 0 : (-start + d - 1) / d;
    int64_t jhi = in - start <= 0 ? 0 : (in - start + d - 1) / d;
    if (jhi > g->k[dim]) jhi = g->k[dim];
    w.first = start + jlo * d;
    w.count = jhi - jlo;
    w.step = d;
    w.size = g->k[dim];
  }
  if (w.count < 0) w.count = 0;
  return w;
}

/* Divisor of an average over the windows of one output element. */
static int64_t avg_divisor(const pool_geo_t* g, const win_t w[3]) {
  if (g->divisor) return g->divisor;
  if (g->count_include_pad) return w[0].size * w[1].size * w[2].size;
  return w[0].count * w[1].count * w[2].count;
}

#define FOR_WINDOW(w, IDX, BODY)                                                    \
  for (int64_t a_ = 0; a_ < (w)[0].count; a_++)                                     \
    for (int64_t b_ = 0; b_ < (w)[1].count; b_++) {                                 \
      int64_t row_ = (((w)[0].first + a_ * (w)[0].step) * g->in[1] + (w)[1].first +  \
                      b_ * (w)[1].step) * g->in[2];                                  \
      for (int64_t c_ = 0; c_ < (w)[2].count; c_++) {                               \
        int64_t IDX = row_ + (w)[2].first + c_ * (w)[2].step;                        \
        BODY                                                                        \
      }                                                                             \
    }

#define FOR_OUTPUT(w, O, BODY)                                          \
  for (int64_t od_ = 0, O = 0; od_ < g->out[0]; od_++) {                \
    (w)[0] = window(g, 0, od_);                                         \
    for (int64_t oh_ = 0; oh_ < g->out[1]; oh_++) {                     \
      (w)[1] = window(g, 1, oh_);                                       \
      for (int64_t ow_ = 0; ow_ < g->out[2]; ow_++, O++) {              \
        (w)[2] = window(g, 2, ow_);                                     \
        BODY                                                            \
      }                                                                 \
    }                                                                   \
  }

/* Forward of one plane (and its indices for max kinds), per compute type.
 * LOWEST starts a max; ISNAN(v) makes a NaN win. */
#define DEFINE_POOL_FWD(SUF, T, LOWEST, ISNAN)                                        \
  static void pool_fwd_##SUF(const pool_geo_t* g, const T* in, T* out, int64_t* ind) { \
    win_t w[3];                                                                       \
    if (g->kind == P_MAX || g->kind == P_ADAPTIVE_MAX) {                              \
      FOR_OUTPUT(w, o, {                                                              \
        T best = LOWEST;                                                              \
        int64_t bi = (w[0].first * g->in[1] + w[1].first) * g->in[2] + w[2].first;    \
        FOR_WINDOW(w, i, {                                                            \
          T v = in[i];                                                                \
          if (v > best || ISNAN(v)) {                                                 \
            best = v;                                                                 \
            bi = i;                                                                   \
          }                                                                           \
        })                                                                            \
        out[o] = best;                                                                \
        ind[o] = bi;                                                                  \
      })                                                                              \
    } else {                                                                          \
      FOR_OUTPUT(w, o, {                                                              \
        T sum = 0;                                                                    \
        FOR_WINDOW(w, i, { sum += in[i]; })                                           \
        if (w[0].count <= 0 || w[1].count <= 0 || w[2].count <= 0)                    \
          out[o] = 0;                                                                 \
        else if (g->kind == P_AVG)                                                    \
          out[o] = sum / (T)avg_divisor(g, w);                                        \
        else                                                                          \
          out[o] = sum / (T)w[0].count / (T)w[1].count / (T)w[2].count;               \
      })                                                                              \
    }                                                                                 \
  }

#define NO_NAN(v) false
DEFINE_POOL_FWD(f32, float, -INFINITY, isnan)
DEFINE_POOL_FWD(f64, double, -INFINITY, isnan)
DEFINE_POOL_FWD(i64, int64_t, INT64_MIN, NO_NAN)

/* Backward of one plane of an average kind (gin starts at zero). */
#define DEFINE_POOL_BWD(SUF, T)                                                       \
  static void pool_bwd_##SUF(const pool_geo_t* g, const T* gout, T* gin) {            \
    win_t w[3];                                                                       \
    FOR_OUTPUT(w, o, {                                                                \
      T delta = g->kind == P_AVG                                                      \
                    ? gout[o] / (T)avg_divisor(g, w)                                  \
                    : gout[o] / (T)w[0].count / (T)w[1].count / (T)w[2].count;        \
      FOR_WINDOW(w, i, { gin[i] += delta; })                                          \
    })                                                                                \
  }
DEFINE_POOL_BWD(f32, float)
DEFINE_POOL_BWD(f64, double)

/* ---- geometry ---- */

/* Checks t is (N, C, spatial) or (C, spatial) for nsp spatial dims. */
static tpu_status_t check_planes(const char* op, const char* what, const tpu_tensor_t* t,
                                 int nsp) {
  if (!t) return TPU_ERR(INVALID_ARGUMENT, "%s: %s is missing", op, what);
  if (t->ndim != nsp + 1 && t->ndim != nsp + 2)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected a %dD or %dD %s, got %dD", op, nsp + 1, nsp + 2,
                   what, (int)t->ndim);
  if (t->dtype == TPU_BOOL)
    return TPU_ERR(INVALID_ARGUMENT, "%s: not implemented for 'Bool'", op);
  return TPU_OK;
}

/* Geometry from the input and output shapes (which must have the same
 * leading dims) and, for windowed kinds, the int lists starting at
 * args[base]: kernel_size, stride, padding, then dilation (max) or
 * ceil_mode, count_include_pad, divisor_override (average). */
static tpu_status_t geo_init(const char* op, const tpu_call_t* call, int base, pool_kind_t kind,
                             int nsp, const tpu_tensor_t* in, const tpu_tensor_t* out,
                             pool_geo_t* g) {
  TPU_RETURN_IF_ERROR(check_planes(op, "input", in, nsp));
  TPU_RETURN_IF_ERROR(check_planes(op, "output", out, nsp));
  memset(g, 0, sizeof *g);
  g->kind = kind;
  int64_t out_lanes;
  sp_split(in, nsp, &g->lanes, g->in);
  sp_split(out, nsp, &out_lanes, g->out);
  bool same = in->ndim == out->ndim;
  for (int d = 0; same && d < in->ndim - nsp; d++) same = in->sizes[d] == out->sizes[d];
  if (!same)
    return TPU_ERR(INVALID_ARGUMENT, "%s: input and output must have the same batch and channels",
                   op);
  g->in_len = sp_prod3(g->in);
  g->out_len = sp_prod3(g->out);
  for (int i = 0; i < 3; i++) g->k[i] = g->s[i] = g->d[i] = 1;
  if (kind == P_ADAPTIVE_AVG || kind == P_ADAPTIVE_MAX) {
    if (g->in_len == 0 && g->out_len > 0 && g->lanes > 0)
      return TPU_ERR(INVALID_ARGUMENT, "%s: expected an input with non-zero spatial sizes", op);
    return TPU_OK;
  }
  int64_t zero[3] = {0, 0, 0}, one[3] = {1, 1, 1};
  TPU_RETURN_IF_ERROR(sp_int_list(op, "kernel_size", call, base, nsp, NULL, 1, g->k));
  TPU_RETURN_IF_ERROR(sp_int_list(op, "stride", call, base + 1, nsp, g->k, 1, g->s));
  TPU_RETURN_IF_ERROR(sp_int_list(op, "padding", call, base + 2, nsp, zero, 0, g->p));
  if (kind == P_MAX) {
    TPU_RETURN_IF_ERROR(sp_int_list(op, "dilation", call, base + 3, nsp, one, 1, g->d));
  } else {
    g->count_include_pad = tpu_arg_bool(call, base + 4, true);
    g->divisor = tpu_arg_is_none(call, base + 5) ? 0 : tpu_arg_i64(call, base + 5, 0);
    if (!tpu_arg_is_none(call, base + 5) && g->divisor == 0)
      return TPU_ERR(INVALID_ARGUMENT, "%s: divisor must be not zero", op);
  }
  for (int i = 0; i < 3; i++) {
    if (g->k[i] < 1 || g->s[i] < 1 || g->d[i] < 1)
      return TPU_ERR(INVALID_ARGUMENT,
                     "%s: kernel size, stride and dilation must be greater than zero", op);
    if (g->p[i] < 0 || g->p[i] > g->k[i] / 2)
      return TPU_ERR(INVALID_ARGUMENT,
                     "%s: pad should be smaller than or equal to half of kernel size, but got "
                     "padding=%lld and kernel_size=%lld",
                     op, (long long)g->p[i], (long long)g->k[i]);
  }
  return TPU_OK;
}

/* ---- forward ---- */
typedef struct {
  const pool_geo_t* g;
  tpu_dtype_t dt;
  const char* in;
  char* out;
  int64_t* ind; /* max kinds */
} fwd_job_t;

static void fwd_range(void* ctx, int64_t begin, int64_t end) {
  const fwd_job_t* job = ctx;
  const pool_geo_t* g = job->g;
  int64_t esz = (int64_t)tpu_dtype_size(job->dt);
  for (int64_t p = begin; p < end; p++) {
    const void* in = job->in + p * g->in_len * esz;
    void* out = job->out + p * g->out_len * esz;
    int64_t* ind = job->ind ? job->ind + p * g->out_len : NULL;
    if (job->dt == TPU_F32) pool_fwd_f32(g, in, out, ind);
    else if (job->dt == TPU_F64) pool_fwd_f64(g, in, out, ind);
    else pool_fwd_i64(g, in, out, ind);
  }
}

/* outs[0] = pooled input (args[0]); outs[1] = indices for max kinds. */
static tpu_status_t pool_forward(const char* op, const tpu_call_t* call, pool_kind_t kind,
                                 int nsp, bool int_ok) {
  const tpu_tensor_t* x = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* y = &call->outs[0];
  pool_geo_t g;
  TPU_RETURN_IF_ERROR(geo_init(op, call, 1, kind, nsp, x, y, &g));
  bool with_ind = kind == P_MAX || kind == P_ADAPTIVE_MAX;
  if (y->dtype != x->dtype)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected an output of dtype %s", op,
                   tpu_dtype_name(x->dtype));
  tpu_dtype_t dt = sp_compute_dtype(x->dtype);
  if (dt == TPU_I64 && !int_ok)
    return TPU_ERR(INVALID_ARGUMENT, "%s: not implemented for %s", op, tpu_dtype_name(x->dtype));
  if (with_ind) {
    const tpu_tensor_t* ind = call->nouts > 1 ? &call->outs[1] : NULL;
    if (!ind || ind->dtype != TPU_I64 || tpu_tensor_numel(ind) != tpu_tensor_numel(y))
      return TPU_ERR(INVALID_ARGUMENT, "%s: expected int64 indices of the output's shape", op);
  }
  sp_stage_t sx, sy, si = {0};
  TPU_RETURN_IF_ERROR(sp_stage_in(op, x, dt, &sx));
  tpu_status_t st = sp_stage_out(op, y, dt, false, &sy);
  if (!st && with_ind) st = sp_stage_out(op, &call->outs[1], TPU_I64, false, &si);
  if (!st) {
    fwd_job_t job = {&g, dt, sx.data, sy.data, with_ind ? si.data : NULL};
    int64_t work = g.out_len * (kind == P_ADAPTIVE_AVG || kind == P_ADAPTIVE_MAX
                                    ? (g.in_len / (g.out_len ? g.out_len : 1) + 1)
                                    : g.k[0] * g.k[1] * g.k[2]);
    sp_parallel(g.lanes, work, fwd_range, &job);
    if (with_ind) st = sp_stage_finish(&si, st);
    st = sp_stage_finish(&sy, st);
  } else {
    sp_stage_free(&sy);
  }
  sp_stage_free(&si);
  sp_stage_free(&sx);
  return st;
}

/* ---- backward ---- */
typedef struct {
  const pool_geo_t* g;
  tpu_dtype_t dt;
  const char* gout;
  char* gin;
  const int64_t* ind; /* max kinds */
  sp_bad_index_t bad;
} bwd_job_t;

/* max kinds: gin[ind[o]] += gout[o], indices checked against the plane */
#define DEFINE_SCATTER(SUF, T)                                                           \
  static void scatter_##SUF(bwd_job_t* job, const T* gout, T* gin, const int64_t* ind) { \
    int64_t n = job->g->in_len;                                                          \
    for (int64_t o = 0; o < job->g->out_len; o++) {                                      \
      if (ind[o] < 0 || ind[o] >= n) {                                                   \
        sp_bad_index_note(&job->bad, ind[o], n);                                         \
        continue;                                                                        \
      }                                                                                  \
      gin[ind[o]] += gout[o];                                                            \
    }                                                                                    \
  }
DEFINE_SCATTER(f32, float)
DEFINE_SCATTER(f64, double)

static void bwd_range(void* ctx, int64_t begin, int64_t end) {
  bwd_job_t* job = ctx;
  const pool_geo_t* g = job->g;
  int64_t esz = (int64_t)tpu_dtype_size(job->dt);
  bool max = g->kind == P_MAX || g->kind == P_ADAPTIVE_MAX;
  for (int64_t p = begin; p < end; p++) {
    const void* gout = job->gout + p * g->out_len * esz;
    void* gin = job->gin + p * g->in_len * esz;
    const int64_t* ind = max ? job->ind + p * g->out_len : NULL;
    if (job->dt == TPU_F32) {
      if (max) scatter_f32(job, gout, gin, ind);
      else pool_bwd_f32(g, gout, gin);
    } else {
      if (max) scatter_f64(job, gout, gin, ind);
      else pool_bwd_f64(g, gout, gin);
    }
  }
}

/* (grad_output, self, [window args from args[2]]..., [indices at
 * args[ind_arg]]) -> grad_input */
static tpu_status_t pool_backward(const char* op, const tpu_call_t* call, pool_kind_t kind,
                                  int nsp, int ind_arg) {
  const tpu_tensor_t* gout = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* x = tpu_arg_tensor(call, 1);
  const tpu_tensor_t* gin = &call->outs[0];
  pool_geo_t g;
  TPU_RETURN_IF_ERROR(geo_init(op, call, 2, kind, nsp, x, gout, &g));
  TPU_RETURN_IF_ERROR(check_planes(op, "grad_input", gin, nsp));
  if (tpu_tensor_numel(gin) != g.lanes * g.in_len || gin->ndim != x->ndim)
    return TPU_ERR(INVALID_ARGUMENT, "%s: grad_input must have the input's shape", op);
  tpu_dtype_t dt = sp_compute_dtype(gin->dtype);
  if (dt == TPU_I64 || !tpu_dtype_is_float(gout->dtype))
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected floating point gradients, got %s", op,
                   tpu_dtype_name(gout->dtype));
  const tpu_tensor_t* ind = NULL;
  if (ind_arg >= 0) {
    ind = tpu_arg_tensor(call, ind_arg);
    if (!ind || ind->dtype != TPU_I64 || tpu_tensor_numel(ind) != tpu_tensor_numel(gout))
      return TPU_ERR(INVALID_ARGUMENT, "%s: expected int64 indices of grad_output's shape", op);
  }
  sp_stage_t sg, si = {0}, sx;
  TPU_RETURN_IF_ERROR(sp_stage_in(op, gout, dt, &sg));
  tpu_status_t st = ind ? sp_stage_in(op, ind, TPU_I64, &si) : TPU_OK;
  if (!st) st = sp_stage_out(op, gin, dt, true, &sx);
  if (!st) {
    bwd_job_t job = {&g, dt, sg.data, sx.data, ind ? si.data : NULL, {0}};
    int64_t work = ind ? g.out_len : g.out_len * g.k[0] * g.k[1] * g.k[2];
    if (kind == P_ADAPTIVE_AVG) work = g.out_len + g.in_len;
    sp_parallel(g.lanes, work, bwd_range, &job);
    if (job.bad.set)
      st = TPU_ERR(OUT_OF_RANGE, "%s: index %lld is out of bounds for a plane of %lld elements",
                   op, (long long)job.bad.index, (long long)job.bad.limit);
    st = sp_stage_finish(&sx, st);
  }
  sp_stage_free(&sg);
  sp_stage_free(&si);
  return st;
}

/* ---- kernels ---- */

/* max_pool{2,3}d_with_indices(self, kernel_size, stride, padding, dilation,
 * ceil_mode) -> (out, indices) */
tpu_status_t tpu_k_max_pool2d(const tpu_call_t* call) {
  return pool_forward("max_pool2d_with_indices", call, P_MAX, 2, true);
}
tpu_status_t tpu_k_max_pool3d(const tpu_call_t* call) {
  return pool_forward("max_pool3d_with_indices", call, P_MAX, 3, true);
}
/* max_pool{2,3}d_with_indices_backward(grad_output, self, kernel_size,
 * stride, padding, dilation, ceil_mode, indices) */
tpu_status_t tpu_k_max_pool2d_backward(const tpu_call_t* call) {
  return pool_backward("max_pool2d_with_indices_backward", call, P_MAX, 2, 7);
}
tpu_status_t tpu_k_max_pool3d_backward(const tpu_call_t* call) {
  return pool_backward("max_pool3d_with_indices_backward", call, P_MAX, 3, 7);
}
/* avg_pool{2,3}d(self, kernel_size, stride, padding, ceil_mode,
 * count_include_pad, divisor_override) */
tpu_status_t tpu_k_avg_pool2d(const tpu_call_t* call) {
  return pool_forward("avg_pool2d", call, P_AVG, 2, true);
}
tpu_status_t tpu_k_avg_pool3d(const tpu_call_t* call) {
  return pool_forward("avg_pool3d", call, P_AVG, 3, true);
}
/* avg_pool{2,3}d_backward(grad_output, self, kernel_size, stride, padding,
 * ceil_mode, count_include_pad, divisor_override) */
tpu_status_t tpu_k_avg_pool2d_backward(const tpu_call_t* call) {
  return pool_backward("avg_pool2d_backward", call, P_AVG, 2, -1);
}
tpu_status_t tpu_k_avg_pool3d_backward(const tpu_call_t* call) {
  return pool_backward("avg_pool3d_backward", call, P_AVG, 3, -1);
}
/* _adaptive_avg_pool{2,3}d(self, output_size) and backward(grad_output, self) */
tpu_status_t tpu_k_adaptive_avg_pool2d(const tpu_call_t* call) {
  return pool_forward("_adaptive_avg_pool2d", call, P_ADAPTIVE_AVG, 2, false);
}
tpu_status_t tpu_k_adaptive_avg_pool3d(const tpu_call_t* call) {
  return pool_forward("_adaptive_avg_pool3d", call, P_ADAPTIVE_AVG, 3, false);
}
tpu_status_t tpu_k_adaptive_avg_pool2d_backward(const tpu_call_t* call) {
  return pool_backward("_adaptive_avg_pool2d_backward", call, P_ADAPTIVE_AVG, 2, -1);
}
tpu_status_t tpu_k_adaptive_avg_pool3d_backward(const tpu_call_t* call) {
  return pool_backward("_adaptive_avg_pool3d_backward", call, P_ADAPTIVE_AVG, 3, -1);
}
/* adaptive_max_pool{2,3}d(self, output_size) -> (out, indices) and
 * backward(grad_output, self, indices) */
tpu_status_t tpu_k_adaptive_max_pool2d(const tpu_call_t* call) {
  return pool_forward("adaptive_max_pool2d", call, P_ADAPTIVE_MAX, 2, false);
}
tpu_status_t tpu_k_adaptive_max_pool3d(const tpu_call_t* call) {
  return pool_forward("adaptive_max_pool3d", call, P_ADAPTIVE_MAX, 3, false);
}
tpu_status_t tpu_k_adaptive_max_pool2d_backward(const tpu_call_t* call) {
  return pool_backward("adaptive_max_pool2d_backward", call, P_ADAPTIVE_MAX, 2, 2);
}
tpu_status_t tpu_k_adaptive_max_pool3d_backward(const tpu_call_t* call) {
  return pool_backward("adaptive_max_pool3d_backward", call, P_ADAPTIVE_MAX, 3, 2);
}

/* ---- fractional max pooling ----
 * fractional_max_pool{2,3}d(self, kernel_size, output_size, random_samples)
 * -> (out, indices): window o along a dim starts at PyTorch's interval
 * sequence int((o + u) * alpha) - int(u * alpha), alpha = (in - k) /
 * (out - 1), the last window at in - k, with u the plane's sample for that
 * dim (2-d: samples (w, h); 3-d: (t, h, w)), computed in the input's dtype
 * as CPU's kernel does (each bfloat16/float16 step rounded). The window's
 * first maximum wins, a NaN always. The backward is max pooling's scatter. */
static double frac_round(tpu_dtype_t dt, double v) {
  if (dt == TPU_F64) return v;
  float f = (float)v;
  if (dt == TPU_BF16) return tpu_bf16_to_f32(tpu_f32_to_bf16(f));
  if (dt == TPU_F16) return tpu_f16_to_f32(tpu_f32_to_f16(f));
  return f;
}

static void frac_intervals(tpu_dtype_t dt, double u, int64_t in, int64_t out, int64_t k,
                           int64_t* seq) {
  if (out > 1) {
    const double alpha =
        frac_round(dt, frac_round(dt, (double)(in - k)) / frac_round(dt, (double)(out - 1)));
    const int64_t base = (int64_t)(int)frac_round(dt, u * alpha);
    for (int64_t o = 0; o < out - 1; o++)
      seq[o] = (int64_t)(int)frac_round(dt, frac_round(dt, frac_round(dt, (double)o) + u) * alpha) -
               base;
  }
  if (out > 0) seq[out - 1] = in - k;
}

typedef struct {
  int nsp;
  tpu_dtype_t dt, sdt; /* compute type; the input's dtype (interval arithmetic) */
  int64_t in[3], out[3], k[3], in_len, out_len;
  const double* samples; /* lanes x nsp */
  const char* x;
  char* y;
  int64_t* ind;
  _Atomic int bad; /* a window outside the input */
} frac_job_t;

#define DEFINE_FRAC_FWD(SUF, T)                                                                static bool frac_plane_##SUF(const frac_job_t* j, const int64_t* const seq[3], const T* x,                                T* y, int64_t* ind) {                                              for (int d = 0; d < 3; d++)                                                                    for (int64_t o = 0; o < j->out[d]; o++)                                                        if (seq[d][o] < 0 || seq[d][o] + j->k[d] > j->in[d]) return false;                       int64_t q = 0;                                                                               for (int64_t ot = 0; ot < j->out[0]; ot++)                                                     for (int64_t oh = 0; oh < j->out[1]; oh++)                                                     for (int64_t ow = 0; ow < j->out[2]; ow++, q++) {                                              const int64_t t0 = seq[0][ot], h0 = seq[1][oh], w0 = seq[2][ow];                             T best = (T)-INFINITY;                                                                       int64_t at = (t0 * j->in[1] + h0) * j->in[2] + w0;                                           for (int64_t t = t0; t < t0 + j->k[0]; t++)                                                    for (int64_t h = h0; h < h0 + j->k[1]; h++)                                                    for (int64_t w = w0; w < w0 + j->k[2]; w++) {                                                  const int64_t i = (t * j->in[1] + h) * j->in[2] + w;                                         const T v = x[i];                                                                            if (v > best || v != v) {                                                                      best = v;                                                                                    at = i;                                                                                    }                                                                                          }                                                                                        y[q] = best;                                                                                 ind[q] = at;                                                                               }                                                                                        return true;                                                                               }
DEFINE_FRAC_FWD(f32, float)
DEFINE_FRAC_FWD(f64, double)

static void frac_range(void* ctx, int64_t begin, int64_t end) {
  frac_job_t* j = ctx;
  const int64_t esz = (int64_t)tpu_dtype_size(j->dt);
  int64_t* seq[3];
  int64_t zero = 0;
  for (int d = 0; d < 3; d++) seq[d] = d >= 3 - j->nsp ? sp_alloc(j->out[d], sizeof(int64_t)) : &zero;
  bool ok = true;
  for (int d = 3 - j->nsp; d < 3; d++) ok = ok && seq[d];
  for (int64_t p = begin; ok && p < end; p++) {
    for (int d = 3 - j->nsp; d < 3; d++) {
      /* 2-d samples are (w, h), 3-d ones (t, h, w) */
      int which = j->nsp == 2 ? 2 - d : d;
      frac_intervals(j->sdt, j->samples[p * j->nsp + which], j->in[d], j->out[d], j->k[d], seq[d]);
    }
    const int64_t* const cs[3] = {seq[0], seq[1], seq[2]};
    const char* x = j->x + p * j->in_len * esz;
    char* y = j->y + p * j->out_len * esz;
    int64_t* ind = j->ind + p * j->out_len;
    bool fine = j->dt == TPU_F32 ? frac_plane_f32(j, cs, (const float*)x, (float*)y, ind)
                                 : frac_plane_f64(j, cs, (const double*)x, (double*)y, ind);
    if (!fine) j->bad = 1;
  }
  if (!ok) j->bad = 2;
  for (int d = 3 - j->nsp; d < 3; d++) free(seq[d]);
}

static tpu_status_t frac_forward(const char* op, const tpu_call_t* call, int nsp) {
  const tpu_tensor_t* x = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* rs = tpu_arg_tensor(call, 3);
  const tpu_tensor_t* y = &call->outs[0];
  const tpu_tensor_t* ind = call->nouts > 1 ? &call->outs[1] : NULL;
  pool_geo_t g;
  TPU_RETURN_IF_ERROR(geo_init(op, call, 1, P_ADAPTIVE_MAX, nsp, x, y, &g));
  if (!tpu_dtype_is_float(x->dtype) || y->dtype != x->dtype)
    return TPU_ERR(INVALID_ARGUMENT, "%s: not implemented for %s", op, tpu_dtype_name(x->dtype));
  if (!ind || ind->dtype != TPU_I64 || tpu_tensor_numel(ind) != tpu_tensor_numel(y))
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected int64 indices of the output's shape", op);
  frac_job_t j;
  memset(&j, 0, sizeof j);
  j.nsp = nsp;
  for (int d = 0; d < 3; d++) {
    j.in[d] = g.in[d];
    j.out[d] = g.out[d];
    j.k[d] = 1;
  }
  TPU_RETURN_IF_ERROR(sp_int_list(op, "kernel_size", call, 1, nsp, NULL, 1, j.k));
  if (!rs || tpu_tensor_numel(rs) < g.lanes * nsp)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected %lld random samples", op,
                   (long long)(g.lanes * nsp));
  j.in_len = g.in_len;
  j.out_len = g.out_len;
  j.dt = sp_compute_dtype(x->dtype);
  j.sdt = x->dtype;
  double* samples = tpu_stage_f64(rs, false);
  if (!samples) return sp_oom(op);
  j.samples = samples;
  sp_stage_t sx, sy, si = {0};
  tpu_status_t st = sp_stage_in(op, x, j.dt, &sx);
  if (st) {
    free(samples);
    return st;
  }
  st = sp_stage_out(op, y, j.dt, false, &sy);
  if (!st) st = sp_stage_out(op, ind, TPU_I64, false, &si);
  if (!st) {
    j.x = sx.data;
    j.y = sy.data;
    j.ind = si.data;
    sp_parallel(g.lanes, g.out_len * j.k[0] * j.k[1] * j.k[2], frac_range, &j);
    if (j.bad == 2) st = sp_oom(op);
    else if (j.bad)
      st = TPU_ERR(INVALID_ARGUMENT, "%s: a pooling window reaches outside the input", op);
    st = sp_stage_finish(&si, st);
    st = sp_stage_finish(&sy, st);
  } else {
    sp_stage_free(&sy);
  }
  sp_stage_free(&si);
  sp_stage_free(&sx);
  free(samples);
  return st;
}

tpu_status_t tpu_k_fractional_max_pool2d(const tpu_call_t* call) {
  return frac_forward("fractional_max_pool2d", call, 2);
}
tpu_status_t tpu_k_fractional_max_pool3d(const tpu_call_t* call) {
  return frac_forward("fractional_max_pool3d", call, 3);
}
/* backward(grad_output, self, kernel_size, output_size, indices); the 3-d
 * backward, which has no meta kernel, is composed in composite_kernels.py */
tpu_status_t tpu_k_fractional_max_pool2d_backward(const tpu_call_t* call) {
  return pool_backward("fractional_max_pool2d_backward", call, P_ADAPTIVE_MAX, 2, 4);
}

/* ---- embedding bags ----
 * Bag b holds positions [offsets[b], offsets[b + 1]) of indices; without
 * include_last_offset the last bag runs to the end of indices. Rows are
 * combined in double (sum, optionally weighted per sample; mean over
 * non-padding positions; max per column, the first maximum winning) and
 * rounded once on store. offset2bag maps positions to bags;
 * bag_size counts non-padding positions (mean and max; zero for sum, as on
 * CPU); max_indices holds each max's weight row. The backward buckets
 * contributions by weight row (counting sort) and sums each row in position
 * order, rows in parallel, so results do not depend on threads.
 * scale_grad_by_freq divides by the number of occurrences of each index.
 */
enum { BAG_SUM = 0, BAG_MEAN = 1, BAG_MAX = 2 };

/* An int64 copy of an integer tensor (any strides). */
static tpu_status_t load_ids(const char* op, const char* what, const tpu_tensor_t* t,
                             int64_t** out) {
  *out = NULL;
  if (!t || (t->dtype != TPU_I64 && t->dtype != TPU_I32))
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected %s of dtype int64 or int32", op, what);
  *out = sp_alloc(tpu_tensor_numel(t), sizeof(int64_t));
  if (!*out) return sp_oom(op);
  tpu_tensor_t buf;
  tpu_tensor_make_contig(&buf, *out, TPU_I64, t->ndim, t->sizes);
  tpu_status_t st = tpu_copy_strided(&buf, t);
  if (st) {
    free(*out);
    *out = NULL;
  }
  return st;
}

/* Stores vals[0..n) into t (flattened, any strides), zero beyond n. */
static void store_ids(const tpu_tensor_t* t, const int64_t* vals, int64_t n) {
  int64_t total = tpu_tensor_numel(t);
  for (int64_t i = 0; i < total; i++)
    tpu_store_i64(tpu_tensor_elem_ptr(t, i), t->dtype, i < n ? vals[i] : 0);
}

/* Row r of a 2-d tensor: its address and column stride. */
static char* row_ptr(const tpu_tensor_t* t, int64_t r) {
  return (char*)t->data + r * t->strides[0] * (int64_t)tpu_dtype_size(t->dtype);
}

/* Bag of every position from offsets (validated: start at 0, non-decreasing,
 * at most n); positions after the last bag (offsets ending early with
 * include_last_offset) are counted in it, as on CPU. */
static tpu_status_t bags_from_offsets(const char* op, const int64_t* off, int64_t noff,
                                      int64_t nbags, int64_t n, int64_t* bag) {
  if (noff > 0 && off[0] != 0)
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: offsets[0] has to be 0, i.e., the first sequence in the mini-batch has "
                   "to start from position 0. However, got %lld",
                   op, (long long)off[0]);
  for (int64_t b = 1; b < noff; b++)
    if (off[b] < off[b - 1] || off[b] > n)
      return TPU_ERR(INVALID_ARGUMENT,
                     "%s: offsets must be non-decreasing and at most the number of indices %lld, "
                     "got offsets[%lld] = %lld",
                     op, (long long)n, (long long)b, (long long)off[b]);
  for (int64_t p = 0; p < n; p++) bag[p] = nbags > 0 ? nbags - 1 : 0;
  for (int64_t b = 0; b + 1 < nbags; b++)
    for (int64_t p = off[b]; p < off[b + 1]; p++) bag[p] = b;
  return TPU_OK;
}

typedef struct {
  const tpu_tensor_t *weight, *out;
  const int64_t *ids, *off;
  const double* psw;
  int64_t n, noff, nbags, dim, mode, padding;
  int64_t* count;   /* per bag: non-padding positions */
  int64_t* max_ind; /* nbags x dim (max mode) */
  sp_bad_index_t bad;
  _Atomic int oom;
} bag_fwd_t;

static void bag_fwd_range(void* ctx, int64_t begin, int64_t end) {
  bag_fwd_t* j = ctx;
  int64_t d = j->dim, nw = j->weight->sizes[0];
  double* acc = sp_alloc(2 * d, sizeof(double));
  if (!acc) {
    j->oom = 1;
    return;
  }
  double* row = acc + d;
  int64_t wst = j->weight->strides[1], ost = j->out->strides[1];
  for (int64_t b = begin; b < end; b++) {
    int64_t stop = b + 1 < j->noff ? j->off[b + 1] : j->n, cnt = 0;
    int64_t* mi = j->mode == BAG_MAX ? j->max_ind + b * d : NULL;
    for (int64_t i = 0; i < d; i++) acc[i] = 0;
    if (mi)
      for (int64_t i = 0; i < d; i++) mi[i] = 0;
    for (int64_t p = j->off[b]; p < stop; p++) {
      int64_t w = j->ids[p];
      if (w == j->padding) continue;
      if (w < 0 || w >= nw) {
        sp_bad_index_note(&j->bad, w, nw);
        continue;
      }
      tpu_run_load_f64(row, 1, row_ptr(j->weight, w), wst, j->weight->dtype, d);
      if (mi) {
        for (int64_t i = 0; i < d; i++)
          if (cnt == 0 || row[i] > acc[i]) {
            acc[i] = row[i];
            mi[i] = w;
          }
      } else {
        double s = j->psw ? j->psw[p] : 1.0;
        for (int64_t i = 0; i < d; i++) acc[i] += s * row[i];
      }
      cnt++;
    }
    if (j->mode == BAG_MEAN && cnt > 0)
      for (int64_t i = 0; i < d; i++) acc[i] /= (double)cnt;
    j->count[b] = cnt;
    tpu_run_store_f64(row_ptr(j->out, b), ost, j->out->dtype, acc, d);
  }
  free(acc);
}

/* _embedding_bag / _embedding_bag_forward_only(weight, indices, offsets,
 * scale_grad_by_freq, mode, sparse, per_sample_weights?,
 * include_last_offset, padding_idx) -> (out, offset2bag, bag_size,
 * max_indices) */
tpu_status_t tpu_k_embedding_bag(const tpu_call_t* call) {
  const char* op = "_embedding_bag";
  const tpu_tensor_t* weight = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* indices = tpu_arg_tensor(call, 1);
  const tpu_tensor_t* offsets = tpu_arg_tensor(call, 2);
  const tpu_tensor_t* psw_t = tpu_arg_tensor(call, 6);
  bag_fwd_t j = {0};
  j.mode = tpu_arg_i64(call, 4, BAG_SUM);
  j.padding = tpu_arg_i64(call, 8, -1);
  bool last = tpu_arg_bool(call, 7, false);
  if (!weight || weight->ndim != 2 || !tpu_dtype_is_float(weight->dtype))
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected a 2-D floating point weight", op);
  if (!indices || indices->ndim != 1 || !offsets || offsets->ndim != 1 || call->nouts < 4)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected 1-D indices and offsets", op);
  if (j.mode < BAG_SUM || j.mode > BAG_MAX)
    return TPU_ERR(INVALID_ARGUMENT, "%s: unknown mode %lld", op, (long long)j.mode);
  if (psw_t && (j.mode != BAG_SUM || tpu_tensor_numel(psw_t) != indices->sizes[0]))
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: per_sample_weights are only supported for mode='sum' and must have one "
                   "weight per index",
                   op);
  j.weight = weight;
  j.out = &call->outs[0];
  j.n = indices->sizes[0];
  j.dim = weight->sizes[1];
  int64_t noff = j.noff = offsets->sizes[0];
  j.nbags = last ? (noff > 0 ? noff - 1 : 0) : noff;
  const tpu_tensor_t *o2b = &call->outs[1], *bsz = &call->outs[2], *mind = &call->outs[3];
  if (j.out->ndim != 2 || j.out->sizes[0] != j.nbags || j.out->sizes[1] != j.dim)
    return TPU_ERR(INVALID_ARGUMENT, "%s: output must be (%lld, %lld)", op, (long long)j.nbags,
                   (long long)j.dim);
  if (tpu_tensor_numel(bsz) < j.nbags ||
      (j.mode == BAG_MAX && tpu_tensor_numel(mind) != j.nbags * j.dim))
    return TPU_ERR(INVALID_ARGUMENT, "%s: bag_size or max_indices have the wrong size", op);
  int64_t *ids = NULL, *off = NULL, *bag = NULL;
  double* psw = NULL;
  tpu_status_t st = load_ids(op, "indices", indices, &ids);
  if (!st) st = load_ids(op, "offsets", offsets, &off);
  if (!st) {
    bag = sp_alloc(j.n, sizeof(int64_t));
    j.count = sp_alloc(j.nbags, sizeof(int64_t));
    j.max_ind = j.mode == BAG_MAX ? sp_alloc(j.nbags * j.dim, sizeof(int64_t)) : NULL;
    if (psw_t) psw = sp_alloc(j.n, sizeof(double));
    if (!bag || !j.count || (j.mode == BAG_MAX && !j.max_ind) || (psw_t && !psw)) st = sp_oom(op);
  }
  if (!st) st = bags_from_offsets(op, off, noff, j.nbags, j.n, bag);
  if (!st && psw) {
    tpu_tensor_t buf;
    tpu_tensor_make_contig(&buf, psw, TPU_F64, 1, &j.n);
    st = tpu_copy_strided(&buf, psw_t);
  }
  if (!st) {
    j.ids = ids;
    j.off = off;
    j.psw = psw;
    sp_parallel(j.nbags, (j.nbags ? j.n / j.nbags + 1 : 1) * j.dim, bag_fwd_range, &j);
    if (j.oom) st = sp_oom(op);
    else if (j.bad.set)
      st = TPU_ERR(OUT_OF_RANGE, "%s: index %lld is out of bounds for %lld embeddings", op,
                   (long long)j.bad.index, (long long)j.bad.limit);
  }
  if (!st) {
    store_ids(o2b, bag, j.n);
    if (j.mode == BAG_SUM)
      for (int64_t b = 0; b < j.nbags; b++) j.count[b] = 0;
    store_ids(bsz, j.count, j.nbags);
    if (j.mode == BAG_MAX) store_ids(mind, j.max_ind, j.nbags * j.dim);
    else store_ids(mind, NULL, 0);
  }
  free(ids);
  free(off);
  free(bag);
  free(psw);
  free(j.count);
  free(j.max_ind);
  return st;
}

/* ---- embedding bag backward ---- */
typedef struct {
  const tpu_tensor_t *grad, *out;
  const int64_t *bag, *bag_size, *start, *order, *freq;
  const double* psw;
  int64_t dim, mode;
  _Atomic int oom;
} bag_bwd_t;

/* Weight rows [begin, end): the sum of their bucketed contributions. A
 * bucket entry is a position (sum, mean) or bag * dim + column (max). */
static void bag_bwd_range(void* ctx, int64_t begin, int64_t end) {
  bag_bwd_t* j = ctx;
  int64_t d = j->dim;
  double* acc = sp_alloc(2 * d, sizeof(double));
  if (!acc) {
    j->oom = 1;
    return;
  }
  double* row = acc + d;
  int64_t gst = j->grad->strides[1];
  for (int64_t w = begin; w < end; w++) {
    for (int64_t i = 0; i < d; i++) acc[i] = 0;
    for (int64_t k = j->start[w]; k < j->start[w + 1]; k++) {
      int64_t e = j->order[k];
      if (j->mode == BAG_MAX) {
        int64_t b = e / d, i = e % d;
        int64_t esz = (int64_t)tpu_dtype_size(j->grad->dtype);
        acc[i] += tpu_load_f64(row_ptr(j->grad, b) + i * gst * esz, j->grad->dtype);
        continue;
      }
      int64_t b = j->bag[e];
      double s = j->psw ? j->psw[e] : 1.0;
      if (j->freq) s /= (double)j->freq[w];
      if (j->mode == BAG_MEAN && j->bag_size[b] != 0) s /= (double)j->bag_size[b];
      tpu_run_load_f64(row, 1, row_ptr(j->grad, b), gst, j->grad->dtype, d);
      for (int64_t i = 0; i < d; i++) acc[i] += s * row[i];
    }
    tpu_run_store_f64(row_ptr(j->out, w), j->out->strides[1], j->out->dtype, acc, d);
  }
  free(acc);
}

typedef struct {
  const tpu_tensor_t *grad, *indices, *offsets, *offset2bag, *bag_size, *max_indices, *psw;
  int64_t num_weights, mode, padding;
  bool scale;
} bag_bwd_args_t;

/* Loads indices and each position's bag (from offset2bag, or from offsets
 * when offset2bag is empty), bounds-checked against nbags. */
static tpu_status_t load_bags(const char* op, const bag_bwd_args_t* a, int64_t nbags,
                              int64_t** ids, int64_t** bag) {
  *bag = NULL;
  TPU_RETURN_IF_ERROR(load_ids(op, "indices", a->indices, ids));
  int64_t n = tpu_tensor_numel(a->indices);
  tpu_status_t st = TPU_OK;
  if (a->offset2bag && tpu_tensor_numel(a->offset2bag) == n) {
    st = load_ids(op, "offset2bag", a->offset2bag, bag);
  } else if (a->offsets && (n == 0 || !a->offset2bag || tpu_tensor_numel(a->offset2bag) == 0)) {
    int64_t* off = NULL;
    st = load_ids(op, "offsets", a->offsets, &off);
    *bag = st ? NULL : sp_alloc(n, sizeof(int64_t));
    if (!st && !*bag) st = sp_oom(op);
    int64_t noff = tpu_tensor_numel(a->offsets);
    if (!st) st = bags_from_offsets(op, off, noff, noff < nbags ? noff : nbags, n, *bag);
    free(off);
  } else {
    st = TPU_ERR(INVALID_ARGUMENT, "%s: offset2bag must have one entry per index", op);
  }
  for (int64_t p = 0; !st && p < n; p++)
    if ((*bag)[p] < 0 || (*bag)[p] >= nbags)
      st = TPU_ERR(OUT_OF_RANGE, "%s: bag %lld is out of bounds for %lld bags", op,
                   (long long)(*bag)[p], (long long)nbags);
  if (st) {
    free(*ids);
    free(*bag);
    *ids = *bag = NULL;
  }
  return st;
}

static tpu_status_t bag_backward(const char* op, const tpu_call_t* call, const bag_bwd_args_t* a) {
  const tpu_tensor_t* out = &call->outs[0];
  const tpu_tensor_t* grad = a->grad;
  if (!grad || grad->ndim != 2 || !tpu_dtype_is_float(grad->dtype))
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected a 2-D floating point grad", op);
  int64_t nbags = grad->sizes[0], d = grad->sizes[1], nw = a->num_weights;
  if (out->ndim != 2 || out->sizes[0] != nw || out->sizes[1] != d)
    return TPU_ERR(INVALID_ARGUMENT, "%s: grad_weight must be (%lld, %lld)", op, (long long)nw,
                   (long long)d);
  if (a->mode < BAG_SUM || a->mode > BAG_MAX || (a->psw && a->mode != BAG_SUM))
    return TPU_ERR(INVALID_ARGUMENT, "%s: invalid mode %lld (per_sample_weights need 'sum')", op,
                   (long long)a->mode);
  int64_t *ids = NULL, *bag = NULL, *bsz = NULL, *mi = NULL, *keys = NULL;
  int64_t *order = NULL, *start = NULL, *freq = NULL;
  double* psw = NULL;
  int64_t n = tpu_tensor_numel(a->indices);
  tpu_status_t st = load_bags(op, a, nbags, &ids, &bag);
  if (!st && a->mode != BAG_SUM) {
    if (!a->bag_size || tpu_tensor_numel(a->bag_size) < nbags)
      st = TPU_ERR(INVALID_ARGUMENT, "%s: bag_size must have one entry per bag", op);
    else st = load_ids(op, "bag_size", a->bag_size, &bsz);
  }
  if (!st && a->mode == BAG_MAX) {
    if (!a->max_indices || tpu_tensor_numel(a->max_indices) != nbags * d)
      st = TPU_ERR(INVALID_ARGUMENT, "%s: max_indices must be (%lld, %lld)", op,
                   (long long)nbags, (long long)d);
    else st = load_ids(op, "max_indices", a->max_indices, &mi);
  }
  if (!st && a->psw) {
    psw = sp_alloc(n, sizeof(double));
    tpu_tensor_t buf;
    tpu_tensor_make_contig(&buf, psw, TPU_F64, 1, &n);
    st = !psw ? sp_oom(op)
              : (tpu_tensor_numel(a->psw) != n
                     ? TPU_ERR(INVALID_ARGUMENT, "%s: per_sample_weights must match indices", op)
                     : tpu_copy_strided(&buf, a->psw));
  }
  /* entries keyed by weight row; key -1 contributes nothing */
  int64_t ne = a->mode == BAG_MAX ? nbags * d : n;
  if (!st) {
    keys = sp_alloc(ne, sizeof(int64_t));
    order = sp_alloc(ne, sizeof(int64_t));
    start = calloc((size_t)nw + 2, sizeof(int64_t));
    if (a->scale && a->mode != BAG_MAX) freq = calloc((size_t)nw + 1, sizeof(int64_t));
    if (!keys || !order || !start || (a->scale && a->mode != BAG_MAX && !freq)) st = sp_oom(op);
  }
  for (int64_t e = 0; !st && e < ne; e++) {
    int64_t w = a->mode == BAG_MAX ? (bsz[e / d] != 0 ? mi[e] : -1)
                                   : (ids[e] == a->padding ? -1 : ids[e]);
    if (a->mode != BAG_MAX && ids[e] != a->padding && (ids[e] < 0 || ids[e] >= nw)) w = -2;
    if (w < -1 || w >= nw)
      st = TPU_ERR(OUT_OF_RANGE, "%s: index %lld is out of bounds for %lld embeddings", op,
                   (long long)(a->mode == BAG_MAX ? mi[e] : ids[e]), (long long)nw);
    keys[e] = w;
  }
  if (!st) {
    /* counting sort of entries by row: start[w + 2] counts, then prefix sums */
    for (int64_t e = 0; e < ne; e++)
      if (keys[e] >= 0) start[keys[e] + 2]++;
    if (freq)
      for (int64_t w = 0; w < nw; w++) freq[w] = start[w + 2];
    for (int64_t w = 2; w <= nw + 1; w++) start[w] += start[w - 1];
    for (int64_t e = 0; e < ne; e++)
      if (keys[e] >= 0) order[start[keys[e] + 1]++] = e;
    bag_bwd_t j = {grad, out, bag, bsz, start, order, freq, psw, d, a->mode, 0};
    sp_parallel(nw, d + (nw ? ne * d / nw : 0), bag_bwd_range, &j);
    if (j.oom) st = sp_oom(op);
  }
  free(ids);
  free(bag);
  free(bsz);
  free(mi);
  free(psw);
  free(keys);
  free(order);
  free(start);
  free(freq);
  return st;
}

/* _embedding_bag_backward(grad, indices, offsets, offset2bag, bag_size,
 * maximum_indices, num_weights, scale_grad_by_freq, mode, sparse,
 * per_sample_weights?, padding_idx) -> grad_weight (dense) */
tpu_status_t tpu_k_embedding_bag_backward(const tpu_call_t* call) {
  if (tpu_arg_bool(call, 9, false))
    return TPU_ERR(UNIMPLEMENTED, "_embedding_bag_backward: sparse gradients are not supported "
                                  "on tpu");
  bag_bwd_args_t a = {tpu_arg_tensor(call, 0), tpu_arg_tensor(call, 1), tpu_arg_tensor(call, 2),
                      tpu_arg_tensor(call, 3), tpu_arg_tensor(call, 4), tpu_arg_tensor(call, 5),
                      tpu_arg_tensor(call, 10), tpu_arg_i64(call, 6, 0), tpu_arg_i64(call, 8, 0),
                      tpu_arg_i64(call, 11, -1), tpu_arg_bool(call, 7, false)};
  return bag_backward("_embedding_bag_backward", call, &a);
}

/* _embedding_bag_dense_backward(grad, indices, offset2bag, bag_size,
 * maximum_indices, num_weights, scale_grad_by_freq, mode,
 * per_sample_weights?, padding_idx) -> grad_weight */
tpu_status_t tpu_k_embedding_bag_dense_backward(const tpu_call_t* call) {
  bag_bwd_args_t a = {tpu_arg_tensor(call, 0), tpu_arg_tensor(call, 1), NULL,
                      tpu_arg_tensor(call, 2), tpu_arg_tensor(call, 3), tpu_arg_tensor(call, 4),
                      tpu_arg_tensor(call, 8), tpu_arg_i64(call, 5, 0), tpu_arg_i64(call, 7, 0),
                      tpu_arg_i64(call, 9, -1), tpu_arg_bool(call, 6, false)};
  return bag_backward("_embedding_bag_dense_backward", call, &a);
}

typedef struct {
  const tpu_tensor_t *grad, *weight;
  const int64_t *ids, *bag;
  double* out;
  int64_t dim, padding;
  _Atomic int oom;
} psw_job_t;

static void psw_range(void* ctx, int64_t begin, int64_t end) {
  psw_job_t* j = ctx;
  int64_t d = j->dim;
  double* buf = sp_alloc(2 * d, sizeof(double));
  if (!buf) {
    j->oom = 1;
    return;
  }
  for (int64_t p = begin; p < end; p++) {
    double dot = 0;
    if (j->ids[p] != j->padding) {
      tpu_run_load_f64(buf, 1, row_ptr(j->grad, j->bag[p]), j->grad->strides[1], j->grad->dtype,
                       d);
      tpu_run_load_f64(buf + d, 1, row_ptr(j->weight, j->ids[p]), j->weight->strides[1],
                       j->weight->dtype, d);
      for (int64_t i = 0; i < d; i++) dot += buf[i] * buf[d + i];
    }
    j->out[p] = dot;
  }
  free(buf);
}

/* _embedding_bag_per_sample_weights_backward(grad, weight, indices,
 * offsets, offset2bag, mode, padding_idx) -> grad_per_sample_weights:
 * the dot product of each position's bag gradient and weight row */
tpu_status_t tpu_k_embedding_bag_psw_backward(const tpu_call_t* call) {
  const char* op = "_embedding_bag_per_sample_weights_backward";
  const tpu_tensor_t* grad = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* weight = tpu_arg_tensor(call, 1);
  const tpu_tensor_t* out = &call->outs[0];
  if (tpu_arg_i64(call, 5, BAG_SUM) != BAG_SUM)
    return TPU_ERR(INVALID_ARGUMENT, "%s: per_sample_weights are only supported for mode='sum'",
                   op);
  if (!grad || !weight || grad->ndim != 2 || weight->ndim != 2 ||
      grad->sizes[1] != weight->sizes[1] || !tpu_dtype_is_float(grad->dtype) ||
      !tpu_dtype_is_float(weight->dtype))
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected 2-D floating grad and weight of one width", op);
  bag_bwd_args_t a = {grad, tpu_arg_tensor(call, 2), tpu_arg_tensor(call, 3),
                      tpu_arg_tensor(call, 4), NULL, NULL, NULL, weight->sizes[0], BAG_SUM,
                      tpu_arg_i64(call, 6, -1), false};
  int64_t n = a.indices ? tpu_tensor_numel(a.indices) : 0;
  if (tpu_tensor_numel(out) != n)
    return TPU_ERR(INVALID_ARGUMENT, "%s: the result must have one entry per index", op);
  int64_t *ids, *bag;
  TPU_RETURN_IF_ERROR(load_bags(op, &a, grad->sizes[0], &ids, &bag));
  tpu_status_t st = TPU_OK;
  for (int64_t p = 0; !st && p < n; p++)
    if (ids[p] != a.padding && (ids[p] < 0 || ids[p] >= a.num_weights))
      st = TPU_ERR(OUT_OF_RANGE, "%s: index %lld is out of bounds for %lld embeddings", op,
                   (long long)ids[p], (long long)a.num_weights);
  double* res = st ? NULL : sp_alloc(n, sizeof(double));
  if (!st && !res) st = sp_oom(op);
  if (!st) {
    psw_job_t j = {grad, weight, ids, bag, res, grad->sizes[1], a.padding, 0};
    sp_parallel(n, 2 * j.dim, psw_range, &j);
    tpu_tensor_t src;
    tpu_tensor_make_contig(&src, res, TPU_F64, 1, &n);
    tpu_tensor_t dst = *out;
    dst.ndim = 1;
    dst.sizes[0] = n;
    dst.strides[0] = out->ndim ? out->strides[out->ndim - 1] : 1;
    st = j.oom ? sp_oom(op) : tpu_copy_strided(&dst, &src);
  }
  free(ids);
  free(bag);
  free(res);
  return st;
}
