/* General eigendecomposition (linalg_eig, _linalg_eigvals) of real and
 * complex square matrices, computed as LAPACK's dgeev / zgeev compute it, so
 * that the eigenvalues come out in CPU's order and the eigenvectors with
 * CPU's normalization:
 *
 *   1. balance (gebal, job 'B'): permutations isolating eigenvalues, then
 *      power-of-2 row/column scaling of the rest (rows ilo..ihi);
 *   2. Householder reduction to Hessenberg form (gehd2) and its Q (orghr),
 *      both done in complex arithmetic (exact for real input: every
 *      imaginary part stays 0);
 *   3. the small-matrix QR algorithm (lahqr): for real input Francis'
 *      double-shift iteration, 2x2 blocks standardized by dlanv2, so a
 *      complex pair appears with positive imaginary part first; for complex
 *      input the single-shift iteration with Wilkinson's shift. Both with
 *      the Ahues-Kressner deflation test and the exceptional shifts every
 *      10 iterations without a deflation;
 *   4. eigenvectors of the (quasi-)triangular Schur form by back
 *      substitution (trevc: x = 1 at the eigenvalue's place, or the
 *      2x2 block's own eigenvector), back-transformed by the Schur vectors and
 *      by the balancing (gebak);
 *   5. normalization: unit 2-norm; a real eigenvector of a real matrix keeps
 *      the sign step 4 gives it; a complex one is turned so that its entry of
 *      largest magnitude is real and positive.
 *
 * Everything runs in double (complex), matrices of a batch in parallel.
 * LAPACK switches to the multishift QR (dlaqr0) from order 75; here the
 * small-matrix iteration runs at every order, so for large matrices the
 * eigenvalue order may differ from CPU's.
 */
#include <float.h>
#include <stdatomic.h>

#include "linalg.h"
#include "tpu/parallel.h"

#define KEXSH 10 /* iterations without a deflation before an exceptional shift */

static double cabs1(zc_t z) { return fabs(creal(z)) + fabs(cimag(z)); }

/* ------------------------------------------------------------- balancing */

/* Swaps columns p and q over rows 0..l and rows p and q over columns k..n-1:
 * gebal's exchange of an isolated eigenvalue's row and column. */
static void exchange(zc_t* a, int64_t n, int64_t p, int64_t q, int64_t k, int64_t l) {
  for (int64_t r = 0; r <= l; r++) {
    zc_t t = a[r * n + p];
    a[r * n + p] = a[r * n + q], a[r * n + q] = t;
  }
  for (int64_t c = k; c < n; c++) {
    zc_t t = a[p * n + c];
    a[p * n + c] = a[q * n + c], a[q * n + c] = t;
  }
}

/* gebal with job 'B' on the n x n complex matrix a (real input is a complex
 * matrix with zero imaginary parts: the same steps as dgebal). Sets *ilo,
 * *ihi (0-based, inclusive) and scale: the permutation index for rows
 * outside ilo..ihi, the scaling factor inside. */
static void balance(zc_t* a, int64_t n, int64_t* ilo, int64_t* ihi, double* scale) {
  const double sclfac = 2.0, factor = 0.95;
  int64_t k = 0, l = n - 1;
  if (n == 0) {
    *ilo = 0, *ihi = -1;
    return;
  }
  /* Rows isolating an eigenvalue go to the bottom. */
  for (bool noconv = true; noconv;) {
    noconv = false;
    for (int64_t i = l; i >= 0; i--) {
      bool canswap = true;
      for (int64_t j = 0; j <= l && canswap; j++)
        if (i != j && a[i * n + j] != 0.0) canswap = false;
      if (!canswap) continue;
      scale[l] = (double)i;
      if (i != l) exchange(a, n, i, l, k, l);
      noconv = true;
      if (l == 0) {
        *ilo = 0, *ihi = 0;
        return;
      }
      l--;
    }
  }
  /* Columns isolating an eigenvalue go to the left. */
  for (bool noconv = true; noconv;) {
    noconv = false;
    for (int64_t j = k; j <= l; j++) {
      bool canswap = true;
      for (int64_t i = k; i <= l && canswap; i++)
        if (i != j && a[i * n + j] != 0.0) canswap = false;
      if (!canswap) continue;
      scale[k] = (double)j;
      if (j != k) exchange(a, n, j, k, k, l);
      noconv = true;
      k++;
    }
  }
  for (int64_t i = k; i <= l; i++) scale[i] = 1.0;
  /* Scale rows and columns k..l by powers of 2 until their norms balance. */
  const double sfmin1 = DBL_MIN / DBL_EPSILON, sfmax1 = 1.0 / sfmin1;
  const double sfmin2 = sfmin1 * sclfac, sfmax2 = 1.0 / sfmin2;
  for (bool noconv = true; noconv;) {
    noconv = false;
    for (int64_t i = k; i <= l; i++) {
      double c = 0.0, r = 0.0, ca = 0.0, ra = 0.0, best = -1.0;
      for (int64_t j = k; j <= l; j++) {
        c = hypot(c, cabs(a[j * n + i]));
        r = hypot(r, cabs(a[i * n + j]));
      }
      for (int64_t j = 0; j <= l; j++) /* i?amax: first largest |re| + |im| */
        if (cabs1(a[j * n + i]) > best) best = cabs1(a[j * n + i]), ca = cabs(a[j * n + i]);
      best = -1.0;
      for (int64_t j = k; j < n; j++)
        if (cabs1(a[i * n + j]) > best) best = cabs1(a[i * n + j]), ra = cabs(a[i * n + j]);
      if (c == 0.0 || r == 0.0) continue;
      if (isnan(c + ca + r + ra)) { /* LAPACK stops here (info -3) */
        *ilo = k, *ihi = l;
        return;
      }
      double g = r / sclfac, f = 1.0, s = c + r;
      while (c < g && fmax(f, fmax(c, ca)) < sfmax2 && fmin(r, fmin(g, ra)) > sfmin2) {
        f *= sclfac, c *= sclfac, ca *= sclfac;
        r /= sclfac, g /= sclfac, ra /= sclfac;
      }
      g = c / sclfac;
      while (g >= r && fmax(r, ra) < sfmax2 && fmin(fmin(f, c), fmin(g, ca)) > sfmin2) {
        f /= sclfac, c /= sclfac, g /= sclfac, ca /= sclfac;
        r *= sclfac, ra *= sclfac;
      }
      if (c + r >= factor * s) continue;
      if (f < 1.0 && scale[i] < 1.0 && f * scale[i] <= sfmin1) continue;
      if (f > 1.0 && scale[i] > 1.0 && scale[i] >= sfmax1 / f) continue;
      scale[i] *= f;
      noconv = true;
      for (int64_t j = k; j < n; j++) a[i * n + j] *= 1.0 / f;
      for (int64_t j = 0; j <= l; j++) a[j * n + i] *= f;
    }
  }
  *ilo = k, *ihi = l;
}

/* gebak for right eigenvectors: undoes the balancing on the rows of v
 * (n x n, row-major). */
static void balance_back(zc_t* v, int64_t n, int64_t ilo, int64_t ihi, const double* scale) {
  for (int64_t i = ilo; i <= ihi && ilo < ihi; i++) /* ilo == ihi: scale[ilo] is a permutation */
    for (int64_t j = 0; j < n; j++) v[i * n + j] *= scale[i];
  for (int64_t ii = 0; ii < n; ii++) {
    int64_t i = ii;
    if (i >= ilo && i <= ihi) continue;
    if (i < ilo) i = ilo - 1 - ii;
    int64_t p = (int64_t)scale[i];
    if (p == i) continue;
    for (int64_t j = 0; j < n; j++) {
      zc_t t = v[i * n + j];
      v[i * n + j] = v[p * n + j], v[p * n + j] = t;
    }
  }
}

/* ------------------------------------------------------------ Hessenberg */

/* gehd2 on rows/columns ilo..ihi of a (n x n), then, when q is not NULL,
 * q = H_ilo ... H_{ihi-1} (orghr). Entries below the subdiagonal are
 * zeroed. */
static void hessenberg(zc_t* a, int64_t n, int64_t ilo, int64_t ihi, zc_t* tau, zc_t* q) {
  for (int64_t i = ilo; i < ihi; i++) {
    zc_t* v = a + (i + 1) * n + i;
    int64_t len = ihi - i;
    tau[i] = tpu_zlarfg(v, len, n);
    tpu_zreflect_right(v, n, len, tau[i], a, n, i + 1, 0, ihi + 1);
    tpu_zreflect_left(v, n, len, conj(tau[i]), a, n, i + 1, i + 1, n);
  }
  if (q) {
    for (int64_t i = 0; i < n; i++)
      for (int64_t j = 0; j < n; j++) q[i * n + j] = i == j ? 1.0 : 0.0;
    for (int64_t i = ihi - 1; i >= ilo; i--)
      tpu_zreflect_left(a + (i + 1) * n + i, n, ihi - i, tau[i], q, n, i + 1, i + 1, n);
  }
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = 0; j + 1 < i; j++) a[i * n + j] = 0.0;
}

/* ------------------------------------------------- real QR algorithm */

/* Real reflector (dlarfg) for (alpha, x[0..n-2]); returns tau. */
static double dlarfg(int n, double* alpha, double* x) {
  double xnorm = 0.0;
  for (int i = 0; i < n - 1; i++) xnorm = hypot(xnorm, x[i]);
  if (xnorm == 0.0) return 0.0;
  double beta = -copysign(hypot(*alpha, xnorm), *alpha);
  double tau = (beta - *alpha) / beta, scal = 1.0 / (*alpha - beta);
  for (int i = 0; i < n - 1; i++) x[i] *= scal;
  *alpha = beta;
  return tau;
}

/* x' = c x + s y, y' = c y - s x over n pairs at strides. */
static void drot(int64_t n, double* x, int64_t sx, double* y, int64_t sy, double c, double s) {
  for (int64_t i = 0; i < n; i++) {
    double xi = x[i * sx], yi = y[i * sy];
    x[i * sx] = c * xi + s * yi;
    y[i * sy] = c * yi - s * xi;
  }
}

/* The Schur factorization of the real 2x2 matrix [a b; c d] (dlanv2):
 * [a b; c d] = [cs -sn; sn cs] [aa bb; cc dd] [cs sn; -sn cs], either
 * triangular (real eigenvalues) or with aa = dd and bb cc < 0 (a complex
 * pair, rt1i > 0). */
static void dlanv2(double* a, double* b, double* c, double* d, double* rt1r, double* rt1i,
                   double* rt2r, double* rt2i, double* cs, double* sn) {
  const double eps = DBL_EPSILON, multpl = 4.0;
  const double safmn2 = ldexp(1.0, (int)(log(DBL_MIN / eps) / log(2.0) / 2.0));
  const double safmx2 = 1.0 / safmn2;
  if (*c == 0.0) {
    *cs = 1.0, *sn = 0.0;
  } else if (*b == 0.0) { /* swap rows and columns */
    *cs = 0.0, *sn = 1.0;
    double t = *d;
    *d = *a, *a = t, *b = -*c, *c = 0.0;
  } else if (*a - *d == 0.0 && copysign(1.0, *b) != copysign(1.0, *c)) {
    *cs = 1.0, *sn = 0.0;
  } else {
    double temp = *a - *d, p = 0.5 * temp;
    double bcmax = fmax(fabs(*b), fabs(*c));
    double bcmis = fmin(fabs(*b), fabs(*c)) * copysign(1.0, *b) * copysign(1.0, *c);
    double scale = fmax(fabs(p), bcmax);
    double z = (p / scale) * p + (bcmax / scale) * bcmis;
    if (z >= multpl * eps) { /* real eigenvalues */
      z = p + copysign(sqrt(scale) * sqrt(z), p);
      *a = *d + z;
      *d = *d - (bcmax / z) * bcmis;
      double tau = hypot(*c, z);
      *cs = z / tau, *sn = *c / tau;
      *b = *b - *c, *c = 0.0;
    } else { /* complex or nearly equal real eigenvalues: equalize the diagonal */
      double sigma = *b + *c;
      for (int count = 0; count < 20; count++) {
        double sc = fmax(fabs(temp), fabs(sigma));
        if (sc >= safmx2) sigma *= safmn2, temp *= safmn2;
        else if (sc <= safmn2) sigma *= safmx2, temp *= safmx2;
        else break;
      }
      p = 0.5 * temp;
      double tau = hypot(sigma, temp);
      *cs = sqrt(0.5 * (1.0 + fabs(sigma) / tau));
      *sn = -(p / (tau * *cs)) * copysign(1.0, sigma);
      double aa = *a * *cs + *b * *sn, bb = -*a * *sn + *b * *cs;
      double cc = *c * *cs + *d * *sn, dd = -*c * *sn + *d * *cs;
      *a = aa * *cs + cc * *sn, *b = bb * *cs + dd * *sn;
      *c = -aa * *sn + cc * *cs, *d = -bb * *sn + dd * *cs;
      temp = 0.5 * (*a + *d);
      *a = temp, *d = temp;
      if (*c != 0.0) {
        if (*b != 0.0) {
          if (copysign(1.0, *b) == copysign(1.0, *c)) { /* real: make it triangular */
            double sab = sqrt(fabs(*b)), sac = sqrt(fabs(*c));
            p = copysign(sab * sac, *c);
            tau = 1.0 / sqrt(fabs(*b + *c));
            *a = temp + p, *d = temp - p;
            *b = *b - *c, *c = 0.0;
            double cs1 = sab * tau, sn1 = sac * tau;
            temp = *cs * cs1 - *sn * sn1;
            *sn = *cs * sn1 + *sn * cs1;
            *cs = temp;
          }
        } else {
          *b = -*c, *c = 0.0;
          temp = *cs, *cs = -*sn, *sn = temp;
        }
      }
    }
  }
  *rt1r = *a, *rt2r = *d;
  if (*c == 0.0) {
    *rt1i = 0.0, *rt2i = 0.0;
  } else {
    *rt1i = sqrt(fabs(*b)) * sqrt(fabs(*c));
    *rt2i = -*rt1i;
  }
}

/* LAPACK's dlahqr on the real upper Hessenberg h (n x n, row-major) over
 * rows/columns ilo..ihi (1-based below, as the reference code): eigenvalues
 * in wr/wi; with wantt the quasi-triangular Schur form in h, with wantz the
 * transformations accumulated into z. Returns 0, or the 1-based index of an
 * eigenvalue that failed to converge. */
static int64_t dlahqr(bool wantt, bool wantz, int64_t n, int64_t ilo, int64_t ihi, double* h,
                      double* wr, double* wi, double* z) {
#define H(i, j) h[((i) - 1) * n + (j) - 1]
#define Z(i, j) z[((i) - 1) * n + (j) - 1]
  const double dat1 = 0.75, dat2 = -0.4375;
  if (n == 0) return 0;
  if (ilo == ihi) {
    wr[ilo - 1] = H(ilo, ilo), wi[ilo - 1] = 0.0;
    return 0;
  }
  for (int64_t j = ilo; j <= ihi - 3; j++) H(j + 2, j) = 0.0, H(j + 3, j) = 0.0;
  if (ilo <= ihi - 2) H(ihi, ihi - 2) = 0.0;
  int64_t nh = ihi - ilo + 1;
  const double ulp = DBL_EPSILON, smlnum = DBL_MIN * ((double)nh / ulp);
  int64_t i1 = 1, i2 = n, itmax = 30 * (nh > 10 ? nh : 10), kdefl = 0;
  for (int64_t i = ihi; i >= ilo;) {
    int64_t l = ilo, k = i;
    bool split = false;
    for (int64_t its = 0; its <= itmax; its++) {
      for (k = i; k > l; k--) { /* a single small subdiagonal entry */
        if (fabs(H(k, k - 1)) <= smlnum) break;
        double tst = fabs(H(k - 1, k - 1)) + fabs(H(k, k));
        if (tst == 0.0) {
          if (k - 2 >= ilo) tst += fabs(H(k - 1, k - 2));
          if (k + 1 <= ihi) tst += fabs(H(k + 1, k));
        }
        if (fabs(H(k, k - 1)) <= ulp * tst) {
          double ab = fmax(fabs(H(k, k - 1)), fabs(H(k - 1, k)));
          double ba = fmin(fabs(H(k, k - 1)), fabs(H(k - 1, k)));
          double aa = fmax(fabs(H(k, k)), fabs(H(k - 1, k - 1) - H(k, k)));
          double bb = fmin(fabs(H(k, k)), fabs(H(k - 1, k - 1) - H(k, k)));
          double s = aa + ab;
          if (ba * (ab / s) <= fmax(smlnum, ulp * (bb * (aa / s)))) break;
        }
      }
      l = k;
      if (l > ilo) H(l, l - 1) = 0.0;
      if (l >= i - 1) {
        split = true;
        break;
      }
      kdefl++;
      if (!wantt) i1 = l, i2 = i;
      double h11, h12, h21, h22, s;
      if (kdefl % (2 * KEXSH) == 0) {
        s = fabs(H(i, i - 1)) + fabs(H(i - 1, i - 2));
        h11 = dat1 * s + H(i, i), h12 = dat2 * s, h21 = s, h22 = h11;
      } else if (kdefl % KEXSH == 0) {
        s = fabs(H(l + 1, l)) + fabs(H(l + 2, l + 1));
        h11 = dat1 * s + H(l, l), h12 = dat2 * s, h21 = s, h22 = h11;
      } else {
        h11 = H(i - 1, i - 1), h21 = H(i, i - 1), h12 = H(i - 1, i), h22 = H(i, i);
      }
      double rt1r, rt1i, rt2r, rt2i;
      s = fabs(h11) + fabs(h12) + fabs(h21) + fabs(h22);
      if (s == 0.0) {
        rt1r = rt1i = rt2r = rt2i = 0.0;
      } else {
        h11 /= s, h21 /= s, h12 /= s, h22 /= s;
        double tr = (h11 + h22) / 2.0;
        double det = (h11 - tr) * (h22 - tr) - h12 * h21, rtdisc = sqrt(fabs(det));
        if (det >= 0.0) { /* complex conjugate shifts */
          rt1r = tr * s, rt2r = rt1r, rt1i = rtdisc * s, rt2i = -rt1i;
        } else { /* real shifts: use the one closer to h22 twice */
          rt1r = tr + rtdisc, rt2r = tr - rtdisc;
          if (fabs(rt1r - h22) <= fabs(rt2r - h22)) rt1r *= s, rt2r = rt1r;
          else rt2r *= s, rt1r = rt2r;
          rt1i = rt2i = 0.0;
        }
      }
      double v[3];
      int64_t m;
      for (m = i - 2; m >= l; m--) { /* two consecutive small subdiagonal entries */
        double h21s = H(m + 1, m);
        s = fabs(H(m, m) - rt2r) + fabs(rt2i) + fabs(h21s);
        h21s = H(m + 1, m) / s;
        v[0] = h21s * H(m, m + 1) + (H(m, m) - rt1r) * ((H(m, m) - rt2r) / s) - rt1i * (rt2i / s);
        v[1] = h21s * (H(m, m) + H(m + 1, m + 1) - rt1r - rt2r);
        v[2] = h21s * H(m + 2, m + 1);
        s = fabs(v[0]) + fabs(v[1]) + fabs(v[2]);
        v[0] /= s, v[1] /= s, v[2] /= s;
        if (m == l) break;
        double h00 = fabs(H(m, m - 1)) * (fabs(v[1]) + fabs(v[2]));
        double h01 = fabs(v[0]) * (fabs(H(m - 1, m - 1)) + fabs(H(m, m)) + fabs(H(m + 1, m + 1)));
        if (h00 <= ulp * h01) break;
      }
      for (k = m; k <= i - 1; k++) { /* the double-shift QR step: chase the bulge */
        int nr = i - k + 1 < 3 ? (int)(i - k + 1) : 3;
        if (k > m)
          for (int r = 0; r < nr; r++) v[r] = H(k + r, k - 1);
        double t1 = dlarfg(nr, &v[0], &v[1]);
        if (k > m) {
          H(k, k - 1) = v[0], H(k + 1, k - 1) = 0.0;
          if (k < i - 1) H(k + 2, k - 1) = 0.0;
        } else if (m > l) {
          H(k, k - 1) = H(k, k - 1) * (1.0 - t1);
        }
        double v2 = v[1], t2 = t1 * v2, v3 = nr == 3 ? v[2] : 0.0, t3 = t1 * v3;
        for (int64_t j = k; j <= i2; j++) {
          double sum = H(k, j) + v2 * H(k + 1, j) + (nr == 3 ? v3 * H(k + 2, j) : 0.0);
          H(k, j) -= sum * t1, H(k + 1, j) -= sum * t2;
          if (nr == 3) H(k + 2, j) -= sum * t3;
        }
        int64_t jend = nr == 3 ? (k + 3 < i ? k + 3 : i) : i;
        for (int64_t j = i1; j <= jend; j++) {
          double sum = H(j, k) + v2 * H(j, k + 1) + (nr == 3 ? v3 * H(j, k + 2) : 0.0);
          H(j, k) -= sum * t1, H(j, k + 1) -= sum * t2;
          if (nr == 3) H(j, k + 2) -= sum * t3;
        }
        if (wantz)
          for (int64_t j = 1; j <= n; j++) {
            double sum = Z(j, k) + v2 * Z(j, k + 1) + (nr == 3 ? v3 * Z(j, k + 2) : 0.0);
            Z(j, k) -= sum * t1, Z(j, k + 1) -= sum * t2;
            if (nr == 3) Z(j, k + 2) -= sum * t3;
          }
      }
    }
    if (!split) return i;
    if (l == i) { /* one real eigenvalue */
      wr[i - 1] = H(i, i), wi[i - 1] = 0.0;
    } else { /* a 2x2 block: standardize it */
      double cs, sn;
      dlanv2(&H(i - 1, i - 1), &H(i - 1, i), &H(i, i - 1), &H(i, i), &wr[i - 2], &wi[i - 2],
             &wr[i - 1], &wi[i - 1], &cs, &sn);
      if (wantt) {
        if (i2 > i) drot(i2 - i, &H(i - 1, i + 1), 1, &H(i, i + 1), 1, cs, sn);
        drot(i - i1 - 1, &H(i1, i - 1), n, &H(i1, i), n, cs, sn);
      }
      if (wantz) drot(n, &Z(1, i - 1), n, &Z(1, i), n, cs, sn);
    }
    kdefl = 0;
    i = l - 1;
  }
  return 0;
#undef H
#undef Z
}

/* ---------------------------------------------- complex QR algorithm */

/* LAPACK's zlahqr: the single-shift QR algorithm on the complex upper
 * Hessenberg h, as dlahqr above (eigenvalues in w). */
static int64_t zlahqr(bool wantt, bool wantz, int64_t n, int64_t ilo, int64_t ihi, zc_t* h,
                      zc_t* w, zc_t* z) {
#define H(i, j) h[((i) - 1) * n + (j) - 1]
#define Z(i, j) z[((i) - 1) * n + (j) - 1]
  const double dat1 = 0.75;
  if (n == 0) return 0;
  if (ilo == ihi) {
    w[ilo - 1] = H(ilo, ilo);
    return 0;
  }
  for (int64_t j = ilo; j <= ihi - 3; j++) H(j + 2, j) = 0.0, H(j + 3, j) = 0.0;
  if (ilo <= ihi - 2) H(ihi, ihi - 2) = 0.0;
  int64_t jlo = wantt ? 1 : ilo, jhi = wantt ? n : ihi;
  for (int64_t i = ilo + 1; i <= ihi; i++) { /* make the subdiagonal real */
    if (cimag(H(i, i - 1)) == 0.0) continue;
    zc_t sc = H(i, i - 1) / cabs1(H(i, i - 1));
    sc = conj(sc) / cabs(sc);
    H(i, i - 1) = cabs(H(i, i - 1));
    for (int64_t j = i; j <= jhi; j++) H(i, j) *= sc;
    for (int64_t j = jlo; j <= (jhi < i + 1 ? jhi : i + 1); j++) H(j, i) *= conj(sc);
    if (wantz)
      for (int64_t j = 1; j <= n; j++) Z(j, i) *= conj(sc);
  }
  int64_t nh = ihi - ilo + 1;
  const double ulp = DBL_EPSILON, smlnum = DBL_MIN * ((double)nh / ulp);
  int64_t i1 = 1, i2 = n, itmax = 30 * (nh > 10 ? nh : 10), kdefl = 0;
  for (int64_t i = ihi; i >= ilo;) {
    int64_t l = ilo, k = i;
    bool split = false;
    for (int64_t its = 0; its <= itmax; its++) {
      for (k = i; k > l; k--) {
        if (cabs1(H(k, k - 1)) <= smlnum) break;
        double tst = cabs1(H(k - 1, k - 1)) + cabs1(H(k, k));
        if (tst == 0.0) {
          if (k - 2 >= ilo) tst += fabs(creal(H(k - 1, k - 2)));
          if (k + 1 <= ihi) tst += fabs(creal(H(k + 1, k)));
        }
        if (fabs(creal(H(k, k - 1))) <= ulp * tst) {
          double ab = fmax(cabs1(H(k, k - 1)), cabs1(H(k - 1, k)));
          double ba = fmin(cabs1(H(k, k - 1)), cabs1(H(k - 1, k)));
          double aa = fmax(cabs1(H(k, k)), cabs1(H(k - 1, k - 1) - H(k, k)));
          double bb = fmin(cabs1(H(k, k)), cabs1(H(k - 1, k - 1) - H(k, k)));
          double s = aa + ab;
          if (ba * (ab / s) <= fmax(smlnum, ulp * (bb * (aa / s)))) break;
        }
      }
      l = k;
      if (l > ilo) H(l, l - 1) = 0.0;
      if (l >= i) {
        split = true;
        break;
      }
      kdefl++;
      if (!wantt) i1 = l, i2 = i;
      zc_t t;
      if (kdefl % (2 * KEXSH) == 0) {
        t = dat1 * fabs(creal(H(i, i - 1))) + H(i, i);
      } else if (kdefl % KEXSH == 0) {
        t = dat1 * fabs(creal(H(l + 1, l))) + H(l, l);
      } else { /* Wilkinson's shift */
        t = H(i, i);
        zc_t u = csqrt(H(i - 1, i)) * csqrt(H(i, i - 1));
        double s = cabs1(u);
        if (s != 0.0) {
          zc_t x = 0.5 * (H(i - 1, i - 1) - t);
          double sx = cabs1(x);
          s = fmax(s, sx);
          zc_t y = s * csqrt((x / s) * (x / s) + (u / s) * (u / s));
          if (sx > 0.0 && creal(x / sx) * creal(y) + cimag(x / sx) * cimag(y) < 0.0) y = -y;
          t = t - u * (u / (x + y));
        }
      }
      zc_t v[2];
      int64_t m;
      for (m = i - 1; m > l; m--) { /* two consecutive small subdiagonal entries */
        zc_t h11 = H(m, m), h22 = H(m + 1, m + 1), h11s = h11 - t;
        double h21 = creal(H(m + 1, m));
        double s = cabs1(h11s) + fabs(h21);
        h11s /= s, h21 /= s;
        v[0] = h11s, v[1] = h21;
        double h10 = creal(H(m, m - 1));
        if (fabs(h10) * fabs(h21) <= ulp * (cabs1(h11s) * (cabs1(h11) + cabs1(h22)))) break;
      }
      if (m == l) {
        zc_t h11s = H(l, l) - t;
        double h21 = creal(H(l + 1, l));
        double s = cabs1(h11s) + fabs(h21);
        v[0] = h11s / s, v[1] = h21 / s;
      }
      for (k = m; k <= i - 1; k++) { /* the single-shift QR step */
        if (k > m) v[0] = H(k, k - 1), v[1] = H(k + 1, k - 1);
        zc_t t1 = tpu_zlarfg(v, 2, 1);
        if (k > m) H(k, k - 1) = v[0], H(k + 1, k - 1) = 0.0;
        zc_t v2 = v[1];
        double t2 = creal(t1 * v2);
        for (int64_t j = k; j <= i2; j++) {
          zc_t sum = conj(t1) * H(k, j) + t2 * H(k + 1, j);
          H(k, j) -= sum, H(k + 1, j) -= sum * v2;
        }
        for (int64_t j = i1; j <= (k + 2 < i ? k + 2 : i); j++) {
          zc_t sum = t1 * H(j, k) + t2 * H(j, k + 1);
          H(j, k) -= sum, H(j, k + 1) -= sum * conj(v2);
        }
        if (wantz)
          for (int64_t j = 1; j <= n; j++) {
            zc_t sum = t1 * Z(j, k) + t2 * Z(j, k + 1);
            Z(j, k) -= sum, Z(j, k + 1) -= sum * conj(v2);
          }
        if (k == m && m > l) { /* keep H(m, m-1) real */
          zc_t temp = 1.0 - t1;
          temp /= cabs(temp);
          H(m + 1, m) *= conj(temp);
          if (m + 2 <= i) H(m + 2, m + 1) *= temp;
          for (int64_t j = m; j <= i; j++) {
            if (j == m + 1) continue;
            for (int64_t c = j + 1; c <= i2; c++) H(j, c) *= temp;
            for (int64_t r = i1; r < j; r++) H(r, j) *= conj(temp);
            if (wantz)
              for (int64_t r = 1; r <= n; r++) Z(r, j) *= conj(temp);
          }
        }
      }
      zc_t temp = H(i, i - 1); /* keep H(i, i-1) real */
      if (cimag(temp) != 0.0) {
        double rtemp = cabs(temp);
        H(i, i - 1) = rtemp;
        temp /= rtemp;
        for (int64_t c = i + 1; c <= i2; c++) H(i, c) *= conj(temp);
        for (int64_t r = i1; r < i; r++) H(r, i) *= temp;
        if (wantz)
          for (int64_t r = 1; r <= n; r++) Z(r, i) *= temp;
      }
    }
    if (!split) return i;
    w[i - 1] = H(i, i);
    kdefl = 0;
    i = l - 1;
  }
  return 0;
#undef H
#undef Z
}

/* ----------------------------------------------------------- eigenvectors */

/* Solves the 2x2 complex system [a b; c d] x = r (Cramer's rule; a singular
 * block is perturbed by smin). */
static void solve2(zc_t a, zc_t b, zc_t c, zc_t d, zc_t* x0, zc_t* x1, double smin) {
  zc_t det = a * d - b * c, r0 = *x0, r1 = *x1;
  if (cabs(det) < smin * smin) det = smin * smin;
  *x0 = (r0 * d - b * r1) / det;
  *x1 = (a * r1 - c * r0) / det;
}

/* The right eigenvector x (n) of the quasi-upper-triangular t (complex copy
 * of the Schur form; 2x2 blocks where t[j][j-1] != 0) for the eigenvalue lam
 * at position k (of a 2x2 block starting at k when `pair`): x = 1 at k (or
 * the block's eigenvector), zero below, back substitution above (trevc). */
static void schur_vector(const zc_t* t, int64_t n, int64_t k, bool pair, zc_t lam, zc_t* x) {
  const double ulp = DBL_EPSILON, smlnum = DBL_MIN * ((double)n / ulp);
  double smin = fmax(ulp * cabs1(lam), smlnum);
  for (int64_t j = 0; j < n; j++) x[j] = 0.0;
  if (pair) {
    zc_t a = t[k * n + k], b = t[k * n + k + 1], c = t[(k + 1) * n + k], d = t[(k + 1) * n + k + 1];
    (void)a, (void)d; /* a = d = Re lam in the standardized block */
    double wi = cimag(lam);
    if (cabs(b) >= cabs(c)) x[k] = 1.0, x[k + 1] = CMPLX(0.0, wi / creal(b));
    else x[k] = -wi / creal(c), x[k + 1] = CMPLX(0.0, 1.0);
  } else {
    x[k] = 1.0;
  }
  int64_t top = pair ? k + 2 : k + 1;
  for (int64_t j = k - 1; j >= 0;) {
    bool block = j > 0 && t[j * n + j - 1] != 0.0;
    int64_t j0 = block ? j - 1 : j;
    for (int64_t r = j0; r <= j; r++) {
      zc_t s = 0.0;
      for (int64_t c = j + 1; c < top; c++) s += t[r * n + c] * x[c];
      x[r] = -s;
    }
    if (block) {
      solve2(t[j0 * n + j0] - lam, t[j0 * n + j], t[j * n + j0], t[j * n + j] - lam, &x[j0],
             &x[j], smin);
    } else {
      zc_t d = t[j * n + j] - lam;
      if (cabs1(d) < smin) d = smin;
      x[j] /= d;
    }
    j = j0 - 1;
  }
}

typedef enum turn { TURN_NONE, TURN_ZGEEV, TURN_DGEEV } turn_t;

/* Scales column j of v (n x n) to unit 2-norm, then turns it so that its
 * entry of largest magnitude (the first), f + i g, is real: positive
 * (zgeev), or as dgeev's rotation leaves it: dlartg's r, negative when
 * |f| > |g| and f < 0 (LAPACK before 3.10, which CPU's MKL follows). */
static void normalize_vector(zc_t* v, int64_t n, int64_t j, turn_t turn) {
  double nrm = 0.0, best = -1.0;
  int64_t at = 0;
  for (int64_t i = 0; i < n; i++) nrm = hypot(nrm, cabs(v[i * n + j]));
  for (int64_t i = 0; i < n; i++) {
    v[i * n + j] /= nrm;
    double re = creal(v[i * n + j]), im = cimag(v[i * n + j]);
    if (re * re + im * im > best) best = re * re + im * im, at = i;
  }
  if (turn == TURN_NONE) return;
  double f = creal(v[at * n + j]), g = cimag(v[at * n + j]), r = sqrt(best);
  if (turn == TURN_DGEEV && fabs(f) > fabs(g) && f < 0.0) r = -r;
  zc_t ph = conj(v[at * n + j]) / r;
  for (int64_t i = 0; i < n; i++) v[i * n + j] *= ph;
  v[at * n + j] = creal(v[at * n + j]);
}

/* ---------------------------------------------------------------- driver */

typedef struct eig_work {
  zc_t *a, *q, *tau, *x, *w;
  double *h, *z, *wr, *wi, *scale;
} eig_work_t;

static void eig_work_free(eig_work_t* k) {
  free(k->a), free(k->q), free(k->tau), free(k->x), free(k->w);
  free(k->h), free(k->z), free(k->wr), free(k->wi), free(k->scale);
}

static bool eig_work_alloc(eig_work_t* k, int64_t n) {
  k->a = zscratch(n * n), k->q = zscratch(n * n), k->tau = zscratch(n), k->x = zscratch(n);
  k->w = zscratch(n), k->h = scratch(n * n), k->z = scratch(n * n), k->wr = scratch(n);
  k->wi = scratch(n), k->scale = scratch(n);
  return k->a && k->q && k->tau && k->x && k->w && k->h && k->z && k->wr && k->wi && k->scale;
}

/* The eigenvalues (k->w) and, with want_v, the eigenvectors (columns of k->q)
 * of the n x n matrix in k->a (destroyed), real when `real`. Returns 0 or
 * LAPACK's info (an eigenvalue that failed to converge). */
static int64_t eig_one(eig_work_t* k, int64_t n, bool real, bool want_v) {
  int64_t ilo, ihi, info;
  balance(k->a, n, &ilo, &ihi, k->scale);
  hessenberg(k->a, n, ilo, ihi, k->tau, want_v ? k->q : NULL);
  zc_t* t = k->a; /* the Schur form, complex, for the eigenvectors */
  if (real) {
    for (int64_t i = 0; i < n * n; i++) k->h[i] = creal(k->a[i]);
    if (want_v)
      for (int64_t i = 0; i < n * n; i++) k->z[i] = creal(k->q[i]);
    for (int64_t i = 0; i < n; i++)
      if (i < ilo || i > ihi) k->wr[i] = k->h[i * n + i], k->wi[i] = 0.0;
    info = dlahqr(want_v, want_v, n, ilo + 1, ihi + 1, k->h, k->wr, k->wi, k->z);
    for (int64_t i = 0; i < n; i++) k->w[i] = CMPLX(k->wr[i], k->wi[i]);
    if (info || !want_v) return info;
    for (int64_t i = 0; i < n * n; i++) t[i] = k->h[i], k->q[i] = k->z[i];
  } else {
    for (int64_t i = 0; i < n; i++)
      if (i < ilo || i > ihi) k->w[i] = k->a[i * n + i];
    info = zlahqr(want_v, want_v, n, ilo + 1, ihi + 1, k->a, k->w, k->q);
    if (info || !want_v) return info;
  }
  for (int64_t i = 0; i < n; i++) /* the Schur form is (quasi-)triangular */
    for (int64_t j = 0; j + 1 < i; j++) t[i * n + j] = 0.0;
  /* Eigenvectors of T, back-transformed by the Schur vectors Q, in place of
   * Q's columns from the last: column j of Q X needs Q's columns up to j + 1. */
  zc_t* vecs = zscratch(n * n);
  if (!vecs) return -1;
  for (int64_t j = 0; j < n; j++) {
    bool pair = real && j + 1 < n && t[(j + 1) * n + j] != 0.0;
    schur_vector(t, n, j, pair, k->w[j], k->x);
    int64_t top = pair ? j + 2 : j + 1;
    for (int64_t r = 0; r < n; r++) {
      zc_t s = 0.0;
      for (int64_t c = 0; c < top; c++) s += k->q[r * n + c] * k->x[c];
      vecs[r * n + j] = s;
      if (pair) vecs[r * n + j + 1] = conj(s);
    }
    if (pair) j++;
  }
  balance_back(vecs, n, ilo, ihi, k->scale);
  for (int64_t j = 0; j < n; j++)
    normalize_vector(vecs, n, j, !real ? TURN_ZGEEV : cimag(k->w[j]) != 0.0 ? TURN_DGEEV : TURN_NONE);
  memcpy(k->q, vecs, sizeof(zc_t) * (size_t)(n * n));
  free(vecs);
  return 0;
}

typedef struct eig_ctx {
  const tpu_tensor_t *A, *W, *V; /* V NULL: eigenvalues only */
  int nb;
  _Atomic int oom;
  _Atomic int64_t info; /* the first failure's info, 0 if none */
} eig_ctx_t;

static void eig_range(void* vctx, int64_t begin, int64_t end) {
  eig_ctx_t* cx = (eig_ctx_t*)vctx;
  mat_view_t av = mat_of(cx->A), wo = vec_of(cx->W);
  int64_t n = av.rows;
  eig_work_t k;
  bool real = !tpu_dtype_is_complex(cx->A->dtype);
  if (!eig_work_alloc(&k, n)) cx->oom = 1;
  for (int64_t b = begin; b < end && !cx->oom; b++) {
    zload_mat(&av, batch_offset(cx->A, 2, cx->nb, cx->A->sizes, b), false, k.a);
    int64_t info = eig_one(&k, n, real, cx->V != NULL);
    if (info < 0) cx->oom = 1;
    if (info > 0) {
      int64_t none = 0;
      atomic_compare_exchange_strong(&cx->info, &none, info);
      continue;
    }
    int64_t woff = batch_offset(cx->W, 1, cx->nb, cx->A->sizes, b);
    for (int64_t j = 0; j < n; j++) tpu_store_z((char*)elem_ptr(&wo, woff, j, 0), cx->W->dtype, k.w[j]);
    if (cx->V) {
      mat_view_t vo = mat_of(cx->V);
      zstore_mat(&vo, batch_offset(cx->V, 2, cx->nb, cx->A->sizes, b), false, k.q);
    }
  }
  eig_work_free(&k);
}

static tpu_status_t eig_batches(const char* op, const tpu_tensor_t* A, const tpu_tensor_t* W,
                                const tpu_tensor_t* V) {
  const bool check_finite = V != NULL; /* CPU checks linalg_eig's input, not eigvals' */
  tpu_dtype_t dt = A->dtype;
  if (dt != TPU_F32 && dt != TPU_F64 && !tpu_dtype_is_complex(dt))
    return TPU_ERR(UNIMPLEMENTED, "%s: dtype %s is not supported (float32, float64, complex64, "
                   "complex128)", op, tpu_dtype_name(dt));
  if (A->ndim < 2 || A->sizes[A->ndim - 1] != A->sizes[A->ndim - 2])
    return TPU_ERR(INVALID_ARGUMENT, "%s: A must be batches of square matrices", op);
  eig_ctx_t cx = {A, W, V, A->ndim - 2, 0, 0};
  /* LAPACK may not converge on non-finite input: CPU's linalg_eig refuses it first. */
  int64_t nb = batch_count(cx.nb, A->sizes);
  mat_view_t av = mat_of(A);
  for (int64_t b = 0; b < nb && check_finite; b++) {
    int64_t off = batch_offset(A, 2, cx.nb, A->sizes, b);
    for (int64_t i = 0; i < av.rows; i++)
      for (int64_t j = 0; j < av.cols; j++) {
        zc_t x = tpu_load_z((const char*)elem_ptr(&av, off, i, j), dt);
        if (!isfinite(creal(x)) || !isfinite(cimag(x)))
          return TPU_ERR(INVALID_ARGUMENT,
                         "torch.linalg.eig: input tensor should not contain infs or NaNs.");
      }
  }
  tpu_parallel_for(nb, 1, eig_range, &cx);
  if (cx.oom) return OOM(op);
  if (cx.info)
    return TPU_ERR(INVALID_ARGUMENT,
                   "%s: The algorithm failed to converge because the input matrix is "
                   "ill-conditioned or has too many repeated eigenvalues (error code: %lld).",
                   op, (long long)cx.info);
  return NULL;
}

/* linalg_eig(A) -> (eigenvalues, eigenvectors), both complex */
tpu_status_t tpu_k_linalg_eig(const tpu_call_t* call) {
  return eig_batches("torch.linalg.eig", tpu_arg_tensor(call, 0), &call->outs[0],
                     &call->outs[1]);
}

/* _linalg_eigvals(A) -> eigenvalues (complex) */
tpu_status_t tpu_k_linalg_eigvals(const tpu_call_t* call) {
  return eig_batches("torch.linalg.eigvals", tpu_arg_tensor(call, 0), &call->outs[0], NULL);
}
