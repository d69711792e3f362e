/* FFT lowerings: _fft_c2c, _fft_r2c and _fft_c2r (every torch.fft function
 * goes through them) as stablehlo.fft.
 *
 * stablehlo.fft transforms the trailing one to three dims of its operand, so
 * each call moves the dims it transforms to the end (in the order asked),
 * transforms, and moves them back; more than three dims are transformed in
 * groups, one after the other (the transform is separable). r2c transforms
 * the last dim real-to-complex (RFFT, n / 2 + 1 outputs) together with up to
 * two more, then the rest complex-to-complex; c2r the reverse: the leading
 * groups inverse complex-to-complex, then IRFFT of the last up-to-three dims
 * with the last dim's size given. XLA's inverse transforms divide by the
 * transformed size; PyTorch's do not, so the scale applied at the end is the
 * norm mode's times the size for an inverse.
 *
 * Each function lowers the ATen ops its table names; it returns false to leave
 * the call to the custom_call fallback (runtime/lower/stablehlo.c). The bodies
 * read n, base and outs and the locals LOWER_LOCALS declares (lower/emit.h). */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "lower/emit.h"

#define FFT_RANK 3 /* the most dims one stablehlo.fft transforms */

/* PyTorch's fft_norm_mode */
enum { NORM_NONE = 0, NORM_BY_ROOT_N = 1, NORM_BY_N = 2 };

/* The transformed dims of argument 1 (normalized against nd), false when
 * there are more than the tensor has. */
static bool fft_dims(const node_t* n, int nd, int64_t* dims, int* m) {
  const tpu_arg_t* a = &n->c->args[1];
  if (a->kind != TPU_ARG_INTLIST || a->n > nd) return false;
  *m = a->n;
  for (int k = 0; k < a->n; k++) {
    dims[k] = norm_dim(a->v.ilist[k], nd);
    if (dims[k] < 0 || dims[k] >= nd) return false;
  }
  return true;
}

/* stablehlo.fft of kind `type` over x's dims `dims` (k <= FFT_RANK of them,
 * in order; the last one is the real one of RFFT / IRFFT, whose size in the
 * real domain is `real_len`): the dims move to the end, are transformed, and
 * move back. */
static ref_t fft_group(em_t* e, ref_t x, const char* type, int k, const int64_t* dims, int64_t real_len) {
  int64_t perm[TPU_MAX_DIMS] = {0}, inv[TPU_MAX_DIMS], len[FFT_RANK];
  int p = 0;
  for (int d = 0; d < x.nd; d++) {
    bool moved = false;
    for (int j = 0; j < k; j++) moved |= dims[j] == d;
    if (!moved) perm[p++] = d;
  }
  for (int j = 0; j < k; j++) perm[p++] = dims[j];
  for (int d = 0; d < x.nd; d++) inv[perm[d]] = d;
  ref_t t = transpose(e, x, perm);
  for (int j = 0; j < k; j++) len[j] = t.sz[x.nd - k + j];
  ref_t r = mkref(t.dt, t.nd, t.sz);
  const bool to_real = !strcmp(type, "IRFFT"), from_real = !strcmp(type, "RFFT");
  if (from_real) {
    r.dt = t.dt == TPU_F64 ? TPU_C128 : TPU_C64;
    r.sz[r.nd - 1] = len[k - 1] / 2 + 1;
  } else if (to_real) {
    r.dt = tpu_dtype_complex_part(t.dt);
    len[k - 1] = real_len;
    r.sz[r.nd - 1] = real_len;
  }
  char b[256];
  r = emit(e, "stablehlo.fft", 1, &t, r, "fft_type = #stablehlo<fft_type %s>, fft_length = %s", type,
           i64arr(b, sizeof b, k, len));
  return transpose(e, r, inv);
}

/* complex-to-complex over m dims, FFT_RANK at a time */
static ref_t fft_c2c_dims(em_t* e, ref_t x, bool forward, int m, const int64_t* dims) {
  for (int j = 0; j < m; j += FFT_RANK) {
    const int k = m - j < FFT_RANK ? m - j : FFT_RANK;
    x = fft_group(e, x, forward ? "FFT" : "IFFT", k, dims + j, 0);
  }
  return x;
}

/* the norm mode's scale of a transform of `count` elements per signal (times
 * count for an inverse, which XLA has divided by it), applied to x */
static ref_t fft_scale(em_t* e, ref_t x, int64_t norm, bool inverse, double count) {
  double s = norm == NORM_BY_N ? 1.0 / count : norm == NORM_BY_ROOT_N ? 1.0 / sqrt(count) : 1.0;
  if (inverse) s *= count;
  return s == 1.0 || count == 0 ? x : scalar_op(e, "stablehlo.multiply", x, s);
}

/* _fft_c2c(self, dim, normalization, forward) */
static bool lower_fft_c2c(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  int64_t dims[TPU_MAX_DIMS];
  int m;
  if (!is_tensor(n, 0) || !tpu_dtype_is_complex(odt) || !fft_dims(n, o->ndim, dims, &m)) return false;
  const bool forward = tpu_arg_bool(c, 3, true);
  ref_t x = arg_out(n, 0, odt);
  double count = 1;
  for (int j = 0; j < m; j++) count *= (double)x.sz[dims[j]];
  x = fft_c2c_dims(e, x, forward, m, dims);
  outs[0] = fft_scale(e, x, tpu_arg_i64(c, 2, NORM_NONE), !forward, count);
  return true;
}

/* _fft_r2c(self, dim, normalization, onesided): the last dim of `dim` is
 * the real one (halved when onesided) */
static bool lower_fft_r2c(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  int64_t dims[TPU_MAX_DIMS];
  int m;
  if (!is_tensor(n, 0) || !tpu_dtype_is_complex(odt) || !fft_dims(n, o->ndim, dims, &m) || m == 0) return false;
  ref_t x = arg(n, 0);
  if (x.dt != tpu_dtype_complex_part(odt)) return false;
  double count = 1;
  for (int j = 0; j < m; j++) count *= (double)x.sz[dims[j]];
  if (tpu_arg_bool(c, 3, true)) { /* the trailing group real-to-complex, the others after it */
    const int k = m < FFT_RANK ? m : FFT_RANK;
    x = fft_group(e, x, "RFFT", k, dims + m - k, 0);
    x = fft_c2c_dims(e, x, true, m - k, dims);
  } else { /* the whole spectrum: a complex transform of the real values */
    x = fft_c2c_dims(e, convert(e, x, odt), true, m, dims);
  }
  outs[0] = fft_scale(e, x, tpu_arg_i64(c, 2, NORM_NONE), false, count);
  return true;
}

/* _fft_c2r(self, dim, normalization, last_dim_size): the last dim of `dim`
 * holds the n / 2 + 1 first bins of a Hermitian signal of last_dim_size
 * (later ones ignored) */
static bool lower_fft_c2r(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  int64_t dims[TPU_MAX_DIMS];
  int m;
  if (!is_tensor(n, 0) || !tpu_dtype_is_float(odt) || !fft_dims(n, o->ndim, dims, &m) || m == 0) return false;
  const int64_t last = tpu_arg_i64(c, 3, 0), half = last / 2 + 1;
  ref_t x = arg(n, 0);
  if (x.dt != (odt == TPU_F64 ? TPU_C128 : TPU_C64) || last <= 0 || x.sz[dims[m - 1]] < half) return false;
  int64_t lo[TPU_MAX_DIMS] = {0}, hi[TPU_MAX_DIMS];
  memcpy(hi, x.sz, sizeof(int64_t) * (size_t)x.nd);
  hi[dims[m - 1]] = half;
  x = slice(e, x, lo, hi);
  double count = (double)last;
  for (int j = 0; j + 1 < m; j++) count *= (double)x.sz[dims[j]];
  const int k = m < FFT_RANK ? m : FFT_RANK;
  x = fft_c2c_dims(e, x, false, m - k, dims);
  x = fft_group(e, x, "IRFFT", k, dims + m - k, last);
  outs[0] = fft_scale(e, x, tpu_arg_i64(c, 2, NORM_NONE), true, count);
  return true;
}

/* sorted by name (strcmp); tests/test_lower.c checks it */
static const tpu_lower_entry_t k_entries[] = {
    {"_fft_c2c", lower_fft_c2c},
    {"_fft_c2r", lower_fft_c2r},
    {"_fft_r2c", lower_fft_r2c},
};

const tpu_lower_table_t tpu_lower_fft = {k_entries, sizeof k_entries / sizeof k_entries[0]};
