/* Shared internals of the dense linear algebra kernels (linalg.c: the
 * LU / Cholesky / LDL^T / QR / least-squares families for real and complex
 * matrices, real SVD and eigh; zlinalg.c: complex SVD and Hermitian eigh;
 * eig.c: general eigendecomposition).
 *
 * A matrix kernel gathers each matrix of a batch into a row-major double (or
 * double complex) buffer, works there, and writes the result back through the
 * output's strides. Batch dims of inputs broadcast against the output's batch
 * shape (size-1 dims repeat).
 */
#ifndef TPU_HOST_KERNELS_LINALG_H_
#define TPU_HOST_KERNELS_LINALG_H_

#include <stdlib.h>

#include "kernels.h"
#include "zvalue.h"

/* A matrix view: element (i, j) of batch offset `off` (in elements). The
 * matrix dims are the tensor's last two. */
typedef struct mat_view {
  const tpu_tensor_t* t;
  int64_t rows, cols, rs, cs;
} mat_view_t;

static inline mat_view_t mat_of(const tpu_tensor_t* t) {
  mat_view_t v = {t, 1, 1, 0, 0};
  if (t->ndim >= 2) {
    v.rows = t->sizes[t->ndim - 2];
    v.cols = t->sizes[t->ndim - 1];
    v.rs = t->strides[t->ndim - 2];
    v.cs = t->strides[t->ndim - 1];
  }
  return v;
}

/* The last dim of t as a vector (rows = size, cols = 1): pivots, tau,
 * singular values and eigenvalues, batched over the leading dims. */
static inline mat_view_t vec_of(const tpu_tensor_t* t) {
  mat_view_t v = {t, 1, 1, 0, 0};
  if (t->ndim >= 1) {
    v.rows = t->sizes[t->ndim - 1];
    v.rs = t->strides[t->ndim - 1];
  }
  return v;
}

static inline void* elem_ptr(const mat_view_t* v, int64_t off, int64_t i, int64_t j) {
  return (char*)v->t->data + (off + i * v->rs + j * v->cs) * (int64_t)tpu_dtype_size(v->t->dtype);
}

/* Element offset of batch `b` (row-major over `bsizes`, nb dims) in t, whose
 * leading t->ndim - mdims dims are its batch dims aligned to the right of
 * bsizes; size-1 dims broadcast. */
static inline int64_t batch_offset(const tpu_tensor_t* t, int mdims, int nb,
                                   const int64_t* bsizes, int64_t b) {
  int tb = t->ndim - mdims;
  int64_t off = 0;
  for (int d = nb - 1; d >= 0; d--) {
    int64_t idx = b % bsizes[d];
    b /= bsizes[d];
    int td = d - (nb - tb);
    if (td >= 0 && t->sizes[td] != 1) off += idx * t->strides[td];
  }
  return off;
}

static inline int64_t batch_count(int nb, const int64_t* bsizes) {
  int64_t n = 1;
  for (int d = 0; d < nb; d++) n *= bsizes[d];
  return n;
}

static inline bool has_elems(const tpu_tensor_t* t) {
  return t->dtype != TPU_DTYPE_NONE && tpu_tensor_numel(t) > 0;
}

/* Scratch of n doubles (at least one, so 0-size matrices need no cases). */
static inline double* scratch(int64_t n) {
  return (double*)malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
}

/* Scratch of n double complex values (at least one). */
static inline zc_t* zscratch(int64_t n) {
  return (zc_t*)malloc(sizeof(zc_t) * (size_t)(n > 0 ? n : 1));
}

#define OOM(op) TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory for scratch", op)

/* Gathers the r x c matrix at offset off as double complex into dst
 * (row-major); with `adj` dst receives its c x r conjugate transpose. Real
 * dtypes load with imaginary part 0. */
static inline void zload_mat(const mat_view_t* v, int64_t off, bool adj, zc_t* dst) {
  for (int64_t i = 0; i < v->rows; i++)
    for (int64_t j = 0; j < v->cols; j++) {
      zc_t x = tpu_load_z((const char*)elem_ptr(v, off, i, j), v->t->dtype);
      if (adj) dst[j * v->rows + i] = conj(x);
      else dst[i * v->cols + j] = x;
    }
}

/* Scatters src (row-major v->rows x v->cols; with `adj` the conjugate
 * transpose of a cols x rows matrix) into the matrix at offset off. */
static inline void zstore_mat(const mat_view_t* v, int64_t off, bool adj, const zc_t* src) {
  for (int64_t i = 0; i < v->rows; i++)
    for (int64_t j = 0; j < v->cols; j++)
      tpu_store_z((char*)elem_ptr(v, off, i, j), v->t->dtype,
                  adj ? conj(src[j * v->rows + i]) : src[i * v->cols + j]);
}

/* Complex elementary reflectors (linalg_qr.h's complex instance, linalg.c),
 * H = I - tau v v^H with v[0] = 1. tpu_zlarfg generates the one with
 * H^H x = (beta, 0, ...)^T, beta real, for the n entries of x at stride s
 * (LAPACK zlarfg): x[0] becomes beta, x[1..] v[1..]; returns tau (0 when x is
 * already (real, 0, ...)). */
zc_t tpu_zlarfg(zc_t* x, int64_t n, int64_t s);
/* c = (I - tau v v^H) c on rows r0 .. r0+len-1 and columns [c0, c1) of the
 * row-major c (ldc columns); v[i] at v + i * vs, v[0] = 1 is not read. */
void tpu_zreflect_left(const zc_t* v, int64_t vs, int64_t len, zc_t tau, zc_t* c, int64_t ldc,
                       int64_t r0, int64_t c0, int64_t c1);
/* c = c (I - tau v v^H) on columns r0 .. r0+len-1 and rows [q0, q1). */
void tpu_zreflect_right(const zc_t* v, int64_t vs, int64_t len, zc_t tau, zc_t* c, int64_t ldc,
                        int64_t r0, int64_t q0, int64_t q1);

/* One-sided Jacobi SVD of the complex m x n matrix w (m >= n), destroyed
 * (zlinalg.c): s[0..n) descending, v (n x n, columns the right singular
 * vectors, row 0 real and non-negative) and, when u is not NULL, u (m x uc,
 * uc = n or m: the extra columns complete a unitary basis). */
void tpu_zjacobi_svd(zc_t* w, int64_t m, int64_t n, double* s, zc_t* u, int64_t uc, zc_t* v);

/* The complex SVD and eigh kernels (zlinalg.c): linalg.c's kernels hand a
 * call with a complex input to them; the calls and results are those of the
 * real kernels. */
tpu_status_t tpu_zk_linalg_svd(const tpu_call_t* call);
tpu_status_t tpu_zk_linalg_eigh(const tpu_call_t* call);

#endif /* TPU_HOST_KERNELS_LINALG_H_ */
