/* Reduction kernels: sums, means, products, extremes (with indices),
 * variance, logical reductions, counts, log-sum-exp, vector norms, and the
 * scans cumsum, cumprod, logcumsumexp, cummax and cummin.
 *
 * One strided driver serves every reduction. A plan splits the input's dims
 * into kept dims (one combination per output element) and reduced dims, both
 * coalesced; when only values matter the reduced dims are also sorted so the
 * smallest stride is innermost. Outputs are processed in blocks of up to
 * `kmax` consecutive elements along the innermost kept dim; the reduction is
 * walked in tiles of `len` positions that are gathered into a double or int64
 * buffer, and each output's accumulator consumes its row of the tile in a
 * tight loop. When the kept dim is the denser one (a column reduction such as
 * sum over dim 0), tiles are wide and short and are read row by row, so the
 * input is streamed once. Floats accumulate in double, integer sums and
 * products in int64 (wrapping like PyTorch).
 *
 * Outputs are independent and each one always sees the same tile sequence,
 * so results do not depend on the thread split. With few outputs and a long
 * reduction, the reduction is cut into fixed chunks (independent of the
 * thread count) whose partial accumulators are combined in order.
 *
 * Scans reuse the plan with the scanned dim as the single reduced dim.
 */
#include <stdlib.h>

#include "kernels.h"
#include "vecmath.h"

#define TILE 2048            /* buffer elements per tile */
#define KMAX 1024            /* most outputs per block */
#define COL_LEN 16           /* reduction positions per tile of a column reduction */
#define SPLIT_CHUNK 65536    /* reduction positions per partial in split mode */
#define SPLIT_MAX_OUTS 16    /* split the reduction only for this few outputs */
#define GRAIN 32768          /* input elements per parallel work item */

typedef enum {
  R_SUM, R_NANSUM, R_PROD, R_MEAN,
  R_MAX, R_MIN, R_ARGMAX, R_ARGMIN, R_MINMAX,
  R_VAR, R_STD,
  R_ALL, R_ANY, R_COUNT, R_LSE,
  R_NORM0, R_NORM1, R_NORM2, R_NORMP, R_NORMINF, R_NORMNINF,
  S_CUMSUM, S_CUMPROD, S_LOGCUMSUMEXP, S_CUMMAX, S_CUMMIN,
} rkind_t;

typedef struct {
  rkind_t kind;
  bool int_domain;  /* accumulate in int64 instead of double */
  double param;     /* var/std: correction; general norm: p */
  const char* in;
  tpu_dtype_t dt;
  int64_t isz;
  /* kept dims: sizes, input strides and output strides (bytes) */
  int nk;
  int64_t ksize[TPU_MAX_DIMS], kstride[TPU_MAX_DIMS], kostride[2][TPU_MAX_DIMS];
  /* reduced dims: sizes and input strides (bytes) */
  int nr;
  int64_t rsize[TPU_MAX_DIMS], rstride[TPU_MAX_DIMS];
  int64_t n_out, n_red;
  int nouts;
  char* out[2];
  tpu_dtype_t odt[2];
  int64_t oscan[2];  /* scans: output strides (bytes) along the scanned dim */
  int64_t len, kmax; /* tile shape: reduction positions x outputs */
  bool by_row;       /* column reduction: gather tiles row by row */
  bool col_acc;      /* by_row and a kind that accumulates a whole row at once */
  bool in_place;     /* float sum or max/min values read in place: contiguous runs, or
                        contiguous rows with col_acc */
} plan_t;

typedef struct {
  double d[2];
  int64_t i[2];
  int64_t idx; /* extremes: index of the current value; -1 before the first element */
  int64_t n;   /* var/std: elements seen */
} acc_t;

typedef struct {
  union {
    double f[TILE];
    int64_t i[TILE];
  } buf;
  int64_t roff[TILE];
  double col[KMAX]; /* col_acc: per-output running values */
} scratch_t;

static int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- dims ---- */

/* Marks the dims named by argument `argi` in red[]. None (or argi < 0) means
 * all dims; an int names one dim; an empty list means all dims, or none when
 * `empty_is_none`. *explicit_dims tells whether dims were named. */
static tpu_status_t parse_dims(const char* op, const tpu_call_t* c, int argi, int ndim,
                               bool empty_is_none, bool* red, bool* explicit_dims) {
  int64_t one;
  const int64_t* list = NULL;
  int n = -1; /* -1: all dims */
  if (argi >= 0 && !tpu_arg_is_none(c, argi)) {
    const tpu_arg_t* a = &c->args[argi];
    if (a->kind == TPU_ARG_INTLIST) {
      list = a->v.ilist;
      n = a->n;
      if (n == 0 && !empty_is_none) n = -1;
    } else {
      one = tpu_arg_i64(c, argi, 0);
      list = &one;
      n = 1;
    }
  }
  *explicit_dims = n > 0;
  for (int d = 0; d < ndim; d++) red[d] = n < 0;
  int wrap = ndim > 0 ? ndim : 1;
  for (int k = 0; k < n; k++) {
    int64_t d = list[k];
    if (d < -wrap || d >= wrap)
      return TPU_ERR(OUT_OF_RANGE,
                     "%s(): Dimension out of range (expected to be in range of [%d, %d], but got "
                     "%lld)",
                     op, -wrap, wrap - 1, (long long)d);
    if (d < 0) d += wrap;
    if (ndim == 0) continue;
    if (red[d])
      return TPU_ERR(INVALID_ARGUMENT, "%s(): dim %lld appears multiple times in the list of dims",
                     op, (long long)d);
    red[d] = true;
  }
  return TPU_OK;
}

/* ---- plans ---- */

/* Builds the plan for reducing (or, with `scan`, scanning) `in` over the dims
 * marked in red[]. Outputs either keep every input dim (keepdim, scans) or
 * only the kept ones. `keep_order` keeps the reduced dims in logical order so
 * tile positions are row-major indices into the reduced sub-tensor. */
static tpu_status_t plan_build(plan_t* p, const char* op, rkind_t kind, const tpu_tensor_t* in,
                               const bool* red, const tpu_tensor_t* outs, int nouts,
                               bool keep_order, bool scan) {
  memset(p, 0, sizeof *p);
  p->kind = kind;
  if (!tpu_dtype_is_supported(in->dtype))
    return TPU_ERR(UNIMPLEMENTED, "%s(): input dtype %d is not supported on tpu", op,
                   (int)in->dtype);
  p->in = in->data;
  p->dt = in->dtype;
  p->isz = (int64_t)tpu_dtype_size(in->dtype);
  p->nouts = nouts;
  int nd = in->ndim, ond = outs[0].ndim, nkept = 0;
  for (int d = 0; d < nd; d++) nkept += !red[d];
  bool keepdim = ond == nd;
  if (!keepdim && ond != nkept)
    return TPU_ERR(INTERNAL, "%s(): output has %d dims; expected %d or %d", op, ond, nd, nkept);
  int64_t osz[2];
  for (int q = 0; q < nouts; q++) {
    if (!tpu_dtype_is_supported(outs[q].dtype))
      return TPU_ERR(UNIMPLEMENTED, "%s(): output dtype %d is not supported on tpu", op,
                     (int)outs[q].dtype);
    if (outs[q].ndim != ond)
      return TPU_ERR(INTERNAL, "%s(): outputs have %d and %d dims", op, ond, outs[q].ndim);
    p->out[q] = outs[q].data;
    p->odt[q] = outs[q].dtype;
    osz[q] = (int64_t)tpu_dtype_size(outs[q].dtype);
  }
  int od = 0;
  for (int d = 0; d < nd; d++) {
    int64_t size = in->sizes[d];
    if (red[d]) {
      for (int q = 0; keepdim && q < nouts; q++) {
        int64_t want = scan ? size : 1;
        if (outs[q].sizes[d] != want)
          return TPU_ERR(INTERNAL, "%s(): output %d has size %lld at dim %d; expected %lld", op,
                         q, (long long)outs[q].sizes[d], d, (long long)want);
        p->oscan[q] = outs[q].strides[d] * osz[q];
      }
      od += keepdim;
      if (size != 1) {
        p->rsize[p->nr] = size;
        p->rstride[p->nr++] = in->strides[d] * p->isz;
      }
      continue;
    }
    for (int q = 0; q < nouts; q++)
      if (outs[q].sizes[od] != size)
        return TPU_ERR(INTERNAL, "%s(): output %d has size %lld at dim %d; expected %lld", op, q,
                       (long long)outs[q].sizes[od], od, (long long)size);
    if (size != 1) {
      p->ksize[p->nk] = size;
      p->kstride[p->nk] = in->strides[d] * p->isz;
      for (int q = 0; q < nouts; q++) p->kostride[q][p->nk] = outs[q].strides[od] * osz[q];
      p->nk++;
    }
    od++;
  }
  /* merge kept neighbours that are one run in the input and every output */
  int m = 0;
  for (int k = 0; k < p->nk; k++) {
    bool merge = m > 0 && p->kstride[m - 1] == p->kstride[k] * p->ksize[k];
    for (int q = 0; merge && q < nouts; q++)
      merge = p->kostride[q][m - 1] == p->kostride[q][k] * p->ksize[k];
    if (merge) {
      p->ksize[m - 1] *= p->ksize[k];
      p->kstride[m - 1] = p->kstride[k];
      for (int q = 0; q < nouts; q++) p->kostride[q][m - 1] = p->kostride[q][k];
    } else {
      p->ksize[m] = p->ksize[k];
      p->kstride[m] = p->kstride[k];
      for (int q = 0; q < nouts; q++) p->kostride[q][m] = p->kostride[q][k];
      m++;
    }
  }
  p->nk = m;
  /* order-free reductions: smallest stride innermost (stable insertion sort) */
  for (int k = 1; !keep_order && k < p->nr; k++) {
    int64_t s = p->rsize[k], st = p->rstride[k];
    int j = k;
    for (; j > 0 && p->rstride[j - 1] < st; j--) {
      p->rsize[j] = p->rsize[j - 1];
      p->rstride[j] = p->rstride[j - 1];
    }
    p->rsize[j] = s;
    p->rstride[j] = st;
  }
  m = 0;
  for (int k = 0; k < p->nr; k++) {
    if (m > 0 && p->rstride[m - 1] == p->rstride[k] * p->rsize[k]) {
      p->rsize[m - 1] *= p->rsize[k];
      p->rstride[m - 1] = p->rstride[k];
    } else {
      p->rsize[m] = p->rsize[k];
      p->rstride[m++] = p->rstride[k];
    }
  }
  p->nr = m;
  /* a missing side becomes one dim of size 1 */
  if (p->nk == 0) p->ksize[p->nk++] = 1;
  if (p->nr == 0) p->rsize[p->nr++] = 1;
  p->n_out = 1;
  for (int k = 0; k < p->nk; k++) p->n_out *= p->ksize[k];
  p->n_red = 1;
  for (int k = 0; k < p->nr; k++) p->n_red *= p->rsize[k];
  /* tile shape (from the shape only, so every output sees the same tiles):
   * when the kept dim is denser than the reduced one, short stretches of the
   * reduction for as many outputs as a row holds */
  int64_t rs = p->rstride[p->nr - 1], ks = p->kstride[p->nk - 1];
  p->by_row = !scan && ks != 0 && ks < rs && p->ksize[p->nk - 1] > 1;
  if (p->by_row) {
    p->kmax = min64(TILE / COL_LEN, p->ksize[p->nk - 1]);
    p->len = min64(p->n_red, TILE / p->kmax);
  } else {
    p->len = min64(p->n_red, TILE);
    p->kmax = scan ? 1 : min64(KMAX, TILE / (p->len > 0 ? p->len : 1));
  }
  if (p->len < 1) p->len = 1;
  return TPU_OK;
}

/* Address of output q at byte offset off; NULL for an absent output. */
static char* out_ptr(const plan_t* p, int q, int64_t off) {
  return q < p->nouts ? p->out[q] + off : NULL;
}

/* Input and output byte offsets of output element `o` (row-major over the
 * kept dims). */
static void kept_offsets(const plan_t* p, int64_t o, int64_t* in_off, int64_t out_off[2]) {
  int64_t a = 0, b0 = 0, b1 = 0;
  for (int d = p->nk - 1; d >= 0; d--) {
    int64_t i = o % p->ksize[d];
    o /= p->ksize[d];
    a += i * p->kstride[d];
    b0 += i * p->kostride[0][d];
    b1 += i * p->kostride[1][d];
  }
  *in_off = a;
  out_off[0] = b0;
  out_off[1] = b1;
}

/* ---- gathering tiles ---- */
#define CONV_ID(x) (x)
#define CONV_BOOL(x) ((x) != 0)
/* contiguous runs convert in blocks of 8 so the compiler vectorizes them */
#define GATHER_LOOP(BT, T, CONV)                                                  \
  if (p->col_acc) {                                                               \
    for (int64_t t = 0; t < len; t++) {                                           \
      const char* q = base + roff[t];                                             \
      BT* o = (BT*)buf + t * K;                                                   \
      if (ks == (int64_t)sizeof(T)) {                                             \
        const T* s = (const T*)q;                                                 \
        for (int64_t j = 0; j < K; j++) o[j] = (BT)CONV(s[j]);                    \
      } else {                                                                    \
        for (int64_t j = 0; j < K; j++) o[j] = (BT)CONV(*(const T*)(q + j * ks)); \
      }                                                                           \
    }                                                                             \
  } else if (p->by_row) {                                                         \
    for (int64_t t = 0; t < len; t++) {                                           \
      const char* q = base + roff[t];                                             \
      for (int64_t j = 0; j < K; j++) ((BT*)buf)[j * len + t] = (BT)CONV(*(const T*)(q + j * ks)); \
    }                                                                             \
  } else {                                                                        \
    for (int64_t j = 0; j < K; j++) {                                             \
      const char* q = base + j * ks;                                              \
      BT* o = (BT*)buf + j * len;                                                 \
      if (contig) {                                                               \
        const T* s = (const T*)q + r0;                                            \
        int64_t t = 0;                                                            \
        for (; t + 8 <= len; t += 8)                                              \
          for (int k = 0; k < 8; k++) o[t + k] = (BT)CONV(s[t + k]);              \
        for (; t < len; t++) o[t] = (BT)CONV(s[t]);                               \
      } else {                                                                    \
        for (int64_t t = 0; t < len; t++) o[t] = (BT)CONV(*(const T*)(q + roff[t])); \
      }                                                                           \
    }                                                                             \
  }
#define GATHER_CASES(BT)                                                 \
  switch (p->dt) {                                                       \
    case TPU_U8: GATHER_LOOP(BT, uint8_t, CONV_ID) break;                \
    case TPU_I8: GATHER_LOOP(BT, int8_t, CONV_ID) break;                 \
    case TPU_I16: GATHER_LOOP(BT, int16_t, CONV_ID) break;               \
    case TPU_I32: GATHER_LOOP(BT, int32_t, CONV_ID) break;               \
    case TPU_I64: GATHER_LOOP(BT, int64_t, CONV_ID) break;               \
    case TPU_U16: GATHER_LOOP(BT, uint16_t, CONV_ID) break;              \
    case TPU_U32: GATHER_LOOP(BT, uint32_t, CONV_ID) break;              \
    case TPU_U64: GATHER_LOOP(BT, uint64_t, CONV_ID) break;              \
    case TPU_F16: GATHER_LOOP(BT, uint16_t, tpu_vm_f16_to_f32) break;    \
    case TPU_BF16: GATHER_LOOP(BT, uint16_t, tpu_vm_bf16_to_f32) break;  \
    case TPU_F32: GATHER_LOOP(BT, float, CONV_ID) break;                 \
    case TPU_F64: GATHER_LOOP(BT, double, CONV_ID) break;                \
    case TPU_BOOL: GATHER_LOOP(BT, uint8_t, CONV_BOOL) break;            \
    default: break;                                                      \
  }

/* roff[t]: input byte offset of reduction position r0 + t (from an output's
 * first element) */
static void tile_offsets(const plan_t* p, int64_t r0, int64_t len, int64_t* roff) {
  int64_t idx[TPU_MAX_DIMS], rem = r0, off = 0;
  for (int d = p->nr - 1; d >= 0; d--) {
    idx[d] = rem % p->rsize[d];
    rem /= p->rsize[d];
    off += idx[d] * p->rstride[d];
  }
  for (int64_t t = 0; t < len; t++) {
    roff[t] = off;
    for (int d = p->nr - 1; d >= 0; d--) {
      off += p->rstride[d];
      if (++idx[d] < p->rsize[d]) break;
      off -= p->rstride[d] * p->rsize[d];
      idx[d] = 0;
    }
  }
}

/* Loads reduction positions [r0, r0 + len) of K consecutive outputs, the
 * first at `base`, into buf[j * len + t] in the plan's domain; column
 * reductions read the tile row by row (consecutive outputs are adjacent),
 * and with col_acc keep that layout: buf[t * K + j]. Inlined into each ISA
 * copy of its callers. */
TPU_VM_INLINE void gather(const plan_t* p, const char* base, int64_t K, int64_t r0, int64_t len,
                          void* buf, int64_t* roff) {
  bool contig = p->nr == 1 && p->rstride[0] == p->isz;
  int64_t ks = p->kstride[p->nk - 1];
  if (!contig) tile_offsets(p, r0, len, roff);
  if (p->int_domain) {
    GATHER_CASES(int64_t)
  } else {
    GATHER_CASES(double)
  }
}

/* ---- accumulators ---- */
static double nan_max(double a, double b) { return a != a ? a : (b != b || b > a) ? b : a; }
static double nan_min(double a, double b) { return a != a ? a : (b != b || b < a) ? b : a; }
/* log-sum-exp partials store s = sum(exp(x - lse_shift(m))) with m = max */
static double lse_shift(double m) { return isinf(m) ? 0 : m; }
#define ADDW(a, b) ((int64_t)((uint64_t)(a) + (uint64_t)(b)))
#define MULW(a, b) ((int64_t)((uint64_t)(a) * (uint64_t)(b)))
/* NaN wins; among equals the earlier element stays */
#define MAX_BETTER(v, cur) ((v) > (cur) || ((v) != (v) && (cur) == (cur)))
#define MIN_BETTER(v, cur) ((v) < (cur) || ((v) != (v) && (cur) == (cur)))

static void acc_init(const plan_t* p, acc_t* a) {
  memset(a, 0, sizeof *a);
  a->idx = -1;
  switch (p->kind) {
    case R_PROD: a->d[0] = 1; a->i[0] = 1; break;
    case R_ALL: a->d[0] = 1; break;
    case R_LSE: a->d[0] = -INFINITY; break;
    case R_NORMNINF: a->d[0] = INFINITY; break;
    default: break;
  }
}

/* Merges a partial mean/M2 over n2 elements (Chan et al.). */
static void var_merge(acc_t* a, int64_t n2, double mean2, double m2) {
  if (n2 == 0) return;
  if (a->n == 0) {
    a->n = n2;
    a->d[0] = mean2;
    a->d[1] = m2;
    return;
  }
  int64_t n = a->n + n2;
  double delta = mean2 - a->d[0];
  a->d[0] += delta * ((double)n2 / (double)n);
  a->d[1] += m2 + delta * delta * ((double)a->n * (double)n2 / (double)n);
  a->n = n;
}

static void lse_merge(acc_t* a, double m2, double s2) {
  double m = nan_max(a->d[0], m2);
  double s1 = a->d[1];
  /* an empty side (s == 0) contributes nothing, even where exp overflows */
  double t1 = s1 == 0 ? 0 : s1 * exp(lse_shift(a->d[0]) - lse_shift(m));
  double t2 = s2 == 0 ? 0 : s2 * exp(lse_shift(m2) - lse_shift(m));
  a->d[0] = m;
  a->d[1] = t1 + t2;
}

/* sum(f(v)) over n values in LANES interleaved partial sums (lane k takes
 * positions k, k + LANES, ...) added up in a fixed order; the lanes become
 * independent vector accumulators. c is a constant of f (mean, shift or p). */
#define LANES 16
#define LANE_SUM(s)                                                                     \
  ((((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))) +                \
   (((s[8] + s[9]) + (s[10] + s[11])) + ((s[12] + s[13]) + (s[14] + s[15]))))
/* declares double s[LANES]: the partial sums of F over v = LOAD (an
 * expression of the position i) for i in [0, n) */
#define SUM_LOOP(LOAD, F)                         \
  double s[LANES] = {0};                          \
  int64_t t = 0;                                  \
  for (; t + LANES <= n; t += LANES)              \
    for (int k = 0; k < LANES; k++) {             \
      int64_t i = t + k;                          \
      double v = (LOAD);                          \
      s[k] += (F);                                \
    }                                             \
  for (int k = 0; t < n; t++, k++) {              \
    int64_t i = t;                                \
    double v = (LOAD);                            \
    s[k] += (F);                                  \
  }
#define SUM_FN(NAME, F)                                             \
  TPU_VM_INLINE double NAME(const double* x, int64_t n, double c) { \
    (void)c;                                                        \
    SUM_LOOP(x[i], F)                                               \
    return LANE_SUM(s);                                             \
  }
SUM_FN(sum_plain, v)
SUM_FN(sum_notnan, v == v ? v : 0)
SUM_FN(sum_abs, fabs(v))
SUM_FN(sum_sq, v * v)
SUM_FN(sum_sqdev, (v - c) * (v - c))
SUM_FN(sum_powabs, pow(fabs(v), c))
SUM_FN(sum_exp, exp(v - c))


/* the running value and index live in locals inside the loop */
#define EXTREME_RUN(T, VAL, BETTER)                  \
  {                                                  \
    T cur = a->idx < 0 ? x[0] : VAL;                 \
    int64_t at = a->idx < 0 ? idx0 : a->idx;         \
    for (int64_t t = 0; t < n; t++) {                \
      if (BETTER(x[t], cur)) {                       \
        cur = x[t];                                  \
        at = idx0 + t;                               \
      }                                              \
    }                                                \
    VAL = cur;                                       \
    a->idx = at;                                     \
  }
#define MINMAX_RUN(LO, HI)                           \
  for (int64_t t = 0; t < n; t++) {                  \
    if (a->idx < 0) {                                \
      LO = HI = x[t];                                \
      a->idx = 0;                                    \
    }                                                \
    if (MIN_BETTER(x[t], LO)) LO = x[t];             \
    if (MAX_BETTER(x[t], HI)) HI = x[t];             \
  }

/* Values-only running max (GT >) or min (GT <) of cur and n values, NaN
 * winning: four independent vectors of four lanes (GCC vector extensions),
 * then the lanes and the tail in order. */
typedef double vd4_t __attribute__((vector_size(32)));
typedef int64_t vl4_t __attribute__((vector_size(32)));
#define EXTREME_VALUES(NAME, GT, BETTER)                              \
  TPU_VM_INLINE double NAME(const double* x, int64_t n, double cur) { \
    int64_t t = 0;                                                    \
    if (n >= 16) {                                                    \
      vd4_t c4 = {cur, cur, cur, cur};                                \
      vd4_t m[4] = {c4, c4, c4, c4};                                  \
      for (; t + 16 <= n; t += 16)                                    \
        for (int q = 0; q < 4; q++) {                                 \
          vd4_t v;                                                    \
          memcpy(&v, x + t + 4 * q, sizeof v);                        \
          vl4_t take = (v GT m[q]) | (v != v);                        \
          m[q] = (vd4_t)(((vl4_t)v & take) | ((vl4_t)m[q] & ~take));  \
        }                                                             \
      for (int q = 0; q < 4; q++)                                     \
        for (int k = 0; k < 4; k++)                                   \
          if (BETTER(m[q][k], cur)) cur = m[q][k];                    \
    }                                                                 \
    for (; t < n; t++)                                                \
      if (BETTER(x[t], cur)) cur = x[t];                              \
    return cur;                                                       \
  }
EXTREME_VALUES(max_values, >, MAX_BETTER)
EXTREME_VALUES(min_values, <, MIN_BETTER)

/* The same over n contiguous floating elements of dtype dt read in place,
 * in float (exact for these dtypes): four vectors of eight lanes. */
typedef float vf8_t __attribute__((vector_size(32)));
typedef int32_t vi8_t __attribute__((vector_size(32)));
#define LOAD8_F32(v, p) memcpy(&(v), (p), sizeof(v))
#define LOAD8_BF16(v, p) for (int k = 0; k < 8; k++) (v)[k] = tpu_vm_bf16_to_f32((p)[k])
#define LOAD8_F16(v, p) for (int k = 0; k < 8; k++) (v)[k] = tpu_vm_f16_to_f32((p)[k])
#define EXTREME_SRC_LOOP(T, CONV, LOAD8, GT, BETTER)                   \
  {                                                                    \
    const T* x = (const T*)src;                                        \
    int64_t t = 0;                                                     \
    if (n >= 32) {                                                     \
      float cf = (float)cur;                                           \
      vf8_t c8 = {cf, cf, cf, cf, cf, cf, cf, cf};                     \
      vf8_t m[4] = {c8, c8, c8, c8};                                   \
      for (; t + 32 <= n; t += 32)                                     \
        for (int q = 0; q < 4; q++) {                                  \
          vf8_t v;                                                     \
          LOAD8(v, x + t + 8 * q);                                     \
          vi8_t take = (v GT m[q]) | (v != v);                         \
          m[q] = (vf8_t)(((vi8_t)v & take) | ((vi8_t)m[q] & ~take));   \
        }                                                              \
      for (int q = 1; q < 4; q++) { /* the four vectors into m[0] */  \
        vi8_t take = (m[q] GT m[0]) | (m[q] != m[q]);                  \
        m[0] = (vf8_t)(((vi8_t)m[q] & take) | ((vi8_t)m[0] & ~take));  \
      }                                                                \
      for (int k = 0; k < 8; k++)                                      \
        if (BETTER((double)m[0][k], cur)) cur = m[0][k];               \
    }                                                                  \
    for (; t < n; t++)                                                 \
      if (BETTER((double)CONV(x[t]), cur)) cur = CONV(x[t]);           \
    return cur;                                                        \
  }
#define EXTREME_SRC(NAME, GT, BETTER, F64_FN)                                             \
  TPU_VM_INLINE double NAME(const char* src, tpu_dtype_t dt, int64_t n, double cur) {    \
    switch (dt) {                                                                         \
      case TPU_F32: EXTREME_SRC_LOOP(float, CONV_ID, LOAD8_F32, GT, BETTER)               \
      case TPU_BF16: EXTREME_SRC_LOOP(uint16_t, tpu_vm_bf16_to_f32, LOAD8_BF16, GT, BETTER) \
      case TPU_F16: EXTREME_SRC_LOOP(uint16_t, tpu_vm_f16_to_f32, LOAD8_F16, GT, BETTER)  \
      case TPU_F64: return F64_FN((const double*)src, n, cur);                            \
      default: return cur;                                                                \
    }                                                                                     \
  }
EXTREME_SRC(max_src, >, MAX_BETTER, max_values)
EXTREME_SRC(min_src, <, MIN_BETTER, min_values)

/* sum of n contiguous float32 / bfloat16 / float16 elements: runs of
 * SUMRUN elements are added in float across 32 lanes (four vectors of eight,
 * SUMRUN / 32 additions per lane, then the four vectors: roundings far
 * below float precision of the run), and each run into eight double partial
 * sums, so long sums keep double accuracy at float speed. The order is fixed
 * by n alone. */
#define SUMRUN 512
typedef double vd8_t __attribute__((vector_size(64)));
#define SUMRUN_LOOP(T, CONV, LOAD8)                                                  \
  {                                                                                  \
    const T* x = (const T*)src;                                                      \
    vd8_t d = {0, 0, 0, 0, 0, 0, 0, 0};                                              \
    int64_t t = 0;                                                                   \
    for (; t + SUMRUN <= n; t += SUMRUN) {                                           \
      vf8_t a[4] = {{0}, {0}, {0}, {0}};                                             \
      for (int j = 0; j < SUMRUN; j += 32)                                           \
        for (int q = 0; q < 4; q++) {                                                \
          vf8_t v;                                                                   \
          LOAD8(v, x + t + j + 8 * q);                                               \
          a[q] += v;                                                                 \
        }                                                                            \
      d += __builtin_convertvector((a[0] + a[1]) + (a[2] + a[3]), vd8_t);            \
    }                                                                                \
    double tail = 0;                                                                 \
    for (; t < n; t++) tail += (double)CONV(x[t]);                                   \
    return (((d[0] + d[4]) + (d[1] + d[5])) + ((d[2] + d[6]) + (d[3] + d[7]))) + tail; \
  }
/* sum of n contiguous floating elements of dtype dt read in place */
TPU_VM_INLINE double sumrun_src(const char* src, tpu_dtype_t dt, int64_t n) {
  switch (dt) {
    case TPU_F32: SUMRUN_LOOP(float, CONV_ID, LOAD8_F32)
    case TPU_BF16: SUMRUN_LOOP(uint16_t, tpu_vm_bf16_to_f32, LOAD8_BF16)
    case TPU_F16: SUMRUN_LOOP(uint16_t, tpu_vm_f16_to_f32, LOAD8_F16)
    case TPU_F64: { /* double values: LANES double partial sums, no float runs */
      const double* x = (const double*)src;
      SUM_LOOP(x[i], v)
      return LANE_SUM(s);
    }
    default: return 0;
  }
}

/* v rounded to a half dtype dt, as a product's running value: float16 and
 * bfloat16 products accumulate in the output's dtype as CPU's prod kernel
 * does (f16 [300, 300, 0.001] overflows to inf there). A float32 product
 * runs in double and is rounded once: a running float32 product overflows
 * where the exact one is finite (4444 factors in [-2, 2] whose product is
 * 4.6e28 reach 3.4e38 on the way; CPU's vector lanes, which hold shorter
 * runs, do not), fuzz seed 231743. */
TPU_VM_INLINE double round_to_dtype(tpu_dtype_t dt, double v) {
  switch (dt) {
    case TPU_F16: return tpu_vm_f16_to_f32(tpu_vm_f32_to_f16((float)v));
    case TPU_BF16: return tpu_vm_bf16_to_f32(tpu_vm_f32_to_bf16((float)v));
    default: return v;
  }
}

/* Consumes n values of the reduction starting at position idx0; inlined
 * into each ISA copy of reduce_block. max/min without indices keep only
 * the value (idx 0 marks it as set). */
TPU_VM_INLINE void run_f64(const plan_t* p, acc_t* a, const double* x, int64_t n, int64_t idx0) {
  int64_t cnt = 0;
  double m = a->d[0];
  switch (p->kind) {
    case R_SUM: case R_MEAN: a->d[0] += sum_plain(x, n, 0); break;
    case R_NANSUM: a->d[0] += sum_notnan(x, n, 0); break;
    case R_PROD:
      if (p->odt[0] == TPU_F64 || p->odt[0] == TPU_F32) {
        for (int64_t t = 0; t < n; t++) a->d[0] *= x[t];
      } else {
        for (int64_t t = 0; t < n; t++) a->d[0] = round_to_dtype(p->odt[0], a->d[0] * x[t]);
      }
      break;
    case R_MAX: case R_MIN:
      if (p->nouts == 1) {
        double cur = a->idx < 0 ? x[0] : a->d[0];
        a->d[0] = p->kind == R_MAX ? max_values(x, n, cur) : min_values(x, n, cur);
        a->idx = 0;
      } else if (p->kind == R_MAX) {
        EXTREME_RUN(double, a->d[0], MAX_BETTER)
      } else {
        EXTREME_RUN(double, a->d[0], MIN_BETTER)
      }
      break;
    case R_ARGMAX: EXTREME_RUN(double, a->d[0], MAX_BETTER) break;
    case R_ARGMIN: EXTREME_RUN(double, a->d[0], MIN_BETTER) break;
    case R_MINMAX: MINMAX_RUN(a->d[0], a->d[1]) break;
    case R_VAR: case R_STD: {
      double mean = sum_plain(x, n, 0) / (double)n;
      var_merge(a, n, mean, sum_sqdev(x, n, mean));
      break;
    }
    case R_ALL:
      for (int64_t t = 0; t < n; t++) cnt += x[t] == 0;
      if (cnt) a->d[0] = 0;
      break;
    case R_ANY:
      for (int64_t t = 0; t < n; t++) cnt += x[t] != 0;
      if (cnt) a->d[0] = 1;
      break;
    case R_COUNT: case R_NORM0:
      for (int64_t t = 0; t < n; t++) cnt += x[t] != 0;
      a->i[0] += cnt;
      break;
    case R_NORM1: a->d[0] += sum_abs(x, n, 0); break;
    case R_NORM2: a->d[0] += sum_sq(x, n, 0); break;
    case R_NORMP: a->d[0] += sum_powabs(x, n, p->param); break;
    case R_NORMINF:
      for (int64_t t = 0; t < n; t++) m = nan_max(m, fabs(x[t]));
      a->d[0] = m;
      break;
    case R_NORMNINF:
      for (int64_t t = 0; t < n; t++) m = nan_min(m, fabs(x[t]));
      a->d[0] = m;
      break;
    case R_LSE: /* the tile's own max and shifted sum, merged */
      m = -INFINITY;
      for (int64_t t = 0; t < n; t++) m = nan_max(m, x[t]);
      lse_merge(a, m, sum_exp(x, n, lse_shift(m)));
      break;
    default: break;
  }
}

/* Integer domain: sums and products (of integer outputs) and extremes (of
 * integer inputs). */
TPU_VM_INLINE void run_i64(const plan_t* p, acc_t* a, const int64_t* x, int64_t n, int64_t idx0) {
  switch (p->kind) {
    case R_SUM: case R_NANSUM: {
      uint64_t s = 0;
      for (int64_t t = 0; t < n; t++) s += (uint64_t)x[t];
      a->i[0] = ADDW(a->i[0], s);
      break;
    }
    case R_PROD:
      for (int64_t t = 0; t < n; t++) a->i[0] = MULW(a->i[0], x[t]);
      break;
    case R_MAX: case R_ARGMAX: EXTREME_RUN(int64_t, a->i[0], MAX_BETTER) break;
    case R_MIN: case R_ARGMIN: EXTREME_RUN(int64_t, a->i[0], MIN_BETTER) break;
    case R_MINMAX: MINMAX_RUN(a->i[0], a->i[1]) break;
    default: break;
  }
}

#define EXTREME_MERGE(VAL, BETTER)                                 \
  if (b->idx >= 0 && (a->idx < 0 || BETTER(b->VAL, a->VAL))) {     \
    a->VAL = b->VAL;                                               \
    a->idx = b->idx;                                               \
  }
#define MINMAX_MERGE(V)                                            \
  if (MIN_BETTER(b->V[0], a->V[0])) a->V[0] = b->V[0];             \
  if (MAX_BETTER(b->V[1], a->V[1])) a->V[1] = b->V[1];

/* Folds partial b (covering later positions) into a. */
static void combine(const plan_t* p, acc_t* a, const acc_t* b) {
  switch (p->kind) {
    case R_SUM: case R_NANSUM: case R_MEAN: case R_COUNT:
    case R_NORM0: case R_NORM1: case R_NORM2: case R_NORMP:
      a->d[0] += b->d[0];
      a->i[0] = ADDW(a->i[0], b->i[0]);
      break;
    case R_PROD:
      a->d[0] = round_to_dtype(p->odt[0], a->d[0] * b->d[0]);
      a->i[0] = MULW(a->i[0], b->i[0]);
      break;
    case R_MAX: case R_ARGMAX:
      if (p->int_domain) { EXTREME_MERGE(i[0], MAX_BETTER) } else { EXTREME_MERGE(d[0], MAX_BETTER) }
      break;
    case R_MIN: case R_ARGMIN:
      if (p->int_domain) { EXTREME_MERGE(i[0], MIN_BETTER) } else { EXTREME_MERGE(d[0], MIN_BETTER) }
      break;
    case R_MINMAX:
      if (b->idx < 0) break;
      if (a->idx < 0) {
        *a = *b;
      } else if (p->int_domain) {
        MINMAX_MERGE(i)
      } else {
        MINMAX_MERGE(d)
      }
      break;
    case R_VAR: case R_STD: var_merge(a, b->n, b->d[0], b->d[1]); break;
    case R_ALL: a->d[0] = a->d[0] != 0 && b->d[0] != 0; break;
    case R_ANY: a->d[0] = a->d[0] != 0 || b->d[0] != 0; break;
    case R_LSE: lse_merge(a, b->d[0], b->d[1]); break;
    case R_NORMINF: a->d[0] = nan_max(a->d[0], b->d[0]); break;
    case R_NORMNINF: a->d[0] = nan_min(a->d[0], b->d[0]); break;
    default: break;
  }
}

/* Stores value slot k of the accumulator in its domain. */
static void store_val(const plan_t* p, void* o, tpu_dtype_t dt, const acc_t* a, int k) {
  if (p->int_domain) tpu_store_i64(o, dt, a->i[k]);
  else tpu_store_f64(o, dt, a->d[k]);
}

/* Writes the final result(s) of one output element. */
static void finish(const plan_t* p, const acc_t* a, char* o0, char* o1) {
  tpu_dtype_t t0 = p->odt[0], t1 = p->odt[1];
  switch (p->kind) {
    case R_SUM: case R_NANSUM: case R_PROD: store_val(p, o0, t0, a, 0); break;
    case R_MEAN: tpu_store_f64(o0, t0, a->d[0] / (double)p->n_red); break;
    case R_MAX: case R_MIN:
      store_val(p, o0, t0, a, 0);
      if (p->nouts > 1) tpu_store_i64(o1, t1, a->idx);
      break;
    case R_ARGMAX: case R_ARGMIN: tpu_store_i64(o0, t0, a->idx); break;
    case R_MINMAX:
      store_val(p, o0, t0, a, 0);
      store_val(p, o1, t1, a, 1);
      break;
    case R_VAR: case R_STD: {
      double div = (double)a->n - p->param;
      double v = a->d[1] / (div > 0 ? div : 0);
      tpu_store_f64(o0, t0, p->kind == R_STD ? sqrt(v) : v);
      if (p->nouts > 1) tpu_store_f64(o1, t1, a->n ? a->d[0] : NAN);
      break;
    }
    case R_ALL: case R_ANY: tpu_store_i64(o0, t0, a->d[0] != 0); break;
    case R_COUNT: tpu_store_i64(o0, t0, a->i[0]); break;
    case R_NORM0: tpu_store_f64(o0, t0, (double)a->i[0]); break;
    case R_NORM2: tpu_store_f64(o0, t0, sqrt(a->d[0])); break;
    case R_NORMP: tpu_store_f64(o0, t0, pow(a->d[0], 1.0 / p->param)); break;
    case R_NORM1: case R_NORMINF: case R_NORMNINF: tpu_store_f64(o0, t0, a->d[0]); break;
    case R_LSE: tpu_store_f64(o0, t0, log(a->d[1]) + lse_shift(a->d[0])); break;
    default: break;
  }
}

/* ---- driver ---- */

/* in_place: consumes n contiguous elements at src. */
TPU_VM_INLINE void run_in_place(const plan_t* p, acc_t* a, const char* src, int64_t n) {
  if (p->kind == R_SUM || p->kind == R_MEAN) {
    a->d[0] += sumrun_src(src, p->dt, n);
    return;
  }
  double cur = a->idx < 0 ? tpu_load_f64(src, p->dt) : a->d[0];
  a->d[0] = p->kind == R_MAX ? max_src(src, p->dt, n, cur) : min_src(src, p->dt, n, cur);
  a->idx = 0;
}

/* col_acc: accumulates reduction positions [rb, re) of K adjacent outputs
 * a row at a time into s->col (element-wise over the row, so it vectorizes),
 * then folds the block's values into acc. */
#define COL_LOOP(EXPR)                                   \
  for (int64_t t = 0; t < len; t++) {                    \
    const double* row = s->buf.f + t * K;                \
    for (int64_t j = 0; j < K; j++) {                    \
      double v = row[j], c = col[j];                     \
      col[j] = (EXPR);                                   \
    }                                                    \
  }
/* running max/min, NaN winning: two selects (one blend each once vectorized) */
#define COL_MAX(v, c) ((v) != (v) ? (v) : (v) > (c) ? (v) : (c))
#define COL_MIN(v, c) ((v) != (v) ? (v) : (v) < (c) ? (v) : (c))
/* the same reading contiguous rows of a floating dtype in place (sums,
 * max, min) */
#define COL_SRC(T, CONV, EXPR)                                   \
  for (int64_t t = 0; t < len; t++) {                            \
    const T* row = (const T*)(base + s->roff[t]);                \
    for (int64_t j = 0; j < K; j++) {                            \
      double v = (double)CONV(row[j]), c = col[j];               \
      col[j] = (EXPR);                                           \
    }                                                            \
  }
/* sums of rows of a 32- or 16-bit float dtype: eight rows at a time are
 * added pairwise in float (roundings far below float precision of the
 * group) before the double column sums, a third of the work per element */
#define COL_SUM8(T, CONV)                                                     \
  {                                                                           \
    int64_t t = 0;                                                            \
    for (; t + 8 <= len; t += 8) {                                            \
      const T* r[8];                                                          \
      for (int q = 0; q < 8; q++) r[q] = (const T*)(base + s->roff[t + q]);   \
      for (int64_t j = 0; j < K; j++) {                                       \
        float v = ((CONV(r[0][j]) + CONV(r[1][j])) + (CONV(r[2][j]) + CONV(r[3][j]))) + \
                  ((CONV(r[4][j]) + CONV(r[5][j])) + (CONV(r[6][j]) + CONV(r[7][j])));  \
        col[j] += (double)v;                                                  \
      }                                                                       \
    }                                                                         \
    for (; t < len; t++) {                                                    \
      const T* row = (const T*)(base + s->roff[t]);                           \
      for (int64_t j = 0; j < K; j++) col[j] += (double)CONV(row[j]);         \
    }                                                                         \
  }
#define COL_SRC_KINDS(T, CONV)                                      \
  switch (p->kind) {                                                \
    case R_MAX: COL_SRC(T, CONV, COL_MAX(v, c)) break;              \
    case R_MIN: COL_SRC(T, CONV, COL_MIN(v, c)) break;              \
    default:                                                        \
      if (sizeof(T) < 8) COL_SUM8(T, CONV)                          \
      else COL_SRC(T, CONV, c + v)                                  \
      break;                                                        \
  }
TPU_VM_INLINE void col_block(const plan_t* p, int64_t in_off, int64_t K, int64_t rb, int64_t re,
                             acc_t* acc, scratch_t* s) {
  double* col = s->col;
  const char* base = p->in + in_off;
  double init = p->kind == R_MAX ? -INFINITY : p->kind == R_MIN ? INFINITY : 0;
  for (int64_t j = 0; j < K; j++) col[j] = init;
  for (int64_t r0 = rb; r0 < re; r0 += p->len) {
    int64_t len = min64(p->len, re - r0);
    if (p->in_place) {
      tile_offsets(p, r0, len, s->roff);
      switch (p->dt) {
        case TPU_F32: COL_SRC_KINDS(float, CONV_ID) break;
        case TPU_F64: COL_SRC_KINDS(double, CONV_ID) break;
        case TPU_BF16: COL_SRC_KINDS(uint16_t, tpu_vm_bf16_to_f32) break;
        case TPU_F16: COL_SRC_KINDS(uint16_t, tpu_vm_f16_to_f32) break;
        default: break;
      }
      continue;
    }
    gather(p, base, K, r0, len, &s->buf, s->roff);
    switch (p->kind) {
      case R_SUM: case R_MEAN: COL_LOOP(c + v) break;
      case R_NANSUM: COL_LOOP(v == v ? c + v : c) break;
      case R_NORM1: COL_LOOP(c + fabs(v)) break;
      case R_NORM2: COL_LOOP(c + v * v) break;
      case R_MAX: COL_LOOP(COL_MAX(v, c)) break;
      case R_MIN: COL_LOOP(COL_MIN(v, c)) break;
      default: break;
    }
  }
  for (int64_t j = 0; j < K; j++) {
    acc_t* a = &acc[j];
    if (p->kind != R_MAX && p->kind != R_MIN) {
      a->d[0] += col[j];
    } else if (a->idx < 0 || (p->kind == R_MAX ? MAX_BETTER(col[j], a->d[0])
                                               : MIN_BETTER(col[j], a->d[0]))) {
      a->d[0] = col[j];
      a->idx = 0;
    }
  }
}

/* Whether a plan's reduction can use col_block. */
static bool col_kind(const plan_t* p) {
  if (!p->by_row || p->int_domain) return false;
  switch (p->kind) {
    case R_SUM: case R_MEAN: case R_NANSUM: case R_NORM1: case R_NORM2: return true;
    case R_MAX: case R_MIN: return p->nouts == 1;
    default: return false;
  }
}

/* Accumulates reduction positions [rb, re) of K consecutive outputs whose
 * first element starts at input offset in_off. One copy per ISA. */
#define DEFINE_REDUCE_BLOCK(SUF, ATTR)                                                        \
  ATTR static void reduce_block_##SUF(const plan_t* p, int64_t in_off, int64_t K, int64_t rb, \
                                      int64_t re, acc_t* acc, scratch_t* s) {                 \
    if (p->col_acc) {                                                                         \
      col_block(p, in_off, K, rb, re, acc, s);                                                \
      return;                                                                                 \
    }                                                                                         \
    for (int64_t r0 = rb; r0 < re; r0 += p->len) {                                            \
      int64_t len = min64(p->len, re - r0);                                                   \
      if (p->in_place) {                                                                      \
        const char* src = p->in + in_off + r0 * p->isz;                                      \
        for (int64_t j = 0; j < K; j++)                                                       \
          run_in_place(p, &acc[j], src + j * p->kstride[p->nk - 1], len);                     \
        continue;                                                                             \
      }                                                                                       \
      gather(p, p->in + in_off, K, r0, len, &s->buf, s->roff);                                \
      for (int64_t j = 0; j < K; j++) {                                                       \
        if (p->int_domain) run_i64(p, &acc[j], s->buf.i + j * len, len, r0);                  \
        else run_f64(p, &acc[j], s->buf.f + j * len, len, r0);                                \
      }                                                                                       \
    }                                                                                         \
  }
DEFINE_REDUCE_BLOCK(p, TPU_VEC_PORTABLE)
#ifdef TPU_HAVE_AVX2_BUILD
DEFINE_REDUCE_BLOCK(a, TPU_VEC_AVX2)
#endif

static void reduce_block(const plan_t* p, int64_t in_off, int64_t K, int64_t rb, int64_t re,
                         acc_t* acc, scratch_t* s) {
#ifdef TPU_HAVE_AVX2_BUILD
  if (tpu_host_isa() == TPU_ISA_AVX2) {
    reduce_block_a(p, in_off, K, rb, re, acc, s);
    return;
  }
#endif
  reduce_block_p(p, in_off, K, rb, re, acc, s);
}

/* Outputs in a block starting at o: up to kmax, within one row of the
 * innermost kept dim and before `end`. */
static int64_t block_len(const plan_t* p, int64_t o, int64_t end) {
  int64_t inner = p->ksize[p->nk - 1];
  return min64(min64(p->kmax, inner - o % inner), end - o);
}

/* Parallel body: whole reductions of outputs [begin, end). */
static void reduce_range(void* ctx, int64_t begin, int64_t end) {
  const plan_t* p = ctx;
  scratch_t s;
  acc_t acc[KMAX];
  for (int64_t o = begin; o < end;) {
    int64_t K = block_len(p, o, end), in_off, out_off[2];
    kept_offsets(p, o, &in_off, out_off);
    for (int64_t j = 0; j < K; j++) acc_init(p, &acc[j]);
    reduce_block(p, in_off, K, 0, p->n_red, acc, &s);
    for (int64_t j = 0; j < K; j++)
      finish(p, &acc[j], out_ptr(p, 0, out_off[0] + j * p->kostride[0][p->nk - 1]),
             out_ptr(p, 1, out_off[1] + j * p->kostride[1][p->nk - 1]));
    o += K;
  }
}

typedef struct {
  const plan_t* p;
  int64_t nblk, *blk_first, *blk_len;
  int64_t nch, chunk; /* chunks of `chunk` reduction positions */
  acc_t* part;        /* [nch][n_out] partials */
} split_t;

/* Parallel body: partials of (chunk, block) pairs [begin, end). */
static void split_range(void* ctx, int64_t begin, int64_t end) {
  const split_t* sp = ctx;
  const plan_t* p = sp->p;
  scratch_t s;
  for (int64_t w = begin; w < end; w++) {
    int64_t c = w / sp->nblk, b = w % sp->nblk, in_off, out_off[2];
    acc_t* acc = &sp->part[c * p->n_out + sp->blk_first[b]];
    kept_offsets(p, sp->blk_first[b], &in_off, out_off);
    for (int64_t j = 0; j < sp->blk_len[b]; j++) acc_init(p, &acc[j]);
    reduce_block(p, in_off, sp->blk_len[b], c * sp->chunk,
                 min64(p->n_red, (c + 1) * sp->chunk), acc, &s);
  }
}

/* Column reductions over contiguous rows (sum over dim 0 and the like):
 * splitting the outputs between threads would make each thread read a
 * narrow strided column band, which the caches and prefetchers handle far
 * worse than whole rows. They split the reduction into COL_SPLIT chunks of
 * rows instead, every chunk covering all outputs, when the partials stay
 * small. */
#define COL_SPLIT 16
#define COL_SPLIT_MAX_BLOCKS 64

static bool col_split(const plan_t* p) {
  return p->col_acc && p->in_place && p->n_red >= 4 * COL_SPLIT &&
         p->n_out <= COL_SPLIT_MAX_BLOCKS * KMAX &&
         p->n_out * p->n_red >= 2 * GRAIN;
}

static tpu_status_t plan_run(const plan_t* p, const char* op) {
  if (p->n_out == 0) return TPU_OK;
  bool cols = col_split(p);
  if (!cols && (p->n_out > SPLIT_MAX_OUTS || p->n_red < 2 * SPLIT_CHUNK)) {
    int64_t grain = GRAIN / (p->n_red > 0 ? p->n_red : 1);
    tpu_parallel_for(p->n_out, grain > 0 ? grain : 1, reduce_range, (void*)p);
    return TPU_OK;
  }
  split_t sp = {.p = p};
  if (cols) { /* 2 to COL_SPLIT chunks of at least ~256K elements (from the shape only) */
    int64_t nch = min64(COL_SPLIT, p->n_out * p->n_red / (GRAIN * 8));
    nch = nch < 2 ? 2 : nch;
    sp.chunk = (p->n_red + nch - 1) / nch;
  } else {
    sp.chunk = SPLIT_CHUNK;
  }
  sp.nch = (p->n_red + sp.chunk - 1) / sp.chunk;
  int64_t maxblk = 0;
  for (int64_t o = 0; o < p->n_out; o += block_len(p, o, p->n_out)) maxblk++;
  sp.blk_first = malloc(sizeof(int64_t) * 2 * (size_t)maxblk);
  sp.part = malloc((size_t)(p->n_out * sp.nch) * sizeof(acc_t));
  if (!sp.part || !sp.blk_first) {
    free(sp.part);
    free(sp.blk_first);
    return TPU_ERR(RESOURCE_EXHAUSTED, "%s(): out of host memory for %lld partial results", op,
                   (long long)(p->n_out * sp.nch));
  }
  sp.blk_len = sp.blk_first + maxblk;
  for (int64_t o = 0; o < p->n_out; o += sp.blk_len[sp.nblk++]) {
    sp.blk_first[sp.nblk] = o;
    sp.blk_len[sp.nblk] = block_len(p, o, p->n_out);
  }
  tpu_parallel_for(sp.nch * sp.nblk, 1, split_range, &sp);
  bool adds = (p->kind == R_SUM || p->kind == R_MEAN) && !p->int_domain;
  for (int64_t c = 1; adds && c < sp.nch; c++) /* chunk by chunk, in order */
    for (int64_t o = 0; o < p->n_out; o++) sp.part[o].d[0] += sp.part[c * p->n_out + o].d[0];
  for (int64_t o = 0; o < p->n_out; o++) {
    acc_t* a = &sp.part[o];
    for (int64_t c = 1; !adds && c < sp.nch; c++) combine(p, a, &sp.part[c * p->n_out + o]);
    int64_t in_off, out_off[2];
    kept_offsets(p, o, &in_off, out_off);
    finish(p, a, out_ptr(p, 0, out_off[0]), out_ptr(p, 1, out_off[1]));
  }
  free(sp.part);
  free(sp.blk_first);
  return TPU_OK;
}

/* Reductions that pick elements (and compare in the input's domain). */
static bool is_extreme(rkind_t k) {
  return k == R_MAX || k == R_MIN || k == R_ARGMAX || k == R_ARGMIN || k == R_MINMAX;
}

/* A reduction of args[0] over the dims named by args[dim_arg] (-1: all dims)
 * into call->outs. */
static tpu_status_t reduce(const tpu_call_t* c, const char* op, rkind_t kind, int dim_arg,
                           double param) {
  if ((kind == R_SUM || kind == R_MEAN || kind == R_PROD || kind == R_LSE) &&
      tpu_call_has_complex(c))
    return tpu_complex_reduce(c, dim_arg);
  if ((kind == R_ALL || kind == R_ANY || kind == R_COUNT) && tpu_call_has_complex(c))
    return tpu_complex_on_truth(c);
  const tpu_tensor_t* in = tpu_arg_tensor(c, 0);
  int nouts = kind == R_MINMAX ? 2 : (c->nouts > 1 ? 2 : 1);
  if (!in || c->nouts < nouts)
    return TPU_ERR(INTERNAL, "%s(): expected an input tensor and %d output(s)", op, nouts);
  bool red[TPU_MAX_DIMS], explicit_dims;
  TPU_RETURN_IF_ERROR(
      parse_dims(op, c, dim_arg, in->ndim, kind == R_ALL || kind == R_ANY, red, &explicit_dims));
  bool keep_order = kind == R_ARGMAX || kind == R_ARGMIN ||
                    ((kind == R_MAX || kind == R_MIN) && nouts > 1);
  plan_t p;
  TPU_RETURN_IF_ERROR(plan_build(&p, op, kind, in, red, c->outs, nouts, keep_order, false));
  p.param = param;
  if (kind == R_SUM || kind == R_NANSUM || kind == R_PROD)
    p.int_domain = !tpu_dtype_is_float(p.odt[0]);
  else if (is_extreme(kind))
    p.int_domain = !tpu_dtype_is_float(in->dtype);
  p.col_acc = col_kind(&p);
  if (p.col_acc) { /* whole rows of up to KMAX outputs stream through the tile */
    p.kmax = min64(KMAX, p.ksize[p.nk - 1]);
    p.len = min64(p.n_red, TILE / p.kmax);
  }
  p.in_place = (kind == R_SUM || kind == R_MEAN || ((kind == R_MAX || kind == R_MIN) && nouts == 1)) &&
               !p.int_domain && tpu_dtype_is_float(in->dtype) &&
               (p.col_acc ? p.kstride[p.nk - 1] == p.isz
                          : !p.by_row && p.nr == 1 && p.rstride[0] == p.isz);
  if (p.in_place && !p.col_acc) { /* rows are read where they lie: no tile to fill */
    p.len = p.n_red > 0 ? p.n_red : 1;
    p.kmax = KMAX;
  } else if (p.in_place) { /* column sums: as many rows per pass as roff holds */
    p.len = min64(p.n_red, TILE);
  }
  if (p.n_red == 0 && (is_extreme(kind) || kind == R_NORMINF || kind == R_NORMNINF)) {
    if (kind == R_NORMINF || kind == R_NORMNINF)
      return TPU_ERR(INVALID_ARGUMENT,
                     "linalg.vector_norm cannot compute the %s norm on an empty tensor because "
                     "the operation does not have an identity",
                     kind == R_NORMINF ? "inf" : "-inf");
    for (int d = 0; explicit_dims && d < in->ndim; d++)
      if (red[d] && in->sizes[d] == 0)
        return TPU_ERR(OUT_OF_RANGE, "%s(): Expected reduction dim %d to have non-zero size.", op,
                       d);
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s(): Expected reduction dim to be specified for input.numel() == 0. Specify "
                   "the reduction dim with the 'dim' argument.",
                   op);
  }
  return plan_run(&p, op);
}

/* ---- scans ---- */
static double log_add_exp(double a, double b) {
  if (a != a || b != b) return a + b;
  double hi = a > b ? a : b, lo = a > b ? b : a;
  if (lo == hi && isinf(lo)) return lo; /* both +inf or both -inf */
  return hi + log1p(exp(lo - hi));
}

typedef struct {
  double d;
  int64_t i, idx;
} scan_state_t;

/* cummax/cummin: NaN always takes over; ties move to the later element */
#define CUM_EXTREME(VAL, X, CMP, STORE)                                           \
  for (int64_t t = 0; t < len; t++) {                                             \
    if (st.idx < 0 || X[t] != X[t] || (VAL == VAL && X[t] CMP VAL)) {             \
      VAL = X[t];                                                                 \
      st.idx = r0 + t;                                                            \
    }                                                                             \
    STORE(o0 + (r0 + t) * p->oscan[0], p->odt[0], VAL);                           \
    tpu_store_i64(o1 + (r0 + t) * p->oscan[1], p->odt[1], st.idx);                \
  }
#define CUM_FOLD(VAL, X, EXPR, STORE)                                             \
  for (int64_t t = 0; t < len; t++) {                                             \
    VAL = EXPR;                                                                   \
    STORE(o0 + (r0 + t) * p->oscan[0], p->odt[0], VAL);                           \
  }

/* Parallel body: scans of lines [begin, end). */
static void scan_range(void* ctx, int64_t begin, int64_t end) {
  const plan_t* p = ctx;
  scratch_t s;
  const double* x = s.buf.f;
  const int64_t* xi = s.buf.i;
  for (int64_t line = begin; line < end; line++) {
    int64_t in_off, out_off[2];
    kept_offsets(p, line, &in_off, out_off);
    char* o0 = out_ptr(p, 0, out_off[0]);
    char* o1 = out_ptr(p, 1, out_off[1]);
    scan_state_t st = {p->kind == S_CUMPROD ? 1.0 : p->kind == S_LOGCUMSUMEXP ? -INFINITY : 0.0,
                       p->kind == S_CUMPROD ? 1 : 0, -1};
    for (int64_t r0 = 0; r0 < p->n_red; r0 += p->len) {
      int64_t len = min64(p->len, p->n_red - r0);
      gather(p, p->in + in_off, 1, r0, len, &s.buf, s.roff);
      switch (p->kind) {
        case S_CUMSUM:
          if (p->int_domain) { CUM_FOLD(st.i, xi, ADDW(st.i, xi[t]), tpu_store_i64) }
          else { CUM_FOLD(st.d, x, st.d + x[t], tpu_store_f64) }
          break;
        case S_CUMPROD:
          if (p->int_domain) { CUM_FOLD(st.i, xi, MULW(st.i, xi[t]), tpu_store_i64) }
          else { CUM_FOLD(st.d, x, st.d * x[t], tpu_store_f64) }
          break;
        case S_LOGCUMSUMEXP: CUM_FOLD(st.d, x, log_add_exp(st.d, x[t]), tpu_store_f64) break;
        case S_CUMMAX:
          if (p->int_domain) { CUM_EXTREME(st.i, xi, >=, tpu_store_i64) }
          else { CUM_EXTREME(st.d, x, >=, tpu_store_f64) }
          break;
        case S_CUMMIN:
          if (p->int_domain) { CUM_EXTREME(st.i, xi, <=, tpu_store_i64) }
          else { CUM_EXTREME(st.d, x, <=, tpu_store_f64) }
          break;
        default: break;
      }
    }
  }
}

/* A scan of args[0] along the dim in args[dim_arg] into outs[0..nouts). */
static tpu_status_t scan(const tpu_call_t* c, const char* op, rkind_t kind, int dim_arg,
                         const tpu_tensor_t* outs, int nouts) {
  if (kind == S_CUMSUM || kind == S_CUMPROD || kind == S_LOGCUMSUMEXP) TPU_ROUTE_COMPLEX(c);
  const tpu_tensor_t* in = tpu_arg_tensor(c, 0);
  if (!in || !outs || tpu_arg_is_none(c, dim_arg))
    return TPU_ERR(INTERNAL, "%s(): expected an input tensor, a dim and outputs", op);
  bool red[TPU_MAX_DIMS], explicit_dims;
  TPU_RETURN_IF_ERROR(parse_dims(op, c, dim_arg, in->ndim, false, red, &explicit_dims));
  plan_t p;
  TPU_RETURN_IF_ERROR(plan_build(&p, op, kind, in, red, outs, nouts, true, true));
  if (kind == S_CUMSUM || kind == S_CUMPROD) p.int_domain = !tpu_dtype_is_float(p.odt[0]);
  else if (kind != S_LOGCUMSUMEXP) p.int_domain = !tpu_dtype_is_float(in->dtype);
  if (p.n_out == 0 || p.n_red == 0) return TPU_OK;
  int64_t grain = GRAIN / p.n_red;
  tpu_parallel_for(p.n_out, grain > 0 ? grain : 1, scan_range, &p);
  return TPU_OK;
}

/* cummax(self, dim) and cummax.out(self, dim, values, indices) return
 * (values, indices); _cummax_helper(self, values, indices, dim) returns
 * nothing and fills its arguments. */
static tpu_status_t cum_extreme(const tpu_call_t* c, const char* op, rkind_t kind) {
  if (c->nouts >= 2) return scan(c, op, kind, 1, c->outs, 2);
  const tpu_tensor_t* v = tpu_arg_tensor(c, 1);
  const tpu_tensor_t* i = tpu_arg_tensor(c, 2);
  if (!v || !i) return TPU_ERR(INTERNAL, "%s(): expected values and indices tensors", op);
  tpu_tensor_t outs[2] = {*v, *i};
  return scan(c, op, kind, 3, outs, 2);
}

/* ---- kernels ---- */
/* Argument layouts: full reductions have no dim argument; the others take
 * their dim(s) at args[1] (norms at args[2], after the order). */
tpu_status_t tpu_k_sum(const tpu_call_t* c) { return reduce(c, "sum", R_SUM, -1, 0); }
tpu_status_t tpu_k_sum_dim(const tpu_call_t* c) { return reduce(c, "sum", R_SUM, 1, 0); }
tpu_status_t tpu_k_nansum(const tpu_call_t* c) { return reduce(c, "nansum", R_NANSUM, 1, 0); }
tpu_status_t tpu_k_mean(const tpu_call_t* c) { return reduce(c, "mean", R_MEAN, -1, 0); }
tpu_status_t tpu_k_mean_dim(const tpu_call_t* c) { return reduce(c, "mean", R_MEAN, 1, 0); }
tpu_status_t tpu_k_prod(const tpu_call_t* c) { return reduce(c, "prod", R_PROD, -1, 0); }
tpu_status_t tpu_k_prod_dim(const tpu_call_t* c) { return reduce(c, "prod", R_PROD, 1, 0); }
tpu_status_t tpu_k_amax(const tpu_call_t* c) { return reduce(c, "amax", R_MAX, 1, 0); }
tpu_status_t tpu_k_amin(const tpu_call_t* c) { return reduce(c, "amin", R_MIN, 1, 0); }
tpu_status_t tpu_k_max(const tpu_call_t* c) { return reduce(c, "max", R_MAX, -1, 0); }
tpu_status_t tpu_k_max_dim(const tpu_call_t* c) { return reduce(c, "max", R_MAX, 1, 0); }
tpu_status_t tpu_k_min(const tpu_call_t* c) { return reduce(c, "min", R_MIN, -1, 0); }
tpu_status_t tpu_k_min_dim(const tpu_call_t* c) { return reduce(c, "min", R_MIN, 1, 0); }
tpu_status_t tpu_k_argmax(const tpu_call_t* c) { return reduce(c, "argmax", R_ARGMAX, 1, 0); }
tpu_status_t tpu_k_argmin(const tpu_call_t* c) { return reduce(c, "argmin", R_ARGMIN, 1, 0); }
tpu_status_t tpu_k_aminmax(const tpu_call_t* c) { return reduce(c, "aminmax", R_MINMAX, 1, 0); }
tpu_status_t tpu_k_all(const tpu_call_t* c) { return reduce(c, "all", R_ALL, -1, 0); }
tpu_status_t tpu_k_all_dim(const tpu_call_t* c) { return reduce(c, "all", R_ALL, 1, 0); }
tpu_status_t tpu_k_any(const tpu_call_t* c) { return reduce(c, "any", R_ANY, -1, 0); }
tpu_status_t tpu_k_any_dim(const tpu_call_t* c) { return reduce(c, "any", R_ANY, 1, 0); }
tpu_status_t tpu_k_count_nonzero(const tpu_call_t* c) { return reduce(c, "count_nonzero", R_COUNT, 1, 0); }
tpu_status_t tpu_k_logsumexp(const tpu_call_t* c) { return reduce(c, "logsumexp", R_LSE, 1, 0); }

/* var/std(self, dim=None, *, correction=None, keepdim=False); the _mean
 * variants also return the mean as outs[1]. */
tpu_status_t tpu_k_var(const tpu_call_t* c) {
  TPU_ROUTE_COMPLEX(c);
  return reduce(c, "var", R_VAR, 1, tpu_arg_is_none(c, 2) ? 1.0 : tpu_arg_f64(c, 2, 1.0));
}
tpu_status_t tpu_k_std(const tpu_call_t* c) {
  TPU_ROUTE_COMPLEX(c);
  return reduce(c, "std", R_STD, 1, tpu_arg_is_none(c, 2) ? 1.0 : tpu_arg_f64(c, 2, 1.0));
}

/* linalg_vector_norm(self, ord=2, dim=None, keepdim, dtype) and
 * norm(self, p=None (2), dim, keepdim, ...). */
tpu_status_t tpu_k_norm(const tpu_call_t* c) {
  if (tpu_call_has_complex(c)) return tpu_complex_on_abs(c);
  double ord = tpu_arg_is_none(c, 1) ? 2.0 : tpu_arg_f64(c, 1, 2.0);
  rkind_t kind = ord == 0 ? R_NORM0 : ord == 1 ? R_NORM1 : ord == 2 ? R_NORM2
               : ord == INFINITY ? R_NORMINF : ord == -INFINITY ? R_NORMNINF : R_NORMP;
  return reduce(c, "linalg.vector_norm", kind, 2, ord);
}

#define OUTS1(c) ((c)->nouts >= 1 ? (c)->outs : NULL)
tpu_status_t tpu_k_cumsum(const tpu_call_t* c) { return scan(c, "cumsum", S_CUMSUM, 1, OUTS1(c), 1); }
tpu_status_t tpu_k_cumprod(const tpu_call_t* c) { return scan(c, "cumprod", S_CUMPROD, 1, OUTS1(c), 1); }
tpu_status_t tpu_k_logcumsumexp(const tpu_call_t* c) {
  return scan(c, "logcumsumexp", S_LOGCUMSUMEXP, 1, OUTS1(c), 1);
}
tpu_status_t tpu_k_cummax(const tpu_call_t* c) { return cum_extreme(c, "cummax", S_CUMMAX); }
tpu_status_t tpu_k_cummin(const tpu_call_t* c) { return cum_extreme(c, "cummin", S_CUMMIN); }
