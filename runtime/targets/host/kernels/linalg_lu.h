/* The LU / Cholesky / triangular-solve family of linalg.c (factor, solve,
 * inverse, determinants, unpacking, Cholesky factor/inverse/solve, triangular
 * solves, the matrix exponential), written once for a scalar type. linalg.c
 * includes this file twice, for real matrices (computed in double) and for
 * complex ones (computed in double complex), after defining:
 *   LA(name)         the instance's name for `name`
 *   LA_T             the scalar type
 *   LA_LOAD(p, dt)   LA_STORE(p, dt, v)   element access (widen, round once)
 *   LA_MUL(a, b)     product (complex: the textbook formula, as LAPACK's
 *                    Fortran compiles it, without C99's NaN recovery)
 *   LA_CONJ(x)       conjugate (the identity on reals)
 *   LA_REAL(x)       real part
 *   LA_ABS(x)        modulus; LA_ABS2(x) its square
 *   LA_ABS1(x)       |re| + |im|: the pivot size of LAPACK's i?amax
 *   LA_SGN(x)        torch.sgn: x / |x|, 0 for 0 (real: -1, 0 or 1; 0 for NaN)
 *   LA_NAN           NaN (complex: NaN in both parts)
 *   LA_COMPLEX       whether the instance's inputs are complex (0 or 1)
 * (linalg_qr.h, included right after this file, undefines them)
 * and the helpers of linalg.c: mat_view_t, mat_of, vec_of, elem_ptr,
 * batch_offset, batch_count, OOM, has_elems, unsqueeze_last, check_dtype,
 * check_matrix_of, load_pivots, info_error and not_pd_error.
 *
 * Matrices are gathered into row-major LA_T buffers. An `op` argument is a
 * set of mat_op_t flags: MAT_T transposes, MAT_C conjugates, MAT_H does both
 * (a real `bool trans` is MAT_N or MAT_T; solves take MAT_N, MAT_T or MAT_H,
 * triangular ones also MAT_C). The entry points LA(k_<op>) take
 * the kernel's call; linalg.c's tpu_k_<op> picks the instance by dtype.
 */

/* ------------------------------------------------------------------ access */

/* Gathers the r x c matrix at offset off into dst (row-major); with MAT_T
 * dst receives its c x r transpose, with MAT_C the conjugate. */
static void LA(load_mat)(const mat_view_t* v, int64_t off, int op, LA_T* dst) {
  for (int64_t i = 0; i < v->rows; i++)
    for (int64_t j = 0; j < v->cols; j++) {
      LA_T x = LA_LOAD(elem_ptr(v, off, i, j), v->t->dtype);
      if (op & MAT_C) x = LA_CONJ(x);
      if (op & MAT_T) dst[j * v->rows + i] = x;
      else dst[i * v->cols + j] = x;
    }
}

/* Scatters src (row-major v->rows x v->cols; with MAT_T its transpose
 * cols x rows; with MAT_C conjugated) into the matrix at offset off. */
static void LA(store_mat)(const mat_view_t* v, int64_t off, int op, const LA_T* src) {
  for (int64_t i = 0; i < v->rows; i++)
    for (int64_t j = 0; j < v->cols; j++) {
      LA_T x = (op & MAT_T) ? src[j * v->rows + i] : src[i * v->cols + j];
      LA_STORE(elem_ptr(v, off, i, j), v->t->dtype, (op & MAT_C) ? LA_CONJ(x) : x);
    }
}

/* Scratch of n scalars (at least one, so 0-size matrices need no cases). */
static LA_T* LA(new_buf)(int64_t n) { return (LA_T*)malloc(sizeof(LA_T) * (size_t)(n > 0 ? n : 1)); }

/* n x n identity into c */
static void LA(set_identity)(LA_T* c, int64_t n) {
  for (int64_t i = 0; i < n * n; i++) c[i] = (i % (n + 1)) == 0 ? 1.0 : 0.0;
}

/* ------------------------------------------------------------ dense kernels */

/* LU with partial pivoting of the m x n matrix a (in place, LAPACK getrf
 * semantics: the pivot is the first entry of largest LA_ABS1 in its column):
 * piv[0..min(m,n)) 1-based; returns info. */
static int LA(lu_factor)(LA_T* a, int64_t m, int64_t n, int32_t* piv) {
  int64_t k = m < n ? m : n;
  int info = 0;
  for (int64_t j = 0; j < k; j++) {
    int64_t p = j;
    double best = LA_ABS1(a[j * n + j]);
    for (int64_t i = j + 1; i < m; i++)
      if (LA_ABS1(a[i * n + j]) > best) best = LA_ABS1(a[i * n + j]), p = i;
    piv[j] = (int32_t)(p + 1);
    if (a[p * n + j] != 0.0) {
      if (p != j)
        for (int64_t c = 0; c < n; c++) {
          LA_T t = a[j * n + c];
          a[j * n + c] = a[p * n + c];
          a[p * n + c] = t;
        }
      for (int64_t i = j + 1; i < m; i++) a[i * n + j] /= a[j * n + j];
    } else if (info == 0) {
      info = (int)(j + 1);
    }
    for (int64_t i = j + 1; i < m; i++) {
      LA_T l = a[i * n + j];
      if (l != 0.0)
        for (int64_t c = j + 1; c < n; c++) a[i * n + c] -= LA_MUL(l, a[j * n + c]);
    }
  }
  return info;
}

/* Solves op(T) Y = C in place (C: n x nrhs row-major) for the triangle of
 * the n x n matrix a (op: MAT_N, MAT_T or MAT_H). Only that triangle is
 * read. */
static void LA(tri_solve)(const LA_T* a, int64_t n, LA_T* c, int64_t nrhs, bool lower, int op,
                          bool unit) {
  bool trans = op & MAT_T, cj = op & MAT_C;
  bool fwd = lower != trans; /* op(T) is lower triangular: forward substitution */
  for (int64_t s = 0; s < n; s++) {
    int64_t i = fwd ? s : n - 1 - s;
    for (int64_t t = 0; t < s; t++) {
      int64_t j = fwd ? t : n - 1 - t;
      LA_T tij = trans ? a[j * n + i] : a[i * n + j];
      if (cj) tij = LA_CONJ(tij);
      if (tij != 0.0)
        for (int64_t r = 0; r < nrhs; r++) c[i * nrhs + r] -= LA_MUL(tij, c[j * nrhs + r]);
    }
    if (!unit) {
      LA_T d = cj ? LA_CONJ(a[i * n + i]) : a[i * n + i];
      for (int64_t r = 0; r < nrhs; r++) c[i * nrhs + r] /= d;
    }
  }
}

/* Swaps rows i and j of c (nrhs columns). */
static void LA(swap_rows)(LA_T* c, int64_t nrhs, int64_t i, int64_t j) {
  if (i == j) return;
  for (int64_t r = 0; r < nrhs; r++) {
    LA_T t = c[i * nrhs + r];
    c[i * nrhs + r] = c[j * nrhs + r];
    c[j * nrhs + r] = t;
  }
}

/* Swaps rows j and piv[j]-1 of c (n x nrhs) for j ascending, or descending
 * with `reverse`. */
static void LA(apply_pivots)(LA_T* c, int64_t nrhs, const int32_t* piv, int64_t k, bool reverse) {
  for (int64_t s = 0; s < k; s++) {
    int64_t j = reverse ? k - 1 - s : s;
    LA(swap_rows)(c, nrhs, j, piv[j] - 1);
  }
}

/* Solves op(A) Y = C (op: MAT_N, MAT_T or MAT_H) given A = P L U from
 * lu_factor. */
static void LA(lu_solve)(const LA_T* lu, int64_t n, const int32_t* piv, LA_T* c, int64_t nrhs,
                         int op) {
  if (!(op & MAT_T)) {
    LA(apply_pivots)(c, nrhs, piv, n, false);
    LA(tri_solve)(lu, n, c, nrhs, true, MAT_N, true);
    LA(tri_solve)(lu, n, c, nrhs, false, MAT_N, false);
  } else {
    LA(tri_solve)(lu, n, c, nrhs, false, op, false);
    LA(tri_solve)(lu, n, c, nrhs, true, op, true);
    LA(apply_pivots)(c, nrhs, piv, n, true);
  }
}

/* Cholesky of the Hermitian n x n matrix a (lower triangle read; as LAPACK,
 * the imaginary parts of the diagonal are ignored) into its lower triangle L
 * (a = L L^H); the strict upper triangle is zeroed. Returns info (order of
 * the first leading minor that is not positive-definite; its diagonal entry
 * then holds the failed pivot, and later columns are left as read, as
 * LAPACK's potf2 leaves them). */
static int LA(cholesky)(LA_T* a, int64_t n) {
  int info = 0;
  for (int64_t j = 0; j < n; j++) {
    double d = LA_REAL(a[j * n + j]);
    for (int64_t k = 0; k < j; k++) d -= LA_ABS2(a[j * n + k]);
    a[j * n + j] = d;
    if (!(d > 0.0)) {
      info = (int)(j + 1);
      break;
    }
    d = sqrt(d);
    a[j * n + j] = d;
    for (int64_t i = j + 1; i < n; i++) {
      LA_T s = a[i * n + j];
      for (int64_t k = 0; k < j; k++) s -= LA_MUL(a[i * n + k], LA_CONJ(a[j * n + k]));
      a[i * n + j] = s / d;
    }
  }
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = i + 1; j < n; j++) a[i * n + j] = 0.0;
  return info;
}

/* Copies the `upper` triangle of a into the lower one, conjugate-transposed,
 * so the lower triangle holds the Hermitian matrix as read from that
 * triangle. */
static void LA(lower_from)(LA_T* a, int64_t n, bool upper) {
  if (!upper) return;
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j < i; j++) a[i * n + j] = LA_CONJ(a[j * n + i]);
}

/* Solves (L L^H) X = C in place for the lower-triangular factor l. */
static void LA(cholesky_solve)(const LA_T* l, int64_t n, LA_T* c, int64_t nrhs) {
  LA(tri_solve)(l, n, c, nrhs, true, MAT_N, false);
  LA(tri_solve)(l, n, c, nrhs, true, MAT_H, false);
}

/* ------------------------------------------------------------ LU kernels */

/* Factors every matrix of A (op(A) with op MAT_N / MAT_T) into LU (same
 * batch shape), pivots and, when given, info. Returns the first nonzero info
 * (0 if none). */
static tpu_status_t LA(lu_factor_batches)(const char* op, const tpu_tensor_t* A, int aop,
                                          const tpu_tensor_t* LU, const tpu_tensor_t* piv,
                                          const tpu_tensor_t* info, int* first_info) {
  mat_view_t av = mat_of(A), lv = mat_of(LU), pv = vec_of(piv);
  int64_t m = lv.rows, n = lv.cols, k = m < n ? m : n;
  int nb = A->ndim - 2;
  int64_t nbatch = batch_count(nb, A->sizes);
  LA_T* a = LA(new_buf)(m * n);
  int32_t* p = (int32_t*)malloc(sizeof(int32_t) * (size_t)(k > 0 ? k : 1));
  if (!a || !p) {
    free(a), free(p);
    return OOM(op);
  }
  *first_info = 0;
  for (int64_t b = 0; b < nbatch; b++) {
    LA(load_mat)(&av, batch_offset(A, 2, nb, A->sizes, b), aop, a);
    int inf = LA(lu_factor)(a, m, n, p);
    if (inf && !*first_info) *first_info = inf;
    LA(store_mat)(&lv, batch_offset(LU, 2, nb, A->sizes, b), MAT_N, a);
    int64_t poff = batch_offset(piv, 1, nb, A->sizes, b);
    for (int64_t j = 0; j < k; j++) tpu_store_i64(elem_ptr(&pv, poff, j, 0), piv->dtype, p[j]);
    if (info && has_elems(info)) tpu_store_i64(tpu_tensor_elem_ptr(info, b), info->dtype, inf);
  }
  free(a), free(p);
  return NULL;
}

/* out = solve of A X = B through A's LU (pivots), with lu_solve's `left` and
 * `adjoint`; batch dims of LU, pivots and B broadcast to out's. X op(A) = B
 * is solved as op(A)^H X^H = B^H. */
static tpu_status_t LA(lu_solve_batches)(const char* op, const tpu_tensor_t* LU,
                                         const tpu_tensor_t* piv, const tpu_tensor_t* B,
                                         const tpu_tensor_t* out, bool left, bool adjoint) {
  mat_view_t lv = mat_of(LU), pv = vec_of(piv), bv = mat_of(B), ov = mat_of(out);
  int64_t n = lv.rows;
  int64_t nrhs = left ? ov.cols : ov.rows;
  int sop = adjoint != !left ? MAT_H : MAT_N, bop = left ? MAT_N : MAT_H;
  int nb = out->ndim - 2;
  int64_t nbatch = batch_count(nb, out->sizes);
  LA_T* a = LA(new_buf)(n * n);
  LA_T* c = LA(new_buf)(n * nrhs);
  int32_t* p = (int32_t*)malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
  tpu_status_t st = NULL;
  if (!a || !c || !p) st = OOM(op);
  for (int64_t b = 0; b < nbatch && !st; b++) {
    LA(load_mat)(&lv, batch_offset(LU, 2, nb, out->sizes, b), MAT_N, a);
    st = load_pivots(op, &pv, batch_offset(piv, 1, nb, out->sizes, b), n, n, p);
    if (st) break;
    LA(load_mat)(&bv, batch_offset(B, 2, nb, out->sizes, b), bop, c);
    LA(lu_solve)(a, n, p, c, nrhs, sop);
    LA(store_mat)(&ov, batch_offset(out, 2, nb, out->sizes, b), bop, c);
  }
  free(a), free(c), free(p);
  return st;
}

/* linalg_lu_factor_ex(A, *, pivot, check_errors) -> (LU, pivots, info) */
static tpu_status_t LA(k_linalg_lu_factor_ex)(const tpu_call_t* call) {
  const char* op = "linalg.lu_factor_ex";
  const tpu_tensor_t* A = tpu_arg_tensor(call, 0);
  tpu_status_t st = check_matrix_of(op, A, false, LA_COMPLEX);
  if (st) return st;
  if (!tpu_arg_bool(call, 1, true))
    return TPU_ERR(INVALID_ARGUMENT, "%s: LU without pivoting is not implemented on tpu", op);
  int info;
  st = LA(lu_factor_batches)(op, A, MAT_N, &call->outs[0], &call->outs[1], &call->outs[2], &info);
  if (!st && info && tpu_arg_bool(call, 2, false)) st = info_error(op, info);
  return st;
}

/* linalg_lu_solve(LU, pivots, B, *, left, adjoint) -> out */
static tpu_status_t LA(k_linalg_lu_solve)(const tpu_call_t* call) {
  const char* op = "linalg.lu_solve";
  const tpu_tensor_t *LU = tpu_arg_tensor(call, 0), *B = tpu_arg_tensor(call, 2);
  tpu_status_t st = check_matrix_of(op, LU, true, LA_COMPLEX);
  if (!st) st = check_matrix_of(op, B, false, LA_COMPLEX);
  if (st) return st;
  return LA(lu_solve_batches)(op, LU, tpu_arg_tensor(call, 1), B, &call->outs[0],
                              tpu_arg_bool(call, 3, true), tpu_arg_bool(call, 4, false));
}

/* _linalg_solve_ex(A, B, *, left, check_errors) -> (result, LU, pivots, info) */
static tpu_status_t LA(k_linalg_solve_ex)(const tpu_call_t* call) {
  const char* op = "linalg.solve_ex";
  const tpu_tensor_t *A = tpu_arg_tensor(call, 0), *B = tpu_arg_tensor(call, 1);
  tpu_status_t st = check_matrix_of(op, A, true, LA_COMPLEX);
  if (!st) st = check_dtype(op, B, LA_COMPLEX);
  if (st) return st;
  bool left = tpu_arg_bool(call, 2, true);
  int info;
  st = LA(lu_factor_batches)(op, A, MAT_N, &call->outs[1], &call->outs[2], &call->outs[3], &info);
  if (st) return st;
  /* A vector right-hand side (B of shape A.shape[:-1], or 1-d) is an n x 1
   * matrix. */
  bool vec = B->ndim == 1;
  if (B->ndim == A->ndim - 1) {
    vec = true;
    for (int d = 0; d < B->ndim; d++) vec = vec && B->sizes[d] == A->sizes[d];
  }
  tpu_tensor_t b2 = vec ? unsqueeze_last(B) : *B, r2 = vec ? unsqueeze_last(&call->outs[0]) : call->outs[0];
  st = LA(lu_solve_batches)(op, &call->outs[1], &call->outs[2], &b2, &r2, left, false);
  if (!st && info && tpu_arg_bool(call, 3, false)) st = info_error(op, info);
  return st;
}

/* linalg_inv_ex(A, *, check_errors) -> (inverse, info) */
static tpu_status_t LA(k_linalg_inv_ex)(const tpu_call_t* call) {
  const char* op = "linalg.inv_ex";
  const tpu_tensor_t* A = tpu_arg_tensor(call, 0);
  tpu_status_t st = check_matrix_of(op, A, true, LA_COMPLEX);
  if (st) return st;
  const tpu_tensor_t *inv = &call->outs[0], *info = &call->outs[1];
  mat_view_t av = mat_of(A), iv = mat_of(inv);
  int64_t n = av.rows;
  int nb = A->ndim - 2;
  int64_t nbatch = batch_count(nb, A->sizes);
  LA_T *a = LA(new_buf)(n * n), *c = LA(new_buf)(n * n);
  int32_t* p = (int32_t*)malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
  if (!a || !c || !p) {
    free(a), free(c), free(p);
    return OOM(op);
  }
  int first = 0;
  for (int64_t b = 0; b < nbatch; b++) {
    LA(load_mat)(&av, batch_offset(A, 2, nb, A->sizes, b), MAT_N, a);
    int inf = LA(lu_factor)(a, n, n, p);
    LA(set_identity)(c, n);
    LA(lu_solve)(a, n, p, c, n, MAT_N);
    LA(store_mat)(&iv, batch_offset(inv, 2, nb, A->sizes, b), MAT_N, c);
    if (has_elems(info)) tpu_store_i64(tpu_tensor_elem_ptr(info, b), info->dtype, inf);
    if (inf && !first) first = inf;
  }
  free(a), free(c), free(p);
  if (first && tpu_arg_bool(call, 1, false)) return info_error(op, first);
  return NULL;
}

/* det / slogdet from each matrix's LU diagonal (read back from the LU
 * output, as CPU's composite does) and pivots: det = sign(P) prod(d);
 * sign = sign(P) prod(sgn(d)), logabsdet = sum log |d|.
 * CPU factors a contiguous real A as A^T (its backward formulas rely on the
 * choice), a complex A as it is; so do we, for equal LU outputs. */
static tpu_status_t LA(lu_det_batches)(const char* op, const tpu_tensor_t* A,
                                       const tpu_tensor_t* LU, const tpu_tensor_t* piv,
                                       const tpu_tensor_t* det, const tpu_tensor_t* sign,
                                       const tpu_tensor_t* logabs) {
  tpu_status_t st = check_matrix_of(op, A, true, LA_COMPLEX);
  if (st) return st;
  int info;
  bool trans = !LA_COMPLEX && tpu_tensor_is_contiguous(A);
  st = LA(lu_factor_batches)(op, A, trans ? MAT_T : MAT_N, LU, piv, NULL, &info);
  if (st) return st;
  mat_view_t lv = mat_of(LU), pv = vec_of(piv);
  int64_t n = lv.rows;
  int nb = A->ndim - 2;
  int64_t nbatch = batch_count(nb, A->sizes);
  for (int64_t b = 0; b < nbatch; b++) {
    int64_t loff = batch_offset(LU, 2, nb, A->sizes, b), poff = batch_offset(piv, 1, nb, A->sizes, b);
    LA_T r = 1.0;
    double logabsdet = 0.0;
    for (int64_t j = 0; j < n; j++) {
      LA_T d = LA_LOAD(elem_ptr(&lv, loff, j, j), LU->dtype);
      if (tpu_load_i64(elem_ptr(&pv, poff, j, 0), piv->dtype) != j + 1) r = -r;
      if (det) {
        r = LA_MUL(r, d);
      } else {
        r = LA_MUL(r, LA_SGN(d));
        logabsdet += log(LA_ABS(d));
      }
    }
    if (det) {
      LA_STORE(tpu_tensor_elem_ptr(det, b), det->dtype, r);
    } else {
      LA_STORE(tpu_tensor_elem_ptr(sign, b), sign->dtype, r);
      tpu_store_f64(tpu_tensor_elem_ptr(logabs, b), logabs->dtype, logabsdet);
    }
  }
  return NULL;
}

/* _linalg_det(A) -> (result, LU, pivots) */
static tpu_status_t LA(k_linalg_det)(const tpu_call_t* call) {
  return LA(lu_det_batches)("linalg.det", tpu_arg_tensor(call, 0), &call->outs[1], &call->outs[2],
                            &call->outs[0], NULL, NULL);
}

/* _linalg_slogdet(A) -> (sign, logabsdet, LU, pivots) */
static tpu_status_t LA(k_linalg_slogdet)(const tpu_call_t* call) {
  return LA(lu_det_batches)("linalg.slogdet", tpu_arg_tensor(call, 0), &call->outs[2],
                            &call->outs[3], NULL, &call->outs[0], &call->outs[1]);
}

/* Writes P (m x m), L (m x k) and U (k x n) of batch b from the m x n LU
 * buffer and pivots; each of P/L/U may be empty (skipped). */
static void LA(lu_unpack_one)(const LA_T* lu, int64_t m, int64_t n, const int32_t* piv,
                              const tpu_tensor_t* P, const tpu_tensor_t* L, const tpu_tensor_t* U,
                              int nb, const int64_t* bsizes, int64_t b, int64_t* perm) {
  int64_t k = m < n ? m : n;
  if (has_elems(P)) {
    /* perm[i]: the row of A that lands in row i of P^T A = L U. */
    for (int64_t i = 0; i < m; i++) perm[i] = i;
    for (int64_t j = 0; j < k; j++) {
      int64_t t = perm[j];
      perm[j] = perm[piv[j] - 1], perm[piv[j] - 1] = t;
    }
    mat_view_t v = mat_of(P);
    int64_t off = batch_offset(P, 2, nb, bsizes, b);
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < m; j++) LA_STORE(elem_ptr(&v, off, i, j), P->dtype, 0.0);
    for (int64_t i = 0; i < m; i++) LA_STORE(elem_ptr(&v, off, perm[i], i), P->dtype, 1.0);
  }
  if (has_elems(L)) {
    mat_view_t v = mat_of(L);
    int64_t off = batch_offset(L, 2, nb, bsizes, b);
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < k; j++)
        LA_STORE(elem_ptr(&v, off, i, j), L->dtype, i == j ? 1.0 : i > j ? lu[i * n + j] : 0.0);
  }
  if (has_elems(U)) {
    mat_view_t v = mat_of(U);
    int64_t off = batch_offset(U, 2, nb, bsizes, b);
    for (int64_t i = 0; i < k; i++)
      for (int64_t j = 0; j < n; j++)
        LA_STORE(elem_ptr(&v, off, i, j), U->dtype, j >= i ? lu[i * n + j] : 0.0);
  }
}

/* Shared by linalg_lu (factor == true: LU from A) and lu_unpack (LU and
 * pivots given). */
static tpu_status_t LA(lu_unpack_batches)(const char* op, const tpu_tensor_t* A,
                                          const tpu_tensor_t* piv_in, bool factor,
                                          const tpu_call_t* call) {
  tpu_status_t st = check_matrix_of(op, A, false, LA_COMPLEX);
  if (st) return st;
  mat_view_t av = mat_of(A);
  int64_t m = av.rows, n = av.cols, k = m < n ? m : n;
  int nb = A->ndim - 2;
  int64_t nbatch = batch_count(nb, A->sizes);
  LA_T* a = LA(new_buf)(m * n);
  int64_t* perm = (int64_t*)malloc(sizeof(int64_t) * (size_t)(m > 0 ? m : 1));
  int32_t* p = (int32_t*)malloc(sizeof(int32_t) * (size_t)(k > 0 ? k : 1));
  if (!a || !perm || !p) st = OOM(op);
  mat_view_t pv = piv_in ? vec_of(piv_in) : av;
  for (int64_t b = 0; b < nbatch && !st; b++) {
    LA(load_mat)(&av, batch_offset(A, 2, nb, A->sizes, b), MAT_N, a);
    if (factor) LA(lu_factor)(a, m, n, p);
    else st = load_pivots(op, &pv, batch_offset(piv_in, 1, nb, A->sizes, b), k, m, p);
    if (!st)
      LA(lu_unpack_one)(a, m, n, p, &call->outs[0], &call->outs[1], &call->outs[2], nb, A->sizes,
                        b, perm);
  }
  free(a), free(perm), free(p);
  return st;
}

/* linalg_lu(A, *, pivot) -> (P, L, U) */
static tpu_status_t LA(k_linalg_lu)(const tpu_call_t* call) {
  if (!tpu_arg_bool(call, 1, true))
    return TPU_ERR(INVALID_ARGUMENT, "linalg.lu: LU without pivoting is not implemented on tpu");
  return LA(lu_unpack_batches)("linalg.lu", tpu_arg_tensor(call, 0), NULL, true, call);
}

/* lu_unpack(LU_data, LU_pivots, unpack_data, unpack_pivots) -> (P, L, U) */
static tpu_status_t LA(k_lu_unpack)(const tpu_call_t* call) {
  const tpu_tensor_t* piv = tpu_arg_tensor(call, 1);
  if (piv->dtype != TPU_I32 && piv->dtype != TPU_I64)
    return TPU_ERR(INVALID_ARGUMENT, "lu_unpack: LU_pivots must be an integer tensor, got %s",
                   tpu_dtype_name(piv->dtype));
  return LA(lu_unpack_batches)("lu_unpack", tpu_arg_tensor(call, 0), piv, false, call);
}

/* ------------------------------------------------------ Cholesky kernels */

/* Cholesky of every matrix of A into out (lower, or its conjugate transpose
 * with `upper`, which also reads A's upper triangle); info per matrix when
 * given. */
static tpu_status_t LA(cholesky_batches)(const char* op, const tpu_tensor_t* A, bool upper,
                                         const tpu_tensor_t* out, const tpu_tensor_t* info,
                                         int* first_info) {
  tpu_status_t st = check_matrix_of(op, A, true, LA_COMPLEX);
  if (st) return st;
  mat_view_t av = mat_of(A), ov = mat_of(out);
  int64_t n = av.rows;
  int nb = A->ndim - 2;
  int64_t nbatch = batch_count(nb, A->sizes);
  LA_T* a = LA(new_buf)(n * n);
  if (!a) return OOM(op);
  *first_info = 0;
  for (int64_t b = 0; b < nbatch; b++) {
    LA(load_mat)(&av, batch_offset(A, 2, nb, A->sizes, b), MAT_N, a);
    LA(lower_from)(a, n, upper);
    int inf = LA(cholesky)(a, n);
    if (inf && !*first_info) *first_info = inf;
    LA(store_mat)(&ov, batch_offset(out, 2, nb, A->sizes, b), upper ? MAT_H : MAT_N, a);
    if (info && has_elems(info)) tpu_store_i64(tpu_tensor_elem_ptr(info, b), info->dtype, inf);
  }
  free(a);
  return NULL;
}

/* linalg_cholesky_ex(self, *, upper, check_errors) -> (L, info) */
static tpu_status_t LA(k_linalg_cholesky_ex)(const tpu_call_t* call) {
  const char* op = "linalg.cholesky_ex";
  int info;
  tpu_status_t st = LA(cholesky_batches)(op, tpu_arg_tensor(call, 0), tpu_arg_bool(call, 1, false),
                                         &call->outs[0], &call->outs[1], &info);
  if (!st && info && tpu_arg_bool(call, 2, false)) st = not_pd_error(op, info);
  return st;
}

/* cholesky(self, upper) -> out; fails for inputs that are not PD. */
static tpu_status_t LA(k_cholesky)(const tpu_call_t* call) {
  const char* op = "cholesky";
  int info;
  tpu_status_t st = LA(cholesky_batches)(op, tpu_arg_tensor(call, 0), tpu_arg_bool(call, 1, false),
                                         &call->outs[0], NULL, &info);
  if (!st && info) st = not_pd_error(op, info);
  return st;
}

/* out = (L L^H)^-1 C for every matrix, where the factor F is L or, with
 * `upper`, U = L^H (loaded conjugate-transposed as L); C is the identity
 * when B is NULL (cholesky_inverse). Batch dims broadcast to out's. */
static tpu_status_t LA(cholesky_solve_batches)(const char* op, const tpu_tensor_t* F,
                                               const tpu_tensor_t* B, bool upper,
                                               const tpu_tensor_t* out) {
  tpu_status_t st = check_matrix_of(op, F, true, LA_COMPLEX);
  if (!st && B) st = check_matrix_of(op, B, false, LA_COMPLEX);
  if (st) return st;
  mat_view_t fv = mat_of(F), bv = B ? mat_of(B) : fv, ov = mat_of(out);
  int64_t n = fv.rows, nrhs = ov.cols;
  int nb = out->ndim - 2;
  int64_t nbatch = batch_count(nb, out->sizes);
  LA_T *l = LA(new_buf)(n * n), *c = LA(new_buf)(n * nrhs);
  if (!l || !c) {
    free(l), free(c);
    return OOM(op);
  }
  for (int64_t b = 0; b < nbatch; b++) {
    LA(load_mat)(&fv, batch_offset(F, 2, nb, out->sizes, b), upper ? MAT_H : MAT_N, l);
    if (B) LA(load_mat)(&bv, batch_offset(B, 2, nb, out->sizes, b), MAT_N, c);
    else LA(set_identity)(c, n);
    LA(cholesky_solve)(l, n, c, nrhs);
    LA(store_mat)(&ov, batch_offset(out, 2, nb, out->sizes, b), MAT_N, c);
  }
  free(l), free(c);
  return NULL;
}

/* cholesky_inverse(self, upper) -> out = (L L^H)^-1 or (U^H U)^-1 */
static tpu_status_t LA(k_cholesky_inverse)(const tpu_call_t* call) {
  return LA(cholesky_solve_batches)("cholesky_inverse", tpu_arg_tensor(call, 0), NULL,
                                    tpu_arg_bool(call, 1, false), &call->outs[0]);
}

/* _cholesky_solve_helper(self=B, A=factor, upper) -> out */
static tpu_status_t LA(k_cholesky_solve_helper)(const tpu_call_t* call) {
  return LA(cholesky_solve_batches)("cholesky_solve", tpu_arg_tensor(call, 1),
                                    tpu_arg_tensor(call, 0), tpu_arg_bool(call, 2, false),
                                    &call->outs[0]);
}

/* ------------------------------------------------------ triangular solves */

/* out = op(T)^-1 B (left) or B op(T)^-1 for the `upper` or lower triangle T
 * of each A (op: MAT_N, MAT_T or MAT_H); with AC non-empty, A's matrices are
 * also copied there. Batch dims broadcast to out's. X op(T) = B is solved as
 * op(T)^H X^H = B^H. */
static tpu_status_t LA(tri_solve_batches)(const char* op, const tpu_tensor_t* A,
                                          const tpu_tensor_t* B, const tpu_tensor_t* out,
                                          const tpu_tensor_t* AC, bool upper, bool left, int top,
                                          bool unit) {
  tpu_status_t st = check_matrix_of(op, A, true, LA_COMPLEX);
  if (!st) st = check_matrix_of(op, B, false, LA_COMPLEX);
  if (st) return st;
  mat_view_t av = mat_of(A), bv = mat_of(B), ov = mat_of(out), cv = AC ? mat_of(AC) : av;
  int64_t n = av.rows, nrhs = left ? ov.cols : ov.rows;
  int bop = left ? MAT_N : MAT_H, sop = left ? top : top ^ MAT_H;
  int nb = out->ndim - 2;
  int64_t nbatch = batch_count(nb, out->sizes);
  bool copy_a = AC && has_elems(AC);
  LA_T *a = LA(new_buf)(n * n), *c = LA(new_buf)(n * nrhs);
  if (!a || !c) {
    free(a), free(c);
    return OOM(op);
  }
  for (int64_t b = 0; b < nbatch; b++) {
    LA(load_mat)(&av, batch_offset(A, 2, nb, out->sizes, b), MAT_N, a);
    LA(load_mat)(&bv, batch_offset(B, 2, nb, out->sizes, b), bop, c);
    LA(tri_solve)(a, n, c, nrhs, !upper, sop, unit);
    LA(store_mat)(&ov, batch_offset(out, 2, nb, out->sizes, b), bop, c);
    if (copy_a) LA(store_mat)(&cv, batch_offset(AC, 2, nb, out->sizes, b), MAT_N, a);
  }
  free(a), free(c);
  return NULL;
}

/* linalg_solve_triangular(self=A, B, *, upper, left, unitriangular) -> out */
static tpu_status_t LA(k_linalg_solve_triangular)(const tpu_call_t* call) {
  return LA(tri_solve_batches)("linalg.solve_triangular", tpu_arg_tensor(call, 0),
                               tpu_arg_tensor(call, 1), &call->outs[0], NULL,
                               tpu_arg_bool(call, 2, false), tpu_arg_bool(call, 3, true), MAT_N,
                               tpu_arg_bool(call, 4, false));
}

/* triangular_solve(self=B, A, upper, transpose, unitriangular) ->
 * (solution X with op(A) X = B, cloned_coefficient = A over the broadcast
 * batch); op(A) is A or A^T (transposed without conjugation, as on CPU). */
static tpu_status_t LA(k_triangular_solve)(const tpu_call_t* call) {
  return LA(tri_solve_batches)("triangular_solve", tpu_arg_tensor(call, 1),
                               tpu_arg_tensor(call, 0), &call->outs[0], &call->outs[1],
                               tpu_arg_bool(call, 2, true), true,
                               tpu_arg_bool(call, 3, false) ? MAT_T : MAT_N,
                               tpu_arg_bool(call, 4, false));
}

/* ------------------------------------------------------ LDL^T (Bunch-Kaufman) */

/* x, conjugated in a Hermitian factorization */
#define HC(x) (herm ? LA_CONJ(x) : (x))

/* Bunch-Kaufman factorization of the n x n matrix a (row-major, lower
 * triangle read) in place: A = P L D L^T P^T (symmetric, LAPACK sytf2) or,
 * with `herm` (complex instance only), A = P L D L^H P^T for a Hermitian A
 * (hetf2: the diagonal is real, its imaginary parts are ignored), in
 * LAPACK's lower layout. D has 1x1 and 2x2 blocks (a 2x2 block's
 * off-diagonal at (k+1, k)); L is unit lower triangular below the blocks.
 * piv[k] = p + 1 (1-based) when step k is a 1x1 block that exchanged
 * rows/columns k and p; for a 2x2 block at k, k+1 that exchanged k+1 and p,
 * piv[k] = piv[k+1] = -(p + 1). The exchanges touch only the trailing
 * submatrix, as in LAPACK. Returns info: the 1-based index of the first zero
 * diagonal block of D, 0 if none. Pivot sizes are LA_ABS1 (LAPACK's cabs1;
 * a Hermitian diagonal entry: |re|); the tests follow Bunch and Kaufman
 * (1977) with alpha = (1 + sqrt(17)) / 8. */
static int LA(bunch_kaufman)(LA_T* a, int64_t n, int32_t* piv, bool herm) {
  const double alpha = (1.0 + sqrt(17.0)) / 8.0;
#define A_(i, j) a[(i) * n + (j)]
#define DIAG_ABS(x) (herm ? fabs(LA_REAL(x)) : LA_ABS1(x))
  int info = 0;
  int64_t k = 0;
  while (k < n) {
    int64_t kstep = 1, kp, imax = k;
    double absakk = DIAG_ABS(A_(k, k)), colmax = 0.0;
    for (int64_t i = k + 1; i < n; i++)
      if (LA_ABS1(A_(i, k)) > colmax) colmax = LA_ABS1(A_(i, k)), imax = i;
    if ((absakk > colmax ? absakk : colmax) == 0.0 || isnan(absakk)) {
      if (!info) info = (int)(k + 1);
      kp = k;
      if (herm) A_(k, k) = LA_REAL(A_(k, k));
    } else {
      if (absakk >= alpha * colmax) {
        kp = k;
      } else {
        /* largest off-diagonal size in row/column imax of the trailing
         * matrix */
        double rowmax = 0.0;
        for (int64_t j = k; j < imax; j++)
          if (LA_ABS1(A_(imax, j)) > rowmax) rowmax = LA_ABS1(A_(imax, j));
        for (int64_t j = imax + 1; j < n; j++)
          if (LA_ABS1(A_(j, imax)) > rowmax) rowmax = LA_ABS1(A_(j, imax));
        if (absakk >= alpha * colmax * (colmax / rowmax)) {
          kp = k;
        } else if (DIAG_ABS(A_(imax, imax)) >= alpha * rowmax) {
          kp = imax;
        } else {
          kp = imax;
          kstep = 2;
        }
      }
      int64_t kk = k + kstep - 1;
      if (kp != kk) { /* symmetric exchange of kk and kp within A(k:n, k:n) */
        LA_T t;
        for (int64_t i = kp + 1; i < n; i++) t = A_(i, kk), A_(i, kk) = A_(i, kp), A_(i, kp) = t;
        for (int64_t j = kk + 1; j < kp; j++)
          t = HC(A_(j, kk)), A_(j, kk) = HC(A_(kp, j)), A_(kp, j) = t;
        A_(kp, kk) = HC(A_(kp, kk));
        t = A_(kk, kk), A_(kk, kk) = A_(kp, kp), A_(kp, kp) = t;
        if (kstep == 2) t = A_(k + 1, k), A_(k + 1, k) = A_(kp, k), A_(kp, k) = t;
      }
      if (herm) /* the diagonal entries of the pivot block are real */
        for (int64_t d = k; d < k + kstep; d++) A_(d, d) = LA_REAL(A_(d, d));
      if (herm && kp != kk) A_(kp, kp) = LA_REAL(A_(kp, kp));
      if (kstep == 1) {
        /* A -= w r w^T (w^H), w column k, r = 1 / D(k); then L(:, k) = w r */
        LA_T r = herm ? (LA_T)(1.0 / LA_REAL(A_(k, k))) : 1.0 / A_(k, k);
        for (int64_t j = k + 1; j < n; j++) {
          LA_T ajk = A_(j, k);
          if (ajk != 0.0) {
            LA_T t = LA_MUL(-r, HC(ajk));
            A_(j, j) += LA_MUL(ajk, t);
            for (int64_t i = j + 1; i < n; i++) A_(i, j) += LA_MUL(A_(i, k), t);
          }
          if (herm) A_(j, j) = LA_REAL(A_(j, j));
        }
        for (int64_t i = k + 1; i < n; i++) A_(i, k) = LA_MUL(A_(i, k), r);
      } else if (k + 2 < n) {
        /* columns k, k+1 of L = (columns k, k+1 of A) D^-1, D = [d e'; e f]
         * the 2x2 block (e' = e, Hermitian: conj(e)), with D^-1 written
         * through entries scaled by s = e (Hermitian: |e|, the unit u = e / s
         * then left) to avoid overflow */
        LA_T e = A_(k + 1, k), s = herm ? (LA_T)LA_ABS(e) : e, u = herm ? e / s : 1.0;
        LA_T d11 = A_(k + 1, k + 1) / s, d22 = A_(k, k) / s;
        LA_T dd = (1.0 / (LA_MUL(d11, d22) - 1.0)) / s;
        for (int64_t j = k + 2; j < n; j++) {
          LA_T ak = A_(j, k), ak1 = A_(j, k + 1);
          LA_T wk = LA_MUL(dd, LA_MUL(d11, ak) - (herm ? LA_MUL(u, ak1) : ak1));
          LA_T wk1 = LA_MUL(dd, LA_MUL(d22, ak1) - (herm ? LA_MUL(LA_CONJ(u), ak) : ak));
          for (int64_t i = j; i < n; i++)
            A_(i, j) = A_(i, j) - LA_MUL(A_(i, k), HC(wk)) - LA_MUL(A_(i, k + 1), HC(wk1));
          A_(j, k) = wk;
          A_(j, k + 1) = wk1;
          if (herm) A_(j, j) = LA_REAL(A_(j, j));
        }
      }
    }
    if (kstep == 1) {
      piv[k] = (int32_t)(kp + 1);
    } else {
      piv[k] = piv[k + 1] = (int32_t)(-(kp + 1));
    }
    k += kstep;
  }
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = i + 1; j < n; j++) A_(i, j) = 0.0;
#undef DIAG_ABS
#undef A_
  return info;
}

/* Solves A X = C in place (C: n x nrhs row-major) from bunch_kaufman's
 * factors ld and pivots (validated by the caller; `herm` as there): P L
 * applied forward, the blocks of D, then L^T (L^H) P^T backward, as LAPACK's
 * sytrs / hetrs. */
static void LA(bk_solve)(const LA_T* ld, int64_t n, const int32_t* piv, LA_T* c, int64_t nrhs,
                         bool herm) {
#define L_(i, j) ld[(i) * n + (j)]
#define C_(i, r) c[(i) * nrhs + (r)]
  for (int64_t k = 0; k < n;) {
    if (piv[k] > 0) {
      LA(swap_rows)(c, nrhs, k, piv[k] - 1);
      for (int64_t i = k + 1; i < n; i++)
        for (int64_t r = 0; r < nrhs; r++) C_(i, r) -= LA_MUL(L_(i, k), C_(k, r));
      LA_T d = herm ? (LA_T)LA_REAL(L_(k, k)) : L_(k, k);
      for (int64_t r = 0; r < nrhs; r++) C_(k, r) /= d;
      k++;
    } else {
      LA(swap_rows)(c, nrhs, k + 1, -piv[k] - 1);
      for (int64_t i = k + 2; i < n; i++)
        for (int64_t r = 0; r < nrhs; r++)
          C_(i, r) = C_(i, r) - LA_MUL(L_(i, k), C_(k, r)) - LA_MUL(L_(i, k + 1), C_(k + 1, r));
      /* D = [d e'; f e]: rows divided by e' and e, then 2x2 Cramer */
      LA_T e = L_(k + 1, k), ec = HC(e);
      LA_T p = L_(k, k) / ec, q = L_(k + 1, k + 1) / e, den = LA_MUL(p, q) - 1.0;
      for (int64_t r = 0; r < nrhs; r++) {
        LA_T x0 = C_(k, r) / ec, x1 = C_(k + 1, r) / e;
        C_(k, r) = (LA_MUL(q, x0) - x1) / den;
        C_(k + 1, r) = (LA_MUL(p, x1) - x0) / den;
      }
      k += 2;
    }
  }
  for (int64_t k = n - 1; k >= 0;) {
    int64_t first = piv[k] > 0 ? k : k - 1; /* first column of the block ending at k */
    for (int64_t j = first; j <= k; j++)
      for (int64_t i = k + 1; i < n; i++)
        for (int64_t r = 0; r < nrhs; r++) C_(j, r) -= LA_MUL(HC(L_(i, j)), C_(i, r));
    LA(swap_rows)(c, nrhs, k, (piv[k] > 0 ? piv[k] : -piv[k]) - 1);
    k = first - 1;
  }
#undef C_
#undef L_
}
#undef HC

/* linalg_ldl_factor_ex(self, *, hermitian, check_errors) -> (LD, pivots,
 * info). `hermitian` matters for complex matrices only (CPU: sytrf for real
 * ones either way). */
static tpu_status_t LA(k_linalg_ldl_factor_ex)(const tpu_call_t* call) {
  const char* op = "linalg.ldl_factor_ex";
  const tpu_tensor_t* A = tpu_arg_tensor(call, 0);
  const tpu_tensor_t *LD = &call->outs[0], *piv = &call->outs[1], *info = &call->outs[2];
  tpu_status_t st = check_matrix_of(op, A, true, LA_COMPLEX);
  if (st) return st;
  bool herm = LA_COMPLEX && tpu_arg_bool(call, 1, false);
  mat_view_t av = mat_of(A), lv = mat_of(LD), pv = vec_of(piv);
  int64_t n = av.rows;
  int nb = A->ndim - 2;
  int64_t nbatch = batch_count(nb, A->sizes);
  LA_T* a = LA(new_buf)(n * n);
  int32_t* p = (int32_t*)malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
  if (!a || !p) {
    free(a), free(p);
    return OOM(op);
  }
  int first = 0;
  for (int64_t b = 0; b < nbatch; b++) {
    LA(load_mat)(&av, batch_offset(A, 2, nb, A->sizes, b), MAT_N, a);
    int inf = LA(bunch_kaufman)(a, n, p, herm);
    if (inf && !first) first = inf;
    LA(store_mat)(&lv, batch_offset(LD, 2, nb, A->sizes, b), MAT_N, a);
    int64_t poff = batch_offset(piv, 1, nb, A->sizes, b);
    for (int64_t j = 0; j < n; j++) tpu_store_i64(elem_ptr(&pv, poff, j, 0), piv->dtype, p[j]);
    if (has_elems(info)) tpu_store_i64(tpu_tensor_elem_ptr(info, b), info->dtype, inf);
  }
  free(a), free(p);
  if (first && tpu_arg_bool(call, 2, false))
    return TPU_ERR(LINALG,
                   "%s: The factorization could not be completed because the input is not "
                   "invertible: D(%d,%d) is exactly zero.",
                   op, first, first);
  return NULL;
}

/* linalg_ldl_solve(LD, pivots, B, *, hermitian) -> out; batch dims
 * broadcast. */
static tpu_status_t LA(k_linalg_ldl_solve)(const tpu_call_t* call) {
  const char* op = "linalg.ldl_solve";
  const tpu_tensor_t *LD = tpu_arg_tensor(call, 0), *piv = tpu_arg_tensor(call, 1);
  const tpu_tensor_t *B = tpu_arg_tensor(call, 2), *out = &call->outs[0];
  tpu_status_t st = check_matrix_of(op, LD, true, LA_COMPLEX);
  if (!st) st = check_matrix_of(op, B, false, LA_COMPLEX);
  if (st) return st;
  bool herm = LA_COMPLEX && tpu_arg_bool(call, 3, false);
  mat_view_t lv = mat_of(LD), pv = vec_of(piv), bv = mat_of(B), ov = mat_of(out);
  int64_t n = lv.rows, nrhs = ov.cols;
  int nb = out->ndim - 2;
  int64_t nbatch = batch_count(nb, out->sizes);
  LA_T *a = LA(new_buf)(n * n), *c = LA(new_buf)(n * nrhs);
  int32_t* p = (int32_t*)malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
  if (!a || !c || !p) st = OOM(op);
  for (int64_t b = 0; b < nbatch && !st; b++) {
    LA(load_mat)(&lv, batch_offset(LD, 2, nb, out->sizes, b), MAT_N, a);
    int64_t poff = batch_offset(piv, 1, nb, out->sizes, b);
    for (int64_t j = 0; j < n && !st; j++) {
      int64_t x = tpu_load_i64(elem_ptr(&pv, poff, j, 0), piv->dtype);
      bool two = x < 0; /* a 2x2 block: both of its pivots negative and equal */
      if (x == 0 || (x < 0 ? -x : x) > n ||
          (two && !((j + 1 < n && tpu_load_i64(elem_ptr(&pv, poff, j + 1, 0), piv->dtype) == x))))
        st = TPU_ERR(INVALID_ARGUMENT, "%s: invalid pivot %lld at position %lld", op,
                     (long long)x, (long long)j);
      p[j] = (int32_t)x;
      if (two && !st) p[++j] = (int32_t)x;
    }
    if (st) break;
    LA(load_mat)(&bv, batch_offset(B, 2, nb, out->sizes, b), MAT_N, c);
    LA(bk_solve)(a, n, p, c, nrhs, herm);
    LA(store_mat)(&ov, batch_offset(out, 2, nb, out->sizes, b), MAT_N, c);
  }
  free(a), free(c), free(p);
  return st;
}

/* ------------------------------------------------------ matrix exponential */

/* c = a @ b for n x n row-major matrices (c distinct from a and b) */
static void LA(mat_mul)(const LA_T* a, const LA_T* b, LA_T* c, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    LA_T* ci = c + i * n;
    for (int64_t j = 0; j < n; j++) ci[j] = 0;
    for (int64_t k = 0; k < n; k++) {
      const LA_T aik = a[i * n + k];
      const LA_T* bk = b + k * n;
      for (int64_t j = 0; j < n; j++) ci[j] += LA_MUL(aik, bk[j]);
    }
  }
}

/* exp(a) for one n x n matrix, in place: the degree-13 Pade approximant with
 * scaling and squaring (Higham, "The scaling and squaring method for the
 * matrix exponential revisited", 2005): a is scaled by 2^-s until its 1-norm
 * is at most theta_13, r = q^-1 p, then squared s times. w: 7 n^2 scalars,
 * piv: n ints. A matrix with a non-finite entry gives NaN everywhere. */
static void LA(matrix_exp_one)(LA_T* a, int64_t n, LA_T* w, int32_t* piv) {
  static const double b[14] = {64764752532480000.0, 32382376266240000.0, 7771770303897600.0,
                               1187353796428800.0,  129060195264000.0,   10559470521600.0,
                               670442572800.0,      33522128640.0,       1323241920.0,
                               40840800.0,          960960.0,            16380.0,
                               182.0,               1.0};
  const double theta13 = 5.371920351148152;
  const int64_t nn = n * n;
  double norm = 0;
  for (int64_t j = 0; j < n; j++) {
    double col = 0;
    for (int64_t i = 0; i < n; i++) col += LA_ABS(a[i * n + j]);
    norm = col > norm || col != col ? col : norm;
  }
  if (!isfinite(norm)) {
    for (int64_t i = 0; i < nn; i++) a[i] = LA_NAN;
    return;
  }
  int s = 0;
  if (norm > theta13) s = (int)ceil(log2(norm / theta13));
  const double scale = ldexp(1.0, -s);
  LA_T *a2 = w, *a4 = w + nn, *a6 = w + 2 * nn, *u = w + 3 * nn, *v = w + 4 * nn;
  LA_T *t = w + 5 * nn, *q = w + 6 * nn;
  for (int64_t i = 0; i < nn; i++) a[i] *= scale;
  LA(mat_mul)(a, a, a2, n);
  LA(mat_mul)(a2, a2, a4, n);
  LA(mat_mul)(a4, a2, a6, n);
  /* u = a (a6 (b13 a6 + b11 a4 + b9 a2) + b7 a6 + b5 a4 + b3 a2 + b1 I),
   * v = a6 (b12 a6 + b10 a4 + b8 a2) + b6 a6 + b4 a4 + b2 a2 + b0 I */
  for (int64_t i = 0; i < nn; i++) t[i] = b[13] * a6[i] + b[11] * a4[i] + b[9] * a2[i];
  LA(mat_mul)(a6, t, q, n);
  for (int64_t i = 0; i < nn; i++)
    q[i] += b[7] * a6[i] + b[5] * a4[i] + b[3] * a2[i] + (i % (n + 1) == 0 ? b[1] : 0);
  LA(mat_mul)(a, q, u, n);
  for (int64_t i = 0; i < nn; i++) t[i] = b[12] * a6[i] + b[10] * a4[i] + b[8] * a2[i];
  LA(mat_mul)(a6, t, v, n);
  for (int64_t i = 0; i < nn; i++)
    v[i] += b[6] * a6[i] + b[4] * a4[i] + b[2] * a2[i] + (i % (n + 1) == 0 ? b[0] : 0);
  /* (v - u) r = v + u */
  for (int64_t i = 0; i < nn; i++) {
    q[i] = v[i] - u[i];
    a[i] = v[i] + u[i];
  }
  LA(lu_factor)(q, n, n, piv);
  LA(lu_solve)(q, n, piv, a, n, MAT_N);
  for (int k = 0; k < s; k++) {
    LA(mat_mul)(a, a, t, n);
    memcpy(a, t, sizeof(LA_T) * (size_t)nn);
  }
}

/* linalg_matrix_exp(self): exp of each square matrix, computed in double
 * (complex: double complex). */
static tpu_status_t LA(k_linalg_matrix_exp)(const tpu_call_t* call) {
  const char* op = "linalg.matrix_exp";
  const tpu_tensor_t* A = tpu_arg_tensor(call, 0);
  const tpu_tensor_t* out = &call->outs[0];
  if (!tpu_dtype_is_float(A->dtype) && !tpu_dtype_is_complex(A->dtype))
    return TPU_ERR(UNIMPLEMENTED, "%s: dtype %s is not supported (floating and complex types)",
                   op, tpu_dtype_name(A->dtype));
  if (A->ndim < 2 || A->sizes[A->ndim - 1] != A->sizes[A->ndim - 2])
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: Expected a square matrix or batches of square matrices, got %d dims", op,
                   (int)A->ndim);
  mat_view_t av = mat_of(A), ov = mat_of(out);
  const int64_t n = av.rows;
  const int nb = A->ndim - 2;
  const int64_t nbatch = batch_count(nb, A->sizes);
  LA_T* a = LA(new_buf)(8 * n * n);
  int32_t* piv = (int32_t*)malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
  if (!a || !piv) {
    free(a), free(piv);
    return OOM(op);
  }
  for (int64_t bi = 0; bi < nbatch && n > 0; bi++) {
    LA(load_mat)(&av, batch_offset(A, 2, nb, A->sizes, bi), MAT_N, a);
    LA(matrix_exp_one)(a, n, a + n * n, piv);
    LA(store_mat)(&ov, batch_offset(out, 2, nb, A->sizes, bi), MAT_N, a);
  }
  free(a), free(piv);
  return NULL;
}
