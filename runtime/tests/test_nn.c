/* Matrix multiply and neural-network kernels against naive references. */
#include <float.h>

#include "targets/host/kernels/gemm_ukernel.h"
#include "targets/host/kernels/matmul.h"
#include "base/cpu.h"
#include "test_util.h"

static uint64_t g_rng = 88172645463325252ull;
static double urand(void) { /* uniform in [-1, 1) */
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (double)(g_rng >> 11) / 4503599627370496.0 - 1.0;
}

/* A host buffer with a contiguous descriptor of up to 4 dims. */
typedef struct {
  void* mem;
  tpu_tensor_t t;
} buf_t;

static buf_t bmake(tpu_dtype_t dt, int nd, int64_t d0, int64_t d1, int64_t d2, int64_t d3) {
  int64_t sizes[4] = {d0, d1, d2, d3};
  buf_t b;
  int64_t n = 1;
  for (int i = 0; i < nd; i++) n *= sizes[i];
  b.mem = calloc((size_t)(n > 0 ? n : 1), tpu_dtype_size(dt));
  tpu_tensor_make_contig(&b.t, b.mem, dt, nd, sizes);
  return b;
}

static void bfill(buf_t* b, double scale) {
  int64_t n = tpu_tensor_numel(&b->t);
  for (int64_t i = 0; i < n; i++) {
    double v = urand() * scale;
    if (!tpu_dtype_is_float(b->t.dtype)) v = floor(v);
    tpu_store_f64(tpu_tensor_elem_ptr(&b->t, i), b->t.dtype, v);
  }
}

static double bget(const buf_t* b, int64_t i) { return tpu_tensor_get_f64(&b->t, i); }

/* Swaps the last two dims of a descriptor (a transposed view). */
static tpu_tensor_t transposed(const tpu_tensor_t* t) {
  tpu_tensor_t r = *t;
  int a = t->ndim - 2, b = t->ndim - 1;
  r.sizes[a] = t->sizes[b];
  r.sizes[b] = t->sizes[a];
  r.strides[a] = t->strides[b];
  r.strides[b] = t->strides[a];
  return r;
}

/* Element (i, j) of a 2-d descriptor. */
static double at2(const tpu_tensor_t* t, int64_t i, int64_t j) {
  return tpu_load_f64((char*)t->data + (i * t->strides[0] + j * t->strides[1]) *
                                           (int64_t)tpu_dtype_size(t->dtype),
                      t->dtype);
}

/* Checks c = beta * self + alpha * a @ b (self: M x N or NULL) with tol. */
static void check_gemm(const tpu_tensor_t* a, const tpu_tensor_t* b, const tpu_tensor_t* c,
                       double alpha, double beta, const tpu_tensor_t* self, double tol) {
  int64_t m = a->sizes[0], k = a->sizes[1], n = b->sizes[1];
  int bad = 0;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0, mag = 0;
      for (int64_t p = 0; p < k; p++) {
        s += at2(a, i, p) * at2(b, p, j);
        mag += fabs(at2(a, i, p) * at2(b, p, j));
      }
      double want = alpha * s + (self && beta != 0 ? beta * at2(self, i, j) : 0);
      double got = at2(c, i, j);
      if (!(fabs(got - want) <= tol * (1 + fabs(alpha) * mag + fabs(want))) && bad++ < 3)
        fprintf(stderr, "gemm %lldx%lldx%lld: c[%lld,%lld] = %g, want %g\n", (long long)m,
                (long long)n, (long long)k, (long long)i, (long long)j, got, want);
    }
  CHECK(bad == 0);
}

/* Runs op `name` like tt_run, under float32 matmul precision `prec`. */
static tpu_status_t run_prec(const char* name, tpu_arg_t* args, int nargs, tpu_tensor_t* outs,
                             int nouts, tpu_precision_t prec) {
  tpu_call_t base = {0};
  base.debug_checks = true;
  base.precision = prec;
  return tt_run_with(name, args, nargs, outs, nouts, &base);
}

/* plain float32 results */
static tpu_status_t run_f32(const char* name, tpu_arg_t* args, int nargs, tpu_tensor_t* outs,
                            int nouts) {
  return run_prec(name, args, nargs, outs, nouts, TPU_PRECISION_HIGHEST);
}

/* c = beta * self + alpha * a @ b through tpu_gemm (float32 precision outside
 * a call); ta/tb/tc: operands and output stored transposed. */
static void gemm_case_t(int64_t m, int64_t n, int64_t k, tpu_dtype_t dt, bool ta, bool tb,
                        bool tc, double alpha, double beta, double tol) {
  buf_t a = ta ? bmake(dt, 2, k, m, 0, 0) : bmake(dt, 2, m, k, 0, 0);
  buf_t b = tb ? bmake(dt, 2, n, k, 0, 0) : bmake(dt, 2, k, n, 0, 0);
  buf_t c = tc ? bmake(dt, 2, n, m, 0, 0) : bmake(dt, 2, m, n, 0, 0);
  buf_t self = bmake(dt, 2, m, n, 0, 0);
  bfill(&a, 4);
  bfill(&b, 4);
  bfill(&self, 4);
  tpu_tensor_t av = ta ? transposed(&a.t) : a.t, bv = tb ? transposed(&b.t) : b.t;
  tpu_tensor_t cv = tc ? transposed(&c.t) : c.t;
  CHECK_OK(tpu_gemm(&av, &bv, &cv, alpha, beta, &self.t));
  check_gemm(&av, &bv, &cv, alpha, beta, &self.t, tol);
  free(a.mem);
  free(b.mem);
  free(c.mem);
  free(self.mem);
}

static void gemm_case(int64_t m, int64_t n, int64_t k, tpu_dtype_t dt, bool ta, bool tb,
                      double alpha, double beta, double tol) {
  gemm_case_t(m, n, k, dt, ta, tb, false, alpha, beta, tol);
}

/* c = beta * self + a @ b for `batch` entries through tpu_gemm_batched, b
 * read transposed, self a broadcast row; each entry checked like gemm_case. */
static void gemm_batched_case(int64_t batch, int64_t m, int64_t n, int64_t k, tpu_dtype_t dt,
                              double beta, double tol) {
  buf_t a = bmake(dt, 3, batch, m, k, 0), b = bmake(dt, 3, batch, n, k, 0);
  buf_t c = bmake(dt, 3, batch, m, n, 0), self = bmake(dt, 1, n, 0, 0, 0);
  bfill(&a, 2);
  bfill(&b, 2);
  bfill(&self, 2);
  tpu_tensor_t bt = transposed(&b.t);
  CHECK_OK(tpu_gemm_batched(&a.t, &bt, &c.t, 1, beta, &self.t));
  tpu_tensor_t srow = self.t; /* the broadcast self as an m x n view */
  srow.ndim = 2;
  srow.sizes[0] = m;
  srow.strides[0] = 0;
  srow.sizes[1] = n;
  srow.strides[1] = 1;
  for (int64_t e = 0; e < batch; e++) {
    tpu_tensor_t ae = a.t, be = bt, ce = c.t;
    tpu_tensor_t* views[3] = {&ae, &be, &ce};
    for (int v = 0; v < 3; v++) {
      views[v]->data = (char*)views[v]->data +
                       e * views[v]->strides[0] * (int64_t)tpu_dtype_size(dt);
      views[v]->ndim = 2;
      for (int d = 0; d < 2; d++) {
        views[v]->sizes[d] = views[v]->sizes[d + 1];
        views[v]->strides[d] = views[v]->strides[d + 1];
      }
    }
    check_gemm(&ae, &be, &ce, 1, beta, &srow, tol);
  }
  free(a.mem);
  free(b.mem);
  free(c.mem);
  free(self.mem);
}

static void test_gemm_shapes(void) {
  for (int isa = TPU_GEMM_ISA_AVX512; isa >= TPU_GEMM_ISA_PORTABLE; isa--) {
    if (!tpu_gemm_set_isa((tpu_gemm_isa_t)isa)) continue;
    gemm_case(1, 1, 1, TPU_F32, false, false, 1, 0, 1e-6);
    gemm_case(37, 19, 53, TPU_F32, false, false, 1, 0, 1e-6);
    gemm_case(37, 19, 53, TPU_F32, true, false, 1, 0, 1e-6);
    gemm_case(37, 19, 53, TPU_F32, false, true, 1, 0, 1e-6);
    gemm_case(37, 19, 53, TPU_F32, true, true, 0.5, -2, 1e-6);
    gemm_case(70, 600, 300, TPU_F32, false, true, 1, 1, 1e-6); /* several tiles and k blocks */
    gemm_case(200, 33, 9, TPU_F32, false, false, 1, 0, 1e-6);
    gemm_case(1, 300, 77, TPU_F32, false, false, 1, 1, 1e-6);   /* vector-matrix, axpy form */
    gemm_case(1, 300, 77, TPU_F32, false, true, 1, 1, 1e-6);    /* vector-matrix, dots */
    gemm_case(300, 1, 77, TPU_F32, false, false, 2, 0.5, 1e-6); /* matrix-vector */
    gemm_case(300, 1, 77, TPU_F32, true, false, 2, 0.5, 1e-6);
    gemm_case(20, 30, 0, TPU_F32, false, false, 3, 0.5, 0);     /* K = 0: beta * self */
    gemm_case(37, 19, 53, TPU_BF16, false, true, 1, 1, 1e-2);
    gemm_case(37, 19, 53, TPU_F16, true, false, 1, 1, 2e-3);
    gemm_case(37, 19, 53, TPU_F64, false, true, 1, 1, 1e-12);
    gemm_case(37, 19, 53, TPU_I64, true, false, 2, 3, 0);
    gemm_case(40, 10, 30, TPU_I32, false, false, 1, 0, 0);
    /* float blocking: edge tiles written into c, k blocks, a float tile for
     * a transposed output, column groups for few row blocks, wide n */
    gemm_case(100, 70, 600, TPU_F32, false, false, 1, 0, 1e-6);
    gemm_case(100, 70, 600, TPU_F32, true, true, 1.5, 0, 1e-6);
    /* c = a @ b + self added in the micro-kernel's store: packed tiles and
     * rows of A, whole and edge tiles, several k blocks */
    gemm_case(37, 19, 53, TPU_F32, false, false, 1, 1, 1e-6);
    gemm_case(100, 70, 600, TPU_F32, false, false, 1, 1, 1e-6);
    gemm_case(61, 300, 45, TPU_F32, true, true, 1, 1, 1e-6);
    gemm_case_t(61, 45, 300, TPU_F32, false, true, true, 1, 1, 1e-6);
    gemm_case_t(61, 45, 300, TPU_BF16, true, false, true, 1, 0, 1e-2);
    gemm_case(7, 1500, 40, TPU_F32, false, false, 1, 0.5, 1e-6);
    gemm_case(13, 2100, 9, TPU_F16, false, true, 1, 0, 2e-3);
    /* batch entries one per task: straight into c, and through float tiles */
    gemm_batched_case(9, 40, 50, 300, TPU_F32, 1, 1e-6);
    gemm_batched_case(9, 40, 50, 70, TPU_BF16, 0.5, 1e-2);
  }
  CHECK(tpu_gemm_set_isa(TPU_GEMM_ISA_AUTO));
  gemm_batched_case(2, 260, 300, 450, TPU_F32, 0, 1e-6); /* large entries: split within */
  CHECK(tpu_gemm_set_isa(TPU_GEMM_ISA_PORTABLE));
  CHECK(strcmp(tpu_gemm_isa_name(), "portable") == 0);
  CHECK(tpu_gemm_set_isa(TPU_GEMM_ISA_AUTO));
  CHECK(!tpu_gemm_set_isa((tpu_gemm_isa_t)7));
}

/* ---- float32 matmul precision ---- */
static float bf16r(float x) { return tpu_bf16_to_f32(tpu_f32_to_bf16(x)); }

/* Scalar transforms: bf16 rounding agrees with the conversion kernels use,
 * the split is exact; each micro-kernel's float32 packer applies them bit
 * for bit like the scalar ones, for both of its layouts. */
static void test_gemm_transforms(void) {
  enum { NV = 4096 };
  static float v[NV];
  const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 1.00390625f /* tie */, 1.01171875f,
                           1e-40f, -3e-39f, 1.2e-38f, FLT_MAX, -FLT_MAX, 3.3961e38f, INFINITY,
                           -INFINITY, NAN, 65504.0f, 1.0f + 1.0f / 1048576, 0.1f};
  int ns = (int)(sizeof special / sizeof special[0]);
  for (int i = 0; i < NV; i++) {
    if (i < ns) {
      v[i] = special[i];
    } else {
      g_rng ^= g_rng << 13;
      g_rng ^= g_rng >> 7;
      g_rng ^= g_rng << 17;
      uint32_t u = (uint32_t)(g_rng >> 20);
      if (i % 4 == 0) u = (u & 0x807fffffu) | (0x3f800000u & ~0x00800000u); /* near 1 */
      memcpy(&v[i], &u, 4);
    }
  }
  int bad = 0;
  for (int i = 0; i < NV; i++) {
    float x = v[i], hi = gemm_xform(GEMM_XF_HI, x), lo = gemm_xform(GEMM_XF_LO, x);
    float r = gemm_xform(GEMM_XF_BF16, x), h16 = gemm_xform(GEMM_XF_HI16, x);
    if (isnan(x)) {
      bad += !isnan(r) || !isnan(hi) || !isnan(h16);
      continue;
    }
    int wrong = gemm_f2u(r) != gemm_f2u(bf16r(x));
    wrong |= (gemm_f2u(hi) & 0xffffu) != 0 || (gemm_f2u(lo) & 0xffffu) != 0;
    if (isinf(x)) wrong |= hi != x || lo != 0;
    else wrong |= isinf(hi) || isinf(lo);
    /* normal, not near overflow: hi + lo is exact and within 2^-16 of x */
    if (fabsf(x) < 3e38f && fabsf(x) > 0x1p-100f)
      wrong |= (double)hi + (double)lo != (double)h16 ||
               fabs((double)x - (double)h16) > ldexp(fabs((double)x), -16);
    if (wrong && bad++ < 3) fprintf(stderr, "transforms of %a: %a %a %a %a\n", x, r, hi, lo, h16);
  }
  CHECK(bad == 0);
  bad = 0;
  static const gemm_xform_t combos[4][2] = {{GEMM_XF_EXACT, GEMM_XF_EXACT},
                                            {GEMM_XF_BF16, GEMM_XF_EXACT},
                                            {GEMM_XF_HI, GEMM_XF_LO},
                                            {GEMM_XF_HI16, GEMM_XF_HI}};
  const gemm_ukernel_t* uks[] = {&tpu_gemm_ukernel_portable,
#ifdef TPU_GEMM_HAVE_X86
                                 &tpu_gemm_ukernel_avx2, &tpu_gemm_ukernel_avx512
#endif
  };
  static float packed[3 * NV]; /* 2 passes of padded panels */
  for (int u = 0; u < (int)(sizeof uks / sizeof uks[0]); u++) {
    if (!tpu_gemm_set_isa((tpu_gemm_isa_t)u) || !uks[u]->pack_f32) continue;
    for (int c = 0; c < 4; c++) {
      int np = c >= 2 ? 2 : 1;
      /* lines x steps read as (l, k) = v[l * kc + k] (A by rows, B by
       * columns) and as v[k * lines + l] (B by rows, A by columns), in
       * panels of A's and B's widths, the last one partial */
      for (int layout = 0; layout < 4; layout++) {
        int w = layout % 2 == 0 ? uks[u]->mr : uks[u]->nr;
        int64_t lines = 3 * w - 1, kc = NV / lines;
        int64_t sl = layout < 2 ? kc : 1, sk = layout < 2 ? 1 : lines;
        if (!uks[u]->pack_f32(packed, v, sl, sk, lines, kc, w, combos[c], np)) continue;
        for (int64_t l = 0; l < (lines + w - 1) / w * w; l++)
          for (int64_t k = 0; k < kc; k++)
            for (int p = 0; p < np; p++) {
              float got = packed[(l / w) * w * kc * np + (k * np + p) * w + l % w];
              float want = l < lines ? gemm_xform(combos[c][p], v[l * sl + k * sk]) : 0.0f;
              if (gemm_f2u(got) != gemm_f2u(want) && !(isnan(got) && isnan(want)) && bad++ < 3)
                fprintf(stderr,
                        "%s pack layout %d xform %d: line %lld step %lld pass %d: %a, want %a\n",
                        uks[u]->name, layout, (int)combos[c][p], (long long)l, (long long)k, p,
                        got, want);
            }
      }
    }
  }
  tpu_gemm_set_isa(TPU_GEMM_ISA_AUTO);
  CHECK(bad == 0);
  /* the bfloat16 packer: the same layouts, values widened exactly (every
   * one-pass transform keeps them), multi-pass transforms declined */
  static uint16_t h[NV];
  for (int i = 0; i < NV; i++) h[i] = tpu_f32_to_bf16(v[i]);
  for (int u = 0; u < (int)(sizeof uks / sizeof uks[0]); u++) {
    if (!uks[u]->pack_bf16) continue;
    for (int c = 0; c < 4; c++) {
      int np = c >= 2 ? 2 : 1;
      for (int layout = 0; layout < 6; layout++) {
        /* layouts 4, 5: lines kept as lines (w = 1), as rows of A */
        int w = layout >= 4 ? 1 : layout % 2 == 0 ? uks[u]->mr : uks[u]->nr;
        int64_t lines = layout >= 4 ? 5 : 3 * w - 1, kc = NV / lines - layout % 2;
        int64_t sl = layout < 2 || layout >= 4 ? kc + layout % 2 : 1, sk = layout < 2 || layout >= 4 ? 1 : lines;
        bool took = uks[u]->pack_bf16(packed, h, sl, sk, lines, kc, w, combos[c], np);
        if (np == 2) {
          bad += took;
          continue;
        }
        CHECK(took);
        for (int64_t l = 0; l < (lines + w - 1) / w * w; l++)
          for (int64_t k = 0; k < kc; k++) {
            float got = packed[(l / w) * w * kc + k * w + l % w];
            float want = l < lines ? tpu_bf16_to_f32(h[l * sl + k * sk]) : 0.0f;
            if (gemm_f2u(got) != gemm_f2u(want) && bad++ < 3)
              fprintf(stderr, "%s bf16 pack layout %d: line %lld step %lld: %a, want %a\n",
                      uks[u]->name, layout, (long long)l, (long long)k, got, want);
          }
      }
    }
  }
  CHECK(bad == 0);
  /* the two-step packer: words of (step 2j, step 2j + 1) bits as
   * tpu_f32_to_bf16 rounds them (float32 source, the specials included) or
   * as stored (bfloat16), the missing odd step `pad`, partial panels zero;
   * every layout, odd and even step counts */
  const tpu_cpu_features_t* cpu = tpu_cpu_features();
  const bool have_dot2 = cpu->avx512bf16 && cpu->avx512bw && cpu->avx512vl;
  static uint32_t words[2 * NV];
  for (int u = 0; u < (int)(sizeof uks / sizeof uks[0]) && have_dot2; u++) {
    const gemm_dot2_t* d2 = uks[u]->dot2;
    if (!d2) continue;
    for (int src16 = 0; src16 < 2; src16++)
      for (int layout = 0; layout < 9; layout++) {
        /* by steps (sl 1), by lines (sk 1), strided (neither); w = MR, NR, 1 */
        const int wv[3] = {uks[u]->mr, uks[u]->nr, 1};
        int w = wv[layout % 3];
        int64_t lines = w == 1 ? 3 : 3 * w - 1 + 40 * (layout == 0), kc = 2 * (NV / lines / 4) - (layout & 1);
        int64_t sl = layout < 3 ? 1 : layout < 6 ? kc + 3 : 2 * kc, sk = layout < 3 ? lines + 5 : layout < 6 ? 1 : 2 * kc * lines;
        if (layout >= 6) { sl = 1 + 2 * kc; sk = 2; lines = (NV - kc * 2) / sl; }
        if ((lines - 1) * sl + (kc - 1) * sk >= NV) kc = ((NV - 1 - (lines - 1) * sl) / sk + 1) & ~(int64_t)(layout & 1 ? 0 : 1);
        const uint16_t pad = (uint16_t)(layout % 2 ? 0x8000 : 0);
        const int64_t kp = (kc + 1) / 2, panels = (lines + w - 1) / w;
        memset(words, 0xab, sizeof words);
        d2->pack(words, src16 ? (const void*)h : (const void*)v, src16, sl, sk, lines, kc, w, pad);
        for (int64_t l = 0; l < panels * w; l++)
          for (int64_t j = 0; j < kp; j++) {
            uint32_t got = words[(l / w) * w * kp + j * w + l % w], want = 0;
            if (l < lines) {
              int64_t o = l * sl + 2 * j * sk;
              uint16_t hi = src16 ? h[o] : tpu_f32_to_bf16(v[o]);
              uint16_t lo = 2 * j + 1 >= kc ? pad : src16 ? h[o + sk] : tpu_f32_to_bf16(v[o + sk]);
              want = (uint32_t)hi << 16 | lo;
            }
            if (got != want && bad++ < 3)
              fprintf(stderr, "dot2 pack src16 %d layout %d (w %d, kc %lld): line %lld word %lld: %08x, want %08x\n",
                      src16, layout, w, (long long)kc, (long long)l, (long long)j, got, want);
          }
      }
  }
  CHECK(bad == 0);
}

/* A bfloat16 product (c = a @ b + beta * self, batched) equals the float32
 * product of the same values (float tiles: precision highest outside a call)
 * rounded once to bfloat16, bit for bit, on every micro-kernel, with and
 * without two-step dot products: the packers widen exactly, the sums run in
 * the same order, and the float result is rounded on store. ta/tb: a, b stored
 * transposed; self a broadcast row. */
static void gemm_bf16_case(int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
                           double beta) {
  buf_t a = ta ? bmake(TPU_BF16, 3, batch, k, m, 0) : bmake(TPU_BF16, 3, batch, m, k, 0);
  buf_t b = tb ? bmake(TPU_BF16, 3, batch, n, k, 0) : bmake(TPU_BF16, 3, batch, k, n, 0);
  buf_t self = bmake(TPU_BF16, 1, n, 0, 0, 0), c = bmake(TPU_BF16, 3, batch, m, n, 0);
  bfill(&a, 4);
  bfill(&b, 4);
  bfill(&self, 4);
  buf_t a32 = ta ? bmake(TPU_F32, 3, batch, k, m, 0) : bmake(TPU_F32, 3, batch, m, k, 0);
  buf_t b32 = tb ? bmake(TPU_F32, 3, batch, n, k, 0) : bmake(TPU_F32, 3, batch, k, n, 0);
  buf_t self32 = bmake(TPU_F32, 1, n, 0, 0, 0), c32 = bmake(TPU_F32, 3, batch, m, n, 0);
  const buf_t* from[3] = {&a, &b, &self};
  buf_t* to[3] = {&a32, &b32, &self32};
  for (int v = 0; v < 3; v++)
    for (int64_t i = 0; i < tpu_tensor_numel(&from[v]->t); i++)
      ((float*)to[v]->mem)[i] = tpu_bf16_to_f32(((const uint16_t*)from[v]->mem)[i]);
  tpu_tensor_t av = ta ? transposed(&a.t) : a.t, bv = tb ? transposed(&b.t) : b.t;
  tpu_tensor_t av32 = ta ? transposed(&a32.t) : a32.t, bv32 = tb ? transposed(&b32.t) : b32.t;
  for (int run = 2 * TPU_GEMM_ISA_AVX512 + 1; run >= 0; run--) {
    const int isa = run / 2; /* each ISA with and without two-step dot products */
    if (!tpu_gemm_set_isa((tpu_gemm_isa_t)isa)) continue;
    tpu_gemm_allow_dot2(run % 2);
    CHECK_OK(tpu_gemm_batched(&av, &bv, &c.t, 1, beta, &self.t));
    CHECK_OK(tpu_gemm_batched(&av32, &bv32, &c32.t, 1, beta, &self32.t));
    int bad = 0;
    for (int64_t i = 0; i < batch * m * n; i++) {
      uint16_t got = ((const uint16_t*)c.mem)[i];
      uint16_t want = tpu_f32_to_bf16(((const float*)c32.mem)[i]);
      if (got != want && bad++ < 3)
        fprintf(stderr, "bf16 gemm %s dot2 %d %lldx%lldx%lldx%lld ta %d tb %d: c[%lld] = %a, want %a\n",
                tpu_gemm_isa_name(), run % 2, (long long)batch, (long long)m, (long long)n,
                (long long)k, ta, tb, (long long)i, tpu_bf16_to_f32(got),
                tpu_bf16_to_f32(want));
    }
    CHECK(bad == 0);
  }
  tpu_gemm_allow_dot2(-1);
  CHECK(tpu_gemm_set_isa(TPU_GEMM_ISA_AUTO));
  buf_t* all[8] = {&a, &b, &self, &c, &a32, &b32, &self32, &c32};
  for (int v = 0; v < 8; v++) free(all[v]->mem);
}

static void test_gemm_bf16(void) {
  gemm_bf16_case(1, 37, 19, 53, false, false, 0);    /* rows of A, edge tiles */
  gemm_bf16_case(1, 37, 19, 53, true, true, 1);      /* A by columns, B by columns */
  gemm_bf16_case(1, 70, 300, 600, false, true, 1);   /* packed panels, k blocks, bias */
  gemm_bf16_case(1, 70, 300, 600, true, false, 0);
  gemm_bf16_case(1, 130, 257, 33, false, false, 0.5);
  gemm_bf16_case(6, 40, 64, 72, false, true, 0);     /* attention-like batches */
  gemm_bf16_case(6, 40, 72, 64, true, false, 1);
  gemm_bf16_case(1, 1, 300, 77, false, true, 1);     /* vector-matrix */
  gemm_bf16_case(1, 50, 40, 1201, false, false, 0);  /* odd k blocks (3 x 401 steps) */
  gemm_bf16_case(2, 30, 700, 1031, true, true, 1);
}

/* Float32 at precision medium: the same results with two-step dot products
 * as with float tiles, bit for bit (both multiply the bfloat16-rounded
 * values and add in k order), through mm and addmm, odd and even K,
 * transposed operands. */
static void test_gemm_dot2_medium(void) {
  const int64_t shapes[4][3] = {{37, 19, 53}, {100, 300, 600}, {64, 129, 1025}, {30, 40, 2}};
  for (int sh = 0; sh < 4; sh++)
    for (int t = 0; t < 4; t++) {
      const int64_t m = shapes[sh][0], n = shapes[sh][1], k = shapes[sh][2];
      buf_t a = t & 1 ? bmake(TPU_F32, 2, k, m, 0, 0) : bmake(TPU_F32, 2, m, k, 0, 0);
      buf_t b = t & 2 ? bmake(TPU_F32, 2, n, k, 0, 0) : bmake(TPU_F32, 2, k, n, 0, 0);
      buf_t bias = bmake(TPU_F32, 1, n, 0, 0, 0);
      buf_t c[2] = {bmake(TPU_F32, 2, m, n, 0, 0), bmake(TPU_F32, 2, m, n, 0, 0)};
      bfill(&a, 4);
      bfill(&b, 4);
      bfill(&bias, 4);
      tpu_tensor_t av = t & 1 ? transposed(&a.t) : a.t, bv = t & 2 ? transposed(&b.t) : b.t;
      for (int d = 0; d < 2; d++) {
        tpu_gemm_allow_dot2(d);
        if (sh % 2) {
          tpu_arg_t args[5] = {ta_t(&bias.t), ta_t(&av), ta_t(&bv), ta_i(1), ta_i(1)};
          CHECK_OK(run_prec("addmm", args, 5, &c[d].t, 1, TPU_PRECISION_MEDIUM));
        } else {
          tpu_arg_t args[2] = {ta_t(&av), ta_t(&bv)};
          CHECK_OK(run_prec("mm", args, 2, &c[d].t, 1, TPU_PRECISION_MEDIUM));
        }
      }
      tpu_gemm_allow_dot2(-1);
      int bad = 0;
      for (int64_t i = 0; i < m * n; i++) {
        float x = ((float*)c[0].mem)[i], y = ((float*)c[1].mem)[i];
        if (gemm_f2u(x) != gemm_f2u(y) && bad++ < 3)
          fprintf(stderr, "medium %lldx%lldx%lld t %d: [%lld] float tiles %a, dot2 %a\n",
                  (long long)m, (long long)n, (long long)k, t, (long long)i, x, y);
      }
      CHECK(bad == 0);
      free(a.mem);
      free(b.mem);
      free(bias.mem);
      free(c[0].mem);
      free(c[1].mem);
    }
}

/* The tile variants that read A in place (by rows, by columns) give the
 * bits of the packed tile on the same values, on every micro-kernel. */
static void test_gemm_tile_layouts(void) {
  enum { KC = 37, MAXR = 16, MAXC = 32, LD = KC + 3 };
  static float pa[KC * MAXR], rows[MAXR * LD], cols[KC * (MAXR + 5)], b[KC * MAXC];
  static float want[MAXR * MAXC], got[MAXR * MAXC];
  for (int i = 0; i < KC * MAXC; i++) b[i] = (float)urand() - 0.5f;
  const gemm_ukernel_t* uks[] = {&tpu_gemm_ukernel_portable,
#ifdef TPU_GEMM_HAVE_X86
                                 &tpu_gemm_ukernel_avx2, &tpu_gemm_ukernel_avx512
#endif
  };
  int bad = 0;
  for (int u = 0; u < (int)(sizeof uks / sizeof uks[0]); u++) {
    const gemm_ukernel_t* uk = uks[u];
    if (!tpu_gemm_set_isa((tpu_gemm_isa_t)u)) continue;
    CHECK(uk->tile_rows && uk->tile_cols && uk->mr <= MAXR && uk->nr <= MAXC);
    const int mr = uk->mr, nr = uk->nr, ldc = nr;
    for (int i = 0; i < mr; i++)
      for (int k = 0; k < KC; k++) {
        float x = (float)urand() - 0.5f;
        pa[k * mr + i] = x;
        rows[i * LD + k] = x;
        cols[k * (mr + 5) + i] = x;
      }
    for (int acc = 0; acc < 2; acc++) {
      for (int i = 0; i < mr * nr; i++) want[i] = got[i] = (float)i;
      uk->tile(KC, pa, b, want, ldc, acc, NULL, 0);
      uk->tile_rows(KC, rows, LD, b, got, ldc, acc, NULL, 0, NULL, 0);
      for (int i = 0; i < mr * nr; i++) bad += memcmp(&got[i], &want[i], 4) != 0;
      for (int i = 0; i < mr * nr; i++) got[i] = (float)i;
      uk->tile_cols(KC, cols, mr + 5, b, got, ldc, acc, NULL, 0);
      for (int i = 0; i < mr * nr; i++) bad += memcmp(&got[i], &want[i], 4) != 0;
    }
    if (bad) fprintf(stderr, "%s: tile_rows/tile_cols differ from tile in %d values\n", uk->name,
                     bad);
  }
  tpu_gemm_set_isa(TPU_GEMM_ISA_AUTO);
  CHECK(bad == 0);
}

/* mm under each precision and micro-kernel against float64 sums of the
 * transformed inputs, within float32 accumulation error (K + 2) * 2^-24 *
 * sum |a||b|: medium = bf16(a) @ bf16(b); high = the 3-pass split a_hi @ b_hi
 * + a_hi @ b_lo + a_lo @ b_hi; highest = a @ b. Medium must be visibly
 * less accurate than float32 (the rounding happened), high close to it. */
static void test_gemm_precision(void) {
  enum { M = 29, K = 300, N = 37 };
  buf_t a = bmake(TPU_F32, 2, M, K, 0, 0), b = bmake(TPU_F32, 2, K, N, 0, 0);
  buf_t c = bmake(TPU_F32, 2, M, N, 0, 0);
  float* av = a.mem;
  float* bv = b.mem;
  for (int i = 0; i < M * K; i++) av[i] = (float)ldexp(urand(), (int)(urand() * 6));
  for (int i = 0; i < K * N; i++) bv[i] = (float)ldexp(urand(), (int)(urand() * 6));
  for (int tb = 0; tb < 2; tb++) {
    tpu_tensor_t bt = b.t;
    if (tb) { /* the same values through a transposed view of a copy */
      float* copy = malloc(sizeof(float) * K * N);
      for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++) copy[j * K + k] = bv[k * N + j];
      int64_t sz[2] = {N, K};
      tpu_tensor_t t = tt_make(copy, TPU_F32, 2, sz);
      bt = transposed(&t);
    }
    for (int isa = TPU_GEMM_ISA_AVX512; isa >= TPU_GEMM_ISA_PORTABLE; isa--) {
      if (!tpu_gemm_set_isa((tpu_gemm_isa_t)isa)) continue;
      for (int prec = TPU_PRECISION_MEDIUM; prec <= TPU_PRECISION_HIGHEST; prec++) {
        tpu_arg_t args[2] = {ta_t(&a.t), ta_t(&bt)};
        CHECK_OK(run_prec("mm", args, 2, &c.t, 1, (tpu_precision_t)prec));
        int bad = 0;
        double worst_exact = 0; /* max |c - a @ b| / ((K + 2) 2^-24 sum |a||b|) */
        for (int i = 0; i < M; i++)
          for (int j = 0; j < N; j++) {
            double ref = 0, exact = 0, mag = 0;
            for (int k = 0; k < K; k++) {
              float x = av[i * K + k], y = bv[k * N + j];
              float xh = bf16r(x), yh = bf16r(y), xl = bf16r(x - xh), yl = bf16r(y - yh);
              exact += (double)x * y;
              mag += fabs((double)x * y);
              if (prec == TPU_PRECISION_MEDIUM) ref += (double)xh * yh;
              else if (prec == TPU_PRECISION_HIGH)
                ref += (double)xh * yh + (double)xh * yl + (double)xl * yh;
              else ref += (double)x * y;
            }
            double got = ((float*)c.mem)[i * N + j], bound = (K + 2) * ldexp(mag, -24);
            if (!(fabs(got - ref) <= bound) && bad++ < 3)
              fprintf(stderr, "%s precision %d: c[%d,%d] = %.9g, want %.9g +- %.3g\n",
                      tpu_gemm_isa_name(), prec, i, j, got, ref, bound);
            worst_exact = fmax(worst_exact, fabs(got - exact) / bound);
          }
        CHECK(bad == 0);
        if (prec == TPU_PRECISION_MEDIUM) CHECK(worst_exact > 4);
        if (prec == TPU_PRECISION_HIGH) CHECK(worst_exact < 4);
      }
    }
    if (tb) free(bt.data);
  }
  tpu_gemm_set_isa(TPU_GEMM_ISA_AUTO);

  /* high keeps large and infinite values apart from their split: x, which
   * rounds to infinity in bfloat16, stays finite, inf stays inf (not
   * inf - inf), NaN propagates */
  const float x = 0x1.ffp+127f; /* half way between bf16 max and infinity */
  float sa[4] = {x, 1, INFINITY, NAN}, sb[2] = {0.5f, 1}, sc2[8];
  int64_t s41[2] = {4, 1}, s12[2] = {1, 2}, s42[2] = {4, 2};
  tpu_tensor_t tsa = tt_make(sa, TPU_F32, 2, s41), tsb = tt_make(sb, TPU_F32, 2, s12),
               tsc = tt_make(sc2, TPU_F32, 2, s42);
  for (int prec = TPU_PRECISION_MEDIUM; prec <= TPU_PRECISION_HIGHEST; prec++) {
    tpu_arg_t args[2] = {ta_t(&tsa), ta_t(&tsb)};
    CHECK_OK(run_prec("mm", args, 2, &tsc, 1, (tpu_precision_t)prec));
    if (prec == TPU_PRECISION_MEDIUM) CHECK(isinf(sc2[0])); /* bf16(FLT_MAX) = inf */
    else CHECK(sc2[0] == x * 0.5f && sc2[1] == x);
    CHECK(sc2[2] == 0.5f && sc2[3] == 1);
    CHECK(sc2[4] == INFINITY && sc2[5] == INFINITY);
    CHECK(isnan(sc2[6]) && isnan(sc2[7]));
  }

  /* bfloat16 inputs take one pass: every level gives the float32 sums of
   * the exact products, rounded once */
  buf_t ha = bmake(TPU_BF16, 2, 9, 70, 0, 0), hb = bmake(TPU_BF16, 2, 70, 11, 0, 0);
  buf_t ref = bmake(TPU_F32, 2, 9, 11, 0, 0), hout = bmake(TPU_BF16, 2, 9, 11, 0, 0);
  bfill(&ha, 3);
  bfill(&hb, 3);
  CHECK_OK(tpu_gemm(&ha.t, &hb.t, &ref.t, 1, 0, NULL));
  for (int prec = TPU_PRECISION_MEDIUM; prec <= TPU_PRECISION_HIGHEST; prec++) {
    tpu_arg_t args[2] = {ta_t(&ha.t), ta_t(&hb.t)};
    CHECK_OK(run_prec("mm", args, 2, &hout.t, 1, (tpu_precision_t)prec));
    for (int i = 0; i < 99; i++) CHECK(bget(&hout, i) == (double)bf16r((float)bget(&ref, i)));
  }
  buf_t* frees[] = {&a, &b, &c, &ha, &hb, &ref, &hout};
  for (unsigned i = 0; i < sizeof frees / sizeof frees[0]; i++) free(frees[i]->mem);
}

static void test_gemm_semantics(void) {
  /* beta == 0 ignores NaN in self; alpha == 0 ignores NaN in the operands */
  float a[4] = {1, 2, 3, 4}, b[4] = {1, 0, 0, 1}, self[4] = {NAN, NAN, NAN, NAN}, c[4];
  int64_t s22[2] = {2, 2};
  tpu_tensor_t ta = tt_make(a, TPU_F32, 2, s22), tb = tt_make(b, TPU_F32, 2, s22),
               ts = tt_make(self, TPU_F32, 2, s22), tc = tt_make(c, TPU_F32, 2, s22);
  CHECK_OK(tpu_gemm(&ta, &tb, &tc, 2, 0, &ts));
  for (int i = 0; i < 4; i++) CHECK_NEAR(c[i], 2 * a[i], 0);
  float bn[4] = {NAN, 0, 0, 1}, s2[4] = {1, 2, 3, 4};
  tpu_tensor_t tbn = tt_make(bn, TPU_F32, 2, s22), ts2 = tt_make(s2, TPU_F32, 2, s22);
  CHECK_OK(tpu_gemm(&ta, &tbn, &tc, 0, 3, &ts2));
  for (int i = 0; i < 4; i++) CHECK_NEAR(c[i], 3 * s2[i], 0);
  /* in place on a 1 x 2 row (size-1 dims): c = 2 * c + [1, 2] @ b */
  float row[2] = {10, 20};
  int64_t s12f[2] = {1, 2};
  tpu_tensor_t trow = tt_make(row, TPU_F32, 2, s12f), ta12 = tt_make(a, TPU_F32, 2, s12f);
  CHECK_OK(tpu_gemm(&ta12, &tb, &trow, 1, 2, &trow));
  CHECK(row[0] == 21 && row[1] == 42);
  /* int8 wraps like PyTorch: 100 * 2 + 100 * 1 = 300 -> 44 */
  int8_t ia[2] = {100, 100}, ib[2] = {2, 1}, ic[1];
  int64_t s12[2] = {1, 2}, s21[2] = {2, 1}, s11[2] = {1, 1};
  tpu_tensor_t tia = tt_make(ia, TPU_I8, 2, s12), tib = tt_make(ib, TPU_I8, 2, s21),
               tic = tt_make(ic, TPU_I8, 2, s11);
  CHECK_OK(tpu_gemm(&tia, &tib, &tic, 1, 0, NULL));
  CHECK(ic[0] == 44);
  /* bool is not implemented, like PyTorch's CPU addmm */
  tpu_tensor_t tbool = tia;
  tbool.dtype = TPU_BOOL;
  tpu_status_t st = tpu_gemm(&tbool, &tbool, &tic, 1, 0, NULL);
  CHECK(st && tpu_status_code(st) == TPU_CODE_UNIMPLEMENTED);
  tpu_status_free(st);
  /* shape mismatch */
  st = tpu_gemm(&ta, &tia, &tc, 1, 0, NULL);
  CHECK(st && tpu_status_code(st) == TPU_CODE_INVALID_ARGUMENT);
  tpu_status_free(st);
}

static void test_mm_ops(void) {
  /* mm.out whose output is its own first operand (computed via a temporary) */
  float a[4] = {1, 2, 3, 4}, b[4] = {0, 1, 1, 0};
  int64_t s22[2] = {2, 2};
  tpu_tensor_t ta = tt_make(a, TPU_F32, 2, s22), tb = tt_make(b, TPU_F32, 2, s22);
  tpu_arg_t args[3] = {ta_t(&ta), ta_t(&tb), ta_t(&ta)};
  CHECK_OK(run_f32("mm.out", args, 3, &ta, 1));
  CHECK(a[0] == 2 && a[1] == 1 && a[2] == 4 && a[3] == 3);

  /* addmm_ in place with a bias row broadcast in addmm */
  float self[4] = {1, 1, 1, 1}, bias[2] = {10, 20}, out[4];
  tpu_tensor_t tself = tt_make(self, TPU_F32, 2, s22);
  int64_t s2[1] = {2};
  tpu_tensor_t tbias = tt_make(bias, TPU_F32, 1, s2), tout = tt_make(out, TPU_F32, 2, s22);
  tpu_arg_t a2[5] = {ta_t(&tself), ta_t(&ta), ta_t(&tb), ta_i(2), ta_d(0.5)};
  CHECK_OK(run_f32("addmm_", a2, 5, &tself, 1));
  /* a is now [[2,1],[4,3]]; a @ b = [[1,2],[3,4]] */
  CHECK(self[0] == 2.5 && self[1] == 3 && self[2] == 3.5 && self[3] == 4);
  tpu_arg_t a3[5] = {ta_t(&tbias), ta_t(&ta), ta_t(&tb), ta_i(1), ta_i(1)};
  CHECK_OK(run_f32("addmm", a3, 5, &tout, 1));
  CHECK(out[0] == 11 && out[1] == 22 && out[2] == 13 && out[3] == 24);

  /* bmm / baddbmm with a broadcast self, addbmm */
  buf_t b1 = bmake(TPU_F32, 3, 3, 5, 7, 0), b2 = bmake(TPU_F32, 3, 3, 7, 4, 0);
  buf_t r = bmake(TPU_F32, 3, 3, 5, 4, 0), s = bmake(TPU_F32, 1, 4, 0, 0, 0);
  buf_t r2 = bmake(TPU_F32, 2, 5, 4, 0, 0);
  bfill(&b1, 1);
  bfill(&b2, 1);
  bfill(&s, 1);
  tpu_arg_t a4[5] = {ta_t(&s.t), ta_t(&b1.t), ta_t(&b2.t), ta_d(0.5), ta_d(2)};
  CHECK_OK(run_f32("baddbmm", a4, 5, &r.t, 1));
  CHECK_OK(run_f32("addbmm", a4, 5, &r2.t, 1));
  int bad = 0;
  for (int i = 0; i < 5; i++)
    for (int j = 0; j < 4; j++) {
      double total = 0.5 * bget(&s, j);
      for (int bt = 0; bt < 3; bt++) {
        double acc = 0;
        for (int p = 0; p < 7; p++) acc += bget(&b1, bt * 35 + i * 7 + p) * bget(&b2, bt * 28 + p * 4 + j);
        total += 2 * acc;
        if (fabs(bget(&r, bt * 20 + i * 4 + j) - (0.5 * bget(&s, j) + 2 * acc)) > 1e-5) bad++;
      }
      if (fabs(bget(&r2, i * 4 + j) - total) > 1e-5) bad++;
    }
  CHECK(bad == 0);
  tpu_arg_t a5[2] = {ta_t(&b1.t), ta_t(&b2.t)};
  CHECK_OK(run_f32("bmm", a5, 2, &r.t, 1));
  double acc = 0;
  for (int p = 0; p < 7; p++) acc += bget(&b1, 35 + 7 + p) * bget(&b2, 28 + p * 4 + 1);
  CHECK_NEAR(bget(&r, 20 + 4 + 1), acc, 1e-5);

  /* mv on a transposed matrix, addmv with a 0-d self, dot with a strided vector */
  float m[6] = {1, 2, 3, 4, 5, 6}, v[3] = {1, 0, -1}, mvo[2], d;
  int64_t s23[2] = {2, 3}, s3[1] = {3};
  tpu_tensor_t tm = tt_make(m, TPU_F32, 2, s23), tv = tt_make(v, TPU_F32, 1, s3),
               tmvo = tt_make(mvo, TPU_F32, 1, s2), td = tt_make(&d, TPU_F32, 0, NULL);
  tpu_arg_t a6[2] = {ta_t(&tm), ta_t(&tv)};
  CHECK_OK(run_f32("mv", a6, 2, &tmvo, 1));
  CHECK(mvo[0] == -2 && mvo[1] == -2);
  float sc = 100;
  tpu_tensor_t tsc = tt_make(&sc, TPU_F32, 0, NULL);
  tpu_tensor_t tmt = transposed(&tm); /* 3 x 2 */
  float v2[2] = {1, 1}, mvo3[3];
  tpu_tensor_t tv2 = tt_make(v2, TPU_F32, 1, s2), tmvo3 = tt_make(mvo3, TPU_F32, 1, s3);
  tpu_arg_t a7[5] = {ta_t(&tsc), ta_t(&tmt), ta_t(&tv2), ta_d(0.5), ta_d(1)};
  CHECK_OK(run_f32("addmv", a7, 5, &tmvo3, 1));
  CHECK(mvo3[0] == 55 && mvo3[1] == 57 && mvo3[2] == 59);
  tpu_tensor_t tcol = tm; /* column 1 of m: {2, 5} */
  tcol.ndim = 1;
  tcol.sizes[0] = 2;
  tcol.strides[0] = 3;
  tcol.data = m + 1;
  tpu_arg_t a8[2] = {ta_t(&tcol), ta_t(&tv2)};
  CHECK_OK(run_f32("dot", a8, 2, &td, 1));
  CHECK(d == 7);
  tpu_arg_t a9[2] = {ta_t(&tcol), ta_t(&tv)};
  tpu_status_t st = run_f32("dot", a9, 2, &td, 1);
  CHECK(st && tpu_status_code(st) == TPU_CODE_INVALID_ARGUMENT);
  tpu_status_free(st);
  /* 0-size batch */
  buf_t e1 = bmake(TPU_F32, 3, 0, 5, 7, 0), e2 = bmake(TPU_F32, 3, 0, 7, 4, 0),
        eo = bmake(TPU_F32, 3, 0, 5, 4, 0);
  tpu_arg_t a10[2] = {ta_t(&e1.t), ta_t(&e2.t)};
  CHECK_OK(run_f32("bmm", a10, 2, &eo.t, 1));
  buf_t* frees[] = {&b1, &b2, &r, &s, &r2, &e1, &e2, &eo};
  for (unsigned i = 0; i < sizeof frees / sizeof frees[0]; i++) free(frees[i]->mem);
}


/* ---- softmax ---- */
static void test_softmax(void) {
  /* softmax over dim 0 of a transposed 3 x 4 view (rows of the 4 x 3 storage) */
  float x[12], y[12], ly[12];
  for (int i = 0; i < 12; i++) x[i] = (float)(i % 5) - 2.0f + 0.25f * (float)i;
  int64_t s43[2] = {4, 3}, s34[2] = {3, 4};
  tpu_tensor_t tx = tt_make(x, TPU_F32, 2, s43);
  tpu_tensor_t txt = transposed(&tx); /* 3 x 4, element (i, j) = x[j * 3 + i] */
  tpu_tensor_t ty = tt_make(y, TPU_F32, 2, s34), tly = tt_make(ly, TPU_F32, 2, s34);
  tpu_arg_t args[3] = {ta_t(&txt), ta_i(0), ta_b(false)};
  CHECK_OK(tt_run("_softmax", args, 3, &ty, 1));
  CHECK_OK(tt_run("_log_softmax", args, 3, &tly, 1));
  for (int j = 0; j < 4; j++) {
    double mx = -INFINITY, sum = 0, got = 0;
    for (int i = 0; i < 3; i++) mx = fmax(mx, x[j * 3 + i]);
    for (int i = 0; i < 3; i++) sum += exp(x[j * 3 + i] - mx);
    for (int i = 0; i < 3; i++) {
      double want = exp(x[j * 3 + i] - mx) / sum;
      CHECK_NEAR(y[i * 4 + j], want, 1e-6);
      CHECK_NEAR(ly[i * 4 + j], log(want), 1e-6);
      got += y[i * 4 + j];
    }
    CHECK_NEAR(got, 1, 1e-6);
  }
  /* large values stay finite (max subtraction), bf16 in float, dim -1 */
  uint16_t bx[3] = {tpu_f32_to_bf16(1000), tpu_f32_to_bf16(1000), tpu_f32_to_bf16(996)}, by[3];
  int64_t s3[1] = {3};
  tpu_tensor_t tbx = tt_make(bx, TPU_BF16, 1, s3), tby = tt_make(by, TPU_BF16, 1, s3);
  tpu_arg_t a2[3] = {ta_t(&tbx), ta_i(-1), ta_b(false)};
  CHECK_OK(tt_run("_softmax", a2, 3, &tby, 1));
  double e = exp(-4.0), z = 2 + e;
  CHECK_NEAR(tpu_bf16_to_f32(by[0]), 1 / z, 4e-3);
  CHECK_NEAR(tpu_bf16_to_f32(by[2]), e / z, 4e-3);
  /* 0-size and a bad dim */
  int64_t s0[2] = {0, 5};
  tpu_tensor_t t0 = tt_make(x, TPU_F32, 2, s0), t0o = tt_make(y, TPU_F32, 2, s0);
  tpu_arg_t a3[3] = {ta_t(&t0), ta_i(1), ta_b(false)};
  CHECK_OK(tt_run("_softmax", a3, 3, &t0o, 1));
  tpu_arg_t a4[3] = {ta_t(&t0), ta_i(2), ta_b(false)};
  tpu_status_t st = tt_run("_softmax", a4, 3, &t0o, 1);
  CHECK(st && tpu_status_code(st) == TPU_CODE_OUT_OF_RANGE);
  tpu_status_free(st);
  /* integer input is not implemented */
  int64_t ix[3] = {1, 2, 3};
  tpu_tensor_t tix = tt_make(ix, TPU_I64, 1, s3);
  tpu_arg_t a5[3] = {ta_t(&tix), ta_i(0), ta_b(false)};
  st = tt_run("_softmax", a5, 3, &tby, 1);
  CHECK(st && tpu_status_code(st) == TPU_CODE_UNIMPLEMENTED);
  tpu_status_free(st);
}

static void test_softmax_backward(void) {
  /* along dim 1 of a 2 x 3 x 20 tensor: strided rows, moved in lane blocks */
  enum { N = 2, C = 3, K = 20, T = N * C * K };
  double x[T], y[T], ly[T], g[T], gi[T], lgi[T];
  for (int i = 0; i < T; i++) {
    x[i] = urand() * 3;
    g[i] = urand();
  }
  int64_t s[3] = {N, C, K};
  tpu_tensor_t tx = tt_make(x, TPU_F64, 3, s), ty = tt_make(y, TPU_F64, 3, s),
               tly = tt_make(ly, TPU_F64, 3, s), tg = tt_make(g, TPU_F64, 3, s),
               tgi = tt_make(gi, TPU_F64, 3, s), tlgi = tt_make(lgi, TPU_F64, 3, s);
  tpu_arg_t a[3] = {ta_t(&tx), ta_i(1), ta_b(false)};
  CHECK_OK(tt_run("_softmax", a, 3, &ty, 1));
  CHECK_OK(tt_run("_log_softmax", a, 3, &tly, 1));
  tpu_arg_t b[4] = {ta_t(&tg), ta_t(&ty), ta_i(1), ta_i(TPU_F64)};
  CHECK_OK(tt_run("_softmax_backward_data", b, 4, &tgi, 1));
  tpu_arg_t c[4] = {ta_t(&tg), ta_t(&tly), ta_i(1), ta_i(TPU_F64)};
  CHECK_OK(tt_run("_log_softmax_backward_data", c, 4, &tlgi, 1));
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++) {
      double sgy = 0, sg = 0, sy = 0, se = 0;
      for (int j = 0; j < C; j++) se += exp(x[n * C * K + j * K + k]);
      for (int j = 0; j < C; j++) {
        int i = n * C * K + j * K + k;
        CHECK_NEAR(y[i], exp(x[i]) / se, 1e-12);
        CHECK_NEAR(ly[i], x[i] - log(se), 1e-12);
        sgy += g[i] * y[i];
        sg += g[i];
        sy += y[i];
      }
      CHECK_NEAR(sy, 1, 1e-12);
      for (int j = 0; j < C; j++) {
        int i = n * C * K + j * K + k;
        CHECK_NEAR(gi[i], y[i] * (g[i] - sgy), 1e-12);
        CHECK_NEAR(lgi[i], g[i] - y[i] * sg, 1e-12);
      }
    }
}

/* ---- nll_loss ---- */
static void test_nll_loss(void) {
  float x[12], w[3] = {1, 2, 0.5f}, out, tw, none[4], gi[12];
  for (int i = 0; i < 12; i++) x[i] = (float)urand();
  int64_t t[4] = {0, 2, -100, 1};
  int64_t s43[2] = {4, 3}, s4[1] = {4}, s3[1] = {3};
  tpu_tensor_t tx = tt_make(x, TPU_F32, 2, s43), tt = tt_make(t, TPU_I64, 1, s4),
               tw3 = tt_make(w, TPU_F32, 1, s3), tout[2], tnone = tt_make(none, TPU_F32, 1, s4);
  tout[0] = tt_make(&out, TPU_F32, 0, NULL);
  tout[1] = tt_make(&tw, TPU_F32, 0, NULL);
  /* mean with class weights and an ignored target */
  tpu_arg_t a[5] = {ta_t(&tx), ta_t(&tt), ta_t(&tw3), ta_i(1), ta_i(-100)};
  CHECK_OK(tt_run("nll_loss_forward", a, 5, tout, 2));
  double num = -(1 * x[0] + 0.5 * x[5] + 2 * x[10]), den = 1 + 0.5 + 2;
  CHECK_NEAR(out, num / den, 1e-6);
  CHECK_NEAR(tw, den, 0);
  /* backward of the mean */
  float go = 2;
  tpu_tensor_t tgo = tt_make(&go, TPU_F32, 0, NULL), tgi = tt_make(gi, TPU_F32, 2, s43);
  tpu_arg_t b[7] = {ta_t(&tgo), ta_t(&tx), ta_t(&tt), ta_t(&tw3), ta_i(1), ta_i(-100), ta_t(&tout[1])};
  CHECK_OK(tt_run("nll_loss_backward", b, 7, &tgi, 1));
  for (int i = 0; i < 12; i++) {
    double want = i == 0 ? -1 : i == 5 ? -0.5 : i == 10 ? -2 : 0;
    CHECK_NEAR(gi[i], want * go / den, 1e-6);
  }
  /* no reduction */
  tpu_tensor_t touts[2] = {tnone, tout[1]};
  tpu_arg_t c[5] = {ta_t(&tx), ta_t(&tt), ta_none(), ta_i(0), ta_i(-100)};
  CHECK_OK(tt_run("nll_loss_forward", c, 5, touts, 2));
  CHECK(none[0] == -x[0] && none[1] == -x[5] && none[2] == 0 && none[3] == -x[10]);
  /* every target ignored: mean is nan */
  int64_t tall[4] = {-100, -100, -100, -100};
  tpu_tensor_t ttall = tt_make(tall, TPU_I64, 1, s4);
  tpu_arg_t d[5] = {ta_t(&tx), ta_t(&ttall), ta_none(), ta_i(1), ta_i(-100)};
  CHECK_OK(tt_run("nll_loss_forward", d, 5, tout, 2));
  CHECK(isnan(out) && tw == 0);
  /* out-of-range target: an error, never a bad read */
  int64_t tbad[4] = {0, 3, 1, 1};
  tpu_tensor_t ttbad = tt_make(tbad, TPU_I64, 1, s4);
  tpu_arg_t e[5] = {ta_t(&tx), ta_t(&ttbad), ta_none(), ta_i(2), ta_i(-100)};
  tpu_status_t st = tt_run("nll_loss_forward", e, 5, tout, 2);
  CHECK(st && tpu_status_code(st) == TPU_CODE_OUT_OF_RANGE);
  CHECK(st && strstr(tpu_status_message(st), "target 3 is out of bounds for 3 classes"));
  tpu_status_free(st);
  /* nll_loss2d: (N=1, C=3, 2) with sum reduction */
  int64_t s132[3] = {1, 3, 2}, s12[2] = {1, 2};
  int64_t t2[2] = {2, 0};
  tpu_tensor_t tx2 = tt_make(x, TPU_F32, 3, s132), tt2 = tt_make(t2, TPU_I64, 2, s12);
  tpu_arg_t f[5] = {ta_t(&tx2), ta_t(&tt2), ta_none(), ta_i(2), ta_i(-100)};
  CHECK_OK(tt_run("nll_loss2d_forward", f, 5, tout, 2));
  CHECK_NEAR(out, -(x[4] + x[1]), 1e-6);
}

/* ---- normalization ---- */
/* Numerical gradient of f with respect to p[0..n). */
static void numgrad(double* p, int n, double (*f)(void*), void* ctx, double* out) {
  const double h = 1e-6;
  for (int i = 0; i < n; i++) {
    double keep = p[i];
    p[i] = keep + h;
    double up = f(ctx);
    p[i] = keep - h;
    double down = f(ctx);
    p[i] = keep;
    out[i] = (up - down) / (2 * h);
  }
}

typedef struct {
  double x[24], w[6], b[6], r[24], y[24], mean[8], rstd[8];
  tpu_tensor_t tx, tw, tb, tr, ty, tmean, trstd;
} norm_case_t;

/* layer norm of a 4 x 6 input over its last dim, group norm of (2, 6, 2)
 * with 3 groups and batch norm of (2, 6, 2): loss = sum(r * y) */
static double ln_loss(void* ctx) {
  norm_case_t* c = ctx;
  int64_t ns[1] = {6};
  tpu_tensor_t outs[3] = {c->ty, c->tmean, c->trstd};
  tpu_arg_t a[5] = {ta_t(&c->tx), ta_il(ns, 1), ta_t(&c->tw), ta_t(&c->tb), ta_d(1e-5)};
  CHECK_OK(tt_run("native_layer_norm", a, 5, outs, 3));
  double l = 0;
  for (int i = 0; i < 24; i++) l += c->r[i] * c->y[i];
  return l;
}

static double gn_loss(void* ctx) {
  norm_case_t* c = ctx;
  tpu_tensor_t outs[3] = {c->ty, c->tmean, c->trstd};
  tpu_arg_t a[8] = {ta_t(&c->tx), ta_t(&c->tw), ta_t(&c->tb), ta_i(2), ta_i(6), ta_i(2), ta_i(3), ta_d(1e-5)};
  CHECK_OK(tt_run("native_group_norm", a, 8, outs, 3));
  double l = 0;
  for (int i = 0; i < 24; i++) l += c->r[i] * c->y[i];
  return l;
}

static double bn_loss(void* ctx) {
  norm_case_t* c = ctx;
  tpu_tensor_t outs[3] = {c->ty, c->tmean, c->trstd};
  tpu_arg_t a[8] = {ta_t(&c->tx), ta_t(&c->tw), ta_t(&c->tb), ta_none(), ta_none(), ta_b(true), ta_d(0.1), ta_d(1e-5)};
  CHECK_OK(tt_run("native_batch_norm", a, 8, outs, 3));
  double l = 0;
  for (int i = 0; i < 24; i++) l += c->r[i] * c->y[i];
  return l;
}

static void norm_case_init(norm_case_t* c, int kind) {
  for (int i = 0; i < 24; i++) {
    c->x[i] = urand() * 2;
    c->r[i] = urand();
  }
  for (int i = 0; i < 6; i++) {
    c->w[i] = 1 + urand() * 0.5;
    c->b[i] = urand();
  }
  int64_t s46[2] = {4, 6}, s262[3] = {2, 6, 2}, s6[1] = {6}, s41[2] = {4, 1}, s23[2] = {2, 3};
  const int64_t* xs = kind == 0 ? s46 : s262;
  int nd = kind == 0 ? 2 : 3;
  c->tx = tt_make(c->x, TPU_F64, nd, xs);
  c->tr = tt_make(c->r, TPU_F64, nd, xs);
  c->ty = tt_make(c->y, TPU_F64, nd, xs);
  c->tw = tt_make(c->w, TPU_F64, 1, s6);
  c->tb = tt_make(c->b, TPU_F64, 1, s6);
  const int64_t* ms = kind == 0 ? s41 : kind == 1 ? s23 : s6;
  int mnd = kind == 2 ? 1 : 2;
  c->tmean = tt_make(c->mean, TPU_F64, mnd, ms);
  c->trstd = tt_make(c->rstd, TPU_F64, mnd, ms);
}

/* Runs the backward of kind 0/1/2 and compares with numerical gradients. */
static void check_norm_backward(int kind) {
  static const char* names[3] = {"native_layer_norm_backward", "native_group_norm_backward",
                                 "native_batch_norm_backward"};
  double (*loss)(void*) = kind == 0 ? ln_loss : kind == 1 ? gn_loss : bn_loss;
  norm_case_t c;
  norm_case_init(&c, kind);
  loss(&c);
  double dx[24], dw[6], db[6], nx[24], nw[6], nb[6];
  int64_t s6[1] = {6}, ns[1] = {6};
  tpu_tensor_t outs[3] = {tt_make(dx, TPU_F64, c.tx.ndim, c.tx.sizes), tt_make(dw, TPU_F64, 1, s6),
                          tt_make(db, TPU_F64, 1, s6)};
  bool mask[3] = {true, true, true};
  tpu_arg_t m = {0};
  m.kind = TPU_ARG_BOOLLIST;
  m.n = 3;
  m.v.blist = mask;
  if (kind == 0) {
    tpu_arg_t a[8] = {ta_t(&c.tr), ta_t(&c.tx), ta_il(ns, 1), ta_t(&c.tmean), ta_t(&c.trstd), ta_t(&c.tw), ta_t(&c.tb), m};
    CHECK_OK(tt_run(names[kind], a, 8, outs, 3));
  } else if (kind == 1) {
    tpu_arg_t a[10] = {ta_t(&c.tr), ta_t(&c.tx), ta_t(&c.tmean), ta_t(&c.trstd), ta_t(&c.tw), ta_i(2), ta_i(6), ta_i(2), ta_i(3), m};
    CHECK_OK(tt_run(names[kind], a, 10, outs, 3));
  } else {
    tpu_arg_t a[10] = {ta_t(&c.tr), ta_t(&c.tx), ta_t(&c.tw), ta_none(), ta_none(), ta_t(&c.tmean), ta_t(&c.trstd), ta_b(true), ta_d(1e-5), m};
    CHECK_OK(tt_run(names[kind], a, 10, outs, 3));
  }
  numgrad(c.x, 24, loss, &c, nx);
  numgrad(c.w, 6, loss, &c, nw);
  numgrad(c.b, 6, loss, &c, nb);
  int bad = 0;
  for (int i = 0; i < 24; i++) bad += fabs(dx[i] - nx[i]) > 1e-6;
  for (int i = 0; i < 6; i++) bad += fabs(dw[i] - nw[i]) > 1e-6 || fabs(db[i] - nb[i]) > 1e-6;
  if (bad) fprintf(stderr, "%s: %d gradient entries differ\n", names[kind], bad);
  CHECK(bad == 0);
}

static void test_layer_norm(void) {
  norm_case_t c;
  norm_case_init(&c, 0);
  ln_loss(&c);
  for (int r = 0; r < 4; r++) {
    double mu = 0, var = 0;
    for (int j = 0; j < 6; j++) mu += c.x[r * 6 + j] / 6;
    for (int j = 0; j < 6; j++) var += (c.x[r * 6 + j] - mu) * (c.x[r * 6 + j] - mu) / 6;
    double rs = 1 / sqrt(var + 1e-5);
    CHECK_NEAR(c.mean[r], mu, 1e-12);
    CHECK_NEAR(c.rstd[r], rs, 1e-9);
    for (int j = 0; j < 6; j++) CHECK_NEAR(c.y[r * 6 + j], (c.x[r * 6 + j] - mu) * rs * c.w[j] + c.b[j], 1e-9);
  }
  check_norm_backward(0);
  /* only grad_input wanted: the other outputs are undefined */
  double dx[24];
  int64_t ns[1] = {6};
  tpu_tensor_t outs[3] = {tt_make(dx, TPU_F64, 2, c.tx.sizes), {0}, {0}};
  outs[1].dtype = outs[2].dtype = TPU_DTYPE_NONE;
  bool mask[3] = {true, false, false};
  tpu_arg_t m = {0};
  m.kind = TPU_ARG_BOOLLIST;
  m.n = 3;
  m.v.blist = mask;
  tpu_arg_t a[8] = {ta_t(&c.tr), ta_t(&c.tx), ta_il(ns, 1), ta_t(&c.tmean), ta_t(&c.trstd), ta_none(), ta_none(), m};
  CHECK_OK(tt_run("native_layer_norm_backward", a, 8, outs, 3));
  /* bf16 input with float statistics, normalized over both dims */
  uint16_t bx[6], by[6];
  float bm, br;
  for (int i = 0; i < 6; i++) bx[i] = tpu_f32_to_bf16((float)i);
  int64_t s23[2] = {2, 3}, s11[2] = {1, 1};
  tpu_tensor_t tbx = tt_make(bx, TPU_BF16, 2, s23), tbo[3] = {tt_make(by, TPU_BF16, 2, s23),
                   tt_make(&bm, TPU_F32, 2, s11), tt_make(&br, TPU_F32, 2, s11)};
  tpu_arg_t b[5] = {ta_t(&tbx), ta_il(s23, 2), ta_none(), ta_none(), ta_d(0)};
  CHECK_OK(tt_run("native_layer_norm", b, 5, tbo, 3));
  CHECK_NEAR(bm, 2.5, 1e-6);
  CHECK_NEAR(br, 1 / sqrt(17.5 / 6), 1e-6);
  CHECK_NEAR(tpu_bf16_to_f32(by[5]), 2.5 / sqrt(17.5 / 6), 1e-2);
  /* normalized_shape must match the trailing dims */
  int64_t bad[1] = {4};
  tpu_arg_t e[5] = {ta_t(&tbx), ta_il(bad, 1), ta_none(), ta_none(), ta_d(0)};
  tpu_status_t st = tt_run("native_layer_norm", e, 5, tbo, 3);
  CHECK(st && tpu_status_code(st) == TPU_CODE_INVALID_ARGUMENT);
  tpu_status_free(st);
}

static void test_group_and_batch_norm(void) {
  norm_case_t c;
  norm_case_init(&c, 1);
  gn_loss(&c);
  /* group g of sample n covers channels 2g, 2g + 1, each with 2 positions */
  for (int n = 0; n < 2; n++)
    for (int g = 0; g < 3; g++) {
      const double* xs = c.x + n * 12 + g * 4;
      double mu = (xs[0] + xs[1] + xs[2] + xs[3]) / 4, var = 0;
      for (int i = 0; i < 4; i++) var += (xs[i] - mu) * (xs[i] - mu) / 4;
      CHECK_NEAR(c.mean[n * 3 + g], mu, 1e-12);
      CHECK_NEAR(c.rstd[n * 3 + g], 1 / sqrt(var + 1e-5), 1e-9);
      int ch = 2 * g + 1; /* element 2 of the group is channel 2g + 1, position 0 */
      CHECK_NEAR(c.y[n * 12 + g * 4 + 2], (xs[2] - mu) / sqrt(var + 1e-5) * c.w[ch] + c.b[ch], 1e-9);
    }
  check_norm_backward(1);

  /* batch norm, training with running statistics updated in place */
  norm_case_init(&c, 2);
  double rm[6] = {0}, rv[6] = {1, 1, 1, 1, 1, 1};
  int64_t s6[1] = {6};
  tpu_tensor_t trm = tt_make(rm, TPU_F64, 1, s6), trv = tt_make(rv, TPU_F64, 1, s6);
  tpu_tensor_t outs[3] = {c.ty, c.tmean, c.trstd};
  tpu_arg_t a[8] = {ta_t(&c.tx), ta_t(&c.tw), ta_t(&c.tb), ta_t(&trm), ta_t(&trv), ta_b(true), ta_d(0.1), ta_d(1e-5)};
  CHECK_OK(tt_run("_native_batch_norm_legit", a, 8, outs, 3));
  for (int ch = 0; ch < 6; ch++) {
    double v[4] = {c.x[ch * 2], c.x[ch * 2 + 1], c.x[12 + ch * 2], c.x[12 + ch * 2 + 1]};
    double mu = (v[0] + v[1] + v[2] + v[3]) / 4, var = 0;
    for (int i = 0; i < 4; i++) var += (v[i] - mu) * (v[i] - mu) / 4;
    CHECK_NEAR(c.mean[ch], mu, 1e-12);
    CHECK_NEAR(c.rstd[ch], 1 / sqrt(var + 1e-5), 1e-9);
    CHECK_NEAR(rm[ch], 0.1 * mu, 1e-12);
    CHECK_NEAR(rv[ch], 0.9 + 0.1 * var * 4 / 3, 1e-12);
    CHECK_NEAR(c.y[12 + ch * 2 + 1], (v[3] - mu) / sqrt(var + 1e-5) * c.w[ch] + c.b[ch], 1e-9);
  }
  check_norm_backward(2);
  /* evaluation uses the running statistics; save_mean/invstd come back empty */
  double y2[24];
  tpu_tensor_t eouts[3] = {tt_make(y2, TPU_F64, 3, c.tx.sizes), tt_make(NULL, TPU_F64, 1, (int64_t[]){0}),
                           tt_make(NULL, TPU_F64, 1, (int64_t[]){0})};
  tpu_arg_t e[8] = {ta_t(&c.tx), ta_none(), ta_none(), ta_t(&trm), ta_t(&trv), ta_b(false), ta_d(0.1), ta_d(0)};
  CHECK_OK(tt_run("native_batch_norm", e, 8, eouts, 3));
  CHECK_NEAR(y2[12 + 5], (c.x[12 + 5] - rm[2]) / sqrt(rv[2]), 1e-12);
  /* group count must divide the channels */
  tpu_arg_t g[8] = {ta_t(&c.tx), ta_none(), ta_none(), ta_i(2), ta_i(6), ta_i(2), ta_i(4), ta_d(1e-5)};
  tpu_status_t st = tt_run("native_group_norm", g, 8, outs, 3);
  CHECK(st && tpu_status_code(st) == TPU_CODE_INVALID_ARGUMENT);
  tpu_status_free(st);
}

/* ---- embedding and dropout backward ---- */
static void test_embedding_backward(void) {
  /* indices (2, 3) with repeats and a padding index; grad rows of 2 */
  int64_t idx[6] = {1, 3, 1, 0, 1, 3};
  float grad[12], gw[10];
  for (int i = 0; i < 12; i++) grad[i] = (float)(i + 1);
  int64_t s23[2] = {2, 3}, s232[3] = {2, 3, 2}, s52[2] = {5, 2};
  tpu_tensor_t ti = tt_make(idx, TPU_I64, 2, s23), tg = tt_make(grad, TPU_F32, 3, s232),
               tw = tt_make(gw, TPU_F32, 2, s52);
  tpu_arg_t a[5] = {ta_t(&tg), ta_t(&ti), ta_i(5), ta_i(0), ta_b(false)};
  CHECK_OK(tt_run("embedding_dense_backward", a, 5, &tw, 1));
  /* index 1 at positions 0, 2, 4; index 3 at 1, 5; index 0 is padding */
  float want[10] = {0, 0, 1 + 5 + 9, 2 + 6 + 10, 0, 0, 3 + 11, 4 + 12, 0, 0};
  for (int i = 0; i < 10; i++) CHECK_NEAR(gw[i], want[i], 0);
  tpu_arg_t b[5] = {ta_t(&tg), ta_t(&ti), ta_i(5), ta_i(-1), ta_b(true)};
  CHECK_OK(tt_run("embedding_dense_backward", b, 5, &tw, 1));
  CHECK_NEAR(gw[0], 7, 0);
  CHECK_NEAR(gw[2], 15.0 / 3, 1e-6);
  CHECK_NEAR(gw[7], 16.0 / 2, 1e-6);
  idx[4] = 5;
  tpu_status_t st = tt_run("embedding_dense_backward", b, 5, &tw, 1);
  CHECK(st && tpu_status_code(st) == TPU_CODE_OUT_OF_RANGE);
  tpu_status_free(st);
}

static void test_dropout_backward(void) {
  float g[4] = {1, 2, 3, 4}, o[4];
  uint8_t m[4] = {1, 0, 1, 1};
  int64_t s4[1] = {4};
  tpu_tensor_t tg = tt_make(g, TPU_F32, 1, s4), tm = tt_make(m, TPU_BOOL, 1, s4),
               to = tt_make(o, TPU_F32, 1, s4);
  tpu_arg_t a[3] = {ta_t(&tg), ta_t(&tm), ta_d(2.5)};
  CHECK_OK(tt_run("native_dropout_backward", a, 3, &to, 1));
  CHECK(o[0] == 2.5f && o[1] == 0 && o[2] == 7.5f && o[3] == 10);
}

int main(void) {
  CHECK_OK(tpu_runtime_init());
  test_gemm_shapes();
  test_gemm_semantics();
  test_gemm_transforms();
  test_gemm_bf16();
  test_gemm_dot2_medium();
  test_gemm_tile_layouts();
  test_gemm_precision();
  test_mm_ops();
  test_softmax();
  test_softmax_backward();
  test_nll_loss();
  test_layer_norm();
  test_group_and_batch_norm();
  test_embedding_backward();
  test_dropout_backward();
  TEST_MAIN_END();
}
