/* Convolution kernels: `convolution` and `convolution_backward` for 1 to 3
 * spatial dims, with stride, padding, dilation, groups, bias, and
 * transposed convolution with output_padding. Every product goes through
 * the shared GEMM (matmul.h) on im2col / col2im buffers.
 *
 * Roles. A convolution relates an image tensor (N, C, img...) and a matrix
 * tensor (N, G*R, col...) through the weight viewed as G matrices W_g of
 * R x S, S = C/G * prod(kernel); im2col(img) has one row per (channel,
 * kernel offset) and one column per col position:
 *   conv_fwd:   mat = W @ im2col(img) (+ bias)
 *   conv_data:  img = col2im(W^T @ mat) (+ bias)
 *   conv_wgrad: dW  = sum over the batch of mat @ im2col(img)^T
 * A plain convolution has img = input and mat = output, a transposed one
 * img = output and mat = input. So the plain forward is conv_fwd and the
 * transposed forward conv_data; grad_input is conv_data (plain) or conv_fwd
 * (transposed), grad_weight is conv_wgrad either way.
 *
 * Operands are staged contiguous in the compute type (float for float32,
 * bfloat16 and float16, double for float64, int64 for integers), so the
 * GEMM accumulates in that type and results round once on store. The batch
 * is processed in chunks whose im2col buffer fits a fixed budget (the
 * chunking depends on shapes only); im2col and col2im run in parallel over
 * rows and planes, the GEMM parallelizes its own tiles. A 1x1 kernel with
 * stride 1 and no padding uses the image itself as the im2col matrix.
 */
#include "matmul.h"
#include "spatial.h"

#define COL_BUDGET ((int64_t)1 << 21) /* im2col elements per chunk: stays in cache */

typedef struct {
  int64_t img[3], col[3], k[3], s[3], p[3], d[3];
  int64_t img_len, col_len, klen;
  int64_t n, c;    /* batch, image channels */
  int64_t g, r, sl; /* groups; each group's weight matrix is r x sl */
  bool direct;     /* the im2col matrix is the image itself */
  tpu_dtype_t dt;  /* compute type */
  int64_t esz;
} geo_t;

/* ---- argument checks ---- */

/* t as a batched tensor of `ndim` dims: an unbatched one (one dim fewer)
 * gets a leading dim of size 1. */
static tpu_status_t as_batched(const char* op, const char* what, const tpu_tensor_t* t, int ndim,
                               tpu_tensor_t* out) {
  *out = *t;
  if (t->ndim == ndim) return TPU_OK;
  if (t->ndim != ndim - 1)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected %s to have %d or %d dims, got %d", op, what,
                   ndim - 1, ndim, (int)t->ndim);
  out->ndim = ndim;
  for (int d = ndim - 1; d > 0; d--) {
    out->sizes[d] = t->sizes[d - 1];
    out->strides[d] = t->strides[d - 1];
  }
  out->sizes[0] = 1;
  out->strides[0] = 0;
  return TPU_OK;
}

static tpu_status_t check_dtype(const char* op, const char* what, const tpu_tensor_t* t,
                                tpu_dtype_t dt) {
  if (!t) return TPU_ERR(INVALID_ARGUMENT, "%s: %s is missing", op, what);
  if (t->dtype != dt)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected %s of dtype %s, got %s", op, what,
                   tpu_dtype_name(dt), tpu_dtype_name(t->dtype));
  return TPU_OK;
}

/* Input and weight present, of one dtype. */
static tpu_status_t check_pair(const char* op, const tpu_tensor_t* x, const tpu_tensor_t* w) {
  if (!x || !w) return TPU_ERR(INVALID_ARGUMENT, "%s: missing input or weight", op);
  return check_dtype(op, "weight", w, x->dtype);
}

/* Fills g from the image / matrix tensors (batched) and the weight. The
 * int lists start at args[base]: stride, padding, dilation, transposed,
 * output_padding, groups (the layout of convolution and its backward). */
static tpu_status_t geo_init(const char* op, const tpu_call_t* call, int base,
                             const tpu_tensor_t* img, const tpu_tensor_t* mat,
                             const tpu_tensor_t* w, geo_t* g) {
  int nsp = w->ndim - 2;
  bool transposed = tpu_arg_bool(call, base + 3, false);
  int64_t groups = tpu_arg_i64(call, base + 5, 1);
  if (nsp < 1 || nsp > 3)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected a weight of 3 to 5 dims, got %d", op,
                   (int)w->ndim);
  if (img->ndim != w->ndim || mat->ndim != w->ndim)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected %d-dim input and output for a %d-dim weight",
                   op, (int)w->ndim, (int)w->ndim);
  if (groups < 1) return TPU_ERR(INVALID_ARGUMENT, "%s: groups must be positive, got %lld", op,
                                 (long long)groups);
  memset(g, 0, sizeof *g);
  int64_t one[3] = {1, 1, 1}, zero[3] = {0, 0, 0}, op_pad[3];
  TPU_RETURN_IF_ERROR(sp_int_list(op, "stride", call, base, nsp, NULL, 1, g->s));
  TPU_RETURN_IF_ERROR(sp_int_list(op, "padding", call, base + 1, nsp, zero, 0, g->p));
  TPU_RETURN_IF_ERROR(sp_int_list(op, "dilation", call, base + 2, nsp, one, 1, g->d));
  TPU_RETURN_IF_ERROR(sp_int_list(op, "output_padding", call, base + 4, nsp, zero, 0, op_pad));
  int64_t lanes;
  sp_split(img, nsp, &lanes, g->img);
  sp_split(mat, nsp, &lanes, g->col);
  sp_split(w, nsp, &lanes, g->k);
  g->n = img->sizes[0];
  g->c = img->sizes[1];
  g->g = groups;
  int64_t mat_c = mat->sizes[1];
  /* plain weight (G*R, C/G, k...), transposed weight (G*R, C/G, k...) with
   * the roles of input and output exchanged: the same matrix view */
  if (mat->sizes[0] != g->n || w->sizes[0] != mat_c || mat_c % groups != 0 ||
      w->sizes[1] * groups != g->c)
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: a %s weight of shape (%lld, %lld, ...) with groups=%lld does not match "
                   "%lld input channels and %lld output channels",
                   op, transposed ? "transposed" : "plain", (long long)w->sizes[0],
                   (long long)w->sizes[1], (long long)groups,
                   (long long)(transposed ? mat_c : g->c), (long long)(transposed ? g->c : mat_c));
  g->r = mat_c / groups;
  g->klen = sp_prod3(g->k);
  g->sl = w->sizes[1] * g->klen;
  g->img_len = sp_prod3(g->img);
  g->col_len = sp_prod3(g->col);
  g->direct = g->klen == 1;
  for (int i = 0; i < 3; i++) {
    if (g->s[i] < 1 || g->d[i] < 1 || g->p[i] < 0 || op_pad[i] < 0)
      return TPU_ERR(INVALID_ARGUMENT,
                     "%s: expected positive stride and dilation and non-negative padding", op);
    int64_t span = g->d[i] * (g->k[i] - 1) + 1;
    bool ok = transposed
                  ? g->img[i] == (g->col[i] - 1) * g->s[i] - 2 * g->p[i] + span + op_pad[i]
                  : g->img[i] + 2 * g->p[i] >= span &&
                        g->col[i] == (g->img[i] + 2 * g->p[i] - span) / g->s[i] + 1;
    if (!ok)
      return TPU_ERR(INVALID_ARGUMENT,
                     "%s: spatial size %lld does not match size %lld for kernel %lld, stride "
                     "%lld, padding %lld, dilation %lld",
                     op, (long long)(transposed ? g->img[i] : g->col[i]),
                     (long long)(transposed ? g->col[i] : g->img[i]), (long long)g->k[i],
                     (long long)g->s[i], (long long)g->p[i], (long long)g->d[i]);
    g->direct = g->direct && g->s[i] == 1 && g->p[i] == 0 && g->img[i] == g->col[i];
  }
  g->dt = sp_compute_dtype(img->dtype);
  g->esz = (int64_t)tpu_dtype_size(g->dt);
  if (img->dtype == TPU_BOOL)
    return TPU_ERR(INVALID_ARGUMENT, "%s: not implemented for 'Bool'", op);
  return TPU_OK;
}

/* ---- im2col / col2im ---- */

/* Range [lo, hi) of output positions o whose input position o * s + off
 * lies in [0, size). */
static void valid_range(int64_t s, int64_t off, int64_t size, int64_t n, int64_t* lo,
                        int64_t* hi) {
  int64_t l = off >= 0 ? 0 : (-off + s - 1) / s;
  int64_t h = size - 1 - off < 0 ? 0 : (size - 1 - off) / s + 1;
  if (l > n) l = n;
  if (h > n) h = n;
  if (h < l) h = l;
  *lo = l;
  *hi = h;
}

/* im2col matrices of samples [n0, n0 + nb): one row per (channel, kernel
 * offset), col_len positions per sample. Element (row, sample b, position
 * l) is at col + row * rs + b * bs + l (in elements). */
typedef struct {
  const geo_t* g;
  char* img; /* staged image, (N, C, img_len) */
  char* col;
  int64_t n0, nb, rs, bs;
  const tpu_tensor_t* bias; /* col2im: optional per-channel bias */
} chunk_t;

/* A chunk buffer of the convolutions: (row, sample * col_len + position). */
static chunk_t conv_chunk(const geo_t* g, char* img, char* col, int64_t n0, int64_t nb,
                          const tpu_tensor_t* bias) {
  if (nb > g->n - n0) nb = g->n - n0;
  return (chunk_t){g, img, col, n0, nb, nb * g->col_len, g->col_len, bias};
}

/* One im2col row run: kernel offset kk of one image plane into dst
 * (col_len elements of esz bytes). */
static void im2col_run(const geo_t* g, const char* plane, int64_t kk, char* dst) {
  const int64_t esz = g->esz;
  int64_t kd = kk / (g->k[1] * g->k[2]), kh = kk / g->k[2] % g->k[1], kw = kk % g->k[2];
  int64_t lo, hi, woff = kw * g->d[2] - g->p[2];
  valid_range(g->s[2], woff, g->img[2], g->col[2], &lo, &hi);
  for (int64_t od = 0; od < g->col[0]; od++) {
    int64_t id = od * g->s[0] - g->p[0] + kd * g->d[0];
    for (int64_t oh = 0; oh < g->col[1]; oh++) {
      int64_t ih = oh * g->s[1] - g->p[1] + kh * g->d[1];
      char* out = dst + (od * g->col[1] + oh) * g->col[2] * esz;
      if (id < 0 || id >= g->img[0] || ih < 0 || ih >= g->img[1] || hi == lo) {
        memset(out, 0, (size_t)(g->col[2] * esz));
        continue;
      }
      const char* src = plane + ((id * g->img[1] + ih) * g->img[2] + lo * g->s[2] + woff) * esz;
      memset(out, 0, (size_t)(lo * esz));
      if (g->s[2] == 1) {
        memcpy(out + lo * esz, src, (size_t)((hi - lo) * esz));
      } else if (esz == 4) {
        uint32_t* o = (uint32_t*)out;
        const uint32_t* s = (const uint32_t*)src;
        for (int64_t i = lo; i < hi; i++) o[i] = s[(i - lo) * g->s[2]];
      } else {
        uint64_t* o = (uint64_t*)out;
        const uint64_t* s = (const uint64_t*)src;
        for (int64_t i = lo; i < hi; i++) o[i] = s[(i - lo) * g->s[2]];
      }
      memset(out + hi * esz, 0, (size_t)((g->col[2] - hi) * esz));
    }
  }
}

/* item = row * nb + sample */
static void im2col_range(void* ctx, int64_t begin, int64_t end) {
  const chunk_t* ch = ctx;
  const geo_t* g = ch->g;
  for (int64_t t = begin; t < end; t++) {
    int64_t row = t / ch->nb, b = t % ch->nb;
    int64_t c = row / g->klen, kk = row % g->klen;
    const char* plane = ch->img + ((ch->n0 + b) * g->c + c) * g->img_len * g->esz;
    char* dst = ch->col + (row * ch->rs + b * ch->bs) * g->esz;
    im2col_run(g, plane, kk, dst);
  }
}

/* col2im of one (sample, channel) plane: the sum of its rows' columns at
 * their image positions, plus the bias. Defined per compute type. */
#define DEFINE_COL2IM(SUF, T, LOAD)                                                        \
  static void col2im_plane_##SUF(const chunk_t* ch, int64_t b, int64_t c) {               \
    const geo_t* g = ch->g;                                                                \
    T* plane = (T*)ch->img + ((ch->n0 + b) * g->c + c) * g->img_len;                      \
    T init = 0;                                                                            \
    if (ch->bias)                                                                          \
      init = (T)LOAD((const char*)ch->bias->data +                                         \
                         c * ch->bias->strides[0] * (int64_t)tpu_dtype_size(ch->bias->dtype), \
                     ch->bias->dtype);                                                     \
    for (int64_t i = 0; i < g->img_len; i++) plane[i] = init;                              \
    for (int64_t kk = 0; kk < g->klen; kk++) {                                             \
      int64_t kd = kk / (g->k[1] * g->k[2]), kh = kk / g->k[2] % g->k[1], kw = kk % g->k[2]; \
      int64_t lo, hi, woff = kw * g->d[2] - g->p[2];                                       \
      valid_range(g->s[2], woff, g->img[2], g->col[2], &lo, &hi);                          \
      const T* src = (const T*)ch->col + (c * g->klen + kk) * ch->rs + b * ch->bs;         \
      for (int64_t od = 0; od < g->col[0]; od++) {                                         \
        int64_t id = od * g->s[0] - g->p[0] + kd * g->d[0];                                \
        if (id < 0 || id >= g->img[0]) continue;                                           \
        for (int64_t oh = 0; oh < g->col[1]; oh++) {                                       \
          int64_t ih = oh * g->s[1] - g->p[1] + kh * g->d[1];                              \
          if (ih < 0 || ih >= g->img[1]) continue;                                         \
          const T* s = src + (od * g->col[1] + oh) * g->col[2];                            \
          T* o = plane + (id * g->img[1] + ih) * g->img[2] + woff;                         \
          if (g->s[2] == 1) /* unit stride vectorizes */                                   \
            for (int64_t i = lo; i < hi; i++) o[i] += s[i];                                  \
          else                                                                               \
            for (int64_t i = lo; i < hi; i++) o[i * g->s[2]] += s[i];                        \
        }                                                                                  \
      }                                                                                    \
    }                                                                                      \
  }
DEFINE_COL2IM(f32, float, tpu_load_f64)
DEFINE_COL2IM(f64, double, tpu_load_f64)
DEFINE_COL2IM(i64, int64_t, tpu_load_i64)

/* item = sample * C + channel */
static void col2im_range(void* ctx, int64_t begin, int64_t end) {
  const chunk_t* ch = ctx;
  const geo_t* g = ch->g;
  for (int64_t t = begin; t < end; t++) {
    int64_t b = t / g->c, c = t % g->c;
    if (g->dt == TPU_F32) col2im_plane_f32(ch, b, c);
    else if (g->dt == TPU_F64) col2im_plane_f64(ch, b, c);
    else col2im_plane_i64(ch, b, c);
  }
}

/* ---- GEMM over (sample, group) ---- */

/* A matrix operand of the per-(sample, group) products: element (r, c) of
 * sample n, group g is at base + n * sn + g * sg + r * sr + c * sc. */
typedef struct {
  char* base;
  tpu_dtype_t dt;
  int64_t sn, sg, sr, sc;
} gop_t;

/* The 3-d view of op batched over groups (sample n) or samples (group g). */
static tpu_tensor_t gop_view(const gop_t* o, bool over_g, int64_t n, int64_t g, int64_t batch,
                             int64_t rows, int64_t cols) {
  int64_t sizes[3] = {batch, rows, cols};
  tpu_tensor_t t;
  tpu_tensor_make_contig(&t, o->base + (n * o->sn + g * o->sg) * (int64_t)tpu_dtype_size(o->dt),
                         o->dt, 3, sizes);
  t.strides[0] = over_g ? o->sg : o->sn;
  t.strides[1] = o->sr;
  t.strides[2] = o->sc;
  return t;
}

/* c(n, g) = a(n, g) @ b(n, g) + beta * self(n, g) for nb samples and G
 * groups, batched along the longer of the two. */
static tpu_status_t conv_gemm(const gop_t* a, const gop_t* b, const gop_t* c, const gop_t* self,
                              double beta, int64_t nb, int64_t groups, int64_t m, int64_t n,
                              int64_t k) {
  bool over_g = groups > nb;
  int64_t outer = over_g ? nb : groups, batch = over_g ? groups : nb;
  for (int64_t o = 0; o < outer; o++) {
    int64_t si = over_g ? o : 0, gi = over_g ? 0 : o;
    tpu_tensor_t ta = gop_view(a, over_g, si, gi, batch, m, k);
    tpu_tensor_t tb = gop_view(b, over_g, si, gi, batch, k, n);
    tpu_tensor_t tc = gop_view(c, over_g, si, gi, batch, m, n);
    tpu_tensor_t ts;
    if (self) ts = gop_view(self, over_g, si, gi, batch, m, n);
    TPU_RETURN_IF_ERROR(tpu_gemm_batched(&ta, &tb, &tc, 1.0, beta, self ? &ts : NULL));
  }
  return TPU_OK;
}

/* Bias as a (group) row operand of r x cols. */
static gop_t bias_gop(const tpu_tensor_t* bias, int64_t rows_per_group) {
  gop_t o = {bias->data, bias->dtype, 0, 0, bias->ndim ? bias->strides[0] : 0, 0};
  o.sg = rows_per_group * o.sr;
  return o;
}

/* The im2col matrix of chunk samples: the image itself, or the buffer. */
static gop_t col_gop(const geo_t* g, const chunk_t* ch) {
  if (g->direct)
    return (gop_t){ch->img + ch->n0 * g->c * g->img_len * g->esz, g->dt, g->c * g->img_len,
                   g->sl * g->img_len, g->img_len, 1};
  return (gop_t){ch->col, g->dt, ch->bs, g->sl * ch->rs, ch->rs, 1};
}

/* The matrix tensor (N, G*R, col_len) of chunk samples. */
static gop_t mat_gop(const geo_t* g, char* mat, int64_t n0) {
  int64_t ch = g->g * g->r;
  return (gop_t){mat + n0 * ch * g->col_len * g->esz, g->dt, ch * g->col_len, g->r * g->col_len,
                 g->col_len, 1};
}

/* Samples per chunk and the chunk buffer (NULL for a direct geometry). */
static tpu_status_t chunk_alloc(const char* op, const geo_t* g, int64_t* nb, char** col) {
  int64_t per = g->c * g->klen * g->col_len;
  int64_t n = per > 0 ? COL_BUDGET / per : g->n;
  if (n > g->n) n = g->n;
  *nb = n > 1 ? n : 1;
  *col = NULL;
  if (g->direct) return TPU_OK;
  *col = sp_alloc(per * *nb, (size_t)g->esz);
  return *col ? TPU_OK : sp_oom(op);
}

/* mat = W @ im2col(img) (+ bias); w is the staged weight (G*R, S). */
static tpu_status_t conv_fwd(const char* op, const geo_t* g, char* img, char* mat, char* w,
                             const tpu_tensor_t* bias) {
  int64_t nb;
  char* col;
  TPU_RETURN_IF_ERROR(chunk_alloc(op, g, &nb, &col));
  gop_t a = {w, g->dt, 0, g->r * g->sl, g->sl, 1};
  gop_t bg = bias ? bias_gop(bias, g->r) : (gop_t){0};
  tpu_status_t st = TPU_OK;
  for (int64_t n0 = 0; !st && n0 < g->n; n0 += nb) {
    chunk_t ch = conv_chunk(g, img, col, n0, nb, NULL);
    if (!g->direct) sp_parallel(g->c * g->klen * ch.nb, g->col_len, im2col_range, &ch);
    gop_t b = col_gop(g, &ch), c = mat_gop(g, mat, n0);
    st = conv_gemm(&a, &b, &c, bias ? &bg : NULL, bias ? 1.0 : 0.0, ch.nb, g->g, g->r,
                   g->col_len, g->sl);
  }
  free(col);
  return st;
}

/* img = col2im(W^T @ mat) (+ bias). */
static tpu_status_t conv_data(const char* op, const geo_t* g, char* mat, char* img, char* w,
                              const tpu_tensor_t* bias) {
  int64_t nb;
  char* col;
  TPU_RETURN_IF_ERROR(chunk_alloc(op, g, &nb, &col));
  gop_t a = {w, g->dt, 0, g->r * g->sl, 1, g->sl}; /* W_g^T: S x R */
  gop_t bg = bias ? bias_gop(bias, g->sl) : (gop_t){0};
  tpu_status_t st = TPU_OK;
  for (int64_t n0 = 0; !st && n0 < g->n; n0 += nb) {
    chunk_t ch = conv_chunk(g, img, col, n0, nb, bias);
    gop_t b = mat_gop(g, mat, n0), c = col_gop(g, &ch);
    bool direct_bias = g->direct && bias;
    st = conv_gemm(&a, &b, &c, direct_bias ? &bg : NULL, direct_bias ? 1.0 : 0.0, ch.nb, g->g,
                   g->sl, g->col_len, g->r);
    if (!st && !g->direct) sp_parallel(ch.nb * g->c, g->klen * g->col_len, col2im_range, &ch);
  }
  free(col);
  return st;
}

/* dw (staged (G*R, S), zeroed) += sum over samples of mat @ im2col(img)^T. */
static tpu_status_t conv_wgrad(const char* op, const geo_t* g, char* mat, char* img, char* dw) {
  int64_t nb;
  char* col;
  TPU_RETURN_IF_ERROR(chunk_alloc(op, g, &nb, &col));
  gop_t c = {dw, g->dt, 0, g->r * g->sl, g->sl, 1};
  tpu_status_t st = TPU_OK;
  for (int64_t n0 = 0; !st && n0 < g->n; n0 += nb) {
    chunk_t ch = conv_chunk(g, img, col, n0, nb, NULL);
    if (!g->direct) sp_parallel(g->c * g->klen * ch.nb, g->col_len, im2col_range, &ch);
    gop_t colg = col_gop(g, &ch);
    /* the sum over samples accumulates in dw: one sample per product */
    for (int64_t b = 0; !st && b < ch.nb; b++) {
      gop_t a = mat_gop(g, mat, n0 + b);
      gop_t bt = {colg.base + b * colg.sn * g->esz, g->dt, 0, colg.sg, colg.sc, colg.sr};
      st = conv_gemm(&a, &bt, &c, &c, 1.0, 1, g->g, g->r, g->sl, g->col_len);
    }
  }
  free(col);
  return st;
}

/* grad_bias[c] = sum of dy (staged (N, C, len)) over samples and positions,
 * accumulated in double. */
typedef struct {
  const char* dy;
  tpu_dtype_t dt;
  int64_t n, c, len;
  double* out;
} bias_job_t;

static void bias_range(void* ctx, int64_t begin, int64_t end) {
  const bias_job_t* job = ctx;
  for (int64_t c = begin; c < end; c++) {
    double acc = 0;
    for (int64_t n = 0; n < job->n; n++) {
      int64_t off = (n * job->c + c) * job->len;
      if (job->dt == TPU_F64) {
        const double* p = (const double*)job->dy + off;
        for (int64_t i = 0; i < job->len; i++) acc += p[i];
      } else {
        const float* p = (const float*)job->dy + off;
        for (int64_t i = 0; i < job->len; i++) acc += p[i];
      }
    }
    job->out[c] = acc;
  }
}

static tpu_status_t grad_bias(const char* op, const tpu_tensor_t* out, const char* dy,
                              tpu_dtype_t dt, int64_t n, int64_t c, int64_t len) {
  if (tpu_tensor_numel(out) != c)
    return TPU_ERR(INVALID_ARGUMENT, "%s: grad_bias must have %lld elements", op, (long long)c);
  double* sums = sp_alloc(c, sizeof(double));
  if (!sums) return sp_oom(op);
  bias_job_t job = {dy, dt, n, c, len, sums};
  sp_parallel(c, n * len, bias_range, &job);
  tpu_tensor_t src;
  int64_t sizes[1] = {c};
  tpu_tensor_make_contig(&src, sums, TPU_F64, 1, sizes);
  tpu_tensor_t dst = *out;
  dst.ndim = 1;
  dst.sizes[0] = c;
  dst.strides[0] = out->ndim ? out->strides[out->ndim - 1] : 1;
  tpu_status_t st = tpu_copy_strided(&dst, &src);
  free(sums);
  return st;
}

/* ---- kernels ---- */

/* convolution / _convolution(input, weight, bias?, stride, padding,
 * dilation, transposed, output_padding, groups, ...) -> out */
tpu_status_t tpu_k_convolution(const tpu_call_t* call) {
  const char* op = "convolution";
  const tpu_tensor_t* w = tpu_arg_tensor(call, 1);
  const tpu_tensor_t* bias = tpu_arg_tensor(call, 2);
  const tpu_tensor_t* x0 = tpu_arg_tensor(call, 0);
  TPU_RETURN_IF_ERROR(check_pair(op, x0, w));
  TPU_RETURN_IF_ERROR(check_dtype(op, "out", &call->outs[0], w->dtype));
  if (bias) TPU_RETURN_IF_ERROR(check_dtype(op, "bias", bias, w->dtype));
  tpu_tensor_t x, y;
  TPU_RETURN_IF_ERROR(as_batched(op, "input", x0, w->ndim, &x));
  TPU_RETURN_IF_ERROR(as_batched(op, "out", &call->outs[0], w->ndim, &y));
  bool transposed = tpu_arg_bool(call, 6, false);
  geo_t g;
  TPU_RETURN_IF_ERROR(
      geo_init(op, call, 3, transposed ? &y : &x, transposed ? &x : &y, w, &g));
  if (bias && tpu_tensor_numel(bias) != y.sizes[1])
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected a bias of %lld elements, got %lld", op,
                   (long long)y.sizes[1], (long long)tpu_tensor_numel(bias));
  sp_stage_t sx, sw, sy;
  TPU_RETURN_IF_ERROR(sp_stage_in(op, &x, g.dt, &sx));
  tpu_status_t st = sp_stage_in(op, w, g.dt, &sw);
  if (st) {
    sp_stage_free(&sx);
    return st;
  }
  st = sp_stage_out(op, &y, g.dt, false, &sy);
  if (!st) {
    st = transposed ? conv_data(op, &g, sx.data, sy.data, sw.data, bias)
                    : conv_fwd(op, &g, sx.data, sy.data, sw.data, bias);
    st = sp_stage_finish(&sy, st);
  }
  sp_stage_free(&sx);
  sp_stage_free(&sw);
  return st;
}

/* convolution_backward(grad_output, input, weight, bias_sizes?, stride,
 * padding, dilation, transposed, output_padding, groups, output_mask) ->
 * (grad_input, grad_weight, grad_bias) */
tpu_status_t tpu_k_convolution_backward(const tpu_call_t* call) {
  const char* op = "convolution_backward";
  const tpu_tensor_t* w = tpu_arg_tensor(call, 2);
  const tpu_tensor_t* dy0 = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* x0 = tpu_arg_tensor(call, 1);
  TPU_RETURN_IF_ERROR(check_pair(op, x0, w));
  TPU_RETURN_IF_ERROR(check_dtype(op, "grad_output", dy0, w->dtype));
  bool want[3];
  for (int k = 0; k < 3; k++) want[k] = sp_out_wanted(call, 10, k);
  if (want[0]) TPU_RETURN_IF_ERROR(check_dtype(op, "grad_input", &call->outs[0], w->dtype));
  if (want[1]) TPU_RETURN_IF_ERROR(check_dtype(op, "grad_weight", &call->outs[1], w->dtype));
  tpu_tensor_t x, dy, dx;
  TPU_RETURN_IF_ERROR(as_batched(op, "input", x0, w->ndim, &x));
  TPU_RETURN_IF_ERROR(as_batched(op, "grad_output", dy0, w->ndim, &dy));
  if (want[0]) {
    TPU_RETURN_IF_ERROR(as_batched(op, "grad_input", &call->outs[0], w->ndim, &dx));
    for (int d = 0; d < x.ndim; d++)
      if (dx.sizes[d] != x.sizes[d])
        return TPU_ERR(INVALID_ARGUMENT, "%s: grad_input must have the input's shape", op);
  }
  bool transposed = tpu_arg_bool(call, 7, false);
  geo_t g;
  TPU_RETURN_IF_ERROR(
      geo_init(op, call, 4, transposed ? &dy : &x, transposed ? &x : &dy, w, &g));
  if (want[1] && tpu_tensor_numel(&call->outs[1]) != tpu_tensor_numel(w))
    return TPU_ERR(INVALID_ARGUMENT, "%s: grad_weight must have the weight's shape", op);
  if (g.dt == TPU_I64)
    return TPU_ERR(INVALID_ARGUMENT, "%s: only floating point dtypes have gradients, got %s", op,
                   tpu_dtype_name(w->dtype));
  sp_stage_t sdy, sx = {0}, sw = {0}, out = {0};
  TPU_RETURN_IF_ERROR(sp_stage_in(op, &dy, g.dt, &sdy));
  tpu_status_t st = TPU_OK;
  if (want[0]) {
    st = sp_stage_in(op, w, g.dt, &sw);
    if (!st) st = sp_stage_out(op, &dx, g.dt, false, &out);
    if (!st) {
      st = transposed ? conv_fwd(op, &g, sdy.data, out.data, sw.data, NULL)
                      : conv_data(op, &g, sdy.data, out.data, sw.data, NULL);
      st = sp_stage_finish(&out, st);
    }
  }
  if (!st && want[1]) {
    st = sp_stage_in(op, &x, g.dt, &sx);
    if (!st) st = sp_stage_out(op, &call->outs[1], g.dt, true, &out);
    if (!st) {
      st = transposed ? conv_wgrad(op, &g, sx.data, sdy.data, out.data)
                      : conv_wgrad(op, &g, sdy.data, sx.data, out.data);
      st = sp_stage_finish(&out, st);
    }
  }
  if (!st && want[2]) {
    int64_t len = transposed ? g.img_len : g.col_len;
    st = grad_bias(op, &call->outs[2], sdy.data, g.dt, dy.sizes[0], dy.sizes[1], len);
  }
  sp_stage_free(&sdy);
  sp_stage_free(&sx);
  sp_stage_free(&sw);
  return st;
}

/* ---- im2col / col2im (F.unfold / F.fold) ---- */

/* Geometry of 2-d im2col: the image (N, C, H, W) and the matrix (N,
 * C * kh * kw, L), L the number of window positions. The int lists start at
 * args[k_arg]: kernel_size, dilation, padding, stride. */
static tpu_status_t geo_unfold(const char* op, const tpu_call_t* call, int k_arg,
                               const tpu_tensor_t* img, const tpu_tensor_t* mat, geo_t* g) {
  memset(g, 0, sizeof *g);
  TPU_RETURN_IF_ERROR(sp_int_list(op, "kernel_size", call, k_arg, 2, NULL, 1, g->k));
  TPU_RETURN_IF_ERROR(sp_int_list(op, "dilation", call, k_arg + 1, 2, NULL, 1, g->d));
  TPU_RETURN_IF_ERROR(sp_int_list(op, "padding", call, k_arg + 2, 2, NULL, 0, g->p));
  TPU_RETURN_IF_ERROR(sp_int_list(op, "stride", call, k_arg + 3, 2, NULL, 1, g->s));
  int64_t lanes;
  sp_split(img, 2, &lanes, g->img);
  g->n = img->sizes[0];
  g->c = img->sizes[1];
  g->col[0] = 1;
  for (int i = 1; i < 3; i++) {
    int64_t span = g->d[i] * (g->k[i] - 1) + 1;
    if (g->k[i] < 1 || g->s[i] < 1 || g->d[i] < 1 || g->p[i] < 0 ||
        g->img[i] + 2 * g->p[i] < span)
      return TPU_ERR(INVALID_ARGUMENT,
                     "%s: kernel %lld with dilation %lld, stride %lld and padding %lld does not "
                     "fit a spatial size of %lld",
                     op, (long long)g->k[i], (long long)g->d[i], (long long)g->s[i],
                     (long long)g->p[i], (long long)g->img[i]);
    g->col[i] = (g->img[i] + 2 * g->p[i] - span) / g->s[i] + 1;
  }
  g->klen = sp_prod3(g->k);
  g->img_len = sp_prod3(g->img);
  g->col_len = sp_prod3(g->col);
  g->g = 1;
  g->dt = sp_compute_dtype(img->dtype);
  g->esz = (int64_t)tpu_dtype_size(g->dt);
  if (mat->ndim != 3 || mat->sizes[0] != g->n || mat->sizes[1] != g->c * g->klen ||
      mat->sizes[2] != g->col_len)
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: expected a matrix of (%lld, %lld, %lld) for an image of %lld channels",
                   op, (long long)g->n, (long long)(g->c * g->klen), (long long)g->col_len,
                   (long long)g->c);
  return TPU_OK;
}

/* A sample-major chunk over the whole batch: the matrix tensor itself. */
static chunk_t unfold_chunk(const geo_t* g, char* img, char* mat) {
  return (chunk_t){g, img, mat, 0, g->n, g->col_len, g->c * g->klen * g->col_len, NULL};
}

/* im2col(self, kernel_size, dilation, padding, stride) -> (N, C*kh*kw, L) */
tpu_status_t tpu_k_im2col(const tpu_call_t* call) {
  const char* op = "im2col";
  if (tpu_call_has_complex(call)) return tpu_complex_by_parts(call);
  const tpu_tensor_t* x0 = tpu_arg_tensor(call, 0);
  if (!x0) return TPU_ERR(INVALID_ARGUMENT, "%s: missing input", op);
  tpu_tensor_t x, y;
  TPU_RETURN_IF_ERROR(as_batched(op, "input", x0, 4, &x));
  TPU_RETURN_IF_ERROR(as_batched(op, "out", &call->outs[0], 3, &y));
  geo_t g;
  TPU_RETURN_IF_ERROR(geo_unfold(op, call, 1, &x, &y, &g));
  sp_stage_t sx, sy;
  TPU_RETURN_IF_ERROR(sp_stage_in(op, &x, g.dt, &sx));
  tpu_status_t st = sp_stage_out(op, &y, g.dt, false, &sy);
  if (!st) {
    chunk_t ch = unfold_chunk(&g, sx.data, sy.data);
    sp_parallel(g.c * g.klen * g.n, g.col_len, im2col_range, &ch);
    st = sp_stage_finish(&sy, st);
  }
  sp_stage_free(&sx);
  return st;
}

/* col2im(self, output_size, kernel_size, dilation, padding, stride) ->
 * (N, C, H, W): the sum of each column's window */
tpu_status_t tpu_k_col2im(const tpu_call_t* call) {
  const char* op = "col2im";
  if (tpu_call_has_complex(call)) return tpu_complex_by_parts(call);
  const tpu_tensor_t* x0 = tpu_arg_tensor(call, 0);
  if (!x0) return TPU_ERR(INVALID_ARGUMENT, "%s: missing input", op);
  tpu_tensor_t x, y;
  TPU_RETURN_IF_ERROR(as_batched(op, "input", x0, 3, &x));
  TPU_RETURN_IF_ERROR(as_batched(op, "out", &call->outs[0], 4, &y));
  geo_t g;
  TPU_RETURN_IF_ERROR(geo_unfold(op, call, 2, &y, &x, &g));
  sp_stage_t sx, sy;
  TPU_RETURN_IF_ERROR(sp_stage_in(op, &x, g.dt, &sx));
  tpu_status_t st = sp_stage_out(op, &y, g.dt, false, &sy);
  if (!st) {
    chunk_t ch = unfold_chunk(&g, sy.data, sx.data);
    sp_parallel(g.n * g.c, g.klen * g.col_len, col2im_range, &ch);
    st = sp_stage_finish(&sy, st);
  }
  sp_stage_free(&sx);
  return st;
}
