/* Element-wise iteration engine: broadcasting, dimension coalescing, chunked
 * conversion to a compute type, and the thread split. */
#include <stdlib.h>

#include "kernels.h"
#include "tpu/float8.h"
#include "vecmath.h"

void tpu_tensor_make_contig(tpu_tensor_t* t, void* data, tpu_dtype_t dt, int ndim,
                            const int64_t* sizes) {
  memset(t, 0, offsetof(tpu_tensor_t, inline_value));
  t->data = data;
  t->dtype = dt;
  t->ndim = ndim;
  int64_t st = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    t->sizes[d] = sizes[d];
    t->strides[d] = st;
    st *= sizes[d] > 1 ? sizes[d] : 1;
  }
}

tpu_ctype_t tpu_ctype_of(tpu_dtype_t dt) {
  if (dt == TPU_F64) return TPU_CT_F64;
  if (tpu_dtype_is_float(dt)) return TPU_CT_F32;
  return TPU_CT_I64;
}

size_t tpu_ctype_size(tpu_ctype_t ct) { return ct == TPU_CT_F32 ? 4 : 8; }

static bool ctype_is_native(tpu_ctype_t ct, tpu_dtype_t dt) {
  return (ct == TPU_CT_F32 && dt == TPU_F32) || (ct == TPU_CT_F64 && dt == TPU_F64) ||
         (ct == TPU_CT_I64 && dt == TPU_I64);
}

/* ---- run conversions ---- */
#define CONV_ID(x) (x)
#define CONV_BOOL(x) ((x) ? 1 : 0)
#define LOAD_CASES(CT)                                                            \
  switch (dt) {                                                                   \
    case TPU_U8: LOAD_RUN(CT, uint8_t, CONV_ID); break;                           \
    case TPU_I8: LOAD_RUN(CT, int8_t, CONV_ID); break;                            \
    case TPU_I16: LOAD_RUN(CT, int16_t, CONV_ID); break;                          \
    case TPU_I32: LOAD_RUN(CT, int32_t, CONV_ID); break;                          \
    case TPU_I64: LOAD_RUN(CT, int64_t, CONV_ID); break;                          \
    case TPU_U16: LOAD_RUN(CT, uint16_t, CONV_ID); break;                         \
    case TPU_U32: LOAD_RUN(CT, uint32_t, CONV_ID); break;                         \
    case TPU_U64: LOAD_RUN(CT, uint64_t, CONV_ID); break; /* int64: its bits */   \
    case TPU_F16: LOAD_RUN(CT, uint16_t, tpu_vm_f16_to_f32); break;                  \
    case TPU_BF16: LOAD_RUN(CT, uint16_t, tpu_vm_bf16_to_f32); break;                \
    case TPU_F32: LOAD_RUN(CT, float, CONV_ID); break;                            \
    case TPU_F64: LOAD_RUN(CT, double, CONV_ID); break;                           \
    case TPU_BOOL: LOAD_RUN(CT, uint8_t, CONV_BOOL); break;                       \
    case TPU_F8E5M2: LOAD_RUN(CT, uint8_t, tpu_f8e5m2_to_f32); break;             \
    case TPU_F8E4M3FN: LOAD_RUN(CT, uint8_t, tpu_f8e4m3fn_to_f32); break;         \
    case TPU_F8E5M2FNUZ: LOAD_RUN(CT, uint8_t, tpu_f8e5m2fnuz_to_f32); break;     \
    case TPU_F8E4M3FNUZ: LOAD_RUN(CT, uint8_t, tpu_f8e4m3fnuz_to_f32); break;     \
    case TPU_F8E8M0FNU: LOAD_RUN(CT, uint8_t, tpu_f8e8m0fnu_to_f32); break;       \
    case TPU_F4E2M1FNX2: LOAD_RUN(CT, uint8_t, CONV_ID); break; /* the byte */    \
    default: break;                                                               \
  }
#define LOAD_RUN(CT, T, CONV)                                               \
  do {                                                                      \
    CT* o = (CT*)buf;                                                       \
    if (stride == (int64_t)sizeof(T)) {                                     \
      const T* s = (const T*)src;                                           \
      for (int64_t i = 0; i < n; i++) o[i] = (CT)CONV(s[i]);                \
    } else if (stride == 0) {                                               \
      CT v = (CT)CONV(*(const T*)src);                                      \
      for (int64_t i = 0; i < n; i++) o[i] = v;                             \
    } else {                                                                \
      for (int64_t i = 0; i < n; i++) o[i] = (CT)CONV(*(const T*)(src + i * stride)); \
    }                                                                       \
  } while (0)

#define STORE_RUN(CT, T, CONV)                                                  \
  do {                                                                          \
    const CT* v = (const CT*)buf;                                               \
    if (stride == (int64_t)sizeof(T)) {                                         \
      T* d = (T*)dst;                                                           \
      for (int64_t i = 0; i < n; i++) d[i] = CONV(v[i]);                        \
    } else {                                                                    \
      for (int64_t i = 0; i < n; i++) *(T*)(dst + i * stride) = CONV(v[i]);     \
    }                                                                           \
  } while (0)
#define TO_U8(x) ((uint8_t)(int64_t)(x))
#define TO_I8(x) ((int8_t)(int64_t)(x))
#define TO_I16(x) ((int16_t)(int64_t)(x))
/* float -> int32 as x86's cvtt (PyTorch CPU's cast): out of range and NaN
 * give INT32_MIN; integers wrap */
static inline int32_t f64_to_i32_(double v) {
  return v >= -2147483648.0 && v < 2147483648.0 ? (int32_t)v : INT32_MIN;
}
static inline int32_t to_i32_wrap_(int64_t v) { return (int32_t)v; }
#define TO_I32(x) _Generic((x), float: f64_to_i32_, double: f64_to_i32_, default: to_i32_wrap_)(x)
#define TO_I64(x) ((int64_t)(x))
#define TO_F16(x) tpu_vm_f32_to_f16((float)(x))
#define TO_BF16(x) tpu_vm_f32_to_bf16((float)(x))
#define TO_F32(x) ((float)(x))
#define TO_F64(x) ((double)(x))
#define TO_BOOL(x) ((uint8_t)((x) != 0))
#define TO_F8E5M2(x) tpu_f32_to_f8e5m2((float)(x))
#define TO_F8E4M3FN(x) tpu_f32_to_f8e4m3fn((float)(x))
#define TO_F8E5M2FNUZ(x) tpu_f32_to_f8e5m2fnuz((float)(x))
#define TO_F8E4M3FNUZ(x) tpu_f32_to_f8e4m3fnuz((float)(x))
#define TO_F8E8M0FNU(x) tpu_f32_to_f8e8m0fnu((float)(x))
#define TO_U16(x) ((uint16_t)(int64_t)(x))
#define TO_U32(x) ((uint32_t)(int64_t)(x))
#define TO_U64(x) ((uint64_t)(x))
#define STORE_CASES(CT)                                       \
  switch (dt) {                                               \
    case TPU_U8: STORE_RUN(CT, uint8_t, TO_U8); break;        \
    case TPU_I8: STORE_RUN(CT, int8_t, TO_I8); break;         \
    case TPU_I16: STORE_RUN(CT, int16_t, TO_I16); break;      \
    case TPU_I32: STORE_RUN(CT, int32_t, TO_I32); break;      \
    case TPU_I64: STORE_RUN(CT, int64_t, TO_I64); break;      \
    case TPU_U16: STORE_RUN(CT, uint16_t, TO_U16); break;     \
    case TPU_U32: STORE_RUN(CT, uint32_t, TO_U32); break;     \
    case TPU_U64: STORE_RUN(CT, uint64_t, TO_U64); break;     \
    case TPU_F16: STORE_RUN(CT, uint16_t, TO_F16); break;     \
    case TPU_BF16: STORE_RUN(CT, uint16_t, TO_BF16); break;   \
    case TPU_F32: STORE_RUN(CT, float, TO_F32); break;        \
    case TPU_F64: STORE_RUN(CT, double, TO_F64); break;       \
    case TPU_BOOL: STORE_RUN(CT, uint8_t, TO_BOOL); break;    \
    case TPU_F8E5M2: STORE_RUN(CT, uint8_t, TO_F8E5M2); break;   \
    case TPU_F8E4M3FN: STORE_RUN(CT, uint8_t, TO_F8E4M3FN); break; \
    case TPU_F8E5M2FNUZ: STORE_RUN(CT, uint8_t, TO_F8E5M2FNUZ); break; \
    case TPU_F8E4M3FNUZ: STORE_RUN(CT, uint8_t, TO_F8E4M3FNUZ); break; \
    case TPU_F8E8M0FNU: STORE_RUN(CT, uint8_t, TO_F8E8M0FNU); break; \
    case TPU_F4E2M1FNX2: STORE_RUN(CT, uint8_t, TO_U8); break; \
    default: break;                                           \
  }

/* load_run: n elements of dtype dt at src (byte stride) -> buf in ct;
 * store_run: the reverse. One copy per ISA. */
#define DEFINE_RUNS(SUF, ATTR)                                                          \
  ATTR static void load_run_##SUF(tpu_ctype_t ct, void* buf, const char* src,          \
                                  int64_t stride, tpu_dtype_t dt, int64_t n) {         \
    if (ct == TPU_CT_F32) {                                                             \
      LOAD_CASES(float)                                                                 \
    } else if (ct == TPU_CT_F64) {                                                      \
      LOAD_CASES(double)                                                                \
    } else {                                                                            \
      LOAD_CASES(int64_t)                                                               \
    }                                                                                   \
  }                                                                                     \
  ATTR static void store_run_##SUF(tpu_ctype_t ct, const void* buf, char* dst,         \
                                   int64_t stride, tpu_dtype_t dt, int64_t n) {        \
    if (ct == TPU_CT_F32) {                                                             \
      STORE_CASES(float)                                                                \
    } else if (ct == TPU_CT_F64) {                                                      \
      STORE_CASES(double)                                                               \
    } else {                                                                            \
      STORE_CASES(int64_t)                                                              \
    }                                                                                   \
  }
DEFINE_RUNS(p, TPU_VEC_PORTABLE)
#ifdef TPU_HAVE_AVX2_BUILD
DEFINE_RUNS(a, TPU_VEC_AVX2)
#endif

static void load_run(tpu_ctype_t ct, void* buf, const char* src, int64_t stride,
                     tpu_dtype_t dt, int64_t n) {
#ifdef TPU_HAVE_AVX2_BUILD
  if (tpu_host_isa() == TPU_ISA_AVX2) {
    if (ct == TPU_CT_F32 && dt == TPU_BF16 && stride == 2) {
      tpu_vm_bf16_row_load_avx2(buf, (const uint16_t*)src, n);
      return;
    }
    load_run_a(ct, buf, src, stride, dt, n);
    return;
  }
#endif
  load_run_p(ct, buf, src, stride, dt, n);
}

static void store_run(tpu_ctype_t ct, const void* buf, char* dst, int64_t stride,
                      tpu_dtype_t dt, int64_t n) {
#ifdef TPU_HAVE_AVX2_BUILD
  if (tpu_host_isa() == TPU_ISA_AVX2) {
    if (ct == TPU_CT_F32 && dt == TPU_BF16 && stride == 2) { /* pack, not per element */
      tpu_vm_bf16_row_store_avx2((uint16_t*)dst, buf, n);
      return;
    }
    store_run_a(ct, buf, dst, stride, dt, n);
    return;
  }
#endif
  store_run_p(ct, buf, dst, stride, dt, n);
}

/* ---- the iterator ---- */
typedef struct {
  int ndim;
  int nops; /* 0 = output */
  int64_t shape[TPU_MAX_DIMS];
  int64_t strides[TPU_ITER_MAX_OPS][TPU_MAX_DIMS]; /* bytes */
  char* data[TPU_ITER_MAX_OPS];
  tpu_dtype_t dtype[TPU_ITER_MAX_OPS];
  tpu_ctype_t ct;
  tpu_loop_fn_t body;
  tpu_loop_fn_t body16; /* bf16 storage body, or NULL (see tpu_loop_set_t) */
  void* ctx;
} iter_t;

static tpu_status_t iter_build(iter_t* it, const tpu_tensor_t* out, const tpu_tensor_t* const* in,
                               int nin) {
  if (nin + 1 > TPU_ITER_MAX_OPS)
    return TPU_ERR(INTERNAL, "element-wise op with %d inputs exceeds %d", nin,
                   TPU_ITER_MAX_OPS - 1);
  int nd = out->ndim;
  it->nops = nin + 1;
  const tpu_tensor_t* ops[TPU_ITER_MAX_OPS];
  ops[0] = out;
  for (int k = 0; k < nin; k++) ops[k + 1] = in[k];
  for (int k = 0; k < it->nops; k++) {
    const tpu_tensor_t* t = ops[k];
    if (!tpu_dtype_is_supported(t->dtype))
      return TPU_ERR(UNIMPLEMENTED, "dtype %d is not supported on tpu", (int)t->dtype);
    if (t->ndim > nd)
      return TPU_ERR(INVALID_ARGUMENT,
                     "operand %d with %d dims cannot broadcast to the output's %d dims", k,
                     t->ndim, nd);
    int64_t isz = (int64_t)tpu_dtype_size(t->dtype);
    for (int d = 0; d < nd; d++) {
      int td = d - (nd - t->ndim);
      int64_t st = 0;
      if (td >= 0) {
        int64_t sz = t->sizes[td];
        if (sz == out->sizes[d]) st = t->strides[td] * isz;
        else if (sz != 1)
          return TPU_ERR(INVALID_ARGUMENT,
                         "the size of operand %d (%lld) must match the output's size (%lld) "
                         "at dimension %d",
                         k, (long long)sz, (long long)out->sizes[d], d);
      }
      it->strides[k][d] = out->sizes[d] == 1 ? 0 : st;
    }
    it->data[k] = t->data;
    it->dtype[k] = t->dtype;
  }
  /* drop size-1 dims, then merge mergeable neighbours */
  int m = 0;
  for (int d = 0; d < nd; d++) {
    if (out->sizes[d] == 1) continue;
    it->shape[m] = out->sizes[d];
    for (int k = 0; k < it->nops; k++) it->strides[k][m] = it->strides[k][d];
    m++;
  }
  int c = 0;
  for (int d = 0; d < m; d++) {
    if (c > 0) {
      bool ok = true;
      for (int k = 0; k < it->nops; k++)
        if (it->strides[k][c - 1] != it->strides[k][d] * it->shape[d]) ok = false;
      if (ok) {
        it->shape[c - 1] *= it->shape[d];
        for (int k = 0; k < it->nops; k++) it->strides[k][c - 1] = it->strides[k][d];
        continue;
      }
    }
    it->shape[c] = it->shape[d];
    for (int k = 0; k < it->nops; k++) it->strides[k][c] = it->strides[k][d];
    c++;
  }
  if (c == 0) { /* scalar output */
    it->shape[0] = 1;
    for (int k = 0; k < it->nops; k++) it->strides[k][0] = 0;
    c = 1;
  }
  it->ndim = c;
  return TPU_OK;
}

/* Elements per chunk of buffered operands: long enough to amortize the
 * per-chunk setup, short enough that the buffers stay in L1/L2 cache. */
#define ITER_CHUNK 2048

/* Whether operand k is used in place: its dtype is the compute type and
 * its innermost stride is one element. */
static bool iter_direct(const iter_t* it, int k) {
  return ctype_is_native(it->ct, it->dtype[k]) &&
         it->strides[k][it->ndim - 1] == (int64_t)tpu_ctype_size(it->ct);
}

/* Runs elements [begin, end) (row-major over the coalesced shape). A run
 * of the innermost dim is handed to the body whole when every operand is
 * used in place, else in chunks of ITER_CHUNK through conversion buffers.
 * A NULL body is a converting copy of the one input: it skips the
 * intermediate buffer where a side is used in place. */
static void iter_range(void* arg, int64_t begin, int64_t end) {
  const iter_t* it = arg;
  int nd = it->ndim, nops = it->nops;
  size_t csz = tpu_ctype_size(it->ct);
  _Alignas(64) unsigned char bufs[TPU_ITER_MAX_OPS][ITER_CHUNK * 8];
  bool direct[TPU_ITER_MAX_OPS], chunked = false;
  tpu_loop_fn_t body = it->body;
  bool h16 = it->body16 != NULL; /* every operand bf16 with unit inner stride */
  for (int k = 0; k < nops; k++)
    h16 &= it->dtype[k] == TPU_BF16 && it->strides[k][nd - 1] == 2;
  for (int k = 0; k < nops; k++) {
    direct[k] = h16 || iter_direct(it, k);
    chunked |= !direct[k];
  }
  if (h16) body = it->body16;
  int64_t idx[TPU_MAX_DIMS];
  int64_t rem = begin;
  for (int d = nd - 1; d >= 0; d--) {
    idx[d] = rem % it->shape[d];
    rem /= it->shape[d];
  }
  int64_t inner = it->shape[nd - 1];
  int64_t ost = it->strides[0][nd - 1];
  int64_t pos = begin;
  while (pos < end) {
    char* base[TPU_ITER_MAX_OPS];
    for (int k = 0; k < nops; k++) {
      int64_t off = 0;
      for (int d = 0; d < nd; d++) off += idx[d] * it->strides[k][d];
      base[k] = it->data[k] + off;
    }
    int64_t n = inner - idx[nd - 1];
    if (n > end - pos) n = end - pos;
    if (chunked && n > ITER_CHUNK) n = ITER_CHUNK;
    void* o = direct[0] ? (void*)base[0] : (void*)bufs[0];
    if (body) {
      const void* in[TPU_ITER_MAX_OPS];
      for (int k = 1; k < nops; k++) {
        if (direct[k]) {
          in[k - 1] = base[k];
        } else {
          load_run(it->ct, bufs[k], base[k], it->strides[k][nd - 1], it->dtype[k], n);
          in[k - 1] = bufs[k];
        }
      }
      body(it->ctx, n, o, in);
    } else if (direct[1]) {
      o = base[1];
      if (direct[0] && base[0] != base[1]) memmove(base[0], base[1], (size_t)n * csz);
    } else {
      load_run(it->ct, o, base[1], it->strides[1][nd - 1], it->dtype[1], n);
    }
    if (!direct[0]) store_run(it->ct, o, base[0], ost, it->dtype[0], n);
    pos += n;
    idx[nd - 1] += n;
    for (int d = nd - 1; d > 0 && idx[d] >= it->shape[d]; d--) {
      idx[d] = 0;
      idx[d - 1]++;
    }
  }
}

/* tpu_elementwise, also for a NULL body (see iter_range) */
static tpu_status_t iter_run(const tpu_tensor_t* out, const tpu_tensor_t* const* in, int nin,
                             tpu_ctype_t ct, tpu_loop_fn_t body, tpu_loop_fn_t body16,
                             void* ctx) {
  iter_t it;
  TPU_RETURN_IF_ERROR(iter_build(&it, out, in, nin));
  int64_t numel = tpu_tensor_numel(out);
  if (numel == 0) return TPU_OK;
  it.ct = ct;
  it.body = body;
  it.body16 = ct == TPU_CT_F32 ? body16 : NULL;
  it.ctx = ctx;
  tpu_parallel_for(numel, 32768, iter_range, &it);
  return TPU_OK;
}

tpu_status_t tpu_elementwise(const tpu_tensor_t* out, const tpu_tensor_t* const* in, int nin,
                             tpu_ctype_t ct, tpu_loop_fn_t body, void* ctx) {
  return iter_run(out, in, nin, ct, body, NULL, ctx);
}

tpu_status_t tpu_elementwise_set(const char* op, const tpu_tensor_t* out,
                                 const tpu_tensor_t* const* in, int nin, tpu_ctype_t ct,
                                 const tpu_loop_set_t* loops, void* ctx) {
  tpu_loop_fn_t fn = ct == TPU_CT_F32 ? loops->f32 : ct == TPU_CT_F64 ? loops->f64 : loops->i64;
  if (!fn) {
    const char* what = ct == TPU_CT_I64 ? "integer or bool" : "floating";
    return TPU_ERR(UNIMPLEMENTED, "%s: not implemented for %s tensors (output dtype %s)", op,
                   what, tpu_dtype_name(out->dtype));
  }
  return iter_run(out, in, nin, ct, fn, ct == TPU_CT_F32 ? loops->bf16 : NULL, ctx);
}

/* ---- copies ---- */

/* A large byte copy split between threads in 64-byte aligned pieces. The
 * ranges must not overlap (else one memmove on the calling thread). */
typedef struct {
  char* dst;
  const char* src;
  size_t bytes;
} bytes_copy_t;

#define COPY_PIECE 4096 /* bytes per parallel unit */

static void bytes_copy_range(void* arg, int64_t b, int64_t e) {
  const bytes_copy_t* c = arg;
  size_t lo = (size_t)b * COPY_PIECE, hi = (size_t)e * COPY_PIECE;
  if (hi > c->bytes) hi = c->bytes;
  memcpy(c->dst + lo, c->src + lo, hi - lo);
}

static void copy_bytes(void* dst, const void* src, size_t bytes) {
  const char *d = dst, *s = src;
  bool overlap = d < s + bytes && s < d + bytes;
  if (overlap || bytes < (size_t)8 * 32768) {
    memmove(dst, src, bytes);
    return;
  }
  bytes_copy_t c = {dst, src, bytes};
  int64_t pieces = (int64_t)((bytes + COPY_PIECE - 1) / COPY_PIECE);
  tpu_parallel_for(pieces, 32, bytes_copy_range, &c);
}

tpu_status_t tpu_copy_strided(const tpu_tensor_t* dst, const tpu_tensor_t* src) {
  if (tpu_dtype_is_complex(dst->dtype) || tpu_dtype_is_complex(src->dtype))
    return tpu_complex_copy(dst, src);
  tpu_ctype_t ct;
  if (dst->dtype == TPU_F64 || src->dtype == TPU_F64) ct = TPU_CT_F64;
  else if (tpu_dtype_is_float(dst->dtype) || tpu_dtype_is_float(src->dtype)) ct = TPU_CT_F32;
  else ct = TPU_CT_I64;
  if (dst->dtype == src->dtype && tpu_tensor_is_contiguous(dst) && tpu_tensor_is_contiguous(src) &&
      tpu_tensor_numel(dst) == tpu_tensor_numel(src)) {
    size_t bytes = (size_t)tpu_tensor_numel(dst) * tpu_dtype_size(dst->dtype);
    if (bytes && dst->data != src->data) copy_bytes(dst->data, src->data, bytes);
    return TPU_OK;
  }
  if (dst->dtype == src->dtype && tpu_dtype_is_narrow(dst->dtype)) {
    /* narrow floats move as bytes: through float32, NaN payloads would change */
    tpu_tensor_t d = *dst, s = *src;
    d.dtype = s.dtype = TPU_U8;
    const tpu_tensor_t* in[1] = {&s};
    return iter_run(&d, in, 1, TPU_CT_I64, NULL, NULL, NULL);
  }
  /* bf16/f16 same-dtype copies go through float exactly (both directions are lossless) */
  const tpu_tensor_t* in[1] = {src};
  return iter_run(dst, in, 1, ct, NULL, NULL, NULL);
}

void* tpu_stage_f64(const tpu_tensor_t* t, bool as_int) {
  int64_t n = tpu_tensor_numel(t);
  void* buf = malloc((size_t)(n > 0 ? n : 1) * 8);
  if (!buf || n == 0) return buf;
  tpu_tensor_t dst;
  tpu_tensor_make_contig(&dst, buf, as_int ? TPU_I64 : TPU_F64, t->ndim, t->sizes);
  tpu_status_t st = tpu_copy_strided(&dst, t);
  if (st) {
    tpu_status_free(st);
    free(buf);
    return NULL;
  }
  return buf;
}

tpu_status_t tpu_unstage_f64(const tpu_tensor_t* out, const double* v) {
  if (tpu_tensor_numel(out) == 0) return TPU_OK;
  tpu_tensor_t src;
  tpu_tensor_make_contig(&src, (void*)v, TPU_F64, out->ndim, out->sizes);
  return tpu_copy_strided(out, &src);
}
