/* Matrix multiply: tpu_gemm and the kernels built on it (mm, bmm, addmm,
 * baddbmm, addbmm, addmv, mv, dot).
 *
 * Float path (float32, bfloat16, float16): a BLIS-style packed GEMM. For
 * each block of NC columns and k block (KC packed steps), B's block is
 * packed into panels of NR columns and blocks of MC rows of A into panels of
 * MR rows; the micro-kernel multiplies an MR-row panel by an NR-column panel
 * into float accumulators added to c (float32 output) or to float tiles
 * stored after the last k block (scaled, combined with beta * self, rounded
 * once for bf16/f16). Packing applies the float32
 * matmul precision of the running call (see gemm_ukernel.h): medium rounds
 * inputs to bfloat16, high splits them into two passes, highest multiplies
 * in float32. Micro-kernels exist per instruction set (gemm_ukernel_*.c),
 * chosen once from CPUID. Every element's sum runs over k in the same order
 * whatever the tiling, so results do not depend on the thread split.
 * Matrix-vector shapes (m == 1 or n == 1) skip packing: dot products of
 * contiguous rows, or column-by-column axpys when the matrix is stored the
 * other way.
 *
 * Float64 and integer path: tiles of RB rows x NB columns accumulated with
 * scalar axpys over k, in double or in wrapping 64-bit integer arithmetic.
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "gemm_ukernel.h"
#include "kernels.h"
#include "matmul.h"

#include "base/cpu.h"
#include "base/env.h"
#include "tpu/float8.h"
#include "vecmath.h"

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
#define TO_F8E5M2(x) tpu_f32_to_f8e5m2((float)(x))
#define TO_F8E4M3FN(x) tpu_f32_to_f8e4m3fn((float)(x))
#define TO_F8E5M2FNUZ(x) tpu_f32_to_f8e5m2fnuz((float)(x))
#define TO_F8E4M3FNUZ(x) tpu_f32_to_f8e4m3fnuz((float)(x))
#define TO_F8E8M0FNU(x) tpu_f32_to_f8e8m0fnu((float)(x))

/* Contiguous bfloat16 runs to and from float32 with vector widening and
 * packing (vecmath.h) where the host ISA has them; false: left to the
 * element loops (the same values). */
static bool run_load_bf16_rows(float* dst, int64_t dstride, const void* src, int64_t sstride,
                               tpu_dtype_t dt, int64_t n) {
#ifdef TPU_HAVE_AVX2_BUILD
  if (dt == TPU_BF16 && dstride == 1 && sstride == 1 && tpu_host_isa() == TPU_ISA_AVX2) {
    tpu_vm_bf16_row_load_avx2(dst, src, n);
    return true;
  }
#endif
  (void)dst, (void)dstride, (void)src, (void)sstride, (void)dt, (void)n;
  return false;
}

static bool run_store_bf16_rows(void* dst, int64_t dstride, tpu_dtype_t dt, const float* src,
                                int64_t n) {
#ifdef TPU_HAVE_AVX2_BUILD
  if (dt == TPU_BF16 && dstride == 1 && tpu_host_isa() == TPU_ISA_AVX2) {
    tpu_vm_bf16_row_store_avx2(dst, src, n);
    return true;
  }
#endif
  (void)dst, (void)dstride, (void)dt, (void)src, (void)n;
  return false;
}

#define RUN_NO_FAST_LOAD(dst, dstride, src, sstride, dt, n) false
#define RUN_NO_FAST_STORE(dst, dstride, dt, src, n) false

/* Defines tpu_run_load_SUF / tpu_run_store_SUF for compute type CT whose
 * storage dtype is NATIVE (plain copies take memcpy); FAST_LOAD and
 * FAST_STORE may take a run first (true: done). */
#define DEFINE_RUN_IO(SUF, CT, NATIVE, FAST_LOAD, FAST_STORE)                              \
  void tpu_run_load_##SUF(CT* dst, int64_t dstride, const void* src, int64_t sstride,      \
                          tpu_dtype_t dt, int64_t n) {                                      \
    if (dt == NATIVE && dstride == 1 && sstride == 1) {                                    \
      memcpy(dst, src, (size_t)n * sizeof(CT));                                            \
      return;                                                                               \
    }                                                                                       \
    if (FAST_LOAD(dst, dstride, src, sstride, dt, n)) return;                              \
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
      case TPU_F8E5M2: LOAD_LOOP(uint8_t, tpu_f8e5m2_to_f32); break;                        \
      case TPU_F8E4M3FN: LOAD_LOOP(uint8_t, tpu_f8e4m3fn_to_f32); break;                    \
      case TPU_F8E5M2FNUZ: LOAD_LOOP(uint8_t, tpu_f8e5m2fnuz_to_f32); break;                \
      case TPU_F8E4M3FNUZ: LOAD_LOOP(uint8_t, tpu_f8e4m3fnuz_to_f32); break;                \
      case TPU_F8E8M0FNU: LOAD_LOOP(uint8_t, tpu_f8e8m0fnu_to_f32); break;                  \
      default: break;                                                                       \
    }                                                                                       \
  }                                                                                         \
  void tpu_run_store_##SUF(void* dst, int64_t dstride, tpu_dtype_t dt, const CT* src,      \
                           int64_t n) {                                                     \
    if (dt == NATIVE && dstride == 1) {                                                    \
      memcpy(dst, src, (size_t)n * sizeof(CT));                                            \
      return;                                                                               \
    }                                                                                       \
    if (FAST_STORE(dst, dstride, dt, src, n)) return;                                      \
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
      case TPU_F8E5M2: STORE_LOOP(uint8_t, TO_F8E5M2); break;                               \
      case TPU_F8E4M3FN: STORE_LOOP(uint8_t, TO_F8E4M3FN); break;                           \
      case TPU_F8E5M2FNUZ: STORE_LOOP(uint8_t, TO_F8E5M2FNUZ); break;                       \
      case TPU_F8E4M3FNUZ: STORE_LOOP(uint8_t, TO_F8E4M3FNUZ); break;                       \
      case TPU_F8E8M0FNU: STORE_LOOP(uint8_t, TO_F8E8M0FNU); break;                         \
      default: break;                                                                       \
    }                                                                                       \
  }

#define CT float
DEFINE_RUN_IO(f32, float, TPU_F32, run_load_bf16_rows, run_store_bf16_rows)
#undef CT
#define CT double
DEFINE_RUN_IO(f64, double, TPU_F64, RUN_NO_FAST_LOAD, RUN_NO_FAST_STORE)
#undef CT
#define CT int64_t
DEFINE_RUN_IO(i64, int64_t, TPU_I64, RUN_NO_FAST_LOAD, RUN_NO_FAST_STORE)
#undef CT

/* ---- problem description ---- */
typedef struct {
  char* data;
  tpu_dtype_t dt;
  int64_t esz;             /* bytes per element */
  int64_t nb, nr, nc;      /* sizes: batch, rows, columns */
  int64_t sb, sr, sc;      /* strides in elements */
  /* float4_e2m1fn_x2 (two values a byte, the low nibble first): the dim that
   * holds the pairs, MAT_PAIRS_ROWS (B, K along rows) or MAT_PAIRS_COLS (A);
   * its size counts values and its stride is the byte stride of a pair.
   * Only the packers read such an operand. */
  int pairs;
} mat_t;

enum { MAT_PAIRS_NONE = 0, MAT_PAIRS_ROWS = 1, MAT_PAIRS_COLS = 2 };

typedef struct {
  int64_t batch, m, n, k;
  mat_t a, b, c, self;
  bool use_self;    /* beta != 0: self takes part */
  bool has_product; /* k > 0 and alpha != 0: a @ b takes part */
  double alpha, beta;
  tpu_precision_t precision; /* the calling kernel's float32 matmul precision */
  const tpu_gemm_scale_t* scale[2]; /* a's (by row), b's (by column) while packing, or NULL */
} gemm_t;

/* Element offset of (b, r, c); for a float4 operand, of the byte holding
 * it (a packed run starts at an even index of the pairs' dim). */
static inline int64_t mat_offset(const mat_t* x, int64_t b, int64_t r, int64_t c) {
  if (x->pairs == MAT_PAIRS_ROWS) r /= 2;
  else if (x->pairs == MAT_PAIRS_COLS) c /= 2;
  return b * x->sb + r * x->sr + c * x->sc;
}

static inline char* mat_ptr(const mat_t* x, int64_t b, int64_t r, int64_t c) {
  return x->data + mat_offset(x, b, r, c) * x->esz;
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
  const int64_t last = mat_offset(x, x->nb - 1, x->nr - 1, x->nc - 1);
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

/* ---- micro-kernel instruction set ---- */
static const gemm_ukernel_t* ukernel_of(tpu_gemm_isa_t isa) {
#ifdef TPU_GEMM_HAVE_X86
  if (isa == TPU_GEMM_ISA_AVX512) return &tpu_gemm_ukernel_avx512;
  if (isa == TPU_GEMM_ISA_AVX2) return &tpu_gemm_ukernel_avx2;
#endif
  return &tpu_gemm_ukernel_portable;
}

/* The detector (base/cpu.c) counts a feature only when the OS also saves
 * its register state. */
static bool isa_supported(tpu_gemm_isa_t isa) {
#ifdef TPU_GEMM_HAVE_X86
  const tpu_cpu_features_t* f = tpu_cpu_features();
  if (isa == TPU_GEMM_ISA_AVX2) return f->avx2 && f->fma;
  if (isa == TPU_GEMM_ISA_AVX512) return f->avx512f;
#endif
  return isa == TPU_GEMM_ISA_PORTABLE;
}

static _Atomic int g_isa_auto = -1;   /* chosen on first use */
static _Atomic int g_isa_forced = -1; /* tpu_gemm_set_isa */

/* The best supported ISA, capped by TORCH_TPU_ISA (portable, avx2, avx512). */
static tpu_gemm_isa_t isa_choose(void) {
  static const char* const names[] = {"portable", "avx2", "avx512"};
  int cap = TPU_GEMM_ISA_AVX512;
  const char* env = tpu_env_str("TORCH_TPU_ISA");
  for (int i = 0; env && i <= TPU_GEMM_ISA_AVX512; i++)
    if (strcmp(env, names[i]) == 0) cap = i;
  int isa = cap;
  while (isa > TPU_GEMM_ISA_PORTABLE && !isa_supported((tpu_gemm_isa_t)isa)) isa--;
  return (tpu_gemm_isa_t)isa;
}

/* The choice, printed to stderr when TORCH_TPU_LOG_ISA=1. */
static void isa_log(tpu_gemm_isa_t isa) {
  const char* log = tpu_env_str("TORCH_TPU_LOG_ISA");
  if (!log || strcmp(log, "1") != 0) return;
  const gemm_ukernel_t* uk = ukernel_of(isa);
  const char* env = tpu_env_str("TORCH_TPU_ISA");
  fprintf(stderr, "torch_tpu: matmul micro-kernel %s (%dx%d); cpu: avx2+fma %s, avx512f %s%s%s\n",
          uk->name, uk->mr, uk->nr, isa_supported(TPU_GEMM_ISA_AVX2) ? "yes" : "no",
          isa_supported(TPU_GEMM_ISA_AVX512) ? "yes" : "no", env ? "; TORCH_TPU_ISA=" : "",
          env ? env : "");
}

static tpu_gemm_isa_t isa_current(void) {
  int forced = atomic_load_explicit(&g_isa_forced, memory_order_relaxed);
  if (forced >= 0) return (tpu_gemm_isa_t)forced;
  int isa = atomic_load_explicit(&g_isa_auto, memory_order_acquire);
  if (isa < 0) {
    int chosen = isa_choose(), expected = -1;
    if (atomic_compare_exchange_strong(&g_isa_auto, &expected, chosen)) isa_log(chosen);
    else chosen = expected; /* another thread chose first (and logged) */
    isa = chosen;
  }
  return (tpu_gemm_isa_t)isa;
}

static const gemm_ukernel_t* pick_ukernel(void) { return ukernel_of(isa_current()); }

bool tpu_gemm_set_isa(tpu_gemm_isa_t isa) {
  if (isa == TPU_GEMM_ISA_AUTO) {
    atomic_store(&g_isa_forced, -1);
    return true;
  }
  if (isa < TPU_GEMM_ISA_PORTABLE || isa > TPU_GEMM_ISA_AVX512 || !isa_supported(isa))
    return false;
  atomic_store(&g_isa_forced, (int)isa);
  return true;
}

const char* tpu_gemm_isa_name(void) { return pick_ukernel()->name; }

/* ---- float path ---- */
/* Block sizes, measured on AMD Zen 3 (back-to-back products, settings
 * interleaved in one process): packed steps per k block (an A block, MC x
 * KC, stays in L2; a B panel, KC x NR, in L1 and L2), rows per A block,
 * columns per B block (a B block, KC x NC, in L3). KC 512 against 256: 1024
 * and 2048 squares +5-16%, 4096x3072x768 +3-8% (fewer passes over c); no
 * change beyond noise on the GPT's K = 384 products. KC (ROWS_A_KC on the
 * rows path) alone shapes the sums, so results depend on neither the thread
 * count nor the other two. */
enum { KC = 512, MC = 96, NC = 2048 };
/* rows of the tallest micro-kernel tile */
enum { GEMM_MAX_MR = 16 };
/* Packed steps per k block on the rows path (see rows_a_strips): long
 * source runs to prefetch and few passes over c; its B panels come from L2
 * either way. 512 measured 5% faster than 256 on attention's P @ V. */
enum { ROWS_A_KC = 512 };
/* floats of a packer's line scratch: the longest k block of either path */
#define LINE_FLOATS ((int)KC > (int)ROWS_A_KC ? (int)KC : (int)ROWS_A_KC)

/* Products with at most this many columns keep A by rows (see rows_a). */
#define ROWS_A_MAX_N 128

/* TORCH_TPU_GEMM_ROWS_A=0 turns the rows path off (for comparisons). */
static bool rows_a_allowed(void) {
  static _Atomic int cached = -1;
  int v = atomic_load(&cached);
  if (v < 0) {
    const char* e = tpu_env_str("TORCH_TPU_GEMM_ROWS_A");
    v = !(e && e[0] == '0');
    atomic_store(&cached, v);
  }
  return v;
}

/* Two-step bfloat16 dot products (gemm_dot2_t): TORCH_TPU_GEMM_DOT2=0 turns
 * them off (for comparisons), tpu_gemm_allow_dot2 overrides. */
static _Atomic int g_dot2_forced = -1;

void tpu_gemm_allow_dot2(int on) { atomic_store(&g_dot2_forced, on < 0 ? -1 : on != 0); }

static bool dot2_allowed(void) {
  static _Atomic int cached = -1; /* bit 0: the CPU has them, bit 1: the environment allows */
  int v = atomic_load(&cached);
  if (v < 0) {
    const char* e = tpu_env_str("TORCH_TPU_GEMM_DOT2");
    const tpu_cpu_features_t* cpu = tpu_cpu_features();
    v = (cpu->avx512bf16 && cpu->avx512bw && cpu->avx512vl) | (!(e && e[0] == '0')) << 1;
    atomic_store(&cached, v);
  }
  const int forced = atomic_load(&g_dot2_forced);
  return (v & 1) && (forced >= 0 ? forced : v >> 1);
}

/* The smallest nonzero magnitude among x's values (INFINITY: none), scanned
 * by runs along a contiguous dim, split between the threads; 0 where x has
 * no contiguous dim. Magnitudes are positive, so their bits order like them. */
typedef struct {
  const gemm_dot2_t* d2;
  const mat_t* x;
  bool by_cols;
  int64_t lines;            /* runs per batch entry */
  _Atomic uint32_t least;   /* bits of the smallest magnitude so far */
} min_scan_t;

static void min_scan_runs(void* ctx, int64_t begin, int64_t end) {
  min_scan_t* sc = ctx;
  const mat_t* x = sc->x;
  float m = INFINITY;
  for (int64_t t = begin; t < end; t++) {
    const int64_t bi = t / sc->lines, l = t % sc->lines;
    const char* p = sc->by_cols ? mat_ptr(x, bi, l, 0) : mat_ptr(x, bi, 0, l);
    const float r = sc->d2->min_abs(p, x->dt == TPU_BF16, sc->by_cols ? x->nc : x->nr);
    if (r < m) m = r;
  }
  const uint32_t bits = gemm_f2u(m);
  uint32_t cur = atomic_load(&sc->least);
  while (bits < cur && !atomic_compare_exchange_weak(&sc->least, &cur, bits)) {
  }
}

static float mat_min_abs(const gemm_dot2_t* d2, const mat_t* x) {
  const bool by_cols = x->sc == 1 || (x->nc == 1 && x->sr != 1);
  if (!by_cols && x->sr != 1 && x->nr != 1) return 0;
  min_scan_t sc = {d2, x, by_cols, by_cols ? x->nr : x->nc, gemm_f2u(INFINITY)};
  const int64_t runs = (x->sb ? x->nb : 1) * sc.lines, len = by_cols ? x->nc : x->nr;
  /* chunks of at least 64K values */
  tpu_parallel_for(runs, len >= (1 << 16) ? 1 : ((1 << 16) + len - 1) / len, min_scan_runs, &sc);
  return gemm_u2f(atomic_load(&sc.least));
}

/* The micro-kernel's two-step dot products for a product of one bfloat16
 * pass: each operand bfloat16, or float32 rounded to it (precision medium);
 * NULL where they do not apply, the CPU lacks them, or they could give
 * other results than the float tiles. They flush denormals, so every
 * nonzero input must be normal after rounding (at least 2^-125 before it)
 * and every product at least 2^-108: products of bfloat16 values are then
 * multiples of a power of two of at least 2^-125 (16 significant bits), and
 * so is every rounded partial sum that is not zero. */
static const gemm_dot2_t* dot2_for(const gemm_t* g, const gemm_ukernel_t* uk,
                                   const gemm_passes_t* ps) {
  if (!uk->dot2 || ps->np != 1 || g->scale[0] || g->scale[1] || g->a.pairs || g->b.pairs)
    return NULL;
  const mat_t* x[2] = {&g->a, &g->b};
  const gemm_xform_t xf[2] = {ps->a[0], ps->b[0]};
  for (int i = 0; i < 2; i++)
    if (x[i]->dt != TPU_BF16 && !(x[i]->dt == TPU_F32 && xf[i] == GEMM_XF_BF16)) return NULL;
  if (!dot2_allowed()) return NULL;
  const float ma = mat_min_abs(uk->dot2, &g->a), mb = mat_min_abs(uk->dot2, &g->b);
  const float low = 0x1p-125f;
  if (ma < low || mb < low || (double)ma * (double)mb < 0x1p-108) return NULL;
  return uk->dot2;
}

/* Work (multiply-adds) below which a product runs on the calling thread. */
#define PARALLEL_MIN_WORK (1 << 17)
/* Batched products whose entries are at most this much work each run one
 * entry per task (with at least as many entries as threads). */
#define BATCH_TASK_MAX_WORK (1 << 25)
/* Packed B blocks at least this large are packed by all threads. */
#define PACK_PARALLEL_MIN (1 << 16)

/* The precision level's packed steps (see gemm_ukernel.h); it applies when
 * an operand is float32, other inputs are exact in every transform. */
static gemm_passes_t gemm_passes(const gemm_t* g) {
  gemm_passes_t ps = {1, {GEMM_XF_EXACT, GEMM_XF_EXACT}, {GEMM_XF_EXACT, GEMM_XF_EXACT}};
  if (g->a.dt != TPU_F32 && g->b.dt != TPU_F32) return ps;
  if (g->precision == TPU_PRECISION_MEDIUM) {
    ps.a[0] = ps.b[0] = GEMM_XF_BF16;
  } else if (g->precision == TPU_PRECISION_HIGH) {
    ps.np = 2;
    ps.a[0] = GEMM_XF_HI;
    ps.b[0] = GEMM_XF_HI16;
    ps.a[1] = GEMM_XF_LO;
    ps.b[1] = GEMM_XF_HI;
  }
  return ps;
}

/* dst[k * np + p] = xf[p](src[k]) for k < n (dst may be src when np == 1) */
static void expand_run(float* dst, const float* src, int64_t n, const gemm_xform_t* xf, int np) {
  for (int64_t k = 0; k < n; k++)
    for (int p = 0; p < np; p++) dst[k * np + p] = gemm_xform(xf[p], src[k]);
}

/* float4 e2m1 codes as float32, tpu_f4e2m1_to_f32's values as a table: the
 * sign is data, not a branch (random codes would mispredict half of them). */
static const float k_f4_values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

/* n float4 values (two a byte along K, the low nibble first) of a run whose
 * first value is nibble `ph` (0 low, 1 high) of the byte at p, the pairs
 * `stride` bytes apart. */
static void load_f4_run(float* dst, const uint8_t* p, int64_t stride, int64_t ph, int64_t n) {
  int64_t i = 0;
  if (ph && n > 0) dst[i++] = k_f4_values[p[0] >> 4];
  const uint8_t* q = p + ph * stride;
  for (; i + 1 < n; i += 2, q += stride) {
    dst[i] = k_f4_values[*q & 15];
    dst[i + 1] = k_f4_values[*q >> 4];
  }
  if (i < n) dst[i] = k_f4_values[*q & 15];
}

/* Position of scale (l, kb) of a [lines, kblocks] grid in cuBLAS's
 * block-scaled layout: 128 x 4 tiles, row-major over (line tile, k tile),
 * each holding its lines l = 32 * a + b (a < 4, b < 32) at b * 16 + a * 4 +
 * (kb % 4). */
static inline int64_t swizzled_index(int64_t l, int64_t kb, int64_t kblocks) {
  const int64_t ktiles = (kblocks + 3) / 4, i = l % 128;
  return ((l / 128) * ktiles + kb / 4) * 512 + (i % 32) * 16 + (i / 32) * 4 + kb % 4;
}

/* The scale of line l's k block kb, in float32. */
static inline float scale_at(const tpu_gemm_scale_t* sc, int64_t l, int64_t kb) {
  if (!sc->codes) return sc->s[l * sc->sl + kb * sc->sk];
  const uint8_t v = sc->codes[swizzled_index(l, kb, sc->kblocks)];
  return sc->code_dtype == TPU_F8E8M0FNU ? tpu_f8e8m0fnu_to_f32(v) : tpu_f8e4m3fn_to_f32(v);
}

/* line[k] *= the scale of step k0 + k (k < kc) of line l: one multiply per
 * value, the scale looked up once a block. */
static void scale_run(float* line, const tpu_gemm_scale_t* sc, int64_t l, int64_t k0,
                      int64_t kc) {
  if (!sc->codes && sc->sk == 0) {
    const float s = sc->s[l * sc->sl];
    for (int64_t k = 0; k < kc; k++) line[k] *= s;
    return;
  }
  for (int64_t k = 0; k < kc;) {
    const int64_t kb = (k0 + k) / sc->blk, end = min64(kc, (kb + 1) * sc->blk - k0);
    const float s = scale_at(sc, l, kb);
    for (; k < end; k++) line[k] *= s;
  }
}

/* float8 codes as float32, one table of 256 per format (built once from
 * tpu/float8.h's conversions, so the same bits): the packers decode an
 * operand's codes by lookup. */
enum { F8_FORMATS = 5 };
static float g_f8_values[F8_FORMATS][256];
static pthread_once_t g_f8_once = PTHREAD_ONCE_INIT;

static void f8_tables_build(void) {
  for (int c = 0; c < 256; c++) {
    const uint8_t v = (uint8_t)c;
    g_f8_values[0][c] = tpu_f8e4m3fn_to_f32(v);
    g_f8_values[1][c] = tpu_f8e5m2_to_f32(v);
    g_f8_values[2][c] = tpu_f8e4m3fnuz_to_f32(v);
    g_f8_values[3][c] = tpu_f8e5m2fnuz_to_f32(v);
    g_f8_values[4][c] = tpu_f8e8m0fnu_to_f32(v);
  }
}

/* The decoding table of float8 dtype dt, or NULL for any other dtype. */
static const float* f8_table(tpu_dtype_t dt) {
  int f;
  switch (dt) {
    case TPU_F8E4M3FN: f = 0; break;
    case TPU_F8E5M2: f = 1; break;
    case TPU_F8E4M3FNUZ: f = 2; break;
    case TPU_F8E5M2FNUZ: f = 3; break;
    case TPU_F8E8M0FNU: f = 4; break;
    default: return NULL;
  }
  pthread_once(&g_f8_once, f8_tables_build);
  return g_f8_values[f];
}

/* n values of x from p on, `stride` elements apart, as float32. */
static void load_run(float* dst, const mat_t* x, const char* p, int64_t stride, int64_t n) {
  const float* t = f8_table(x->dt);
  if (t) {
    const uint8_t* b = (const uint8_t*)p;
    for (int64_t i = 0; i < n; i++) dst[i] = t[b[i * stride]];
  } else {
    tpu_run_load_f32(dst, 1, p, stride, x->dt, n);
  }
}

/* Steps k0 .. k0 + kc - 1 of line l of x as float32, times their scales
 * (sc may be NULL): the run starts at p (for float4, the byte holding step
 * k0), steps sk elements apart (float4: pairs sk bytes apart). */
static void load_line(float* dst, const mat_t* x, const char* p, int64_t sk, int64_t k0,
                      int64_t kc, const tpu_gemm_scale_t* sc, int64_t l) {
  if (x->pairs) load_f4_run(dst, (const uint8_t*)p, sk, k0 & 1, kc);
  else load_run(dst, x, p, sk, kc);
  if (sc) scale_run(dst, sc, l, k0, kc);
}

/* Step k of n lines l0, l0 + 1, ... of x as float32, times their scales:
 * the values start at p (for float4, the byte holding step k of line l0),
 * lines sl elements (float4: bytes) apart. */
static void load_step(float* dst, const mat_t* x, const char* p, int64_t sl, int64_t k,
                      int64_t n, const tpu_gemm_scale_t* sc, int64_t l0) {
  if (x->pairs) {
    const uint8_t* b = (const uint8_t*)p;
    const int shift = (int)(k & 1) * 4;
    for (int64_t i = 0; i < n; i++) dst[i] = k_f4_values[(b[i * sl] >> shift) & 15];
  } else {
    load_run(dst, x, p, sl, n);
  }
  if (sc && sc->codes) { /* decoded values times their scales, rounded to float32 */
    for (int64_t i = 0; i < n; i++) dst[i] *= scale_at(sc, l0 + i, k / sc->blk);
  } else if (sc) {
    const float* sv = sc->s + (k / sc->blk) * sc->sk + l0 * sc->sl;
    for (int64_t i = 0; i < n; i++) dst[i] *= sv[i * sc->sl];
  }
}

/* Packs `lines` lines of kc steps (line l, step k at src + (l * sl + k *
 * sk) elements of x) into panels of w lines, as gemm_ukernel_t.pack_f32
 * describes. Float32 and bfloat16 layouts the micro-kernel's packers know
 * go there; any
 * other dtype or layout converts one run at a time through `line`
 * (max(kc, w) floats): float8 and float4 codes are decoded there, and
 * multiplied by their scales (sc) when the operand has them. For a float4
 * operand src is the byte holding step k0 (of the line l0 the scales count
 * from) and sk the byte stride of a pair of steps. */
static void pack_panels(const gemm_ukernel_t* uk, float* dst, const mat_t* x, const char* src,
                        int64_t sl, int64_t sk, int64_t lines, int64_t kc, int w,
                        const gemm_xform_t* xf, int np, float* line, const tpu_gemm_scale_t* sc,
                        int64_t l0, int64_t k0) {
  if (!sc && x->dt == TPU_F32 && uk->pack_f32 &&
      uk->pack_f32(dst, (const float*)src, sl, sk, lines, kc, w, xf, np))
    return;
  if (!sc && x->dt == TPU_BF16 && uk->pack_bf16 &&
      uk->pack_bf16(dst, (const uint16_t*)src, sl, sk, lines, kc, w, xf, np))
    return;
  const int64_t ph = x->pairs ? k0 & 1 : 0; /* float4: nibble of the first step */
  const int64_t kcp = kc * np;
  for (int64_t q0 = 0; q0 < lines; q0 += w) {
    const int64_t rows = min64(w, lines - q0);
    float* d = dst + q0 * kcp;
    const char* s = src + q0 * sl * x->esz;
    if (rows < w) memset(d, 0, sizeof(float) * (size_t)(w * kcp));
    if (sl == 1 && sk != 1) { /* lines contiguous at each step */
      for (int64_t k = 0; k < kc; k++) {
        const char* sp = x->pairs ? s + ((ph + k) >> 1) * sk : s + k * sk * x->esz;
        load_step(line, x, sp, 1, k0 + k, rows, sc, l0 + q0);
        for (int p = 0; p < np; p++)
          for (int64_t l = 0; l < rows; l++) d[(k * np + p) * w + l] = gemm_xform(xf[p], line[l]);
      }
    } else {
      for (int64_t l = 0; l < rows; l++) {
        load_line(line, x, s + l * sl * x->esz, sk, k0, kc, sc, l0 + q0 + l);
        for (int64_t k = 0; k < kc; k++)
          for (int p = 0; p < np; p++) d[(k * np + p) * w + l] = gemm_xform(xf[p], line[k]);
      }
    }
  }
}

/* c[rows i0.., columns j0..] = alpha * acc + beta * self for mlen x nlen
 * (acc: row stride ldc, ignored without a product; it may be c itself);
 * `row` is scratch for two rows. */
/* r = al * a + be * s over n values (whole chunks of 8 vectorize at -O2) */
static void axpby_row(float* restrict r, float al, const float* restrict a, float be,
                      const float* restrict s, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int h = 0; h < 8; h++) r[j + h] = al * a[j + h] + be * s[j + h];
  for (; j < n; j++) r[j] = al * a[j] + be * s[j];
}

static void ftile_store(const gemm_t* g, int64_t bi, int64_t i0, int64_t j0, int64_t mlen,
                        int64_t nlen, const float* acc, int64_t ldc, float* row) {
  const float al = (float)g->alpha, be = (float)g->beta;
  float* srow = row + nlen;
  /* a self broadcast along rows (a bias) is converted once */
  const bool self_row = g->use_self && g->self.sr == 0;
  for (int64_t i = 0; i < mlen; i++) {
    const float* ar = g->has_product ? acc + i * ldc : NULL;
    const float* out = row;
    if (g->use_self) {
      if (!self_row || i == 0)
        tpu_run_load_f32(srow, 1, mat_ptr(&g->self, bi, i0 + i, j0), g->self.sc, g->self.dt,
                         nlen);
      if (g->has_product)
        axpby_row(row, al, ar, be, srow, nlen);
      else
        for (int64_t j = 0; j < nlen; j++) row[j] = be * srow[j];
    } else if (g->has_product && al == 1.0f) {
      out = ar; /* stored as it is */
    } else if (g->has_product) {
      for (int64_t j = 0; j < nlen; j++) row[j] = al * ar[j];
    } else {
      memset(row, 0, sizeof(float) * (size_t)nlen);
    }
    void* dst = mat_ptr(&g->c, bi, i0 + i, j0);
    if (dst != out) tpu_run_store_f32(dst, g->c.sc, g->c.dt, out, nlen);
  }
}

/* Blocked product, BLIS style. For each batch entry, block of nc columns
 * and k block (kcs source steps), B's block is packed in NR-column panels;
 * then each item, an A block of mc rows times a group of those panels,
 * packs its rows and runs the micro-kernel over its panels, adding to c
 * directly (float32 c with unit column stride, no self aliasing it) or to
 * float tiles stored after the last k block. Both phases spread over the
 * threads. */
typedef struct {
  const gemm_t* g;
  const gemm_ukernel_t* uk;
  gemm_passes_t ps;
  int64_t kcs, nkb;  /* source steps per k block, k blocks */
  int64_t mc, nmb;   /* rows per A block, A blocks */
  int64_t nc;        /* columns per B block */
  int64_t jgroups;   /* B panel groups per A block (items = nmb * jgroups) */
  bool direct;       /* accumulate in c */
  bool epi;          /* direct, and the last k block adds self (alpha = beta = 1) */
  bool rows_a;       /* A blocks kept by rows (uk->tile_rows): few columns */
  const gemm_dot2_t* dot2; /* packed in bfloat16 step pairs for its tiles, or NULL */
  _Atomic int64_t next_entry; /* per-entry split: the next entry to claim */
  _Atomic int oom;
} fgemm_t;

typedef struct {
  fgemm_t* f;
  int64_t bi, j0, nlen, npan; /* batch entry, columns [j0, j0 + nlen), panels */
  int64_t kb;                 /* the k block */
  float* pb;  /* packed B block: panel jp at pb + jp * kcp * nr */
  float* acc; /* without the direct path: tile rows, row i at acc + i * npan * nr */
  int64_t units, items;                 /* packing units, items */
  _Atomic int64_t next_unit, next_item; /* the next ones to claim */
} fblock_t;

/* Packing units: PACK_PANELS panels. */
enum { PACK_PANELS = 16 };

/* Packed steps (floats or words) of a line of klen source steps. */
static inline int64_t packed_steps(const fgemm_t* f, int64_t klen) {
  return f->dot2 ? (klen + 1) / 2 : klen * f->ps.np;
}

/* pack_panels, or the dot2 packer's step pairs (A's missing step -0, B's
 * +0: see gemm_dot2_t) */
static void pack_lines(const fgemm_t* f, bool is_a, float* dst, const char* src, int64_t sl,
                       int64_t sk, int64_t lines, int64_t kc, int w, float* line, int64_t l0,
                       int64_t k0) {
  const mat_t* x = is_a ? &f->g->a : &f->g->b;
  if (f->dot2)
    f->dot2->pack((uint32_t*)dst, src, x->dt == TPU_BF16, sl, sk, lines, kc, w,
                  is_a ? 0x8000 : 0);
  else
    pack_panels(f->uk, dst, x, src, sl, sk, lines, kc, w, is_a ? f->ps.a : f->ps.b, f->ps.np,
                line, f->g->scale[is_a ? 0 : 1], l0, k0);
}

/* One micro-kernel tile of kcp packed steps: A a packed panel (lda 0) or
 * rows lda apart (the rows path, which passes its prefetches). */
static inline void run_tile(const fgemm_t* f, int64_t kcp, const float* a, int64_t lda,
                            const float* b, float* c, int64_t ldc, bool accumulate,
                            const float* s, int64_t lds, const void* const* pf, int64_t npf) {
  if (f->dot2)
    f->dot2->tile(kcp, (const uint32_t*)a, lda, (const uint32_t*)b, c, ldc, accumulate, s, lds,
                  pf, npf);
  else if (lda)
    f->uk->tile_rows(kcp, a, lda, b, c, ldc, accumulate, s, lds, pf, npf);
  else
    f->uk->tile(kcp, a, b, c, ldc, accumulate, s, lds);
}

/* Both phases run as workers (the range passed is ignored) that claim units
 * or items one at a time until none are left: the threads stay busy to the
 * end whatever else the machine runs. */
static void fblock_pack_b(void* ctx, int64_t begin, int64_t end) {
  fblock_t* blk = ctx;
  const fgemm_t* f = blk->f;
  const gemm_t* g = f->g;
  const int nr = f->uk->nr;
  const int64_t k0 = blk->kb * f->kcs, klen = min64(f->kcs, g->k - k0);
  float line[LINE_FLOATS > 64 ? LINE_FLOATS : 64];
  for (int64_t u; (u = atomic_fetch_add(&blk->next_unit, 1)) < blk->units;) {
    int64_t jp = u * PACK_PANELS;
    pack_lines(f, false, blk->pb + jp * packed_steps(f, klen) * nr,
               mat_ptr(&g->b, blk->bi, k0, blk->j0 + jp * nr), g->b.sc, g->b.sr,
               min64(PACK_PANELS * nr, blk->nlen - jp * nr), klen, nr, line, blk->j0 + jp * nr,
               k0);
  }
}

/* One micro-kernel tile of the direct path that crosses c's edge: computed
 * in `tmp` (mr x nr) and its rows x cols corner copied to / from c, with
 * the epilogue operand s (see gemm_ukernel_t.tile) added to that corner. */
static void edge_tile(const fgemm_t* f, int64_t kcp, const float* a, int64_t lda,
                      const float* b, float* c, int64_t ldc, bool accumulate, const float* s,
                      int64_t lds, int64_t rows, int64_t cols, float* tmp,
                      const void* const* pf, int64_t npf) {
  const int nr = f->uk->nr;
  if (accumulate)
    for (int64_t i = 0; i < rows; i++)
      memcpy(tmp + i * nr, c + i * ldc, sizeof(float) * (size_t)cols);
  run_tile(f, kcp, a, lda, b, tmp, nr, accumulate, NULL, 0, pf, npf);
  for (int64_t i = 0; i < rows; i++) {
    float* t = tmp + i * nr;
    if (s)
      for (int64_t j = 0; j < cols; j++) t[j] += s[i * lds + j];
    memcpy(c + i * ldc, t, sizeof(float) * (size_t)cols);
  }
}

/* The tiles of one item on a packed A block (pa, mlen rows): each of the
 * item's B panels, jp0 to jp1, against every MR-row panel of the block;
 * sv (NULL: none) is the epilogue operand at the item's first element. */
static void packed_tiles(const fblock_t* blk, const float* pa, int64_t mlen, int64_t jp0,
                         int64_t jp1, float* tgt, int64_t ldt, int64_t cw, const float* sv,
                         int64_t lds, float* tmp) {
  const fgemm_t* f = blk->f;
  const gemm_ukernel_t* uk = f->uk;
  const int mr = uk->mr, nr = uk->nr;
  const int64_t kcp = packed_steps(f, min64(f->kcs, f->g->k - blk->kb * f->kcs));
  const bool first = blk->kb == 0;
  for (int64_t jp = jp0; jp < jp1; jp++) {
    const float* bp = blk->pb + jp * kcp * nr;
    const int64_t cc = (jp - jp0) * nr;
    for (int64_t r = 0; r < mlen; r += mr) {
      const float* ap = pa + r * kcp;
      float* ct = tgt + r * ldt + cc;
      const float* st = sv ? sv + r * lds + cc : NULL;
      if (f->direct && (r + mr > mlen || cc + nr > cw))
        edge_tile(f, kcp, ap, 0, bp, ct, ldt, !first, st, lds, min64(mr, mlen - r),
                  min64(nr, cw - cc), tmp, NULL, 0);
      else
        run_tile(f, kcp, ap, 0, bp, ct, ldt, !first, st, lds, NULL, 0);
    }
  }
}

/* Strips ahead that the rows path prefetches (2 measured no better). */
enum { PF_STRIPS = 1 };

/* The tiles of one item with A kept by rows: one strip of MR rows at a
 * time is transformed into `strip` (MR x kcp, rows past mlen zero) and
 * multiplied by each of the item's B panels while it sits in L1. The next
 * strip's source rows are prefetched meanwhile, a few lines per micro-kernel
 * call: read in short runs far apart, they would otherwise come from memory
 * at the pace of the transform, which then costs a third of the product. */
static void rows_a_strips(const fblock_t* blk, float* strip, int64_t i0, int64_t mlen,
                          int64_t jp0, int64_t jp1, float* tgt, int64_t ldt, int64_t cw,
                          const float* sv, int64_t lds, float* tmp, float* line) {
  /* source lines of a strip: MR rows of at most KC floats (A is float32 or
   * bfloat16) */
  const void* pf[GEMM_MAX_MR * (ROWS_A_KC * sizeof(float) / 64 + 1)];
  const fgemm_t* f = blk->f;
  const gemm_t* g = f->g;
  const gemm_ukernel_t* uk = f->uk;
  const int mr = uk->mr, nr = uk->nr;
  const int64_t k0 = blk->kb * f->kcs, klen = min64(f->kcs, g->k - k0);
  const int64_t kcp = packed_steps(f, klen);
  const bool first = blk->kb == 0;
  for (int64_t r = 0; r < mlen; r += mr) {
    const int64_t rows = min64(mr, mlen - r);
    pack_lines(f, true, strip, mat_ptr(&g->a, blk->bi, i0 + r, k0), g->a.sr, g->a.sc, rows,
               klen, 1, line, i0 + r, k0);
    if (rows < mr) memset(strip + rows * kcp, 0, sizeof(float) * (size_t)((mr - rows) * kcp));
    /* the next strip's source lines, prefetched a few at a time by the
     * micro-kernel over this strip's tiles; any left over, at the end. After
     * an A block's last strip comes (most likely) the next A block's first,
     * then the next k block's, then the next batch entry's. */
    int64_t nb = blk->bi, nrow = i0 + r, nk = k0;
    for (int d = 0; d < PF_STRIPS; d++) {
      const int64_t bend = min64(nrow / f->mc * f->mc + f->mc, g->m); /* A block's end */
      if ((nrow += mr) >= bend && (nrow = bend) >= g->m) {
        nrow = 0;
        if ((nk += f->kcs) >= g->k) {
          nk = 0;
          nb++;
        }
      }
    }
    int64_t npf = 0, done = 0;
    if (nb < g->batch) {
      const int64_t nrun = min64(f->kcs, g->k - nk) * g->a.esz; /* bytes per row */
      for (int64_t l = nrow; l < min64(nrow + mr, g->m); l++) {
        const char* s = mat_ptr(&g->a, nb, l, nk);
        for (int64_t o = 0; o < nrun; o += 64) pf[npf++] = s + o;
      }
    }
    const int64_t per_tile = min64((npf + jp1 - jp0 - 1) / (jp1 - jp0), kcp / GEMM_PF_STEPS);
    float* ct = tgt + r * ldt;
    for (int64_t jp = jp0; jp < jp1; jp++, ct += nr) {
      const int64_t n = min64(per_tile, npf - done);
      const float* bp = blk->pb + jp * kcp * nr;
      const int64_t cc = (jp - jp0) * nr;
      const float* st = sv ? sv + r * lds + cc : NULL;
      if (f->direct && (rows < mr || cc + nr > cw))
        edge_tile(f, kcp, strip, kcp, bp, ct, ldt, !first, st, lds, rows, min64(nr, cw - cc),
                  tmp, pf + done, n);
      else
        run_tile(f, kcp, strip, kcp, bp, ct, ldt, !first, st, lds, pf + done, n);
      done += n;
    }
    for (; done < npf; done++) __builtin_prefetch(pf[done]);
  }
}

static void fblock_items(void* ctx, int64_t begin, int64_t end) {
  fblock_t* blk = ctx;
  fgemm_t* f = blk->f;
  const gemm_t* g = f->g;
  const gemm_ukernel_t* uk = f->uk;
  const int mr = uk->mr, nr = uk->nr;
  const int64_t k0 = blk->kb * f->kcs, klen = min64(f->kcs, g->k - k0);
  const int64_t kcp = packed_steps(f, klen);
  const bool last = blk->kb == f->nkb - 1;
  const int64_t gp = (blk->npan + f->jgroups - 1) / f->jgroups; /* panels per group */
  const int64_t mcp = round_up(f->mc, mr);
  size_t floats =
      (size_t)(mcp * kcp + 2 * gp * nr + mr * nr + (LINE_FLOATS > nr ? LINE_FLOATS : nr));
  float* buf = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
  if (!buf) {
    f->oom = 1;
    return;
  }
  float* pa = buf;
  float* row = pa + mcp * kcp;
  float* tmp = row + 2 * gp * nr;
  float* line = tmp + mr * nr;
  for (int64_t t; (t = atomic_fetch_add(&blk->next_item, 1)) < blk->items;) {
    int64_t ib = t / f->jgroups, jp0 = (t % f->jgroups) * gp, jp1 = min64(blk->npan, jp0 + gp);
    if (jp0 >= jp1) continue;
    int64_t i0 = ib * f->mc, mlen = min64(f->mc, g->m - i0);
    int64_t c0 = blk->j0 + jp0 * nr, cw = min64(blk->nlen - jp0 * nr, (jp1 - jp0) * nr);
    float* tgt = f->direct ? (float*)mat_ptr(&g->c, blk->bi, i0, c0)
                           : blk->acc + i0 * blk->npan * nr + jp0 * nr;
    int64_t ldt = f->direct ? g->c.sr : blk->npan * nr;
    const float* sv = last && f->epi ? (const float*)mat_ptr(&g->self, blk->bi, i0, c0) : NULL;
    if (f->rows_a) {
      rows_a_strips(blk, pa, i0, mlen, jp0, jp1, tgt, ldt, cw, sv, g->self.sr, tmp, line);
    } else {
      pack_lines(f, true, pa, mat_ptr(&g->a, blk->bi, i0, k0), g->a.sr, g->a.sc, mlen, klen, mr,
                 line, i0, k0);
      packed_tiles(blk, pa, mlen, jp0, jp1, tgt, ldt, cw, sv, g->self.sr, tmp);
    }
    if (last && !f->epi && (!f->direct || g->use_self || g->alpha != 1))
      ftile_store(g, blk->bi, i0, c0, mlen, cw, tgt, ldt, row);
  }
  free(buf);
}

/* Scratch of one task: a packed B block, then (without the direct path)
 * float tiles for a block of columns of all rows. */
static float* fgemm_alloc_scratch(const fgemm_t* f, float** acc) {
  const int64_t ncp = round_up(f->nc, f->uk->nr);
  const int64_t pb = packed_steps(f, f->kcs) * ncp, tiles = f->direct ? 0 : f->nmb * f->mc * ncp;
  float* buf = aligned_alloc(64, ((size_t)(pb + tiles) * sizeof(float) + 63) / 64 * 64);
  *acc = buf ? buf + pb : NULL;
  return buf;
}

/* Batch entry bi; `parallel` spreads each phase over the threads. */
static void fgemm_entry(fgemm_t* f, int64_t bi, bool parallel, float* pb, float* acc) {
  const gemm_t* g = f->g;
  const int nr = f->uk->nr;
  const int nth = parallel ? tpu_num_threads() : 1;
  for (int64_t j0 = 0; j0 < g->n; j0 += f->nc) {
    for (int64_t kb = 0; kb < f->nkb && !f->oom; kb++) {
      fblock_t blk = {f, bi, j0, min64(f->nc, g->n - j0), 0, kb, pb, acc, 0, 0, 0, 0};
      blk.npan = (blk.nlen + nr - 1) / nr;
      blk.units = (blk.npan + PACK_PANELS - 1) / PACK_PANELS;
      blk.items = f->nmb * f->jgroups;
      if (nth > 1 && f->kcs * blk.nlen >= PACK_PARALLEL_MIN)
        tpu_parallel_for(nth, 1, fblock_pack_b, &blk);
      else
        fblock_pack_b(&blk, 0, 1);
      if (nth > 1) tpu_parallel_for(nth, 1, fblock_items, &blk);
      else fblock_items(&blk, 0, 1);
    }
  }
}

/* A worker (the range passed is ignored) that claims batch entries one at
 * a time until none are left, so that a thread slowed down by the rest of
 * the machine holds up the others by one entry at most. */
static void fgemm_entries(void* ctx, int64_t begin, int64_t end) {
  fgemm_t* f = ctx;
  float* acc;
  float* pb = fgemm_alloc_scratch(f, &acc);
  if (!pb) {
    f->oom = 1;
    return;
  }
  for (int64_t bi; !f->oom && (bi = atomic_fetch_add(&f->next_entry, 1)) < f->g->batch;)
    fgemm_entry(f, bi, false, pb, acc);
  free(pb);
}

/* Matrix-vector products (m == 1 or n == 1): results r = sum_k x[r, k] *
 * v[k] where x is a (rows of A against b's column) or, when m == 1, b's
 * transpose against a's row. Rows contiguous along k take dot products;
 * otherwise, when x's columns are contiguous, whole columns are accumulated
 * (axpy). Multi-pass precision expands both sides like the packers do.
 * Tasks are blocks of `blk` results. */
enum { GEMV_ROWS = 256, GEMV_MAX_COLS = 16384 };

typedef struct {
  const gemm_t* g;
  const gemm_ukernel_t* uk;
  const mat_t *x, *v;
  const gemm_xform_t *xxf, *vxf; /* transforms of x's and v's passes */
  const tpu_gemm_scale_t *xs, *vs; /* their scales (line: x's result, v's 0), or NULL */
  int np;
  bool exact;         /* one exact pass: float32 x is used in place */
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
  const int np = job->np;
  const int64_t run = g->k > job->blk ? g->k : job->blk;
  float* buf = malloc(sizeof(float) * (size_t)(2 * np * g->k + run + 3 * job->blk));
  if (!buf) {
    job->oom = 1;
    return;
  }
  float *vexp = buf, *xexp = vexp + np * g->k, *xraw = xexp + np * g->k;
  float *y = xraw + run, *row = y + job->blk;
  for (int64_t t = begin; t < end; t++) {
    int64_t bi = t / job->nblk, r0 = (t % job->nblk) * job->blk;
    int64_t len = min64(job->blk, job->len - r0);
    if (g->has_product) {
      load_line(xraw, job->v, mat_ptr(job->v, bi, 0, 0), job->vk, 0, g->k, job->vs, 0);
      expand_run(vexp, xraw, g->k, job->vxf, np);
      if (job->by_columns) {
        memset(y, 0, sizeof(float) * (size_t)len);
        for (int64_t k = 0; k < g->k; k++) {
          const char* xc = gemv_x(job, bi, r0, k);
          for (int p = 0; p < np; p++) {
            const float* xv = (const float*)xc;
            if (x->dt != TPU_F32 || !job->exact) {
              load_step(xraw, x, xc, job->xl, k, len, job->xs, r0);
              for (int64_t i = 0; i < len; i++) xraw[i] = gemm_xform(job->xxf[p], xraw[i]);
              xv = xraw;
            }
            axpy_f32(y, xv, vexp[k * np + p], len);
          }
        }
      } else {
        for (int64_t r = 0; r < len; r++) {
          const char* xr = gemv_x(job, bi, r0 + r, 0);
          const float* xv = (const float*)xr;
          if (x->dt != TPU_F32 || job->xk != 1 || !job->exact) {
            load_line(xraw, x, xr, job->xk, 0, g->k, job->xs, r0 + r);
            expand_run(xexp, xraw, g->k, job->xxf, np);
            xv = xexp;
          }
          y[r] = job->uk->dot(xv, vexp, np * g->k);
        }
      }
    }
    if (g->m == 1) ftile_store(g, bi, 0, r0, 1, len, y, len, row);
    else ftile_store(g, bi, r0, 0, len, 1, y, 1, row);
  }
  free(buf);
}

static tpu_status_t gemv_float(const gemm_t* g, const gemm_passes_t* ps, double work) {
  gemv_job_t job = {0};
  bool over_n = g->m == 1;
  job.g = g;
  job.uk = pick_ukernel();
  job.x = over_n ? &g->b : &g->a;
  job.v = over_n ? &g->a : &g->b;
  job.xxf = over_n ? ps->b : ps->a;
  job.vxf = over_n ? ps->a : ps->b;
  job.np = ps->np;
  job.exact = ps->np == 1 && job.xxf[0] == GEMM_XF_EXACT;
  job.xl = over_n ? g->b.sc : g->a.sr;
  job.xk = over_n ? g->b.sr : g->a.sc;
  job.vk = over_n ? g->a.sc : g->b.sr;
  job.len = over_n ? g->n : g->m;
  job.xs = over_n ? g->scale[1] : g->scale[0];
  job.vs = over_n ? g->scale[0] : g->scale[1];
  job.by_columns = job.xk != 1 && job.xl == 1;
  /* float4 (see gemm_float): the order a row-major A and B would give */
  if (g->a.pairs) job.by_columns = over_n && g->n != 1;
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

/* Without a product (K == 0 or alpha == 0): c = beta * self or 0. */
static tpu_status_t fill_float(const gemm_t* g) {
  float* row = malloc(sizeof(float) * (size_t)(2 * g->n));
  if (!row) return TPU_ERR(RESOURCE_EXHAUSTED, "matmul: out of host memory");
  for (int64_t bi = 0; bi < g->batch; bi++) ftile_store(g, bi, 0, 0, g->m, g->n, NULL, 0, row);
  free(row);
  return TPU_OK;
}

static tpu_status_t gemm_float(const gemm_t* g) {
  if (!g->has_product) return fill_float(g);
  const gemm_passes_t ps = gemm_passes(g);
  const double work = (double)g->batch * (double)g->m * (double)g->n * (double)g->k;
  /* Matrix-vector shapes; scaled float8 ones go to the packed path. Float4
   * ones decode (and scale) as the gemv loads them, summing in the order the
   * float32 copies of both operands (row-major) once took here. */
  if ((g->m == 1 || g->n == 1) &&
      ((!g->scale[0] && !g->scale[1]) || (g->a.pairs && g->b.pairs)))
    return gemv_float(g, &ps, work);
  fgemm_t f = {0};
  f.g = g;
  f.uk = pick_ukernel();
  f.ps = ps;
  const int mr = f.uk->mr, nr = f.uk->nr, nth = tpu_num_threads();
  /* Few columns (attention's P @ V): each A block serves at most a few B
   * panels, so transposing it into panels costs more than it saves; keep its
   * rows for tile_rows (see rows_a_strips). */
  f.dot2 = dot2_for(g, f.uk, &ps);
  f.rows_a = f.uk->tile_rows && f.uk->mr <= GEMM_MAX_MR && ps.np <= 2 && !g->scale[0] &&
             (g->a.dt == TPU_F32 || g->a.dt == TPU_BF16) && g->a.sc == 1 &&
             g->n <= ROWS_A_MAX_N && rows_a_allowed();
  /* balanced blocks: equal k blocks, A blocks and B blocks within their caps */
  const int64_t kcap = (f.rows_a ? ROWS_A_KC : KC) / ps.np; /* source steps per k block */
  f.nkb = (g->k + kcap - 1) / kcap;
  f.kcs = (g->k + f.nkb - 1) / f.nkb;
  f.nmb = (g->m + MC - 1) / MC;
  f.mc = round_up((g->m + f.nmb - 1) / f.nmb, mr);
  f.nmb = (g->m + f.mc - 1) / f.mc;
  int64_t ncb = (g->n + NC - 1) / NC;
  f.nc = round_up((g->n + ncb - 1) / ncb, nr);
  f.direct = g->c.dt == TPU_F32 && g->c.sc == 1 &&
             !(g->use_self && mats_overlap(&g->self, &g->c));
  /* c = a @ b + self (nn.Linear's bias, a residual) in the micro-kernel's
   * store, in the order ftile_store would add it */
  f.epi = f.direct && g->use_self && g->alpha == 1 && g->beta == 1 && g->self.dt == TPU_F32 &&
          g->self.sc == 1;
  f.jgroups = 1;
  const bool parallel = nth > 1 && work >= PARALLEL_MIN_WORK;
  const bool by_entry = parallel && g->batch > 1 &&
                        (g->batch >= 4 * nth ||
                         (g->batch >= nth && work / (double)g->batch <= BATCH_TASK_MAX_WORK));
  if (by_entry) {
    tpu_parallel_for(nth, 1, fgemm_entries, &f);
  } else {
    if (parallel) {
      /* enough items for the threads to share out evenly: smaller A blocks
       * (packing stays the same), then groups of each one's B panels (each
       * group packs the A block again) */
      while (f.nmb < 8 * nth && f.mc > 4 * mr) {
        f.mc = round_up(f.mc / 2, mr);
        f.nmb = (g->m + f.mc - 1) / f.mc;
      }
      int64_t npan = (f.nc + nr - 1) / nr;
      if (f.nmb < 4 * nth) f.jgroups = min64(npan, (4 * nth + f.nmb - 1) / f.nmb);
    }
    float* acc;
    float* pb = fgemm_alloc_scratch(&f, &acc);
    if (!pb) return TPU_ERR(RESOURCE_EXHAUSTED, "matmul: out of host memory for packing");
    for (int64_t bi = 0; bi < g->batch && !f.oom; bi++) fgemm_entry(&f, bi, parallel, pb, acc);
    free(pb);
  }
  if (f.oom) return TPU_ERR(RESOURCE_EXHAUSTED, "matmul: out of host memory for packing");
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
#ifdef TPU_GEMM_HAVE_X86
/* the same loops vectorized for AVX2 with fused multiply-adds */
DEFINE_RTILE(rtile_f64_avx2, f64, double, double,
             __attribute__((target("avx2,fma"), optimize("fp-contract=fast"))))
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
#ifdef TPU_GEMM_HAVE_X86
  if (is_f64 && isa_current() >= TPU_GEMM_ISA_AVX2) fn = rtile_f64_avx2;
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
  g.precision = tpu_kernel_precision();
  g.use_self = self != NULL && beta != 0;
  g.has_product = g.k > 0 && alpha != 0;
  if (g.use_self && !mat_broadcast(&g.self, self, g.batch, g.m, g.n))
    return TPU_ERR(INVALID_ARGUMENT,
                   "matmul: self of %d dims cannot broadcast to the result shape %lldx%lldx%lld",
                   (int)self->ndim, (long long)g.batch, (long long)g.m, (long long)g.n);
  return gemm_dispatch(&g, c);
}

tpu_status_t tpu_gemm_scaled(const tpu_tensor_t* a, const tpu_tensor_t* b, const tpu_tensor_t* c,
                             const tpu_gemm_scale_t* sa, const tpu_gemm_scale_t* sb,
                             const tpu_tensor_t* bias) {
  const tpu_tensor_t* ops[3] = {a, b, c};
  for (int i = 0; i < 3; i++)
    if (!ops[i] || ops[i]->ndim != 2 ||
        !(tpu_dtype_is_float(ops[i]->dtype) || (i < 2 && ops[i]->dtype == TPU_F4E2M1FNX2)) ||
        ops[i]->dtype == TPU_F64)
      return TPU_ERR(INVALID_ARGUMENT, "scaled matmul: operand %d must be a float matrix", i);
  gemm_t g = {0};
  mat_from(&g.a, a, false);
  mat_from(&g.b, b, false);
  mat_from(&g.c, c, false);
  if (a->dtype == TPU_F4E2M1FNX2) { /* K counts values: two a byte */
    g.a.pairs = MAT_PAIRS_COLS;
    g.a.nc *= 2;
    g.a.sc = a->strides[1];
  }
  if (b->dtype == TPU_F4E2M1FNX2) {
    g.b.pairs = MAT_PAIRS_ROWS;
    g.b.nr *= 2;
    g.b.sr = b->strides[0];
  }
  g.batch = 1;
  g.m = g.a.nr;
  g.k = g.a.nc;
  g.n = g.b.nc;
  if (g.b.nr != g.k || g.c.nr != g.m || g.c.nc != g.n)
    return TPU_ERR(INVALID_ARGUMENT, "scaled matmul: shapes %lldx%lld, %lldx%lld -> %lldx%lld",
                   (long long)g.m, (long long)g.k, (long long)g.b.nr, (long long)g.n,
                   (long long)g.c.nr, (long long)g.c.nc);
  g.alpha = g.beta = 1;
  g.precision = TPU_PRECISION_HIGHEST; /* float32 products of the scaled values */
  g.use_self = bias != NULL;
  g.has_product = g.k > 0;
  g.scale[0] = sa;
  g.scale[1] = sb;
  if (g.use_self && !mat_broadcast(&g.self, bias, 1, g.m, g.n))
    return TPU_ERR(INVALID_ARGUMENT, "scaled matmul: bias of %d dims cannot broadcast to %lldx%lld",
                   (int)bias->ndim, (long long)g.m, (long long)g.n);
  if (g.m == 0 || g.n == 0) return TPU_OK;
  if (mats_overlap(&g.c, &g.a) || mats_overlap(&g.c, &g.b) ||
      (g.use_self && mats_overlap(&g.c, &g.self)))
    return TPU_ERR(INVALID_ARGUMENT, "scaled matmul: the output overlaps an input");
  return gemm_float(&g);
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

/* c = beta * self + alpha * (a @ b) with the call's alpha (args[4]) and, when
 * `scaled_self`, its beta (args[3]); beta 1 otherwise. Complex operands or
 * scalars take the complex product. */
static tpu_status_t product(const tpu_call_t* call, const tpu_tensor_t* a, const tpu_tensor_t* b,
                           const tpu_tensor_t* c, const tpu_tensor_t* self, bool scaled_self,
                           bool batched) {
  double alpha[2] = {1, 0}, beta[2] = {1, 0};
  if (self) {
    (void)tpu_arg_complex(call, 4, alpha);
    if (scaled_self) (void)tpu_arg_complex(call, 3, beta);
  }
  if (tpu_call_has_complex(call))
    return tpu_complex_gemm(call->op ? call->op->name : "matmul", a, b, c, alpha, beta, self, batched);
  return batched ? tpu_gemm_batched(a, b, c, alpha[0], beta[0], self)
                 : tpu_gemm(a, b, c, alpha[0], beta[0], self);
}

tpu_status_t tpu_k_mm(const tpu_call_t* call) {
  return product(call, tpu_arg_tensor(call, 0), tpu_arg_tensor(call, 1), &call->outs[0], NULL,
                 false, false);
}

tpu_status_t tpu_k_bmm(const tpu_call_t* call) {
  return product(call, tpu_arg_tensor(call, 0), tpu_arg_tensor(call, 1), &call->outs[0], NULL,
                 false, true);
}

/* addmm(self, mat1, mat2, *, beta, alpha) and addmm_ */
tpu_status_t tpu_k_addmm(const tpu_call_t* call) {
  return product(call, tpu_arg_tensor(call, 1), tpu_arg_tensor(call, 2), &call->outs[0],
                 tpu_arg_tensor(call, 0), true, false);
}

/* baddbmm(self, batch1, batch2, *, beta, alpha) and baddbmm_ */
tpu_status_t tpu_k_baddbmm(const tpu_call_t* call) {
  return product(call, tpu_arg_tensor(call, 1), tpu_arg_tensor(call, 2), &call->outs[0],
                 tpu_arg_tensor(call, 0), true, true);
}

/* addbmm(self, batch1, batch2, *, beta, alpha): beta * self + alpha * sum_b
 * batch1[b] @ batch2[b], accumulated one batch at a time like PyTorch. */
tpu_status_t tpu_k_addbmm(const tpu_call_t* call) {
  const tpu_tensor_t* self = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* b1 = tpu_arg_tensor(call, 1);
  const tpu_tensor_t* b2 = tpu_arg_tensor(call, 2);
  const tpu_tensor_t* out = &call->outs[0];
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
    TPU_RETURN_IF_ERROR(product(call, &m1, &m2, out, i == 0 ? self : out, i == 0, false));
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
  return product(call, tpu_arg_tensor(call, 1), &v, &o, &s, true, false);
}

tpu_status_t tpu_k_mv(const tpu_call_t* call) {
  const tpu_tensor_t* vec = tpu_arg_tensor(call, 1);
  TPU_RETURN_IF_ERROR(check_vector("mv", "vec", vec));
  TPU_RETURN_IF_ERROR(check_vector("mv", "out", &call->outs[0]));
  tpu_tensor_t v = as_column(vec), o = as_column(&call->outs[0]);
  return product(call, tpu_arg_tensor(call, 0), &v, &o, NULL, false, false);
}

tpu_status_t tpu_k_dot(const tpu_call_t* call) {
  TPU_ROUTE_COMPLEX(call);
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
