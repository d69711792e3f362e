/* Fused scaled dot-product attention (flash style): the kernels behind
 * aten::_scaled_dot_product_fused_attention_overrideable and its backward.
 *
 * Shapes: query (B, H, Tq, E), key (B, Hk, Tk, E), value (B, Hk, Tk, Ev), or
 * the same without B; H is a multiple of Hk (grouped-query attention: query
 * head h reads key/value head h / (H / Hk)). Any strides. float32, bfloat16
 * and float16, all three operands of one dtype; sums in float32.
 *
 * Forward. Work items are (batch, head, block of BQ queries); each runs over
 * the key blocks (BK keys) the causal mask leaves, with an online softmax: the
 * block's scores S = Q K^T (a BQ x BK tile in a per-thread buffer) are scaled,
 * masked, exponentiated against the running row maximum, and P @ V is added to
 * a float accumulator rescaled whenever the maximum grows. The scores of the
 * whole sequence never exist; the output is divided by the row sums at the end
 * and logsumexp (max + log(sum), float32 (B, H, Tq)) is kept for the backward.
 *
 * Backward (FlashAttention-2's recurrences). Work items are (batch, key/value
 * head); each goes over its query heads, key blocks and query blocks in that
 * order, recomputing P = exp(S - logsumexp) blockwise, and accumulates dV +=
 * P^T dO, dK += dS^T Q and dQ += dS K in float buffers, where dP = dO V^T and
 * dS = P * (dP - rowsum(dO * O)). Every sum runs in a fixed order, so results
 * do not depend on the thread count.
 *
 * Products go through the GEMM micro-kernels of matmul.c (gemm_ukernel.h,
 * the instance matmul uses, chosen by CPUID) with the transforms of the
 * float32 matmul precision (medium: bfloat16 inputs, high: the bf16x3 split,
 * highest: float32). No operand is transposed inside the block loops: the
 * B operands (keys, values, and for the backward queries and dO) are packed
 * into panels once per call; queries and dO as A are only transformed, row
 * by row, and read by rows (tile_rows); the computed P and dS are read where
 * the score products left them, by rows (P V, dS K: tile_rows) or by columns
 * (P^T dO, dS^T Q: tile_cols), rounded in place by the row loops at medium
 * precision (the split of high precision writes its two passes out first).
 * Under the causal mask, tiles and steps that only meet masked pairs are
 * skipped. Products of two input operands follow the precision for float32
 * inputs and are exact for 16-bit ones; for 16-bit inputs the computed
 * operands (P, dS) stay float32 (the products are exact float32 ones: closer
 * to float64 than the math path, which rounds P to the input dtype).
 *
 * Masks: is_causal (query i sees keys j <= i, aligned at the top left as the
 * math path's tril), and attn_bias broadcastable to (B, H, Tq, Tk), boolean
 * (true = attend) or additive. A row that sees no key gives output 0 and
 * logsumexp -inf, as PyTorch's math path (its safe softmax) does.
 *
 * Dropout: element (b, h, i, j) of the attention matrix is kept when the
 * Philox block at counter rng_offset + ((b * H + h) * Tq + i) * Tk + j gives
 * u01(w0, w1) < 1 - p, the rule of native_dropout (random.c), so the same
 * seed and offset give the same mask in every mode, and the backward draws
 * the same one again from the seed and offset the forward returned.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "../../../base/philox.h"
#include "gemm_ukernel.h"
#include "kernels.h"
#include "matmul.h"
#include "tpu/parallel.h"
#include "vecmath.h"

#include "base/env.h"

/* ---- operands ---- */
typedef struct {
  const char* data;
  tpu_dtype_t dt;
  int64_t esz;
  int64_t sb, sh, st, se; /* strides in elements: batch, head, position, feature */
} aview_t;

static void aview_of(aview_t* v, const tpu_tensor_t* t) {
  const int o = t->ndim - 3; /* 1 with a batch dim */
  v->data = t->data;
  v->dt = t->dtype;
  v->esz = (int64_t)tpu_dtype_size(t->dtype);
  v->sb = o ? t->strides[0] : 0;
  v->sh = t->strides[o];
  v->st = t->strides[o + 1];
  v->se = t->strides[o + 2];
}

static inline const char* aptr(const aview_t* v, int64_t b, int64_t h, int64_t t, int64_t e) {
  return v->data + (b * v->sb + h * v->sh + t * v->st + e * v->se) * v->esz;
}

static inline float load_f(const char* p, tpu_dtype_t dt) {
  switch (dt) {
    case TPU_F32: {
      float f;
      memcpy(&f, p, 4);
      return f;
    }
    case TPU_BF16: {
      uint16_t h;
      memcpy(&h, p, 2);
      return tpu_bf16_to_f32(h);
    }
    case TPU_F16: {
      uint16_t h;
      memcpy(&h, p, 2);
      return tpu_f16_to_f32(h);
    }
    default: return (float)tpu_load_f64(p, dt);
  }
}

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t rup(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/* ---- the micro-kernel and the precision's transforms ---- */
/* The instance matmul.c runs (TORCH_TPU_ISA and CPUID decide there). */
static const gemm_ukernel_t* attn_ukernel(void) {
  const char* name = tpu_gemm_isa_name();
#ifdef TPU_GEMM_HAVE_X86
  if (strcmp(name, tpu_gemm_ukernel_avx512.name) == 0) return &tpu_gemm_ukernel_avx512;
  if (strcmp(name, tpu_gemm_ukernel_avx2.name) == 0) return &tpu_gemm_ukernel_avx2;
#endif
  (void)name;
  return &tpu_gemm_ukernel_portable;
}

/* Packed steps of a product of two inputs (dev) and of a computed operand
 * (A) by an input (B) (der), for inputs of dtype dt. */
static void attn_passes(tpu_dtype_t dt, tpu_precision_t prec, gemm_passes_t* dev,
                        gemm_passes_t* der) {
  gemm_passes_t ps = {1, {GEMM_XF_EXACT, GEMM_XF_EXACT}, {GEMM_XF_EXACT, GEMM_XF_EXACT}};
  *dev = *der = ps;
  if (dt != TPU_F32) return;
  if (prec == TPU_PRECISION_MEDIUM) {
    ps.a[0] = ps.b[0] = GEMM_XF_BF16;
  } else if (prec == TPU_PRECISION_HIGH) {
    ps.np = 2;
    ps.a[0] = GEMM_XF_HI;
    ps.a[1] = GEMM_XF_LO;
    ps.b[0] = GEMM_XF_HI16;
    ps.b[1] = GEMM_XF_HI;
  }
  *dev = *der = ps;
}

/* Packs `lines` lines of kc steps (line l, step k at src + (l * sl + k * sk)
 * elements of dtype dt) into panels of w lines, the layout of gemm_ukernel.h
 * (a last partial panel zero-filled): the micro-kernel's own packer for the
 * float32 layouts it knows, element by element otherwise. */
static void pack_src(const gemm_ukernel_t* uk, float* dst, const char* src, tpu_dtype_t dt,
                     int64_t sl, int64_t sk, int64_t lines, int64_t kc, int w,
                     const gemm_passes_t* ps, bool side_a) {
  const gemm_xform_t* xf = side_a ? ps->a : ps->b;
  const int np = ps->np;
  if (lines <= 0 || kc <= 0) return;
  if (dt == TPU_F32 && uk->pack_f32 &&
      uk->pack_f32(dst, (const float*)src, sl, sk, lines, kc, w, xf, np))
    return;
  const int64_t esz = (int64_t)tpu_dtype_size(dt), kcp = kc * np;
  for (int64_t q0 = 0; q0 < lines; q0 += w) {
    const int64_t rows = min64(w, lines - q0);
    float* d = dst + q0 * kcp;
    for (int64_t k = 0; k < kc; k++)
      for (int p = 0; p < np; p++) {
        float* dk = d + (k * np + p) * w;
        int64_t l = 0;
        for (; l < rows; l++)
          dk[l] = gemm_xform(xf[p], load_f(src + ((q0 + l) * sl + k * sk) * esz, dt));
        for (; l < w; l++) dk[l] = 0;
      }
  }
}

/* How tiles() reads A: a block left in rows (row i at a + i * lda,
 * tile_rows) or in columns (row i of step k at a + k * lda + i, tile_cols). */
typedef enum { A_ROWS, A_COLS } alayout_t;

/* The causal mask's zeros in a product of one (query block, key block)
 * pair, where query i meets key j (block-local) iff j <= i + d: tiles()
 * skips the tiles and steps that only meet masked pairs. Z_COLS: A's rows
 * are queries, the columns keys (S = Q K^T; skipped tiles are left as they
 * were); Z_STEPS_TO: rows queries, steps keys (P V); Z_STEPS_FROM: rows keys,
 * steps queries (P^T dO). The skipped steps must be products with zeros. */
typedef enum { Z_NONE, Z_COLS, Z_STEPS_TO, Z_STEPS_FROM } zkind_t;
typedef struct {
  zkind_t kind;
  int64_t d;
} zone_t;

/* c (+)= A @ B over whole micro-kernel tiles: A has `rows` rows of ks
 * source steps, np packed steps each, in layout al (stride lda), rows
 * rounded up to whole tiles readable; B's panels of nr columns start at b0,
 * bps floats apart (`cols` columns); c has row stride ldc and room for rows
 * and columns rounded up to whole tiles. Steps are skipped only where c
 * accumulates. */
static void tiles(const gemm_ukernel_t* uk, const float* a, alayout_t al, int64_t lda,
                  int64_t rows, int64_t ks, int np, const float* b0, int64_t bps, int64_t cols,
                  float* c, int64_t ldc, bool acc, zone_t z) {
  for (int64_t j = 0, jp = 0; j < cols; j += uk->nr, jp++)
    for (int64_t r = 0; r < rows; r += uk->mr) {
      const int64_t last = min64(r + uk->mr, rows) - 1;
      int64_t s0 = 0, s1 = ks;
      if (z.kind == Z_COLS && j > last + z.d) continue;
      if (acc && z.kind == Z_STEPS_TO) s1 = min64(ks, max64(0, last + z.d + 1));
      if (acc && z.kind == Z_STEPS_FROM) s0 = min64(ks, max64(0, r - z.d));
      if (s0 >= s1 && acc) continue;
      const float* b = b0 + jp * bps + s0 * np * uk->nr;
      float* cr = c + r * ldc + j;
      if (al == A_ROWS)
        uk->tile_rows((s1 - s0) * np, a + r * lda + s0 * np, lda, b, cr, ldc, acc, NULL, 0, NULL,
                      0);
      else uk->tile_cols((s1 - s0) * np, a + r + s0 * np * lda, lda, b, cr, ldc, acc, NULL, 0);
    }
}

/* ---- row loops, vectorized (one copy per ISA, chosen at run time) ---- */
/* Maxima and sums of a row run in ROW_LANES interleaved lanes (element j in
 * lane j % ROW_LANES), then across the lanes in a fixed order: vectors on
 * every ISA, the same bits on all of them. */
enum { ROW_LANES = 16 };

/* ROW_LANES floats (any alignment) and their lane masks, for the maximum,
 * whose select the compiler leaves scalar when written element-wise */
typedef float rowv_t __attribute__((vector_size(ROW_LANES * 4), aligned(4)));
typedef int32_t rowvi_t __attribute__((vector_size(ROW_LANES * 4)));

/* gemm_round_bf16 in 32-bit lanes, inlined into the row loops */
TPU_VM_INLINE float row_bf16(float x) {
  const uint32_t u = tpu_vm_bits(x);
  const float r = tpu_vm_float((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
  return x != x ? x : r;
}

TPU_VM_INLINE float lanes_max(const float* m) {
  float r = m[0];
  for (int l = 1; l < ROW_LANES; l++) r = m[l] > r ? m[l] : r;
  return r;
}

TPU_VM_INLINE float lanes_sum(float* t) {
  for (int w = ROW_LANES / 2; w > 0; w /= 2)
    for (int l = 0; l < w; l++) t[l] += t[l + w];
  return t[0];
}

#define ATTN_ROW_FNS(SUF, ATTR)                                                              \
  static ATTR float row_max_##SUF(const float* s, int64_t n) {                               \
    rowv_t v = (rowv_t){0} - INFINITY;                                                       \
    int64_t j = 0;                                                                           \
    for (; j + ROW_LANES <= n; j += ROW_LANES) {                                             \
      const rowv_t x = *(const rowv_t*)(s + j);                                              \
      const rowvi_t gt = x > v;                                                              \
      v = (rowv_t)((gt & (rowvi_t)x) | (~gt & (rowvi_t)v));                                  \
    }                                                                                        \
    float m[ROW_LANES];                                                                      \
    memcpy(m, &v, sizeof m);                                                                 \
    for (int l = 0; j + l < n; l++) m[l] = s[j + l] > m[l] ? s[j + l] : m[l];                \
    return lanes_max(m);                                                                     \
  }                                                                                          \
  /* s = exp(s - m), rounded to bfloat16 with `round` (the sum is of the  */                 \
  /* unrounded values); returns the sum */                                                   \
  static ATTR float row_exp_##SUF(float* s, int64_t n, float m, bool round) {                \
    float t[ROW_LANES] = {0};                                                                \
    int64_t j = 0;                                                                           \
    for (; j + ROW_LANES <= n; j += ROW_LANES)                                               \
      for (int l = 0; l < ROW_LANES; l++) {                                                  \
        float e = tpu_vm_expf(s[j + l] - m);                                                 \
        t[l] += e;                                                                           \
        s[j + l] = round ? row_bf16(e) : e;                                                  \
      }                                                                                      \
    for (int l = 0; j + l < n; l++) {                                                        \
      float e = tpu_vm_expf(s[j + l] - m);                                                   \
      t[l] += e;                                                                             \
      s[j + l] = round ? row_bf16(e) : e;                                                    \
    }                                                                                        \
    return lanes_sum(t);                                                                     \
  }                                                                                          \
  /* s = exp(s * scale - lse) (backward's P) */                                              \
  static ATTR void row_p_##SUF(float* s, int64_t n, float lse) {                             \
    for (int64_t j = 0; j < n; j++) s[j] = tpu_vm_expf(s[j] - lse);                          \
  }                                                                                          \
  static ATTR void row_scale_##SUF(float* s, int64_t n, float a) {                           \
    for (int64_t j = 0; j < n; j++) s[j] *= a;                                               \
  }                                                                                          \
  /* ds = p * (dp - d) */                                                                    \
  static ATTR void row_ds_##SUF(float* ds, const float* p, int64_t n, float d) {             \
    for (int64_t j = 0; j < n; j++) ds[j] = p[j] * (ds[j] - d);                              \
  }                                                                                          \
  static ATTR void row_round_##SUF(float* s, int64_t n) {                                    \
    for (int64_t j = 0; j < n; j++) s[j] = row_bf16(s[j]);                                   \
  }

ATTN_ROW_FNS(p, TPU_VEC_PORTABLE)
#ifdef TPU_HAVE_AVX2_BUILD
ATTN_ROW_FNS(a, TPU_VEC_AVX2)
/* 16 lanes where the micro-kernel is the AVX-512 one (the CPU has it) */
ATTN_ROW_FNS(z, __attribute__((target("avx512f,avx512dq,avx512vl,avx2,fma,prefer-vector-width=512"),
                               optimize(TPU_VEC_OPTS, "fp-contract=fast"))))
#define ROW_CALL(isa, fn, ...) \
  ((isa) == 2 ? fn##_z(__VA_ARGS__) : (isa) == 1 ? fn##_a(__VA_ARGS__) : fn##_p(__VA_ARGS__))
#else
#define ROW_CALL(isa, fn, ...) fn##_p(__VA_ARGS__)
#endif

/* ---- the problem ---- */
enum { MASK_NONE = 0, MASK_BOOL, MASK_ADD };

typedef struct {
  const gemm_ukernel_t* uk;
  gemm_passes_t pd, px; /* input x input, computed x input */
  int rowisa;           /* row loops' ISA: 0 portable, 1 AVX2, 2 AVX-512 */
  bool round_p;         /* computed operands (P, dS) as A are rounded to bfloat16 in place */
  int64_t B, H, Hk, g, Tq, Tk, E, Ev;
  int64_t bq, bk, nqb, nkb;
  float scale;
  bool causal;
  int mask_kind;
  const char* mask;
  tpu_dtype_t mdt;
  int64_t mesz, mb, mh, mi, mj; /* mask strides broadcast to (B, H, Tq, Tk) */
  bool dropout;
  double keep;    /* 1 - p */
  float keep_inv; /* 1 / (1 - p), 0 when p == 1 */
  uint64_t seed, offset;
  aview_t q, k, v, o, dout, dq, dk, dv;
  aview_t db;   /* backward: gradient of an additive mask, (B, H, Tq, Tk) ... */
  bool want_db; /* ... when the call has a fourth output */
  float* lse; /* (B, H, Tq) */
  int64_t lsb, lsh, lst;
  /* forward: packed keys and values per (batch, kv head) */
  float* kpack;
  float* vpack;
  int64_t kps, vps; /* floats per (batch, kv head) */
  /* backward: packs per (batch, kv head) (keys for S, values for dP, keys for
   * dQ) and per (batch, head) (queries and dO as A and as B operands, then
   * rowsum(dO * O) and logsumexp rows), n_* floats each */
  float *kS, *vP, *kQ, *qA, *doA, *qB, *doB, *Dr, *L;
  int64_t n_kS, n_vP, n_kQ, n_qA, n_doA, n_qB, n_doB, tqp, ep, evp;
  _Atomic int64_t next;
  int64_t items;
  _Atomic int oom;
} attn_t;

static tpu_status_t attn_init(attn_t* a, const char* op, const tpu_tensor_t* q,
                              const tpu_tensor_t* k, const tpu_tensor_t* v,
                              const tpu_tensor_t* mask, double scale_arg, bool has_scale,
                              bool causal, double p, tpu_precision_t prec) {
  memset(a, 0, sizeof *a);
  TPU_CHECK_ARG(q && k && v, "%s: query, key and value must be tensors", op);
  TPU_CHECK_ARG((q->ndim == 3 || q->ndim == 4) && k->ndim == q->ndim && v->ndim == q->ndim,
                "%s: query, key and value must all be 3-d or all 4-d, got %d, %d, %d", op,
                q->ndim, k->ndim, v->ndim);
  TPU_CHECK_ARG(q->dtype == k->dtype && q->dtype == v->dtype &&
                    (q->dtype == TPU_F32 || q->dtype == TPU_BF16 || q->dtype == TPU_F16),
                "%s: query, key and value must have one dtype of float32, bfloat16, float16; got "
                "%s, %s, %s",
                op, tpu_dtype_name(q->dtype), tpu_dtype_name(k->dtype), tpu_dtype_name(v->dtype));
  const int o = q->ndim - 3;
  a->B = o ? q->sizes[0] : 1;
  a->H = q->sizes[o];
  a->Tq = q->sizes[o + 1];
  a->E = q->sizes[o + 2];
  a->Hk = k->sizes[o];
  a->Tk = k->sizes[o + 1];
  a->Ev = v->sizes[o + 2];
  TPU_CHECK_ARG(!o || (k->sizes[0] == a->B && v->sizes[0] == a->B),
                "%s: batch sizes differ: %lld, %lld, %lld", op, (long long)a->B,
                (long long)k->sizes[0], (long long)v->sizes[0]);
  TPU_CHECK_ARG(k->sizes[o + 2] == a->E, "%s: key's last dim %lld differs from query's %lld", op,
                (long long)k->sizes[o + 2], (long long)a->E);
  TPU_CHECK_ARG(v->sizes[o] == a->Hk && v->sizes[o + 1] == a->Tk,
                "%s: value's heads and length (%lld, %lld) differ from key's (%lld, %lld)", op,
                (long long)v->sizes[o], (long long)v->sizes[o + 1], (long long)a->Hk,
                (long long)a->Tk);
  TPU_CHECK_ARG(a->Hk > 0 && a->H % a->Hk == 0,
                "%s: query heads %lld must be a multiple of key/value heads %lld", op,
                (long long)a->H, (long long)a->Hk);
  TPU_CHECK_ARG(p >= 0 && p <= 1, "%s: dropout probability must be in [0, 1], got %g", op, p);
  a->g = a->H / a->Hk;
  a->uk = attn_ukernel();
  attn_passes(q->dtype, prec, &a->pd, &a->px);
  a->round_p = a->px.np == 1 && a->px.a[0] == GEMM_XF_BF16;
#ifdef TPU_HAVE_AVX2_BUILD
  if (tpu_host_isa() == TPU_ISA_AVX2) a->rowisa = a->uk == &tpu_gemm_ukernel_avx512 ? 2 : 1;
#endif
  const int mr = a->uk->mr, nr = a->uk->nr;
  /* BQ: about 64 queries in whole row panels; BK: about 96 keys in whole row
   * and column panels (the backward's dK/dV blocks take key rows) */
  a->bq = rup(64, mr);
  int64_t l = mr;
  while (l % nr) l += mr;
  a->bk = l * max64(1, 96 / l);
  a->nqb = (a->Tq + a->bq - 1) / a->bq;
  a->nkb = (a->Tk + a->bk - 1) / a->bk;
  a->scale = (float)(has_scale ? scale_arg : 1.0 / sqrt((double)a->E));
  a->causal = causal;
  aview_of(&a->q, q);
  aview_of(&a->k, k);
  aview_of(&a->v, v);
  if (mask) {
    TPU_CHECK_ARG(mask->dtype == TPU_BOOL || mask->dtype == q->dtype,
                  "%s: attn_mask must be bool or the query's dtype %s, got %s", op,
                  tpu_dtype_name(q->dtype), tpu_dtype_name(mask->dtype));
    TPU_CHECK_ARG(mask->ndim <= 4, "%s: attn_mask has %d dims", op, mask->ndim);
    const int64_t want[4] = {a->B, a->H, a->Tq, a->Tk};
    int64_t st[4] = {0, 0, 0, 0};
    for (int d = 0; d < mask->ndim; d++) {
      const int wd = 4 - mask->ndim + d;
      const int64_t sz = mask->sizes[d];
      TPU_CHECK_ARG(sz == want[wd] || sz == 1,
                    "%s: attn_mask of size %lld at dim %d does not broadcast to %lld", op,
                    (long long)sz, d, (long long)want[wd]);
      st[wd] = sz == 1 ? 0 : mask->strides[d];
    }
    a->mask_kind = mask->dtype == TPU_BOOL ? MASK_BOOL : MASK_ADD;
    a->mask = mask->data;
    a->mdt = mask->dtype;
    a->mesz = (int64_t)tpu_dtype_size(mask->dtype);
    a->mb = st[0];
    a->mh = st[1];
    a->mi = st[2];
    a->mj = st[3];
  }
  a->dropout = p > 0;
  a->keep = 1.0 - p;
  a->keep_inv = p < 1 ? (float)(1.0 / (1.0 - p)) : 0.0f;
  return TPU_OK;
}

static void lse_view(attn_t* a, const tpu_tensor_t* t) {
  a->lse = t->data;
  a->lsb = t->ndim == 3 ? t->strides[0] : 0;
  a->lsh = t->strides[t->ndim - 2];
  a->lst = t->strides[t->ndim - 1];
}

/* Scores of row qi against keys [k0, k0 + n) in s: scaled, masked (masked
 * ones -inf); returns how many of the n keys the causal mask leaves. */
static void row_mask(const attn_t* a, float* s, int64_t b, int64_t h, int64_t qi, int64_t k0,
                     int64_t n) {
  ROW_CALL(a->rowisa, row_scale, s, n, a->scale);
  if (a->mask_kind != MASK_NONE) {
    const char* m = a->mask + (b * a->mb + h * a->mh + qi * a->mi + k0 * a->mj) * a->mesz;
    const int64_t mj = a->mj * a->mesz;
    if (a->mask_kind == MASK_BOOL) {
      for (int64_t j = 0; j < n; j++)
        if (!m[j * mj]) s[j] = -INFINITY;
    } else if (a->mdt == TPU_F32 && mj == 4) {
      const float* mf = (const float*)m;
      for (int64_t j = 0; j < n; j++) s[j] += mf[j];
    } else {
      for (int64_t j = 0; j < n; j++) s[j] += load_f(m + j * mj, a->mdt);
    }
  }
  if (a->causal)
    for (int64_t j = max64(0, qi - k0 + 1); j < n; j++) s[j] = -INFINITY;
}

/* Dropout of row qi against keys [k0, k0 + n): s[j] *= keep ? 1/(1-p) : 0;
 * with `also`, the same for also[j]. */
static void row_dropout(const attn_t* a, float* s, float* also, int64_t b, int64_t h, int64_t qi,
                        int64_t k0, int64_t n) {
  const uint64_t base = a->offset + (uint64_t)(((b * a->H + h) * a->Tq + qi) * a->Tk + k0);
  for (int64_t j = 0; j < n; j++) {
    tpu_philox_block_t blk = tpu_philox4x32_10(base + (uint64_t)j, 0, a->seed);
    const double u = (double)((((uint64_t)blk.w[0] << 32) | blk.w[1]) >> 11) * 0x1p-53;
    const float z = u < a->keep ? a->keep_inv : 0.0f;
    s[j] *= z;
    if (also) also[j] *= z;
  }
}

/* A computed block (rows x n floats, row stride ld) as the A operand of a
 * product with an input, in layout al (A_ROWS: steps along its rows; A_COLS:
 * its rows are the steps): itself with one packed step per step (the row
 * loops applied the transform, round_p), else its passes written into dst
 * (room for rows * n * np floats and mr more); *lda gets the layout's
 * stride. Streams the block once, no transposition. */
static const float* computed_a(const attn_t* a, float* dst, const float* src, int64_t ld,
                               int64_t rows, int64_t n, alayout_t al, int64_t* lda) {
  const gemm_passes_t* px = &a->px;
  if (px->np == 1) {
    *lda = ld;
    return src;
  }
  if (al == A_ROWS) { /* row i at dst + i * n * np, passes interleaved */
    *lda = n * px->np;
    pack_src(a->uk, dst, (const char*)src, TPU_F32, ld, 1, rows, n, 1, px, true);
    return dst;
  }
  *lda = n;
  for (int64_t i = 0; i < rows; i++) /* step (i, pass p) is the line i * np + p */
    for (int p = 0; p < px->np; p++) {
      const gemm_passes_t one = {1, {px->a[p]}, {px->a[p]}};
      pack_src(a->uk, dst + (i * px->np + p) * n, (const char*)(src + i * ld), TPU_F32, ld, 1, 1,
               n, 1, &one, true);
    }
  return dst;
}

/* Rows of a float accumulator, times scale (in place), to rows [t0, t0 + n)
 * of (batch b, head h) of v. */
static void store_rows(const attn_t* a, const aview_t* v, int64_t b, int64_t h, int64_t t0,
                       int64_t n, float* src, int64_t ld, int64_t cols, float scale) {
  for (int64_t i = 0; i < n; i++) {
    float* r = src + i * ld;
    if (scale != 1.0f) ROW_CALL(a->rowisa, row_scale, r, cols, scale);
    tpu_run_store_f32((char*)aptr(v, b, h, t0 + i, 0), v->se, v->dt, r, cols);
  }
}

/* How many of a block's n keys row i (of `rows`) must hold for the
 * products that tiles() runs with the causal zone's offset d: P V and dS K
 * read the keys up to the diagonal of the row's last tile row, P^T dO and
 * dS^T Q the key tiles that start at or before its own diagonal. The keys
 * between the row's diagonal and that extent are masked (zeros in P). */
static int64_t row_extent(const attn_t* a, int64_t i, int64_t rows, int64_t d, int64_t n) {
  if (!a->causal || a->want_db) return n;
  const int64_t mr = a->uk->mr, last = min64((i / mr + 1) * mr, rows) - 1;
  const int64_t e = max64(last + d + 1, i + d < 0 ? 0 : ((i + d) / mr + 1) * mr);
  return min64(n, max64(e, 0));
}

/* ---- forward ---- */
/* Packs key and value panels of (batch, kv head) entries claimed one by one. */
static void fwd_pack(void* ctx, int64_t begin, int64_t end) {
  attn_t* a = ctx;
  const gemm_ukernel_t* uk = a->uk;
  for (int64_t it; (it = atomic_fetch_add(&a->next, 1)) < a->B * a->Hk;) {
    const int64_t b = it / a->Hk, hk = it % a->Hk;
    /* K as B of S = Q K^T: lines keys, steps features */
    pack_src(uk, a->kpack + it * a->kps, aptr(&a->k, b, hk, 0, 0), a->k.dt, a->k.st, a->k.se,
             a->Tk, a->E, uk->nr, &a->pd, false);
    /* V as B of P V: lines value features, steps keys */
    pack_src(uk, a->vpack + it * a->vps, aptr(&a->v, b, hk, 0, 0), a->v.dt, a->v.se, a->v.st,
             a->Ev, a->Tk, uk->nr, &a->px, false);
  }
}

static void fwd_items(void* ctx, int64_t begin, int64_t end) {
  attn_t* a = ctx;
  const gemm_ukernel_t* uk = a->uk;
  const int mr = uk->mr, nr = uk->nr;
  const int npd = a->pd.np, npx = a->px.np;
  const int64_t ldS = a->bk, evp = rup(a->Ev, nr), ldO = evp;
  const size_t floats = (size_t)(a->bq * a->E * npd + a->bq * ldS + a->bq * a->bk * npx + mr +
                                 a->bq * ldO + 2 * a->bq);
  float* buf = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
  if (!buf) {
    a->oom = 1;
    return;
  }
  memset(buf, 0, floats * sizeof(float)); /* whole tiles read past the blocks' edges */
  float* qp = buf;
  float* S = qp + a->bq * a->E * npd;
  float* pp = S + a->bq * ldS;
  float* O = pp + a->bq * a->bk * npx + mr;
  float* mx = O + a->bq * ldO;
  float* sum = mx + a->bq;
  for (int64_t it; (it = atomic_fetch_add(&a->next, 1)) < a->items;) {
    const int64_t bh = it / a->nqb, qb = it % a->nqb, b = bh / a->H, h = bh % a->H;
    const int64_t hk = h / a->g, q0 = qb * a->bq, qcur = min64(a->bq, a->Tq - q0);
    const float* kp = a->kpack + (b * a->Hk + hk) * a->kps;
    const float* vp = a->vpack + (b * a->Hk + hk) * a->vps;
    pack_src(uk, qp, aptr(&a->q, b, h, q0, 0), a->q.dt, a->q.st, a->q.se, qcur, a->E, 1, &a->pd,
             true); /* by rows: transformed, not transposed */
    for (int64_t i = 0; i < qcur; i++) {
      mx[i] = -INFINITY;
      sum[i] = 0;
    }
    memset(O, 0, sizeof(float) * (size_t)(a->bq * ldO));
    const int64_t kend = a->causal ? min64(a->Tk, q0 + qcur) : a->Tk;
    for (int64_t k0 = 0; k0 < kend; k0 += a->bk) {
      const int64_t kcur = min64(a->bk, a->Tk - k0);
      const int64_t d = q0 - k0;
      tiles(uk, qp, A_ROWS, a->E * npd, qcur, a->E, npd, kp + k0 * a->E * npd, nr * a->E * npd,
            kcur, S, ldS, false, (zone_t){a->causal ? Z_COLS : Z_NONE, d});
      for (int64_t i = 0; i < qcur; i++) {
        float* s = S + i * ldS;
        const int64_t n = row_extent(a, i, qcur, d, kcur);
        row_mask(a, s, b, h, q0 + i, k0, n);
        const float bm = ROW_CALL(a->rowisa, row_max, s, n);
        const float mnew = bm > mx[i] ? bm : mx[i];
        if (mnew == -INFINITY) { /* nothing seen yet */
          memset(s, 0, sizeof(float) * (size_t)n);
          continue;
        }
        const float alpha = expf(mx[i] - mnew);
        const float bs = ROW_CALL(a->rowisa, row_exp, s, n, mnew, a->round_p && !a->dropout);
        sum[i] = sum[i] * alpha + bs;
        mx[i] = mnew;
        if (alpha != 1.0f) ROW_CALL(a->rowisa, row_scale, O + i * ldO, evp, alpha);
        if (a->dropout) {
          row_dropout(a, s, NULL, b, h, q0 + i, k0, n);
          if (a->round_p) ROW_CALL(a->rowisa, row_round, s, n);
        }
      }
      int64_t lda;
      const float* pa = computed_a(a, pp, S, ldS, qcur, kcur, A_ROWS, &lda);
      tiles(uk, pa, A_ROWS, lda, qcur, kcur, npx, vp + k0 * npx * nr, nr * a->Tk * npx, a->Ev, O,
            ldO, true, (zone_t){a->causal ? Z_STEPS_TO : Z_NONE, d});
    }
    for (int64_t i = 0; i < qcur; i++) {
      store_rows(a, &a->o, b, h, q0 + i, 1, O + i * ldO, ldO, a->Ev,
                 sum[i] > 0 ? 1.0f / sum[i] : 0.0f);
      a->lse[b * a->lsb + h * a->lsh + (q0 + i) * a->lst] =
          sum[i] > 0 ? mx[i] + logf(sum[i]) : -INFINITY;
    }
  }
  free(buf);
}

/* _scaled_dot_product_fused_attention_overrideable(query, key, value,
 * attn_bias?, dropout_p, is_causal, return_debug_mask, *, scale?) -> outputs
 * (output, logsumexp); the bridge passes only these two and reserves
 * B * H * Tq * Tk Philox counters when dropout_p > 0. */
tpu_status_t tpu_k_sdpa_fwd(const tpu_call_t* c) {
  static const char* op = "scaled_dot_product_attention";
  attn_t a;
  TPU_CHECK_ARG(c->nouts >= 2, "%s: expected output and logsumexp", op);
  const double p = tpu_arg_f64(c, 4, 0.0);
  TPU_RETURN_IF_ERROR(attn_init(&a, op, tpu_arg_tensor(c, 0), tpu_arg_tensor(c, 1),
                                tpu_arg_tensor(c, 2), tpu_arg_tensor(c, 3), tpu_arg_f64(c, 7, 0),
                                !tpu_arg_is_none(c, 7), tpu_arg_bool(c, 5, false), p,
                                c->precision));
  a.seed = c->rng_seed;
  a.offset = c->rng_offset;
  aview_of(&a.o, &c->outs[0]);
  lse_view(&a, &c->outs[1]);
  if (a.B * a.H * a.Tq == 0 || a.Ev == 0) return TPU_OK;
  /* no keys: every row sees none (output 0, logsumexp -inf) */
  const int nr = a.uk->nr;
  a.kps = rup(a.Tk, nr) * a.E * a.pd.np;
  a.vps = rup(a.Ev, nr) * a.Tk * a.px.np;
  const size_t floats = (size_t)(a.B * a.Hk * (a.kps + a.vps)) + 16;
  float* packs = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
  if (!packs)
    return TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory for %zu bytes of packed keys", op,
                   floats * sizeof(float));
  a.kpack = packs;
  a.vpack = packs + a.B * a.Hk * a.kps;
  const int nth = tpu_num_threads();
  atomic_store(&a.next, 0);
  if (nth > 1 && a.B * a.Hk > 1) tpu_parallel_for(nth, 1, fwd_pack, &a);
  else fwd_pack(&a, 0, 1);
  a.items = a.B * a.H * a.nqb;
  atomic_store(&a.next, 0);
  if (nth > 1 && a.items > 1) tpu_parallel_for(min64(nth, a.items), 1, fwd_items, &a);
  else fwd_items(&a, 0, 1);
  free(packs);
  if (a.oom) return TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory for scratch", op);
  return TPU_OK;
}

/* ---- backward ---- */
/* Packs the backward's operands: items [0, B * Hk) are (batch, kv head),
 * then (batch, head). */
static void bwd_pack(void* ctx, int64_t begin, int64_t end) {
  attn_t* a = ctx;
  const gemm_ukernel_t* uk = a->uk;
  const int nr = uk->nr;
  const int64_t E = a->E, Ev = a->Ev, Tq = a->Tq, Tk = a->Tk, nkv = a->B * a->Hk;
  for (int64_t it; (it = atomic_fetch_add(&a->next, 1)) < nkv + a->B * a->H;) {
    if (it < nkv) {
      const int64_t b = it / a->Hk, hk = it % a->Hk;
      const char* k = aptr(&a->k, b, hk, 0, 0);
      pack_src(uk, a->kS + it * a->n_kS, k, a->k.dt, a->k.st, a->k.se, Tk, E, nr, &a->pd, false);
      pack_src(uk, a->vP + it * a->n_vP, aptr(&a->v, b, hk, 0, 0), a->v.dt, a->v.st, a->v.se, Tk,
               Ev, nr, &a->pd, false);
      pack_src(uk, a->kQ + it * a->n_kQ, k, a->k.dt, a->k.se, a->k.st, E, Tk, nr, &a->px, false);
      continue;
    }
    const int64_t bh = it - nkv, b = bh / a->H, h = bh % a->H;
    const char* q = aptr(&a->q, b, h, 0, 0);
    const char* d = aptr(&a->dout, b, h, 0, 0);
    /* Q and dO as A, by rows (tile_rows): transformed, not transposed; the
     * rows up to a whole tile are zeros */
    float *qA = a->qA + bh * a->n_qA, *doA = a->doA + bh * a->n_doA;
    pack_src(uk, qA, q, a->q.dt, a->q.st, a->q.se, Tq, E, 1, &a->pd, true);
    pack_src(uk, doA, d, a->dout.dt, a->dout.st, a->dout.se, Tq, Ev, 1, &a->pd, true);
    memset(qA + Tq * E * a->pd.np, 0, sizeof(float) * (size_t)((a->tqp - Tq) * E * a->pd.np));
    memset(doA + Tq * Ev * a->pd.np, 0, sizeof(float) * (size_t)((a->tqp - Tq) * Ev * a->pd.np));
    pack_src(uk, a->qB + bh * a->n_qB, q, a->q.dt, a->q.se, a->q.st, E, Tq, nr, &a->px, false);
    pack_src(uk, a->doB + bh * a->n_doB, d, a->dout.dt, a->dout.se, a->dout.st, Ev, Tq, nr,
             &a->px, false);
    float* Dr = a->Dr + bh * a->tqp;
    float* L = a->L + bh * a->tqp;
    for (int64_t i = 0; i < Tq; i++) {
      float s = 0;
      if (a->o.dt == TPU_F32) { /* else bwd_rowsum, from unrounded P */
        const float* x = (const float*)aptr(&a->dout, b, h, i, 0);
        const float* y = (const float*)aptr(&a->o, b, h, i, 0);
        if (a->dout.se == 1 && a->o.se == 1) s = uk->dot(x, y, Ev);
        else
          for (int64_t e = 0; e < Ev; e++) s += x[e * a->dout.se] * y[e * a->o.se];
      }
      Dr[i] = s;
      L[i] = a->lse[b * a->lsb + h * a->lsh + i * a->lst];
    }
  }
}

/* The first query block a key block at k0 meets (causal: rows i >= k0). */
static inline int64_t first_q(const attn_t* a, int64_t k0) {
  return a->causal ? k0 / a->bq * a->bq : 0;
}

/* Per-thread blocks of the backward. */
typedef struct {
  float *S, *dP, *Pd, *pk, *acc, *acc2;
} bwd_buf_t;

static float* bwd_buf_alloc(const attn_t* a, bwd_buf_t* w, int64_t acc, int64_t acc2) {
  const int64_t n_blk = a->bq * a->bk;
  const int64_t n_pk = a->bq * a->bk * a->px.np + a->uk->mr; /* computed_a's */
  const size_t floats = (size_t)(3 * n_blk + n_pk + acc + acc2);
  float* buf = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
  if (!buf) return NULL;
  /* whole tiles read past the blocks' edges: finite values there */
  memset(buf, 0, sizeof(float) * (size_t)(3 * n_blk + n_pk));
  w->S = buf;
  w->dP = w->S + n_blk;
  w->Pd = w->dP + n_blk;
  w->pk = w->Pd + n_blk;
  w->acc = w->pk + n_pk;
  w->acc2 = w->acc + acc;
  return buf;
}

/* The additive mask's gradient is dS itself (the scores are scale * Q K^T +
 * mask): row qi of the block's dS (w->dP) goes to the (B, H, Tq, Tk) output. */
static void store_db(const attn_t* a, const bwd_buf_t* w, int64_t b, int64_t h, int64_t q0,
                     int64_t i, int64_t k0, int64_t kcur) {
  tpu_run_store_f32((char*)aptr(&a->db, b, h, q0 + i, k0), a->db.se, a->db.dt,
                    w->dP + i * a->bk, kcur);
}

/* One (query block, key block) of head h: P into S, dS into dP, P with the
 * dropout applied into Pd; `partial` leaves dP as dO V^T. Else dS goes to
 * the mask's gradient (want_db), then Pd and dS are rounded for the
 * products they enter as A (round_p). */
static void bwd_block(const attn_t* a, bwd_buf_t* w, int64_t b, int64_t h, int64_t q0,
                      int64_t qcur, int64_t k0, int64_t kcur, bool partial) {
  const gemm_ukernel_t* uk = a->uk;
  const int nr = uk->nr, npd = a->pd.np;
  const int64_t E = a->E, Ev = a->Ev, ldS = a->bk, bh = b * a->H + h, kv = b * a->Hk + h / a->g;
  const int64_t d = q0 - k0;
  const zone_t z = {a->causal ? Z_COLS : Z_NONE, d};
  tiles(uk, a->qA + bh * a->n_qA + q0 * E * npd, A_ROWS, E * npd, qcur, E, npd,
        a->kS + kv * a->n_kS + k0 * E * npd, nr * E * npd, kcur, w->S, ldS, false, z);
  tiles(uk, a->doA + bh * a->n_doA + q0 * Ev * npd, A_ROWS, Ev * npd, qcur, Ev, npd,
        a->vP + kv * a->n_vP + k0 * Ev * npd, nr * Ev * npd, kcur, w->dP, ldS, false, z);
  const float* L = a->L + bh * a->tqp + q0;
  const float* Dr = a->Dr + bh * a->tqp + q0;
  for (int64_t i = 0; i < qcur; i++) {
    float *s = w->S + i * ldS, *dp = w->dP + i * ldS, *pd = w->Pd + i * ldS;
    const int64_t n = row_extent(a, i, qcur, d, kcur);
    row_mask(a, s, b, h, q0 + i, k0, n);
    if (L[i] == -INFINITY) memset(s, 0, sizeof(float) * (size_t)n);
    else ROW_CALL(a->rowisa, row_p, s, n, L[i]);
    memcpy(pd, s, sizeof(float) * (size_t)n);
    if (a->dropout) row_dropout(a, pd, partial ? NULL : dp, b, h, q0 + i, k0, n);
    if (partial) continue;
    ROW_CALL(a->rowisa, row_ds, dp, s, n, Dr[i]);
    if (a->want_db) store_db(a, w, b, h, q0, i, k0, kcur);
    if (a->round_p) {
      ROW_CALL(a->rowisa, row_round, pd, n);
      ROW_CALL(a->rowisa, row_round, dp, n);
    }
  }
}

/* rowsum(dO * O) = sum_j Pd_ij dP_ij, from the blocks, for 16-bit outputs:
 * the stored output is rounded, and dP - D cancels (its rounding error
 * would reach dS many times over). Items are (batch, head); runs after
 * bwd_pack. */
static void bwd_rowsum(void* ctx, int64_t begin, int64_t end) {
  attn_t* a = ctx;
  bwd_buf_t w;
  float* buf = bwd_buf_alloc(a, &w, 0, 0);
  if (!buf) {
    a->oom = 1;
    return;
  }
  for (int64_t it; (it = atomic_fetch_add(&a->next, 1)) < a->B * a->H;) {
    const int64_t b = it / a->H, h = it % a->H;
    float* Dr = a->Dr + it * a->tqp;
    for (int64_t q0 = 0; q0 < a->Tq; q0 += a->bq) {
      const int64_t qcur = min64(a->bq, a->Tq - q0);
      for (int64_t k0 = 0; k0 < a->Tk && first_q(a, k0) <= q0; k0 += a->bk) {
        const int64_t kcur = min64(a->bk, a->Tk - k0);
        bwd_block(a, &w, b, h, q0, qcur, k0, kcur, true);
        for (int64_t i = 0; i < qcur; i++) {
          const float *pd = w.Pd + i * a->bk, *dp = w.dP + i * a->bk;
          const int64_t n = row_extent(a, i, qcur, q0 - k0, kcur);
          float s = 0;
          for (int64_t j = 0; j < n; j++) s += pd[j] * dp[j];
          Dr[q0 + i] += s;
        }
      }
    }
  }
  free(buf);
}

/* dV += Pd^T dO and dK += dS^T Q for the block's kcur keys (rows of dv and
 * dk, row strides evp and ep): A's rows are keys, its steps queries, so the
 * blocks are read by columns. */
static void bwd_dkdv(const attn_t* a, bwd_buf_t* w, int64_t b, int64_t h, int64_t q0,
                     int64_t qcur, int64_t k0, int64_t kcur, float* dk, float* dv) {
  const gemm_ukernel_t* uk = a->uk;
  const int nr = uk->nr, npx = a->px.np;
  const int64_t bh = b * a->H + h, ldS = a->bk;
  const zone_t z = {a->causal ? Z_STEPS_FROM : Z_NONE, q0 - k0};
  int64_t lda;
  const float* pa = computed_a(a, w->pk, w->Pd, ldS, qcur, kcur, A_COLS, &lda);
  tiles(uk, pa, A_COLS, lda, kcur, qcur, npx, a->doB + bh * a->n_doB + q0 * npx * nr,
        nr * a->Tq * npx, a->Ev, dv, a->evp, true, z);
  pa = computed_a(a, w->pk, w->dP, ldS, qcur, kcur, A_COLS, &lda);
  tiles(uk, pa, A_COLS, lda, kcur, qcur, npx, a->qB + bh * a->n_qB + q0 * npx * nr,
        nr * a->Tq * npx, a->E, dk, a->ep, true, z);
}

/* dQ += dS K for the block's qcur queries (rows of dq, row stride ep). */
static void bwd_dq(const attn_t* a, bwd_buf_t* w, int64_t b, int64_t h, int64_t q0, int64_t qcur,
                   int64_t k0, int64_t kcur, float* dq) {
  const gemm_ukernel_t* uk = a->uk;
  const int nr = uk->nr, npx = a->px.np;
  const int64_t kv = b * a->Hk + h / a->g;
  int64_t lda;
  const float* pa = computed_a(a, w->pk, w->dP, a->bk, qcur, kcur, A_ROWS, &lda);
  tiles(uk, pa, A_ROWS, lda, qcur, kcur, npx, a->kQ + kv * a->n_kQ + k0 * npx * nr,
        nr * a->Tk * npx, a->E, dq, a->ep, true,
        (zone_t){a->causal ? Z_STEPS_TO : Z_NONE, q0 - k0});
}

/* Zeros of the mask's gradient where the causal mask skips whole blocks:
 * rows [0, first_q(k0)) of key block k0. */
static void zero_db(const attn_t* a, int64_t b, int64_t h, int64_t k0, int64_t kcur) {
  static const float zeros[64];
  for (int64_t i = 0; i < first_q(a, k0) && i < a->Tq; i++)
    for (int64_t j = 0; j < kcur; j += 64)
      tpu_run_store_f32((char*)aptr(&a->db, b, h, i, k0 + j), a->db.se, a->db.dt, zeros,
                        min64(64, kcur - j));
}

/* Whole (batch, kv head) items: dK and dV over all of the group's heads and
 * blocks, and each head's dQ, in one pass over the blocks. */
static void bwd_whole(void* ctx, int64_t begin, int64_t end) {
  attn_t* a = ctx;
  const int64_t tkp = a->nkb * a->bk;
  bwd_buf_t w;
  float* buf = bwd_buf_alloc(a, &w, a->tqp * a->ep, tkp * (a->ep + a->evp));
  if (!buf) {
    a->oom = 1;
    return;
  }
  float *dQ = w.acc, *dK = w.acc2, *dV = dK + tkp * a->ep;
  for (int64_t it; (it = atomic_fetch_add(&a->next, 1)) < a->B * a->Hk;) {
    const int64_t b = it / a->Hk, hk = it % a->Hk;
    memset(dK, 0, sizeof(float) * (size_t)(tkp * (a->ep + a->evp)));
    for (int64_t gi = 0; gi < a->g; gi++) {
      const int64_t h = hk * a->g + gi;
      memset(dQ, 0, sizeof(float) * (size_t)(a->tqp * a->ep));
      for (int64_t k0 = 0; k0 < a->Tk; k0 += a->bk) {
        const int64_t kcur = min64(a->bk, a->Tk - k0);
        if (a->want_db) zero_db(a, b, h, k0, kcur);
        for (int64_t q0 = first_q(a, k0); q0 < a->Tq; q0 += a->bq) {
          const int64_t qcur = min64(a->bq, a->Tq - q0);
          bwd_block(a, &w, b, h, q0, qcur, k0, kcur, false);
          bwd_dkdv(a, &w, b, h, q0, qcur, k0, kcur, dK + k0 * a->ep, dV + k0 * a->evp);
          bwd_dq(a, &w, b, h, q0, qcur, k0, kcur, dQ + q0 * a->ep);
        }
      }
      store_rows(a, &a->dq, b, h, 0, a->Tq, dQ, a->ep, a->E, a->scale);
    }
    store_rows(a, &a->dk, b, hk, 0, a->Tk, dK, a->ep, a->E, a->scale);
    store_rows(a, &a->dv, b, hk, 0, a->Tk, dV, a->evp, a->Ev, 1.0f);
  }
  free(buf);
}

/* Split items for few (batch, kv head) pairs: first (batch, kv head, key
 * block) items make dK and dV, then (batch, head, query block) items make
 * dQ, recomputing the blocks. Every sum runs in bwd_whole's order, so both
 * ways give the same bits. */
static void bwd_split(void* ctx, int64_t begin, int64_t end) {
  attn_t* a = ctx;
  const int64_t nk = a->B * a->Hk * a->nkb;
  bwd_buf_t w;
  float* buf = bwd_buf_alloc(a, &w, a->bk * (a->ep + a->evp), a->bq * a->ep);
  if (!buf) {
    a->oom = 1;
    return;
  }
  for (int64_t it; (it = atomic_fetch_add(&a->next, 1)) < nk + a->B * a->H * a->nqb;) {
    if (it < nk) {
      const int64_t bkv = it / a->nkb, b = bkv / a->Hk, hk = bkv % a->Hk;
      const int64_t k0 = it % a->nkb * a->bk, kcur = min64(a->bk, a->Tk - k0);
      float *dK = w.acc, *dV = dK + a->bk * a->ep;
      memset(dK, 0, sizeof(float) * (size_t)(a->bk * (a->ep + a->evp)));
      for (int64_t gi = 0; gi < a->g; gi++) {
        if (a->want_db) zero_db(a, b, hk * a->g + gi, k0, kcur);
        for (int64_t q0 = first_q(a, k0); q0 < a->Tq; q0 += a->bq) {
          const int64_t qcur = min64(a->bq, a->Tq - q0);
          bwd_block(a, &w, b, hk * a->g + gi, q0, qcur, k0, kcur, false);
          bwd_dkdv(a, &w, b, hk * a->g + gi, q0, qcur, k0, kcur, dK, dV);
        }
      }
      store_rows(a, &a->dk, b, hk, k0, kcur, dK, a->ep, a->E, a->scale);
      store_rows(a, &a->dv, b, hk, k0, kcur, dV, a->evp, a->Ev, 1.0f);
    } else {
      const int64_t t = it - nk, bh = t / a->nqb, b = bh / a->H, h = bh % a->H;
      const int64_t q0 = t % a->nqb * a->bq, qcur = min64(a->bq, a->Tq - q0);
      float* dQ = w.acc2;
      memset(dQ, 0, sizeof(float) * (size_t)(a->bq * a->ep));
      for (int64_t k0 = 0; k0 < a->Tk; k0 += a->bk) {
        if (first_q(a, k0) > q0) break;
        const int64_t kcur = min64(a->bk, a->Tk - k0);
        bwd_block(a, &w, b, h, q0, qcur, k0, kcur, false);
        bwd_dq(a, &w, b, h, q0, qcur, k0, kcur, dQ);
      }
      store_rows(a, &a->dq, b, h, q0, qcur, dQ, a->ep, a->E, a->scale);
    }
  }
  free(buf);
}

/* _scaled_dot_product_fused_attention_overrideable_backward(grad_out, query,
 * key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q,
 * cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset,
 * *, scale?) -> outputs (grad_query, grad_key, grad_value[, grad_bias]); the
 * bridge sets rng_seed / rng_offset to the forward's. A fourth output, float
 * (B, H, Tq, Tk) (B = 1 for 3-d inputs), gets dS, the gradient of an additive
 * attn_mask before its broadcast is summed away (by the bridge). With at least as many (batch, kv
 * head) pairs as threads each pair is one item (bwd_whole); with fewer the
 * work splits by key blocks, then by query blocks (bwd_split), which
 * recomputes the blocks once more for dQ and gives the same results;
 * TORCH_TPU_SDPA_BWD_SPLIT=1 forces the split (tests). */
tpu_status_t tpu_k_sdpa_bwd(const tpu_call_t* c) {
  static const char* op = "scaled_dot_product_attention backward";
  attn_t a;
  TPU_CHECK_ARG(c->nouts >= 3, "%s: expected three gradients", op);
  const tpu_tensor_t* gout = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* out = tpu_arg_tensor(c, 6);
  const tpu_tensor_t* lse = tpu_arg_tensor(c, 7);
  TPU_CHECK_ARG(gout && out && lse, "%s: grad_out, out and logsumexp must be tensors", op);
  TPU_RETURN_IF_ERROR(attn_init(&a, op, tpu_arg_tensor(c, 1), tpu_arg_tensor(c, 2),
                                tpu_arg_tensor(c, 3), tpu_arg_tensor(c, 4), tpu_arg_f64(c, 16, 0),
                                !tpu_arg_is_none(c, 16), tpu_arg_bool(c, 13, false),
                                tpu_arg_f64(c, 12, 0.0), c->precision));
  a.seed = c->rng_seed;
  a.offset = c->rng_offset;
  aview_of(&a.dout, gout);
  aview_of(&a.o, out);
  lse_view(&a, lse);
  aview_of(&a.dq, &c->outs[0]);
  aview_of(&a.dk, &c->outs[1]);
  aview_of(&a.dv, &c->outs[2]);
  if (c->nouts >= 4) {
    const tpu_tensor_t* db = &c->outs[3];
    TPU_CHECK_ARG(a.mask_kind == MASK_ADD, "%s: a mask gradient needs an additive attn_mask", op);
    TPU_CHECK_ARG(db->ndim == 4 && db->sizes[0] == a.B && db->sizes[1] == a.H &&
                      db->sizes[2] == a.Tq && db->sizes[3] == a.Tk,
                  "%s: the mask gradient must be (%lld, %lld, %lld, %lld)", op, (long long)a.B,
                  (long long)a.H, (long long)a.Tq, (long long)a.Tk);
    aview_of(&a.db, db);
    a.want_db = true;
  }
  if (a.B * a.Hk == 0) return TPU_OK;
  const int nr = a.uk->nr, npd = a.pd.np, npx = a.px.np;
  const int64_t E = a.E, Ev = a.Ev, Tq = a.Tq, Tk = a.Tk;
  a.ep = rup(E, nr);
  a.evp = rup(Ev, nr);
  a.tqp = a.nqb * a.bq;
  a.n_kS = rup(Tk, nr) * E * npd;
  a.n_vP = rup(Tk, nr) * Ev * npd;
  a.n_kQ = a.ep * Tk * npx;
  a.n_qA = a.tqp * E * npd;
  a.n_doA = a.tqp * Ev * npd;
  a.n_qB = a.ep * Tq * npx;
  a.n_doB = a.evp * Tq * npx;
  const int64_t nkv = a.B * a.Hk, nqh = a.B * a.H;
  const size_t floats = (size_t)(nkv * (a.n_kS + a.n_vP + a.n_kQ) +
                                 nqh * (a.n_qA + a.n_doA + a.n_qB + a.n_doB + 2 * a.tqp)) + 16;
  float* packs = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
  if (!packs)
    return TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory for %zu bytes of packed operands",
                   op, floats * sizeof(float));
  a.kS = packs;
  a.vP = a.kS + nkv * a.n_kS;
  a.kQ = a.vP + nkv * a.n_vP;
  a.qA = a.kQ + nkv * a.n_kQ;
  a.doA = a.qA + nqh * a.n_qA;
  a.qB = a.doA + nqh * a.n_doA;
  a.doB = a.qB + nqh * a.n_qB;
  a.Dr = a.doB + nqh * a.n_doB;
  a.L = a.Dr + nqh * a.tqp;
  const int nth = tpu_num_threads();
  atomic_store(&a.next, 0);
  if (nth > 1) tpu_parallel_for(nth, 1, bwd_pack, &a);
  else bwd_pack(&a, 0, 1);
  if (a.o.dt != TPU_F32) {
    atomic_store(&a.next, 0);
    if (nth > 1) tpu_parallel_for(nth, 1, bwd_rowsum, &a);
    else bwd_rowsum(&a, 0, 1);
  }
  const char* env = tpu_env_str("TORCH_TPU_SDPA_BWD_SPLIT");
  const bool split = (env && env[0] == '1') || nkv < nth;
  atomic_store(&a.next, 0);
  if (nth > 1) tpu_parallel_for(nth, 1, split ? bwd_split : bwd_whole, &a);
  else if (split) bwd_split(&a, 0, 1);
  else bwd_whole(&a, 0, 1);
  free(packs);
  if (a.oom) return TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory for scratch", op);
  return TPU_OK;
}
