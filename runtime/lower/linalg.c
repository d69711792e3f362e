/* Linear algebra lowerings: Cholesky factors, triangular solves, and an LU
 * factorization with partial pivoting (unrolled over the columns, as LAPACK's
 * getrf chooses pivots: the first largest magnitude) with what is built on
 * it: lu_factor, lu, lu_unpack, lu_solve, solve, inv, det, slogdet; Householder
 * QR (geqrf unrolled over the columns) with householder_product and ormqr;
 * Jacobi SVD and symmetric eigendecomposition (sweeps in a stablehlo.while);
 * the matrix exponential (scaling and squaring). QR, SVD, eigh and exp run in
 * float64, as the host kernels.
 *
 * Matrices are the last two dims; batch dims broadcast as in PyTorch. Only
 * float32 and float64 (as LAPACK). Each function lowers the ATen ops its
 * table names; it returns false to leave the call unlowered. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lower/emit.h"

/* an i64 iota along dim of shape (nd, sz) */
static ref_t iota_along(em_t* e, int nd, const int64_t* sz, int dim) {
  return emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, nd, sz), "iota_dimension = %d : i64", dim);
}

static ref_t transpose_last2(em_t* e, ref_t a) {
  int64_t perm[TPU_MAX_DIMS];
  for (int d = 0; d < a.nd; d++) perm[d] = d;
  perm[a.nd - 2] = a.nd - 1;
  perm[a.nd - 1] = a.nd - 2;
  return transpose(e, a, perm);
}

/* rows [lo, hi) and columns [clo, chi) of a matrix batch */
static ref_t block(em_t* e, ref_t a, int64_t lo, int64_t hi, int64_t clo, int64_t chi) {
  int64_t s[TPU_MAX_DIMS] = {0}, l[TPU_MAX_DIMS];
  memcpy(l, a.sz, sizeof(int64_t) * (size_t)a.nd);
  s[a.nd - 2] = lo;
  l[a.nd - 2] = hi;
  s[a.nd - 1] = clo;
  l[a.nd - 1] = chi;
  return slice(e, a, s, l);
}

/* a [..., p, q] broadcast to [..., m, n] along its batch dims and p -> m, q -> n (p, q 1 or equal) */
static ref_t spread(em_t* e, ref_t a, int nd, const int64_t* sz) { return bcast(e, a, nd, sz); }

/* the lower (or upper) triangle of a (k below or above the diagonal kept), zeros elsewhere */
static ref_t triangle(em_t* e, ref_t a, bool lower, bool strict) {
  ref_t r = iota_along(e, a.nd, a.sz, a.nd - 2), c = iota_along(e, a.nd, a.sz, a.nd - 1);
  const char* dir = lower ? (strict ? "GT" : "GE") : (strict ? "LT" : "LE");
  return select3(e, compare(e, dir, r, c), a, cst_like(e, a.dt, 0, a.nd, a.sz));
}

static ref_t eye_like(em_t* e, tpu_dtype_t dt, int nd, const int64_t* sz) {
  return convert(e, compare(e, "EQ", iota_along(e, nd, sz, nd - 2), iota_along(e, nd, sz, nd - 1)), dt);
}

/* L with A = L L^T from A's lower triangle (the rest of L zero) */
static ref_t cholesky_lower(em_t* e, ref_t a) {
  return triangle(e, emit(e, "stablehlo.cholesky", 1, &a, a, "lower = true"), true, false);
}

/* X with op(A) X = B (left) or X op(A) = B; A's other triangle (and with
 * unit, its diagonal) is not read */
static ref_t tri_solve(em_t* e, ref_t a, ref_t b, bool left, bool lower, bool unit, bool transpose_a) {
  ref_t in[2] = {a, b};
  return emit(e, "stablehlo.triangular_solve", 2, in, b,
              "left_side = %s, lower = %s, unit_diagonal = %s, transpose_a = #stablehlo<transpose %s>",
              left ? "true" : "false", lower ? "true" : "false", unit ? "true" : "false",
              transpose_a ? "TRANSPOSE" : "NO_TRANSPOSE");
}

/* a and b with their batch dims (all but the last two) broadcast together */
static bool batch_broadcast(em_t* e, ref_t* a, ref_t* b) {
  const int nb = (a->nd > b->nd ? a->nd : b->nd) - 2;
  if (a->nd < 2 || b->nd < 2 || nb + 2 > TPU_MAX_DIMS) return false;
  int64_t bsz[TPU_MAX_DIMS];
  for (int i = 0; i < nb; i++) {
    const int ia = i - (nb - (a->nd - 2)), ib = i - (nb - (b->nd - 2));
    const int64_t sa = ia >= 0 ? a->sz[ia] : 1, sb = ib >= 0 ? b->sz[ib] : 1;
    if (sa != sb && sa != 1 && sb != 1) return false;
    bsz[i] = sa == 1 ? sb : sa;
  }
  ref_t* v[2] = {a, b};
  for (int j = 0; j < 2; j++) {
    int64_t sz[TPU_MAX_DIMS];
    memcpy(sz, bsz, sizeof(int64_t) * (size_t)nb);
    sz[nb] = v[j]->sz[v[j]->nd - 2];
    sz[nb + 1] = v[j]->sz[v[j]->nd - 1];
    *v[j] = bcast(e, *v[j], nb + 2, sz);
  }
  return true;
}

/* ---- LU ---- */
/* row p (a per-matrix i64 index, shape = x's batch dims) of x, as [..., 1, c] */
static ref_t row_at(em_t* e, ref_t x, ref_t p) {
  const int nd = x.nd;
  int64_t bd[TPU_MAX_DIMS];
  for (int d = 0; d < nd - 2; d++) bd[d] = d;
  ref_t hit = compare(e, "EQ", iota_along(e, nd, x.sz, nd - 2), bcast_dims(e, p, nd, x.sz, bd));
  int64_t rd[1] = {nd - 2};
  ref_t r = reduce(e, select3(e, hit, x, cst_like(e, x.dt, 0, nd, x.sz)), 1, rd, "stablehlo.add", 0);
  int64_t sz[TPU_MAX_DIMS];
  memcpy(sz, x.sz, sizeof(int64_t) * (size_t)nd);
  sz[nd - 2] = 1;
  return reshape(e, r, nd, sz);
}

/* x with rows j and p (per matrix) swapped */
static ref_t swap_rows(em_t* e, ref_t x, int64_t j, ref_t p) {
  const int nd = x.nd;
  int64_t bd[TPU_MAX_DIMS];
  for (int d = 0; d < nd - 2; d++) bd[d] = d;
  ref_t r = iota_along(e, nd, x.sz, nd - 2);
  ref_t rowj = spread(e, block(e, x, j, j + 1, 0, x.sz[nd - 1]), nd, x.sz);
  ref_t rowp = spread(e, row_at(e, x, p), nd, x.sz);
  ref_t at_p = compare(e, "EQ", r, bcast_dims(e, p, nd, x.sz, bd));
  ref_t at_j = compare(e, "EQ", r, cst_like(e, TPU_I64, (double)j, nd, x.sz));
  return select3(e, at_j, rowp, select3(e, at_p, rowj, x));
}

/* pivot j (0-based i64 row, the batch dims' shape) of 1-based int pivots */
static ref_t pivot_at(em_t* e, ref_t piv, int64_t j) {
  int64_t s[TPU_MAX_DIMS] = {0}, l[TPU_MAX_DIMS];
  memcpy(l, piv.sz, sizeof(int64_t) * (size_t)piv.nd);
  s[piv.nd - 1] = j;
  l[piv.nd - 1] = j + 1;
  ref_t p = slice(e, convert(e, piv, TPU_I64), s, l);
  return scalar_op(e, "stablehlo.subtract", reshape(e, p, piv.nd - 1, piv.sz), 1);
}

/* x's rows permuted as the pivots' swaps do, in order (or undone, in reverse) */
static ref_t apply_pivots(em_t* e, ref_t x, ref_t piv, bool undo) {
  const int64_t k = piv.sz[piv.nd - 1];
  for (int64_t i = 0; i < k; i++) {
    const int64_t j = undo ? k - 1 - i : i;
    x = swap_rows(e, x, j, pivot_at(e, piv, j));
  }
  return x;
}

typedef struct {
  ref_t lu;   /* L below the diagonal (unit), U on and above */
  ref_t piv;  /* [..., k] int32, 1-based */
  ref_t info; /* [...] int32: the first zero pivot's column + 1, else 0 */
} lu_t;

static void getrf(em_t* e, ref_t a, lu_t* out) {
  const int nd = a.nd;
  const int64_t m = a.sz[nd - 2], n = a.sz[nd - 1], k = m < n ? m : n;
  int64_t csz[TPU_MAX_DIMS], bsz[TPU_MAX_DIMS];
  memcpy(csz, a.sz, sizeof(int64_t) * (size_t)nd);
  csz[nd - 1] = 1;
  memcpy(bsz, a.sz, sizeof(int64_t) * (size_t)(nd - 2));
  int64_t rd[1] = {nd - 2}, p1[TPU_MAX_DIMS];
  memcpy(p1, bsz, sizeof(int64_t) * (size_t)(nd - 2));
  p1[nd - 2] = 1;
  ref_t rows = iota_along(e, nd, a.sz, nd - 2), cols = iota_along(e, nd, a.sz, nd - 1);
  ref_t crow = iota_along(e, nd, csz, nd - 2);
  ref_t info = cst_like(e, TPU_I32, 0, nd - 2, bsz);
  ref_t pivs[64];
  if (k > 64) return; /* the caller checked */
  for (int64_t j = 0; j < k; j++) {
    /* the pivot: the first row at or below j of largest magnitude in column j */
    ref_t col = block(e, a, 0, m, j, j + 1);
    ref_t mag = select3(e, compare(e, "GE", crow, cst_like(e, TPU_I64, (double)j, nd, csz)),
                        unop(e, "stablehlo.abs", col), cst_like(e, a.dt, -1, nd, csz));
    ref_t best = reduce(e, mag, 1, rd, "stablehlo.maximum", -INFINITY);
    int64_t bdims[TPU_MAX_DIMS]; /* best: [batch..., 1], the column's dim last */
    for (int d = 0; d < nd - 2; d++) bdims[d] = d;
    bdims[nd - 2] = nd - 1;
    ref_t is_best = compare(e, "EQ", mag, bcast_dims(e, best, nd, csz, bdims));
    ref_t p = reduce(e, select3(e, is_best, crow, cst_like(e, TPU_I64, (double)m, nd, csz)), 1, rd,
                     "stablehlo.minimum", (double)m);
    p = reshape(e, p, nd - 2, bsz);
    pivs[j] = reshape(e, convert(e, scalar_op(e, "stablehlo.add", p, 1), TPU_I32), nd - 1, p1);
    a = swap_rows(e, a, j, p);
    /* eliminate below the pivot */
    ref_t prow = block(e, a, j, j + 1, 0, n);
    ref_t pv = block(e, prow, 0, 1, j, j + 1);
    ref_t zero = compare(e, "EQ", pv, cst_like(e, a.dt, 0, pv.nd, pv.sz));
    ref_t colj = block(e, a, 0, m, j, j + 1);
    ref_t l = select3(e, spread(e, zero, nd, csz), colj, binop(e, "stablehlo.divide", colj, spread(e, pv, nd, csz)));
    ref_t below = compare(e, "GT", rows, cst_like(e, TPU_I64, (double)j, nd, a.sz));
    ref_t right = compare(e, "GT", cols, cst_like(e, TPU_I64, (double)j, nd, a.sz));
    ref_t at_j = compare(e, "EQ", cols, cst_like(e, TPU_I64, (double)j, nd, a.sz));
    ref_t lb = spread(e, l, nd, a.sz);
    ref_t upd = binop(e, "stablehlo.subtract", a, binop(e, "stablehlo.multiply", lb, spread(e, prow, nd, a.sz)));
    a = select3(e, binop(e, "stablehlo.and", below, right), upd,
                select3(e, binop(e, "stablehlo.and", below, at_j), lb, a));
    ref_t z = reshape(e, zero, nd - 2, bsz);
    ref_t first = binop(e, "stablehlo.and", z, compare(e, "EQ", info, cst_like(e, TPU_I32, 0, nd - 2, bsz)));
    info = select3(e, first, cst_like(e, TPU_I32, (double)(j + 1), nd - 2, bsz), info);
  }
  int64_t psz[TPU_MAX_DIMS];
  memcpy(psz, bsz, sizeof(int64_t) * (size_t)(nd - 2));
  psz[nd - 2] = k;
  out->piv = k == 1 ? pivs[0]
                    : emit(e, "stablehlo.concatenate", (int)k, pivs, mkref(TPU_I32, nd - 1, psz), "dimension = %d : i64",
                           nd - 2);
  out->lu = a;
  out->info = info;
}

/* The unrolled factorization's column limit (program size grows with it). */
#define MAX_LU_COLS 64

/* X with A X = B (adjoint: A^T X = B) from A's LU and pivots; B [..., n, r] */
static ref_t lu_solve_left(em_t* e, ref_t lu, ref_t piv, ref_t b, bool adjoint) {
  if (!adjoint) { /* A = P L U: X = U^-1 L^-1 P^T B */
    ref_t y = tri_solve(e, lu, apply_pivots(e, b, piv, false), true, true, true, false);
    return tri_solve(e, lu, y, true, false, false, false);
  }
  /* A^T = U^T L^T P^T: X = P L^-T U^-T B */
  ref_t y = tri_solve(e, lu, b, true, false, false, true);
  return apply_pivots(e, tri_solve(e, lu, y, true, true, true, true), piv, true);
}

/* left: A X = B, else X A = B (the transposed system); adjoint: A^T instead of A */
static ref_t lu_solve_any(em_t* e, ref_t lu, ref_t piv, ref_t b, bool left, bool adjoint) {
  if (left) return lu_solve_left(e, lu, piv, b, adjoint);
  return transpose_last2(e, lu_solve_left(e, lu, piv, transpose_last2(e, b), !adjoint));
}

/* the diagonal of a square matrix batch, [..., n] */
static ref_t diagonal(em_t* e, ref_t a) {
  ref_t d = select3(e, compare(e, "EQ", iota_along(e, a.nd, a.sz, a.nd - 2), iota_along(e, a.nd, a.sz, a.nd - 1)), a,
                    cst_like(e, a.dt, 0, a.nd, a.sz));
  int64_t rd[1] = {a.nd - 1};
  return reduce(e, d, 1, rd, "stablehlo.add", 0);
}

/* (-1)^(the pivots that swap), as a.dt, the batch dims' shape */
static ref_t pivot_sign(em_t* e, ref_t piv, tpu_dtype_t dt) {
  const int nd = piv.nd;
  ref_t at = scalar_op(e, "stablehlo.add", iota_along(e, nd, piv.sz, nd - 1), 1);
  ref_t swaps = convert(e, compare(e, "NE", convert(e, piv, TPU_I64), at), TPU_I64);
  int64_t rd[1] = {nd - 1};
  ref_t cnt = reduce(e, swaps, 1, rd, "stablehlo.add", 0);
  ref_t odd = compare(e, "NE", binop(e, "stablehlo.remainder", cnt, cst_like(e, TPU_I64, 2, cnt.nd, cnt.sz)),
                      cst_like(e, TPU_I64, 0, cnt.nd, cnt.sz));
  return select3(e, odd, cst_like(e, dt, -1, cnt.nd, cnt.sz), cst_like(e, dt, 1, cnt.nd, cnt.sz));
}

/* P of A = P L U: the permutation the pivots make, P[perm[c], c] = 1 */
static ref_t permutation(em_t* e, ref_t piv, int64_t m, tpu_dtype_t dt) {
  const int nd = piv.nd + 1;
  int64_t sz[TPU_MAX_DIMS];
  memcpy(sz, piv.sz, sizeof(int64_t) * (size_t)(piv.nd - 1));
  sz[nd - 2] = m;
  sz[nd - 1] = 1;
  /* the rows in order after the swaps: perm as an [..., m, 1] column */
  ref_t perm = apply_pivots(e, iota_along(e, nd, sz, nd - 2), piv, false);
  int64_t psz[TPU_MAX_DIMS];
  memcpy(psz, sz, sizeof(int64_t) * (size_t)nd);
  psz[nd - 1] = m;
  /* P[r, c] = (r == perm[c]) */
  return convert(e, compare(e, "EQ", iota_along(e, nd, psz, nd - 2), spread(e, transpose_last2(e, perm), nd, psz)), dt);
}

/* L (unit lower, m x k) and U (upper, k x n) of packed LU */
static void unpack(em_t* e, ref_t lu, ref_t* l, ref_t* u) {
  const int nd = lu.nd;
  const int64_t m = lu.sz[nd - 2], n = lu.sz[nd - 1], k = m < n ? m : n;
  ref_t lo = block(e, lu, 0, m, 0, k);
  *l = binop(e, "stablehlo.add", triangle(e, lo, true, true), eye_like(e, lu.dt, nd, lo.sz));
  *u = triangle(e, block(e, lu, 0, k, 0, n), false, false);
}

/* ---- matrix exponential (float64) ----
 * Scaling and squaring: B = A / 2^s with s = max(0, ceil(log2 |A|_1)) per
 * matrix so that |B|_1 <= 1, exp(B) by its Taylor series to degree 18
 * (remainder below 1/19! ~ 8e-18), then s squarings in a while loop (each
 * matrix squares while the count is below its own s). */
static ref_t mexp_cond(em_t* e, const ref_t* v, void* ctx) {
  (void)ctx;
  return any_of(e, compare(e, "LT", bcast(e, v[0], v[2].nd, v[2].sz), v[2]));
}
static void mexp_body(em_t* e, const ref_t* v, ref_t* nx, void* ctx) {
  (void)ctx;
  ref_t x = v[1];
  const int nd = x.nd;
  ref_t sq = dot_general(e, x, x, nd - 2, nd - 1, nd - 2, x, TPU_PRECISION_HIGHEST);
  ref_t live = compare(e, "LT", bcast(e, v[0], v[2].nd, v[2].sz), v[2]); /* [..., 1, 1] */
  nx[0] = binop(e, "stablehlo.add", v[0], cst(e, TPU_F64, 1));
  nx[1] = select3(e, spread(e, live, nd, x.sz), sq, x);
  nx[2] = v[2];
}

static ref_t matrix_exp(em_t* e, ref_t a) {
  const int nd = a.nd;
  int64_t rd[1] = {nd - 2}, cd[1] = {nd - 1};
  /* the 1-norm: the largest column sum of magnitudes, [..., 1, 1] */
  ref_t cs = reduce_keep(e, unop(e, "stablehlo.abs", a), 1, rd, "stablehlo.add", 0);
  ref_t nrm = reduce_keep(e, cs, 1, cd, "stablehlo.maximum", 0);
  ref_t s = unop(e, "stablehlo.ceil", binop(e, "stablehlo.divide", unop(e, "stablehlo.log", nrm),
                                             cst_like(e, TPU_F64, M_LN2, nrm.nd, nrm.sz)));
  s = binop(e, "stablehlo.maximum", s, cst_like(e, TPU_F64, 0, s.nd, s.sz)); /* log(0) = -inf: 0 */
  s = binop(e, "stablehlo.minimum", s, cst_like(e, TPU_F64, 1100, s.nd, s.sz)); /* inf / nan norms end */
  s = select3(e, compare(e, "NE", s, s), cst_like(e, TPU_F64, 0, s.nd, s.sz), s);
  ref_t b = binop(e, "stablehlo.divide", a, spread(e, binop(e, "stablehlo.power", cst_like(e, TPU_F64, 2, s.nd, s.sz), s), nd, a.sz));
  ref_t eye = eye_like(e, TPU_F64, nd, a.sz), r = eye;
  for (int k = 18; k >= 1; k--) /* I + B/k (I + B/(k+1) (...)) */
    r = binop(e, "stablehlo.add", eye,
              scalar_op(e, "stablehlo.divide", dot_general(e, b, r, nd - 2, nd - 1, nd - 2, a, TPU_PRECISION_HIGHEST), (double)k));
  ref_t v[3] = {cst(e, TPU_F64, 0), r, s};
  while_loop(e, 3, v, mexp_cond, mexp_body, NULL);
  return v[1];
}

/* ---- Householder QR (float64, LAPACK's geqrf layout and signs) ---- */
/* reflector j of the packed a [..., m, n]: v [..., m, 1], 1 at row j, a's column j below */
static ref_t reflector(em_t* e, ref_t a, int64_t j) {
  const int nd = a.nd;
  const int64_t m = a.sz[nd - 2];
  ref_t col = block(e, a, 0, m, j, j + 1), r = iota_along(e, nd, col.sz, nd - 2);
  ref_t jj = cst_like(e, TPU_I64, (double)j, nd, col.sz);
  return select3(e, compare(e, "EQ", r, jj), cst_like(e, a.dt, 1, nd, col.sz),
                 select3(e, compare(e, "GT", r, jj), col, cst_like(e, a.dt, 0, nd, col.sz)));
}

/* (I - tau v v^T) y for y [..., m, c], tau [..., 1, 1] */
static ref_t reflect(em_t* e, ref_t v, ref_t tau, ref_t y) {
  int64_t rd[1] = {y.nd - 2};
  ref_t s = reduce_keep(e, binop(e, "stablehlo.multiply", spread(e, v, y.nd, y.sz), y), 1, rd, "stablehlo.add", 0);
  ref_t ts = binop(e, "stablehlo.multiply", spread(e, tau, s.nd, s.sz), s);
  return binop(e, "stablehlo.subtract", y, binop(e, "stablehlo.multiply", spread(e, v, y.nd, y.sz), spread(e, ts, y.nd, y.sz)));
}

/* tau j of [..., k] as [..., 1, 1] */
static ref_t tau_at(em_t* e, ref_t tau, int64_t j) {
  int64_t lo[TPU_MAX_DIMS] = {0}, hi[TPU_MAX_DIMS], sz[TPU_MAX_DIMS];
  memcpy(hi, tau.sz, sizeof(int64_t) * (size_t)tau.nd);
  lo[tau.nd - 1] = j;
  hi[tau.nd - 1] = j + 1;
  memcpy(sz, tau.sz, sizeof(int64_t) * (size_t)tau.nd);
  sz[tau.nd - 1] = 1;
  sz[tau.nd] = 1;
  return reshape(e, slice(e, tau, lo, hi), tau.nd + 1, sz);
}

/* a [..., m, n] -> packed R and reflectors, tau [..., min(m, n)] */
static void geqrf(em_t* e, ref_t a, ref_t* out_a, ref_t* out_tau) {
  const int nd = a.nd;
  const int64_t m = a.sz[nd - 2], n = a.sz[nd - 1], k = m < n ? m : n;
  ref_t taus[MAX_LU_COLS];
  int64_t rd[1] = {nd - 2};
  ref_t rows = iota_along(e, nd, a.sz, nd - 2), cols = iota_along(e, nd, a.sz, nd - 1);
  for (int64_t j = 0; j < k; j++) {
    ref_t col = block(e, a, 0, m, j, j + 1), alpha = block(e, a, j, j + 1, j, j + 1);
    ref_t cr = iota_along(e, nd, col.sz, nd - 2);
    ref_t below = compare(e, "GT", cr, cst_like(e, TPU_I64, (double)j, nd, col.sz));
    ref_t xb = select3(e, below, col, cst_like(e, a.dt, 0, nd, col.sz));
    ref_t xn2 = reduce_keep(e, binop(e, "stablehlo.multiply", xb, xb), 1, rd, "stablehlo.add", 0);
    ref_t none = compare(e, "EQ", xn2, cst_like(e, a.dt, 0, xn2.nd, xn2.sz));
    ref_t h = unop(e, "stablehlo.sqrt", binop(e, "stablehlo.add", binop(e, "stablehlo.multiply", alpha, alpha), xn2));
    ref_t beta = select3(e, compare(e, "LT", alpha, cst_like(e, a.dt, 0, alpha.nd, alpha.sz)), h, unop(e, "stablehlo.negate", h));
    ref_t bs = select3(e, none, cst_like(e, a.dt, 1, beta.nd, beta.sz), beta);
    ref_t tau = select3(e, none, cst_like(e, a.dt, 0, beta.nd, beta.sz),
                        binop(e, "stablehlo.divide", binop(e, "stablehlo.subtract", beta, alpha), bs));
    ref_t den = select3(e, none, cst_like(e, a.dt, 1, beta.nd, beta.sz), binop(e, "stablehlo.subtract", alpha, beta));
    ref_t vcol = select3(e, below, binop(e, "stablehlo.divide", col, spread(e, den, nd, col.sz)), col);
    /* column j: beta on the diagonal (alpha where nothing reflects), v below */
    vcol = select3(e, compare(e, "EQ", cr, cst_like(e, TPU_I64, (double)j, nd, col.sz)),
                   spread(e, select3(e, none, alpha, beta), nd, col.sz), vcol);
    ref_t at_j = compare(e, "EQ", cols, cst_like(e, TPU_I64, (double)j, nd, a.sz));
    a = select3(e, at_j, spread(e, vcol, nd, a.sz), a);
    /* the trailing columns: (I - tau v v^T) A */
    ref_t v = reflector(e, a, j);
    ref_t upd = reflect(e, v, tau, a);
    ref_t right = compare(e, "GT", cols, cst_like(e, TPU_I64, (double)j, nd, a.sz));
    a = select3(e, right, upd, a);
    (void)rows;
    int64_t tsz[TPU_MAX_DIMS];
    memcpy(tsz, a.sz, sizeof(int64_t) * (size_t)(nd - 2));
    tsz[nd - 2] = 1;
    taus[j] = reshape(e, tau, nd - 1, tsz);
  }
  int64_t tsz[TPU_MAX_DIMS];
  memcpy(tsz, a.sz, sizeof(int64_t) * (size_t)(nd - 2));
  tsz[nd - 2] = k;
  *out_tau = k == 1 ? taus[0]
                    : emit(e, "stablehlo.concatenate", (int)k, taus, mkref(a.dt, nd - 1, tsz), "dimension = %d : i64", nd - 2);
  *out_a = a;
}

/* H_first ... applied to y from the left, reflectors j = from, from + step, ... (k of them) */
static ref_t apply_reflectors(em_t* e, ref_t a, ref_t tau, ref_t y, bool reverse) {
  const int64_t k = tau.sz[tau.nd - 1];
  for (int64_t i = 0; i < k; i++) {
    const int64_t j = reverse ? k - 1 - i : i;
    y = reflect(e, reflector(e, a, j), tau_at(e, tau, j), y);
  }
  return y;
}

/* Q's first c columns (H_1 ... H_k I[:, :c]) */
static ref_t q_columns(em_t* e, ref_t a, ref_t tau, int64_t c) {
  int64_t sz[TPU_MAX_DIMS];
  memcpy(sz, a.sz, sizeof(int64_t) * (size_t)a.nd);
  sz[a.nd - 1] = c;
  return apply_reflectors(e, a, tau, eye_like(e, a.dt, a.nd, sz), true);
}

/* linalg_qr(A, mode) -> (Q, R); linalg_householder_product(A, tau);
 * ormqr(A, tau, C, left, transpose) */
static bool lower_householder(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!is_tensor(n, 0)) return false;
  const tpu_tensor_t* t = c->args[0].v.t;
  if (t->ndim < 2 || (t->dtype != TPU_F32 && t->dtype != TPU_F64) || c->nouts < 1) return false;
  const int64_t m = t->sizes[t->ndim - 2], nn = t->sizes[t->ndim - 1], k = m < nn ? m : nn;
  if (k > MAX_LU_COLS) return false;
  if (tpu_tensor_numel(t) == 0) { /* Q is the identity's columns, R and the rest empty or zero */
    for (int i = 0; i < c->nouts; i++) {
      const tpu_tensor_t* r = &c->outs[i];
      if (r->dtype == TPU_DTYPE_NONE) continue;
      outs[i] = r->ndim >= 2 && i == 0 && strcmp(base, "ormqr") ? eye_like(e, r->dtype, r->ndim, r->sizes)
                                                                 : cst_like(e, r->dtype, 0, r->ndim, r->sizes);
    }
    return true;
  }
  ref_t a = convert(e, arg(n, 0), TPU_F64);
  if (!strcmp(base, "linalg_qr")) {
    const char* mode = tpu_arg_str(c, 1, "reduced");
    const bool complete = mode && !strcmp(mode, "complete"), ronly = mode && !strcmp(mode, "r");
    ref_t packed, tau;
    geqrf(e, a, &packed, &tau);
    const int64_t rr = complete ? m : k;
    outs[1] = convert(e, triangle(e, block(e, packed, 0, rr, 0, nn), false, false), c->outs[1].dtype);
    outs[0] = ronly ? cst_like(e, c->outs[0].dtype, 0, c->outs[0].ndim, c->outs[0].sizes)
                    : convert(e, q_columns(e, packed, tau, rr), odt);
    return true;
  }
  if (!is_tensor(n, 1)) return false;
  ref_t tau = convert(e, arg(n, 1), TPU_F64);
  if (tau.nd != a.nd - 1 || tau.sz[tau.nd - 1] > nn) return false;
  if (!strcmp(base, "linalg_householder_product")) {
    outs[0] = convert(e, q_columns(e, a, tau, nn), odt);
    return true;
  }
  if (!strcmp(base, "ormqr") && is_tensor(n, 2)) {
    const bool left = tpu_arg_bool(c, 3, true), tr = tpu_arg_bool(c, 4, false);
    ref_t y = convert(e, arg(n, 2), TPU_F64);
    if (y.nd != a.nd) return false;
    /* Q C = H_1 .. H_k C; Q^T C = H_k .. H_1 C; C Q = (Q^T C^T)^T; C Q^T = (Q C^T)^T */
    if (left) {
      outs[0] = convert(e, apply_reflectors(e, a, tau, y, !tr), odt);
    } else {
      outs[0] = convert(e, transpose_last2(e, apply_reflectors(e, a, tau, transpose_last2(e, y), tr)), odt);
    }
    return true;
  }
  return false;
}

/* ---- Jacobi rotations (float64) ---- */
/* The largest matrix the unrolled sweeps take (n (n - 1) / 2 rotations each). */
#define MAX_JACOBI 24

/* x [..., r, n] with columns p, q replaced by c x_p - s x_q and s x_p + c x_q
 * (c, s: [..., 1, 1]) */
static ref_t rotate_cols(em_t* e, ref_t x, int64_t p, int64_t q, ref_t c, ref_t s) {
  const int nd = x.nd;
  const int64_t r = x.sz[nd - 2];
  ref_t xp = block(e, x, 0, r, p, p + 1), xq = block(e, x, 0, r, q, q + 1);
  ref_t cb = spread(e, c, nd, xp.sz), sb = spread(e, s, nd, xp.sz);
  ref_t np = binop(e, "stablehlo.subtract", binop(e, "stablehlo.multiply", cb, xp), binop(e, "stablehlo.multiply", sb, xq));
  ref_t nq = binop(e, "stablehlo.add", binop(e, "stablehlo.multiply", sb, xp), binop(e, "stablehlo.multiply", cb, xq));
  ref_t col = iota_along(e, nd, x.sz, nd - 1);
  ref_t at_p = compare(e, "EQ", col, cst_like(e, TPU_I64, (double)p, nd, x.sz));
  ref_t at_q = compare(e, "EQ", col, cst_like(e, TPU_I64, (double)q, nd, x.sz));
  return select3(e, at_p, spread(e, np, nd, x.sz), select3(e, at_q, spread(e, nq, nd, x.sz), x));
}

/* the rotation (c, s) with t = sign(z) / (|z| + sqrt(1 + z^2)), c = 1 / sqrt(1 + t^2),
 * s = c t; none (c = 1, s = 0) where `skip` */
static void rotation(em_t* e, ref_t z, ref_t skip, ref_t* c, ref_t* s) {
  ref_t one = cst_like(e, z.dt, 1, z.nd, z.sz);
  ref_t sg = select3(e, compare(e, "GE", z, cst_like(e, z.dt, 0, z.nd, z.sz)), one, unop(e, "stablehlo.negate", one));
  ref_t t = binop(e, "stablehlo.divide", sg,
                  binop(e, "stablehlo.add", unop(e, "stablehlo.abs", z),
                        unop(e, "stablehlo.sqrt", binop(e, "stablehlo.add", one, binop(e, "stablehlo.multiply", z, z)))));
  ref_t cc = unop(e, "stablehlo.rsqrt", binop(e, "stablehlo.add", one, binop(e, "stablehlo.multiply", t, t)));
  *c = select3(e, skip, one, cc);
  *s = select3(e, skip, cst_like(e, z.dt, 0, z.nd, z.sz), binop(e, "stablehlo.multiply", cc, t));
}

/* sum over the rows of a [..., r, 1] column pair product: [..., 1, 1] */
static ref_t col_dot(em_t* e, ref_t a, ref_t b) {
  int64_t rd[1] = {a.nd - 2};
  return reduce_keep(e, binop(e, "stablehlo.multiply", a, b), 1, rd, "stablehlo.add", 0);
}

/* one-sided Jacobi sweeps on W [..., m, n] (m >= n), V [..., n, n]; carried:
 * sweep (i64), rotated (i1), W, V */
static ref_t svd_cond(em_t* e, const ref_t* v, void* ctx) {
  (void)ctx;
  return binop(e, "stablehlo.and", compare(e, "LT", v[0], cst(e, TPU_I64, 80)), v[1]);
}
static void svd_body(em_t* e, const ref_t* v, ref_t* nx, void* ctx) {
  (void)ctx;
  ref_t w = v[2], vv = v[3];
  const int nd = w.nd;
  const int64_t m = w.sz[nd - 2], n = w.sz[nd - 1];
  ref_t any = cst(e, TPU_BOOL, 0);
  for (int64_t p = 0; p + 1 < n; p++)
    for (int64_t q = p + 1; q < n; q++) {
      ref_t wp = block(e, w, 0, m, p, p + 1), wq = block(e, w, 0, m, q, q + 1);
      ref_t al = col_dot(e, wp, wp), be = col_dot(e, wq, wq), ga = col_dot(e, wp, wq);
      ref_t lim = scalar_op(e, "stablehlo.multiply", unop(e, "stablehlo.sqrt", binop(e, "stablehlo.multiply", al, be)),
                            4 * 2.220446049250313e-16);
      ref_t skip = compare(e, "LE", unop(e, "stablehlo.abs", ga), lim); /* gamma == 0 included */
      ref_t gs = select3(e, skip, cst_like(e, ga.dt, 1, ga.nd, ga.sz), ga);
      ref_t z = binop(e, "stablehlo.divide", binop(e, "stablehlo.subtract", be, al), scalar_op(e, "stablehlo.multiply", gs, 2));
      ref_t c, s;
      rotation(e, z, skip, &c, &s);
      w = rotate_cols(e, w, p, q, c, s);
      vv = rotate_cols(e, vv, p, q, c, s);
      any = binop(e, "stablehlo.or", any, any_of(e, unop(e, "stablehlo.not", skip)));
    }
  nx[0] = binop(e, "stablehlo.add", v[0], cst(e, TPU_I64, 1));
  nx[1] = any;
  nx[2] = w;
  nx[3] = vv;
}

/* cyclic two-sided Jacobi on a symmetric A [..., n, n] with V; carried:
 * sweep (i64), A, V */
static ref_t offdiag_ratio_big(em_t* e, ref_t a) {
  const int nd = a.nd;
  ref_t sq = binop(e, "stablehlo.multiply", a, a);
  ref_t offm = select3(e, compare(e, "NE", iota_along(e, nd, a.sz, nd - 2), iota_along(e, nd, a.sz, nd - 1)), sq,
                       cst_like(e, a.dt, 0, nd, a.sz));
  int64_t rd[2] = {nd - 2, nd - 1};
  ref_t off = reduce(e, offm, 2, rd, "stablehlo.add", 0), tot = reduce(e, sq, 2, rd, "stablehlo.add", 0);
  const double eps = 2.220446049250313e-16;
  ref_t big = binop(e, "stablehlo.and", compare(e, "GT", off, scalar_op(e, "stablehlo.multiply", tot, eps * eps * 1e-2)),
                    compare(e, "NE", off, cst_like(e, off.dt, 0, off.nd, off.sz)));
  return any_of(e, big);
}
static ref_t eigh_cond(em_t* e, const ref_t* v, void* ctx) {
  (void)ctx;
  return binop(e, "stablehlo.and", compare(e, "LT", v[0], cst(e, TPU_I64, 100)), offdiag_ratio_big(e, v[1]));
}
static void eigh_body(em_t* e, const ref_t* v, ref_t* nx, void* ctx) {
  (void)ctx;
  ref_t a = v[1], vv = v[2];
  const int64_t n = a.sz[a.nd - 1];
  for (int64_t p = 0; p + 1 < n; p++)
    for (int64_t q = p + 1; q < n; q++) {
      ref_t apq = block(e, a, p, p + 1, q, q + 1), app = block(e, a, p, p + 1, p, p + 1), aqq = block(e, a, q, q + 1, q, q + 1);
      ref_t skip = compare(e, "EQ", apq, cst_like(e, apq.dt, 0, apq.nd, apq.sz));
      ref_t as = select3(e, skip, cst_like(e, apq.dt, 1, apq.nd, apq.sz), apq);
      ref_t th = binop(e, "stablehlo.divide", binop(e, "stablehlo.subtract", aqq, app), scalar_op(e, "stablehlo.multiply", as, 2));
      ref_t c, s;
      rotation(e, th, skip, &c, &s);
      a = rotate_cols(e, a, p, q, c, s);
      a = transpose_last2(e, rotate_cols(e, transpose_last2(e, a), p, q, c, s)); /* the rows */
      vv = rotate_cols(e, vv, p, q, c, s);
    }
  nx[0] = binop(e, "stablehlo.add", v[0], cst(e, TPU_I64, 1));
  nx[1] = a;
  nx[2] = vv;
}

/* x [..., r, n] with its columns in the order idx [..., n] names (x[..., :, idx[j]]) */
static ref_t permute_cols(em_t* e, ref_t x, ref_t idx) {
  const int nd = x.nd;
  const int64_t n = x.sz[nd - 1];
  int64_t psz[TPU_MAX_DIMS], bd[TPU_MAX_DIMS];
  memcpy(psz, x.sz, sizeof(int64_t) * (size_t)nd);
  psz[nd - 2] = n;
  for (int d = 0; d < nd - 2; d++) bd[d] = d;
  bd[nd - 2] = nd - 1;
  /* P[..., i, j] = (idx[j] == i) */
  ref_t pm = convert(e, compare(e, "EQ", iota_along(e, nd, psz, nd - 2), bcast_dims(e, idx, nd, psz, bd)), x.dt);
  return dot_general(e, x, pm, nd - 2, nd - 1, nd - 2, x, TPU_PRECISION_HIGHEST);
}

/* each column of v (and of w alike) signed so that its entry of largest
 * magnitude is positive (the first such entry) */
static void sign_columns(em_t* e, ref_t* v, ref_t* w) {
  const int nd = v->nd;
  int64_t rd[1] = {nd - 2};
  ref_t av = unop(e, "stablehlo.abs", *v);
  ref_t mx = reduce_keep(e, av, 1, rd, "stablehlo.maximum", -INFINITY);
  ref_t rows = iota_along(e, nd, v->sz, nd - 2);
  ref_t first = reduce_keep(e, select3(e, compare(e, "EQ", av, spread(e, mx, nd, v->sz)), rows,
                                       cst_like(e, TPU_I64, (double)v->sz[nd - 2], nd, v->sz)),
                            1, rd, "stablehlo.minimum", (double)v->sz[nd - 2]);
  ref_t pick = reduce_keep(e, select3(e, compare(e, "EQ", rows, spread(e, first, nd, v->sz)), *v,
                                      cst_like(e, v->dt, 0, nd, v->sz)),
                           1, rd, "stablehlo.add", 0);
  ref_t sg = select3(e, compare(e, "LT", pick, cst_like(e, pick.dt, 0, pick.nd, pick.sz)),
                     cst_like(e, pick.dt, -1, pick.nd, pick.sz), cst_like(e, pick.dt, 1, pick.nd, pick.sz));
  *v = binop(e, "stablehlo.multiply", *v, spread(e, sg, nd, v->sz));
  if (w) *w = binop(e, "stablehlo.multiply", *w, spread(e, sg, w->nd, w->sz));
}

/* A [..., m, n], m >= n, float64: U [..., m, n] (columns of zero singular
 * values left zero), S [..., n] descending, V [..., n, n] */
static void jacobi_svd(em_t* e, ref_t a, ref_t* u, ref_t* sv, ref_t* v) {
  const int nd = a.nd;
  const int64_t m = a.sz[nd - 2], n = a.sz[nd - 1];
  int64_t vsz[TPU_MAX_DIMS];
  memcpy(vsz, a.sz, sizeof(int64_t) * (size_t)nd);
  vsz[nd - 2] = n;
  ref_t st[4] = {cst(e, TPU_I64, 0), cst(e, TPU_BOOL, 1), a, eye_like(e, a.dt, nd, vsz)};
  while_loop(e, 4, st, svd_cond, svd_body, NULL);
  ref_t w = st[2], vv = st[3];
  int64_t rd[1] = {nd - 2};
  ref_t nrm = unop(e, "stablehlo.sqrt", reduce(e, binop(e, "stablehlo.multiply", w, w), 1, rd, "stablehlo.add", 0));
  ref_t srt[2];
  sort_with_indices(e, nrm, nd - 2, true, srt);
  w = permute_cols(e, w, srt[1]);
  vv = permute_cols(e, vv, srt[1]);
  sign_columns(e, &vv, &w);
  ref_t s = srt[0];
  /* tiny: s[0] eps max(m, n) */
  int64_t lo[TPU_MAX_DIMS] = {0}, hi[TPU_MAX_DIMS];
  memcpy(hi, s.sz, sizeof(int64_t) * (size_t)s.nd);
  hi[s.nd - 1] = 1;
  ref_t s0 = slice(e, s, lo, hi);
  ref_t tiny = scalar_op(e, "stablehlo.multiply", s0, 2.220446049250313e-16 * (double)(m > n ? m : n));
  ref_t ok = compare(e, "GT", s, spread(e, tiny, s.nd, s.sz));
  int64_t sd[TPU_MAX_DIMS];
  for (int d = 0; d < nd - 2; d++) sd[d] = d;
  sd[nd - 2] = nd - 1;
  ref_t sdiv = select3(e, ok, s, cst_like(e, s.dt, 1, s.nd, s.sz));
  ref_t uu = binop(e, "stablehlo.divide", w, bcast_dims(e, sdiv, nd, w.sz, sd));
  *u = select3(e, bcast_dims(e, ok, nd, w.sz, sd), uu, cst_like(e, w.dt, 0, nd, w.sz));
  *sv = s;
  *v = vv;
}

/* _linalg_svd(A, full_matrices, compute_uv, driver) -> (U, S, Vh) */
static bool lower_svd(node_t* n, ref_t a, tpu_dtype_t ft, ref_t* outs) {
  em_t* e = n->e;
  const tpu_call_t* c = n->c;
  const int nd = a.nd;
  const int64_t m = a.sz[nd - 2], nn = a.sz[nd - 1], k = m < nn ? m : nn;
  const bool full = tpu_arg_bool(c, 1, true), uv = tpu_arg_bool(c, 2, true);
  if (k > MAX_JACOBI || c->nouts != 3) return false;
  if (uv && full && m != nn) return false; /* the completed bases: not here */
  const bool wide = m < nn;
  ref_t x = convert(e, wide ? transpose_last2(e, a) : a, TPU_F64), u, s, v;
  jacobi_svd(e, x, &u, &s, &v);
  /* A = U S V^T; for the wide A, A^T = U' S V'^T: U = V', Vh = U'^T */
  ref_t uo = wide ? v : u, vh = wide ? transpose_last2(e, u) : transpose_last2(e, v);
  outs[1] = convert(e, s, c->outs[1].dtype);
  if (uv) {
    outs[0] = convert(e, uo, c->outs[0].dtype);
    outs[2] = convert(e, vh, c->outs[2].dtype);
  } else {
    for (int i = 0; i < 3; i += 2) outs[i] = cst_like(e, c->outs[i].dtype, 0, c->outs[i].ndim, c->outs[i].sizes);
  }
  (void)ft;
  return true;
}

/* _linalg_eigh(A, UPLO, compute_v) -> (eigenvalues ascending, eigenvectors) */
static bool lower_eigh(node_t* n, ref_t a, ref_t* outs) {
  em_t* e = n->e;
  const tpu_call_t* c = n->c;
  const int nd = a.nd;
  const int64_t nn = a.sz[nd - 1];
  if (nn != a.sz[nd - 2] || nn > MAX_JACOBI || c->nouts != 2) return false;
  const char* uplo = tpu_arg_str(c, 1, "L");
  const bool lower = !uplo || uplo[0] != 'U';
  ref_t x = convert(e, a, TPU_F64);
  /* the symmetric matrix of the triangle read */
  ref_t t = triangle(e, x, lower, false), ts = triangle(e, x, lower, true);
  ref_t sym = binop(e, "stablehlo.add", t, transpose_last2(e, ts));
  ref_t st[3] = {cst(e, TPU_I64, 0), sym, eye_like(e, TPU_F64, nd, a.sz)};
  while_loop(e, 3, st, eigh_cond, eigh_body, NULL);
  ref_t w = diagonal(e, st[1]), srt[2];
  sort_with_indices(e, w, nd - 2, false, srt);
  outs[0] = convert(e, srt[0], c->outs[0].dtype);
  if (tpu_arg_bool(c, 2, true) && tpu_tensor_numel(&c->outs[1])) {
    ref_t v = permute_cols(e, st[2], srt[1]);
    sign_columns(e, &v, NULL);
    outs[1] = convert(e, v, c->outs[1].dtype);
  } else {
    outs[1] = cst_like(e, c->outs[1].dtype, 0, c->outs[1].ndim, c->outs[1].sizes);
  }
  return true;
}

static bool lower_linalg(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!is_tensor(n, 0)) return false;
  const tpu_tensor_t* t = c->args[0].v.t;
  const tpu_dtype_t ft = t->dtype;
  if (t->ndim < 2 || (ft != TPU_F32 && ft != TPU_F64)) return false;
  if (tpu_tensor_numel(t) == 0 && (!strcmp(base, "_linalg_det") || !strcmp(base, "_linalg_slogdet"))) {
    /* 0 x 0 matrices: det 1 (sign 1, log|det| 0); LU and pivots are empty */
    for (int i = 0; i < c->nouts; i++)
      if (c->outs[i].dtype != TPU_DTYPE_NONE)
        outs[i] = cst_like(e, c->outs[i].dtype, i == 0 ? 1 : 0, c->outs[i].ndim, c->outs[i].sizes);
    return true;
  }
  if (!strcmp(base, "linalg_matrix_exp")) {
    if (t->sizes[t->ndim - 1] != t->sizes[t->ndim - 2]) return false;
    outs[0] = tpu_tensor_numel(t) ? convert(e, matrix_exp(e, convert(e, arg(n, 0), TPU_F64)), odt)
                                  : cst_like(e, odt, 0, o->ndim, o->sizes);
    return true;
  }
  if ((!strcmp(base, "_linalg_svd") || !strcmp(base, "_linalg_eigh")) && tpu_tensor_numel(t) > 0) {
    ref_t a = convert(e, arg(n, 0), ft); /* (their first output may be empty: U, V not wanted) */
    return base[8] == 's' ? lower_svd(n, a, ft, outs) : lower_eigh(n, a, outs);
  }
  if (tpu_tensor_numel(o) == 0 || tpu_tensor_numel(t) == 0) { /* nothing to factor or solve */
    for (int i = 0; i < c->nouts; i++)
      outs[i] = cst_like(e, c->outs[i].dtype, 0, c->outs[i].ndim, c->outs[i].sizes);
    return true;
  }
  const int64_t rows = t->sizes[t->ndim - 2], cols = t->sizes[t->ndim - 1];
  const int64_t k = rows < cols ? rows : cols;
  ref_t a = convert(e, arg(n, 0), ft);
  if (!strcmp(base, "linalg_cholesky_ex") || !strcmp(base, "cholesky")) {
    /* (self, upper[, check_errors]) -> L (or U = L^T)[, info] */
    ref_t l = cholesky_lower(e, a);
    outs[0] = tpu_arg_bool(c, 1, false) ? transpose_last2(e, l) : l;
    if (c->nouts > 1) { /* info: the order of the first leading minor that is not positive definite */
      ref_t d = diagonal(e, l);
      ref_t ok = binop(e, "stablehlo.and", emit(e, "stablehlo.is_finite", 1, &d, mkref(TPU_BOOL, d.nd, d.sz), NULL),
                       compare(e, "GT", d, cst_like(e, ft, 0, d.nd, d.sz)));
      ref_t at = select3(e, ok, cst_like(e, TPU_I64, (double)rows, d.nd, d.sz), iota_along(e, d.nd, d.sz, d.nd - 1));
      int64_t rd[1] = {d.nd - 1};
      ref_t first = reduce(e, at, 1, rd, "stablehlo.minimum", (double)rows);
      ref_t none = compare(e, "EQ", first, cst_like(e, TPU_I64, (double)rows, first.nd, first.sz));
      outs[1] = convert(e, select3(e, none, cst_like(e, TPU_I64, 0, first.nd, first.sz),
                                   scalar_op(e, "stablehlo.add", first, 1)), c->outs[1].dtype);
    }
    return true;
  }
  if (!strcmp(base, "cholesky_inverse")) { /* (L, upper): (L L^T)^-1 = L^-T L^-1 */
    ref_t l = tpu_arg_bool(c, 1, false) ? transpose_last2(e, a) : a;
    ref_t linv = tri_solve(e, l, eye_like(e, ft, l.nd, l.sz), true, true, false, false);
    outs[0] = dot_general(e, transpose_last2(e, linv), linv, l.nd - 2, l.nd - 1, l.nd - 2, out_ref(n, ft),
                          TPU_PRECISION_HIGHEST);
    return true;
  }
  if (!strcmp(base, "_cholesky_solve_helper") && is_tensor(n, 1)) { /* (B, L, upper): L L^T X = B */
    ref_t b = a, l = convert(e, arg(n, 1), ft);
    if (!batch_broadcast(e, &l, &b)) return false;
    const bool upper = tpu_arg_bool(c, 2, false);
    outs[0] = tri_solve(e, l, tri_solve(e, l, b, true, !upper, false, upper), true, !upper, false, !upper);
    return true;
  }
  if (!strcmp(base, "linalg_solve_triangular") && is_tensor(n, 1)) { /* (A, B, upper, left, unitriangular) */
    ref_t b = convert(e, arg(n, 1), ft);
    if (!batch_broadcast(e, &a, &b)) return false;
    outs[0] = tri_solve(e, a, b, tpu_arg_bool(c, 3, true), !tpu_arg_bool(c, 2, false), tpu_arg_bool(c, 4, false), false);
    return true;
  }
  if (!strcmp(base, "triangular_solve") && is_tensor(n, 1) && c->nouts == 2) {
    /* (B, A, upper, transpose, unitriangular) -> (X, A) */
    ref_t b = a, m = convert(e, arg(n, 1), ft), m0 = m;
    if (!batch_broadcast(e, &m, &b)) return false;
    outs[0] = tri_solve(e, m, b, true, !tpu_arg_bool(c, 2, true), tpu_arg_bool(c, 4, false), tpu_arg_bool(c, 3, false));
    outs[1] = bcast(e, m0, c->outs[1].ndim, c->outs[1].sizes);
    return true;
  }
  if (!strcmp(base, "lu_unpack") && is_tensor(n, 1)) { /* (LU, pivots, unpack_data, unpack_pivots) -> P, L, U */
    if (k > MAX_LU_COLS) return false;
    ref_t piv = arg(n, 1), l, u;
    unpack(e, a, &l, &u);
    outs[0] = permutation(e, piv, rows, ft);
    outs[1] = l;
    outs[2] = u;
    return true;
  }
  if (!strcmp(base, "linalg_lu_solve") || !strcmp(base, "lu_solve")) {
    /* linalg_lu_solve(LU, pivots, B, left, adjoint); lu_solve(B, LU, pivots) */
    const bool old = base[0] == 'l' && base[1] == 'u';
    const int ilu = old ? 1 : 0, ipiv = old ? 2 : 1, ib = old ? 0 : 2;
    if (!is_tensor(n, ilu) || !is_tensor(n, ipiv) || !is_tensor(n, ib)) return false;
    ref_t lu = convert(e, arg(n, ilu), ft), piv = arg(n, ipiv), b = convert(e, arg(n, ib), ft);
    if (c->args[ilu].v.t->sizes[c->args[ilu].v.t->ndim - 1] > MAX_LU_COLS) return false;
    if (lu.nd != b.nd) return false; /* batch broadcasting of the factors: not here */
    outs[0] = lu_solve_any(e, lu, piv, b, old || tpu_arg_bool(c, 3, true), !old && tpu_arg_bool(c, 4, false));
    return true;
  }
  if (k > MAX_LU_COLS) return false;
  if (!strcmp(base, "linalg_lu_factor_ex") || !strcmp(base, "linalg_lu")) {
    if (!tpu_arg_bool(c, 1, true)) return false; /* pivot=False: not on the CPU either */
    lu_t f;
    getrf(e, a, &f);
    if (base[9] == '_') { /* linalg_lu_factor_ex: LU, pivots, info */
      outs[0] = f.lu;
      outs[1] = convert(e, f.piv, c->outs[1].dtype);
      outs[2] = convert(e, f.info, c->outs[2].dtype);
    } else { /* P, L, U */
      outs[0] = permutation(e, f.piv, rows, ft);
      unpack(e, f.lu, &outs[1], &outs[2]);
    }
    return true;
  }
  if (rows != cols) return false; /* the rest are of square matrices */
  if ((!strcmp(base, "linalg_solve_ex") || !strcmp(base, "_linalg_solve_ex")) && is_tensor(n, 1)) {
    /* (A, B, left, check_errors) -> result, LU, pivots, info; B a matrix or a batch of vectors */
    const bool left = tpu_arg_bool(c, 2, true);
    const tpu_tensor_t* bt = c->args[1].v.t;
    const bool vec = bt->ndim == 1 || (bt->ndim == t->ndim - 1 && !memcmp(bt->sizes, t->sizes, sizeof(int64_t) * (size_t)bt->ndim));
    ref_t b = convert(e, arg(n, 1), ft);
    if (vec) {
      int64_t sz[TPU_MAX_DIMS];
      memcpy(sz, b.sz, sizeof(int64_t) * (size_t)b.nd);
      sz[b.nd] = 1;
      b = reshape(e, b, b.nd + 1, sz);
      if (!left) return false;
    }
    lu_t f;
    ref_t a2 = a;
    if (!batch_broadcast(e, &a2, &b)) return false;
    getrf(e, a2, &f);
    outs[0] = lu_solve_any(e, f.lu, f.piv, b, left, false);
    outs[1] = f.lu;
    outs[2] = convert(e, f.piv, c->outs[2].dtype);
    outs[3] = convert(e, f.info, c->outs[3].dtype);
    return true;
  }
  lu_t f;
  getrf(e, a, &f);
  if (!strcmp(base, "linalg_inv_ex")) { /* (A, check_errors) -> inverse, info */
    outs[0] = lu_solve_left(e, f.lu, f.piv, eye_like(e, ft, a.nd, a.sz), false);
    outs[1] = convert(e, f.info, c->outs[1].dtype);
    return true;
  }
  if (!strcmp(base, "_linalg_det") || !strcmp(base, "_linalg_slogdet")) {
    /* det: product of U's diagonal with the pivots' sign -> det, LU, pivots;
     * slogdet: sign and log |det| -> sign, logabsdet, LU, pivots */
    ref_t d = diagonal(e, f.lu);
    int64_t rd[1] = {d.nd - 1};
    ref_t s = pivot_sign(e, f.piv, ft);
    int i = 0;
    if (base[8] == 'd') { /* _linalg_det */
      outs[i++] = binop(e, "stablehlo.multiply", s, reduce(e, d, 1, rd, "stablehlo.multiply", 1));
    } else {
      ref_t sg = reduce(e, unop(e, "stablehlo.sign", d), 1, rd, "stablehlo.multiply", 1);
      outs[i++] = binop(e, "stablehlo.multiply", s, sg);
      outs[i++] = reduce(e, unop(e, "stablehlo.log", unop(e, "stablehlo.abs", d)), 1, rd, "stablehlo.add", 0);
    }
    outs[i++] = f.lu;
    if (i < c->nouts && c->outs[i].dtype != TPU_DTYPE_NONE) outs[i] = convert(e, f.piv, c->outs[i].dtype);
    return true;
  }
  return false;
}

/* sorted by name (strcmp); tests/test_lower.c checks it */
static const tpu_lower_entry_t k_entries[] = {
    {"_cholesky_solve_helper", lower_linalg},
    {"_linalg_det", lower_linalg},
    {"_linalg_eigh", lower_linalg},
    {"_linalg_slogdet", lower_linalg},
    {"_linalg_solve_ex", lower_linalg},
    {"_linalg_svd", lower_linalg},
    {"cholesky", lower_linalg},
    {"cholesky_inverse", lower_linalg},
    {"linalg_cholesky_ex", lower_linalg},
    {"linalg_householder_product", lower_householder},
    {"linalg_inv_ex", lower_linalg},
    {"linalg_lu", lower_linalg},
    {"linalg_lu_factor_ex", lower_linalg},
    {"linalg_lu_solve", lower_linalg},
    {"linalg_matrix_exp", lower_linalg},
    {"linalg_qr", lower_householder},
    {"linalg_solve_ex", lower_linalg},
    {"linalg_solve_triangular", lower_linalg},
    {"lu_solve", lower_linalg},
    {"lu_unpack", lower_linalg},
    {"ormqr", lower_householder},
    {"triangular_solve", lower_linalg},
};

const tpu_lower_table_t tpu_lower_linalg = {k_entries, sizeof k_entries / sizeof k_entries[0]};
