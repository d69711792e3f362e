/* Discrete Fourier transforms: PyTorch's _fft_c2c, _fft_r2c and _fft_c2r.
 *
 * A 1-D transform of length n runs as a Stockham autosort FFT (no bit
 * reversal: every stage reads one buffer and writes the other) over the
 * factors of n: radix 4, 2, 3 and 5 butterflies, and a direct odd-radix
 * butterfly for primes up to 13. A length with a larger prime factor is
 * computed by Bluestein's algorithm: the transform as a convolution with a
 * chirp, done by FFTs of a 2^a 3^b 5^c length of at least 2n - 1.
 *
 * Precision: complex64 / float32 tensors compute in float (as pocketfft and
 * MKL do), complex128 / float64 in double; twiddles and chirps are computed
 * in double and rounded once. Plans (factors, twiddles, Bluestein's chirp
 * and its transform) are cached per (length, precision).
 *
 * A transform over several dims applies the 1-D transform along each dim in
 * turn. Lines along a dim are transformed in blocks of up to FFT_MAX_LANES
 * lines at once, in the lane layout of fft_kernel.h (split real and
 * imaginary parts, the lines interleaved), so that the butterflies vectorize
 * across lines; loading a block reads any strides (a strided dim reads runs
 * of adjacent lines). Blocks split across the thread pool. Real transforms
 * put two real lines in one complex lane (z = x1 + i x2, split or joined
 * through conjugate symmetry); a real output (c2r) is the inverse of the
 * Hermitian extension of its half spectrum. Normalization 0 is none, 1
 * scales by 1/sqrt(n) and 2 by 1/n, n the signal length of each transformed
 * dim. The kernels are compiled for the baseline ISA and for AVX2 + FMA
 * (vecmath.h's tpu_host_isa() picks at run time).
 */
#include <complex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "tpu/parallel.h"
#include "vecmath.h"
#include "zvalue.h"

#define FFT_MAX_FACTORS 64
#define FFT_MAX_DIRECT_RADIX 13
/* lines per block (per complex block; real blocks hold twice as many) */
#define FFT_MAX_LANES 64
/* the bytes a block's buffers aim to stay within (the L2 cache) */
#define FFT_BLOCK_BYTES (64 << 10)
#define FFT_BLOCK_BYTES_STRIDED (256 << 10)
#define FFT_BLOCK_MAX_BYTES (8 << 20)
#define FFT_PLAN_CACHE 16
/* output bytes per thread of a chunk of a multi-dim transform (see transform) */
#define FFT_CHUNK_BYTES (512 << 10)
/* butterfly loops run in chunks of this many values where they can */
#define FFT_VB 8

typedef struct fft_plan {
  int64_t n;
  bool dbl; /* double values (else float) */
  int nf;
  int fac[FFT_MAX_FACTORS];
  void* tw; /* per stage of length r * m: exp(-2 pi i p j / (r m)), p < m, 0 < j < r, as (re, im) */
  /* Bluestein (n has a prime factor above FFT_MAX_DIRECT_RADIX): */
  struct fft_plan* sub; /* length m */
  int64_t m;
  void* chirp; /* exp(-pi i k^2 / n), k < n, (re, im) */
  void* bfft;  /* FFT of the conjugate chirp, divided by m, (re, im) */
  /* the cache's bookkeeping, under g_plans.lock */
  int refs;
  uint64_t used;
} fft_plan_t;

typedef enum { K_C2C, K_R2C, K_C2R } fft_kind_t;

/* exp(-2 pi i p / n) for 0 <= p < n as hi[p >> sh] * lo[p & mask]: two
 * tables of about sqrt(n) (re, im) pairs in the plan's precision instead of
 * one of n. */
typedef struct fft_unit_table {
  int64_t n;
  int sh;
  int64_t mask;
  void* hi;
  void* lo;
  /* for the four-step twiddles (else NULL): exp(-2 pi i k l / n) for rows
   * k < the first pass's length and l < FFT_VB, at [k FFT_VB + l], real and
   * imaginary parts apart */
  void* lane_re;
  void* lane_im;
} fft_unit_table_t;

typedef struct fft_job {
  const tpu_tensor_t* src;
  const tpu_tensor_t* dst;
  int dim;
  int64_t n; /* signal length */
  fft_kind_t kind;
  bool forward;
  double scale;
  const fft_plan_t* plan;
  int64_t lines;
  int64_t lanes;     /* complex lanes of a full block */
  int64_t per_block; /* lines of a full block: lanes, or 2 lanes for real kinds */
  /* the first pass of a long line (see along_long): element k of line l is
   * multiplied by exp(-+2 pi i k l / tw4->n) after its transform; else NULL */
  const fft_unit_table_t* tw4;
  _Atomic int failed;
} fft_job_t;

/* The pass between a real long line and its half-length complex transform
 * (see along_long): pairs (k, m - k) for k in [begin, end) of [0, m / 2]. */
typedef struct fft_real_pass {
  const fft_unit_table_t* t; /* n = 2 m */
  int64_t m;
  const void* x; /* r2c: unused; c2r: the half spectrum, xlen values at stride xs */
  int64_t xs, xlen;
  void* z; /* r2c: Z in, X out (stride zs); c2r: Z out (contiguous) */
  int64_t zs;
  bool two_sided; /* r2c: X has 2 m values, the upper half conjugates */
  double scale;
} fft_real_pass_t;

static void fft_unit(int64_t num, int64_t den, double* re, double* im) { /* exp(-2 pi i num / den) */
  const double a = -2.0 * M_PI * (double)(num % den) / (double)den;
  *re = cos(a);
  *im = sin(a);
}

/* Block buffers: each thread keeps its last one (up to FFT_SCRATCH_KEEP
 * bytes) for the next call, freed when the thread exits; a fresh allocation
 * per call would fault its pages in again, a large part of a call's time. */
#define FFT_SCRATCH_KEEP ((size_t)4 << 20)
typedef struct fft_scratch {
  void* p;
  size_t size;
  bool busy; /* handed out (a nested caller gets its own allocation) */
} fft_scratch_t;
static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void* v) {
  fft_scratch_t* s = v;
  free(s->p);
  free(s);
}
static void scratch_key_make(void) {
  if (pthread_key_create(&g_scratch_key, scratch_free) != 0) g_scratch_key = (pthread_key_t)-1;
}

/* bytes of scratch, or NULL; give it back with scratch_put */
static void* scratch_get(size_t bytes) {
  pthread_once(&g_scratch_once, scratch_key_make);
  if (bytes > FFT_SCRATCH_KEEP || g_scratch_key == (pthread_key_t)-1) return malloc(bytes);
  fft_scratch_t* s = pthread_getspecific(g_scratch_key);
  if (s && s->busy) return malloc(bytes);
  if (!s) {
    s = calloc(1, sizeof *s);
    if (!s || pthread_setspecific(g_scratch_key, s) != 0) {
      free(s);
      return malloc(bytes);
    }
  }
  if (s->size < bytes) {
    free(s->p);
    s->p = malloc(bytes);
    s->size = s->p ? bytes : 0;
  }
  s->busy = s->p != NULL;
  return s->p;
}

static void scratch_put(void* p) {
  fft_scratch_t* s = g_scratch_key == (pthread_key_t)-1 ? NULL : pthread_getspecific(g_scratch_key);
  if (s && p && p == s->p) s->busy = false;
  else free(p);
}

/* values (of the plan's precision) a block's buffers take: a and b (n per
 * lane each, real and imaginary), and Bluestein's work (4 m per lane) */
static size_t fft_buf_elems(const fft_job_t* j) {
  const fft_plan_t* p = j->plan;
  return (size_t)((4 * p->n + (p->sub ? 4 * p->m : 0)) * j->lanes);
}

/* Byte offsets of the first element of line l along dim in src and dst. */
static void fft_line_offsets(const tpu_tensor_t* src, const tpu_tensor_t* dst, int dim, int64_t l,
                             int64_t* so, int64_t* dof) {
  int64_t rem = l, s = 0, d = 0;
  for (int k = dst->ndim - 1; k >= 0; k--) {
    if (k == dim) continue;
    const int64_t i = rem % dst->sizes[k];
    rem /= dst->sizes[k];
    s += i * src->strides[k];
    d += i * dst->strides[k];
  }
  *so = s * (int64_t)tpu_dtype_size(src->dtype);
  *dof = d * (int64_t)tpu_dtype_size(dst->dtype);
}

/* The butterfly loops read one buffer and write the other: no dependences
 * between iterations, whatever the vectorizer can prove about the legs. */
#if defined(__GNUC__) && !defined(__clang__)
#define FFT_IVDEP _Pragma("GCC ivdep")
#else
#define FFT_IVDEP
#endif
#define FFT_INLINE static inline __attribute__((always_inline))
#define CMUL_RE(ar, ai, br, bi) ((ar) * (br) - (ai) * (bi))
#define CMUL_IM(ar, ai, br, bi) ((ar) * (bi) + (ai) * (br))

/* One copy of the kernels per precision and ISA. */
typedef struct fft_kernels {
  const char* name;
  /* the forward transforms of w lanes (see fft_kernel.h's exec) */
  void (*exec)(const fft_plan_t* p, int64_t w, void* ar, void* ai, void* br, void* bi, void* work,
               void** out_r, void** out_i);
  void (*blocks)(void* job, int64_t begin, int64_t end);
  /* tpu_parallel_for bodies over a fft_real_pass_t */
  void (*real_post)(void* pass, int64_t begin, int64_t end);
  void (*real_pre)(void* pass, int64_t begin, int64_t end);
} fft_kernels_t;

#ifdef TPU_HAVE_AVX2_BUILD
/* ---- 8 x 8 float tiles between rows (a line each) and lanes, AVX2 ---- */

TPU_VM_AVX2_INLINE void fft_transpose8_avx2(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 4; i++) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; i++) {
    u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  for (int i = 0; i < 4; i++) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

/* De-interleaving 8 complex values with shuffle_ps leaves them in the order
 * 0 1 4 5 2 3 6 7; the tiles keep that order through the transpose and
 * place each row by it, so no lane-crossing permute is needed. */
static const int k_fft_tile_order[8] = {0, 1, 4, 5, 2, 3, 6, 7};

/* elements k0..k0+7 of 8 complex64 rows -> rows 0..7 (stride w) of 8 lanes */
TPU_VM_AVX2_INLINE void fft_c64_tile_load_avx2(const float* const* rows, int64_t k0, float* dr,
                                               float* di, int64_t w) {
  __m256 re[8], im[8];
  for (int j = 0; j < 8; j++) {
    const __m256 a = _mm256_loadu_ps(rows[j] + 2 * k0), b = _mm256_loadu_ps(rows[j] + 2 * k0 + 8);
    re[j] = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    im[j] = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
  }
  fft_transpose8_avx2(re);
  fft_transpose8_avx2(im);
  for (int i = 0; i < 8; i++) {
    _mm256_storeu_ps(dr + k_fft_tile_order[i] * w, re[i]);
    _mm256_storeu_ps(di + k_fft_tile_order[i] * w, im[i]);
  }
}

/* the inverse, times scale */
TPU_VM_AVX2_INLINE void fft_c64_tile_store_avx2(float* const* rows, int64_t k0, const float* sr,
                                                const float* si, int64_t w, float scale) {
  __m256 re[8], im[8];
  const __m256 sc = _mm256_set1_ps(scale);
  for (int i = 0; i < 8; i++) {
    re[i] = _mm256_mul_ps(_mm256_loadu_ps(sr + k_fft_tile_order[i] * w), sc);
    im[i] = _mm256_mul_ps(_mm256_loadu_ps(si + k_fft_tile_order[i] * w), sc);
  }
  fft_transpose8_avx2(re);
  fft_transpose8_avx2(im);
  for (int j = 0; j < 8; j++) {
    _mm256_storeu_ps(rows[j] + 2 * k0, _mm256_unpacklo_ps(re[j], im[j]));
    _mm256_storeu_ps(rows[j] + 2 * k0 + 8, _mm256_unpackhi_ps(re[j], im[j]));
  }
}

TPU_VM_AVX2_INLINE void fft_f32_tile_load_avx2(const float* const* rows, int64_t k0, float* d,
                                               int64_t w) {
  __m256 v[8];
  for (int j = 0; j < 8; j++) v[j] = _mm256_loadu_ps(rows[j] + k0);
  fft_transpose8_avx2(v);
  for (int i = 0; i < 8; i++) _mm256_storeu_ps(d + i * w, v[i]);
}

TPU_VM_AVX2_INLINE void fft_f32_tile_store_avx2(float* const* rows, int64_t k0, const float* s,
                                                int64_t w, float scale) {
  __m256 v[8];
  const __m256 sc = _mm256_set1_ps(scale);
  for (int i = 0; i < 8; i++) v[i] = _mm256_mul_ps(_mm256_loadu_ps(s + i * w), sc);
  fft_transpose8_avx2(v);
  for (int j = 0; j < 8; j++) _mm256_storeu_ps(rows[j] + k0, v[j]);
}
#endif

#define FT float
#define FT_C TPU_C64
#define FT_R TPU_F32
#define FN(x) fft_f_p_##x
#define FATTR TPU_VEC_PORTABLE
#include "fft_kernel.h"
#undef FN
#undef FATTR
#ifdef TPU_HAVE_AVX2_BUILD
#define FN(x) fft_f_a_##x
#define FATTR TPU_VEC_AVX2
#define FFT_TILES
#define FFT_TILE_LOAD_C fft_c64_tile_load_avx2
#define FFT_TILE_STORE_C fft_c64_tile_store_avx2
#define FFT_TILE_LOAD_R fft_f32_tile_load_avx2
#define FFT_TILE_STORE_R fft_f32_tile_store_avx2
#include "fft_kernel.h"
#undef FFT_TILES
#undef FN
#undef FATTR
#endif
#undef FT
#undef FT_C
#undef FT_R
#define FT double
#define FT_C TPU_C128
#define FT_R TPU_F64
#define FN(x) fft_d_p_##x
#define FATTR TPU_VEC_PORTABLE
#include "fft_kernel.h"
#undef FN
#undef FATTR
#ifdef TPU_HAVE_AVX2_BUILD
#define FN(x) fft_d_a_##x
#define FATTR TPU_VEC_AVX2
#include "fft_kernel.h"
#undef FN
#undef FATTR
#endif
#undef FT
#undef FT_C
#undef FT_R

static const fft_kernels_t k_fft_f_portable = {"portable", fft_f_p_exec_any, fft_f_p_blocks,
                                             fft_f_p_real_post, fft_f_p_real_pre};
static const fft_kernels_t k_fft_d_portable = {"portable", fft_d_p_exec_any, fft_d_p_blocks,
                                             fft_d_p_real_post, fft_d_p_real_pre};
#ifdef TPU_HAVE_AVX2_BUILD
static const fft_kernels_t k_fft_f_avx2 = {"avx2", fft_f_a_exec_any, fft_f_a_blocks,
                                             fft_f_a_real_post, fft_f_a_real_pre};
static const fft_kernels_t k_fft_d_avx2 = {"avx2", fft_d_a_exec_any, fft_d_a_blocks,
                                             fft_d_a_real_post, fft_d_a_real_pre};
#endif

static const fft_kernels_t* kernels_for(bool dbl) {
#ifdef TPU_HAVE_AVX2_BUILD
  if (tpu_host_isa() == TPU_ISA_AVX2) return dbl ? &k_fft_d_avx2 : &k_fft_f_avx2;
#endif
  return dbl ? &k_fft_d_portable : &k_fft_f_portable;
}

/* ---- plans ---- */

static void plan_free(fft_plan_t* p) {
  if (!p) return;
  free(p->tw);
  free(p->chirp);
  free(p->bfft);
  plan_free(p->sub);
  free(p);
}

static void put_z(void* a, bool dbl, int64_t i, double re, double im) {
  if (dbl) {
    ((double*)a)[2 * i] = re;
    ((double*)a)[2 * i + 1] = im;
  } else {
    ((float*)a)[2 * i] = (float)re;
    ((float*)a)[2 * i + 1] = (float)im;
  }
}

static void put_split(void* re_arr, void* im_arr, bool dbl, int64_t i, double re, double im) {
  if (dbl) {
    ((double*)re_arr)[i] = re;
    ((double*)im_arr)[i] = im;
  } else {
    ((float*)re_arr)[i] = (float)re;
    ((float*)im_arr)[i] = (float)im;
  }
}

static int64_t smooth_at_least(int64_t n) {
  for (int64_t m = n;; m++) {
    int64_t r = m;
    while (r % 2 == 0) r /= 2;
    while (r % 3 == 0) r /= 3;
    while (r % 5 == 0) r /= 5;
    if (r == 1) return m;
  }
}

static fft_plan_t* plan_make(int64_t n, bool dbl);

/* Bluestein's chirp and the transform of its conjugate, for p->n */
static bool plan_bluestein(fft_plan_t* p) {
  const int64_t n = p->n, m = smooth_at_least(2 * n - 1);
  const size_t vs = p->dbl ? sizeof(double) : sizeof(float);
  p->m = m;
  p->sub = plan_make(m, p->dbl);
  p->chirp = malloc((size_t)n * 2 * vs);
  p->bfft = malloc((size_t)m * 2 * vs);
  char* work = malloc((size_t)m * 4 * vs);
  if (!p->sub || !p->chirp || !p->bfft || !work) {
    free(work);
    return false;
  }
  char *ar = work, *ai = work + m * vs, *br = work + 2 * m * vs, *bi = work + 3 * m * vs;
  memset(work, 0, (size_t)m * 2 * vs);
  for (int64_t k = 0; k < n; k++) {
    double re, im;
    fft_unit((k * k) % (2 * n), 2 * n, &re, &im);
    put_z(p->chirp, p->dbl, k, re, im);
    /* b = conj(chirp), placed cyclically at k and m - k */
    put_split(ar, ai, p->dbl, k, re, -im);
    if (k > 0) put_split(ar, ai, p->dbl, m - k, re, -im);
  }
  void *zr, *zi;
  kernels_for(p->dbl)->exec(p->sub, 1, ar, ai, br, bi, NULL, &zr, &zi);
  for (int64_t k = 0; k < m; k++) {
    const double re = p->dbl ? ((double*)zr)[k] : ((float*)zr)[k];
    const double im = p->dbl ? ((double*)zi)[k] : ((float*)zi)[k];
    put_z(p->bfft, p->dbl, k, re / (double)m, im / (double)m);
  }
  free(work);
  return true;
}

static fft_plan_t* plan_make(int64_t n, bool dbl) {
  fft_plan_t* p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->n = n;
  p->dbl = dbl;
  int64_t r = n;
  while (r % 4 == 0 && p->nf < FFT_MAX_FACTORS) { p->fac[p->nf++] = 4; r /= 4; }
  while (r % 2 == 0 && p->nf < FFT_MAX_FACTORS) { p->fac[p->nf++] = 2; r /= 2; }
  for (int64_t f = 3; r > 1; f += 2) {
    if (f * f > r) f = r; /* what is left is prime */
    while (r % f == 0 && p->nf < FFT_MAX_FACTORS) {
      p->fac[p->nf++] = (int)(f < INT32_MAX ? f : INT32_MAX);
      r /= f;
    }
  }
  bool direct = true;
  for (int i = 0; i < p->nf; i++) direct = direct && p->fac[i] <= FFT_MAX_DIRECT_RADIX;
  if (!direct) {
    p->nf = 0;
    if (!plan_bluestein(p)) {
      plan_free(p);
      return NULL;
    }
    return p;
  }
  p->tw = malloc((size_t)(2 * n + 2) * (dbl ? sizeof(double) : sizeof(float)));
  if (!p->tw) {
    plan_free(p);
    return NULL;
  }
  int64_t t = 0, len = n;
  for (int i = 0; i < p->nf; i++) {
    const int rr = p->fac[i];
    const int64_t m = len / rr;
    for (int64_t q = 0; q < m; q++)
      for (int j = 1; j < rr; j++) {
        double re, im;
        fft_unit(q * j, len, &re, &im);
        put_z(p->tw, dbl, t++, re, im);
      }
    len = m;
  }
  return p;
}

/* The plan cache: the FFT_PLAN_CACHE plans used last, each with a count of
 * holders (the cache is one); a plan is freed when its last holder lets go. */
static struct {
  pthread_mutex_t lock;
  fft_plan_t* slot[FFT_PLAN_CACHE];
  uint64_t clock;
} g_plans = {PTHREAD_MUTEX_INITIALIZER, {0}, 0};

static void plan_release(fft_plan_t* p) {
  pthread_mutex_lock(&g_plans.lock);
  const bool last = --p->refs == 0;
  pthread_mutex_unlock(&g_plans.lock);
  if (last) plan_free(p);
}

/* A plan for length n held by the caller (plan_release), or NULL when out of memory. */
static fft_plan_t* plan_get(int64_t n, bool dbl) {
  pthread_mutex_lock(&g_plans.lock);
  for (int i = 0; i < FFT_PLAN_CACHE; i++) {
    fft_plan_t* p = g_plans.slot[i];
    if (p && p->n == n && p->dbl == dbl) {
      p->refs++;
      p->used = ++g_plans.clock;
      pthread_mutex_unlock(&g_plans.lock);
      return p;
    }
  }
  pthread_mutex_unlock(&g_plans.lock);
  fft_plan_t* p = plan_make(n, dbl);
  if (!p) return NULL;
  fft_plan_t* evicted = NULL;
  pthread_mutex_lock(&g_plans.lock);
  int at = 0;
  for (int i = 0; i < FFT_PLAN_CACHE; i++) {
    if (!g_plans.slot[i]) {
      at = i;
      break;
    }
    if (g_plans.slot[i]->used < g_plans.slot[at]->used) at = i;
  }
  if (g_plans.slot[at] && --g_plans.slot[at]->refs == 0) evicted = g_plans.slot[at];
  g_plans.slot[at] = p;
  p->refs = 2;
  p->used = ++g_plans.clock;
  pthread_mutex_unlock(&g_plans.lock);
  plan_free(evicted);
  return p;
}

/* ---- transforms along one dim ---- */

/* The lines along dim, in blocks of lanes split across the thread pool,
 * with a given plan (of length n), scale and four-step twiddles (or NULL). */
static tpu_status_t along_lines(const char* op, const tpu_tensor_t* src, const tpu_tensor_t* dst,
                                int dim, fft_kind_t kind, bool forward, double scale,
                                const fft_plan_t* plan, const fft_unit_table_t* tw4) {
  const int64_t n = plan->n;
  const bool dbl = plan->dbl;
  fft_job_t j = {src, dst, dim, n, kind, forward, scale, plan, 0, 0, 0, tw4, 0};
  j.lines = tpu_tensor_numel(dst) / dst->sizes[dim];
  const int64_t lane_bytes = (4 * n + (plan->sub ? 4 * plan->m : 0)) * (dbl ? 8 : 4);
  const int64_t line_per_lane = kind == K_C2C ? 1 : 2;
  /* lanes for the cache budget, at least FFT_VB (the chunked loops) where that
   * stays within FFT_BLOCK_MAX_BYTES */
  int64_t lanes = (src->strides[dim] == 1 ? FFT_BLOCK_BYTES : FFT_BLOCK_BYTES_STRIDED) / lane_bytes;
  if (lanes < FFT_VB) {
    lanes = FFT_BLOCK_MAX_BYTES / lane_bytes;
    lanes = lanes < 1 ? 1 : lanes > FFT_VB ? FFT_VB : lanes;
  }
  lanes = lanes > FFT_MAX_LANES ? FFT_MAX_LANES : lanes;
  const int64_t want = (j.lines + line_per_lane - 1) / line_per_lane;
  j.lanes = lanes < want ? lanes : want;
  j.per_block = j.lanes * line_per_lane;
  const int64_t blocks = (j.lines + j.per_block - 1) / j.per_block;
  const int64_t per = n * j.per_block, grain = per >= 32768 ? 1 : (32768 + per - 1) / per;
  tpu_parallel_for(blocks, grain, kernels_for(dbl)->blocks, &j);
  if (j.failed) return TPU_ERR(RESOURCE_EXHAUSTED, "%s: no host memory for a length-%lld line", op, (long long)n);
  return TPU_OK;
}

/* ---- long lines: the four-step split ----
 * A line of n = n1 n2 complex values longer than the caches is viewed as an
 * n1 x n2 matrix, x_{a n2 + b} at (a, b). Pass 1 transforms its n2 columns
 * (n1 points each, blocks of adjacent columns as lanes) into a temporary,
 * multiplying (k1, b) by W^(k1 b), W = exp(-2 pi i / n); pass 2 transforms
 * the temporary's n1 rows (n2 points) into X_{k1 + n1 k2}. Each pass keeps
 * a block of lanes in cache and splits its blocks across the pool. A real
 * line of even length n goes through the complex transform of length n / 2
 * of its value pairs (fft_kernel.h's real_post and real_pre). */

/* the smallest line (values of a complex transform) taken in two passes:
 * where one lane's buffers (16 n bytes for float) outgrow the L2 cache */
#define FFT_LONG_MIN_BYTES (1 << 20)
/* neither factor of the split below this */
#define FFT_LONG_MIN_FACTOR 16

static void unit_table_free(fft_unit_table_t* t) {
  free(t->hi);
  free(t->lo);
  free(t->lane_re);
  free(t->lane_im);
}

/* the lane table of t for rows < n1, from hi and lo (products in double) */
static bool unit_table_lanes(fft_unit_table_t* t, int64_t n1, bool dbl) {
  const size_t vs = dbl ? sizeof(double) : sizeof(float);
  t->lane_re = malloc((size_t)(n1 * FFT_VB) * vs);
  t->lane_im = malloc((size_t)(n1 * FFT_VB) * vs);
  if (!t->lane_re || !t->lane_im) return false;
  for (int64_t k = 0; k < n1; k++)
    for (int64_t l = 0; l < FFT_VB; l++) {
      const int64_t p = k * l % t->n, h = p >> t->sh, o = p & t->mask;
      const double hr = dbl ? ((double*)t->hi)[2 * h] : ((float*)t->hi)[2 * h];
      const double hi = dbl ? ((double*)t->hi)[2 * h + 1] : ((float*)t->hi)[2 * h + 1];
      const double lr = dbl ? ((double*)t->lo)[2 * o] : ((float*)t->lo)[2 * o];
      const double li = dbl ? ((double*)t->lo)[2 * o + 1] : ((float*)t->lo)[2 * o + 1];
      put_split(t->lane_re, t->lane_im, dbl, k * FFT_VB + l, hr * lr - hi * li, hr * li + hi * lr);
    }
  return true;
}

static bool unit_table_make(fft_unit_table_t* t, int64_t n, bool dbl) {
  int sh = 0;
  while (((int64_t)1 << (2 * sh)) < n) sh++;
  const int64_t s = (int64_t)1 << sh, nh = (n - 1) / s + 1;
  const size_t vs = dbl ? sizeof(double) : sizeof(float);
  *t = (fft_unit_table_t){n, sh, s - 1, malloc((size_t)nh * 2 * vs), malloc((size_t)s * 2 * vs), NULL, NULL};
  if (!t->hi || !t->lo) {
    unit_table_free(t);
    return false;
  }
  double re, im;
  for (int64_t i = 0; i < nh; i++) {
    fft_unit(i * s, n, &re, &im);
    put_z(t->hi, dbl, i, re, im);
  }
  for (int64_t i = 0; i < s; i++) {
    fft_unit(i, n, &re, &im);
    put_z(t->lo, dbl, i, re, im);
  }
  return true;
}

/* The split n = n1 n2 with n1 >= n2 as close as it gets to sqrt(n), or
 * false when n is too short for two passes or has no such split. */
static bool long_split(int64_t n, bool dbl, int64_t* n1, int64_t* n2) {
  if (n * 4 * (dbl ? 8 : 4) < FFT_LONG_MIN_BYTES) return false;
  int64_t d = 1;
  for (int64_t f = 2; f * f <= n; f++)
    if (n % f == 0) d = f;
  *n1 = n / d;
  *n2 = d;
  return d >= FFT_LONG_MIN_FACTOR;
}

/* 2-D views of a line at byte offset off: (rows, cols) with element
 * strides (rs, cs) */
static tpu_tensor_t line_view(const tpu_tensor_t* t, tpu_dtype_t dtype, int64_t off, int64_t rows,
                              int64_t cols, int64_t rs, int64_t cs) {
  tpu_tensor_t v = *t;
  v.data = (char*)t->data + off;
  v.dtype = dtype;
  v.ndim = 2;
  v.sizes[0] = rows;
  v.sizes[1] = cols;
  v.strides[0] = rs;
  v.strides[1] = cs;
  return v;
}

/* One complex line of n1 n2 values, src view (n1, n2) to dst view (n1, n2)
 * holding X_{k1 + n1 k2} at (k1, k2), through tmp (n1 n2 values of the
 * plan's complex dtype). */
static tpu_status_t long_c2c(const char* op, const tpu_tensor_t* src, const tpu_tensor_t* dst,
                             bool forward, double scale, const fft_plan_t* p1, const fft_plan_t* p2,
                             const fft_unit_table_t* tw4, void* tmp) {
  const int64_t n1 = p1->n, n2 = p2->n;
  tpu_tensor_t t;
  const int64_t sizes[2] = {n1, n2};
  tpu_tensor_make_contig(&t, tmp, p1->dbl ? TPU_C128 : TPU_C64, 2, sizes);
  TPU_RETURN_IF_ERROR(along_lines(op, src, &t, 0, K_C2C, forward, 1.0, p1, tw4));
  return along_lines(op, &t, dst, 1, K_C2C, forward, scale, p2, NULL);
}

/* Every line along dim through the four-step split of the complex length
 * n / 2 (real kinds) or n; false in *done where this route does not apply
 * (short lines, no split, or a real line that is odd, strided or of
 * another precision). */
static tpu_status_t along_long(const char* op, const tpu_tensor_t* src, const tpu_tensor_t* dst,
                               int dim, int64_t n, fft_kind_t kind, bool forward, double scale,
                               bool dbl, bool* done) {
  *done = false;
  const tpu_dtype_t ct = dbl ? TPU_C128 : TPU_C64, rt = dbl ? TPU_F64 : TPU_F32;
  const bool real = kind != K_C2C;
  if (real && (n % 2 || (kind == K_R2C ? src : dst)->strides[dim] != 1 ||
               (kind == K_R2C ? src : dst)->dtype != rt || (kind == K_R2C ? dst : src)->dtype != ct))
    return TPU_OK;
  const int64_t m = real ? n / 2 : n;
  int64_t n1, n2;
  if (!long_split(m, dbl, &n1, &n2)) return TPU_OK;
  *done = true;
  fft_plan_t *p1 = plan_get(n1, dbl), *p2 = plan_get(n2, dbl);
  fft_unit_table_t tw4 = {0}, twr = {0};
  const size_t cs = tpu_dtype_size(ct);
  void* tmp = malloc((size_t)m * cs);
  tpu_status_t s = TPU_OK;
  if (!p1 || !p2 || !tmp || !unit_table_make(&tw4, m, dbl) || !unit_table_lanes(&tw4, n1, dbl) ||
      (real && !unit_table_make(&twr, n, dbl))) {
    s = TPU_ERR(RESOURCE_EXHAUSTED, "%s: no host memory for a length-%lld line", op, (long long)n);
    goto done;
  }
  const fft_kernels_t* kern = kernels_for(dbl);
  const int64_t lines = tpu_tensor_numel(dst) / dst->sizes[dim];
  const int64_t ss = src->strides[dim], ds = dst->strides[dim];
  const int64_t grain = 4096;
  for (int64_t l = 0; l < lines && !s; l++) {
    int64_t so, dof;
    fft_line_offsets(src, dst, dim, l, &so, &dof);
    if (kind == K_C2C) {
      const tpu_tensor_t sv = line_view(src, src->dtype, so, n1, n2, n2 * ss, ss);
      const tpu_tensor_t dv = line_view(dst, dst->dtype, dof, n1, n2, ds, n1 * ds);
      s = long_c2c(op, &sv, &dv, forward, scale, p1, p2, &tw4, tmp);
    } else if (kind == K_R2C) {
      /* the real values as m complex pairs; Z into the first m rows of dst */
      const tpu_tensor_t sv = line_view(src, ct, so, n1, n2, n2, 1);
      const tpu_tensor_t dv = line_view(dst, ct, dof, n1, n2, ds, n1 * ds);
      s = long_c2c(op, &sv, &dv, true, 1.0, p1, p2, &tw4, tmp);
      fft_real_pass_t q = {&twr, m, NULL, 0, 0, (char*)dst->data + dof, ds,
                           dst->sizes[dim] == n, scale};
      if (!s) tpu_parallel_for(m / 2 + 1, grain, kern->real_post, &q);
    } else {
      /* Z into dst (m complex pairs), then its inverse in place */
      const tpu_tensor_t dv = line_view(dst, ct, dof, n1, n2, 1, n1);
      fft_real_pass_t q = {&twr, m, (const char*)src->data + so, ss, src->sizes[dim],
                           (char*)dst->data + dof, 1, false, 1.0};
      tpu_parallel_for(m / 2 + 1, grain, kern->real_pre, &q);
      const tpu_tensor_t zv = line_view(dst, ct, dof, n1, n2, n2, 1);
      s = long_c2c(op, &zv, &dv, false, scale, p1, p2, &tw4, tmp);
    }
  }
done:
  if (p1) plan_release(p1);
  if (p2) plan_release(p2);
  unit_table_free(&tw4);
  unit_table_free(&twr);
  free(tmp);
  return s;
}

static tpu_status_t along(const char* op, const tpu_tensor_t* src, const tpu_tensor_t* dst, int dim,
                          int64_t n, fft_kind_t kind, bool forward, int64_t norm) {
  if (n == 0 || tpu_tensor_numel(dst) == 0) return TPU_OK;
  const bool dbl = tpu_dtype_size(dst->dtype) == (kind == K_C2R ? 8 : 16) ||
                   tpu_dtype_size(src->dtype) == (kind == K_R2C ? 8 : 16);
  const double scale = norm == 2 ? 1.0 / (double)n : norm == 1 ? 1.0 / sqrt((double)n) : 1.0;
  bool done;
  TPU_RETURN_IF_ERROR(along_long(op, src, dst, dim, n, kind, forward, scale, dbl, &done));
  if (done) return TPU_OK;
  fft_plan_t* plan = plan_get(n, dbl);
  if (!plan) return TPU_ERR(RESOURCE_EXHAUSTED, "%s: no host memory for a length-%lld plan", op, (long long)n);
  const tpu_status_t s = along_lines(op, src, dst, dim, kind, forward, scale, plan, NULL);
  plan_release(plan);
  return s;
}

/* dims argument (index 1) wrapped and checked against t */
static tpu_status_t read_dims(const tpu_call_t* c, const char* op, const tpu_tensor_t* t, int* dims,
                              int* nd) {
  const tpu_arg_t* a = &c->args[1];
  TPU_CHECK_ARG(a->kind == TPU_ARG_INTLIST && a->n <= TPU_MAX_DIMS, "%s: dim must be a list of ints", op);
  *nd = a->n;
  for (int i = 0; i < a->n; i++) {
    int64_t d = a->v.ilist[i] < 0 ? a->v.ilist[i] + t->ndim : a->v.ilist[i];
    TPU_CHECK_ARG(d >= 0 && d < t->ndim, "%s: dim %lld out of range for a %d-D tensor", op,
                  (long long)a->v.ilist[i], (int)t->ndim);
    dims[i] = (int)d;
  }
  return TPU_OK;
}

static tpu_status_t check_dtypes(const char* op, const tpu_tensor_t* in, const tpu_tensor_t* out,
                                 bool in_complex, bool out_complex) {
  const bool ok_in = in_complex ? tpu_dtype_is_complex(in->dtype)
                                : (in->dtype == TPU_F32 || in->dtype == TPU_F64);
  const bool ok_out = out_complex ? tpu_dtype_is_complex(out->dtype)
                                  : (out->dtype == TPU_F32 || out->dtype == TPU_F64);
  if (!ok_in || !ok_out)
    return TPU_ERR(UNIMPLEMENTED, "%s: unsupported dtypes %s -> %s (tpu transforms float32, float64, "
                   "complex64 and complex128)", op, tpu_dtype_name(in->dtype), tpu_dtype_name(out->dtype));
  return TPU_OK;
}

/* The passes of one op over in and out (or one chunk of them): c2c each dim
 * in turn; r2c the last dim real-to-complex, then the others forward; c2r
 * the dims but the last complex-to-complex backward into tmp (self is not
 * written; tmp holds in's elements), then the last complex-to-real. */
static tpu_status_t passes(const char* op, fft_kind_t kind, const tpu_tensor_t* in,
                           const tpu_tensor_t* out, const int* dims, int nd, int64_t norm,
                           bool forward, void* tmp_data) {
  const int last = dims[nd - 1];
  if (kind == K_C2C) { /* the dims in any order: the one of smallest input stride first */
    int order[TPU_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
      int at = i;
      while (at > 0 && in->strides[order[at - 1]] > in->strides[dims[i]]) {
        order[at] = order[at - 1];
        at--;
      }
      order[at] = dims[i];
    }
    for (int i = 0; i < nd; i++)
      TPU_RETURN_IF_ERROR(along(op, i == 0 ? in : out, out, order[i], out->sizes[order[i]], K_C2C,
                                forward, norm));
    return TPU_OK;
  }
  if (kind == K_R2C) {
    TPU_RETURN_IF_ERROR(along(op, in, out, last, in->sizes[last], K_R2C, true, norm));
    for (int i = 0; i < nd - 1; i++)
      TPU_RETURN_IF_ERROR(along(op, out, out, dims[i], out->sizes[dims[i]], K_C2C, true, norm));
    return TPU_OK;
  }
  const int64_t n = out->sizes[last];
  if (nd == 1) return along(op, in, out, last, n, K_C2R, false, norm);
  tpu_tensor_t tmp;
  tpu_tensor_make_contig(&tmp, tmp_data, in->dtype, in->ndim, in->sizes);
  for (int i = 0; i < nd - 1; i++)
    TPU_RETURN_IF_ERROR(along(op, i == 0 ? in : &tmp, &tmp, dims[i], in->sizes[dims[i]], K_C2C,
                              false, norm));
  return along(op, &tmp, out, last, n, K_C2R, false, norm);
}

/* A transform cut into chunks along batch dim b (see transform). */
typedef struct fft_chunks {
  const char* op;
  fft_kind_t kind;
  const tpu_tensor_t *in, *out;
  const int* dims;
  int nd;
  int64_t norm;
  bool forward;
  int b;
  int64_t nb, chunk; /* slices along b, slices per chunk */
  _Atomic(tpu_status_t) status; /* the first failure */
} fft_chunks_t;

static void chunks_range(void* vctx, int64_t begin, int64_t end) {
  fft_chunks_t* cx = vctx;
  const tpu_tensor_t *in = cx->in, *out = cx->out;
  const int b = cx->b;
  void* tmp = NULL;
  tpu_status_t s = TPU_OK;
  if (cx->kind == K_C2R && cx->nd > 1) {
    const int64_t tmp_numel = tpu_tensor_numel(in) / cx->nb * cx->chunk;
    tmp = malloc((size_t)(tmp_numel > 0 ? tmp_numel : 1) * tpu_dtype_size(in->dtype));
    if (!tmp) s = TPU_ERR(RESOURCE_EXHAUSTED, "%s: no host memory for a %lld-element temporary",
                          cx->op, (long long)tmp_numel);
  }
  for (int64_t c = begin; c < end && !s; c++) {
    const int64_t c0 = c * cx->chunk;
    tpu_tensor_t ic = *in, oc = *out;
    if (b >= 0) {
      ic.sizes[b] = oc.sizes[b] = c0 + cx->chunk < cx->nb ? cx->chunk : cx->nb - c0;
      ic.data = (char*)in->data + c0 * in->strides[b] * (int64_t)tpu_dtype_size(in->dtype);
      oc.data = (char*)out->data + c0 * out->strides[b] * (int64_t)tpu_dtype_size(out->dtype);
    }
    s = passes(cx->op, cx->kind, &ic, &oc, cx->dims, cx->nd, cx->norm, cx->forward, tmp);
  }
  free(tmp);
  tpu_status_t none = TPU_OK;
  if (s && !atomic_compare_exchange_strong(&cx->status, &none, s)) tpu_status_free(s);
}

/* Runs the passes. A transform over several dims of a batch larger than the
 * caches runs in chunks along the outermost batch dim (one not transformed),
 * each about FFT_CHUNK_BYTES of output, so that every pass after the first
 * finds its chunk in cache; the chunks split across the thread pool (the
 * passes of one chunk then run on one thread). */
static tpu_status_t transform(const char* op, fft_kind_t kind, const tpu_tensor_t* in,
                              const tpu_tensor_t* out, const int* dims, int nd, int64_t norm,
                              bool forward) {
  if (nd == 0) return tpu_copy_strided(out, in);
  fft_chunks_t cx = {op, kind, in, out, dims, nd, norm, forward, -1, 1, 1, TPU_OK};
  for (int d = 0; d < out->ndim; d++) {
    bool transformed = false;
    for (int i = 0; i < nd; i++) transformed = transformed || dims[i] == d;
    if (!transformed && out->sizes[d] > 1 && (cx.b < 0 || out->strides[d] > out->strides[cx.b])) cx.b = d;
  }
  const int64_t numel = tpu_tensor_numel(out);
  cx.nb = cx.chunk = cx.b < 0 ? 1 : out->sizes[cx.b];
  if (nd > 1 && cx.b >= 0 && numel > 0) {
    const int64_t slice = numel / cx.nb * (int64_t)tpu_dtype_size(out->dtype);
    cx.chunk = FFT_CHUNK_BYTES / slice;
    cx.chunk = cx.chunk < 1 ? 1 : cx.chunk > cx.nb ? cx.nb : cx.chunk;
  }
  const int64_t nchunks = (cx.nb + cx.chunk - 1) / cx.chunk;
  /* one chunk: its passes split their lines across the pool instead */
  tpu_parallel_for(nchunks, nchunks < tpu_num_threads() ? nchunks : 1, chunks_range, &cx);
  return atomic_load(&cx.status);
}

/* _fft_c2c(self, dim, normalization, forward) */
tpu_status_t tpu_k_fft_c2c(const tpu_call_t* c) {
  const char* op = "_fft_c2c";
  const tpu_tensor_t* in = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* out = &c->outs[0];
  TPU_RETURN_IF_ERROR(check_dtypes(op, in, out, true, true));
  int dims[TPU_MAX_DIMS], nd;
  TPU_RETURN_IF_ERROR(read_dims(c, op, in, dims, &nd));
  return transform(op, K_C2C, in, out, dims, nd, tpu_arg_i64(c, 2, 0), tpu_arg_bool(c, 3, true));
}

/* _fft_r2c(self, dim, normalization, onesided) */
tpu_status_t tpu_k_fft_r2c(const tpu_call_t* c) {
  const char* op = "_fft_r2c";
  const tpu_tensor_t* in = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* out = &c->outs[0];
  TPU_RETURN_IF_ERROR(check_dtypes(op, in, out, false, true));
  int dims[TPU_MAX_DIMS], nd;
  TPU_RETURN_IF_ERROR(read_dims(c, op, in, dims, &nd));
  return transform(op, K_R2C, in, out, dims, nd, tpu_arg_i64(c, 2, 0), true);
}

/* _fft_c2r(self, dim, normalization, last_dim_size) */
tpu_status_t tpu_k_fft_c2r(const tpu_call_t* c) {
  const char* op = "_fft_c2r";
  const tpu_tensor_t* in = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* out = &c->outs[0];
  TPU_RETURN_IF_ERROR(check_dtypes(op, in, out, true, false));
  int dims[TPU_MAX_DIMS], nd;
  TPU_RETURN_IF_ERROR(read_dims(c, op, in, dims, &nd));
  TPU_CHECK_ARG(nd == 0 || out->sizes[dims[nd - 1]] >= 1, "%s: invalid last_dim_size %lld", op,
                (long long)(nd ? out->sizes[dims[nd - 1]] : 0));
  return transform(op, K_C2R, in, out, dims, nd, tpu_arg_i64(c, 2, 0), false);
}
