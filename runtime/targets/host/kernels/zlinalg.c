/* Complex dense linear algebra: Householder QR (linalg_qr, geqrf,
 * householder_product, ormqr), one-sided Jacobi SVD and Hermitian Jacobi
 * eigendecomposition of complex64/complex128 matrices.
 *
 * The kernels of linalg.c hand calls with complex inputs here; everything
 * computes in double complex on row-major copies (linalg.h) and rounds once
 * on store.
 *
 * Reflectors are LAPACK's complex ones (zlarfg): H = I - tau v v^H with
 * v[0] = 1, tau complex, and H^H (alpha; x) = (beta; 0) with beta real,
 * -sign(Re alpha) * norm. QR applies H^H to the trailing columns, so R's
 * diagonal is real and Q = H_0 H_1 ... H_{k-1} is CPU's (zgeqrf/zungqr).
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

/* ------------------------------------------------------------- reflectors */

zc_t tpu_zlarfg(zc_t* x, int64_t n, int64_t s) {
  zc_t alpha = x[0];
  double xnorm = 0.0;
  for (int64_t i = 1; i < n; i++) xnorm = hypot(xnorm, cabs(x[i * s]));
  if (xnorm == 0.0 && cimag(alpha) == 0.0) return 0.0;
  double ar = creal(alpha), ai = cimag(alpha);
  double beta = -copysign(hypot(hypot(ar, ai), xnorm), ar);
  zc_t tau = CMPLX((beta - ar) / beta, -ai / beta);
  zc_t scal = 1.0 / (alpha - beta);
  for (int64_t i = 1; i < n; i++) x[i * s] *= scal;
  x[0] = beta;
  return tau;
}

void tpu_zreflect_left(const zc_t* v, int64_t vs, int64_t len, zc_t tau, zc_t* c, int64_t ldc,
                       int64_t r0, int64_t c0, int64_t c1) {
  if (tau == 0.0) return;
  c += r0 * ldc;
  for (int64_t col = c0; col < c1; col++) {
    zc_t s = c[col];
    for (int64_t i = 1; i < len; i++) s += conj(v[i * vs]) * c[i * ldc + col];
    s *= tau;
    c[col] -= s;
    for (int64_t i = 1; i < len; i++) c[i * ldc + col] -= s * v[i * vs];
  }
}

void tpu_zreflect_right(const zc_t* v, int64_t vs, int64_t len, zc_t tau, zc_t* c, int64_t ldc,
                        int64_t r0, int64_t q0, int64_t q1) {
  if (tau == 0.0) return;
  for (int64_t r = q0; r < q1; r++) {
    zc_t* row = c + r * ldc + r0;
    zc_t s = row[0];
    for (int64_t i = 1; i < len; i++) s += row[i] * v[i * vs];
    s *= tau;
    row[0] -= s;
    for (int64_t i = 1; i < len; i++) row[i] -= s * conj(v[i * vs]);
  }
}

/* Householder QR of the m x n matrix a in place (zgeqrf's layout: R on and
 * above the diagonal, reflector j's v below it); tau[0..min(m,n)). */
static void zhouse_qr(zc_t* a, int64_t m, int64_t n, zc_t* tau) {
  int64_t k = m < n ? m : n;
  for (int64_t j = 0; j < k; j++) {
    tau[j] = tpu_zlarfg(a + j * n + j, m - j, n);
    tpu_zreflect_left(a + j * n + j, n, m - j, conj(tau[j]), a, n, j, j + 1, n);
  }
}

/* q (m x qc) = the first qc columns of H_0 H_1 ... H_{k-1}. */
static void zform_q(const zc_t* a, int64_t lda, int64_t m, const zc_t* tau, int64_t k, zc_t* q,
                    int64_t qc) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < qc; j++) q[i * qc + j] = i == j ? 1.0 : 0.0;
  for (int64_t j = k - 1; j >= 0; j--)
    tpu_zreflect_left(a + j * lda + j, lda, m - j, tau[j], q, qc, j, 0, qc);
}

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

static tpu_status_t check_same_dtype(const char* op, const tpu_tensor_t* a, const char* what,
                                     const tpu_tensor_t* b) {
  if (a->dtype == b->dtype) return NULL;
  return TPU_ERR(INVALID_ARGUMENT, "%s: expected %s to have dtype %s, got %s", op, what,
                 tpu_dtype_name(a->dtype), tpu_dtype_name(b->dtype));
}

/* ------------------------------------------------------------ QR kernels */

tpu_status_t tpu_zk_linalg_qr(const tpu_call_t* call) {
  const char* op = "linalg.qr";
  const tpu_tensor_t *A = tpu_arg_tensor(call, 0), *Q = &call->outs[0], *R = &call->outs[1];
  tpu_status_t st = check_complex_matrix(op, A, false);
  if (st) return st;
  mat_view_t av = mat_of(A), qv = mat_of(Q), rv = mat_of(R);
  int64_t m = av.rows, n = av.cols, k = m < n ? m : n;
  bool want_q = has_elems(Q);
  int64_t qc = want_q ? qv.cols : 0;
  int nb = A->ndim - 2;
  int64_t nbatch = batch_count(nb, A->sizes);
  zc_t *a = zscratch(m * n), *tau = zscratch(k), *q = zscratch(m * qc);
  if (!a || !tau || !q) {
    free(a), free(tau), free(q);
    return OOM(op);
  }
  for (int64_t b = 0; b < nbatch; b++) {
    zload_mat(&av, batch_offset(A, 2, nb, A->sizes, b), false, a);
    zhouse_qr(a, m, n, tau);
    if (want_q) {
      zform_q(a, n, m, tau, k, q, qc);
      zstore_mat(&qv, batch_offset(Q, 2, nb, A->sizes, b), false, q);
    }
    int64_t roff = batch_offset(R, 2, nb, A->sizes, b);
    for (int64_t i = 0; i < rv.rows; i++)
      for (int64_t j = 0; j < n; j++)
        tpu_store_z((char*)elem_ptr(&rv, roff, i, j), R->dtype, j >= i ? a[i * n + j] : 0.0);
  }
  free(a), free(tau), free(q);
  return NULL;
}

tpu_status_t tpu_zk_geqrf(const tpu_call_t* call) {
  const char* op = "geqrf";
  const tpu_tensor_t* A = tpu_arg_tensor(call, 0);
  const tpu_tensor_t *QR = &call->outs[0], *T = &call->outs[1];
  tpu_status_t st = check_complex_matrix(op, A, false);
  if (st) return st;
  mat_view_t av = mat_of(A), qv = mat_of(QR), tv = vec_of(T);
  int64_t m = av.rows, n = av.cols, k = m < n ? m : n;
  int nb = A->ndim - 2;
  int64_t nbatch = batch_count(nb, A->sizes);
  zc_t *a = zscratch(m * n), *tau = zscratch(k);
  if (!a || !tau) {
    free(a), free(tau);
    return OOM(op);
  }
  for (int64_t b = 0; b < nbatch; b++) {
    zload_mat(&av, batch_offset(A, 2, nb, A->sizes, b), false, a);
    zhouse_qr(a, m, n, tau);
    zstore_mat(&qv, batch_offset(QR, 2, nb, A->sizes, b), false, a);
    int64_t toff = batch_offset(T, 1, nb, A->sizes, b);
    for (int64_t j = 0; j < k; j++) tpu_store_z((char*)elem_ptr(&tv, toff, j, 0), T->dtype, tau[j]);
  }
  free(a), free(tau);
  return NULL;
}

/* Loads the reflectors (m x n) and k taus of batch b. */
static void zload_reflectors(const tpu_tensor_t* V, const tpu_tensor_t* T, int nb,
                             const int64_t* bsizes, int64_t b, zc_t* v, zc_t* tau, int64_t k) {
  mat_view_t vv = mat_of(V), tv = vec_of(T);
  zload_mat(&vv, batch_offset(V, 2, nb, bsizes, b), false, v);
  int64_t toff = batch_offset(T, 1, nb, bsizes, b);
  for (int64_t j = 0; j < k; j++) tau[j] = tpu_load_z((const char*)elem_ptr(&tv, toff, j, 0), T->dtype);
}

tpu_status_t tpu_zk_linalg_householder_product(const tpu_call_t* call) {
  const char* op = "linalg.householder_product";
  const tpu_tensor_t *V = tpu_arg_tensor(call, 0), *T = tpu_arg_tensor(call, 1);
  const tpu_tensor_t* out = &call->outs[0];
  tpu_status_t st = check_complex_matrix(op, V, false);
  if (!st) st = check_same_dtype(op, V, "tau", T);
  if (st) return st;
  mat_view_t vv = mat_of(V), ov = mat_of(out);
  int64_t m = vv.rows, n = vv.cols, k = T->ndim ? T->sizes[T->ndim - 1] : 1;
  if (k > n || n > m)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected m >= n >= k, got %lld, %lld, %lld", op,
                   (long long)m, (long long)n, (long long)k);
  int nb = out->ndim - 2;
  int64_t nbatch = batch_count(nb, out->sizes);
  zc_t *v = zscratch(m * n), *tau = zscratch(k), *q = zscratch(m * n);
  if (!v || !tau || !q) {
    free(v), free(tau), free(q);
    return OOM(op);
  }
  for (int64_t b = 0; b < nbatch; b++) {
    zload_reflectors(V, T, nb, out->sizes, b, v, tau, k);
    zform_q(v, n, m, tau, k, q, n);
    zstore_mat(&ov, batch_offset(out, 2, nb, out->sizes, b), false, q);
  }
  free(v), free(tau), free(q);
  return NULL;
}

/* ormqr: op(Q) C or C op(Q), op(Q) = Q^H with `transpose`. */
tpu_status_t tpu_zk_ormqr(const tpu_call_t* call) {
  const char* op = "ormqr";
  const tpu_tensor_t *V = tpu_arg_tensor(call, 0), *T = tpu_arg_tensor(call, 1);
  const tpu_tensor_t *C = tpu_arg_tensor(call, 2), *out = &call->outs[0];
  tpu_status_t st = check_complex_matrix(op, V, false);
  if (!st) st = check_same_dtype(op, V, "tau", T);
  if (!st) st = check_same_dtype(op, V, "other", C);
  if (!st) st = check_complex_matrix(op, C, false);
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
  zc_t *v = zscratch(mv * nv), *tau = zscratch(k), *c = zscratch(mc * nc);
  if (!v || !tau || !c) {
    free(v), free(tau), free(c);
    return OOM(op);
  }
  /* Q C applies H_{k-1} first, Q^H C applies H_0^H first; from the right the
   * order flips. H^H has tau conjugated. */
  bool ascending = left == trans;
  for (int64_t b = 0; b < nbatch; b++) {
    zload_reflectors(V, T, nb, out->sizes, b, v, tau, k);
    zload_mat(&cv, batch_offset(C, 2, nb, out->sizes, b), false, c);
    for (int64_t s = 0; s < k; s++) {
      int64_t j = ascending ? s : k - 1 - s;
      zc_t t = trans ? conj(tau[j]) : tau[j];
      const zc_t* vj = v + j * nv + j;
      if (left) tpu_zreflect_left(vj, nv, mv - j, t, c, nc, j, 0, nc);
      else tpu_zreflect_right(vj, nv, mv - j, t, c, nc, j, 0, mc);
    }
    zstore_mat(&ov, batch_offset(out, 2, nb, out->sizes, b), false, c);
  }
  free(v), free(tau), free(c);
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

/* One-sided Jacobi SVD of the complex m x n matrix w (m >= n), destroyed:
 * s[0..n) descending, v (n x n, columns the right singular vectors, row 0
 * real and non-negative) and, when u is not NULL, u (m x uc, uc = n or m:
 * the extra columns complete a unitary basis). Each rotation first turns
 * column q by the phase of w_p^H w_q, then rotates as in the real case. */
static void zjacobi_svd(zc_t* w, int64_t m, int64_t n, double* s, zc_t* u, int64_t uc, zc_t* v) {
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
    zjacobi_svd(w, M, N, s, uv ? u : NULL, tc, v);
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
