/* Neural-network kernels: softmax and log_softmax with their backward,
 * nll_loss (and nll_loss2d), layer / group / batch norm with their backward,
 * embedding backward and dropout backward.
 *
 * Most kernels work on rows: the elements one reduction runs over (the
 * softmax dim, the normalized dims, a channel...). A row view splits a
 * tensor's dims into lane dims (which row) and row dims (position in the
 * row), each with its own strides, so any layout works. Rows are gathered
 * into double buffers, computed in double and stored once in the output
 * dtype. Lanes run in parallel; reductions across lanes (weight and bias
 * gradients) add per-block partial sums in a fixed order, so results do not
 * depend on the thread split.
 */
#include <stdlib.h>

#include "kernels.h"
#include "matmul.h"
#include "vecmath.h"

/* ---- row views ---- */
typedef struct {
  char* data;
  tpu_dtype_t dt;
  int64_t esz;
  int nl, nr; /* lane dims, row dims (size-1 row dims dropped, mergeable ones merged) */
  int64_t lsize[TPU_MAX_DIMS + 1], lstride[TPU_MAX_DIMS + 1];
  int64_t rsize[TPU_MAX_DIMS + 1], rstride[TPU_MAX_DIMS + 1];
  int64_t lanes, len; /* number of rows, elements per row */
} rows_t;

static void rows_init(rows_t* v, const tpu_tensor_t* t) {
  memset(v, 0, sizeof *v);
  v->data = t->data;
  v->dt = t->dtype;
  v->esz = (int64_t)tpu_dtype_size(t->dtype);
  v->lanes = v->len = 1;
}

/* Appends a dim to a list kept outermost first: size-1 dims vanish, and one
 * that continues the last in memory merges with it (a lane's address then
 * takes fewer divisions, a row fewer runs). */
static void dims_push(int64_t* sizes, int64_t* strides, int* n, int64_t size, int64_t stride) {
  if (size == 1) return;
  if (*n > 0 && strides[*n - 1] == size * stride) {
    sizes[*n - 1] *= size;
    strides[*n - 1] = stride;
    return;
  }
  sizes[*n] = size;
  strides[(*n)++] = stride;
}

static void rows_add_lane(rows_t* v, int64_t size, int64_t stride) {
  v->lanes *= size;
  dims_push(v->lsize, v->lstride, &v->nl, size, stride);
}

static void rows_add_row(rows_t* v, int64_t size, int64_t stride) {
  v->len *= size;
  dims_push(v->rsize, v->rstride, &v->nr, size, stride);
}

/* Lanes: every dim but `dim`; row: dim (a 0-d tensor is one row of one). */
static void rows_along(rows_t* v, const tpu_tensor_t* t, int dim) {
  rows_init(v, t);
  for (int d = 0; d < t->ndim; d++)
    if (d != dim) rows_add_lane(v, t->sizes[d], t->strides[d]);
  if (dim < t->ndim) rows_add_row(v, t->sizes[dim], t->strides[dim]);
}

/* Lanes: dims [0, axis); row: dims [axis, ndim). axis = ndim gives one
 * element per lane, axis = 0 the whole tensor as one row. */
static void rows_split(rows_t* v, const tpu_tensor_t* t, int axis) {
  rows_init(v, t);
  for (int d = 0; d < t->ndim; d++) {
    if (d < axis) rows_add_lane(v, t->sizes[d], t->strides[d]);
    else rows_add_row(v, t->sizes[d], t->strides[d]);
  }
}

static char* rows_lane_ptr(const rows_t* v, int64_t lane) {
  int64_t off = 0;
  for (int d = v->nl - 1; d >= 0; d--) {
    off += (lane % v->lsize[d]) * v->lstride[d];
    lane /= v->lsize[d];
  }
  return v->data + off * v->esz;
}

/* Element i of a lane of a view with at most one row dim. */
static char* rows_elem_ptr(const rows_t* v, int64_t lane, int64_t i) {
  return rows_lane_ptr(v, lane) + i * (v->nr ? v->rstride[0] : 0) * v->esz;
}

typedef enum { IO_LOAD, IO_STORE, IO_LOAD_I64 } io_t;

/* Moves a lane's row between the tensor and buf (double, or int64 for
 * IO_LOAD_I64), one strided run of the innermost row dim at a time. */
static void rows_io(const rows_t* v, int64_t lane, void* buf, io_t io) {
  if (v->len == 0) return;
  char* base = rows_lane_ptr(v, lane);
  int64_t n = v->nr ? v->rsize[v->nr - 1] : 1, st = v->nr ? v->rstride[v->nr - 1] : 1;
  for (int64_t o = 0; o < v->len / n; o++) {
    int64_t off = 0, rem = o;
    for (int d = v->nr - 2; d >= 0; d--) {
      off += (rem % v->rsize[d]) * v->rstride[d];
      rem /= v->rsize[d];
    }
    char* p = base + off * v->esz;
    if (io == IO_LOAD) tpu_run_load_f64((double*)buf + o * n, 1, p, st, v->dt, n);
    else if (io == IO_STORE) tpu_run_store_f64(p, st, v->dt, (const double*)buf + o * n, n);
    else tpu_run_load_i64((int64_t*)buf + o * n, 1, p, st, v->dt, n);
  }
}

static void row_load(const rows_t* v, int64_t lane, double* buf) { rows_io(v, lane, buf, IO_LOAD); }
static void row_store(const rows_t* v, int64_t lane, const double* buf) {
  rows_io(v, lane, (void*)buf, IO_STORE);
}

/* Lane blocks: when rows are strided but neighbouring lanes are adjacent in
 * memory (softmax over a dim other than the last), rows are moved LANE_BLOCK
 * lanes at a time, element by element across the lanes, so each cache line
 * and page is visited once per block instead of once per lane. */
enum { LANE_BLOCK = 16 };

static bool rows_blockable(const rows_t* v) {
  return v->nr > 0 && v->rstride[v->nr - 1] != 1 && v->nl > 0 && v->lstride[v->nl - 1] == 1;
}

/* How many lanes from `lane` (before `end`) form one block: in each of the
 * nv views the block moves through (input, output, ...) they must share all
 * but the innermost lane index, for rows_io_block steps from a block's first
 * lane by that view's innermost lane stride. The views merge their lane dims
 * by their own strides, so their innermost lane dims can differ in size (a
 * transposed input against a contiguous output): each view bounds the
 * block. */
static int64_t block_lanes(const rows_t* const* vs, int nv, int64_t lane, int64_t end,
                           bool blocked) {
  if (!blocked) return 1;
  int64_t n = end - lane < LANE_BLOCK ? end - lane : LANE_BLOCK;
  for (int k = 0; k < nv; k++) {
    const rows_t* v = vs[k];
    if (v->nl == 0) return 1; /* a single lane */
    int64_t inner = v->lsize[v->nl - 1], left = inner - lane % inner;
    if (left < n) n = left;
  }
  return n;
}

/* Moves the rows of lanes [lane, lane + nl) between the tensor and buf
 * (row k at buf + k * len); nl > 1 only for lanes that block_lanes grouped
 * for this view. */
static void rows_io_block(const rows_t* v, int64_t lane, int64_t nl, double* buf, io_t io) {
  if (nl == 1) {
    rows_io(v, lane, buf, io);
    return;
  }
  char* base = rows_lane_ptr(v, lane);
  int64_t ls = v->lstride[v->nl - 1];
  double tmp[LANE_BLOCK];
  for (int64_t i = 0; i < v->len; i++) {
    int64_t off = 0, rem = i;
    for (int d = v->nr - 1; d >= 0; d--) {
      off += (rem % v->rsize[d]) * v->rstride[d];
      rem /= v->rsize[d];
    }
    char* p = base + off * v->esz;
    if (io == IO_LOAD) {
      tpu_run_load_f64(buf + i, v->len, p, ls, v->dt, nl);
    } else {
      for (int64_t k = 0; k < nl; k++) tmp[k] = buf[k * v->len + i];
      tpu_run_store_f64(p, ls, v->dt, tmp, nl);
    }
  }
}

/* ---- shared helpers ---- */
static tpu_status_t oom_error(const char* op) {
  return TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory for scratch buffers", op);
}

/* Scratch of n doubles for a parallel range; NULL (with *oom set) on
 * failure. */
static double* scratch(int64_t n, _Atomic int* oom) {
  double* p = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
  if (!p) *oom = 1;
  return p;
}

/* Runs fn over n items of about `cost` elements each; small work inline. */
static tpu_status_t run_items(const char* op, int64_t n, int64_t cost,
                              void (*fn)(void*, int64_t, int64_t), void* ctx, _Atomic int* oom) {
  int64_t grain = 32768 / (cost > 0 ? cost : 1);
  tpu_parallel_for(n, grain > 0 ? grain : 1, fn, ctx);
  return *oom ? oom_error(op) : TPU_OK;
}

static tpu_status_t check_tensor(const char* op, const char* what, const tpu_tensor_t* t) {
  if (!t) return TPU_ERR(INVALID_ARGUMENT, "%s: %s must be a tensor", op, what);
  if (!tpu_dtype_is_supported(t->dtype))
    return TPU_ERR(UNIMPLEMENTED, "%s: dtype %d of %s is not supported on tpu", op, (int)t->dtype,
                   what);
  return TPU_OK;
}

static tpu_status_t check_float(const char* op, const char* what, const tpu_tensor_t* t) {
  TPU_RETURN_IF_ERROR(check_tensor(op, what, t));
  if (!tpu_dtype_is_float(t->dtype))
    return TPU_ERR(UNIMPLEMENTED, "%s: not implemented for %s (%s)", op,
                   tpu_dtype_name(t->dtype), what);
  return TPU_OK;
}

static tpu_status_t check_same_shape(const char* op, const char* what, const tpu_tensor_t* t,
                                     const tpu_tensor_t* ref) {
  TPU_RETURN_IF_ERROR(check_tensor(op, what, t));
  bool same = t->ndim == ref->ndim;
  for (int d = 0; same && d < t->ndim; d++) same = t->sizes[d] == ref->sizes[d];
  if (!same)
    return TPU_ERR(INVALID_ARGUMENT, "%s: %s has %d dims and %lld elements, expected the input's shape",
                   op, what, (int)t->ndim, (long long)tpu_tensor_numel(t));
  return TPU_OK;
}

static tpu_status_t check_numel(const char* op, const char* what, const tpu_tensor_t* t,
                                int64_t n) {
  TPU_RETURN_IF_ERROR(check_tensor(op, what, t));
  if (tpu_tensor_numel(t) != n)
    return TPU_ERR(INVALID_ARGUMENT, "%s: %s has %lld elements, expected %lld", op, what,
                   (long long)tpu_tensor_numel(t), (long long)n);
  return TPU_OK;
}

static tpu_status_t wrap_dim(const char* op, int64_t dim, int ndim, int* out) {
  int64_t n = ndim > 0 ? ndim : 1;
  if (dim < -n || dim >= n)
    return TPU_ERR(OUT_OF_RANGE,
                   "%s: dimension out of range (expected to be in range of [%lld, %lld], but got %lld)",
                   op, (long long)-n, (long long)(n - 1), (long long)dim);
  *out = (int)(dim < 0 ? dim + n : dim);
  return TPU_OK;
}

/* An optional tensor argument: NULL for None. */
static const tpu_tensor_t* opt_tensor(const tpu_call_t* call, int i) {
  return tpu_arg_is_none(call, i) ? NULL : tpu_arg_tensor(call, i);
}

/* Loads all n elements of t (row-major) as doubles into a new array; *out
 * is NULL when t is. */
static tpu_status_t load_all(const char* op, const char* what, const tpu_tensor_t* t, int64_t n,
                             double** out) {
  *out = NULL;
  if (!t) return TPU_OK;
  TPU_RETURN_IF_ERROR(check_numel(op, what, t, n));
  *out = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
  if (!*out) return oom_error(op);
  rows_t v;
  rows_split(&v, t, 0);
  row_load(&v, 0, *out);
  return TPU_OK;
}

/* Stores n doubles into all elements of t (row-major); t holds n elements. */
static void store_all(const tpu_tensor_t* t, const double* v) {
  rows_t r;
  rows_split(&r, t, 0);
  row_store(&r, 0, v);
}

/* Whether output k of a call with an output_mask argument at `mask_arg` is
 * wanted: masked in and not an undefined (dtype NONE) output. */
static bool out_wanted(const tpu_call_t* call, int mask_arg, int k) {
  if (k >= call->nouts || call->outs[k].dtype == TPU_DTYPE_NONE) return false;
  const tpu_arg_t* m = mask_arg < call->nargs ? &call->args[mask_arg] : NULL;
  return !(m && m->kind == TPU_ARG_BOOLLIST && k < m->n && !m->v.blist[k]);
}

static tpu_status_t fill_zero(const tpu_tensor_t* t) {
  tpu_tensor_t z;
  memset(&z, 0, sizeof z);
  z.dtype = TPU_F64;
  z.data = z.inline_value;
  return tpu_copy_strided(t, &z);
}


/* ---- single-precision rows (vectorized) ----
 * Rows that are contiguous in float32, bfloat16 or float16 skip the double
 * buffers: 16-bit rows convert to float32 once, softmax and layer norm run
 * loops the compiler vectorizes (compiled for the baseline ISA and AVX2, see
 * vecmath.h), and sums accumulate in double over eight lanes. Results stay
 * within a few float32 ulps of the double path. */
static bool rows_flat(const rows_t* v) {
  return v->nr == 0 || (v->nr == 1 && v->rstride[0] == 1);
}

static bool f32_storage(tpu_dtype_t dt) {
  return dt == TPU_F32 || dt == TPU_BF16 || dt == TPU_F16;
}

/* Inlined into the per-ISA entry points below. Their own early
 * optimization must already allow selects for conditionals (no trapping
 * math), else the loops stay scalar after inlining. */
#if defined(__GNUC__) && !defined(__clang__)
#define TPU_VR_INLINE static inline __attribute__((always_inline, optimize(TPU_VEC_OPTS)))
#else
#define TPU_VR_INLINE TPU_VM_INLINE
#endif

/* avx2 is a constant of the caller: true only in its TPU_VEC_AVX2 copy */
TPU_VR_INLINE void vrow_to_f32(float* dst, const void* src, tpu_dtype_t dt, int64_t n, bool avx2) {
#ifdef TPU_HAVE_AVX2_BUILD
  if (avx2 && dt == TPU_BF16) {
    tpu_vm_bf16_row_load_avx2(dst, src, n);
    return;
  }
#endif
  (void)avx2;
  if (dt == TPU_BF16) {
    const uint16_t* h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = tpu_vm_bf16_to_f32(h[i]);
  } else if (dt == TPU_F16) {
    const uint16_t* h = src;
    for (int64_t i = 0; i < n; i++) dst[i] = tpu_vm_f16_to_f32(h[i]);
  } else {
    memcpy(dst, src, sizeof(float) * (size_t)n);
  }
}

TPU_VR_INLINE void vrow_from_f32(void* dst, tpu_dtype_t dt, const float* src, int64_t n,
                                  bool avx2) {
#ifdef TPU_HAVE_AVX2_BUILD
  if (avx2 && dt == TPU_BF16) {
    tpu_vm_bf16_row_store_avx2(dst, src, n);
    return;
  }
#endif
  (void)avx2;
  if (dt == TPU_BF16) {
    uint16_t* h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = tpu_vm_f32_to_bf16(src[i]);
  } else if (dt == TPU_F16) {
    uint16_t* h = dst;
    for (int64_t i = 0; i < n; i++) h[i] = tpu_vm_f32_to_f16(src[i]);
  } else if (dst != src) {
    memcpy(dst, src, sizeof(float) * (size_t)n);
  }
}

/* Float32 row kernels shared with fused kernels (one copy per ISA of each
 * caller, like the helpers above) */
#define TPU_FR_INLINE TPU_VR_INLINE
#include "fuse_rows.h"

/* A flat row body's two ISA copies and NAME_run(job, begin, end, floats),
 * which gives the body a scratch of `floats` floats and runs the copy built
 * for this CPU (job->oom set when the scratch cannot be had). */
#ifdef TPU_HAVE_AVX2_BUILD
#define FLAT_AVX2_COPY(NAME, JOB_T, BODY)                                                   \
  static TPU_VEC_AVX2 void NAME##_a(JOB_T* job, int64_t b, int64_t e, float* buf) {        \
    BODY(job, b, e, buf, true);                                                             \
  }
#define FLAT_AVX2_CALL(NAME) \
  if (tpu_host_isa() == TPU_ISA_AVX2) NAME##_a(job, begin, end, buf); else
#else
#define FLAT_AVX2_COPY(NAME, JOB_T, BODY)
#define FLAT_AVX2_CALL(NAME)
#endif
#define DEFINE_FLAT_RUN(NAME, JOB_T, BODY)                                                  \
  static TPU_VEC_PORTABLE void NAME##_p(JOB_T* job, int64_t b, int64_t e, float* buf) {    \
    BODY(job, b, e, buf, false);                                                            \
  }                                                                                         \
  FLAT_AVX2_COPY(NAME, JOB_T, BODY)                                                         \
  static void NAME##_run(JOB_T* job, int64_t begin, int64_t end, int64_t floats) {          \
    float* buf = malloc(sizeof(float) * (size_t)(floats > 0 ? floats : 1));                 \
    if (!buf) {                                                                             \
      job->oom = 1;                                                                         \
      return;                                                                               \
    }                                                                                       \
    FLAT_AVX2_CALL(NAME) NAME##_p(job, begin, end, buf);                                    \
    free(buf);                                                                              \
  }

/* ---- softmax ---- */
typedef struct {
  rows_t a, b, out; /* forward: a = input; backward: a = grad, b = output */
  bool log;
  int round16;      /* log_softmax's sum rounded as tpu_fr_lse_sum does */
  bool seq_float;   /* log_softmax's sum added in float in row order (CPU's
                     * kernel for a dim other than the last, single precision) */
  bool single;      /* float32/16 output: single-precision exp is accurate enough */
  bool blocked;     /* move rows in lane blocks */
  bool flat;        /* forward over contiguous single-precision rows */
  _Atomic int oom;
} softmax_job_t;

/* Forward over lanes [begin, end) of contiguous rows; buf holds one row. */
TPU_VR_INLINE void softmax_flat_body(const softmax_job_t* job, int64_t begin, int64_t end,
                                     float* buf, bool avx2) {
  int64_t n = job->a.len;
  float* tmp = buf + n;
  for (int64_t lane = begin; lane < end; lane++) {
    const char* src = rows_lane_ptr(&job->a, lane);
    char* dst = rows_lane_ptr(&job->out, lane);
    const float* x = (const float*)src;
    if (job->a.dt != TPU_F32) {
      vrow_to_f32(buf, src, job->a.dt, n, avx2);
      x = buf;
    }
    /* y may be the input row itself (in-place softmax); tmp never is */
    float* y = job->out.dt == TPU_F32 ? (float*)dst : tmp;
    tpu_fr_softmax_r(x, y, tmp, n, job->log, job->round16);
    vrow_from_f32(dst, job->out.dt, y, n, avx2);
  }
}
DEFINE_FLAT_RUN(softmax_flat, softmax_job_t, softmax_flat_body)

static inline double sm_exp(const softmax_job_t* job, double v) {
  return job->single ? (double)expf((float)v) : exp(v);
}

static void softmax_row(const softmax_job_t* job, double* x, int64_t n) {
  double mx = -INFINITY, sum = 0;
  for (int64_t i = 0; i < n; i++)
    if (x[i] > mx) mx = x[i];
  if (job->log && job->seq_float) {
    float fs = 0;
    for (int64_t i = 0; i < n; i++) fs += (float)sm_exp(job, x[i] - mx);
    sum = fs;
  } else if (job->log) {
    for (int64_t i = 0; i < n; i++) sum += sm_exp(job, x[i] - mx);
  }
  if (job->log) {
    /* single precision: the sum rounded like the flat rows' (fuse_rows.h) */
    double lse = log(job->single ? tpu_fr_lse_sum(sum, job->round16) : sum);
    for (int64_t i = 0; i < n; i++) x[i] = (x[i] - mx) - lse;
  } else {
    for (int64_t i = 0; i < n; i++) {
      x[i] = sm_exp(job, x[i] - mx);
      sum += x[i];
    }
    for (int64_t i = 0; i < n; i++) x[i] /= sum;
  }
}

static void softmax_range(void* ctx, int64_t begin, int64_t end) {
  softmax_job_t* job = ctx;
  int64_t n = job->a.len;
  if (job->flat) {
    softmax_flat_run(job, begin, end, 2 * n);
    return;
  }
  double* x = scratch(LANE_BLOCK * n, &job->oom);
  if (!x) return;
  for (int64_t lane = begin, nl; lane < end; lane += nl) {
    nl = block_lanes((const rows_t* const[]){&job->a, &job->out}, 2, lane, end, job->blocked);
    rows_io_block(&job->a, lane, nl, x, IO_LOAD);
    for (int64_t k = 0; k < nl; k++) softmax_row(job, x + k * n, n);
    rows_io_block(&job->out, lane, nl, x, IO_STORE);
  }
  free(x);
}

/* Backward over lanes [begin, end) of contiguous single-precision rows
 * (tpu_fr_softmax_backward); buf holds two rows. */
TPU_VR_INLINE void softmax_backward_flat_body(const softmax_job_t* job, int64_t begin,
                                              int64_t end, float* buf, bool avx2) {
  const int64_t n = job->a.len;
  for (int64_t lane = begin; lane < end; lane++) {
    const char* gs = rows_lane_ptr(&job->a, lane);
    const char* ys = rows_lane_ptr(&job->b, lane);
    char* dst = rows_lane_ptr(&job->out, lane);
    const float* g = (const float*)gs;
    const float* y = (const float*)ys;
    if (job->a.dt != TPU_F32) {
      vrow_to_f32(buf, gs, job->a.dt, n, avx2);
      g = buf;
    }
    if (job->b.dt != TPU_F32) {
      vrow_to_f32(buf + n, ys, job->b.dt, n, avx2);
      y = buf + n;
    }
    /* elementwise after the sum: the result may overwrite g's row */
    float* o = job->out.dt == TPU_F32 ? (float*)dst : buf;
    tpu_fr_softmax_backward(g, y, o, n, job->log);
    vrow_from_f32(dst, job->out.dt, o, n, avx2);
  }
}
DEFINE_FLAT_RUN(softmax_backward_flat, softmax_job_t, softmax_backward_flat_body)

/* softmax: gi = y * (g - sum(g * y)); log_softmax: gi = g - exp(y) * sum(g) */
static void softmax_backward_row(const softmax_job_t* job, double* g, const double* y, int64_t n) {
  double s = 0;
  if (job->log) {
    for (int64_t i = 0; i < n; i++) s += g[i];
    for (int64_t i = 0; i < n; i++) g[i] -= sm_exp(job, y[i]) * s;
  } else {
    for (int64_t i = 0; i < n; i++) s += g[i] * y[i];
    for (int64_t i = 0; i < n; i++) g[i] = y[i] * (g[i] - s);
  }
}

static void softmax_backward_range(void* ctx, int64_t begin, int64_t end) {
  softmax_job_t* job = ctx;
  int64_t n = job->a.len;
  if (job->flat) {
    softmax_backward_flat_run(job, begin, end, 2 * n);
    return;
  }
  double* g = scratch(2 * LANE_BLOCK * n, &job->oom);
  if (!g) return;
  double* y = g + LANE_BLOCK * n;
  for (int64_t lane = begin, nl; lane < end; lane += nl) {
    nl = block_lanes((const rows_t* const[]){&job->a, &job->b, &job->out}, 3, lane, end,
                     job->blocked);
    rows_io_block(&job->a, lane, nl, g, IO_LOAD);
    rows_io_block(&job->b, lane, nl, y, IO_LOAD);
    for (int64_t k = 0; k < nl; k++) softmax_backward_row(job, g + k * n, y + k * n, n);
    rows_io_block(&job->out, lane, nl, g, IO_STORE);
  }
  free(g);
}

/* _softmax / _log_softmax(self, dim, half_to_float) */
static tpu_status_t softmax_forward(const tpu_call_t* call, bool log) {
  const char* op = log ? "_log_softmax" : "_softmax";
  const tpu_tensor_t* x = tpu_arg_tensor(call, 0);
  TPU_RETURN_IF_ERROR(check_tensor(op, "self", x));
  TPU_RETURN_IF_ERROR(check_same_shape(op, "out", &call->outs[0], x));
  int dim = 0;
  TPU_RETURN_IF_ERROR(wrap_dim(op, tpu_arg_i64(call, 1, -1), x->ndim, &dim));
  /* nothing to compute; CPU runs no kernel either, so checks no dtype */
  if (tpu_tensor_numel(x) == 0) return TPU_OK;
  TPU_RETURN_IF_ERROR(check_float(op, "self", x));
  softmax_job_t job = {0};
  job.log = log;
  job.single = call->outs[0].dtype != TPU_F64;
  /* CPU's kernel over the last dim keeps a 16-bit output's row sum in that
   * dtype; over other dims in float */
  if (dim == (x->ndim > 0 ? x->ndim - 1 : 0))
    job.round16 = call->outs[0].dtype == TPU_BF16 ? 1 : call->outs[0].dtype == TPU_F16 ? 2 : 0;
  else
    job.seq_float = job.single;
  rows_along(&job.a, x, dim);
  rows_along(&job.out, &call->outs[0], dim);
  job.blocked = rows_blockable(&job.a);
  job.flat = rows_flat(&job.a) && rows_flat(&job.out) && f32_storage(job.a.dt) &&
             f32_storage(job.out.dt);
  return run_items(op, job.a.lanes, job.a.len, softmax_range, &job, &job.oom);
}

/* _softmax_backward_data / _log_softmax_backward_data(grad_output, output,
 * dim, input_dtype) */
static tpu_status_t softmax_backward(const tpu_call_t* call, bool log) {
  const char* op = log ? "_log_softmax_backward_data" : "_softmax_backward_data";
  const tpu_tensor_t* g = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* y = tpu_arg_tensor(call, 1);
  TPU_RETURN_IF_ERROR(check_float(op, "grad_output", g));
  TPU_RETURN_IF_ERROR(check_same_shape(op, "output", y, g));
  TPU_RETURN_IF_ERROR(check_same_shape(op, "grad_input", &call->outs[0], g));
  int dim = 0;
  TPU_RETURN_IF_ERROR(wrap_dim(op, tpu_arg_i64(call, 2, -1), g->ndim, &dim));
  softmax_job_t job = {0};
  job.log = log;
  job.single = call->outs[0].dtype != TPU_F64;
  rows_along(&job.a, g, dim);
  rows_along(&job.b, y, dim);
  rows_along(&job.out, &call->outs[0], dim);
  job.blocked = rows_blockable(&job.a);
  job.flat = rows_flat(&job.a) && rows_flat(&job.b) && rows_flat(&job.out) &&
             f32_storage(job.a.dt) && f32_storage(job.b.dt) && f32_storage(job.out.dt);
  return run_items(op, job.a.lanes, job.a.len, softmax_backward_range, &job, &job.oom);
}

tpu_status_t tpu_k_softmax(const tpu_call_t* call) { return softmax_forward(call, false); }
tpu_status_t tpu_k_log_softmax(const tpu_call_t* call) { return softmax_forward(call, true); }
tpu_status_t tpu_k_softmax_backward(const tpu_call_t* call) { return softmax_backward(call, false); }
tpu_status_t tpu_k_log_softmax_backward(const tpu_call_t* call) {
  return softmax_backward(call, true);
}

/* ---- nll_loss ----
 * self: (C), (N, C) or (N, C, d1, ...) for nll_loss2d; target: the same
 * without the class dim. One lane per target element. */
typedef struct {
  rows_t x;        /* lanes: target positions; row: classes */
  rows_t target;   /* one element per lane */
  int64_t classes;
  double* weight;  /* per class, or NULL */
  int64_t ignore_index;
} nll_t;

enum { REDUCTION_NONE = 0, REDUCTION_MEAN = 1, REDUCTION_SUM = 2 };

static tpu_status_t nll_setup(const char* op, const tpu_tensor_t* self, const tpu_tensor_t* target,
                              const tpu_tensor_t* weight, int64_t reduction, int64_t ignore_index,
                              nll_t* s) {
  memset(s, 0, sizeof *s);
  TPU_RETURN_IF_ERROR(check_float(op, "self", self));
  TPU_RETURN_IF_ERROR(check_tensor(op, "target", target));
  if (self->ndim < 1)
    return TPU_ERR(INVALID_ARGUMENT, "%s: input tensor should be 1D or more, got 0D", op);
  if (tpu_dtype_is_float(target->dtype))
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected target of an integer dtype, got %s", op,
                   tpu_dtype_name(target->dtype));
  if (reduction < REDUCTION_NONE || reduction > REDUCTION_SUM)
    return TPU_ERR(INVALID_ARGUMENT, "%s: invalid reduction %lld", op, (long long)reduction);
  int cdim = self->ndim == 1 ? 0 : 1;
  rows_along(&s->x, self, cdim);
  s->classes = self->sizes[cdim];
  s->ignore_index = ignore_index;
  if (target->ndim != self->ndim - 1)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected a %d-D target for a %d-D input, got %d-D", op,
                   (int)self->ndim - 1, (int)self->ndim, (int)target->ndim);
  TPU_RETURN_IF_ERROR(check_numel(op, "target", target, s->x.lanes));
  rows_split(&s->target, target, target->ndim);
  return load_all(op, "weight", weight, s->classes, &s->weight);
}

/* Class of lane `lane` (-1 when ignored) and its weight; OUT_OF_RANGE for
 * a target that is not a class. */
static tpu_status_t nll_class(const char* op, const nll_t* s, int64_t lane, int64_t* cls,
                              double* w) {
  int64_t t = tpu_load_i64(rows_lane_ptr(&s->target, lane), s->target.dt);
  *cls = -1;
  *w = 0;
  if (t == s->ignore_index) return TPU_OK;
  if (t < 0 || t >= s->classes)
    return TPU_ERR(OUT_OF_RANGE, "%s: target %lld is out of bounds for %lld classes", op,
                   (long long)t, (long long)s->classes);
  *cls = t;
  *w = s->weight ? s->weight[t] : 1.0;
  return TPU_OK;
}

/* nll_loss_forward / nll_loss2d_forward(self, target, weight?, reduction,
 * ignore_index) -> (output, total_weight) */
tpu_status_t tpu_k_nll_loss_forward(const tpu_call_t* call) {
  const char* op = "nll_loss";
  const tpu_tensor_t* self = tpu_arg_tensor(call, 0);
  int64_t reduction = tpu_arg_i64(call, 3, REDUCTION_MEAN);
  nll_t s;
  tpu_status_t st = nll_setup(op, self, tpu_arg_tensor(call, 1), opt_tensor(call, 2), reduction,
                              tpu_arg_i64(call, 4, -100), &s);
  const tpu_tensor_t* out = &call->outs[0];
  rows_t o;
  if (!st && reduction == REDUCTION_NONE) {
    st = check_numel(op, "output", out, s.x.lanes);
    rows_split(&o, out, out->ndim);
  }
  double total = 0, total_weight = 0;
  for (int64_t lane = 0; !st && lane < s.x.lanes; lane++) {
    int64_t cls;
    double w, v = 0;
    st = nll_class(op, &s, lane, &cls, &w);
    if (!st && cls >= 0) v = -w * tpu_load_f64(rows_elem_ptr(&s.x, lane, cls), s.x.dt);
    if (reduction == REDUCTION_NONE) tpu_run_store_f64(rows_lane_ptr(&o, lane), 1, o.dt, &v, 1);
    total += v;
    total_weight += w;
  }
  free(s.weight);
  TPU_RETURN_IF_ERROR(st);
  /* PyTorch reports no total weight for an unreduced batch */
  if (reduction == REDUCTION_NONE && self->ndim > 1) total_weight = 0;
  if (reduction != REDUCTION_NONE) {
    double r = reduction == REDUCTION_MEAN ? total / total_weight : total;
    TPU_RETURN_IF_ERROR(check_numel(op, "output", out, 1));
    store_all(out, &r);
  }
  if (call->nouts > 1) {
    TPU_RETURN_IF_ERROR(check_numel(op, "total_weight", &call->outs[1], 1));
    store_all(&call->outs[1], &total_weight);
  }
  return TPU_OK;
}

/* nll_loss_backward / nll_loss2d_backward(grad_output, self, target,
 * weight?, reduction, ignore_index, total_weight) -> grad_input */
tpu_status_t tpu_k_nll_loss_backward(const tpu_call_t* call) {
  const char* op = "nll_loss_backward";
  const tpu_tensor_t* grad = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* self = tpu_arg_tensor(call, 1);
  const tpu_tensor_t* gi = &call->outs[0];
  int64_t reduction = tpu_arg_i64(call, 4, REDUCTION_MEAN);
  TPU_RETURN_IF_ERROR(check_tensor(op, "grad_output", grad));
  nll_t s;
  TPU_RETURN_IF_ERROR(nll_setup(op, self, tpu_arg_tensor(call, 2), opt_tensor(call, 3), reduction,
                                tpu_arg_i64(call, 5, -100), &s));
  tpu_status_t st = check_same_shape(op, "grad_input", gi, self);
  double g = 0;
  rows_t vg, vgi;
  if (!st && reduction == REDUCTION_NONE) {
    st = check_numel(op, "grad_output", grad, s.x.lanes);
    rows_split(&vg, grad, grad->ndim);
  } else if (!st) {
    st = check_numel(op, "grad_output", grad, 1);
    if (!st) g = tpu_tensor_get_f64(grad, 0);
    const tpu_tensor_t* tw = tpu_arg_tensor(call, 6);
    if (!st && reduction == REDUCTION_MEAN) {
      st = check_numel(op, "total_weight", tw, 1);
      if (!st) g /= tpu_tensor_get_f64(tw, 0);
    }
  }
  if (!st) st = fill_zero(gi);
  rows_along(&vgi, gi, self->ndim == 1 ? 0 : 1);
  for (int64_t lane = 0; !st && lane < s.x.lanes; lane++) {
    int64_t cls;
    double w;
    st = nll_class(op, &s, lane, &cls, &w);
    if (st || cls < 0) continue;
    double gl = reduction == REDUCTION_NONE ? tpu_load_f64(rows_lane_ptr(&vg, lane), vg.dt) : g;
    double v = -w * gl;
    tpu_run_store_f64(rows_elem_ptr(&vgi, lane, cls), 1, vgi.dt, &v, 1);
  }
  free(s.weight);
  return st;
}

/* ---- normalization ----
 * Layer, group and batch norm share one forward and one backward: rows of
 * `len` elements normalized by their own mean and variance (or given
 * statistics), then scaled by per-parameter weight and bias. The parameter
 * of element e of lane l is (l % lane_mod) * lane_mul + e / e_div, or e
 * itself when e_div is 0:
 *   layer norm: lane_mod 1, lane_mul 0, e_div 0     (per element)
 *   group norm: lane_mod G, lane_mul C/G, e_div HxW (per channel)
 *   batch norm: lane_mod C, lane_mul 1, e_div len   (per lane = channel) */
typedef struct {
  int64_t lane_mod, lane_mul, e_div, nparam;
} param_map_t;

/* Calls BODY(p, ps, e0, e1) for runs [e0, e1) of a lane's elements: element
 * i of a run has parameter p + (i - e0) * ps (ps is 1 for per-element
 * parameters, else 0). */
#define FOR_PARAM_RUNS(map, lane, len, BODY)                                 \
  do {                                                                       \
    int64_t p_ = ((lane) % (map).lane_mod) * (map).lane_mul;                 \
    if ((map).e_div == 0) {                                                  \
      BODY(p_, 1, 0, (len));                                                 \
      break;                                                                 \
    }                                                                        \
    for (int64_t e0_ = 0; e0_ < (len); e0_ += (map).e_div, p_++) {           \
      int64_t e1_ = e0_ + (map).e_div < (len) ? e0_ + (map).e_div : (len);   \
      BODY(p_, 0, e0_, e1_);                                                 \
    }                                                                        \
  } while (0)

typedef struct {
  rows_t x, y;
  param_map_t map;
  const double *w, *b; /* per parameter, or NULL */
  float *wf, *bf;      /* float copies of w and b for the flat path */
  double eps;
  bool given_stats;    /* mean/var are inputs (batch norm evaluation) */
  double *mean, *var;  /* per lane: biased variance */
  bool flat;           /* layer norm over contiguous single-precision rows */
  _Atomic int oom;
} norm_job_t;

/* Layer norm over contiguous single-precision rows: statistics in double
 * from float32 values, y = ((x - mean) * rstd) * w + b in float32 (like
 * PyTorch's CPU kernel; w and b as float copies). buf holds one row. */
TPU_VR_INLINE void norm_flat_body(norm_job_t* job, int64_t begin, int64_t end, float* buf,
                                  bool avx2) {
  int64_t n = job->x.len;
  const float *w = job->wf, *b = job->bf;
  for (int64_t lane = begin; lane < end; lane++) {
    const char* src = rows_lane_ptr(&job->x, lane);
    char* dst = rows_lane_ptr(&job->y, lane);
    const float* x = (const float*)src;
    if (job->x.dt != TPU_F32) {
      vrow_to_f32(buf, src, job->x.dt, n, avx2);
      x = buf;
    }
    float mh, ml;
    tpu_fr_row_stats(x, n, &job->mean[lane], &job->var[lane], &mh, &ml);
    float rs = (float)(1 / sqrt(job->var[lane] + job->eps));
    float* y = job->y.dt == TPU_F32 ? (float*)dst : buf;
    tpu_fr_normalize(x, y, n, mh, ml, rs, w, b);
    vrow_from_f32(dst, job->y.dt, y, n, avx2);
  }
}
DEFINE_FLAT_RUN(norm_flat, norm_job_t, norm_flat_body)

static void norm_range(void* ctx, int64_t begin, int64_t end) {
  norm_job_t* job = ctx;
  int64_t n = job->x.len;
  if (job->flat) {
    norm_flat_run(job, begin, end, n);
    return;
  }
  double* x = scratch(n, &job->oom);
  if (!x) return;
  for (int64_t lane = begin; lane < end; lane++) {
    row_load(&job->x, lane, x);
    if (!job->given_stats) {
      double s = 0, ss = 0;
      for (int64_t i = 0; i < n; i++) s += x[i];
      double m = n > 0 ? s / (double)n : 0;
      for (int64_t i = 0; i < n; i++) ss += (x[i] - m) * (x[i] - m);
      job->mean[lane] = m;
      job->var[lane] = n > 0 ? ss / (double)n : NAN;
    }
    double mu = job->mean[lane], rs = 1 / sqrt(job->var[lane] + job->eps);
#define NORM_RUN(p, ps, e0, e1)                                              \
    for (int64_t i = e0, q = p; i < e1; i++, q += ps)                        \
      x[i] = (x[i] - mu) * rs * (job->w ? job->w[q] : 1) + (job->b ? job->b[q] : 0);
    FOR_PARAM_RUNS(job->map, lane, n, NORM_RUN);
#undef NORM_RUN
    row_store(&job->y, lane, x);
  }
  free(x);
}

/* Backward: x_hat = (x - mean) * rstd, g = dy * w;
 *   dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat))   (own statistics)
 *   dx = rstd * g                                          (given statistics)
 *   dw[p] = sum dy * x_hat, db[p] = sum dy over the elements of parameter p.
 * Lanes are cut into fixed blocks; each block sums its dw/db contributions
 * into its own slice of `part`, added in block order afterwards. */
typedef struct {
  rows_t dy, x, dx;
  param_map_t map;
  const double* w;
  const double *mean, *rstd; /* per lane */
  bool given_stats, want_dx, want_dwb;
  int64_t blk, nblk; /* lanes per block, blocks */
  double* part;      /* [nblk][2][nparam] */
  bool flat;         /* layer norm over contiguous single-precision rows */
  float* wf;         /* the flat path's float weight, or NULL */
  _Atomic int oom;
} norm_bwd_job_t;

/* The backward of layer norm over contiguous single-precision rows, for
 * blocks [begin, end): x_hat and g = dy * w in float32, the row sums of g
 * and g * x_hat in tpu_fr_dot's order, dx in float32; a block's weight and
 * bias partials add in float32 over its lanes, then go to double. buf holds
 * six rows. */
TPU_VR_INLINE void norm_bwd_flat_body(norm_bwd_job_t* job, int64_t begin, int64_t end,
                                      float* buf, bool avx2) {
  const int64_t n = job->x.len;
  const float* w = job->wf;
  float *dyb = buf, *xh = buf + n, *g = buf + 2 * n, *gx = buf + 3 * n;
  float *pwf = buf + 4 * n, *pbf = buf + 5 * n;
  for (int64_t b = begin; b < end; b++) {
    if (job->want_dwb) memset(pwf, 0, sizeof(float) * (size_t)(2 * n));
    int64_t lane_end = (b + 1) * job->blk < job->x.lanes ? (b + 1) * job->blk : job->x.lanes;
    for (int64_t lane = b * job->blk; lane < lane_end; lane++) {
      const char* dys = rows_lane_ptr(&job->dy, lane);
      const float* dy = (const float*)dys;
      if (job->dy.dt != TPU_F32) {
        vrow_to_f32(dyb, dys, job->dy.dt, n, avx2);
        dy = dyb;
      }
      vrow_to_f32(xh, rows_lane_ptr(&job->x, lane), job->x.dt, n, avx2);
      const float mu = (float)job->mean[lane], rs = (float)job->rstd[lane];
      tpu_fr_norm_bwd_terms(dy, w, mu, rs, xh, g, gx, pwf, pbf, n);
      if (!job->want_dx) continue;
      char* dst = rows_lane_ptr(&job->dx, lane);
      float* dx = job->dx.dt == TPU_F32 ? (float*)dst : gx;
      tpu_fr_norm_bwd_dx(g, gx, xh, rs, dx, n);
      vrow_from_f32(dst, job->dx.dt, dx, n, avx2);
    }
    if (job->want_dwb) {
      double* pw = job->part + b * 2 * n;
      for (int64_t i = 0; i < 2 * n; i++) pw[i] = (double)pwf[i];
    }
  }
}
DEFINE_FLAT_RUN(norm_bwd_flat, norm_bwd_job_t, norm_bwd_flat_body)

static void norm_bwd_range(void* ctx, int64_t begin, int64_t end) {
  norm_bwd_job_t* job = ctx;
  int64_t n = job->x.len, np = job->map.nparam;
  if (job->flat) {
    norm_bwd_flat_run(job, begin, end, 6 * n);
    return;
  }
  double* dy = scratch(3 * n, &job->oom);
  if (!dy) return;
  double *xh = dy + n, *g = xh + n;
  for (int64_t b = begin; b < end; b++) {
    double* pw = job->want_dwb ? job->part + b * 2 * np : NULL;
    double* pb = pw ? pw + np : NULL;
    if (pw) memset(pw, 0, sizeof(double) * (size_t)(2 * np));
    int64_t lane_end = (b + 1) * job->blk < job->x.lanes ? (b + 1) * job->blk : job->x.lanes;
    for (int64_t lane = b * job->blk; lane < lane_end; lane++) {
      row_load(&job->dy, lane, dy);
      row_load(&job->x, lane, xh);
      double mu = job->mean[lane], rs = job->rstd[lane], sg = 0, sgx = 0;
      for (int64_t i = 0; i < n; i++) xh[i] = (xh[i] - mu) * rs;
#define NORM_BWD_RUN(p, ps, e0, e1)                                          \
      for (int64_t i = e0, q = p; i < e1; i++, q += ps) {                    \
        g[i] = dy[i] * (job->w ? job->w[q] : 1);                             \
        sg += g[i];                                                          \
        sgx += g[i] * xh[i];                                                 \
        if (pw) {                                                            \
          pw[q] += dy[i] * xh[i];                                            \
          pb[q] += dy[i];                                                    \
        }                                                                    \
      }
      FOR_PARAM_RUNS(job->map, lane, n, NORM_BWD_RUN);
#undef NORM_BWD_RUN
      if (!job->want_dx) continue;
      if (job->given_stats) {
        for (int64_t i = 0; i < n; i++) g[i] *= rs;
      } else {
        double mg = sg / (double)n, mgx = sgx / (double)n;
        for (int64_t i = 0; i < n; i++) g[i] = rs * (g[i] - mg - xh[i] * mgx);
      }
      row_store(&job->dx, lane, g);
    }
  }
  free(dy);
}

/* Runs the backward and stores grad_weight (outs[1]) and grad_bias
 * (outs[2]) where wanted. */
static tpu_status_t norm_backward(const char* op, const tpu_call_t* call, int mask_arg,
                                  norm_bwd_job_t* job) {
  bool want_dw = out_wanted(call, mask_arg, 1), want_db = out_wanted(call, mask_arg, 2);
  int64_t lanes = job->x.lanes, np = job->map.nparam;
  job->want_dx = out_wanted(call, mask_arg, 0);
  job->want_dwb = want_dw || want_db;
  if (want_dw) TPU_RETURN_IF_ERROR(check_numel(op, "grad_weight", &call->outs[1], np));
  if (want_db) TPU_RETURN_IF_ERROR(check_numel(op, "grad_bias", &call->outs[2], np));
  /* blocks from the shape only, as a fused kernel's column sums */
  job->blk = tpu_fr_col_block(lanes, np);
  job->nblk = (lanes + job->blk - 1) / job->blk;
  if (job->want_dwb) {
    job->part = calloc((size_t)((job->nblk > 0 ? job->nblk : 1) * 2 * (np > 0 ? np : 1)),
                       sizeof(double));
    if (!job->part) return oom_error(op);
  }
  tpu_status_t st = TPU_OK;
  if (job->want_dx || job->want_dwb)
    st = run_items(op, job->nblk, job->blk * job->x.len, norm_bwd_range, job, &job->oom);
  if (!st && job->want_dwb) {
    /* sum the block partials in order into block 0 */
    double* sum = job->part;
    for (int64_t b = 1; b < job->nblk; b++)
      for (int64_t i = 0; i < 2 * np; i++) sum[i] += job->part[b * 2 * np + i];
    if (want_dw) store_all(&call->outs[1], sum);
    if (want_db) store_all(&call->outs[2], sum + np);
  }
  free(job->part);
  return st;
}

/* normalized_shape at args[i]: the axis where it starts in t */
static tpu_status_t layer_norm_axis(const char* op, const tpu_call_t* call, int i,
                                    const tpu_tensor_t* t, int* axis) {
  if (i >= call->nargs || call->args[i].kind != TPU_ARG_INTLIST)
    return TPU_ERR(INVALID_ARGUMENT, "%s: normalized_shape must be a list of ints", op);
  const tpu_arg_t* ns = &call->args[i];
  int a = t->ndim - ns->n;
  bool ok = a >= 0;
  for (int d = 0; ok && d < ns->n; d++) ok = t->sizes[a + d] == ns->v.ilist[d];
  if (!ok)
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: normalized_shape of %d dims does not match the trailing dims of the "
                   "%d-D input",
                   op, (int)ns->n, (int)t->ndim);
  *axis = a;
  return TPU_OK;
}

/* Stores per-lane mean and rstd = 1 / sqrt(var + eps) into mean_out and
 * rstd_out (either may be NULL); var is overwritten with rstd. */
static tpu_status_t store_stats(const char* op, const tpu_tensor_t* mean_out,
                                const tpu_tensor_t* rstd_out, const double* mean, double* var,
                                int64_t n, double eps) {
  for (int64_t i = 0; i < n; i++) var[i] = 1 / sqrt(var[i] + eps);
  if (mean_out) {
    TPU_RETURN_IF_ERROR(check_numel(op, "mean", mean_out, n));
    store_all(mean_out, mean);
  }
  if (rstd_out) {
    TPU_RETURN_IF_ERROR(check_numel(op, "rstd", rstd_out, n));
    store_all(rstd_out, var);
  }
  return TPU_OK;
}

/* Forward shared by layer and group norm: outs = (y, mean, rstd). */
/* *out = src[0, n) as float (NULL for a NULL src); the caller frees it */
static tpu_status_t float_copy(const char* op, const double* src, int64_t n, float** out) {
  *out = NULL;
  if (!src) return TPU_OK;
  *out = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  if (!*out) return oom_error(op);
  for (int64_t i = 0; i < n; i++) (*out)[i] = (float)src[i];
  return TPU_OK;
}

static tpu_status_t norm_forward_stats(const char* op, const tpu_call_t* call, norm_job_t* job,
                                       const tpu_tensor_t* w, const tpu_tensor_t* b) {
  int64_t lanes = job->x.lanes;
  double* wv = NULL;
  double* bv = NULL;
  tpu_status_t st = load_all(op, "weight", w, job->map.nparam, &wv);
  if (!st) st = load_all(op, "bias", b, job->map.nparam, &bv);
  job->w = wv;
  job->b = bv;
  if (!st && job->flat) st = float_copy(op, wv, job->map.nparam, &job->wf);
  if (!st && job->flat) st = float_copy(op, bv, job->map.nparam, &job->bf);
  job->mean = malloc(sizeof(double) * (size_t)(lanes > 0 ? lanes : 1));
  job->var = malloc(sizeof(double) * (size_t)(lanes > 0 ? lanes : 1));
  if (!st && (!job->mean || !job->var)) st = oom_error(op);
  if (!st) st = run_items(op, lanes, job->x.len, norm_range, job, &job->oom);
  if (!st)
    st = store_stats(op, call->nouts > 1 ? &call->outs[1] : NULL,
                     call->nouts > 2 ? &call->outs[2] : NULL, job->mean, job->var, lanes,
                     job->eps);
  free(wv);
  free(bv);
  free(job->wf);
  free(job->bf);
  free(job->mean);
  free(job->var);
  return st;
}

/* native_layer_norm(input, normalized_shape, weight?, bias?, eps) ->
 * (out, mean, rstd) */
tpu_status_t tpu_k_native_layer_norm(const tpu_call_t* call) {
  const char* op = "native_layer_norm";
  const tpu_tensor_t* x = tpu_arg_tensor(call, 0);
  TPU_RETURN_IF_ERROR(check_float(op, "input", x));
  TPU_RETURN_IF_ERROR(check_same_shape(op, "out", &call->outs[0], x));
  int axis;
  TPU_RETURN_IF_ERROR(layer_norm_axis(op, call, 1, x, &axis));
  norm_job_t job = {0};
  rows_split(&job.x, x, axis);
  rows_split(&job.y, &call->outs[0], axis);
  job.map = (param_map_t){1, 0, 0, job.x.len};
  job.eps = tpu_arg_f64(call, 4, 1e-5);
  job.flat = rows_flat(&job.x) && rows_flat(&job.y) && f32_storage(job.x.dt) &&
             f32_storage(job.y.dt);
  return norm_forward_stats(op, call, &job, opt_tensor(call, 2), opt_tensor(call, 3));
}

/* Loads per-lane mean and rstd tensors for a backward. */
static tpu_status_t load_stats(const char* op, const tpu_tensor_t* mean, const tpu_tensor_t* rstd,
                               int64_t lanes, double** m, double** r) {
  *r = NULL;
  TPU_RETURN_IF_ERROR(check_tensor(op, "mean", mean));
  TPU_RETURN_IF_ERROR(check_tensor(op, "rstd", rstd));
  TPU_RETURN_IF_ERROR(load_all(op, "mean", mean, lanes, m));
  tpu_status_t st = load_all(op, "rstd", rstd, lanes, r);
  if (st) free(*m);
  return st;
}

/* Backward shared by layer and group norm once the job's views are set. */
static tpu_status_t norm_backward_stats(const char* op, const tpu_call_t* call, int mask_arg,
                                        norm_bwd_job_t* job, const tpu_tensor_t* mean,
                                        const tpu_tensor_t* rstd, const tpu_tensor_t* w) {
  double *m, *r, *wv = NULL;
  TPU_RETURN_IF_ERROR(load_stats(op, mean, rstd, job->x.lanes, &m, &r));
  tpu_status_t st = load_all(op, "weight", w, job->map.nparam, &wv);
  job->mean = m;
  job->rstd = r;
  job->w = wv;
  if (!st && job->flat) st = float_copy(op, wv, job->map.nparam, &job->wf);
  if (!st) st = norm_backward(op, call, mask_arg, job);
  free(m);
  free(r);
  free(wv);
  free(job->wf);
  return st;
}

/* native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd,
 * weight?, bias?, output_mask) -> (grad_input, grad_weight, grad_bias) */
tpu_status_t tpu_k_native_layer_norm_backward(const tpu_call_t* call) {
  const char* op = "native_layer_norm_backward";
  const tpu_tensor_t* dy = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* x = tpu_arg_tensor(call, 1);
  TPU_RETURN_IF_ERROR(check_float(op, "input", x));
  TPU_RETURN_IF_ERROR(check_same_shape(op, "grad_out", dy, x));
  int axis;
  TPU_RETURN_IF_ERROR(layer_norm_axis(op, call, 2, x, &axis));
  norm_bwd_job_t job = {0};
  rows_split(&job.dy, dy, axis);
  rows_split(&job.x, x, axis);
  if (out_wanted(call, 7, 0)) {
    TPU_RETURN_IF_ERROR(check_same_shape(op, "grad_input", &call->outs[0], x));
    rows_split(&job.dx, &call->outs[0], axis);
  }
  job.map = (param_map_t){1, 0, 0, job.x.len};
  job.flat = rows_flat(&job.dy) && rows_flat(&job.x) && f32_storage(job.dy.dt) &&
             f32_storage(job.x.dt) &&
             (!out_wanted(call, 7, 0) || (rows_flat(&job.dx) && f32_storage(job.dx.dt)));
  return norm_backward_stats(op, call, 7, &job, tpu_arg_tensor(call, 3), tpu_arg_tensor(call, 4),
                             opt_tensor(call, 5));
}

/* Group norm view of (N, C, *): lanes (n, group), rows (channel in group,
 * spatial...). */
static tpu_status_t group_norm_view(const char* op, const tpu_tensor_t* t, int64_t n, int64_t c,
                                    int64_t hw, int64_t groups, rows_t* v) {
  TPU_RETURN_IF_ERROR(check_float(op, "input", t));
  if (t->ndim < 2 || t->sizes[0] != n || t->sizes[1] != c)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected an input of shape (%lld, %lld, *)", op,
                   (long long)n, (long long)c);
  if (groups <= 0 || c % groups != 0)
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: expected number of channels in input to be divisible by num_groups, but "
                   "got input of shape with %lld channels and num_groups=%lld",
                   op, (long long)c, (long long)groups);
  int64_t cpg = c / groups;
  rows_init(v, t);
  rows_add_lane(v, n, t->strides[0]);
  rows_add_lane(v, groups, cpg * t->strides[1]);
  rows_add_row(v, cpg, t->strides[1]);
  for (int d = 2; d < t->ndim; d++) rows_add_row(v, t->sizes[d], t->strides[d]);
  if (v->len != cpg * hw)
    return TPU_ERR(INVALID_ARGUMENT, "%s: HxW = %lld does not match the input's spatial size", op,
                   (long long)hw);
  return TPU_OK;
}

static param_map_t group_norm_map(int64_t c, int64_t hw, int64_t groups) {
  return (param_map_t){groups, c / groups, hw > 0 ? hw : 1, c};
}

/* native_group_norm(input, weight?, bias?, N, C, HxW, group, eps) ->
 * (out, mean, rstd) */
tpu_status_t tpu_k_native_group_norm(const tpu_call_t* call) {
  const char* op = "native_group_norm";
  const tpu_tensor_t* x = tpu_arg_tensor(call, 0);
  int64_t n = tpu_arg_i64(call, 3, 0), c = tpu_arg_i64(call, 4, 0), hw = tpu_arg_i64(call, 5, 0);
  int64_t groups = tpu_arg_i64(call, 6, 1);
  norm_job_t job = {0};
  TPU_RETURN_IF_ERROR(group_norm_view(op, x, n, c, hw, groups, &job.x));
  TPU_RETURN_IF_ERROR(check_same_shape(op, "out", &call->outs[0], x));
  TPU_RETURN_IF_ERROR(group_norm_view(op, &call->outs[0], n, c, hw, groups, &job.y));
  job.map = group_norm_map(c, hw, groups);
  job.eps = tpu_arg_f64(call, 7, 1e-5);
  return norm_forward_stats(op, call, &job, opt_tensor(call, 1), opt_tensor(call, 2));
}

/* native_group_norm_backward(grad_out, input, mean, rstd, weight?, N, C,
 * HxW, group, output_mask) -> (grad_input, grad_weight, grad_bias) */
tpu_status_t tpu_k_native_group_norm_backward(const tpu_call_t* call) {
  const char* op = "native_group_norm_backward";
  const tpu_tensor_t* dy = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* x = tpu_arg_tensor(call, 1);
  int64_t n = tpu_arg_i64(call, 5, 0), c = tpu_arg_i64(call, 6, 0), hw = tpu_arg_i64(call, 7, 0);
  int64_t groups = tpu_arg_i64(call, 8, 1);
  norm_bwd_job_t job = {0};
  TPU_RETURN_IF_ERROR(group_norm_view(op, x, n, c, hw, groups, &job.x));
  TPU_RETURN_IF_ERROR(check_same_shape(op, "grad_out", dy, x));
  TPU_RETURN_IF_ERROR(group_norm_view(op, dy, n, c, hw, groups, &job.dy));
  if (out_wanted(call, 9, 0)) {
    TPU_RETURN_IF_ERROR(check_same_shape(op, "grad_input", &call->outs[0], x));
    TPU_RETURN_IF_ERROR(group_norm_view(op, &call->outs[0], n, c, hw, groups, &job.dx));
  }
  job.map = group_norm_map(c, hw, groups);
  return norm_backward_stats(op, call, 9, &job, tpu_arg_tensor(call, 2), tpu_arg_tensor(call, 3),
                             opt_tensor(call, 4));
}

/* Batch norm view of (N, C, *): one lane per channel over (n, spatial...). */
static tpu_status_t batch_norm_view(const char* op, const tpu_tensor_t* t, rows_t* v,
                                    param_map_t* map) {
  TPU_RETURN_IF_ERROR(check_float(op, "input", t));
  if (t->ndim < 2)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected an input with at least 2 dims, got %d", op,
                   (int)t->ndim);
  rows_init(v, t);
  rows_add_lane(v, t->sizes[1], t->strides[1]);
  rows_add_row(v, t->sizes[0], t->strides[0]);
  for (int d = 2; d < t->ndim; d++) rows_add_row(v, t->sizes[d], t->strides[d]);
  *map = (param_map_t){v->lanes > 0 ? v->lanes : 1, 1, v->len > 0 ? v->len : 1, v->lanes};
  return TPU_OK;
}

static tpu_status_t batch_norm_forward(const char* op, const tpu_call_t* call,
                                       const tpu_tensor_t* rm, const tpu_tensor_t* rv,
                                       bool training, double momentum, double eps) {
  const tpu_tensor_t* x = tpu_arg_tensor(call, 0);
  norm_job_t job = {0};
  TPU_RETURN_IF_ERROR(batch_norm_view(op, x, &job.x, &job.map));
  TPU_RETURN_IF_ERROR(check_same_shape(op, "out", &call->outs[0], x));
  param_map_t unused;
  TPU_RETURN_IF_ERROR(batch_norm_view(op, &call->outs[0], &job.y, &unused));
  int64_t ch = job.x.lanes, count = job.x.len;
  if (!training && (!rm || !rv))
    return TPU_ERR(INVALID_ARGUMENT, "%s: running_mean and running_var must be defined in evaluation mode", op);
  job.eps = eps;
  job.given_stats = !training;
  double *wv = NULL, *bv = NULL, *rmv = NULL, *rvv = NULL;
  tpu_status_t st = load_all(op, "weight", opt_tensor(call, 1), ch, &wv);
  if (!st) st = load_all(op, "bias", opt_tensor(call, 2), ch, &bv);
  if (!st) st = load_all(op, "running_mean", rm, ch, &rmv);
  if (!st) st = load_all(op, "running_var", rv, ch, &rvv);
  job.w = wv;
  job.b = bv;
  job.mean = training ? malloc(sizeof(double) * (size_t)(ch > 0 ? ch : 1)) : rmv;
  job.var = training ? malloc(sizeof(double) * (size_t)(ch > 0 ? ch : 1)) : rvv;
  if (!st && (!job.mean || !job.var)) st = oom_error(op);
  if (!st) st = run_items(op, ch, count, norm_range, &job, &job.oom);
  if (!st && training && rmv && rvv) {
    /* running statistics take the unbiased variance */
    double unbias = (double)count / (double)(count - 1);
    for (int64_t i = 0; i < ch; i++) {
      rmv[i] = (1 - momentum) * rmv[i] + momentum * job.mean[i];
      rvv[i] = (1 - momentum) * rvv[i] + momentum * job.var[i] * unbias;
    }
    store_all(rm, rmv);
    store_all(rv, rvv);
  }
  /* save_mean / save_invstd; evaluation mode returns them empty */
  if (!st && training)
    st = store_stats(op, call->nouts > 1 ? &call->outs[1] : NULL,
                     call->nouts > 2 ? &call->outs[2] : NULL, job.mean, job.var, ch, eps);
  if (training) {
    free(job.mean);
    free(job.var);
  }
  free(wv);
  free(bv);
  free(rmv);
  free(rvv);
  return st;
}

/* native_batch_norm / _native_batch_norm_legit(input, weight?, bias?,
 * running_mean?, running_var?, training, momentum, eps) and
 * _native_batch_norm_legit.no_stats(input, weight?, bias?, training,
 * momentum, eps) -> (out, save_mean, save_invstd) */
tpu_status_t tpu_k_native_batch_norm(const tpu_call_t* call) {
  const char* op = "native_batch_norm";
  if (call->nargs > 3 && call->args[3].kind == TPU_ARG_BOOL)
    return batch_norm_forward(op, call, NULL, NULL, tpu_arg_bool(call, 3, true),
                              tpu_arg_f64(call, 4, 0.1), tpu_arg_f64(call, 5, 1e-5));
  return batch_norm_forward(op, call, opt_tensor(call, 3), opt_tensor(call, 4),
                            tpu_arg_bool(call, 5, true), tpu_arg_f64(call, 6, 0.1),
                            tpu_arg_f64(call, 7, 1e-5));
}

/* _batch_norm_with_update(input, weight?, bias?, running_mean, running_var,
 * momentum, eps) -> (out, save_mean, save_invstd, reserve) */
tpu_status_t tpu_k_batch_norm_with_update(const tpu_call_t* call) {
  return batch_norm_forward("_batch_norm_with_update", call, opt_tensor(call, 3),
                            opt_tensor(call, 4), true, tpu_arg_f64(call, 5, 0.1),
                            tpu_arg_f64(call, 6, 1e-5));
}

/* native_batch_norm_backward / batch_norm_backward(grad_out, input, weight?,
 * running_mean?, running_var?, save_mean?, save_invstd?, train, eps,
 * output_mask[, reserve]) -> (grad_input, grad_weight, grad_bias) */
tpu_status_t tpu_k_native_batch_norm_backward(const tpu_call_t* call) {
  const char* op = "native_batch_norm_backward";
  const tpu_tensor_t* dy = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* x = tpu_arg_tensor(call, 1);
  bool train = tpu_arg_bool(call, 7, true);
  double eps = tpu_arg_f64(call, 8, 1e-5);
  norm_bwd_job_t job = {0};
  param_map_t unused;
  TPU_RETURN_IF_ERROR(batch_norm_view(op, x, &job.x, &job.map));
  TPU_RETURN_IF_ERROR(check_same_shape(op, "grad_out", dy, x));
  TPU_RETURN_IF_ERROR(batch_norm_view(op, dy, &job.dy, &unused));
  if (out_wanted(call, 9, 0)) {
    TPU_RETURN_IF_ERROR(check_same_shape(op, "grad_input", &call->outs[0], x));
    TPU_RETURN_IF_ERROR(batch_norm_view(op, &call->outs[0], &job.dx, &unused));
  }
  const tpu_tensor_t* mean = opt_tensor(call, train ? 5 : 3);
  const tpu_tensor_t* stat = opt_tensor(call, train ? 6 : 4);
  if (!mean || !stat)
    return TPU_ERR(INVALID_ARGUMENT, "%s: %s statistics must be defined", op,
                   train ? "saved" : "running");
  job.given_stats = !train;
  double *m, *r, *wv = NULL;
  TPU_RETURN_IF_ERROR(load_stats(op, mean, stat, job.x.lanes, &m, &r));
  if (!train) /* running variance to 1 / sqrt(var + eps) */
    for (int64_t i = 0; i < job.x.lanes; i++) r[i] = 1 / sqrt(r[i] + eps);
  tpu_status_t st = load_all(op, "weight", opt_tensor(call, 2), job.x.lanes, &wv);
  job.mean = m;
  job.rstd = r;
  job.w = wv;
  if (!st) st = norm_backward(op, call, 9, &job);
  free(m);
  free(r);
  free(wv);
  return st;
}

/* ---- embedding backward ----
 * grad_weight[w] = sum of grad_output rows whose index is w (padding_idx
 * skipped), divided by the index's count with scale_grad_by_freq. Positions
 * are bucketed by index (counting sort), then weight rows are summed in
 * parallel, each in position order. */
typedef struct {
  rows_t grad, out;
  const int64_t* start; /* positions of index w: order[start[w] .. start[w + 1]) */
  const int64_t* order;
  bool scale;
  _Atomic int oom;
} emb_job_t;

static void embedding_range(void* ctx, int64_t begin, int64_t end) {
  emb_job_t* job = ctx;
  int64_t d = job->out.len;
  double* acc = scratch(2 * d, &job->oom);
  if (!acc) return;
  double* row = acc + d;
  for (int64_t w = begin; w < end; w++) {
    memset(acc, 0, sizeof(double) * (size_t)d);
    int64_t cnt = job->start[w + 1] - job->start[w];
    for (int64_t k = job->start[w]; k < job->start[w + 1]; k++) {
      row_load(&job->grad, job->order[k], row);
      for (int64_t i = 0; i < d; i++) acc[i] += row[i];
    }
    if (job->scale && cnt > 0)
      for (int64_t i = 0; i < d; i++) acc[i] /= (double)cnt;
    row_store(&job->out, w, acc);
  }
  free(acc);
}

/* embedding_dense_backward(grad_output, indices, num_weights, padding_idx,
 * scale_grad_by_freq) -> grad_weight */
tpu_status_t tpu_k_embedding_dense_backward(const tpu_call_t* call) {
  const char* op = "embedding_dense_backward";
  const tpu_tensor_t* grad = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* idx = tpu_arg_tensor(call, 1);
  const tpu_tensor_t* out = &call->outs[0];
  int64_t nw = tpu_arg_i64(call, 2, 0), padding = tpu_arg_i64(call, 3, -1);
  TPU_RETURN_IF_ERROR(check_float(op, "grad_output", grad));
  TPU_RETURN_IF_ERROR(check_tensor(op, "indices", idx));
  if (tpu_dtype_is_float(idx->dtype))
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected indices of an integer dtype, got %s", op,
                   tpu_dtype_name(idx->dtype));
  if (grad->ndim != idx->ndim + 1)
    return TPU_ERR(INVALID_ARGUMENT, "%s: grad_output must have one more dim than indices", op);
  emb_job_t job = {0};
  rows_split(&job.grad, grad, grad->ndim - 1);
  TPU_RETURN_IF_ERROR(check_numel(op, "indices", idx, job.grad.lanes));
  if (out->ndim != 2 || out->sizes[0] != nw || out->sizes[1] != job.grad.len)
    return TPU_ERR(INVALID_ARGUMENT, "%s: grad_weight must have shape (%lld, %lld)", op,
                   (long long)nw, (long long)job.grad.len);
  rows_split(&job.out, out, 1);
  int64_t np = job.grad.lanes;
  int64_t* ids = malloc(sizeof(int64_t) * (size_t)(np + 1));
  int64_t* order = malloc(sizeof(int64_t) * (size_t)(np + 1));
  int64_t* start = calloc((size_t)nw + 2, sizeof(int64_t));
  tpu_status_t st = ids && order && start ? TPU_OK : oom_error(op);
  if (!st) {
    rows_t vi;
    rows_split(&vi, idx, 0);
    rows_io(&vi, 0, ids, IO_LOAD_I64);
  }
  /* count each index (start[w + 2]), prefix-sum, then place positions */
  for (int64_t p = 0; !st && p < np; p++) {
    if (ids[p] == padding) continue;
    if (ids[p] < 0 || ids[p] >= nw)
      st = TPU_ERR(OUT_OF_RANGE, "%s: index %lld is out of bounds for %lld embeddings", op,
                   (long long)ids[p], (long long)nw);
    else start[ids[p] + 2]++;
  }
  if (!st) {
    for (int64_t w = 2; w <= nw + 1; w++) start[w] += start[w - 1];
    for (int64_t p = 0; p < np; p++)
      if (ids[p] != padding) order[start[ids[p] + 1]++] = p;
    job.start = start;
    job.order = order;
    job.scale = tpu_arg_bool(call, 4, false);
    st = run_items(op, nw, job.out.len + 1, embedding_range, &job, &job.oom);
  }
  free(ids);
  free(order);
  free(start);
  return st;
}

/* ---- dropout backward ---- */
#define DROPOUT_BODY(SUF, T)                                                               \
  static void dropout_bwd_##SUF(void* ctx, int64_t n, void* out, const void* const* in) { \
    const T s = (T)*(const double*)ctx;                                                    \
    const T* g = in[0];                                                                    \
    const T* m = in[1];                                                                    \
    T* o = out;                                                                            \
    for (int64_t i = 0; i < n; i++) o[i] = g[i] * m[i] * s;                                \
  }
DROPOUT_BODY(f32, float)
DROPOUT_BODY(f64, double)

/* native_dropout_backward(grad_output, mask, scale) = grad * mask * scale */
tpu_status_t tpu_k_native_dropout_backward(const tpu_call_t* call) {
  const tpu_tensor_t* in[2] = {tpu_arg_tensor(call, 0), tpu_arg_tensor(call, 1)};
  TPU_RETURN_IF_ERROR(check_tensor("native_dropout_backward", "grad_output", in[0]));
  TPU_RETURN_IF_ERROR(check_tensor("native_dropout_backward", "mask", in[1]));
  double scale = tpu_arg_f64(call, 2, 1.0);
  static const tpu_loop_set_t loops = {dropout_bwd_f32, dropout_bwd_f64, NULL, NULL};
  return tpu_elementwise_set("native_dropout_backward", &call->outs[0], in, 2,
                             tpu_ctype_of(call->outs[0].dtype), &loops, &scale);
}
