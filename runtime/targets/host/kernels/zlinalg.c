/* Complex dense linear algebra: one-sided Jacobi SVD and Hermitian Jacobi
 * eigendecomposition of complex64/complex128 matrices (the QR family and
 * least squares are linalg_qr.h's complex instance in linalg.c).
 *
 * The SVD and eigh kernels of linalg.c hand calls with complex inputs here;
 * everything computes in double complex on row-major copies (linalg.h) and
 * rounds once on store.
 *
 * Phases of singular and eigen vectors: LAPACK reduces a complex matrix to
 * a real bidiagonal / tridiagonal one by reflectors that leave one row of the
 * small factor real (zgesdd: the first row of V for tall matrices, of U for
 * wide ones; zheevd: the first row of the eigenvectors with UPLO="L", the
 * last with "U"). The Jacobi kernels rotate each vector so that this entry is
 * real and non-negative, which gives CPU's vectors up to a sign (the sign
 * depends on the real bidiagonal / tridiagonal solver's path).
 */
#include <float.h>
#include <stdatomic.h>

#include "linalg.h"
#include "tpu/parallel.h"

static double zabs2(zc_t z) { return creal(z) * creal(z) + cimag(z) * cimag(z); }

static tpu_status_t check_complex_matrix(const char* op, const tpu_tensor_t* t, bool square) {
  if (!tpu_dtype_is_complex(t->dtype))
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected a complex tensor, got %s", op,
                   tpu_dtype_name(t->dtype));
  if (t->ndim < 2)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected a tensor with 2 or more dimensions, got %d",
                   op, (int)t->ndim);
  if (square && t->sizes[t->ndim - 1] != t->sizes[t->ndim - 2])
    return TPU_ERR(INVALID_ARGUMENT, "%s: A must be batches of square matrices, got %lld by %lld",
                   op, (long long)t->sizes[t->ndim - 2], (long long)t->sizes[t->ndim - 1]);
  return NULL;
}

/* ------------------------------------------------------- spectral helpers */

/* Multiplies column j of the r x ld row-major matrix x by s. */
static void zscale_column(zc_t* x, int64_t r, int64_t ld, int64_t j, zc_t s) {
  for (int64_t i = 0; i < r; i++) x[i * ld + j] *= s;
}

/* Multiplies column j of v (n x n) by the unit phase that makes its entry
 * `anchor` real and non-negative (when that entry is 0: its largest entry
 * real and positive), and column j of w (wr rows, n columns) with it when w
 * is not NULL. */
static void turn_column(zc_t* v, int64_t n, int64_t j, int64_t anchor, zc_t* w, int64_t wr) {
  int64_t at = anchor;
  if (v[anchor * n + j] == 0.0)
    for (int64_t i = 0; i < n; i++)
      if (zabs2(v[i * n + j]) > zabs2(v[at * n + j])) at = i;
  double r = cabs(v[at * n + j]);
  if (r == 0.0) return;
  zc_t ph = conj(v[at * n + j]) / r;
  zscale_column(v, n, n, j, ph);
  v[at * n + j] = creal(v[at * n + j]);
  if (w) zscale_column(w, wr, n, j, ph);
}

/* Swaps columns a and b of the r x ld row-major matrix x. */
static void zswap_columns(zc_t* x, int64_t r, int64_t ld, int64_t a, int64_t b) {
  for (int64_t i = 0; i < r; i++) {
    zc_t t = x[i * ld + a];
    x[i * ld + a] = x[i * ld + b];
    x[i * ld + b] = t;
  }
}

/* Fills column j of the m x ld row-major matrix u with a unit vector
 * orthogonal to its columns listed in `done`: the standard basis vector with
 * the largest residual, orthogonalized twice. */
static void zcomplete_column(zc_t* u, int64_t m, int64_t ld, int64_t j, const int64_t* done,
                             int64_t ndone, zc_t* tmp) {
  double best = -1.0;
  int64_t best_e = 0;
  for (int64_t e = 0; e < m; e++) {
    double r = 1.0; /* |e - sum_c u_c conj(u_c[e])|^2 = 1 - sum_c |u_c[e]|^2 */
    for (int64_t c = 0; c < ndone; c++) r -= zabs2(u[e * ld + done[c]]);
    if (r > best) best = r, best_e = e;
  }
  for (int64_t i = 0; i < m; i++) tmp[i] = i == best_e ? 1.0 : 0.0;
  for (int pass = 0; pass < 2; pass++)
    for (int64_t c = 0; c < ndone; c++) {
      zc_t d = 0.0;
      for (int64_t i = 0; i < m; i++) d += conj(u[i * ld + done[c]]) * tmp[i];
      for (int64_t i = 0; i < m; i++) tmp[i] -= d * u[i * ld + done[c]];
    }
  double nrm = 0.0;
  for (int64_t i = 0; i < m; i++) nrm = hypot(nrm, cabs(tmp[i]));
  for (int64_t i = 0; i < m; i++) u[i * ld + j] = tmp[i] / nrm;
}

/* (linalg.h) Each rotation first turns column q by the phase of w_p^H w_q,
 * then rotates as in the real case. */
void tpu_zjacobi_svd(zc_t* w, int64_t m, int64_t n, double* s, zc_t* u, int64_t uc, zc_t* v) {
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < n; j++) v[i * n + j] = i == j ? 1.0 : 0.0;
  for (int sweep = 0; sweep < 80; sweep++) {
    bool rotated = false;
    for (int64_t p = 0; p + 1 < n; p++)
      for (int64_t q = p + 1; q < n; q++) {
        double alpha = 0.0, beta = 0.0;
        zc_t gamma = 0.0;
        for (int64_t i = 0; i < m; i++) {
          alpha += zabs2(w[i * n + p]);
          beta += zabs2(w[i * n + q]);
          gamma += conj(w[i * n + p]) * w[i * n + q];
        }
        double g = cabs(gamma);
        if (g == 0.0 || g <= 4 * DBL_EPSILON * sqrt(alpha * beta)) continue;
        rotated = true;
        zc_t ph = conj(gamma) / g;
        double zeta = (beta - alpha) / (2.0 * g);
        double t = (zeta >= 0 ? 1.0 : -1.0) / (fabs(zeta) + sqrt(1.0 + zeta * zeta));
        double c = 1.0 / sqrt(1.0 + t * t), sn = c * t;
        for (int64_t i = 0; i < m; i++) {
          zc_t wp = w[i * n + p], wq = w[i * n + q] * ph;
          w[i * n + p] = c * wp - sn * wq;
          w[i * n + q] = sn * wp + c * wq;
        }
        for (int64_t i = 0; i < n; i++) {
          zc_t vp = v[i * n + p], vq = v[i * n + q] * ph;
          v[i * n + p] = c * vp - sn * vq;
          v[i * n + q] = sn * vp + c * vq;
        }
      }
    if (!rotated) break;
  }
  for (int64_t j = 0; j < n; j++) {
    double nrm = 0.0;
    for (int64_t i = 0; i < m; i++) nrm = hypot(nrm, cabs(w[i * n + j]));
    s[j] = nrm;
  }
  for (int64_t j = 0; j < n; j++) { /* selection sort, descending */
    int64_t b = j;
    for (int64_t c = j + 1; c < n; c++)
      if (s[c] > s[b]) b = c;
    if (b == j) continue;
    double t = s[j];
    s[j] = s[b], s[b] = t;
    zswap_columns(w, m, n, j, b);
    zswap_columns(v, n, n, j, b);
  }
  if (!u) return;
  for (int64_t j = 0; j < n; j++) turn_column(v, n, j, 0, w, m);
  double tiny = (s[0] > 0 ? s[0] : 1.0) * DBL_EPSILON * (double)(m > n ? m : n);
  int64_t* done = (int64_t*)malloc(sizeof(int64_t) * (size_t)(uc > 0 ? uc : 1));
  zc_t* tmp = zscratch(m);
  int64_t ndone = 0;
  for (int64_t j = 0; j < n; j++)
    if (s[j] > tiny) {
      for (int64_t i = 0; i < m; i++) u[i * uc + j] = w[i * n + j] / s[j];
      done[ndone++] = j;
    }
  for (int64_t j = 0; j < uc; j++)
    if (j >= n || !(s[j] > tiny)) {
      zcomplete_column(u, m, uc, j, done, ndone, tmp);
      done[ndone++] = j;
    }
  free(done);
  free(tmp);
}

/* Cyclic Jacobi eigendecomposition of the Hermitian n x n matrix a (full,
 * destroyed): eigenvalues ascending in w, eigenvectors as columns of v (NULL
 * for values only), each with entry `anchor` real and non-negative. A
 * rotation of (p, q) first turns q by the phase of a_pq, making the pair's
 * block real symmetric, then rotates as in the real case. */
static void zjacobi_eigh(zc_t* a, int64_t n, double* w, zc_t* v, int64_t anchor) {
  if (v)
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < n; j++) v[i * n + j] = i == j ? 1.0 : 0.0;
  for (int sweep = 0; sweep < 100; sweep++) {
    double off = 0.0, tot = 0.0;
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < n; j++) {
        double x = zabs2(a[i * n + j]);
        tot += x;
        if (i != j) off += x;
      }
    if (off <= DBL_EPSILON * DBL_EPSILON * tot * 1e-2 || off == 0.0) break;
    for (int64_t p = 0; p + 1 < n; p++)
      for (int64_t q = p + 1; q < n; q++) {
        zc_t apq = a[p * n + q];
        double r = cabs(apq);
        if (r == 0.0) continue;
        zc_t e = apq / r, ec = conj(e);
        double theta = (creal(a[q * n + q]) - creal(a[p * n + p])) / (2.0 * r);
        double t = (theta >= 0 ? 1.0 : -1.0) / (fabs(theta) + sqrt(theta * theta + 1.0));
        double c = 1.0 / sqrt(t * t + 1.0), s = t * c;
        /* U = diag(1, conj(e)) R: columns p = (c, -s conj(e)), q = (s, c conj(e)). */
        for (int64_t k = 0; k < n; k++) {
          zc_t akp = a[k * n + p], akq = a[k * n + q] * ec;
          a[k * n + p] = c * akp - s * akq;
          a[k * n + q] = s * akp + c * akq;
        }
        for (int64_t k = 0; k < n; k++) {
          zc_t apk = a[p * n + k], aqk = a[q * n + k] * e;
          a[p * n + k] = c * apk - s * aqk;
          a[q * n + k] = s * apk + c * aqk;
        }
        if (v)
          for (int64_t k = 0; k < n; k++) {
            zc_t vkp = v[k * n + p], vkq = v[k * n + q] * ec;
            v[k * n + p] = c * vkp - s * vkq;
            v[k * n + q] = s * vkp + c * vkq;
          }
      }
  }
  for (int64_t i = 0; i < n; i++) w[i] = creal(a[i * n + i]);
  for (int64_t j = 0; j < n; j++) { /* selection sort, ascending */
    int64_t b = j;
    for (int64_t c = j + 1; c < n; c++)
      if (w[c] < w[b]) b = c;
    if (b == j) continue;
    double t = w[j];
    w[j] = w[b], w[b] = t;
    if (v) zswap_columns(v, n, n, j, b);
  }
  if (v)
    for (int64_t j = 0; j < n; j++) turn_column(v, n, j, anchor, NULL, 0);
}

/* ------------------------------------------------------- spectral kernels */

/* Matrices of a batch run in parallel; each range has its own scratch. */
typedef struct zspectral_ctx {
  const tpu_call_t* call;
  const tpu_tensor_t* A;
  int nb;
  bool flag;         /* svd: compute U/Vh; eigh: read the upper triangle */
  int64_t tall_cols; /* svd: columns of the tall factor */
  _Atomic int oom;
} zspectral_ctx_t;

static void zsvd_range(void* vctx, int64_t begin, int64_t end) {
  zspectral_ctx_t* cx = (zspectral_ctx_t*)vctx;
  const tpu_tensor_t *A = cx->A, *U = &cx->call->outs[0], *S = &cx->call->outs[1];
  const tpu_tensor_t* Vh = &cx->call->outs[2];
  mat_view_t av = mat_of(A), uo = mat_of(U), so = vec_of(S), vo = mat_of(Vh);
  /* Wide matrices: the SVD of A^H = V S U^H gives A's with roles swapped. */
  bool wide = av.rows < av.cols, uv = cx->flag;
  int64_t M = wide ? av.cols : av.rows, N = wide ? av.rows : av.cols, tc = cx->tall_cols;
  zc_t *w = zscratch(M * N), *u = zscratch(M * tc), *v = zscratch(N * N);
  double* s = scratch(N);
  if (!w || !s || !u || !v) cx->oom = 1;
  for (int64_t b = begin; b < end && !cx->oom; b++) {
    zload_mat(&av, batch_offset(A, 2, cx->nb, A->sizes, b), wide, w);
    tpu_zjacobi_svd(w, M, N, s, uv ? u : NULL, tc, v);
    int64_t soff = batch_offset(S, 1, cx->nb, A->sizes, b);
    for (int64_t j = 0; j < N; j++) tpu_store_f64(elem_ptr(&so, soff, j, 0), S->dtype, s[j]);
    if (!uv) continue;
    int64_t uoff = batch_offset(U, 2, cx->nb, A->sizes, b);
    int64_t voff = batch_offset(Vh, 2, cx->nb, A->sizes, b);
    /* Tall: U = u, Vh = v^H. Wide (A = v s u^H): U = v, Vh = u^H. */
    zstore_mat(&uo, uoff, false, wide ? v : u);
    zstore_mat(&vo, voff, true, wide ? u : v);
  }
  free(w), free(s), free(u), free(v);
}

tpu_status_t tpu_zk_linalg_svd(const tpu_call_t* call) {
  const char* op = "linalg.svd";
  const tpu_tensor_t* A = tpu_arg_tensor(call, 0);
  tpu_status_t st = check_complex_matrix(op, A, false);
  if (st) return st;
  zspectral_ctx_t cx = {call, A, A->ndim - 2,
                        has_elems(&call->outs[0]) || has_elems(&call->outs[2]), 0, 0};
  if (cx.flag) { /* N (reduced) or M (full) columns */
    bool wide = A->sizes[A->ndim - 2] < A->sizes[A->ndim - 1];
    cx.tall_cols = wide ? mat_of(&call->outs[2]).rows : mat_of(&call->outs[0]).cols;
  }
  tpu_parallel_for(batch_count(cx.nb, A->sizes), 1, zsvd_range, &cx);
  return cx.oom ? OOM(op) : NULL;
}

static void zeigh_range(void* vctx, int64_t begin, int64_t end) {
  zspectral_ctx_t* cx = (zspectral_ctx_t*)vctx;
  const tpu_tensor_t *A = cx->A, *W = &cx->call->outs[0], *V = &cx->call->outs[1];
  bool want_v = has_elems(V), upper = cx->flag;
  mat_view_t av = mat_of(A), wo = vec_of(W), vo = mat_of(V);
  int64_t n = av.rows;
  zc_t *a = zscratch(n * n), *v = zscratch(n * n);
  double* w = scratch(n);
  if (!a || !w || !v) cx->oom = 1;
  for (int64_t b = begin; b < end && !cx->oom; b++) {
    zload_mat(&av, batch_offset(A, 2, cx->nb, A->sizes, b), false, a);
    /* The matrix is read from one triangle; its diagonal's imaginary part is
     * ignored, as LAPACK does. */
    for (int64_t i = 0; i < n; i++) {
      a[i * n + i] = creal(a[i * n + i]);
      for (int64_t j = i + 1; j < n; j++) {
        if (upper) a[j * n + i] = conj(a[i * n + j]);
        else a[i * n + j] = conj(a[j * n + i]);
      }
    }
    zjacobi_eigh(a, n, w, want_v ? v : NULL, upper ? n - 1 : 0);
    int64_t woff = batch_offset(W, 1, cx->nb, A->sizes, b);
    for (int64_t j = 0; j < n; j++) tpu_store_f64(elem_ptr(&wo, woff, j, 0), W->dtype, w[j]);
    if (want_v) zstore_mat(&vo, batch_offset(V, 2, cx->nb, A->sizes, b), false, v);
  }
  free(a), free(w), free(v);
}

tpu_status_t tpu_zk_linalg_eigh(const tpu_call_t* call) {
  const char* op = "linalg.eigh";
  const tpu_tensor_t* A = tpu_arg_tensor(call, 0);
  tpu_status_t st = check_complex_matrix(op, A, true);
  if (st) return st;
  const char* uplo = tpu_arg_str(call, 1, "L");
  bool upper = uplo[0] == 'U' || uplo[0] == 'u';
  if (!upper && uplo[0] != 'L' && uplo[0] != 'l')
    return TPU_ERR(INVALID_ARGUMENT, "%s: UPLO must be 'L' or 'U', got '%s'", op, uplo);
  zspectral_ctx_t cx = {call, A, A->ndim - 2, upper, 0, 0};
  tpu_parallel_for(batch_count(cx.nb, A->sizes), 1, zeigh_range, &cx);
  return cx.oom ? OOM(op) : NULL;
}
