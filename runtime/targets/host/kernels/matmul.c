/* Matrix multiply: tpu_gemm and the kernels built on it (mm, bmm, addmm,
 * baddbmm, addbmm, addmv, mv, dot).
 *
 * Float path (float32, bfloat16, float16): C is cut into tiles of mc x nc
 * that the thread pool computes independently. For each tile, K is walked in
 * blocks of KC: the A block (mc x kc) is packed into panels of MR rows and
 * the B block (kc x nc) into panels of NR columns, converted to float and
 * zero padded, and the micro-kernel multiplies one MR x kc panel by one
 * kc x NR panel into a float accumulator tile. After the last block the tile
 * is scaled, combined with beta * self and stored once (one rounding for
 * bf16/f16). Every element's sum runs over k in the same order whatever the
 * tiling, so results do not depend on the thread split. Matrix-vector
 * shapes (m == 1 or n == 1) skip packing: dot products of contiguous rows,
 * or column-by-column axpys when the matrix is stored the other way.
 *
 * Float64 and integer path: tiles of RB rows x NB columns accumulated with
 * scalar axpys over k, in double or in wrapping 64-bit integer arithmetic.
 */
#include <stdlib.h>

#include "kernels.h"
#include "matmul.h"

/* ---- strided run conversions ---- */
#define CONV_ID(x) (x)
#define CONV_BOOL(x) ((x) != 0)
#define LOAD_LOOP(T, CONV)                                                        \
  do {                                                                            \
    const T* s = (const T*)src;                                                   \
    for (int64_t i = 0; i < n; i++) dst[i * dstride] = (CT)CONV(s[i * sstride]); \
  } while (0)
#define STORE_LOOP(T, CONV)                                                       \
  do {                                                                            \
    T* d = (T*)dst;                                                               \
    for (int64_t i = 0; i < n; i++) d[i * dstride] = CONV(src[i]);                \
  } while (0)
#define TO_U8(x) ((uint8_t)(int64_t)(x))
#define TO_I8(x) ((int8_t)(int64_t)(x))
#define TO_I16(x) ((int16_t)(int64_t)(x))
#define TO_I32(x) ((int32_t)(int64_t)(x))
#define TO_I64(x) ((int64_t)(x))
#define TO_F16(x) tpu_f32_to_f16((float)(x))
#define TO_BF16(x) tpu_f32_to_bf16((float)(x))
#define TO_F32(x) ((float)(x))
#define TO_F64(x) ((double)(x))
#define TO_BOOL(x) ((uint8_t)((x) != 0))

/* Defines tpu_run_load_SUF / tpu_run_store_SUF for compute type CT whose
 * storage dtype is NATIVE (plain copies take memcpy). */
#define DEFINE_RUN_IO(SUF, CT, NATIVE)                                                     \
  void tpu_run_load_##SUF(CT* dst, int64_t dstride, const void* src, int64_t sstride,      \
                          tpu_dtype_t dt, int64_t n) {                                      \
    if (dt == NATIVE && dstride == 1 && sstride == 1) {                                    \
      memcpy(dst, src, (size_t)n * sizeof(CT));                                            \
      return;                                                                               \
    }                                                                                       \
    switch (dt) {                                                                           \
      case TPU_U8: LOAD_LOOP(uint8_t, CONV_ID); break;                                      \
      case TPU_I8: LOAD_LOOP(int8_t, CONV_ID); break;                                       \
      case TPU_I16: LOAD_LOOP(int16_t, CONV_ID); break;                                     \
      case TPU_I32: LOAD_LOOP(int32_t, CONV_ID); break;                                     \
      case TPU_I64: LOAD_LOOP(int64_t, CONV_ID); break;                                     \
      case TPU_F16: LOAD_LOOP(uint16_t, tpu_f16_to_f32); break;                             \
      case TPU_BF16: LOAD_LOOP(uint16_t, tpu_bf16_to_f32); break;                           \
      case TPU_F32: LOAD_LOOP(float, CONV_ID); break;                                       \
      case TPU_F64: LOAD_LOOP(double, CONV_ID); break;                                      \
      case TPU_BOOL: LOAD_LOOP(uint8_t, CONV_BOOL); break;                                  \
      default: break;                                                                       \
    }                                                                                       \
  }                                                                                         \
  void tpu_run_store_##SUF(void* dst, int64_t dstride, tpu_dtype_t dt, const CT* src,      \
                           int64_t n) {                                                     \
    if (dt == NATIVE && dstride == 1) {                                                    \
      memcpy(dst, src, (size_t)n * sizeof(CT));                                            \
      return;                                                                               \
    }                                                                                       \
    switch (dt) {                                                                           \
      case TPU_U8: STORE_LOOP(uint8_t, TO_U8); break;                                       \
      case TPU_I8: STORE_LOOP(int8_t, TO_I8); break;                                        \
      case TPU_I16: STORE_LOOP(int16_t, TO_I16); break;                                     \
      case TPU_I32: STORE_LOOP(int32_t, TO_I32); break;                                     \
      case TPU_I64: STORE_LOOP(int64_t, TO_I64); break;                                     \
      case TPU_F16: STORE_LOOP(uint16_t, TO_F16); break;                                    \
      case TPU_BF16: STORE_LOOP(uint16_t, TO_BF16); break;                                  \
      case TPU_F32: STORE_LOOP(float, TO_F32); break;                                       \
      case TPU_F64: STORE_LOOP(double, TO_F64); break;                                      \
      case TPU_BOOL: STORE_LOOP(uint8_t, TO_BOOL); break;                                   \
      default: break;                                                                       \
    }                                                                                       \
  }

#define CT float
DEFINE_RUN_IO(f32, float, TPU_F32)
#undef CT
#define CT double
DEFINE_RUN_IO(f64, double, TPU_F64)
#undef CT
#define CT int64_t
DEFINE_RUN_IO(i64, int64_t, TPU_I64)
#undef CT

/* ---- problem description ---- */
typedef struct {
  char* data;
  tpu_dtype_t dt;
  int64_t esz;             /* bytes per element */
  int64_t nb, nr, nc;      /* sizes: batch, rows, columns */
  int64_t sb, sr, sc;      /* strides in elements */
} mat_t;

typedef struct {
  int64_t batch, m, n, k;
  mat_t a, b, c, self;
  bool use_self;    /* beta != 0: self takes part */
  bool has_product; /* k > 0 and alpha != 0: a @ b takes part */
  double alpha, beta;
} gemm_t;

static inline char* mat_ptr(const mat_t* x, int64_t b, int64_t r, int64_t c) {
  return x->data + (b * x->sb + r * x->sr + c * x->sc) * x->esz;
}

/* Views t (2-d, or 3-d when batched) as a mat_t; size-1 dims get stride 0
 * (as in mat_broadcast, so an in-place self compares equal to c). */
static void mat_from(mat_t* x, const tpu_tensor_t* t, bool batched) {
  int o = batched ? 1 : 0;
  x->data = t->data;
  x->dt = t->dtype;
  x->esz = (int64_t)tpu_dtype_size(t->dtype);
  x->nb = batched ? t->sizes[0] : 1;
  x->sb = batched && x->nb != 1 ? t->strides[0] : 0;
  x->nr = t->sizes[o];
  x->sr = x->nr != 1 ? t->strides[o] : 0;
  x->nc = t->sizes[o + 1];
  x->sc = x->nc != 1 ? t->strides[o + 1] : 0;
}

/* Views t broadcast to batch x rows x cols (right-aligned, size-1 dims get
 * stride 0); false when it does not broadcast. */
static bool mat_broadcast(mat_t* x, const tpu_tensor_t* t, int64_t nb, int64_t nr, int64_t nc) {
  const int64_t want[3] = {nb, nr, nc};
  int64_t st[3] = {0, 0, 0};
  if (t->ndim > 3) return false;
  for (int d = 0; d < t->ndim; d++) {
    int wd = 3 - t->ndim + d;
    int64_t sz = t->sizes[d];
    if (sz == want[wd]) st[wd] = sz == 1 ? 0 : t->strides[d];
    else if (sz != 1) return false;
  }
  x->data = t->data;
  x->dt = t->dtype;
  x->esz = (int64_t)tpu_dtype_size(t->dtype);
  x->nb = nb;
  x->nr = nr;
  x->nc = nc;
  x->sb = st[0];
  x->sr = st[1];
  x->sc = st[2];
  return true;
}

/* Byte range [lo, hi) a view touches; empty (lo == hi) for no elements. */
static void mat_span(const mat_t* x, uintptr_t* lo, uintptr_t* hi) {
  *lo = *hi = (uintptr_t)x->data;
  if (x->nb == 0 || x->nr == 0 || x->nc == 0) return;
  int64_t last = (x->nb - 1) * x->sb + (x->nr - 1) * x->sr + (x->nc - 1) * x->sc;
  *hi = (uintptr_t)(x->data + (last + 1) * x->esz);
}

static bool mats_overlap(const mat_t* x, const mat_t* y) {
  uintptr_t xl, xh, yl, yh;
  mat_span(x, &xl, &xh);
  mat_span(y, &yl, &yh);
  return xl < xh && yl < yh && xl < yh && yl < xh;
}

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/* ---- float micro-kernels ----
 * tile: c[i * ldc + j] += sum_k a[k * MR + i] * b[k * NR + j] for an MR x NR
 * tile, NR = 2 vectors; dot: sum_k x[k] * y[k]. GCC vector extensions keep
 * the accumulators in registers; the portable instances use 128-bit vectors
 * (SSE2 on x86-64, scalar code elsewhere), the x86 ones 256-bit AVX2 with
 * fused multiply-add. */
typedef struct {
  int mr, nr;
  void (*tile)(int64_t kc, const float* a, const float* b, float* c, int64_t ldc);
  float (*dot)(const float* x, const float* y, int64_t n);
} ukernel_t;

typedef float vf4_t __attribute__((vector_size(16)));
typedef float vf8_t __attribute__((vector_size(32)));
#define SPLAT4(x) ((vf4_t){x, x, x, x})
#define SPLAT8(x) ((vf8_t){x, x, x, x, x, x, x, x})

#define DEFINE_UKERNEL(NAME, MR, VT, VL, SPLAT, ATTR)                                     \
  ATTR static void NAME(int64_t kc, const float* restrict a, const float* restrict b,     \
                        float* restrict c, int64_t ldc) {                                  \
    VT acc[MR][2];                                                                         \
    for (int i = 0; i < MR; i++) acc[i][0] = acc[i][1] = SPLAT(0.0f);                      \
    for (int64_t k = 0; k < kc; k++) {                                                     \
      VT b0, b1;                                                                           \
      memcpy(&b0, b, sizeof b0);                                                           \
      memcpy(&b1, b + VL, sizeof b1);                                                      \
      _Pragma("GCC unroll 8") for (int i = 0; i < MR; i++) {                               \
        VT av = SPLAT(a[i]);                                                               \
        acc[i][0] += av * b0;                                                              \
        acc[i][1] += av * b1;                                                              \
      }                                                                                    \
      a += MR;                                                                             \
      b += 2 * VL;                                                                         \
    }                                                                                      \
    for (int i = 0; i < MR; i++) {                                                         \
      for (int h = 0; h < 2; h++) {                                                        \
        VT t;                                                                              \
        memcpy(&t, c + i * ldc + h * VL, sizeof t);                                        \
        t += acc[i][h];                                                                    \
        memcpy(c + i * ldc + h * VL, &t, sizeof t);                                        \
      }                                                                                    \
    }                                                                                      \
  }

/* four vector accumulators, summed in a fixed order */
#define DEFINE_DOT(NAME, VT, VL, SPLAT, ATTR)                                             \
  ATTR static float NAME(const float* restrict x, const float* restrict y, int64_t n) {    \
    VT acc[4] = {SPLAT(0.0f), SPLAT(0.0f), SPLAT(0.0f), SPLAT(0.0f)};                      \
    int64_t k = 0;                                                                         \
    for (; k + 4 * VL <= n; k += 4 * VL) {                                                 \
      _Pragma("GCC unroll 4") for (int h = 0; h < 4; h++) {                                \
        VT xv, yv;                                                                         \
        memcpy(&xv, x + k + h * VL, sizeof xv);                                            \
        memcpy(&yv, y + k + h * VL, sizeof yv);                                            \
        acc[h] += xv * yv;                                                                 \
      }                                                                                    \
    }                                                                                      \
    VT t = (acc[0] + acc[1]) + (acc[2] + acc[3]);                                          \
    float s = 0;                                                                           \
    for (int l = 0; l < VL; l++) s += t[l];                                                \
    for (; k < n; k++) s += x[k] * y[k];                                                   \
    return s;                                                                              \
  }

DEFINE_UKERNEL(tile_portable, 4, vf4_t, 4, SPLAT4, )
DEFINE_DOT(dot_portable, vf4_t, 4, SPLAT4, )
static const ukernel_t k_portable = {4, 8, tile_portable, dot_portable};

#if defined(__GNUC__) && !defined(__clang__) && (defined(__x86_64__) || defined(__i386__))
#define HAVE_AVX2_KERNEL 1
#define AVX2_ATTR __attribute__((target("avx2,fma"), optimize("fp-contract=fast")))
DEFINE_UKERNEL(tile_avx2, 6, vf8_t, 8, SPLAT8, AVX2_ATTR)
DEFINE_DOT(dot_avx2, vf8_t, 8, SPLAT8, AVX2_ATTR)
static const ukernel_t k_avx2 = {6, 16, tile_avx2, dot_avx2};
#endif

static _Atomic int g_simd_enabled = 1;

void tpu_gemm_set_simd(bool enable) { g_simd_enabled = enable; }

static const ukernel_t* pick_ukernel(void) {
#ifdef HAVE_AVX2_KERNEL
  static _Atomic int has_avx2 = -1; /* probed once */
  if (has_avx2 < 0) {
    __builtin_cpu_init();
    has_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }
  if (g_simd_enabled && has_avx2) return &k_avx2;
#endif
  return &k_portable;
}

/* ---- float path ---- */
enum { KC = 256, MC = 96, NC = 512 };

/* Packs rows [0, len) x k [0, kc) of a strided matrix (element (l, k) at src
 * + (l * sl + k * sk) elements) as float panels of w rows: element (l, k)
 * goes to dst[(l / w) * w * kc + k * w + l % w]; missing rows of the last
 * panel are zero. */
static void pack_panels(float* dst, const char* src, const mat_t* x, int64_t sl, int64_t sk,
                        int64_t len, int64_t kc, int w) {
  for (int64_t p = 0; p < len; p += w) {
    int64_t rows = min64(w, len - p);
    float* d = dst + p * kc;
    const char* s = src + p * sl * x->esz;
    if (rows < w) memset(d, 0, sizeof(float) * (size_t)(w * kc));
    if (sl == 1 && sk != 1) { /* rows are contiguous: copy one k at a time */
      for (int64_t k = 0; k < kc; k++)
        tpu_run_load_f32(d + k * w, 1, s + k * sk * x->esz, sl, x->dt, rows);
    } else {
      for (int64_t l = 0; l < rows; l++)
        tpu_run_load_f32(d + l, w, s + l * sl * x->esz, sk, x->dt, kc);
    }
  }
}

typedef struct {
  const gemm_t* g;
  const ukernel_t* uk;
  int64_t mc, nc; /* tile size */
  int64_t tm, tn; /* tiles along M and N */
  _Atomic int oom;
} ftile_job_t;

/* c[tile row i] = alpha * acc + beta * self for rows [i0, i0 + mlen) and
 * columns [j0, j0 + nlen); `row` is scratch for two rows. */
static void ftile_store(const gemm_t* g, int64_t bi, int64_t i0, int64_t j0, int64_t mlen,
                        int64_t nlen, const float* acc, int64_t ldc, float* row) {
  const float al = (float)g->alpha, be = (float)g->beta;
  float* srow = row + nlen;
  for (int64_t i = 0; i < mlen; i++) {
    const float* ar = acc + i * ldc;
    if (g->use_self) {
      tpu_run_load_f32(srow, 1, mat_ptr(&g->self, bi, i0 + i, j0), g->self.sc, g->self.dt, nlen);
      if (g->has_product)
        for (int64_t j = 0; j < nlen; j++) row[j] = al * ar[j] + be * srow[j];
      else
        for (int64_t j = 0; j < nlen; j++) row[j] = be * srow[j];
    } else if (g->has_product) {
      for (int64_t j = 0; j < nlen; j++) row[j] = al * ar[j];
    } else {
      memset(row, 0, sizeof(float) * (size_t)nlen);
    }
    tpu_run_store_f32(mat_ptr(&g->c, bi, i0 + i, j0), g->c.sc, g->c.dt, row, nlen);
  }
}

static void ftile_range(void* ctx, int64_t begin, int64_t end) {
  ftile_job_t* job = ctx;
  const gemm_t* g = job->g;
  const int mr = job->uk->mr, nr = job->uk->nr;
  const int64_t kmax = g->has_product ? min64(KC, g->k) : 0;
  const int64_t mcp = round_up(job->mc, mr), ncp = round_up(job->nc, nr);
  size_t floats = (size_t)(mcp * kmax + kmax * ncp + mcp * ncp + 2 * ncp);
  float* buf = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
  if (!buf) {
    job->oom = 1;
    return;
  }
  float* pa = buf;
  float* pb = pa + mcp * kmax;
  float* acc = pb + kmax * ncp;
  float* row = acc + mcp * ncp;
  for (int64_t t = begin; t < end; t++) {
    int64_t bi = t / (job->tm * job->tn), r = t % (job->tm * job->tn);
    int64_t i0 = (r / job->tn) * job->mc, j0 = (r % job->tn) * job->nc;
    int64_t mlen = min64(job->mc, g->m - i0), nlen = min64(job->nc, g->n - j0);
    int64_t mp = round_up(mlen, mr), np = round_up(nlen, nr);
    memset(acc, 0, sizeof(float) * (size_t)(mp * np));
    for (int64_t pc = 0; pc < (g->has_product ? g->k : 0); pc += KC) {
      int64_t kc = min64(KC, g->k - pc);
      pack_panels(pa, mat_ptr(&g->a, bi, i0, pc), &g->a, g->a.sr, g->a.sc, mlen, kc, mr);
      pack_panels(pb, mat_ptr(&g->b, bi, pc, j0), &g->b, g->b.sc, g->b.sr, nlen, kc, nr);
      for (int64_t jr = 0; jr < np; jr += nr)
        for (int64_t ir = 0; ir < mp; ir += mr)
          job->uk->tile(kc, pa + ir * kc, pb + jr * kc, acc + ir * np + jr, np);
    }
    ftile_store(g, bi, i0, j0, mlen, nlen, acc, np, row);
  }
  free(buf);
}

/* Work (multiply-adds) below which a product runs on the calling thread. */
#define PARALLEL_MIN_WORK (1 << 17)

/* Matrix-vector products (m == 1 or n == 1): results r = sum_k x[r, k] *
 * v[k] where x is a (rows of A against b's column) or, when m == 1, b's
 * transpose against a's row. Rows contiguous along k take dot products;
 * otherwise, when x's columns are contiguous, whole columns are accumulated
 * (axpy). Tasks are blocks of `blk` results. */
enum { GEMV_ROWS = 256, GEMV_MAX_COLS = 16384 };

typedef struct {
  const gemm_t* g;
  const ukernel_t* uk;
  const mat_t *x, *v;
  int64_t xl, xk, vk; /* strides of x along r and k, of v along k */
  int64_t len;        /* results per batch */
  int64_t blk, nblk;  /* results per task, tasks per batch */
  bool by_columns;
  _Atomic int oom;
} gemv_job_t;

static inline const char* gemv_x(const gemv_job_t* job, int64_t bi, int64_t r, int64_t k) {
  return job->g->m == 1 ? mat_ptr(job->x, bi, k, r) : mat_ptr(job->x, bi, r, k);
}

/* y += a * x */
static void axpy_f32(float* restrict y, const float* restrict x, float a, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) /* whole chunks of 8 vectorize at -O2 */
    for (int h = 0; h < 8; h++) y[i + h] += a * x[i + h];
  for (; i < n; i++) y[i] += a * x[i];
}

static void gemv_range(void* ctx, int64_t begin, int64_t end) {
  gemv_job_t* job = ctx;
  const gemm_t* g = job->g;
  const mat_t* x = job->x;
  float* buf = malloc(sizeof(float) * (size_t)(g->k + 4 * job->blk + g->k));
  if (!buf) {
    job->oom = 1;
    return;
  }
  float *vbuf = buf, *y = buf + g->k, *row = y + job->blk, *xbuf = row + 2 * job->blk;
  for (int64_t t = begin; t < end; t++) {
    int64_t bi = t / job->nblk, r0 = (t % job->nblk) * job->blk;
    int64_t len = min64(job->blk, job->len - r0);
    if (g->has_product) {
      tpu_run_load_f32(vbuf, 1, mat_ptr(job->v, bi, 0, 0), job->vk, job->v->dt, g->k);
      if (job->by_columns) {
        memset(y, 0, sizeof(float) * (size_t)len);
        for (int64_t k = 0; k < g->k; k++) {
          const char* xc = gemv_x(job, bi, r0, k);
          const float* xv = (const float*)xc;
          if (x->dt != TPU_F32) {
            tpu_run_load_f32(xbuf, 1, xc, 1, x->dt, len);
            xv = xbuf;
          }
          axpy_f32(y, xv, vbuf[k], len);
        }
      } else {
        for (int64_t r = 0; r < len; r++) {
          const char* xr = gemv_x(job, bi, r0 + r, 0);
          const float* xv = (const float*)xr;
          if (x->dt != TPU_F32 || job->xk != 1) {
            tpu_run_load_f32(xbuf, 1, xr, job->xk, x->dt, g->k);
            xv = xbuf;
          }
          y[r] = job->uk->dot(xv, vbuf, g->k);
        }
      }
    }
    if (g->m == 1) ftile_store(g, bi, 0, r0, 1, len, y, len, row);
    else ftile_store(g, bi, r0, 0, len, 1, y, 1, row);
  }
  free(buf);
}

static tpu_status_t gemv_float(const gemm_t* g, double work) {
  gemv_job_t job = {0};
  bool over_n = g->m == 1;
  job.g = g;
  job.uk = pick_ukernel();
  job.x = over_n ? &g->b : &g->a;
  job.v = over_n ? &g->a : &g->b;
  job.xl = over_n ? g->b.sc : g->a.sr;
  job.xk = over_n ? g->b.sr : g->a.sc;
  job.vk = over_n ? g->a.sc : g->b.sr;
  job.len = over_n ? g->n : g->m;
  job.by_columns = job.xk != 1 && job.xl == 1;
  job.blk = GEMV_ROWS;
  if (job.by_columns) { /* long contiguous column runs, a couple of tasks per thread */
    int64_t want = (job.len + 2 * tpu_num_threads() - 1) / (2 * tpu_num_threads());
    job.blk = min64(GEMV_MAX_COLS, round_up(want > GEMV_ROWS ? want : GEMV_ROWS, 64));
  }
  job.nblk = (job.len + job.blk - 1) / job.blk;
  int64_t tasks = g->batch * job.nblk;
  tpu_parallel_for(tasks, work >= PARALLEL_MIN_WORK ? 1 : tasks, gemv_range, &job);
  if (job.oom) return TPU_ERR(RESOURCE_EXHAUSTED, "matmul: out of host memory");
  return TPU_OK;
}

static tpu_status_t gemm_float(const gemm_t* g) {
  double work = (double)g->batch * (double)g->m * (double)g->n * (double)(g->k + 1);
  if (g->m == 1 || g->n == 1) return gemv_float(g, work);
  ftile_job_t job = {0};
  job.g = g;
  job.uk = pick_ukernel();
  const int mr = job.uk->mr, nr = job.uk->nr;
  job.mc = min64(MC, round_up(g->m, mr));
  job.nc = min64(NC, round_up(g->n, nr));
  int nth = tpu_num_threads();
  bool parallel = nth > 1 && work >= PARALLEL_MIN_WORK;
  /* give every thread a few tiles: halve the larger tile side while possible */
  while (parallel) {
    int64_t tiles = g->batch * ((g->m + job.mc - 1) / job.mc) * ((g->n + job.nc - 1) / job.nc);
    if (tiles >= 2 * nth) break;
    if (job.mc >= job.nc && job.mc > 4 * mr) job.mc = round_up(job.mc / 2, mr);
    else if (job.nc > 2 * nr) job.nc = round_up(job.nc / 2, nr);
    else if (job.mc > 4 * mr) job.mc = round_up(job.mc / 2, mr);
    else break;
  }
  job.tm = (g->m + job.mc - 1) / job.mc;
  job.tn = (g->n + job.nc - 1) / job.nc;
  int64_t tiles = g->batch * job.tm * job.tn;
  tpu_parallel_for(tiles, parallel ? 1 : tiles, ftile_range, &job);
  if (job.oom) return TPU_ERR(RESOURCE_EXHAUSTED, "matmul: out of host memory for packing");
  return TPU_OK;
}

/* ---- float64 and integer path ---- */
enum { RB = 32, NB = 512 };

typedef struct {
  const gemm_t* g;
  int64_t tm, tn;
  _Atomic int oom;
} rtile_job_t;

/* Defines the tile range function NAME: loads through tpu_run_*_SUF into
 * type T, accumulates in U (unsigned for integers so that overflow wraps
 * like PyTorch); ATTR adds target attributes. */
#define DEFINE_RTILE(NAME, SUF, T, U, ATTR)                                                \
  ATTR static void NAME(void* ctx, int64_t begin, int64_t end) {                          \
    rtile_job_t* job = ctx;                                                               \
    const gemm_t* g = job->g;                                                             \
    U* acc = malloc(sizeof(U) * RB * NB);                                                 \
    T* rows = malloc(sizeof(T) * (2 * NB + RB));                                          \
    if (!acc || !rows) {                                                                  \
      free(acc);                                                                          \
      free(rows);                                                                         \
      job->oom = 1;                                                                       \
      return;                                                                             \
    }                                                                                     \
    T* brow = rows;                                                                       \
    T* out = rows + NB;                                                                   \
    T* acol = rows + 2 * NB;                                                              \
    const U al = (U)(T)g->alpha, be = (U)(T)g->beta;                                      \
    for (int64_t t = begin; t < end; t++) {                                               \
      int64_t bi = t / (job->tm * job->tn), r = t % (job->tm * job->tn);                  \
      int64_t i0 = (r / job->tn) * RB, j0 = (r % job->tn) * NB;                           \
      int64_t mlen = min64(RB, g->m - i0), nlen = min64(NB, g->n - j0);                   \
      memset(acc, 0, sizeof(U) * RB * NB);                                                \
      int64_t nlen8 = round_up(nlen, 8); /* whole chunks of 8 vectorize at -O2 */        \
      memset(brow + nlen, 0, sizeof(T) * (size_t)(nlen8 - nlen));                         \
      for (int64_t k = 0; k < (g->has_product ? g->k : 0); k++) {                         \
        tpu_run_load_##SUF(brow, 1, mat_ptr(&g->b, bi, k, j0), g->b.sc, g->b.dt, nlen);   \
        tpu_run_load_##SUF(acol, 1, mat_ptr(&g->a, bi, i0, k), g->a.sr, g->a.dt, mlen);   \
        for (int64_t i = 0; i < mlen; i++) {                                              \
          const U av = (U)acol[i];                                                        \
          U* restrict ar = acc + i * NB;                                                  \
          for (int64_t j = 0; j < nlen8; j += 8)                                          \
            for (int jj = 0; jj < 8; jj++) ar[j + jj] += av * (U)brow[j + jj];            \
        }                                                                                 \
      }                                                                                   \
      for (int64_t i = 0; i < mlen; i++) {                                                \
        const U* ar = acc + i * NB;                                                       \
        if (g->use_self) {                                                                \
          tpu_run_load_##SUF(out, 1, mat_ptr(&g->self, bi, i0 + i, j0), g->self.sc,       \
                             g->self.dt, nlen);                                           \
          for (int64_t j = 0; j < nlen; j++)                                              \
            out[j] = (T)((g->has_product ? al * ar[j] : 0) + be * (U)out[j]);             \
        } else {                                                                          \
          for (int64_t j = 0; j < nlen; j++) out[j] = (T)(g->has_product ? al * ar[j] : 0); \
        }                                                                                 \
        tpu_run_store_##SUF(mat_ptr(&g->c, bi, i0 + i, j0), g->c.sc, g->c.dt, out, nlen); \
      }                                                                                   \
    }                                                                                     \
    free(acc);                                                                            \
    free(rows);                                                                           \
  }

DEFINE_RTILE(rtile_f64, f64, double, double, )
DEFINE_RTILE(rtile_i64, i64, int64_t, uint64_t, )
#ifdef HAVE_AVX2_KERNEL
DEFINE_RTILE(rtile_f64_avx2, f64, double, double, AVX2_ATTR)
#endif

static tpu_status_t gemm_rows(const gemm_t* g, bool is_f64) {
  rtile_job_t job = {0};
  job.g = g;
  job.tm = (g->m + RB - 1) / RB;
  job.tn = (g->n + NB - 1) / NB;
  int64_t tiles = g->batch * job.tm * job.tn;
  double work = (double)g->batch * (double)g->m * (double)g->n * (double)(g->k + 1);
  int64_t grain = work >= PARALLEL_MIN_WORK ? 1 : tiles;
  void (*fn)(void*, int64_t, int64_t) = is_f64 ? rtile_f64 : rtile_i64;
#ifdef HAVE_AVX2_KERNEL
  if (is_f64 && pick_ukernel() == &k_avx2) fn = rtile_f64_avx2;
#endif
  tpu_parallel_for(tiles, grain, fn, &job);
  if (job.oom) return TPU_ERR(RESOURCE_EXHAUSTED, "matmul: out of host memory");
  return TPU_OK;
}

/* ---- entry points ---- */
static tpu_status_t gemm_dispatch(gemm_t* g, const tpu_tensor_t* c) {
  if (g->batch == 0 || g->m == 0 || g->n == 0) return TPU_OK;
  /* an output overlapping an input (other than self updated in place) is
   * computed into a temporary first */
  bool self_inplace = g->self.data == g->c.data && g->self.sb == g->c.sb &&
                      g->self.sr == g->c.sr && g->self.sc == g->c.sc &&
                      g->self.dt == g->c.dt;
  bool overlap = mats_overlap(&g->c, &g->a) || mats_overlap(&g->c, &g->b) ||
                 (g->use_self && !self_inplace && mats_overlap(&g->c, &g->self));
  void* tmp = NULL;
  if (overlap) {
    tmp = malloc((size_t)(g->batch * g->m * g->n * g->c.esz));
    if (!tmp) return TPU_ERR(RESOURCE_EXHAUSTED, "matmul: out of host memory");
    /* self, even when it is c, is still read from c's untouched memory */
    g->c.data = tmp;
    g->c.sb = g->m * g->n;
    g->c.sr = g->n;
    g->c.sc = 1;
  }
  tpu_status_t st;
  if (g->c.dt == TPU_F64) st = gemm_rows(g, true);
  else if (tpu_dtype_is_float(g->c.dt)) st = gemm_float(g);
  else st = gemm_rows(g, false);
  if (tmp) {
    if (st == TPU_OK) {
      tpu_tensor_t src = *c;
      src.data = tmp;
      int64_t stride = 1;
      for (int d = src.ndim - 1; d >= 0; d--) {
        src.strides[d] = stride;
        stride *= src.sizes[d];
      }
      st = tpu_copy_strided(c, &src);
    }
    free(tmp);
  }
  return st;
}

static tpu_status_t gemm_setup(const tpu_tensor_t* a, const tpu_tensor_t* b,
                               const tpu_tensor_t* c, double alpha, double beta,
                               const tpu_tensor_t* self, bool batched) {
  int nd = batched ? 3 : 2;
  if (!a || !b || !c) return TPU_ERR(INVALID_ARGUMENT, "matmul: missing operand");
  if (a->ndim != nd || b->ndim != nd || c->ndim != nd)
    return TPU_ERR(INVALID_ARGUMENT,
                   "matmul: expected %d-D operands, got %d-D, %d-D and a %d-D output", nd,
                   (int)a->ndim, (int)b->ndim, (int)c->ndim);
  const tpu_tensor_t* ops[4] = {a, b, c, self};
  for (int i = 0; i < 4; i++) {
    if (!ops[i]) continue;
    if (!tpu_dtype_is_supported(ops[i]->dtype))
      return TPU_ERR(UNIMPLEMENTED, "matmul: dtype %d is not supported on tpu",
                     (int)ops[i]->dtype);
    if (ops[i]->dtype == TPU_BOOL)
      return TPU_ERR(UNIMPLEMENTED, "matmul: not implemented for 'Bool'");
  }
  gemm_t g = {0};
  mat_from(&g.a, a, batched);
  mat_from(&g.b, b, batched);
  mat_from(&g.c, c, batched);
  g.batch = g.a.nb;
  g.m = g.a.nr;
  g.k = g.a.nc;
  g.n = g.b.nc;
  if (g.b.nb != g.batch || g.b.nr != g.k)
    return TPU_ERR(INVALID_ARGUMENT,
                   "matmul: shapes cannot be multiplied (%lldx%lldx%lld and %lldx%lldx%lld)",
                   (long long)g.batch, (long long)g.m, (long long)g.k, (long long)g.b.nb,
                   (long long)g.b.nr, (long long)g.b.nc);
  if (g.c.nb != g.batch || g.c.nr != g.m || g.c.nc != g.n)
    return TPU_ERR(INVALID_ARGUMENT,
                   "matmul: output has shape %lldx%lldx%lld, expected %lldx%lldx%lld",
                   (long long)g.c.nb, (long long)g.c.nr, (long long)g.c.nc, (long long)g.batch,
                   (long long)g.m, (long long)g.n);
  g.alpha = alpha;
  g.beta = beta;
  g.use_self = self != NULL && beta != 0;
  g.has_product = g.k > 0 && alpha != 0;
  if (g.use_self && !mat_broadcast(&g.self, self, g.batch, g.m, g.n))
    return TPU_ERR(INVALID_ARGUMENT,
                   "matmul: self of %d dims cannot broadcast to the result shape %lldx%lldx%lld",
                   (int)self->ndim, (long long)g.batch, (long long)g.m, (long long)g.n);
  return gemm_dispatch(&g, c);
}

tpu_status_t tpu_gemm(const tpu_tensor_t* a, const tpu_tensor_t* b, const tpu_tensor_t* c,
                      double alpha, double beta, const tpu_tensor_t* self) {
  return gemm_setup(a, b, c, alpha, beta, self, false);
}

tpu_status_t tpu_gemm_batched(const tpu_tensor_t* a, const tpu_tensor_t* b,
                              const tpu_tensor_t* c, double alpha, double beta,
                              const tpu_tensor_t* self) {
  return gemm_setup(a, b, c, alpha, beta, self, true);
}

/* ---- kernels ---- */
#define BETA(i) tpu_arg_f64(call, i, 1.0)
#define ALPHA(i) tpu_arg_f64(call, i, 1.0)

/* 2-d views of vectors: v as an n x 1 column or a 1 x n row; a 0-d tensor
 * stays 0-d (it broadcasts). */
static tpu_tensor_t as_column(const tpu_tensor_t* v) {
  tpu_tensor_t t = *v;
  if (v->ndim == 1) {
    t.ndim = 2;
    t.sizes[1] = 1;
    t.strides[1] = 1;
  }
  return t;
}

static tpu_tensor_t as_row(const tpu_tensor_t* v) {
  tpu_tensor_t t = *v;
  if (v->ndim == 1) {
    t.ndim = 2;
    t.sizes[0] = 1;
    t.strides[0] = 0;
    t.sizes[1] = v->sizes[0];
    t.strides[1] = v->strides[0];
  }
  return t;
}

static tpu_status_t check_vector(const char* op, const char* what, const tpu_tensor_t* t) {
  if (!t || t->ndim != 1)
    return TPU_ERR(INVALID_ARGUMENT, "%s: %s must be 1-D, got %d-D", op, what, t ? (int)t->ndim : -1);
  return TPU_OK;
}

tpu_status_t tpu_k_mm(const tpu_call_t* call) {
  return tpu_gemm(tpu_arg_tensor(call, 0), tpu_arg_tensor(call, 1), &call->outs[0], 1, 0, NULL);
}

tpu_status_t tpu_k_bmm(const tpu_call_t* call) {
  return tpu_gemm_batched(tpu_arg_tensor(call, 0), tpu_arg_tensor(call, 1), &call->outs[0], 1, 0,
                          NULL);
}

/* addmm(self, mat1, mat2, *, beta, alpha) and addmm_ */
tpu_status_t tpu_k_addmm(const tpu_call_t* call) {
  return tpu_gemm(tpu_arg_tensor(call, 1), tpu_arg_tensor(call, 2), &call->outs[0], ALPHA(4),
                  BETA(3), tpu_arg_tensor(call, 0));
}

/* baddbmm(self, batch1, batch2, *, beta, alpha) and baddbmm_ */
tpu_status_t tpu_k_baddbmm(const tpu_call_t* call) {
  return tpu_gemm_batched(tpu_arg_tensor(call, 1), tpu_arg_tensor(call, 2), &call->outs[0],
                          ALPHA(4), BETA(3), tpu_arg_tensor(call, 0));
}

/* addbmm(self, batch1, batch2, *, beta, alpha): beta * self + alpha * sum_b
 * batch1[b] @ batch2[b], accumulated one batch at a time like PyTorch. */
tpu_status_t tpu_k_addbmm(const tpu_call_t* call) {
  const tpu_tensor_t* self = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* b1 = tpu_arg_tensor(call, 1);
  const tpu_tensor_t* b2 = tpu_arg_tensor(call, 2);
  const tpu_tensor_t* out = &call->outs[0];
  double beta = BETA(3), alpha = ALPHA(4);
  if (!b1 || !b2 || b1->ndim != 3 || b2->ndim != 3)
    return TPU_ERR(INVALID_ARGUMENT, "addbmm: batch1 and batch2 must be 3-D tensors");
  if (b1->sizes[0] != b2->sizes[0])
    return TPU_ERR(INVALID_ARGUMENT,
                   "addbmm: batch1 and batch2 must have the same number of batches, got %lld and %lld",
                   (long long)b1->sizes[0], (long long)b2->sizes[0]);
  /* matrix i of a batch (for none, an empty product of the right shape) */
  int64_t nb = b1->sizes[0];
  for (int64_t i = 0; i < (nb > 0 ? nb : 1); i++) {
    tpu_tensor_t m1 = *b1, m2 = *b2;
    m1.ndim = m2.ndim = 2;
    for (int d = 0; d < 2; d++) {
      m1.sizes[d] = b1->sizes[d + 1];
      m1.strides[d] = b1->strides[d + 1];
      m2.sizes[d] = b2->sizes[d + 1];
      m2.strides[d] = b2->strides[d + 1];
    }
    if (nb == 0) m1.sizes[1] = m2.sizes[0] = 0;
    m1.data = (char*)b1->data + i * b1->strides[0] * (int64_t)tpu_dtype_size(b1->dtype);
    m2.data = (char*)b2->data + i * b2->strides[0] * (int64_t)tpu_dtype_size(b2->dtype);
    TPU_RETURN_IF_ERROR(tpu_gemm(&m1, &m2, out, alpha, i == 0 ? beta : 1.0, i == 0 ? self : out));
  }
  return TPU_OK;
}

/* addmv(self, mat, vec, *, beta, alpha) and addmv_ */
tpu_status_t tpu_k_addmv(const tpu_call_t* call) {
  const tpu_tensor_t* self = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* vec = tpu_arg_tensor(call, 2);
  TPU_RETURN_IF_ERROR(check_vector("addmv", "vec", vec));
  TPU_RETURN_IF_ERROR(check_vector("addmv", "out", &call->outs[0]));
  if (!self || self->ndim > 1)
    return TPU_ERR(INVALID_ARGUMENT, "addmv: self must be 0-D or 1-D");
  tpu_tensor_t v = as_column(vec), o = as_column(&call->outs[0]), s = as_column(self);
  return tpu_gemm(tpu_arg_tensor(call, 1), &v, &o, ALPHA(4), BETA(3), &s);
}

tpu_status_t tpu_k_mv(const tpu_call_t* call) {
  const tpu_tensor_t* vec = tpu_arg_tensor(call, 1);
  TPU_RETURN_IF_ERROR(check_vector("mv", "vec", vec));
  TPU_RETURN_IF_ERROR(check_vector("mv", "out", &call->outs[0]));
  tpu_tensor_t v = as_column(vec), o = as_column(&call->outs[0]);
  return tpu_gemm(tpu_arg_tensor(call, 0), &v, &o, 1, 0, NULL);
}

tpu_status_t tpu_k_dot(const tpu_call_t* call) {
  const tpu_tensor_t* x = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* y = tpu_arg_tensor(call, 1);
  TPU_RETURN_IF_ERROR(check_vector("dot", "self", x));
  TPU_RETURN_IF_ERROR(check_vector("dot", "tensor", y));
  if (x->sizes[0] != y->sizes[0])
    return TPU_ERR(INVALID_ARGUMENT,
                   "dot: inconsistent tensor size, expected tensor [%lld] and src [%lld] to have "
                   "the same number of elements",
                   (long long)x->sizes[0], (long long)y->sizes[0]);
  if (call->outs[0].ndim != 0)
    return TPU_ERR(INVALID_ARGUMENT, "dot: expected a 0-D output, got %d-D",
                   (int)call->outs[0].ndim);
  tpu_tensor_t r = as_row(x), col = as_column(y), o = call->outs[0];
  o.ndim = 2;
  o.sizes[0] = o.sizes[1] = 1;
  o.strides[0] = o.strides[1] = 1;
  return tpu_gemm(&r, &col, &o, 1, 0, NULL);
}
