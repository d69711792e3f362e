/* Dense linear algebra kernels: LU (factor, solve, inverse, determinants,
 * unpacking), Cholesky (factor, inverse, solve), triangular solves, the
 * matrix exponential, Bunch-Kaufman LDL^T, Householder QR (linalg_qr, geqrf,
 * householder_product, ormqr), least squares, one-sided Jacobi SVD, cyclic
 * Jacobi symmetric eigendecomposition, and the 3-vector cross product.
 *
 * Every matrix kernel works on float32/float64 matrices batched over leading
 * dims; the families written once for a scalar type (linalg_lu.h: LU /
 * Cholesky / triangular / matrix exponential / LDL^T; linalg_qr.h: QR and
 * least squares) also on complex64/complex128, in double complex; the SVD and
 * eigh kernels hand complex matrices to zlinalg.c.
 * Each matrix is gathered into a row-major double buffer, factored there, and
 * written back through the output's strides (the bridge allocates outputs
 * with the meta kernel's strides, often column-major). Batch dims of inputs
 * broadcast against the output's batch shape (size-1 dims repeat).
 *
 * Conventions follow LAPACK as PyTorch's CPU kernels expose them: pivots are
 * 1-based int32 row interchanges (row j swapped with row piv[j]-1, in order),
 * info outputs are int32 (0 on success, k for a zero pivot U(k,k) or a
 * leading minor of order k that is not positive-definite), Householder
 * reflectors are H = I - tau v v^H with v[0] = 1 and beta = -sign(Re alpha) *
 * norm (so R's diagonal is real and may be negative, as from geqrf). Inputs
 * the factorization cannot take raise TPU_CODE_LINALG (LinAlgError).
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

static tpu_status_t check_same_dtype(const char* op, const tpu_tensor_t* a, const char* what,
                                     const tpu_tensor_t* b) {
  if (a->dtype == b->dtype) return NULL;
  return TPU_ERR(INVALID_ARGUMENT, "%s: expected %s to have dtype %s, got %s", op, what,
                 tpu_dtype_name(a->dtype), tpu_dtype_name(b->dtype));
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
  return TPU_ERR(LINALG,
                 "%s: The diagonal element %d is zero, the inversion could not be completed "
                 "because the input matrix is singular.",
                 op, info);
}

static tpu_status_t not_pd_error(const char* op, int info) {
  return TPU_ERR(LINALG,
                 "%s: The factorization could not be completed because the input is not "
                 "positive-definite (the leading minor of order %d is not positive-definite).",
                 op, info);
}

/* How a matrix is read or applied: transposed (MAT_T), conjugated (MAT_C),
 * or both (MAT_H, the adjoint). */
typedef enum mat_op { MAT_N = 0, MAT_T = 1, MAT_C = 2, MAT_H = 3 } mat_op_t;

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

/* How a least-squares problem is solved: the LAPACK driver named. */
typedef enum lsq_driver { LSQ_GELS, LSQ_GELSY, LSQ_GELSD, LSQ_GELSS } lsq_driver_t;

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

/* The LU / Cholesky / triangular / LDL^T family (linalg_lu.h) and the
 * Householder QR family with least squares (linalg_qr.h), one instance each
 * for real and complex matrices: the real instance keeps the plain names
 * (the spectral kernels below use its load_mat, store_mat and lower_from),
 * the complex one is z_-prefixed. */
#define LA(name) name
#define LA_T double
#define LA_LOAD(p, dt) tpu_load_f64(p, dt)
#define LA_STORE(p, dt, v) tpu_store_f64(p, dt, v)
#define LA_MUL(a, b) ((a) * (b))
#define LA_CONJ(x) (x)
#define LA_REAL(x) (x)
#define LA_IMAG(x) 0.0
#define LA_ABS(x) fabs(x)
#define LA_ABS2(x) ((x) * (x))
#define LA_ABS1(x) fabs(x)
#define LA_SGN(x) (double)(((x) > 0) - ((x) < 0))
#define LA_NAN NAN
#define LA_COMPLEX 0
#define LA_QUOT(x, d) ((x) / (d))
#define LA_SVD jacobi_svd
#include "linalg_lu.h"
#include "linalg_qr.h"

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
#define LA_IMAG(x) cimag(x)
#define LA_ABS(x) cabs(x)
#define LA_ABS2(x) (creal(x) * creal(x) + cimag(x) * cimag(x))
#define LA_ABS1(x) (fabs(creal(x)) + fabs(cimag(x)))
#define LA_SGN(x) (cabs(x) == 0.0 ? 0.0 : (x) / cabs(x))
#define LA_NAN CMPLX(NAN, NAN)
#define LA_COMPLEX 1
#define LA_QUOT(x, d) ((x) * (1.0 / (d)))
#define LA_SVD tpu_zjacobi_svd
#include "linalg_lu.h"
#include "linalg_qr.h"

/* The reflectors of the complex instance, for eig.c (linalg.h). */
zc_t tpu_zlarfg(zc_t* x, int64_t n, int64_t s) { return z_larfg(x, n, s); }

void tpu_zreflect_left(const zc_t* v, int64_t vs, int64_t len, zc_t tau, zc_t* c, int64_t ldc,
                       int64_t r0, int64_t c0, int64_t c1) {
  z_reflect_left(v, vs, len, tau, c, ldc, r0, c0, c1);
}

void tpu_zreflect_right(const zc_t* v, int64_t vs, int64_t len, zc_t tau, zc_t* c, int64_t ldc,
                        int64_t r0, int64_t q0, int64_t q1) {
  z_reflect_right(v, vs, len, tau, c, ldc, r0, q0, q1);
}

/* ---------------------------------------------- instance entry points */

/* The families' kernels: a call with a complex tensor runs the complex
 * instance of linalg_lu.h / linalg_qr.h, any other the real one. */
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
LA_ENTRY(linalg_qr)
LA_ENTRY(geqrf)
LA_ENTRY(linalg_householder_product)
LA_ENTRY(ormqr)
LA_ENTRY(linalg_lstsq)
#undef LA_ENTRY

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
