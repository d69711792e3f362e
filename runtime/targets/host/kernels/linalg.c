/* Dense linear algebra kernels: LU (factor, solve, inverse, determinants,
 * unpacking), Cholesky (factor, inverse, solve), triangular solves,
 * Householder QR (linalg_qr, householder_product, ormqr), one-sided
 * Jacobi SVD, cyclic Jacobi symmetric eigendecomposition, and the 3-vector
 * cross product.
 *
 * Every matrix kernel works on float32/float64 matrices batched over leading
 * dims; the LU / Cholesky / triangular family and the matrix exponential
 * (linalg_lu.h) also on complex64/complex128, in double complex; the QR,
 * SVD and eigh kernels hand complex matrices to zlinalg.c.
 * Each matrix is gathered into a row-major double buffer, factored there, and
 * written back through the output's strides (the bridge allocates outputs
 * with the meta kernel's strides, often column-major). Batch dims of inputs
 * broadcast against the output's batch shape (size-1 dims repeat).
 *
 * Conventions follow LAPACK as PyTorch's CPU kernels expose them: pivots are
 * 1-based int32 row interchanges (row j swapped with row piv[j]-1, in order),
 * info outputs are int32 (0 on success, k for a zero pivot U(k,k) or a
 * leading minor of order k that is not positive-definite), Householder
 * reflectors are H = I - tau v v^T with v[0] = 1 and beta = -sign(alpha) *
 * norm (so R's diagonal may be negative, as from geqrf).
 */
#include <float.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "linalg.h"

/* ------------------------------------------------------------------ access */

/* float32/float64, and with complex_ok complex64/complex128 */
static tpu_status_t check_dtype(const char* op, const tpu_tensor_t* t, bool complex_ok) {
  if (t->dtype == TPU_F32 || t->dtype == TPU_F64) return NULL;
  if (complex_ok && tpu_dtype_is_complex(t->dtype)) return NULL;
  return TPU_ERR(UNIMPLEMENTED, "%s: dtype %s is not supported (float32, float64%s)", op,
                 tpu_dtype_name(t->dtype), complex_ok ? ", complex64, complex128" : "");
}

static tpu_status_t check_float(const char* op, const tpu_tensor_t* t) {
  return check_dtype(op, t, false);
}

static tpu_status_t check_matrix_of(const char* op, const tpu_tensor_t* t, bool square,
                                    bool complex_ok) {
  tpu_status_t st = check_dtype(op, t, complex_ok);
  if (st) return st;
  if (t->ndim < 2)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected a tensor with 2 or more dimensions, got %d",
                   op, (int)t->ndim);
  if (square && t->sizes[t->ndim - 1] != t->sizes[t->ndim - 2])
    return TPU_ERR(INVALID_ARGUMENT, "%s: A must be batches of square matrices, got %lld by %lld",
                   op, (long long)t->sizes[t->ndim - 2], (long long)t->sizes[t->ndim - 1]);
  return NULL;
}

static tpu_status_t check_matrix(const char* op, const tpu_tensor_t* t, bool square) {
  return check_matrix_of(op, t, square, false);
}

/* A descriptor of t with a trailing size-1 dim: a vector right-hand side
 * viewed as an n x 1 matrix. */
static tpu_tensor_t unsqueeze_last(const tpu_tensor_t* t) {
  tpu_tensor_t u = *t;
  u.sizes[u.ndim] = 1;
  u.strides[u.ndim] = 1;
  u.ndim++;
  return u;
}

/* Reads the 1-based pivots of batch offset off, bounds-checked. */
static tpu_status_t load_pivots(const char* op, const mat_view_t* pv, int64_t off, int64_t k,
                                int64_t m, int32_t* p) {
  for (int64_t j = 0; j < k; j++) {
    int64_t x = tpu_load_i64(elem_ptr(pv, off, j, 0), pv->t->dtype);
    if (x < 1 || x > m)
      return TPU_ERR(OUT_OF_RANGE, "%s: pivot %lld is out of bounds for %lld rows", op,
                     (long long)x, (long long)m);
    p[j] = (int32_t)x;
  }
  return NULL;
}

static tpu_status_t info_error(const char* op, int info) {
  return TPU_ERR(INVALID_ARGUMENT,
                 "%s: The diagonal element %d is zero, the inversion could not be completed "
                 "because the input matrix is singular.",
                 op, info);
}

static tpu_status_t not_pd_error(const char* op, int info) {
  return TPU_ERR(INVALID_ARGUMENT,
                 "%s: The factorization could not be completed because the input is not "
                 "positive-definite (the leading minor of order %d is not positive-definite).",
                 op, info);
}

/* How a matrix is read or applied: transposed (MAT_T), conjugated (MAT_C),
 * or both (MAT_H, the adjoint). */
typedef enum mat_op { MAT_N = 0, MAT_T = 1, MAT_C = 2, MAT_H = 3 } mat_op_t;

/* The LU / Cholesky / triangular family (linalg_lu.h): the real instance
 * keeps the plain names (QR, eigh and lstsq below use its load_mat,
 * store_mat, tri_solve and lower_from), the complex one is z_-prefixed. */
#define LA(name) name
#define LA_T double
#define LA_LOAD(p, dt) tpu_load_f64(p, dt)
#define LA_STORE(p, dt, v) tpu_store_f64(p, dt, v)
#define LA_MUL(a, b) ((a) * (b))
#define LA_CONJ(x) (x)
#define LA_REAL(x) (x)
#define LA_ABS(x) fabs(x)
#define LA_ABS2(x) ((x) * (x))
#define LA_ABS1(x) fabs(x)
#define LA_SGN(x) (double)(((x) > 0) - ((x) < 0))
#define LA_NAN NAN
#define LA_COMPLEX 0
#include "linalg_lu.h"

static inline zc_t z_mul(zc_t a, zc_t b) {
  double ar = creal(a), ai = cimag(a), br = creal(b), bi = cimag(b);
  return CMPLX(ar * br - ai * bi, ar * bi + ai * br);
}

#define LA(name) z_##name
#define LA_T zc_t
#define LA_LOAD(p, dt) tpu_load_z(p, dt)
#define LA_STORE(p, dt, v) tpu_store_z(p, dt, v)
#define LA_MUL(a, b) z_mul(a, b)
#define LA_CONJ(x) conj(x)
#define LA_REAL(x) creal(x)
#define LA_ABS(x) cabs(x)
#define LA_ABS2(x) (creal(x) * creal(x) + cimag(x) * cimag(x))
#define LA_ABS1(x) (fabs(creal(x)) + fabs(cimag(x)))
#define LA_SGN(x) (cabs(x) == 0.0 ? 0.0 : (x) / cabs(x))
#define LA_NAN CMPLX(NAN, NAN)
#define LA_COMPLEX 1
#include "linalg_lu.h"

/* Householder QR of the m x n matrix a in place (LAPACK geqrf layout: R on
 * and above the diagonal, reflector j's v below it with v[j] = 1 implied);
 * tau[0..min(m,n)). */
static void householder_qr(double* a, int64_t m, int64_t n, double* tau) {
  int64_t k = m < n ? m : n;
  for (int64_t j = 0; j < k; j++) {
    double alpha = a[j * n + j], xnorm = 0.0;
    for (int64_t i = j + 1; i < m; i++) xnorm = hypot(xnorm, a[i * n + j]);
    if (xnorm == 0.0) {
      tau[j] = 0.0;
      continue;
    }
    double beta = -copysign(hypot(alpha, xnorm), alpha);
    tau[j] = (beta - alpha) / beta;
    for (int64_t i = j + 1; i < m; i++) a[i * n + j] /= alpha - beta;
    a[j * n + j] = beta;
    /* Apply H = I - tau v v^T to the trailing columns. */
    for (int64_t c = j + 1; c < n; c++) {
      double s = a[j * n + c];
      for (int64_t i = j + 1; i < m; i++) s += a[i * n + j] * a[i * n + c];
      s *= tau[j];
      a[j * n + c] -= s;
      for (int64_t i = j + 1; i < m; i++) a[i * n + c] -= s * a[i * n + j];
    }
  }
}

/* Applies reflector j (v stored below the diagonal in column j of the
 * lda-column matrix a, m rows) to c (m x nc row-major) from the left:
 * c = (I - tau v v^T) c. */
static void reflect_left(const double* a, int64_t lda, int64_t m, int64_t j, double tau, double* c,
                         int64_t nc) {
  if (tau == 0.0) return;
  for (int64_t col = 0; col < nc; col++) {
    double s = c[j * nc + col];
    for (int64_t i = j + 1; i < m; i++) s += a[i * lda + j] * c[i * nc + col];
    s *= tau;
    c[j * nc + col] -= s;
    for (int64_t i = j + 1; i < m; i++) c[i * nc + col] -= s * a[i * lda + j];
  }
}

/* Same from the right on c (nr x m row-major): c = c (I - tau v v^T). */
static void reflect_right(const double* a, int64_t lda, int64_t m, int64_t j, double tau,
                          double* c, int64_t nr) {
  if (tau == 0.0) return;
  for (int64_t r = 0; r < nr; r++) {
    double* row = c + r * m;
    double s = row[j];
    for (int64_t i = j + 1; i < m; i++) s += a[i * lda + j] * row[i];
    s *= tau;
    row[j] -= s;
    for (int64_t i = j + 1; i < m; i++) row[i] -= s * a[i * lda + j];
  }
}

/* q (m x qc) = first qc columns of H_0 H_1 ... H_{k-1} (reflectors from a,
 * lda columns). */
static void form_q(const double* a, int64_t lda, int64_t m, const double* tau, int64_t k,
                   double* q, int64_t qc) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < qc; j++) q[i * qc + j] = i == j ? 1.0 : 0.0;
  for (int64_t j = k - 1; j >= 0; j--) reflect_left(a, lda, m, j, tau[j], q, qc);
}

/* Fills column j of the m x ld row-major matrix u with a unit vector
 * orthogonal to its columns listed in `done` (ndone of them): the standard
 * basis vector with the largest residual, orthogonalized twice. */
static void complete_column(double* u, int64_t m, int64_t ld, int64_t j, const int64_t* done,
                            int64_t ndone, double* tmp) {
  double best = -1.0;
  int64_t best_e = 0;
  for (int64_t e = 0; e < m; e++) {
    double r = 1.0; /* |e - sum_c u_c u_c[e]|^2 = 1 - sum_c u_c[e]^2 */
    for (int64_t c = 0; c < ndone; c++) r -= u[e * ld + done[c]] * u[e * ld + done[c]];
    if (r > best) best = r, best_e = e;
  }
  for (int64_t i = 0; i < m; i++) tmp[i] = i == best_e ? 1.0 : 0.0;
  for (int pass = 0; pass < 2; pass++)
    for (int64_t c = 0; c < ndone; c++) {
      double d = 0.0;
      for (int64_t i = 0; i < m; i++) d += u[i * ld + done[c]] * tmp[i];
      for (int64_t i = 0; i < m; i++) tmp[i] -= d * u[i * ld + done[c]];
    }
  double nrm = 0.0;
  for (int64_t i = 0; i < m; i++) nrm = hypot(nrm, tmp[i]);
  for (int64_t i = 0; i < m; i++) u[i * ld + j] = tmp[i] / nrm;
}

/* One-sided Jacobi SVD of the m x n matrix w (m >= n), destroyed. Produces
 * s[0..n) descending, u (m x uc row-major, uc = n or m: the extra columns
 * complete an orthonormal basis) and v (n x n row-major, columns are the right
 * singular vectors). With u == NULL only s is computed. Each column of v is
 * signed so that its entry of largest magnitude is positive. */
static void jacobi_svd(double* w, int64_t m, int64_t n, double* s, double* u, int64_t uc,
                       double* v) {
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < n; j++) v[i * n + j] = i == j ? 1.0 : 0.0;
  for (int sweep = 0; sweep < 80; sweep++) {
    bool rotated = false;
    for (int64_t p = 0; p + 1 < n; p++)
      for (int64_t q = p + 1; q < n; q++) {
        double alpha = 0.0, beta = 0.0, gamma = 0.0;
        for (int64_t i = 0; i < m; i++) {
          alpha += w[i * n + p] * w[i * n + p];
          beta += w[i * n + q] * w[i * n + q];
          gamma += w[i * n + p] * w[i * n + q];
        }
        if (gamma == 0.0 || fabs(gamma) <= 4 * DBL_EPSILON * sqrt(alpha * beta)) continue;
        rotated = true;
        double zeta = (beta - alpha) / (2.0 * gamma);
        double t = (zeta >= 0 ? 1.0 : -1.0) / (fabs(zeta) + sqrt(1.0 + zeta * zeta));
        double c = 1.0 / sqrt(1.0 + t * t), sn = c * t;
        for (int64_t i = 0; i < m; i++) {
          double wp = w[i * n + p], wq = w[i * n + q];
          w[i * n + p] = c * wp - sn * wq;
          w[i * n + q] = sn * wp + c * wq;
        }
        for (int64_t i = 0; i < n; i++) {
          double vp = v[i * n + p], vq = v[i * n + q];
          v[i * n + p] = c * vp - sn * vq;
          v[i * n + q] = sn * vp + c * vq;
        }
      }
    if (!rotated) break;
  }
  /* Column norms, then a selection sort of columns by descending norm. */
  for (int64_t j = 0; j < n; j++) {
    double nrm = 0.0;
    for (int64_t i = 0; i < m; i++) nrm = hypot(nrm, w[i * n + j]);
    s[j] = nrm;
  }
  for (int64_t j = 0; j < n; j++) {
    int64_t b = j;
    for (int64_t c = j + 1; c < n; c++)
      if (s[c] > s[b]) b = c;
    if (b == j) continue;
    double t = s[j];
    s[j] = s[b], s[b] = t;
    for (int64_t i = 0; i < m; i++) t = w[i * n + j], w[i * n + j] = w[i * n + b], w[i * n + b] = t;
    for (int64_t i = 0; i < n; i++) t = v[i * n + j], v[i * n + j] = v[i * n + b], v[i * n + b] = t;
  }
  if (!u) return;
  for (int64_t j = 0; j < n; j++) {
    int64_t big = 0;
    for (int64_t i = 1; i < n; i++)
      if (fabs(v[i * n + j]) > fabs(v[big * n + j])) big = i;
    if (v[big * n + j] < 0) {
      for (int64_t i = 0; i < n; i++) v[i * n + j] = -v[i * n + j];
      for (int64_t i = 0; i < m; i++) w[i * n + j] = -w[i * n + j];
    }
  }
  /* Left vectors: normalized columns; columns of negligible norm and the
   * extra columns of a full U complete an orthonormal basis. */
  double tiny = (s[0] > 0 ? s[0] : 1.0) * DBL_EPSILON * (double)(m > n ? m : n);
  int64_t* done = (int64_t*)malloc(sizeof(int64_t) * (size_t)(uc > 0 ? uc : 1));
  double* tmp = scratch(m);
  int64_t ndone = 0;
  for (int64_t j = 0; j < n; j++)
    if (s[j] > tiny) {
      for (int64_t i = 0; i < m; i++) u[i * uc + j] = w[i * n + j] / s[j];
      done[ndone++] = j;
    }
  for (int64_t j = 0; j < uc; j++)
    if (j >= n || !(s[j] > tiny)) {
      complete_column(u, m, uc, j, done, ndone, tmp);
      done[ndone++] = j;
    }
  free(done);
  free(tmp);
}

/* Cyclic Jacobi eigendecomposition of the symmetric n x n matrix a (full,
 * destroyed): eigenvalues ascending in w, eigenvectors as columns of v
 * (n x n row-major; NULL for values only), each signed so that its entry of
 * largest magnitude is positive. */
static void jacobi_eigh(double* a, int64_t n, double* w, double* v) {
  double* vv = v;
  if (vv)
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < n; j++) vv[i * n + j] = i == j ? 1.0 : 0.0;
  for (int sweep = 0; sweep < 100; sweep++) {
    double off = 0.0, tot = 0.0;
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < n; j++) {
        tot += a[i * n + j] * a[i * n + j];
        if (i != j) off += a[i * n + j] * a[i * n + j];
      }
    if (off <= DBL_EPSILON * DBL_EPSILON * tot * 1e-2 || off == 0.0) break;
    for (int64_t p = 0; p + 1 < n; p++)
      for (int64_t q = p + 1; q < n; q++) {
        double apq = a[p * n + q];
        if (apq == 0.0) continue;
        double theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
        double t = (theta >= 0 ? 1.0 : -1.0) / (fabs(theta) + sqrt(theta * theta + 1.0));
        double c = 1.0 / sqrt(t * t + 1.0), s = t * c;
        for (int64_t k = 0; k < n; k++) {
          double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - s * akq;
          a[k * n + q] = s * akp + c * akq;
        }
        for (int64_t k = 0; k < n; k++) {
          double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - s * aqk;
          a[q * n + k] = s * apk + c * aqk;
        }
        if (vv)
          for (int64_t k = 0; k < n; k++) {
            double vkp = vv[k * n + p], vkq = vv[k * n + q];
            vv[k * n + p] = c * vkp - s * vkq;
            vv[k * n + q] = s * vkp + c * vkq;
          }
      }
  }
  for (int64_t i = 0; i < n; i++) w[i] = a[i * n + i];
  for (int64_t j = 0; j < n; j++) { /* selection sort, ascending */
    int64_t b = j;
    for (int64_t c = j + 1; c < n; c++)
      if (w[c] < w[b]) b = c;
    if (b == j) continue;
    double t = w[j];
    w[j] = w[b], w[b] = t;
    if (vv)
      for (int64_t i = 0; i < n; i++)
        t = vv[i * n + j], vv[i * n + j] = vv[i * n + b], vv[i * n + b] = t;
  }
  if (vv)
    for (int64_t j = 0; j < n; j++) {
      int64_t big = 0;
      for (int64_t i = 1; i < n; i++)
        if (fabs(vv[i * n + j]) > fabs(vv[big * n + j])) big = i;
      if (vv[big * n + j] < 0)
        for (int64_t i = 0; i < n; i++) vv[i * n + j] = -vv[i * n + j];
    }
}

/* ------------------------------------------- LU / Cholesky / triangular */

/* The family's kernels: a call with a complex tensor runs the complex
 * instance of linalg_lu.h, any other the real one. */
#define LA_ENTRY(name)                                                           \
  tpu_status_t tpu_k_##name(const tpu_call_t* call) {                            \
    return tpu_call_has_complex(call) ? z_k_##name(call) : k_##name(call);       \
  }
LA_ENTRY(linalg_lu_factor_ex)
LA_ENTRY(linalg_lu_solve)
LA_ENTRY(linalg_solve_ex)
LA_ENTRY(linalg_inv_ex)
LA_ENTRY(linalg_det)
LA_ENTRY(linalg_slogdet)
LA_ENTRY(linalg_lu)
LA_ENTRY(lu_unpack)
LA_ENTRY(linalg_cholesky_ex)
LA_ENTRY(cholesky)
LA_ENTRY(cholesky_inverse)
LA_ENTRY(cholesky_solve_helper)
LA_ENTRY(linalg_solve_triangular)
LA_ENTRY(triangular_solve)
LA_ENTRY(linalg_matrix_exp)
LA_ENTRY(linalg_ldl_factor_ex)
LA_ENTRY(linalg_ldl_solve)
#undef LA_ENTRY

/* ------------------------------------------------------------ QR kernels */

/* linalg_qr(A, mode) -> (Q, R); mode "reduced", "complete" or "r" (Q empty). */
tpu_status_t tpu_k_linalg_qr(const tpu_call_t* call) {
  const char* op = "linalg.qr";
  const tpu_tensor_t *A = tpu_arg_tensor(call, 0), *Q = &call->outs[0], *R = &call->outs[1];
  if (tpu_dtype_is_complex(A->dtype)) return tpu_zk_linalg_qr(call);
  tpu_status_t st = check_matrix(op, A, false);
  if (st) return st;
  mat_view_t av = mat_of(A), qv = mat_of(Q), rv = mat_of(R);
  int64_t m = av.rows, n = av.cols, k = m < n ? m : n;
  bool want_q = has_elems(Q);
  int64_t qc = want_q ? qv.cols : 0;
  int nb = A->ndim - 2;
  int64_t nbatch = batch_count(nb, A->sizes);
  double *a = scratch(m * n), *tau = scratch(k), *q = scratch(m * qc);
  if (!a || !tau || !q) {
    free(a), free(tau), free(q);
    return OOM(op);
  }
  for (int64_t b = 0; b < nbatch; b++) {
    load_mat(&av, batch_offset(A, 2, nb, A->sizes, b), false, a);
    householder_qr(a, m, n, tau);
    if (want_q) {
      form_q(a, n, m, tau, k, q, qc);
      store_mat(&qv, batch_offset(Q, 2, nb, A->sizes, b), false, q);
    }
    int64_t roff = batch_offset(R, 2, nb, A->sizes, b);
    for (int64_t i = 0; i < rv.rows; i++)
      for (int64_t j = 0; j < n; j++)
        tpu_store_f64(elem_ptr(&rv, roff, i, j), R->dtype, j >= i ? a[i * n + j] : 0.0);
  }
  free(a), free(tau), free(q);
  return NULL;
}

/* Loads the reflectors (m x n) and k taus of batch b. */
static void load_reflectors(const tpu_tensor_t* V, const tpu_tensor_t* T, int nb,
                            const int64_t* bsizes, int64_t b, double* v, double* tau, int64_t k) {
  mat_view_t vv = mat_of(V), tv = vec_of(T);
  load_mat(&vv, batch_offset(V, 2, nb, bsizes, b), false, v);
  int64_t toff = batch_offset(T, 1, nb, bsizes, b);
  for (int64_t j = 0; j < k; j++) tau[j] = tpu_load_f64(elem_ptr(&tv, toff, j, 0), T->dtype);
}

/* linalg_householder_product(input, tau) -> out (m x n) */
tpu_status_t tpu_k_linalg_householder_product(const tpu_call_t* call) {
  const char* op = "linalg.householder_product";
  const tpu_tensor_t *V = tpu_arg_tensor(call, 0), *T = tpu_arg_tensor(call, 1);
  const tpu_tensor_t* out = &call->outs[0];
  if (tpu_dtype_is_complex(V->dtype) || tpu_dtype_is_complex(T->dtype))
    return tpu_zk_linalg_householder_product(call);
  tpu_status_t st = check_matrix(op, V, false);
  if (!st) st = check_float(op, T);
  if (st) return st;
  mat_view_t vv = mat_of(V), ov = mat_of(out);
  int64_t m = vv.rows, n = vv.cols, k = T->ndim ? T->sizes[T->ndim - 1] : 1;
  if (k > n || n > m)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected m >= n >= k, got %lld, %lld, %lld", op,
                   (long long)m, (long long)n, (long long)k);
  int nb = out->ndim - 2;
  int64_t nbatch = batch_count(nb, out->sizes);
  double *v = scratch(m * n), *tau = scratch(k), *q = scratch(m * n);
  if (!v || !tau || !q) {
    free(v), free(tau), free(q);
    return OOM(op);
  }
  for (int64_t b = 0; b < nbatch; b++) {
    load_reflectors(V, T, nb, out->sizes, b, v, tau, k);
    form_q(v, n, m, tau, k, q, n);
    store_mat(&ov, batch_offset(out, 2, nb, out->sizes, b), false, q);
  }
  free(v), free(tau), free(q);
  return NULL;
}

/* ormqr(self=reflectors, input2=tau, input3=C, left, transpose) -> out:
 * op(Q) C (left) or C op(Q) with Q = H_0 ... H_{k-1}. */
tpu_status_t tpu_k_ormqr(const tpu_call_t* call) {
  const char* op = "ormqr";
  const tpu_tensor_t *V = tpu_arg_tensor(call, 0), *T = tpu_arg_tensor(call, 1);
  const tpu_tensor_t *C = tpu_arg_tensor(call, 2), *out = &call->outs[0];
  if (tpu_call_has_complex(call)) return tpu_zk_ormqr(call);
  tpu_status_t st = check_matrix(op, V, false);
  if (!st) st = check_matrix(op, C, false);
  if (!st) st = check_float(op, T);
  if (st) return st;
  bool left = tpu_arg_bool(call, 3, true), trans = tpu_arg_bool(call, 4, false);
  mat_view_t vv = mat_of(V), cv = mat_of(C), ov = mat_of(out);
  int64_t mv = vv.rows, nv = vv.cols, k = T->ndim ? T->sizes[T->ndim - 1] : 1;
  int64_t mc = cv.rows, nc = cv.cols;
  if (mv != (left ? mc : nc) || k > nv || k > mv)
    return TPU_ERR(INVALID_ARGUMENT, "%s: reflectors %lldx%lld (k %lld) do not fit C %lldx%lld",
                   op, (long long)mv, (long long)nv, (long long)k, (long long)mc, (long long)nc);
  int nb = out->ndim - 2;
  int64_t nbatch = batch_count(nb, out->sizes);
  double *v = scratch(mv * nv), *tau = scratch(k), *c = scratch(mc * nc);
  if (!v || !tau || !c) {
    free(v), free(tau), free(c);
    return OOM(op);
  }
  /* Q C applies H_{k-1} first; Q^T C applies H_0 first; from the right the
   * order flips. */
  bool ascending = left == trans;
  for (int64_t b = 0; b < nbatch; b++) {
    load_reflectors(V, T, nb, out->sizes, b, v, tau, k);
    load_mat(&cv, batch_offset(C, 2, nb, out->sizes, b), false, c);
    for (int64_t s = 0; s < k; s++) {
      int64_t j = ascending ? s : k - 1 - s;
      if (left) reflect_left(v, nv, mv, j, tau[j], c, nc);
      else reflect_right(v, nv, mv, j, tau[j], c, mc);
    }
    store_mat(&ov, batch_offset(out, 2, nb, out->sizes, b), false, c);
  }
  free(v), free(tau), free(c);
  return NULL;
}

/* ---------------------------------------------------- spectral kernels */

/* Spectral kernels iterate, so matrices of a batch run in parallel; each
 * range of batches has its own scratch. */
typedef struct spectral_ctx {
  const tpu_call_t* call;
  const tpu_tensor_t* A;
  int nb;
  bool flag;            /* svd: compute U/Vh; eigh: read the upper triangle */
  int64_t tall_cols;    /* svd: columns of the tall factor */
  _Atomic int oom;      /* set by any range whose scratch malloc failed */
} spectral_ctx_t;

static void svd_range(void* vctx, int64_t begin, int64_t end) {
  spectral_ctx_t* cx = (spectral_ctx_t*)vctx;
  const tpu_tensor_t *A = cx->A, *U = &cx->call->outs[0], *S = &cx->call->outs[1];
  const tpu_tensor_t* Vh = &cx->call->outs[2];
  mat_view_t av = mat_of(A), uo = mat_of(U), so = vec_of(S), vo = mat_of(Vh);
  /* Wide matrices: the SVD of A^T = V S U^T gives A's with roles swapped. */
  bool wide = av.rows < av.cols, uv = cx->flag;
  int64_t M = wide ? av.cols : av.rows, N = wide ? av.rows : av.cols, tc = cx->tall_cols;
  double *w = scratch(M * N), *s = scratch(N), *u = scratch(M * tc), *v = scratch(N * N);
  if (!w || !s || !u || !v) cx->oom = 1;
  for (int64_t b = begin; b < end && !cx->oom; b++) {
    load_mat(&av, batch_offset(A, 2, cx->nb, A->sizes, b), wide, w);
    jacobi_svd(w, M, N, s, uv ? u : NULL, tc, v);
    int64_t soff = batch_offset(S, 1, cx->nb, A->sizes, b);
    for (int64_t j = 0; j < N; j++) tpu_store_f64(elem_ptr(&so, soff, j, 0), S->dtype, s[j]);
    if (!uv) continue;
    int64_t uoff = batch_offset(U, 2, cx->nb, A->sizes, b);
    int64_t voff = batch_offset(Vh, 2, cx->nb, A->sizes, b);
    /* Tall: U = u, Vh = v^T. Wide (A = v s u^T): U = v, Vh = u^T. */
    store_mat(&uo, uoff, false, wide ? v : u);
    store_mat(&vo, voff, true, wide ? u : v);
  }
  free(w), free(s), free(u), free(v);
}

/* _linalg_svd(A, full_matrices, compute_uv, *, driver) -> (U, S, Vh) */
tpu_status_t tpu_k_linalg_svd(const tpu_call_t* call) {
  const char* op = "linalg.svd";
  const tpu_tensor_t* A = tpu_arg_tensor(call, 0);
  if (tpu_dtype_is_complex(A->dtype)) return tpu_zk_linalg_svd(call);
  tpu_status_t st = check_matrix(op, A, false);
  if (st) return st;
  spectral_ctx_t cx = {call, A, A->ndim - 2, has_elems(&call->outs[0]) || has_elems(&call->outs[2]),
                       0, 0};
  if (cx.flag) { /* N (reduced) or M (full) columns */
    bool wide = A->sizes[A->ndim - 2] < A->sizes[A->ndim - 1];
    cx.tall_cols = wide ? mat_of(&call->outs[2]).rows : mat_of(&call->outs[0]).cols;
  }
  tpu_parallel_for(batch_count(cx.nb, A->sizes), 1, svd_range, &cx);
  return cx.oom ? OOM(op) : NULL;
}

static void eigh_range(void* vctx, int64_t begin, int64_t end) {
  spectral_ctx_t* cx = (spectral_ctx_t*)vctx;
  const tpu_tensor_t *A = cx->A, *W = &cx->call->outs[0], *V = &cx->call->outs[1];
  bool want_v = has_elems(V);
  mat_view_t av = mat_of(A), wo = vec_of(W), vo = mat_of(V);
  int64_t n = av.rows;
  double *a = scratch(n * n), *w = scratch(n), *v = scratch(n * n);
  if (!a || !w || !v) cx->oom = 1;
  for (int64_t b = begin; b < end && !cx->oom; b++) {
    load_mat(&av, batch_offset(A, 2, cx->nb, A->sizes, b), false, a);
    lower_from(a, n, cx->flag);
    for (int64_t i = 0; i < n; i++) /* mirror the lower triangle */
      for (int64_t j = i + 1; j < n; j++) a[i * n + j] = a[j * n + i];
    jacobi_eigh(a, n, w, want_v ? v : NULL);
    int64_t woff = batch_offset(W, 1, cx->nb, A->sizes, b);
    for (int64_t j = 0; j < n; j++) tpu_store_f64(elem_ptr(&wo, woff, j, 0), W->dtype, w[j]);
    if (want_v) store_mat(&vo, batch_offset(V, 2, cx->nb, A->sizes, b), false, v);
  }
  free(a), free(w), free(v);
}

/* _linalg_eigh(A, UPLO, compute_v) -> (eigenvalues, eigenvectors) */
tpu_status_t tpu_k_linalg_eigh(const tpu_call_t* call) {
  const char* op = "linalg.eigh";
  const tpu_tensor_t* A = tpu_arg_tensor(call, 0);
  if (tpu_dtype_is_complex(A->dtype)) return tpu_zk_linalg_eigh(call);
  tpu_status_t st = check_matrix(op, A, true);
  if (st) return st;
  const char* uplo = tpu_arg_str(call, 1, "L");
  bool upper = uplo[0] == 'U' || uplo[0] == 'u';
  if (!upper && uplo[0] != 'L' && uplo[0] != 'l')
    return TPU_ERR(INVALID_ARGUMENT, "%s: UPLO must be 'L' or 'U', got '%s'", op, uplo);
  spectral_ctx_t cx = {call, A, A->ndim - 2, upper, 0, 0};
  tpu_parallel_for(batch_count(cx.nb, A->sizes), 1, eigh_range, &cx);
  return cx.oom ? OOM(op) : NULL;
}

/* ---------------------------------------------------------- cross product */

/* Element offset in t (broadcast to out's shape, right-aligned; size-1 dims
 * repeat) of out's index `idx`. */
static int64_t bcast_offset(const tpu_tensor_t* t, const tpu_tensor_t* out, const int64_t* idx) {
  int64_t off = 0;
  for (int d = 0; d < t->ndim; d++) {
    int od = d + out->ndim - t->ndim;
    if (t->sizes[d] != 1) off += idx[od] * t->strides[d];
  }
  return off;
}

/* linalg_cross(self, other, *, dim) -> out: 3-vectors along dim, inputs
 * broadcast to out's shape. Floats compute in double, integers in wrapping
 * 64-bit arithmetic. */
tpu_status_t tpu_k_linalg_cross(const tpu_call_t* call) {
  TPU_ROUTE_COMPLEX(call);
  const tpu_tensor_t *a = tpu_arg_tensor(call, 0), *b = tpu_arg_tensor(call, 1);
  const tpu_tensor_t* out = &call->outs[0];
  int64_t dim = tpu_arg_i64(call, 2, -1);
  if (dim < 0) dim += out->ndim;
  if (dim < 0 || dim >= out->ndim || out->sizes[dim] != 3)
    return TPU_ERR(INVALID_ARGUMENT, "linalg.cross: dimension %lld does not have size 3",
                   (long long)tpu_arg_i64(call, 2, -1));
  tpu_dtype_t dt = out->dtype;
  if (!tpu_dtype_is_supported(dt) || dt == TPU_BOOL || a->dtype != dt || b->dtype != dt)
    return TPU_ERR(UNIMPLEMENTED, "linalg.cross: dtypes %s, %s -> %s are not supported",
                   tpu_dtype_name(a->dtype), tpu_dtype_name(b->dtype), tpu_dtype_name(dt));
  bool is_float = tpu_dtype_is_float(dt);
  size_t es = tpu_dtype_size(dt);
  int64_t count = tpu_tensor_numel(out) / 3;
  /* Offsets of a, b and out along dim (dim of a/b may broadcast from 1). */
  int da = (int)dim - (out->ndim - a->ndim), db = (int)dim - (out->ndim - b->ndim);
  int64_t sa = da >= 0 && a->sizes[da] != 1 ? a->strides[da] : 0;
  int64_t sb = db >= 0 && b->sizes[db] != 1 ? b->strides[db] : 0;
  int64_t so = out->strides[dim];
  int64_t idx[TPU_MAX_DIMS];
  for (int64_t p = 0; p < count; p++) {
    int64_t rest = p;
    for (int d = out->ndim - 1; d >= 0; d--) {
      if (d == dim) {
        idx[d] = 0;
        continue;
      }
      idx[d] = rest % out->sizes[d];
      rest /= out->sizes[d];
    }
    char* pa = (char*)a->data + bcast_offset(a, out, idx) * (int64_t)es;
    char* pb = (char*)b->data + bcast_offset(b, out, idx) * (int64_t)es;
    int64_t ooff = 0;
    for (int d = 0; d < out->ndim; d++) ooff += idx[d] * out->strides[d];
    char* po = (char*)out->data + ooff * (int64_t)es;
    if (is_float) {
      double x[3], y[3];
      for (int k = 0; k < 3; k++) {
        x[k] = tpu_load_f64(pa + k * sa * (int64_t)es, dt);
        y[k] = tpu_load_f64(pb + k * sb * (int64_t)es, dt);
      }
      for (int k = 0; k < 3; k++) {
        int i = (k + 1) % 3, j = (k + 2) % 3;
        tpu_store_f64(po + k * so * (int64_t)es, dt, x[i] * y[j] - x[j] * y[i]);
      }
    } else {
      uint64_t x[3], y[3];
      for (int k = 0; k < 3; k++) {
        x[k] = (uint64_t)tpu_load_i64(pa + k * sa * (int64_t)es, dt);
        y[k] = (uint64_t)tpu_load_i64(pb + k * sb * (int64_t)es, dt);
      }
      for (int k = 0; k < 3; k++) {
        int i = (k + 1) % 3, j = (k + 2) % 3;
        tpu_store_i64(po + k * so * (int64_t)es, dt, (int64_t)(x[i] * y[j] - x[j] * y[i]));
      }
    }
  }
  return NULL;
}

/* ------------------------------------------------------------------ geqrf */

/* geqrf(self) -> (a, tau): the Householder QR in LAPACK's compact form,
 * R on and above the diagonal, reflector j's vector below it (v[j] = 1
 * implied), H_j = I - tau[j] v v^T. */
tpu_status_t tpu_k_geqrf(const tpu_call_t* call) {
  const char* op = "geqrf";
  const tpu_tensor_t* A = tpu_arg_tensor(call, 0);
  const tpu_tensor_t *QR = &call->outs[0], *T = &call->outs[1];
  if (tpu_dtype_is_complex(A->dtype)) return tpu_zk_geqrf(call);
  tpu_status_t st = check_matrix(op, A, false);
  if (st) return st;
  mat_view_t av = mat_of(A), qv = mat_of(QR), tv = vec_of(T);
  int64_t m = av.rows, n = av.cols, k = m < n ? m : n;
  int nb = A->ndim - 2;
  int64_t nbatch = batch_count(nb, A->sizes);
  double *a = scratch(m * n), *tau = scratch(k);
  if (!a || !tau) {
    free(a), free(tau);
    return OOM(op);
  }
  for (int64_t b = 0; b < nbatch; b++) {
    load_mat(&av, batch_offset(A, 2, nb, A->sizes, b), false, a);
    householder_qr(a, m, n, tau);
    store_mat(&qv, batch_offset(QR, 2, nb, A->sizes, b), false, a);
    int64_t toff = batch_offset(T, 1, nb, A->sizes, b);
    for (int64_t j = 0; j < k; j++) tpu_store_f64(elem_ptr(&tv, toff, j, 0), T->dtype, tau[j]);
  }
  free(a), free(tau);
  return NULL;
}

/* --------------------------------------------------------- least squares */

/* Numerical rank of the m x n matrix a (destroyed) by Householder QR with
 * column pivoting (the column of largest remaining norm first, as gelsy's
 * factorization): the leading diagonal entries of R with |R(j,j)| > rcond *
 * |R(0,0)|. */
static int64_t qrcp_rank(double* a, int64_t m, int64_t n, double rcond, double* norms) {
  int64_t k = m < n ? m : n, rank = 0;
  double r00 = 0.0;
  for (int64_t j = 0; j < k; j++) {
    int64_t best = j;
    for (int64_t c = j; c < n; c++) {
      double s = 0.0;
      for (int64_t i = j; i < m; i++) s = hypot(s, a[i * n + c]);
      norms[c] = s;
      if (s > norms[best]) best = c;
    }
    if (best != j)
      for (int64_t i = 0; i < m; i++) {
        double t = a[i * n + j];
        a[i * n + j] = a[i * n + best];
        a[i * n + best] = t;
      }
    double alpha = a[j * n + j], xnorm = 0.0;
    for (int64_t i = j + 1; i < m; i++) xnorm = hypot(xnorm, a[i * n + j]);
    double rjj = alpha;
    if (xnorm != 0.0) {
      double beta = -copysign(hypot(alpha, xnorm), alpha), tau = (beta - alpha) / beta;
      for (int64_t i = j + 1; i < m; i++) a[i * n + j] /= alpha - beta;
      rjj = beta;
      for (int64_t c = j + 1; c < n; c++) {
        double s = a[j * n + c];
        for (int64_t i = j + 1; i < m; i++) s += a[i * n + j] * a[i * n + c];
        s *= tau;
        a[j * n + c] -= s;
        for (int64_t i = j + 1; i < m; i++) a[i * n + c] -= s * a[i * n + j];
      }
    }
    if (j == 0) r00 = fabs(rjj);
    if (r00 == 0.0 || !(fabs(rjj) > rcond * r00)) break;
    rank++;
  }
  return rank;
}

typedef enum lsq_driver { LSQ_GELS, LSQ_GELSY, LSQ_GELSD, LSQ_GELSS } lsq_driver_t;

/* Scratch of one least-squares solve (m x n system, nrhs columns). */
typedef struct lsq_work {
  double *a, *c, *x, *tau, *s, *u, *v, *w;
} lsq_work_t;

/* Solves min ||A X - C|| for one matrix: a (m x n), c (m x nrhs) row-major;
 * x (n x nrhs) receives the solution. gels: Householder QR (m >= n) or QR of
 * A^T (m < n, the minimum-norm solution), no rank test; returns the 1-based
 * index of an exactly zero diagonal entry of R (LAPACK's info), 0 if none, and
 * leaves in c rows n..m of Q^T C (the residual part). The others: the
 * minimum-norm solution through the SVD truncated at rank `*rank` (singular
 * values > rcond * s[0]; gelsy takes its rank from QR with column pivoting).
 * s receives the min(m, n) singular values. */
static int lsq_solve_one(lsq_driver_t drv, lsq_work_t* w, int64_t m, int64_t n, int64_t nrhs,
                         double rcond, int64_t* rank) {
  int64_t k = m < n ? m : n;
  double *a = w->a, *c = w->c, *x = w->x;
  for (int64_t i = 0; i < n * nrhs; i++) x[i] = 0.0;
  if (drv == LSQ_GELS) {
    *rank = k;
    if (m >= n) {
      householder_qr(a, m, n, w->tau);
      for (int64_t j = 0; j < k; j++) reflect_left(a, n, m, j, w->tau[j], c, nrhs);
      for (int64_t j = 0; j < n; j++)
        if (a[j * n + j] == 0.0) return (int)(j + 1);
      for (int64_t i = 0; i < n * nrhs; i++) x[i] = c[i];
      tri_solve(a, n, x, nrhs, false, false, false); /* R is the top n x n block, stride n */
    } else {
      double* at = w->w; /* A^T = Q R (n x m); A = R^T Q^T */
      for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) at[j * m + i] = a[i * n + j];
      householder_qr(at, n, m, w->tau);
      for (int64_t j = 0; j < m; j++)
        if (at[j * m + j] == 0.0) return (int)(j + 1);
      for (int64_t i = 0; i < m * nrhs; i++) x[i] = c[i];
      tri_solve(at, m, x, nrhs, false, true, false); /* R^T z = C */
      for (int64_t j = k - 1; j >= 0; j--) reflect_left(at, m, n, j, w->tau[j], x, nrhs);
    }
    return 0;
  }
  /* SVD: A = P diag(s) Q^T with P m x k, Q n x k (row-major). */
  bool wide = m < n;
  int64_t M = wide ? n : m, N = k;
  double *p, *q;
  if (!wide) {
    for (int64_t i = 0; i < m * n; i++) w->w[i] = a[i];
    jacobi_svd(w->w, M, N, w->s, w->u, N, w->v);
    p = w->u, q = w->v; /* u: m x k, v: n x k (k = n) */
  } else {
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) w->w[j * m + i] = a[i * n + j];
    jacobi_svd(w->w, M, N, w->s, w->u, N, w->v);
    p = w->v, q = w->u; /* A^T = u s v^T: P = v (m x k), Q = u (n x k) */
  }
  double* s = w->s;
  if (drv == LSQ_GELSY) {
    for (int64_t i = 0; i < m * n; i++) w->w[i] = a[i];
    *rank = qrcp_rank(w->w, m, n, rcond, w->tau);
  } else {
    int64_t r = 0;
    while (r < k && s[0] > 0.0 && s[r] > rcond * s[0]) r++;
    *rank = r;
  }
  for (int64_t j = 0; j < *rank; j++)
    for (int64_t col = 0; col < nrhs; col++) {
      double d = 0.0;
      for (int64_t i = 0; i < m; i++) d += p[i * k + j] * c[i * nrhs + col];
      d /= s[j];
      for (int64_t i = 0; i < n; i++) x[i * nrhs + col] += q[i * k + j] * d;
    }
  return 0;
}

static tpu_status_t lsq_driver(const char* op, const char* name, lsq_driver_t* out) {
  static const char* const names[] = {"gels", "gelsy", "gelsd", "gelss"};
  for (int i = 0; i < 4; i++)
    if (strcmp(name, names[i]) == 0) {
      *out = (lsq_driver_t)i;
      return NULL;
    }
  return TPU_ERR(INVALID_ARGUMENT,
                 "%s: parameter `driver` should be one of (gels, gelsy, gelsd, gelss), got %s", op,
                 name);
}

/* linalg_lstsq(self, b, rcond, *, driver) -> (solution, residuals, rank,
 * singular_values). Outputs the meta kernel sized empty are not written:
 * residuals exist for m > n and drivers other than gelsy, rank for every
 * driver but gels, singular values for gelsd and gelss. Residuals are the
 * squared norms of the columns of A X - B (gels: of rows n..m of Q^T B, as
 * LAPACK leaves them). */
tpu_status_t tpu_k_linalg_lstsq(const tpu_call_t* call) {
  const char* op = "linalg.lstsq";
  const tpu_tensor_t *A = tpu_arg_tensor(call, 0), *B = tpu_arg_tensor(call, 1);
  tpu_status_t st = check_matrix(op, A, false);
  if (!st) st = check_float(op, B);
  if (st) return st;
  lsq_driver_t drv = LSQ_GELSY;
  st = lsq_driver(op, tpu_arg_str(call, 3, "gelsy"), &drv);
  if (st) return st;
  mat_view_t av = mat_of(A);
  int64_t m = av.rows, n = av.cols, k = m < n ? m : n, mx = m > n ? m : n;
  double eps = A->dtype == TPU_F32 ? (double)FLT_EPSILON : DBL_EPSILON;
  double rcond = tpu_arg_is_none(call, 2) ? eps * (double)mx : tpu_arg_f64(call, 2, 0.0);
  if (rcond < 0) rcond = eps;
  /* A vector right-hand side (b of shape A.shape[:-1], or 1-d) is an m x 1
   * matrix; the solution then drops its last dim. */
  bool vec = B->ndim == 1;
  if (B->ndim == A->ndim - 1) {
    vec = true;
    for (int d = 0; d < B->ndim; d++) vec = vec && B->sizes[d] == A->sizes[d];
  }
  tpu_tensor_t b2 = vec ? unsqueeze_last(B) : *B;
  tpu_tensor_t x2 = vec ? unsqueeze_last(&call->outs[0]) : call->outs[0];
  const tpu_tensor_t *res = &call->outs[1], *rk = &call->outs[2], *sv = &call->outs[3];
  mat_view_t bv = mat_of(&b2), xv = mat_of(&x2), rv = vec_of(res), sview = vec_of(sv);
  if (bv.rows != m)
    return TPU_ERR(INVALID_ARGUMENT, "%s: input.size(-2) should match other.size(-2)", op);
  int64_t nrhs = bv.cols;
  int nb = x2.ndim - 2;
  int64_t nbatch = batch_count(nb, x2.sizes);
  bool want_res = has_elems(res), want_rank = has_elems(rk), want_sv = has_elems(sv);
  lsq_work_t w = {scratch(m * n), scratch(m * nrhs), scratch(n * nrhs), scratch(mx),
                  scratch(k), scratch(mx * k), scratch(k * k), scratch(m * n)};
  double* ax = scratch(m * nrhs);
  if (!w.a || !w.c || !w.x || !w.tau || !w.s || !w.u || !w.v || !w.w || !ax) st = OOM(op);
  for (int64_t b = 0; b < nbatch && !st; b++) {
    load_mat(&av, batch_offset(A, 2, nb, x2.sizes, b), false, w.a);
    load_mat(&bv, batch_offset(&b2, 2, nb, x2.sizes, b), false, w.c);
    for (int64_t i = 0; i < m * nrhs; i++) ax[i] = w.c[i];
    int64_t rank = 0;
    int info = k == 0 ? 0 : lsq_solve_one(drv, &w, m, n, nrhs, rcond, &rank);
    if (info) {
      st = TPU_ERR(INVALID_ARGUMENT,
                   "%s: The least squares solution could not be computed because the input "
                   "matrix does not have full rank (error code: %d).",
                   op, info);
      break;
    }
    if (k == 0)
      for (int64_t i = 0; i < n * nrhs; i++) w.x[i] = 0.0;
    store_mat(&xv, batch_offset(&x2, 2, nb, x2.sizes, b), false, w.x);
    if (want_res) {
      int64_t roff = batch_offset(res, 1, nb, x2.sizes, b);
      for (int64_t col = 0; col < nrhs; col++) {
        double r2 = 0.0;
        if (drv == LSQ_GELS) {
          for (int64_t i = n; i < m; i++) r2 += w.c[i * nrhs + col] * w.c[i * nrhs + col];
        } else {
          /* b is read back from ax: A x - b in double */
          for (int64_t i = 0; i < m; i++) {
            double e = -ax[i * nrhs + col];
            for (int64_t j = 0; j < n; j++) e += w.a[i * n + j] * w.x[j * nrhs + col];
            r2 += e * e;
          }
        }
        tpu_store_f64(elem_ptr(&rv, roff, col, 0), res->dtype, r2);
      }
    }
    if (want_rank) /* rank and singular values have A's batch shape */
      tpu_store_i64((char*)rk->data + batch_offset(rk, 0, nb, x2.sizes, b) *
                                          (int64_t)tpu_dtype_size(rk->dtype),
                    rk->dtype, rank);
    if (want_sv) {
      int64_t soff = batch_offset(sv, 1, nb, x2.sizes, b);
      for (int64_t j = 0; j < k; j++) tpu_store_f64(elem_ptr(&sview, soff, j, 0), sv->dtype, w.s[j]);
    }
  }
  free(w.a), free(w.c), free(w.x), free(w.tau), free(w.s), free(w.u), free(w.v), free(w.w);
  free(ax);
  return st;
}
