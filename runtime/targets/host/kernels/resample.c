/* Resampling kernels: upsampling (nearest, nearest-exact, linear, bilinear,
 * bicubic, trilinear), reflection and replication padding, grid_sampler_2d/3d,
 * all with their backward, and channel_shuffle.
 *
 * Upsampling is separable: for every output coordinate along each dim a
 * table gives up to four (input index, weight) taps, computed with
 * PyTorch's CPU formulas in the same precision (float for float32,
 * bfloat16, float16 and uint8, double for float64; nearest indices in float
 * as PyTorch does), so the chosen source pixels match exactly. A plane's
 * output is the nested weighted sum over the taps of each dim; the backward
 * scatters the output gradient through the same taps. Planes run in
 * parallel on staged contiguous data (spatial.h).
 *
 * grid_sampler_2d samples input (N, C, H, W) at grid (N, Ho, Wo, 2)
 * positions (x, y in [-1, 1]) with bilinear, nearest or bicubic
 * interpolation and zeros, border or reflection padding, following
 * PyTorch's reference CPU formulas, gradients included. grid_sampler_3d
 * is the same code over input (N, C, D, H, W) and grid (N, Do, Ho, Wo, 3)
 * (x, y, z), with trilinear or nearest interpolation.
 */
#include "spatial.h"

/* ---- upsampling ---- */
typedef enum { U_NEAREST, U_NEAREST_EXACT, U_LINEAR, U_CUBIC, U_LINEAR_AA, U_CUBIC_AA } up_kind_t;

typedef struct {
  int ntaps[3];
  int64_t* idx[3]; /* out[d] x ntaps[d] input indices */
  void* w[3];      /* matching weights in the compute type */
  int64_t in[3], out[3], in_len, out_len, lanes;
  tpu_dtype_t dt; /* TPU_F32 or TPU_F64 */
  bool round_u8;  /* uint8 output: round to nearest and clamp */
} up_plan_t;

/* PyTorch's compute_scales_value: 1 / scale when given, in / out otherwise. */
#define SCALE_VALUE(T, scale, in, out) \
  ((scale) > 0 ? (T)(1.0 / (scale)) : (T)(in) / (T)(out))

/* Cubic convolution weights for fractional offset t (A = -0.75). */
#define CUBIC_COEFFS(T, c, t)                                            \
  do {                                                                   \
    const T A_ = (T)-0.75, x1_ = (t), x2_ = (T)1 - (t);                  \
    (c)[0] = ((A_ * (x1_ + 1) - 5 * A_) * (x1_ + 1) + 8 * A_) * (x1_ + 1) - 4 * A_; \
    (c)[1] = ((A_ + 2) * x1_ - (A_ + 3)) * x1_ * x1_ + 1;                \
    (c)[2] = ((A_ + 2) * x2_ - (A_ + 3)) * x2_ * x2_ + 1;                \
    (c)[3] = ((A_ * (x2_ + 1) - 5 * A_) * (x2_ + 1) + 8 * A_) * (x2_ + 1) - 4 * A_; \
  } while (0)

/* The ratio of input to output coordinates along a dim, in type T:
 * (in - 1) / (out - 1) with align_corners, else SCALE_VALUE. */
#define UP_RATIO(T, align, scale, in, out)                               \
  ((align) ? ((out) > 1 ? (T)((in) - 1) / (T)((out) - 1) : (T)0)        \
           : SCALE_VALUE(T, scale, in, out))

/* Antialiased resampling (antialias=True), linear or cubic: output o takes
 * the input samples within `support` of its centre ratio * (o + 0.5) (half
 * the filter's width, 1 for the triangle, 2 for the cubic, stretched by the
 * ratio when downsampling), weighted by the filter at the distance (shrunk
 * by the ratio when downsampling) and normalized to sum 1. The cubic filter
 * is Keys' with a = -0.5 (PyTorch's, for compatibility with PIL; the
 * unantialiased bicubic uses -0.75). Taps past an output's span get weight 0. */
static double aa_support(bool cubic, double ratio) {
  return (cubic ? 2.0 : 1.0) * (ratio >= 1 ? ratio : 1);
}

static int aa_taps(bool cubic, double ratio) {
  return 2 * (int)ceil(aa_support(cubic, ratio)) + 1;
}

static double aa_filter(bool cubic, double x) {
  x = fabs(x);
  if (!cubic) return x < 1 ? 1 - x : 0;
  const double a = -0.5;
  if (x < 1) return ((a + 2) * x - (a + 3)) * x * x + 1;
  if (x < 2) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
  return 0;
}

static void aa_table(bool cubic, double ratio, int64_t in, int64_t out, int taps, int64_t* idx,
                     double* w) {
  const double support = aa_support(cubic, ratio), inv = ratio >= 1 ? 1 / ratio : 1;
  for (int64_t o = 0; o < out; o++) {
    const double center = ratio * ((double)o + 0.5);
    int64_t lo = (int64_t)(center - support + 0.5);
    if (lo < 0) lo = 0;
    int64_t n = (int64_t)(center + support + 0.5);
    n = (n < in ? n : in) - lo;
    if (n > taps) n = taps;
    double total = 0;
    for (int64_t j = 0; j < taps; j++) {
      w[o * taps + j] = j < n ? aa_filter(cubic, ((double)(j + lo) - center + 0.5) * inv) : 0;
      idx[o * taps + j] = j < n ? lo + j : lo;
      total += w[o * taps + j];
    }
    for (int64_t j = 0; j < taps && total != 0; j++) w[o * taps + j] /= total;
  }
}

/* Fills one dim's taps. `scale` <= 0 means none was given. */
#define DEFINE_UP_TABLE(SUF, T)                                                          \
  static void up_table_##SUF(up_kind_t kind, bool align, double scale, int64_t in,       \
                             int64_t out, int64_t* idx, T* w) {                          \
    T ratio = UP_RATIO(T, align, scale, in, out);                                        \
    float fscale = SCALE_VALUE(float, scale, in, out);                                   \
    for (int64_t o = 0; o < out; o++) {                                                  \
      if (kind == U_NEAREST || kind == U_NEAREST_EXACT) {                                \
        int64_t i;                                                                       \
        if (kind == U_NEAREST && out == in) i = o;                                       \
        else if (kind == U_NEAREST && out == 2 * in) i = o >> 1;                         \
        else if (kind == U_NEAREST) i = (int64_t)floorf((float)o * fscale);              \
        else i = (int64_t)floorf((float)(((double)o + 0.5) * (double)fscale));           \
        idx[o] = i < in - 1 ? i : in - 1;                                                \
        w[o] = 1;                                                                        \
        continue;                                                                        \
      }                                                                                  \
      bool cubic = kind == U_CUBIC;                                                      \
      if (!cubic && out == in) {                                                         \
        idx[2 * o] = idx[2 * o + 1] = o;                                                 \
        w[2 * o] = 1;                                                                    \
        w[2 * o + 1] = 0;                                                                \
        continue;                                                                        \
      }                                                                                  \
      T real = align ? ratio * (T)o : ratio * ((T)o + (T)0.5) - (T)0.5;                  \
      if (!align && !cubic && real < 0) real = 0;                                        \
      int64_t i0 = (int64_t)floorf((float)real);                                         \
      if (i0 > in - 1) i0 = in - 1;                                                      \
      T lambda = real - (T)i0;                                                           \
      lambda = lambda < 0 ? 0 : (lambda > 1 ? 1 : lambda);                               \
      if (!cubic) {                                                                      \
        idx[2 * o] = i0;                                                                 \
        idx[2 * o + 1] = i0 + (i0 < in - 1 ? 1 : 0);                                     \
        w[2 * o] = (T)1 - lambda;                                                        \
        w[2 * o + 1] = lambda;                                                           \
      } else {                                                                           \
        CUBIC_COEFFS(T, w + 4 * o, lambda);                                              \
        for (int j = 0; j < 4; j++) {                                                    \
          int64_t k = i0 - 1 + j;                                                        \
          idx[4 * o + j] = k < 0 ? 0 : (k > in - 1 ? in - 1 : k);                        \
        }                                                                                \
      }                                                                                  \
    }                                                                                    \
  }
DEFINE_UP_TABLE(f32, float)
DEFINE_UP_TABLE(f64, double)

/* Interpolates (forward) or scatters (backward, gin zeroed) one plane. The
 * forward works a row at a time: out = sum_a w0 * (sum_b w1 * (sum_c w2 *
 * in)), the inner sums of a whole row accumulated in `tmp` (out[2] values). */
#define DEFINE_UP_FWD(SUF, T)                                                              \
  static void up_fwd_##SUF(const up_plan_t* p, const T* in, T* out, T* tmp) {             \
    const T *w0 = p->w[0], *w1 = p->w[1], *w2 = p->w[2];                                  \
    const int n0 = p->ntaps[0], n1 = p->ntaps[1], n2 = p->ntaps[2];                        \
    const int64_t *i0 = p->idx[0], *i1 = p->idx[1], *i2 = p->idx[2], ow_n = p->out[2];     \
    for (int64_t od = 0; od < p->out[0]; od++)                                             \
      for (int64_t oh = 0; oh < p->out[1]; oh++) {                                         \
        T* o = out + (od * p->out[1] + oh) * ow_n;                                         \
        if (n0 * n1 * n2 == 1) { /* nearest: a gather */                                   \
          const T* row = in + (i0[od] * p->in[1] + i1[oh]) * p->in[2];                     \
          for (int64_t ow = 0; ow < ow_n; ow++) o[ow] = row[i2[ow]];                       \
          continue;                                                                        \
        }                                                                                  \
        for (int64_t ow = 0; ow < ow_n; ow++) o[ow] = 0;                                   \
        for (int a = 0; a < n0; a++) {                                                     \
          for (int64_t ow = 0; ow < ow_n; ow++) tmp[ow] = 0;                               \
          for (int b = 0; b < n1; b++) {                                                   \
            const T* row = in + (i0[od * n0 + a] * p->in[1] + i1[oh * n1 + b]) * p->in[2]; \
            const T wb = w1[oh * n1 + b];                                                  \
            for (int64_t ow = 0; ow < ow_n; ow++) {                                        \
              T s = 0;                                                                     \
              for (int c = 0; c < n2; c++) s += w2[ow * n2 + c] * row[i2[ow * n2 + c]];    \
              tmp[ow] += wb * s;                                                           \
            }                                                                              \
          }                                                                                \
          const T wa = w0[od * n0 + a];                                                    \
          for (int64_t ow = 0; ow < ow_n; ow++) o[ow] += wa * tmp[ow];                     \
        }                                                                                  \
      }                                                                                    \
  }
#define DEFINE_UP_BWD(SUF, T)                                                              \
  static void up_bwd_##SUF(const up_plan_t* p, const T* gout, T* gin) {                   \
    const T *w0 = p->w[0], *w1 = p->w[1], *w2 = p->w[2];                                  \
    const int n0 = p->ntaps[0], n1 = p->ntaps[1], n2 = p->ntaps[2];                        \
    for (int64_t od = 0, o = 0; od < p->out[0]; od++)                                      \
      for (int64_t oh = 0; oh < p->out[1]; oh++)                                           \
        for (int64_t ow = 0; ow < p->out[2]; ow++, o++)                                    \
          for (int a = 0; a < n0; a++)                                                     \
            for (int b = 0; b < n1; b++) {                                                 \
              T g = gout[o] * w0[od * n0 + a] * w1[oh * n1 + b];                           \
              T* row = gin + (p->idx[0][od * n0 + a] * p->in[1] +                          \
                              p->idx[1][oh * n1 + b]) * p->in[2];                          \
              for (int c = 0; c < n2; c++) row[p->idx[2][ow * n2 + c]] += g * w2[ow * n2 + c]; \
            }                                                                              \
  }
DEFINE_UP_FWD(f32, float)
DEFINE_UP_FWD(f64, double)
DEFINE_UP_FWD(i64, int64_t)
DEFINE_UP_BWD(f32, float)
DEFINE_UP_BWD(f64, double)

typedef struct {
  const up_plan_t* p;
  const char* src;
  char* dst;
  bool backward;
  _Atomic int oom;
} up_job_t;

static void up_range(void* ctx, int64_t begin, int64_t end) {
  up_job_t* job = ctx;
  const up_plan_t* p = job->p;
  int64_t esz = (int64_t)tpu_dtype_size(p->dt);
  void* tmp = sp_alloc(p->out[2], (size_t)esz);
  if (!tmp) {
    job->oom = 1;
    return;
  }
  int64_t src_len = job->backward ? p->out_len : p->in_len;
  int64_t dst_len = job->backward ? p->in_len : p->out_len;
  for (int64_t i = begin; i < end; i++) {
    const void* s = job->src + i * src_len * esz;
    void* d = job->dst + i * dst_len * esz;
    if (p->dt == TPU_F32) {
      if (job->backward) up_bwd_f32(p, s, d);
      else up_fwd_f32(p, s, d, tmp);
      if (p->round_u8)
        for (int64_t k = 0; k < dst_len; k++) {
          float v = nearbyintf(((float*)d)[k]);
          ((float*)d)[k] = v < 0 ? 0 : (v > 255 ? 255 : v);
        }
    } else if (p->dt == TPU_F64) {
      if (job->backward) up_bwd_f64(p, s, d);
      else up_fwd_f64(p, s, d, tmp);
    } else { /* integer gathers (padding) */
      up_fwd_i64(p, s, d, tmp);
    }
  }
  free(tmp);
}

static void up_plan_free(up_plan_t* p) {
  for (int d = 0; d < 3; d++) {
    free(p->idx[d]);
    free(p->w[d]);
  }
}

/* Checks the input-side and output-side tensors (`in`, `out` of the
 * forward: for the backward, grad_input and grad_output) and sets the plan's
 * sizes; plan_tables then allocates its tables. */
static tpu_status_t plan_init(const char* op, int nsp, const tpu_tensor_t* in,
                              const tpu_tensor_t* out, tpu_dtype_t dt, up_plan_t* p) {
  memset(p, 0, sizeof *p);
  if (!in || !out) return TPU_ERR(INVALID_ARGUMENT, "%s: missing tensor", op);
  if (in->ndim < nsp + 1 || in->ndim != out->ndim)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected input and output of %d dims, got %d and %d", op,
                   nsp + 2, (int)in->ndim, (int)out->ndim);
  for (int d = 0; d < in->ndim - nsp; d++)
    if (in->sizes[d] != out->sizes[d])
      return TPU_ERR(INVALID_ARGUMENT, "%s: input and output must have the same batch and channels",
                     op);
  p->dt = dt;
  sp_split(in, nsp, &p->lanes, p->in);
  int64_t lanes;
  sp_split(out, nsp, &lanes, p->out);
  p->in_len = sp_prod3(p->in);
  p->out_len = sp_prod3(p->out);
  if (p->in_len == 0 && p->out_len > 0 && p->lanes > 0)
    return TPU_ERR(INVALID_ARGUMENT, "%s: input spatial sizes must be greater than 0", op);
  return TPU_OK;
}

/* Allocates a plan's tables: `taps` per output coordinate along the nsp
 * spatial dims, one tap of weight 1 along the unused ones. */
static tpu_status_t plan_tables(const char* op, int nsp, int taps, up_plan_t* p) {
  const tpu_dtype_t dt = p->dt;
  for (int d = 0; d < 3; d++) {
    bool used = d >= 3 - nsp;
    p->ntaps[d] = used ? taps : 1;
    int64_t n = p->out[d] * p->ntaps[d];
    p->idx[d] = sp_alloc(n, sizeof(int64_t));
    p->w[d] = sp_alloc(n, tpu_dtype_size(dt));
    if (!p->idx[d] || !p->w[d]) {
      up_plan_free(p);
      return sp_oom(op);
    }
    if (!used) {
      p->idx[d][0] = 0;
      if (dt == TPU_F32) ((float*)p->w[d])[0] = 1;
      else if (dt == TPU_F64) ((double*)p->w[d])[0] = 1;
      else ((int64_t*)p->w[d])[0] = 1;
    }
  }
  return TPU_OK;
}

/* Upsampling plan; optional scales are args[scale_arg ...] in dim order,
 * align_corners is args[align_arg] (-1: none). */
static tpu_status_t up_plan(const char* op, const tpu_call_t* call, up_kind_t kind, int nsp,
                            int align_arg, int scale_arg, const tpu_tensor_t* in,
                            const tpu_tensor_t* out, bool backward, up_plan_t* p) {
  if (!in || !out) return TPU_ERR(INVALID_ARGUMENT, "%s: missing tensor", op);
  bool u8 = in->dtype == TPU_U8 && out->dtype == TPU_U8 && !backward;
  if (!(tpu_dtype_is_float(in->dtype) && tpu_dtype_is_float(out->dtype)) && !u8)
    return TPU_ERR(INVALID_ARGUMENT, "%s: not implemented for %s", op,
                   tpu_dtype_name(tpu_dtype_is_float(in->dtype) ? out->dtype : in->dtype));
  TPU_RETURN_IF_ERROR(plan_init(op, nsp, in, out, in->dtype == TPU_F64 ? TPU_F64 : TPU_F32, p));
  p->round_u8 = u8;
  bool align = align_arg >= 0 && tpu_arg_bool(call, align_arg, false);
  double scales[3] = {0, 0, 0}, ratios[3] = {0, 0, 0};
  int taps = kind == U_CUBIC ? 4 : (kind == U_LINEAR ? 2 : 1);
  const bool aa = kind == U_LINEAR_AA || kind == U_CUBIC_AA;
  for (int d = 3 - nsp; d < 3; d++) {
    int ai = scale_arg + d - (3 - nsp);
    scales[d] = tpu_arg_is_none(call, ai) ? 0 : tpu_arg_f64(call, ai, 0);
    ratios[d] = UP_RATIO(double, align, scales[d], p->in[d], p->out[d]);
    if (aa && aa_taps(kind == U_CUBIC_AA, ratios[d]) > taps)
      taps = aa_taps(kind == U_CUBIC_AA, ratios[d]);
  }
  TPU_RETURN_IF_ERROR(plan_tables(op, nsp, taps, p));
  for (int d = 3 - nsp; d < 3; d++) {
    if (aa) {
      const int64_t n = p->out[d] * taps;
      double* w = sp_alloc(n, sizeof(double));
      if (!w) {
        up_plan_free(p);
        return sp_oom(op);
      }
      aa_table(kind == U_CUBIC_AA, ratios[d], p->in[d], p->out[d], taps, p->idx[d], w);
      for (int64_t k = 0; k < n; k++) {
        if (p->dt == TPU_F32) ((float*)p->w[d])[k] = (float)w[k];
        else ((double*)p->w[d])[k] = w[k];
      }
      free(w);
    } else if (p->dt == TPU_F32) {
      up_table_f32(kind, align, scales[d], p->in[d], p->out[d], p->idx[d], p->w[d]);
    } else {
      up_table_f64(kind, align, scales[d], p->in[d], p->out[d], p->idx[d], p->w[d]);
    }
  }
  return TPU_OK;
}

/* Runs a plan from src to dst (forward: input to output; backward:
 * grad_output to grad_input) and releases it. */
static tpu_status_t plan_run(const char* op, up_plan_t* p, const tpu_tensor_t* src,
                             const tpu_tensor_t* dst, bool backward) {
  sp_stage_t ss, sd;
  tpu_status_t st = sp_stage_in(op, src, p->dt, &ss);
  if (!st) {
    st = sp_stage_out(op, dst, p->dt, backward, &sd);
    if (!st) {
      up_job_t job = {p, ss.data, sd.data, backward, 0};
      int64_t taps = (int64_t)p->ntaps[0] * p->ntaps[1] * p->ntaps[2];
      sp_parallel(p->lanes, p->out_len * taps, up_range, &job);
      st = sp_stage_finish(&sd, job.oom ? sp_oom(op) : st);
    }
    sp_stage_free(&ss);
  }
  up_plan_free(p);
  return st;
}

/* forward (self, output_size, [align_corners], scales...) -> out;
 * backward (grad_output, output_size, input_size, [align_corners],
 * scales...) -> grad_input */
static tpu_status_t upsample(const char* op, const tpu_call_t* call, up_kind_t kind, int nsp,
                             bool backward) {
  bool has_align = kind == U_LINEAR || kind == U_CUBIC || kind == U_LINEAR_AA || kind == U_CUBIC_AA;
  int align_arg = has_align ? (backward ? 3 : 2) : -1;
  int scale_arg = (backward ? 3 : 2) + (has_align ? 1 : 0);
  const tpu_tensor_t* src = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* dst = &call->outs[0];
  up_plan_t p;
  TPU_RETURN_IF_ERROR(up_plan(op, call, kind, nsp, align_arg, scale_arg, backward ? dst : src,
                              backward ? src : dst, backward, &p));
  return plan_run(op, &p, src, dst, backward);
}

#define UPSAMPLE_KERNELS(NAME, OPNAME, KIND, NSP)                                \
  tpu_status_t tpu_k_##NAME(const tpu_call_t* call) {                           \
    return upsample(OPNAME, call, KIND, NSP, false);                            \
  }                                                                             \
  tpu_status_t tpu_k_##NAME##_backward(const tpu_call_t* call) {                \
    return upsample(OPNAME "_backward", call, KIND, NSP, true);                 \
  }
UPSAMPLE_KERNELS(upsample_nearest1d, "upsample_nearest1d", U_NEAREST, 1)
UPSAMPLE_KERNELS(upsample_nearest2d, "upsample_nearest2d", U_NEAREST, 2)
UPSAMPLE_KERNELS(upsample_nearest3d, "upsample_nearest3d", U_NEAREST, 3)
UPSAMPLE_KERNELS(upsample_nearest_exact1d, "_upsample_nearest_exact1d", U_NEAREST_EXACT, 1)
UPSAMPLE_KERNELS(upsample_nearest_exact2d, "_upsample_nearest_exact2d", U_NEAREST_EXACT, 2)
UPSAMPLE_KERNELS(upsample_nearest_exact3d, "_upsample_nearest_exact3d", U_NEAREST_EXACT, 3)
UPSAMPLE_KERNELS(upsample_linear1d, "upsample_linear1d", U_LINEAR, 1)
UPSAMPLE_KERNELS(upsample_bilinear2d, "upsample_bilinear2d", U_LINEAR, 2)
UPSAMPLE_KERNELS(upsample_trilinear3d, "upsample_trilinear3d", U_LINEAR, 3)
UPSAMPLE_KERNELS(upsample_bicubic2d, "upsample_bicubic2d", U_CUBIC, 2)
UPSAMPLE_KERNELS(upsample_bilinear2d_aa, "_upsample_bilinear2d_aa", U_LINEAR_AA, 2)
UPSAMPLE_KERNELS(upsample_bicubic2d_aa, "_upsample_bicubic2d_aa", U_CUBIC_AA, 2)

/* ---- reflection and replication padding ----
 * A gather through one-tap index tables (PyTorch's CPU index formulas, any
 * padding sign); the backward scatters through the same tables. */
typedef enum { PAD_REFLECT, PAD_REPLICATE } pad_kind_t;

/* Source index of every output position along one dim; false if one falls
 * outside the input (sizes inconsistent with the padding). */
static bool pad_table(pad_kind_t kind, int64_t pad_l, int64_t in, int64_t out, int64_t* idx) {
  int64_t i_start = pad_l < 0 ? -pad_l : 0, o_start = pad_l > 0 ? pad_l : 0;
  for (int64_t o = 0; o < out; o++) {
    int64_t i;
    if (o < pad_l) i = kind == PAD_REFLECT ? 2 * pad_l - o : pad_l;
    else if (o < in + pad_l) i = o;
    else i = kind == PAD_REFLECT ? 2 * (in + pad_l - 1) - o : in + pad_l - 1;
    i = i - o_start + i_start;
    if (i < 0 || i >= in) return false;
    idx[o] = i;
  }
  return true;
}

/* forward (self, padding) -> out; backward (grad_output, self, padding) ->
 * grad_input. padding holds (left, right) pairs from the last dim. */
static tpu_status_t pad_op(const char* op, const tpu_call_t* call, pad_kind_t kind, int nsp,
                           bool backward) {
  if (tpu_call_has_complex(call)) return tpu_complex_by_parts(call);
  const tpu_tensor_t* src = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* dst = &call->outs[0];
  int pad_arg = backward ? 2 : 1;
  const tpu_arg_t* pads = pad_arg < call->nargs ? &call->args[pad_arg] : NULL;
  if (!src) return TPU_ERR(INVALID_ARGUMENT, "%s: missing input", op);
  if (!pads || pads->kind != TPU_ARG_INTLIST || pads->n != 2 * nsp)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected padding of %d ints", op, 2 * nsp);
  if (src->dtype == TPU_BOOL || (backward && !tpu_dtype_is_float(src->dtype)))
    return TPU_ERR(INVALID_ARGUMENT, "%s: not implemented for %s", op, tpu_dtype_name(src->dtype));
  up_plan_t p;
  TPU_RETURN_IF_ERROR(plan_init(op, nsp, backward ? dst : src, backward ? src : dst,
                                sp_compute_dtype(src->dtype), &p));
  TPU_RETURN_IF_ERROR(plan_tables(op, nsp, 1, &p));
  for (int d = 3 - nsp; d < 3; d++) {
    if (!pad_table(kind, pads->v.ilist[2 * (2 - d)], p.in[d], p.out[d], p.idx[d])) {
      up_plan_free(&p);
      return TPU_ERR(INVALID_ARGUMENT, "%s: padding %lld does not fit sizes %lld -> %lld", op,
                     (long long)pads->v.ilist[2 * (2 - d)], (long long)p.in[d],
                     (long long)p.out[d]);
    }
    for (int64_t o = 0; o < p.out[d]; o++) {
      if (p.dt == TPU_F32) ((float*)p.w[d])[o] = 1;
      else if (p.dt == TPU_F64) ((double*)p.w[d])[o] = 1;
      else ((int64_t*)p.w[d])[o] = 1;
    }
  }
  return plan_run(op, &p, src, dst, backward);
}

#define PAD_KERNELS(NAME, KIND, NSP)                                      \
  tpu_status_t tpu_k_##NAME(const tpu_call_t* call) {                     \
    return pad_op(#NAME, call, KIND, NSP, false);                         \
  }                                                                       \
  tpu_status_t tpu_k_##NAME##_backward(const tpu_call_t* call) {          \
    return pad_op(#NAME "_backward", call, KIND, NSP, true);              \
  }
PAD_KERNELS(reflection_pad1d, PAD_REFLECT, 1)
PAD_KERNELS(reflection_pad2d, PAD_REFLECT, 2)
PAD_KERNELS(reflection_pad3d, PAD_REFLECT, 3)
PAD_KERNELS(replication_pad1d, PAD_REPLICATE, 1)
PAD_KERNELS(replication_pad2d, PAD_REPLICATE, 2)
PAD_KERNELS(replication_pad3d, PAD_REPLICATE, 3)

/* ---- grid_sampler_2d / grid_sampler_3d ---- */
enum { GS_BILINEAR = 0, GS_NEAREST = 1, GS_BICUBIC = 2 };
enum { GS_ZEROS = 0, GS_BORDER = 1, GS_REFLECTION = 2 };

/* Sizes are kept in grid component order: index 0 is W (x), 1 is H (y),
 * 2 is D (z, 3-D only). */
typedef struct {
  int nd; /* spatial dims: 2 or 3 */
  int64_t n, c, sz[3], osz[3];
  int64_t plane, oplane, orows; /* input / output points per plane, output rows */
  int mode, padding;
  bool align;
  tpu_dtype_t dt;
  const char *in, *grid, *gout;
  char *out, *gin, *ggrid;
} gs_job_t;

/* An index from a coordinate; far-out or NaN coordinates map far out of
 * bounds (neighbors included). */
static inline int64_t gs_index(double v) {
  return v > -1e15 && v < 1e15 ? (int64_t)v : -((int64_t)1 << 62);
}

/* Flat offset of the input point at idx (grid component order), -1 when
 * it lies outside (reads as 0). */
__attribute__((always_inline)) static inline int64_t gs_tap_off(const gs_job_t* j,
                                                               const int64_t* idx, int nd) {
  int64_t off = 0;
  for (int d = nd - 1; d >= 0; d--) {
    if (idx[d] < 0 || idx[d] >= j->sz[d]) return -1;
    off = off * j->sz[d] + idx[d];
  }
  return off;
}

/* The taps of one sample point: flat input offsets (-1: outside, reads 0),
 * weights, and the weights' derivatives along each grid component;
 * m[d] = d(pixel coordinate) / d(grid coordinate). Linear interpolation
 * has 2^nd corners; corner k takes the upper neighbour along dim d when bit
 * d of k is set, which is PyTorch's nw, ne, sw, se (then the bottom layer)
 * order. */
#define DEFINE_GRID_SAMPLER(SUF, T, FLOOR, FABS, FMOD, NEARBYINT)                             \
  typedef struct {                                                                            \
    int n;                                                                                    \
    int64_t off[16];                                                                          \
    T w[16], wg[3][16];                                                                       \
    T m[3];                                                                                   \
  } taps_##SUF;                                                                               \
                                                                                              \
  static T clip_##SUF(T v, int64_t size, T* grad) {                                           \
    if (v <= 0) {                                                                             \
      *grad = 0;                                                                              \
      return 0;                                                                               \
    }                                                                                         \
    T max = (T)(size - 1);                                                                    \
    *grad = v >= max ? 0 : 1;                                                                 \
    return v >= max ? max : v;                                                                \
  }                                                                                           \
                                                                                              \
  static T reflect_##SUF(T v, int64_t twice_low, int64_t twice_high, T* grad) {               \
    if (twice_low == twice_high) {                                                            \
      *grad = 0;                                                                              \
      return 0;                                                                               \
    }                                                                                         \
    T min = (T)twice_low / 2, span = (T)(twice_high - twice_low) / 2;                         \
    v -= min;                                                                                 \
    T sign = 1;                                                                               \
    if (v < 0) {                                                                              \
      sign = -1;                                                                              \
      v = -v;                                                                                 \
    }                                                                                         \
    T extra = FMOD(v, span);                                                                  \
    int flips = (int)FLOOR(v / span);                                                         \
    *grad = flips % 2 == 0 ? sign : -sign;                                                    \
    return flips % 2 == 0 ? extra + min : span - extra + min;                                 \
  }                                                                                           \
                                                                                              \
  /* padding applied to a pixel coordinate; *grad gets its derivative */                      \
  static T pad_coord_##SUF(const gs_job_t* j, T v, int64_t size, T* grad) {                   \
    T gc = 1, gr = 1;                                                                         \
    if (j->padding == GS_BORDER) {                                                            \
      v = clip_##SUF(v, size, &gc);                                                           \
    } else if (j->padding == GS_REFLECTION) {                                                 \
      v = j->align ? reflect_##SUF(v, 0, 2 * (size - 1), &gr)                                 \
                   : reflect_##SUF(v, -1, 2 * size - 1, &gr);                                 \
      v = clip_##SUF(v, size, &gc);                                                           \
    }                                                                                         \
    *grad = gr * gc;                                                                          \
    return v;                                                                                 \
  }                                                                                           \
                                                                                              \
  static T unnormalize_##SUF(const gs_job_t* j, T v, int64_t size, T* grad) {                 \
    if (j->align) {                                                                           \
      *grad = (T)(size - 1) / 2;                                                              \
      return ((v + 1) / 2) * (T)(size - 1);                                                   \
    }                                                                                         \
    *grad = (T)size / 2;                                                                      \
    return ((v + 1) * (T)size - 1) / 2;                                                       \
  }                                                                                           \
                                                                                              \
  /* bicubic (2-D only): 4 x 4 taps, each coordinate padded on its own */                     \
  static void gs_cubic_taps_##SUF(const gs_job_t* j, const T* g, taps_##SUF* t) {             \
    T ix = unnormalize_##SUF(j, g[0], j->sz[0], &t->m[0]);                                    \
    T iy = unnormalize_##SUF(j, g[1], j->sz[1], &t->m[1]);                                    \
    T fx = FLOOR(ix), fy = FLOOR(iy), tx = ix - fx, ty = iy - fy, px, py;                     \
    T cx[4], cy[4], dx[4], dy[4];                                                             \
    CUBIC_COEFFS(T, cx, tx);                                                                  \
    CUBIC_COEFFS(T, cy, ty);                                                                  \
    CUBIC_GRAD(T, dx, tx);                                                                    \
    CUBIC_GRAD(T, dy, ty);                                                                    \
    t->n = 16;                                                                                \
    for (int a = 0; a < 4; a++)   /* y tap */                                                 \
      for (int b = 0; b < 4; b++) { /* x tap */                                               \
        int k = a * 4 + b;                                                                    \
        int64_t idx[2] = {gs_index(pad_coord_##SUF(j, fx - 1 + (T)b, j->sz[0], &px)),         \
                          gs_index(pad_coord_##SUF(j, fy - 1 + (T)a, j->sz[1], &py))};        \
        t->off[k] = gs_tap_off(j, idx, 2);                                                    \
        t->w[k] = cx[b] * cy[a];                                                              \
        t->wg[0][k] = -dx[b] * cy[a];                                                         \
        t->wg[1][k] = -dy[a] * cx[b];                                                         \
      }                                                                                       \
  }                                                                                           \
                                                                                              \
  /* nearest or linear; inlined with a constant nd so the dim loops unroll */                 \
  __attribute__((always_inline)) static inline void gs_nd_taps_##SUF(                         \
      const gs_job_t* j, const T* g, taps_##SUF* t, const int nd) {                           \
    T pc[3];                                                                                  \
    for (int d = 0; d < nd; d++) {                                                            \
      T gu, gp;                                                                               \
      pc[d] = unnormalize_##SUF(j, g[d], j->sz[d], &gu);                                      \
      pc[d] = pad_coord_##SUF(j, pc[d], j->sz[d], &gp);                                       \
      t->m[d] = gu * gp;                                                                      \
    }                                                                                         \
    int64_t idx[3];                                                                           \
    if (j->mode == GS_NEAREST) {                                                              \
      for (int d = 0; d < nd; d++) idx[d] = gs_index(NEARBYINT(pc[d]));                       \
      t->n = 1;                                                                               \
      t->off[0] = gs_tap_off(j, idx, nd);                                                     \
      t->w[0] = 1;                                                                            \
      for (int d = 0; d < nd; d++) t->wg[d][0] = 0;                                           \
      return;                                                                                 \
    }                                                                                         \
    /* f[d][1] = i - i0 (weight of the upper corner), f[d][0] = i0 + 1 - i */                 \
    int64_t lo[3];                                                                            \
    T f[3][2];                                                                                \
    for (int d = 0; d < nd; d++) {                                                            \
      T fl = FLOOR(pc[d]);                                                                    \
      lo[d] = gs_index(fl);                                                                   \
      f[d][0] = (fl + 1) - pc[d];                                                             \
      f[d][1] = pc[d] - fl;                                                                   \
    }                                                                                         \
    t->n = 1 << nd;                                                                           \
    for (int k = 0; k < t->n; k++) {                                                          \
      T w = 1;                                                                                \
      for (int d = 0; d < nd; d++) {                                                          \
        int up = (k >> d) & 1;                                                                \
        idx[d] = lo[d] + up;                                                                  \
        w *= f[d][up];                                                                        \
      }                                                                                       \
      t->off[k] = gs_tap_off(j, idx, nd);                                                     \
      t->w[k] = w;                                                                            \
      for (int e = 0; e < nd; e++) { /* d w / d i_e: the other factors, signed */             \
        T dw = (k >> e) & 1 ? 1 : -1;                                                         \
        for (int d = 0; d < nd; d++)                                                          \
          if (d != e) dw *= f[d][(k >> d) & 1];                                               \
        t->wg[e][k] = dw;                                                                     \
      }                                                                                       \
    }                                                                                         \
  }                                                                                           \
                                                                                              \
  static void gs_taps_##SUF(const gs_job_t* j, const T* g, taps_##SUF* t) {                   \
    if (j->mode == GS_BICUBIC) gs_cubic_taps_##SUF(j, g, t);                                  \
    else if (j->nd == 2) gs_nd_taps_##SUF(j, g, t, 2);                                        \
    else gs_nd_taps_##SUF(j, g, t, 3);                                                        \
  }                                                                                           \
                                                                                              \
  static void gs_point_##SUF(const gs_job_t* j, int64_t n, int64_t p, taps_##SUF* t) {        \
    gs_taps_##SUF(j, (const T*)j->grid + (n * j->oplane + p) * j->nd, t);                     \
  }                                                                                           \
                                                                                              \
  /* forward: items are (n, output row) */                                                    \
  static void gs_fwd_##SUF(const gs_job_t* j, int64_t item) {                                 \
    int64_t n = item / j->orows;                                                              \
    taps_##SUF t;                                                                             \
    for (int64_t p = (item % j->orows) * j->osz[0], e = p + j->osz[0]; p < e; p++) {          \
      gs_point_##SUF(j, n, p, &t);                                                            \
      for (int64_t c = 0; c < j->c; c++) {                                                    \
        const T* in = (const T*)j->in + (n * j->c + c) * j->plane;                            \
        T acc = 0;                                                                            \
        for (int k = 0; k < t.n; k++)                                                         \
          if (t.off[k] >= 0) acc += in[t.off[k]] * t.w[k];                                    \
        ((T*)j->out)[(n * j->c + c) * j->oplane + p] = acc;                                   \
      }                                                                                       \
    }                                                                                         \
  }                                                                                           \
                                                                                              \
  /* grad_input: items are (n, c) planes */                                                   \
  static void gs_bwd_input_##SUF(const gs_job_t* j, int64_t item) {                           \
    int64_t n = item / j->c;                                                                  \
    T* gin = (T*)j->gin + item * j->plane;                                                    \
    const T* gout = (const T*)j->gout + item * j->oplane;                                     \
    taps_##SUF t;                                                                             \
    for (int64_t p = 0; p < j->oplane; p++) {                                                 \
      gs_point_##SUF(j, n, p, &t);                                                            \
      for (int k = 0; k < t.n; k++)                                                           \
        if (t.off[k] >= 0) gin[t.off[k]] += t.w[k] * gout[p];                                 \
    }                                                                                         \
  }                                                                                           \
                                                                                              \
  /* grad_grid: items are (n, output row) */                                                  \
  static void gs_bwd_grid_##SUF(const gs_job_t* j, int64_t item) {                            \
    int64_t n = item / j->orows;                                                              \
    taps_##SUF t;                                                                             \
    for (int64_t p = (item % j->orows) * j->osz[0], e = p + j->osz[0]; p < e; p++) {          \
      gs_point_##SUF(j, n, p, &t);                                                            \
      T acc[3] = {0, 0, 0};                                                                   \
      for (int64_t c = 0; c < j->c; c++) {                                                    \
        const T* in = (const T*)j->in + (n * j->c + c) * j->plane;                            \
        T go = ((const T*)j->gout)[(n * j->c + c) * j->oplane + p];                           \
        for (int k = 0; k < t.n; k++)                                                         \
          if (t.off[k] >= 0)                                                                  \
            for (int d = 0; d < j->nd; d++) acc[d] += in[t.off[k]] * t.wg[d][k] * go;         \
      }                                                                                       \
      T* gg = (T*)j->ggrid + (n * j->oplane + p) * j->nd;                                     \
      for (int d = 0; d < j->nd; d++) gg[d] = t.m[d] * acc[d];                                \
    }                                                                                         \
  }

/* derivatives of the cubic weights with respect to t, as PyTorch's
 * get_cubic_coefficients_grad */
#define CUBIC_GRAD(T, c, t)                                                  \
  do {                                                                       \
    const T A_ = (T)-0.75;                                                   \
    T x_ = -1 - (t);                                                         \
    (c)[0] = (-3 * A_ * x_ - 10 * A_) * x_ - 8 * A_;                         \
    x_ = -(t);                                                               \
    (c)[1] = (-3 * (A_ + 2) * x_ - 2 * (A_ + 3)) * x_;                       \
    x_ = 1 - (t);                                                            \
    (c)[2] = (3 * (A_ + 2) * x_ - 2 * (A_ + 3)) * x_;                        \
    x_ = 2 - (t);                                                            \
    (c)[3] = (3 * A_ * x_ - 10 * A_) * x_ + 8 * A_;                          \
  } while (0)

DEFINE_GRID_SAMPLER(f32, float, floorf, fabsf, fmodf, nearbyintf)
DEFINE_GRID_SAMPLER(f64, double, floor, fabs, fmod, nearbyint)

typedef enum { GS_FWD, GS_BWD_INPUT, GS_BWD_GRID } gs_pass_t;

typedef struct {
  const gs_job_t* j;
  gs_pass_t pass;
} gs_run_t;

static void gs_range(void* ctx, int64_t begin, int64_t end) {
  const gs_run_t* r = ctx;
  bool f32 = r->j->dt == TPU_F32;
  for (int64_t i = begin; i < end; i++) {
    if (r->pass == GS_FWD) f32 ? gs_fwd_f32(r->j, i) : gs_fwd_f64(r->j, i);
    else if (r->pass == GS_BWD_INPUT) f32 ? gs_bwd_input_f32(r->j, i) : gs_bwd_input_f64(r->j, i);
    else f32 ? gs_bwd_grid_f32(r->j, i) : gs_bwd_grid_f64(r->j, i);
  }
}

/* Checks input (N, C, [D,] H, W), grid (N, [Do,] Ho, Wo, nd) and the
 * sampled shape (N, C, [Do,] Ho, Wo) of `sampled`; fills the job's sizes
 * and options. */
static tpu_status_t gs_init(const char* op, const tpu_call_t* call, int arg, int nd,
                            const tpu_tensor_t* in, const tpu_tensor_t* grid,
                            const tpu_tensor_t* sampled, gs_job_t* j) {
  memset(j, 0, sizeof *j);
  int rank = nd + 2;
  if (!in || !grid || !sampled || in->ndim != rank || grid->ndim != rank || sampled->ndim != rank)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected %d-D input, grid and output", op, rank);
  j->nd = nd;
  j->n = in->sizes[0];
  j->c = in->sizes[1];
  j->plane = j->oplane = 1;
  bool ok = grid->sizes[0] == j->n && grid->sizes[rank - 1] == nd && sampled->sizes[0] == j->n &&
            sampled->sizes[1] == j->c;
  for (int d = 0; d < nd; d++) {
    j->sz[d] = in->sizes[rank - 1 - d];
    j->osz[d] = grid->sizes[nd - d];
    ok = ok && sampled->sizes[rank - 1 - d] == j->osz[d];
    j->plane *= j->sz[d];
    j->oplane *= j->osz[d];
  }
  if (!ok)
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: grid must be (N, *out_spatial, %d) and the output (N, C, *out_spatial) "
                   "for an input of batch N (input batch %lld, grid batch %lld)",
                   op, nd, (long long)j->n, (long long)grid->sizes[0]);
  j->orows = j->osz[0] ? j->oplane / j->osz[0] : 0;
  if (!tpu_dtype_is_float(in->dtype) || grid->dtype != in->dtype || sampled->dtype != in->dtype)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected input and grid of one floating dtype", op);
  j->mode = (int)tpu_arg_i64(call, arg, 0);
  j->padding = (int)tpu_arg_i64(call, arg + 1, 0);
  j->align = tpu_arg_bool(call, arg + 2, false);
  if (j->mode < GS_BILINEAR || j->mode > GS_BICUBIC || j->padding < GS_ZEROS ||
      j->padding > GS_REFLECTION)
    return TPU_ERR(INVALID_ARGUMENT, "%s: invalid interpolation mode %d or padding mode %d", op,
                   j->mode, j->padding);
  if (j->mode == GS_BICUBIC && nd != 2)
    return TPU_ERR(INVALID_ARGUMENT, "%s: bicubic interpolation only supports 4-D input", op);
  j->dt = in->dtype == TPU_F64 ? TPU_F64 : TPU_F32;
  return TPU_OK;
}

/* grid_sampler_{2,3}d(input, grid, interpolation_mode, padding_mode,
 * align_corners) -> out */
static tpu_status_t gs_forward(const char* op, const tpu_call_t* call, int nd) {
  const tpu_tensor_t* in = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* grid = tpu_arg_tensor(call, 1);
  gs_job_t j;
  TPU_RETURN_IF_ERROR(gs_init(op, call, 2, nd, in, grid, &call->outs[0], &j));
  sp_stage_t si, sg, so;
  TPU_RETURN_IF_ERROR(sp_stage_in(op, in, j.dt, &si));
  tpu_status_t st = sp_stage_in(op, grid, j.dt, &sg);
  if (!st) {
    st = sp_stage_out(op, &call->outs[0], j.dt, false, &so);
    if (!st) {
      j.in = si.data;
      j.grid = sg.data;
      j.out = so.data;
      gs_run_t r = {&j, GS_FWD};
      sp_parallel(j.n * j.orows, j.osz[0] * j.c * (1 << nd), gs_range, &r);
      st = sp_stage_finish(&so, st);
    }
    sp_stage_free(&sg);
  }
  sp_stage_free(&si);
  return st;
}

/* grid_sampler_{2,3}d_backward(grad_output, input, grid, interpolation_mode,
 * padding_mode, align_corners, output_mask) -> (grad_input, grad_grid) */
static tpu_status_t gs_backward(const char* op, const tpu_call_t* call, int nd) {
  const tpu_tensor_t* gout = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* in = tpu_arg_tensor(call, 1);
  const tpu_tensor_t* grid = tpu_arg_tensor(call, 2);
  gs_job_t j;
  TPU_RETURN_IF_ERROR(gs_init(op, call, 3, nd, in, grid, gout, &j));
  bool want_in = sp_out_wanted(call, 6, 0), want_grid = sp_out_wanted(call, 6, 1);
  if (want_in && tpu_tensor_numel(&call->outs[0]) != tpu_tensor_numel(in))
    return TPU_ERR(INVALID_ARGUMENT, "%s: grad_input must have the input's shape", op);
  if (want_grid && tpu_tensor_numel(&call->outs[1]) != tpu_tensor_numel(grid))
    return TPU_ERR(INVALID_ARGUMENT, "%s: grad_grid must have the grid's shape", op);
  sp_stage_t si = {0}, sg, sgo, out;
  TPU_RETURN_IF_ERROR(sp_stage_in(op, grid, j.dt, &sg));
  tpu_status_t st = sp_stage_in(op, gout, j.dt, &sgo);
  if (!st && want_grid) st = sp_stage_in(op, in, j.dt, &si);
  j.grid = sg.data;
  j.gout = st ? NULL : sgo.data;
  j.in = si.data;
  if (!st && want_in) {
    st = sp_stage_out(op, &call->outs[0], j.dt, true, &out);
    if (!st) {
      j.gin = out.data;
      gs_run_t r = {&j, GS_BWD_INPUT};
      sp_parallel(j.n * j.c, j.oplane * (1 << nd), gs_range, &r);
      st = sp_stage_finish(&out, st);
    }
  }
  if (!st && want_grid) {
    st = sp_stage_out(op, &call->outs[1], j.dt, false, &out);
    if (!st) {
      j.ggrid = out.data;
      gs_run_t r = {&j, GS_BWD_GRID};
      sp_parallel(j.n * j.orows, j.osz[0] * j.c * (1 << nd), gs_range, &r);
      st = sp_stage_finish(&out, st);
    }
  }
  sp_stage_free(&sg);
  sp_stage_free(&sgo);
  sp_stage_free(&si);
  return st;
}

tpu_status_t tpu_k_grid_sampler_2d(const tpu_call_t* call) {
  return gs_forward("grid_sampler_2d", call, 2);
}
tpu_status_t tpu_k_grid_sampler_2d_backward(const tpu_call_t* call) {
  return gs_backward("grid_sampler_2d_backward", call, 2);
}
tpu_status_t tpu_k_grid_sampler_3d(const tpu_call_t* call) {
  return gs_forward("grid_sampler_3d", call, 3);
}
tpu_status_t tpu_k_grid_sampler_3d_backward(const tpu_call_t* call) {
  return gs_backward("grid_sampler_3d_backward", call, 3);
}

/* ---- channel_shuffle ---- */

/* channel_shuffle(self, groups): out[:, i * g + j] = self[:, j * (C / g) + i] */
tpu_status_t tpu_k_channel_shuffle(const tpu_call_t* call) {
  const char* op = "channel_shuffle";
  const tpu_tensor_t* x = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* y = &call->outs[0];
  int64_t g = tpu_arg_i64(call, 1, 1);
  if (!x || x->ndim < 3 || x->ndim >= TPU_MAX_DIMS || y->ndim != x->ndim)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected an input of at least 3 dims", op);
  int64_t c = x->sizes[1];
  if (g <= 0 || c % g != 0)
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: number of channels must be divisible by groups, got %lld channels and "
                   "%lld groups",
                   op, (long long)c, (long long)g);
  for (int d = 0; d < x->ndim; d++)
    if (y->sizes[d] != x->sizes[d])
      return TPU_ERR(INVALID_ARGUMENT, "%s: output must have the input's shape", op);
  /* both as (N, C / g, g, rest...) */
  tpu_tensor_t src = *x, dst = *y;
  src.ndim = dst.ndim = x->ndim + 1;
  for (int d = x->ndim; d >= 3; d--) {
    src.sizes[d] = dst.sizes[d] = x->sizes[d - 1];
    src.strides[d] = x->strides[d - 1];
    dst.strides[d] = y->strides[d - 1];
  }
  src.sizes[1] = dst.sizes[1] = c / g;
  src.sizes[2] = dst.sizes[2] = g;
  src.strides[1] = x->strides[1];
  src.strides[2] = (c / g) * x->strides[1];
  dst.strides[1] = g * y->strides[1];
  dst.strides[2] = y->strides[1];
  return tpu_copy_strided(&dst, &src);
}
