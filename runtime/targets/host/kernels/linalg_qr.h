/* The Householder family of linalg.c (linalg_qr, geqrf, householder_product,
 * ormqr) and least squares (linalg_lstsq), written once for a scalar type.
 * linalg.c includes this file right after linalg_lu.h, with the parameters
 * described there and these:
 *   LA_IMAG(x)       imaginary part (0 for reals)
 *   LA_QUOT(x, d)    a reflector entry x scaled by 1 / d (real: x / d;
 *                    complex: x times the reciprocal, as zlarfg scales)
 *   LA_SVD           the one-sided Jacobi SVD of the scalar type, with
 *                    jacobi_svd's contract (linalg.c; tpu_zjacobi_svd)
 * and it ends the instance: the parameters are undefined at its end.
 *
 * Reflectors are LAPACK's: H = I - tau v v^H with v[0] = 1, and H^H (alpha;
 * x) = (beta; 0) with beta real, -sign(Re alpha) * norm (so R's diagonal is
 * real and may be negative, as from geqrf). For reals tau is real and H
 * symmetric; for complex matrices tau is complex and QR applies H^H to the
 * trailing columns, so Q = H_0 H_1 ... H_{k-1} is CPU's (?geqrf / ?ungqr).
 */

/* ------------------------------------------------------------- reflectors */

/* Generates the reflector H with H^H x = (beta, 0, ...)^T, beta real, for the
 * n entries of x at stride s (LAPACK ?larfg): x[0] becomes beta, x[1..] v's
 * entries; returns tau (0 when x is already (real, 0, ...)). */
static LA_T LA(larfg)(LA_T* x, int64_t n, int64_t s) {
  LA_T alpha = x[0];
  double xnorm = 0.0;
  for (int64_t i = 1; i < n; i++) xnorm = hypot(xnorm, LA_ABS(x[i * s]));
  if (xnorm == 0.0 && LA_IMAG(alpha) == 0.0) return 0.0;
  double beta = -copysign(hypot(LA_ABS(alpha), xnorm), LA_REAL(alpha));
  LA_T tau = -(alpha - beta) / beta;
  for (int64_t i = 1; i < n; i++) x[i * s] = LA_QUOT(x[i * s], alpha - beta);
  x[0] = beta;
  return tau;
}

/* c = (I - tau v v^H) c on rows r0 .. r0+len-1 and columns [c0, c1) of the
 * row-major c (ldc columns); v[i] at v + i * vs, v[0] = 1 is not read. */
static void LA(reflect_left)(const LA_T* v, int64_t vs, int64_t len, LA_T tau, LA_T* c,
                             int64_t ldc, int64_t r0, int64_t c0, int64_t c1) {
  if (tau == 0.0) return;
  c += r0 * ldc;
  for (int64_t col = c0; col < c1; col++) {
    LA_T s = c[col];
    for (int64_t i = 1; i < len; i++) s += LA_CONJ(v[i * vs]) * c[i * ldc + col];
    s *= tau;
    c[col] -= s;
    for (int64_t i = 1; i < len; i++) c[i * ldc + col] -= s * v[i * vs];
  }
}

/* c = c (I - tau v v^H) on columns r0 .. r0+len-1 and rows [q0, q1). */
static void LA(reflect_right)(const LA_T* v, int64_t vs, int64_t len, LA_T tau, LA_T* c,
                              int64_t ldc, int64_t r0, int64_t q0, int64_t q1) {
  if (tau == 0.0) return;
  for (int64_t r = q0; r < q1; r++) {
    LA_T* row = c + r * ldc + r0;
    LA_T s = row[0];
    for (int64_t i = 1; i < len; i++) s += row[i] * v[i * vs];
    s *= tau;
    row[0] -= s;
    for (int64_t i = 1; i < len; i++) row[i] -= s * LA_CONJ(v[i * vs]);
  }
}

/* Householder QR of the m x n matrix a in place (geqrf's layout: R on and
 * above the diagonal, reflector j's v below it with v[j] = 1 implied);
 * tau[0..min(m,n)). */
static void LA(house_qr)(LA_T* a, int64_t m, int64_t n, LA_T* tau) {
  int64_t k = m < n ? m : n;
  for (int64_t j = 0; j < k; j++) {
    tau[j] = LA(larfg)(a + j * n + j, m - j, n);
    LA(reflect_left)(a + j * n + j, n, m - j, LA_CONJ(tau[j]), a, n, j, j + 1, n);
  }
}

/* Applies H_j (op: MAT_N) or H_j^H (MAT_H) of the reflectors stored below
 * the diagonal of the lda-column matrix a (m rows) to c: from the left to
 * its m rows (nc columns), or from the right to its m columns (nc rows). */
static void LA(apply_reflector)(const LA_T* a, int64_t lda, int64_t m, int64_t j, LA_T tau,
                                int op, bool left, LA_T* c, int64_t nc) {
  const LA_T* v = a + j * lda + j;
  LA_T t = op == MAT_H ? LA_CONJ(tau) : tau;
  if (left) LA(reflect_left)(v, lda, m - j, t, c, nc, j, 0, nc);
  else LA(reflect_right)(v, lda, m - j, t, c, m, j, 0, nc);
}

/* q (m x qc) = the first qc columns of H_0 H_1 ... H_{k-1} (reflectors from
 * a, lda columns). */
static void LA(form_q)(const LA_T* a, int64_t lda, int64_t m, const LA_T* tau, int64_t k, LA_T* q,
                       int64_t qc) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < qc; j++) q[i * qc + j] = i == j ? 1.0 : 0.0;
  for (int64_t j = k - 1; j >= 0; j--) LA(apply_reflector)(a, lda, m, j, tau[j], MAT_N, true, q, qc);
}

/* ------------------------------------------------------------ QR kernels */

/* linalg_qr(A, mode) -> (Q, R); mode "reduced", "complete" or "r" (Q empty). */
static tpu_status_t LA(k_linalg_qr)(const tpu_call_t* call) {
  const char* op = "linalg.qr";
  const tpu_tensor_t *A = tpu_arg_tensor(call, 0), *Q = &call->outs[0], *R = &call->outs[1];
  tpu_status_t st = check_matrix_of(op, A, false, LA_COMPLEX);
  if (st) return st;
  mat_view_t av = mat_of(A), qv = mat_of(Q), rv = mat_of(R);
  int64_t m = av.rows, n = av.cols, k = m < n ? m : n;
  bool want_q = has_elems(Q);
  int64_t qc = want_q ? qv.cols : 0;
  int nb = A->ndim - 2;
  int64_t nbatch = batch_count(nb, A->sizes);
  LA_T *a = LA(new_buf)(m * n), *tau = LA(new_buf)(k), *q = LA(new_buf)(m * qc);
  if (!a || !tau || !q) {
    free(a), free(tau), free(q);
    return OOM(op);
  }
  for (int64_t b = 0; b < nbatch; b++) {
    LA(load_mat)(&av, batch_offset(A, 2, nb, A->sizes, b), MAT_N, a);
    LA(house_qr)(a, m, n, tau);
    if (want_q) {
      LA(form_q)(a, n, m, tau, k, q, qc);
      LA(store_mat)(&qv, batch_offset(Q, 2, nb, A->sizes, b), MAT_N, q);
    }
    int64_t roff = batch_offset(R, 2, nb, A->sizes, b);
    for (int64_t i = 0; i < rv.rows; i++)
      for (int64_t j = 0; j < n; j++)
        LA_STORE(elem_ptr(&rv, roff, i, j), R->dtype, j >= i ? a[i * n + j] : 0.0);
  }
  free(a), free(tau), free(q);
  return NULL;
}

/* geqrf(self) -> (a, tau): the Householder QR in LAPACK's compact form. */
static tpu_status_t LA(k_geqrf)(const tpu_call_t* call) {
  const char* op = "geqrf";
  const tpu_tensor_t* A = tpu_arg_tensor(call, 0);
  const tpu_tensor_t *QR = &call->outs[0], *T = &call->outs[1];
  tpu_status_t st = check_matrix_of(op, A, false, LA_COMPLEX);
  if (st) return st;
  mat_view_t av = mat_of(A), qv = mat_of(QR), tv = vec_of(T);
  int64_t m = av.rows, n = av.cols, k = m < n ? m : n;
  int nb = A->ndim - 2;
  int64_t nbatch = batch_count(nb, A->sizes);
  LA_T *a = LA(new_buf)(m * n), *tau = LA(new_buf)(k);
  if (!a || !tau) {
    free(a), free(tau);
    return OOM(op);
  }
  for (int64_t b = 0; b < nbatch; b++) {
    LA(load_mat)(&av, batch_offset(A, 2, nb, A->sizes, b), MAT_N, a);
    LA(house_qr)(a, m, n, tau);
    LA(store_mat)(&qv, batch_offset(QR, 2, nb, A->sizes, b), MAT_N, a);
    int64_t toff = batch_offset(T, 1, nb, A->sizes, b);
    for (int64_t j = 0; j < k; j++) LA_STORE(elem_ptr(&tv, toff, j, 0), T->dtype, tau[j]);
  }
  free(a), free(tau);
  return NULL;
}

/* Loads the reflectors (m x n) and k taus of batch b. */
static void LA(load_reflectors)(const tpu_tensor_t* V, const tpu_tensor_t* T, int nb,
                                const int64_t* bsizes, int64_t b, LA_T* v, LA_T* tau, int64_t k) {
  mat_view_t vv = mat_of(V), tv = vec_of(T);
  LA(load_mat)(&vv, batch_offset(V, 2, nb, bsizes, b), MAT_N, v);
  int64_t toff = batch_offset(T, 1, nb, bsizes, b);
  for (int64_t j = 0; j < k; j++) tau[j] = LA_LOAD(elem_ptr(&tv, toff, j, 0), T->dtype);
}

/* linalg_householder_product(input, tau) -> out (m x n) */
static tpu_status_t LA(k_linalg_householder_product)(const tpu_call_t* call) {
  const char* op = "linalg.householder_product";
  const tpu_tensor_t *V = tpu_arg_tensor(call, 0), *T = tpu_arg_tensor(call, 1);
  const tpu_tensor_t* out = &call->outs[0];
  tpu_status_t st = check_matrix_of(op, V, false, LA_COMPLEX);
  if (!st) st = check_same_dtype(op, V, "tau", T);
  if (st) return st;
  mat_view_t vv = mat_of(V), ov = mat_of(out);
  int64_t m = vv.rows, n = vv.cols, k = T->ndim ? T->sizes[T->ndim - 1] : 1;
  if (k > n || n > m)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected m >= n >= k, got %lld, %lld, %lld", op,
                   (long long)m, (long long)n, (long long)k);
  int nb = out->ndim - 2;
  int64_t nbatch = batch_count(nb, out->sizes);
  LA_T *v = LA(new_buf)(m * n), *tau = LA(new_buf)(k), *q = LA(new_buf)(m * n);
  if (!v || !tau || !q) {
    free(v), free(tau), free(q);
    return OOM(op);
  }
  for (int64_t b = 0; b < nbatch; b++) {
    LA(load_reflectors)(V, T, nb, out->sizes, b, v, tau, k);
    LA(form_q)(v, n, m, tau, k, q, n);
    LA(store_mat)(&ov, batch_offset(out, 2, nb, out->sizes, b), MAT_N, q);
  }
  free(v), free(tau), free(q);
  return NULL;
}

/* ormqr(self=reflectors, input2=tau, input3=C, left, transpose) -> out:
 * op(Q) C (left) or C op(Q) with Q = H_0 ... H_{k-1}, op(Q) = Q^H with
 * `transpose`. */
static tpu_status_t LA(k_ormqr)(const tpu_call_t* call) {
  const char* op = "ormqr";
  const tpu_tensor_t *V = tpu_arg_tensor(call, 0), *T = tpu_arg_tensor(call, 1);
  const tpu_tensor_t *C = tpu_arg_tensor(call, 2), *out = &call->outs[0];
  tpu_status_t st = check_matrix_of(op, V, false, LA_COMPLEX);
  if (!st) st = check_same_dtype(op, V, "tau", T);
  if (!st) st = check_same_dtype(op, V, "other", C);
  if (!st) st = check_matrix_of(op, C, false, LA_COMPLEX);
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
  LA_T *v = LA(new_buf)(mv * nv), *tau = LA(new_buf)(k), *c = LA(new_buf)(mc * nc);
  if (!v || !tau || !c) {
    free(v), free(tau), free(c);
    return OOM(op);
  }
  /* Q C applies H_{k-1} first, Q^H C applies H_0^H first; from the right the
   * order flips. */
  bool ascending = left == trans;
  for (int64_t b = 0; b < nbatch; b++) {
    LA(load_reflectors)(V, T, nb, out->sizes, b, v, tau, k);
    LA(load_mat)(&cv, batch_offset(C, 2, nb, out->sizes, b), MAT_N, c);
    for (int64_t s = 0; s < k; s++) {
      int64_t j = ascending ? s : k - 1 - s;
      LA(apply_reflector)(v, nv, mv, j, tau[j], trans ? MAT_H : MAT_N, left, c, left ? nc : mc);
    }
    LA(store_mat)(&ov, batch_offset(out, 2, nb, out->sizes, b), MAT_N, c);
  }
  free(v), free(tau), free(c);
  return NULL;
}

/* --------------------------------------------------------- least squares */

/* Numerical rank of the m x n matrix a (destroyed) by Householder QR with
 * column pivoting (the column of largest remaining norm first, as gelsy's
 * factorization): the leading diagonal entries of R with |R(j,j)| > rcond *
 * |R(0,0)|. norms: n doubles. */
static int64_t LA(qrcp_rank)(LA_T* a, int64_t m, int64_t n, double rcond, double* norms) {
  int64_t k = m < n ? m : n, rank = 0;
  double r00 = 0.0;
  for (int64_t j = 0; j < k; j++) {
    int64_t best = j;
    for (int64_t c = j; c < n; c++) {
      double s = 0.0;
      for (int64_t i = j; i < m; i++) s = hypot(s, LA_ABS(a[i * n + c]));
      norms[c] = s;
      if (s > norms[best]) best = c;
    }
    if (best != j)
      for (int64_t i = 0; i < m; i++) {
        LA_T t = a[i * n + j];
        a[i * n + j] = a[i * n + best];
        a[i * n + best] = t;
      }
    LA_T tau = LA(larfg)(a + j * n + j, m - j, n);
    LA(reflect_left)(a + j * n + j, n, m - j, LA_CONJ(tau), a, n, j, j + 1, n);
    double rjj = LA_ABS(a[j * n + j]);
    if (j == 0) r00 = rjj;
    if (r00 == 0.0 || !(rjj > rcond * r00)) break;
    rank++;
  }
  return rank;
}

/* Scratch of one least-squares solve (m x n system, nrhs columns). */
typedef struct LA(lsq_work) {
  LA_T *a, *c, *x, *tau, *u, *v, *w;
  double *s, *norms;
} LA(lsq_work_t);

/* Solves min ||A X - C|| for one matrix: a (m x n), c (m x nrhs) row-major;
 * x (n x nrhs) receives the solution. gels: Householder QR (m >= n) or QR of
 * A^H (m < n, the minimum-norm solution), no rank test (an all-zero A gives
 * 0, as LAPACK's); returns the 1-based
 * index of an exactly zero diagonal entry of R (LAPACK's info), 0 if none, and
 * leaves in c rows n..m of Q^H C (the residual part). The others: the
 * minimum-norm solution through the SVD truncated at rank `*rank` (singular
 * values > rcond * s[0]; gelsy takes its rank from QR with column pivoting).
 * s receives the min(m, n) singular values. */
static int LA(lsq_solve_one)(lsq_driver_t drv, LA(lsq_work_t)* w, int64_t m, int64_t n,
                             int64_t nrhs, double rcond, int64_t* rank) {
  int64_t k = m < n ? m : n;
  LA_T *a = w->a, *c = w->c, *x = w->x;
  for (int64_t i = 0; i < n * nrhs; i++) x[i] = 0.0;
  if (drv == LSQ_GELS) {
    *rank = k;
    bool zero = true; /* LAPACK's gels: an all-zero A has the solution 0, residuals 0 */
    for (int64_t i = 0; i < m * n && zero; i++) zero = a[i] == 0.0;
    if (zero) {
      for (int64_t i = 0; i < m * nrhs; i++) c[i] = 0.0;
      return 0;
    }
    if (m >= n) {
      LA(house_qr)(a, m, n, w->tau);
      for (int64_t j = 0; j < k; j++) LA(apply_reflector)(a, n, m, j, w->tau[j], MAT_H, true, c, nrhs);
      for (int64_t j = 0; j < n; j++)
        if (a[j * n + j] == 0.0) return (int)(j + 1);
      for (int64_t i = 0; i < n * nrhs; i++) x[i] = c[i];
      LA(tri_solve)(a, n, x, nrhs, false, MAT_N, false); /* R: the top n x n block, stride n */
    } else {
      LA_T* at = w->w; /* A^H = Q R (n x m); A = R^H Q^H */
      for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) at[j * m + i] = LA_CONJ(a[i * n + j]);
      LA(house_qr)(at, n, m, w->tau);
      for (int64_t j = 0; j < m; j++)
        if (at[j * m + j] == 0.0) return (int)(j + 1);
      for (int64_t i = 0; i < m * nrhs; i++) x[i] = c[i];
      LA(tri_solve)(at, m, x, nrhs, false, MAT_H, false); /* R^H z = C */
      for (int64_t j = k - 1; j >= 0; j--) LA(apply_reflector)(at, m, n, j, w->tau[j], MAT_N, true, x, nrhs);
    }
    return 0;
  }
  /* SVD: A = P diag(s) Q^H with P m x k, Q n x k (row-major). */
  bool wide = m < n;
  int64_t M = wide ? n : m, N = k;
  LA_T *p, *q;
  if (!wide) {
    for (int64_t i = 0; i < m * n; i++) w->w[i] = a[i];
    LA_SVD(w->w, M, N, w->s, w->u, N, w->v);
    p = w->u, q = w->v; /* u: m x k, v: n x k (k = n) */
  } else {
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) w->w[j * m + i] = LA_CONJ(a[i * n + j]);
    LA_SVD(w->w, M, N, w->s, w->u, N, w->v);
    p = w->v, q = w->u; /* A^H = u s v^H: P = v (m x k), Q = u (n x k) */
  }
  double* s = w->s;
  if (drv == LSQ_GELSY) {
    for (int64_t i = 0; i < m * n; i++) w->w[i] = a[i];
    *rank = LA(qrcp_rank)(w->w, m, n, rcond, w->norms);
  } else {
    int64_t r = 0;
    while (r < k && s[0] > 0.0 && s[r] > rcond * s[0]) r++;
    *rank = r;
  }
  for (int64_t j = 0; j < *rank; j++)
    for (int64_t col = 0; col < nrhs; col++) {
      LA_T d = 0.0;
      for (int64_t i = 0; i < m; i++) d += LA_CONJ(p[i * k + j]) * c[i * nrhs + col];
      d /= s[j];
      for (int64_t i = 0; i < n; i++) x[i * nrhs + col] += q[i * k + j] * d;
    }
  return 0;
}

/* linalg_lstsq(self, b, rcond, *, driver) -> (solution, residuals, rank,
 * singular_values). Outputs the meta kernel sized empty are not written:
 * residuals exist for m > n and drivers other than gelsy, rank for every
 * driver but gels, singular values for gelsd and gelss. Residuals are the
 * squared norms of the columns of A X - B (gels: of rows n..m of Q^H B, as
 * LAPACK leaves them), in the real dtype. */
static tpu_status_t LA(k_linalg_lstsq)(const tpu_call_t* call) {
  const char* op = "linalg.lstsq";
  const tpu_tensor_t *A = tpu_arg_tensor(call, 0), *B = tpu_arg_tensor(call, 1);
  tpu_status_t st = check_matrix_of(op, A, false, LA_COMPLEX);
  if (!st) st = check_same_dtype(op, A, "other", B);
  if (st) return st;
  lsq_driver_t drv = LSQ_GELSY;
  st = lsq_driver(op, tpu_arg_str(call, 3, "gelsy"), &drv);
  if (st) return st;
  mat_view_t av = mat_of(A);
  int64_t m = av.rows, n = av.cols, k = m < n ? m : n, mx = m > n ? m : n;
  bool single = A->dtype == TPU_F32 || A->dtype == TPU_C64;
  double eps = single ? (double)FLT_EPSILON : DBL_EPSILON;
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
  LA(lsq_work_t) w = {LA(new_buf)(m * n), LA(new_buf)(m * nrhs), LA(new_buf)(n * nrhs),
                      LA(new_buf)(mx),    LA(new_buf)(mx * k),  LA(new_buf)(k * k),
                      LA(new_buf)(m * n), scratch(k),           scratch(n)};
  LA_T* bc = LA(new_buf)(m * nrhs);
  if (!w.a || !w.c || !w.x || !w.tau || !w.u || !w.v || !w.w || !w.s || !w.norms || !bc)
    st = OOM(op);
  for (int64_t b = 0; b < nbatch && !st; b++) {
    LA(load_mat)(&av, batch_offset(A, 2, nb, x2.sizes, b), MAT_N, w.a);
    LA(load_mat)(&bv, batch_offset(&b2, 2, nb, x2.sizes, b), MAT_N, w.c);
    for (int64_t i = 0; i < m * nrhs; i++) bc[i] = w.c[i];
    int64_t rank = 0;
    int info = k == 0 ? 0 : LA(lsq_solve_one)(drv, &w, m, n, nrhs, rcond, &rank);
    if (info) {
      st = TPU_ERR(LINALG,
                   "%s: The least squares solution could not be computed because the input "
                   "matrix does not have full rank (error code: %d).",
                   op, info);
      break;
    }
    if (k == 0)
      for (int64_t i = 0; i < n * nrhs; i++) w.x[i] = 0.0;
    LA(store_mat)(&xv, batch_offset(&x2, 2, nb, x2.sizes, b), MAT_N, w.x);
    if (want_res) {
      int64_t roff = batch_offset(res, 1, nb, x2.sizes, b);
      for (int64_t col = 0; col < nrhs; col++) {
        double r2 = 0.0;
        if (drv == LSQ_GELS) {
          for (int64_t i = n; i < m; i++) r2 += LA_ABS2(w.c[i * nrhs + col]);
        } else {
          /* b is read back from bc: A x - b in double */
          for (int64_t i = 0; i < m; i++) {
            LA_T e = -bc[i * nrhs + col];
            for (int64_t j = 0; j < n; j++) e += w.a[i * n + j] * w.x[j * nrhs + col];
            r2 += LA_ABS2(e);
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
  free(w.a), free(w.c), free(w.x), free(w.tau), free(w.u), free(w.v), free(w.w), free(w.s);
  free(w.norms), free(bc);
  return st;
}

/* The parameters end with the instance. */
#undef LA
#undef LA_T
#undef LA_LOAD
#undef LA_STORE
#undef LA_MUL
#undef LA_CONJ
#undef LA_REAL
#undef LA_IMAG
#undef LA_ABS
#undef LA_ABS2
#undef LA_ABS1
#undef LA_SGN
#undef LA_NAN
#undef LA_COMPLEX
#undef LA_QUOT
#undef LA_SVD
