/* The FFT kernels of one precision and instruction set. fft.c includes this
 * file once per (FT, FATTR) pair: FT is the real type transforms compute in
 * (float for complex64/float32 tensors, double for complex128/float64),
 * FATTR the function attributes of the instruction set (vecmath.h), FN(x)
 * the name of this copy's x, FT_C / FT_R the complex and real dtypes whose
 * elements are FT.
 *
 * Lane layout: a block of w lines is transformed at once, each as one lane:
 * element k of lane l lies at [k * w + l], real and imaginary parts in
 * separate arrays. A Stockham stage over w lanes is the single-line stage
 * with w times the stride, so every butterfly loop runs over w * s
 * consecutive values and vectorizes across lanes (and across the
 * interleaved sub-transforms of the later stages). */

/* ---- Stockham stages: len = r m, a stride of sw values (s sub-transforms
 * times w lanes). Butterfly p < m reads elements p + k m and writes r p + k
 * (k < r, in units of sw), output k > 0 multiplied by the twiddle
 * tw[p (r - 1) + k - 1]. The twiddles of p = 0 are 1: that butterfly (the
 * whole last stage, where m = 1) skips the products. ---- */

/* Leg k of butterfly p: input (p + k m), output (r p + k), in units of sw. */
#define LEG_IN(x, k) ((x) + sw * (p + (k) * m))
#define LEG_OUT(y, n_, k) ((y) + sw * ((n_) * p + (k)))
/* output leg k of the loop below gets (vr, vi), times twiddle k when twiddle */
#define PUT(k, vr, vi)                                   \
  do {                                                   \
    const FT pr_ = (vr), pi_ = (vi);                     \
    if (twiddle) {                                       \
      b##k##r[i] = CMUL_RE(pr_, pi_, w##k##r, w##k##i);  \
      b##k##i[i] = CMUL_IM(pr_, pi_, w##k##r, w##k##i);  \
    } else {                                             \
      b##k##r[i] = pr_;                                  \
      b##k##i[i] = pi_;                                  \
    }                                                    \
  } while (0)
#define TW(k) const FT w##k##r = tw[2 * (k) - 2], w##k##i = tw[2 * (k) - 1]
#define IN(k) const FT *a##k##r = LEG_IN(xr, k), *a##k##i = a##k##r + (xi - xr)
#define OUT(n_, k) FT *b##k##r = LEG_OUT(yr, n_, k), *b##k##i = b##k##r + (yi - yr)
/* The stage: butterfly 0 without twiddles, the others with theirs. Where
 * sw is a multiple of FFT_VB the loops run in chunks of FFT_VB values, whose
 * fixed count vectorizes without remainder code (the first stages have short
 * loops: sw = w lanes). */
#define STAGE(R)                                                                              \
  FATTR static void FN(radix##R)(int64_t m, int64_t sw, const FT* tw, const FT* restrict xr,   \
                                 const FT* restrict xi, FT* restrict yr, FT* restrict yi) {    \
    if (sw % FFT_VB == 0) {                                                                   \
      for (int64_t i0 = 0; i0 < sw; i0 += FFT_VB)                                             \
        FN(bfly##R)(m, sw, 0, tw, xr, xi, yr, yi, false, i0, FFT_VB);                         \
      for (int64_t p = 1; p < m; p++)                                                         \
        for (int64_t i0 = 0; i0 < sw; i0 += FFT_VB)                                           \
          FN(bfly##R)(m, sw, p, tw + 2 * ((R) - 1) * p, xr, xi, yr, yi, true, i0, FFT_VB);    \
    } else {                                                                                  \
      FN(bfly##R)(m, sw, 0, tw, xr, xi, yr, yi, false, 0, sw);                                \
      for (int64_t p = 1; p < m; p++)                                                         \
        FN(bfly##R)(m, sw, p, tw + 2 * ((R) - 1) * p, xr, xi, yr, yi, true, 0, sw);           \
    }                                                                                         \
  }
/* butterfly p on the values [i0, i0 + cnt) of its legs */
#define BFLY_ARGS                                                                         \
  int64_t m, int64_t sw, int64_t p, const FT* tw, const FT* xr, const FT* xi, FT* yr, FT* yi, \
      bool twiddle, int64_t i0, int64_t cnt
FATTR FFT_INLINE void FN(bfly2)(BFLY_ARGS) {
  TW(1);
  IN(0);
  IN(1);
  OUT(2, 0);
  OUT(2, 1);
  FFT_IVDEP
  for (int64_t i = i0; i < i0 + cnt; i++) {
    b0r[i] = a0r[i] + a1r[i];
    b0i[i] = a0i[i] + a1i[i];
    PUT(1, a0r[i] - a1r[i], a0i[i] - a1i[i]);
  }
}
STAGE(2)

FATTR FFT_INLINE void FN(bfly3)(BFLY_ARGS) {
  const FT c = (FT)-0.5, s = (FT)0.86602540378443864676; /* cos, sin(2 pi / 3) */
  TW(1);
  TW(2);
  IN(0);
  IN(1);
  IN(2);
  OUT(3, 0);
  OUT(3, 1);
  OUT(3, 2);
  FFT_IVDEP
  for (int64_t i = i0; i < i0 + cnt; i++) {
    const FT t1r = a1r[i] + a2r[i], t1i = a1i[i] + a2i[i];
    const FT t2r = a0r[i] + c * t1r, t2i = a0i[i] + c * t1i;
    /* t3 = -i s (a1 - a2) */
    const FT t3r = s * (a1i[i] - a2i[i]), t3i = s * (a2r[i] - a1r[i]);
    b0r[i] = a0r[i] + t1r;
    b0i[i] = a0i[i] + t1i;
    PUT(1, t2r + t3r, t2i + t3i);
    PUT(2, t2r - t3r, t2i - t3i);
  }
}
STAGE(3)

FATTR FFT_INLINE void FN(bfly4)(BFLY_ARGS) {
  TW(1);
  TW(2);
  TW(3);
  IN(0);
  IN(1);
  IN(2);
  IN(3);
  OUT(4, 0);
  OUT(4, 1);
  OUT(4, 2);
  OUT(4, 3);
  FFT_IVDEP
  for (int64_t i = i0; i < i0 + cnt; i++) {
    const FT t0r = a0r[i] + a2r[i], t0i = a0i[i] + a2i[i];
    const FT t1r = a0r[i] - a2r[i], t1i = a0i[i] - a2i[i];
    const FT t2r = a1r[i] + a3r[i], t2i = a1i[i] + a3i[i];
    /* t3 = -i (a1 - a3) */
    const FT t3r = a1i[i] - a3i[i], t3i = a3r[i] - a1r[i];
    b0r[i] = t0r + t2r;
    b0i[i] = t0i + t2i;
    PUT(1, t1r + t3r, t1i + t3i);
    PUT(2, t0r - t2r, t0i - t2i);
    PUT(3, t1r - t3r, t1i - t3i);
  }
}
STAGE(4)

FATTR FFT_INLINE void FN(bfly5)(BFLY_ARGS) {
  const FT c1 = (FT)0.30901699437494742410, c2 = (FT)-0.80901699437494742410;
  const FT s1 = (FT)0.95105651629515357212, s2 = (FT)0.58778525229247312917;
  TW(1);
  TW(2);
  TW(3);
  TW(4);
  IN(0);
  IN(1);
  IN(2);
  IN(3);
  IN(4);
  OUT(5, 0);
  OUT(5, 1);
  OUT(5, 2);
  OUT(5, 3);
  OUT(5, 4);
  FFT_IVDEP
  for (int64_t i = i0; i < i0 + cnt; i++) {
    const FT x0r = a0r[i], x0i = a0i[i];
    const FT t1r = a1r[i] + a4r[i], t1i = a1i[i] + a4i[i];
    const FT t2r = a2r[i] + a3r[i], t2i = a2i[i] + a3i[i];
    const FT t3r = a1r[i] - a4r[i], t3i = a1i[i] - a4i[i];
    const FT t4r = a2r[i] - a3r[i], t4i = a2i[i] - a3i[i];
    const FT u1r = x0r + c1 * t1r + c2 * t2r, u1i = x0i + c1 * t1i + c2 * t2i;
    const FT u2r = x0r + c2 * t1r + c1 * t2r, u2i = x0i + c2 * t1i + c1 * t2i;
    /* v1 = -i (s1 t3 + s2 t4), v2 = -i (s2 t3 - s1 t4) */
    const FT v1r = s1 * t3i + s2 * t4i, v1i = -(s1 * t3r + s2 * t4r);
    const FT v2r = s2 * t3i - s1 * t4i, v2i = -(s2 * t3r - s1 * t4r);
    b0r[i] = x0r + t1r + t2r;
    b0i[i] = x0i + t1i + t2i;
    PUT(1, u1r + v1r, u1i + v1i);
    PUT(2, u2r + v2r, u2i + v2i);
    PUT(3, u2r - v2r, u2i - v2i);
    PUT(4, u1r - v1r, u1i - v1i);
  }
}
STAGE(5)

#undef LEG_IN
#undef LEG_OUT
#undef PUT
#undef TW
#undef IN
#undef OUT
#undef STAGE
#undef BFLY_ARGS

/* Any odd radix up to FFT_MAX_DIRECT_RADIX, as a direct r-point DFT. */
FATTR static void FN(radixg)(int r, int64_t m, int64_t sw, const FT* tw, const FT* restrict xr,
                             const FT* restrict xi, FT* restrict yr, FT* restrict yi) {
  FT cr[FFT_MAX_DIRECT_RADIX], ci[FFT_MAX_DIRECT_RADIX];
  for (int k = 0; k < r; k++) {
    double re, im;
    fft_unit(k, r, &re, &im);
    cr[k] = (FT)re;
    ci[k] = (FT)im;
  }
  const int64_t q = sw * m;
  for (int64_t p = 0; p < m; p++) {
    const FT *ar = xr + sw * p, *ai = xi + sw * p;
    for (int j = 0; j < r; j++) {
      FT *br = yr + sw * (r * p + j), *bi = yi + sw * (r * p + j);
      for (int64_t i = 0; i < sw; i++) {
        br[i] = ar[i];
        bi[i] = ai[i];
      }
      for (int k = 1; k < r; k++) {
        const FT c = cr[(j * k) % r], s = ci[(j * k) % r];
        for (int64_t i = 0; i < sw; i++) {
          const FT vr = ar[i + k * q], vi = ai[i + k * q];
          br[i] += CMUL_RE(vr, vi, c, s);
          bi[i] += CMUL_IM(vr, vi, c, s);
        }
      }
      if (j == 0) continue;
      const FT wr = tw[2 * (p * (r - 1) + j - 1)], wi = tw[2 * (p * (r - 1) + j - 1) + 1];
      for (int64_t i = 0; i < sw; i++) {
        const FT vr = br[i], vi = bi[i];
        br[i] = CMUL_RE(vr, vi, wr, wi);
        bi[i] = CMUL_IM(vr, vi, wr, wi);
      }
    }
  }
}

/* y = x times c[k] on row k of the lanes (c interleaved complex); y may be x */
FATTR static void FN(mul_rows)(int64_t rows, int64_t w, const FT* c, const FT* xr, const FT* xi,
                               FT* yr, FT* yi) {
  for (int64_t k = 0; k < rows; k++) {
    const FT cr = c[2 * k], ci = c[2 * k + 1];
    for (int64_t l = 0; l < w; l++) {
      const FT vr = xr[k * w + l], vi = xi[k * w + l];
      yr[k * w + l] = CMUL_RE(vr, vi, cr, ci);
      yi[k * w + l] = CMUL_IM(vr, vi, cr, ci);
    }
  }
}

static void FN(exec)(const fft_plan_t* p, int64_t w, FT* ar, FT* ai, FT* br, FT* bi, FT* work,
                     FT** out_r, FT** out_i);

/* Bluestein: X_k = c_k sum_j (x_j c_j) conj(c_{k-j}), c_k = exp(-pi i k^2 / n),
 * the sum a cyclic convolution of length m by FFTs. work: 4 m w values. */
FATTR static void FN(bluestein)(const fft_plan_t* p, int64_t w, FT* xr, FT* xi, FT* work) {
  const int64_t n = p->n, m = p->m;
  FT *ar = work, *ai = ar + m * w, *br = ai + m * w, *bi = br + m * w;
  FN(mul_rows)(n, w, p->chirp, xr, xi, ar, ai);
  memset(ar + n * w, 0, (size_t)((m - n) * w) * sizeof(FT));
  memset(ai + n * w, 0, (size_t)((m - n) * w) * sizeof(FT));
  FT *zr, *zi, *ur, *ui;
  FN(exec)(p->sub, w, ar, ai, br, bi, NULL, &zr, &zi);
  FN(mul_rows)(m, w, p->bfft, zr, zi, zr, zi); /* bfft carries the 1/m */
  FT *fr = zr == ar ? br : ar, *fi = zr == ar ? bi : ai;
  FN(exec)(p->sub, w, zi, zr, fi, fr, NULL, &ui, &ur); /* inverse: parts swapped */
  FN(mul_rows)(n, w, p->chirp, ur, ui, xr, xi);
}

/* Forward transforms of the w lanes of a = (ar, ai), with b as the other
 * buffer of the same size (n w values each) and work as Bluestein's (4 m w
 * values). *out_r, *out_i: the arrays holding the result (a or b). A
 * backward transform is a forward one with the real and imaginary parts
 * swapped on the way in and out. */
FATTR static void FN(exec)(const fft_plan_t* p, int64_t w, FT* ar, FT* ai, FT* br, FT* bi, FT* work,
                           FT** out_r, FT** out_i) {
  if (p->sub) {
    FN(bluestein)(p, w, ar, ai, work);
    *out_r = ar;
    *out_i = ai;
    return;
  }
  const FT* tw = p->tw;
  FT *xr = ar, *xi = ai, *yr = br, *yi = bi;
  int64_t len = p->n, sw = w;
  for (int f = 0; f < p->nf; f++) {
    const int r = p->fac[f];
    const int64_t m = len / r;
    switch (r) {
      case 2: FN(radix2)(m, sw, tw, xr, xi, yr, yi); break;
      case 3: FN(radix3)(m, sw, tw, xr, xi, yr, yi); break;
      case 4: FN(radix4)(m, sw, tw, xr, xi, yr, yi); break;
      case 5: FN(radix5)(m, sw, tw, xr, xi, yr, yi); break;
      default: FN(radixg)(r, m, sw, tw, xr, xi, yr, yi); break;
    }
    tw += 2 * m * (r - 1);
    FT* t = xr;
    xr = yr;
    yr = t;
    t = xi;
    xi = yi;
    yi = t;
    len = m;
    sw *= r;
  }
  *out_r = xr;
  *out_i = xi;
}

static void FN(exec_any)(const fft_plan_t* p, int64_t w, void* ar, void* ai, void* br, void* bi,
                         void* work, void** out_r, void** out_i) {
  FT *r, *i;
  FN(exec)(p, w, ar, ai, br, bi, work, &r, &i);
  *out_r = r;
  *out_i = i;
}

/* ---- lines of tensors <-> lane layout ----
 * cnt elements along the job's dim from each of nl lines (byte offsets off)
 * to lanes [0, nl) of a block of w lanes, or back; the stores scale. Three
 * ways: elements of another dtype than FT_C / FT_R take the generic
 * conversions; lines contiguous along the dim are transposed, by 8 x 8
 * tiles where this copy has them (FFT_TILES); otherwise each element step
 * reads or writes across the lines, one run of values when the lines are
 * adjacent (a strided dim of a contiguous tensor). */

/* the lines lie one element apart */
static bool FN(adjacent)(const int64_t* off, int64_t nl, int64_t esize) {
  for (int64_t l = 1; l < nl; l++)
    if (off[l] != off[0] + l * esize) return false;
  return true;
}

FATTR static void FN(load_c)(const tpu_tensor_t* t, int dim, const int64_t* off, int64_t nl,
                             int64_t cnt, FT* restrict dr, FT* restrict di, int64_t w) {
  const char* base = t->data;
  const int64_t st = t->strides[dim];
  if (t->dtype != FT_C) {
    const int64_t sb = st * (int64_t)tpu_dtype_size(t->dtype);
    for (int64_t l = 0; l < nl; l++)
      for (int64_t k = 0; k < cnt; k++) {
        const zc_t z = tpu_load_z(base + off[l] + k * sb, t->dtype);
        dr[k * w + l] = (FT)creal(z);
        di[k * w + l] = (FT)cimag(z);
      }
  } else if (st == 1) {
    int64_t l = 0, k;
#ifdef FFT_TILES
    for (; l + 8 <= nl; l += 8) {
      const FT* rows[8];
      for (int j = 0; j < 8; j++) rows[j] = (const FT*)(base + off[l + j]);
      for (k = 0; k + 8 <= cnt; k += 8) FFT_TILE_LOAD_C(rows, k, dr + k * w + l, di + k * w + l, w);
      for (; k < cnt; k++)
        for (int j = 0; j < 8; j++) {
          dr[k * w + l + j] = rows[j][2 * k];
          di[k * w + l + j] = rows[j][2 * k + 1];
        }
    }
#endif
    for (; l < nl; l++) {
      const FT* s = (const FT*)(base + off[l]);
      for (k = 0; k < cnt; k++) {
        dr[k * w + l] = s[2 * k];
        di[k * w + l] = s[2 * k + 1];
      }
    }
  } else if (FN(adjacent)(off, nl, 2 * sizeof(FT))) {
    for (int64_t k = 0; k < cnt; k++) {
      const FT* s = (const FT*)(base + off[0]) + 2 * k * st;
      for (int64_t l = 0; l < nl; l++) {
        dr[k * w + l] = s[2 * l];
        di[k * w + l] = s[2 * l + 1];
      }
    }
  } else {
    for (int64_t k = 0; k < cnt; k++)
      for (int64_t l = 0; l < nl; l++) {
        const FT* s = (const FT*)(base + off[l]) + 2 * k * st;
        dr[k * w + l] = s[0];
        di[k * w + l] = s[1];
      }
  }
}

FATTR static void FN(load_r)(const tpu_tensor_t* t, int dim, const int64_t* off, int64_t nl,
                             int64_t cnt, FT* restrict d, int64_t w) {
  const char* base = t->data;
  const int64_t st = t->strides[dim];
  if (t->dtype != FT_R) {
    const int64_t sb = st * (int64_t)tpu_dtype_size(t->dtype);
    for (int64_t l = 0; l < nl; l++)
      for (int64_t k = 0; k < cnt; k++) d[k * w + l] = (FT)tpu_load_f64(base + off[l] + k * sb, t->dtype);
  } else if (st == 1) {
    int64_t l = 0, k;
#ifdef FFT_TILES
    for (; l + 8 <= nl; l += 8) {
      const FT* rows[8];
      for (int j = 0; j < 8; j++) rows[j] = (const FT*)(base + off[l + j]);
      for (k = 0; k + 8 <= cnt; k += 8) FFT_TILE_LOAD_R(rows, k, d + k * w + l, w);
      for (; k < cnt; k++)
        for (int j = 0; j < 8; j++) d[k * w + l + j] = rows[j][k];
    }
#endif
    for (; l < nl; l++) {
      const FT* s = (const FT*)(base + off[l]);
      for (k = 0; k < cnt; k++) d[k * w + l] = s[k];
    }
  } else if (FN(adjacent)(off, nl, sizeof(FT))) {
    for (int64_t k = 0; k < cnt; k++) {
      const FT* s = (const FT*)(base + off[0]) + k * st;
      for (int64_t l = 0; l < nl; l++) d[k * w + l] = s[l];
    }
  } else {
    for (int64_t k = 0; k < cnt; k++)
      for (int64_t l = 0; l < nl; l++) d[k * w + l] = ((const FT*)(base + off[l]))[k * st];
  }
}

FATTR static void FN(store_c)(const tpu_tensor_t* t, int dim, const int64_t* off, int64_t nl,
                              int64_t cnt, const FT* restrict sr, const FT* restrict si, int64_t w,
                              FT scale) {
  char* base = t->data;
  const int64_t st = t->strides[dim];
  if (t->dtype != FT_C) {
    const int64_t sb = st * (int64_t)tpu_dtype_size(t->dtype);
    for (int64_t l = 0; l < nl; l++)
      for (int64_t k = 0; k < cnt; k++)
        tpu_store_z(base + off[l] + k * sb, t->dtype,
                    CMPLX((double)(sr[k * w + l] * scale), (double)(si[k * w + l] * scale)));
  } else if (st == 1) {
    int64_t l = 0, k;
#ifdef FFT_TILES
    for (; l + 8 <= nl; l += 8) {
      FT* rows[8];
      for (int j = 0; j < 8; j++) rows[j] = (FT*)(base + off[l + j]);
      for (k = 0; k + 8 <= cnt; k += 8) FFT_TILE_STORE_C(rows, k, sr + k * w + l, si + k * w + l, w, scale);
      for (; k < cnt; k++)
        for (int j = 0; j < 8; j++) {
          rows[j][2 * k] = sr[k * w + l + j] * scale;
          rows[j][2 * k + 1] = si[k * w + l + j] * scale;
        }
    }
#endif
    for (; l < nl; l++) {
      FT* d = (FT*)(base + off[l]);
      for (k = 0; k < cnt; k++) {
        d[2 * k] = sr[k * w + l] * scale;
        d[2 * k + 1] = si[k * w + l] * scale;
      }
    }
  } else if (FN(adjacent)(off, nl, 2 * sizeof(FT))) {
    for (int64_t k = 0; k < cnt; k++) {
      FT* d = (FT*)(base + off[0]) + 2 * k * st;
      for (int64_t l = 0; l < nl; l++) {
        d[2 * l] = sr[k * w + l] * scale;
        d[2 * l + 1] = si[k * w + l] * scale;
      }
    }
  } else {
    for (int64_t k = 0; k < cnt; k++)
      for (int64_t l = 0; l < nl; l++) {
        FT* d = (FT*)(base + off[l]) + 2 * k * st;
        d[0] = sr[k * w + l] * scale;
        d[1] = si[k * w + l] * scale;
      }
  }
}

FATTR static void FN(store_r)(const tpu_tensor_t* t, int dim, const int64_t* off, int64_t nl,
                              int64_t cnt, const FT* restrict s, int64_t w, FT scale) {
  char* base = t->data;
  const int64_t st = t->strides[dim];
  if (t->dtype != FT_R) {
    const int64_t sb = st * (int64_t)tpu_dtype_size(t->dtype);
    for (int64_t l = 0; l < nl; l++)
      for (int64_t k = 0; k < cnt; k++)
        tpu_store_f64(base + off[l] + k * sb, t->dtype, (double)(s[k * w + l] * scale));
  } else if (st == 1) {
    int64_t l = 0, k;
#ifdef FFT_TILES
    for (; l + 8 <= nl; l += 8) {
      FT* rows[8];
      for (int j = 0; j < 8; j++) rows[j] = (FT*)(base + off[l + j]);
      for (k = 0; k + 8 <= cnt; k += 8) FFT_TILE_STORE_R(rows, k, s + k * w + l, w, scale);
      for (; k < cnt; k++)
        for (int j = 0; j < 8; j++) rows[j][k] = s[k * w + l + j] * scale;
    }
#endif
    for (; l < nl; l++) {
      FT* d = (FT*)(base + off[l]);
      for (k = 0; k < cnt; k++) d[k] = s[k * w + l] * scale;
    }
  } else if (FN(adjacent)(off, nl, sizeof(FT))) {
    for (int64_t k = 0; k < cnt; k++) {
      FT* d = (FT*)(base + off[0]) + k * st;
      for (int64_t l = 0; l < nl; l++) d[l] = s[k * w + l] * scale;
    }
  } else {
    for (int64_t k = 0; k < cnt; k++)
      for (int64_t l = 0; l < nl; l++) ((FT*)(base + off[l]))[k * st] = s[k * w + l] * scale;
  }
}

static void FN(zero_rows)(FT* a, int64_t k0, int64_t k1, int64_t w) {
  if (k1 > k0) memset(a + k0 * w, 0, (size_t)((k1 - k0) * w) * sizeof(FT));
}

static void FN(zero_lane)(FT* a, int64_t rows, int64_t w, int64_t l) {
  for (int64_t k = 0; k < rows; k++) a[k * w + l] = 0;
}

/* Two real transforms from one complex Z = X1 + i X2: X1_k = (Z_k + conj
 * Z_{n-k}) / 2 into f, X2_k = -i (Z_k - conj Z_{n-k}) / 2 into z itself,
 * both times scale; rows k and n - k are done together. */
FATTR static void FN(split_pair)(int64_t n, int64_t w, FT* restrict zr, FT* restrict zi,
                                 FT* restrict fr, FT* restrict fi, FT scale) {
  const FT h = (FT)0.5 * scale;
  for (int64_t k = 0; k <= n / 2; k++) {
    const int64_t k2 = k == 0 ? 0 : n - k;
    for (int64_t l = 0; l < w; l++) {
      const FT ar = zr[k * w + l], ai = zi[k * w + l], br = zr[k2 * w + l], bi = zi[k2 * w + l];
      const FT x1r = h * (ar + br), x1i = h * (ai - bi), x2r = h * (ai + bi), x2i = h * (br - ar);
      fr[k * w + l] = x1r;
      fi[k * w + l] = x1i;
      fr[k2 * w + l] = x1r;
      fi[k2 * w + l] = -x1i;
      zr[k * w + l] = x2r;
      zi[k * w + l] = x2i;
      zr[k2 * w + l] = x2r;
      zi[k2 * w + l] = -x2i;
    }
  }
}

/* The inverse of split_pair for half spectra: a = X1, b = X2 (rows <= n/2,
 * imaginary parts of the DC and Nyquist terms already 0) become Z = X1 + i X2
 * in a, all n rows, from the Hermitian extensions (X_{n-k} = conj X_k). */
FATTR static void FN(join_pair)(int64_t n, int64_t w, FT* restrict ar, FT* restrict ai,
                                const FT* restrict br, const FT* restrict bi) {
  const int64_t half = n / 2;
  for (int64_t k = half + 1; k < n; k++) {
    const int64_t k2 = n - k;
    for (int64_t l = 0; l < w; l++) {
      ar[k * w + l] = ar[k2 * w + l] + bi[k2 * w + l];
      ai[k * w + l] = br[k2 * w + l] - ai[k2 * w + l];
    }
  }
  for (int64_t k = 0; k <= half; k++)
    for (int64_t l = 0; l < w; l++) {
      const FT xr = ar[k * w + l], xi = ai[k * w + l];
      ar[k * w + l] = xr - bi[k * w + l];
      ai[k * w + l] = xi + br[k * w + l];
    }
}

/* exp(-+2 pi i p / t->n) from the two tables (the sign + when conj) */
#define UNIT_AT(t, p, conj, wr, wi)                                               \
  do {                                                                            \
    const FT* h_ = (const FT*)(t)->hi + 2 * ((p) >> (t)->sh);                     \
    const FT* o_ = (const FT*)(t)->lo + 2 * ((p) & (t)->mask);                    \
    wr = CMUL_RE(h_[0], h_[1], o_[0], o_[1]);                                     \
    wi = CMUL_IM(h_[0], h_[1], o_[0], o_[1]);                                     \
    if (conj) wi = -wi;                                                           \
  } while (0)

/* The twiddles between the two passes of a long line: element k of lane l
 * (line l0 + l of the first pass) times exp(-+2 pi i k (l0 + l) / t->n),
 * for each chunk of FFT_VB lanes from c the chunk's factor W^(k (l0 + c))
 * (from the two tables) times the lane table's W^(k l'), l' < FFT_VB. */
FATTR static void FN(twiddle_lanes)(const fft_unit_table_t* t, bool conj, int64_t rows, int64_t w,
                                    int64_t l0, FT* restrict xr, FT* restrict xi) {
  const FT sg = conj ? (FT)-1 : (FT)1;
  const int64_t n = t->n, d0 = l0 % n;
  int64_t p0 = 0; /* k l0 mod n */
  for (int64_t k = 1; k < rows; k++) {
    p0 = p0 + d0 >= n ? p0 + d0 - n : p0 + d0;
    const FT* ur = (const FT*)t->lane_re + k * FFT_VB;
    const FT* ui = (const FT*)t->lane_im + k * FFT_VB;
    const int64_t dc = FFT_VB * k % n;
    int64_t pc = p0;
    for (int64_t c = 0; c < w; c += FFT_VB) {
      FT br, bi;
      UNIT_AT(t, pc, conj, br, bi);
      pc = pc + dc >= n ? pc + dc - n : pc + dc;
      FT* yr = xr + k * w + c;
      FT* yi = xi + k * w + c;
      const int64_t cnt = w - c < FFT_VB ? w - c : FFT_VB;
      for (int64_t l = 0; l < cnt; l++) {
        const FT fr = CMUL_RE(br, bi, ur[l], sg * ui[l]), fi = CMUL_IM(br, bi, ur[l], sg * ui[l]);
        const FT vr = yr[l], vi = yi[l];
        yr[l] = CMUL_RE(vr, vi, fr, fi);
        yi[l] = CMUL_IM(vr, vi, fr, fi);
      }
    }
  }
}

/* Lines [l0, l0 + nl) of the job. A complex job takes one line per lane; a
 * real one two per lane (the even lines in the real parts, the odd ones in
 * the imaginary parts). buf: fft_buf_elems values. */
static void FN(block)(const fft_job_t* j, int64_t l0, int64_t nl, FT* buf) {
  const tpu_tensor_t *src = j->src, *dst = j->dst;
  const int dim = j->dim;
  const int64_t n = j->n, slen = src->sizes[dim], dlen = dst->sizes[dim];
  const bool cplx = j->kind == K_C2C;
  const int64_t w = cplx ? nl : (nl + 1) / 2, nodd = cplx ? 0 : nl / 2;
  /* real jobs: the even lines' offsets first, then the odd ones' */
  int64_t so[2 * FFT_MAX_LANES], dof[2 * FFT_MAX_LANES];
  for (int64_t i = 0; i < nl; i++) {
    const int64_t at = cplx ? i : i % 2 ? w + i / 2 : i / 2;
    fft_line_offsets(src, dst, dim, l0 + i, &so[at], &dof[at]);
  }
  FT *ar = buf, *ai = ar + n * w, *br = ai + n * w, *bi = br + n * w, *work = bi + n * w;
  FT *zr, *zi;
  const FT scale = (FT)j->scale;
  if (j->kind == K_C2C) {
    const int64_t cnt = slen < n ? slen : n;
    FN(load_c)(src, dim, so, w, cnt, ar, ai, w);
    FN(zero_rows)(ar, cnt, n, w);
    FN(zero_rows)(ai, cnt, n, w);
    if (j->forward) FN(exec)(j->plan, w, ar, ai, br, bi, work, &zr, &zi);
    else FN(exec)(j->plan, w, ai, ar, bi, br, work, &zi, &zr);
    if (j->tw4) FN(twiddle_lanes)(j->tw4, !j->forward, n, w, l0, zr, zi);
    FN(store_c)(dst, dim, dof, w, dlen, zr, zi, w, scale);
  } else if (j->kind == K_R2C) {
    const int64_t cnt = slen < n ? slen : n;
    FN(load_r)(src, dim, so, w, cnt, ar, w);
    FN(load_r)(src, dim, so + w, nodd, cnt, ai, w);
    if (nodd < w) FN(zero_lane)(ai, cnt, w, w - 1);
    FN(zero_rows)(ar, cnt, n, w);
    FN(zero_rows)(ai, cnt, n, w);
    FN(exec)(j->plan, w, ar, ai, br, bi, work, &zr, &zi);
    FT *fr = zr == ar ? br : ar, *fi = zr == ar ? bi : ai;
    FN(split_pair)(n, w, zr, zi, fr, fi, scale);
    FN(store_c)(dst, dim, dof, w, dlen, fr, fi, w, 1);
    FN(store_c)(dst, dim, dof + w, nodd, dlen, zr, zi, w, 1);
  } else {
    const int64_t half = n / 2, h = half + 1 < slen ? half + 1 : slen;
    FN(load_c)(src, dim, so, w, h, ar, ai, w);
    FN(load_c)(src, dim, so + w, nodd, h, br, bi, w);
    if (nodd < w) {
      FN(zero_lane)(br, h, w, w - 1);
      FN(zero_lane)(bi, h, w, w - 1);
    }
    FT* parts[4] = {ar, ai, br, bi};
    for (int q = 0; q < 4; q++) FN(zero_rows)(parts[q], h, half + 1, w);
    FN(zero_rows)(ai, 0, 1, w); /* a real inverse ignores these imaginary parts */
    FN(zero_rows)(bi, 0, 1, w);
    if (n % 2 == 0) {
      FN(zero_rows)(ai, half, half + 1, w);
      FN(zero_rows)(bi, half, half + 1, w);
    }
    FN(join_pair)(n, w, ar, ai, br, bi);
    FN(exec)(j->plan, w, ai, ar, bi, br, work, &zi, &zr);
    FN(store_r)(dst, dim, dof, w, dlen, zr, w, scale);
    FN(store_r)(dst, dim, dof + w, nodd, dlen, zi, w, scale);
  }
}

/* tpu_parallel_for body: blocks [begin, end) of the job */
static void FN(blocks)(void* ctx, int64_t begin, int64_t end) {
  fft_job_t* j = ctx;
  FT* buf = scratch_get(fft_buf_elems(j) * sizeof(FT));
  if (!buf) {
    j->failed = 1;
    return;
  }
  for (int64_t b = begin; b < end; b++) {
    const int64_t l0 = b * j->per_block, left = j->lines - l0;
    FN(block)(j, l0, left < j->per_block ? left : j->per_block, buf);
  }
  scratch_put(buf);
}


/* ---- real long lines <-> their half-length complex transform ----
 * x real of length n = 2 m, z_j = x_2j + i x_2j+1, Z its m-point transform.
 * With E_k = (Z_k + conj Z_{m-k}) / 2 and O_k = -i (Z_k - conj Z_{m-k}) / 2
 * (the transforms of the even and the odd samples), X_k = E_k + W^k O_k
 * (W = exp(-2 pi i / n)) and X_{m-k} = conj(E_k - W^k O_k). Pair (k, m - k)
 * is one iteration; each reads and writes only its own two rows. */

/* r2c: Z (rows < m of z) to X in place, times scale; X_m from row 0 and,
 * two-sided, X_{n-k} = conj X_k */
static void FN(real_post)(void* ctx, int64_t begin, int64_t end) {
  const fft_real_pass_t* q = ctx;
  const int64_t m = q->m, zs = 2 * q->zs;
  FT* z = q->z;
  const FT sc = (FT)q->scale, h = (FT)0.5;
  for (int64_t k = begin; k < end; k++) {
    FT* a = z + k * zs;
    if (k == 0) {
      const FT re = a[0], im = a[1];
      FT* xm = z + m * zs;
      a[0] = (re + im) * sc;
      a[1] = 0;
      xm[0] = (re - im) * sc;
      xm[1] = 0;
      continue;
    }
    FT* b = z + (m - k) * zs;
    const FT er = h * (a[0] + b[0]), ei = h * (a[1] - b[1]); /* E */
    const FT dr = a[0] - b[0], di = a[1] + b[1];             /* Z_k - conj Z_{m-k} */
    const FT or_ = h * di, oi = -h * dr;                      /* O = -i D / 2 */
    FT wr, wi;
    UNIT_AT(q->t, k, false, wr, wi);
    const FT tr = CMUL_RE(or_, oi, wr, wi), ti = CMUL_IM(or_, oi, wr, wi);
    a[0] = (er + tr) * sc;
    a[1] = (ei + ti) * sc;
    if (b != a) {
      b[0] = (er - tr) * sc;
      b[1] = (ti - ei) * sc;
    }
    if (q->two_sided) {
      FT *ua = z + (2 * m - k) * zs, *ub = z + (m + k) * zs;
      ua[0] = a[0];
      ua[1] = -a[1];
      if (b != a) {
        ub[0] = b[0];
        ub[1] = -b[1];
      }
    }
  }
}

/* c2r: the half spectrum X (xlen rows, zero beyond; the imaginary parts of
 * X_0 and X_m ignored) to Z in z (m contiguous rows), whose inverse
 * m-point transform is z: Z_k = E'_k + i O'_k with E'_k = X_k + conj
 * X_{m-k} and O'_k = (X_k - conj X_{m-k}) conj(W^k), and Z_{m-k} = conj E'_k
 * + i conj O'_k. */
static void FN(real_pre)(void* ctx, int64_t begin, int64_t end) {
  const fft_real_pass_t* q = ctx;
  const int64_t m = q->m, xs = 2 * q->xs;
  const FT* x = q->x;
  FT* z = q->z;
  for (int64_t k = begin; k < end; k++) {
    const int64_t k2 = m - k;
    const FT* a = x + k * xs;
    const FT* b = x + k2 * xs;
    const FT ar = k < q->xlen ? a[0] : 0, ai = k < q->xlen && k > 0 ? a[1] : 0;
    const FT br = k2 < q->xlen ? b[0] : 0, bi = k2 < q->xlen && k2 < m ? b[1] : 0;
    const FT er = ar + br, ei = ai - bi, dr = ar - br, di = ai + bi;
    FT wr, wi;
    UNIT_AT(q->t, k, true, wr, wi);
    const FT or_ = CMUL_RE(dr, di, wr, wi), oi = CMUL_IM(dr, di, wr, wi);
    z[2 * k] = er - oi;
    z[2 * k + 1] = ei + or_;
    if (k2 != k && k2 < m) {
      z[2 * k2] = er + oi;
      z[2 * k2 + 1] = or_ - ei;
    }
  }
}

#undef UNIT_AT
