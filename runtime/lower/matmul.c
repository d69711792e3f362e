/* Contractions: the matmul family as dot_general with the call's precision, and
 * convolutions (plain and transposed) as stablehlo.convolution.
 *
 * Each function lowers the ATen ops its table names; it returns false to leave
 * the call to the custom_call fallback (runtime/lower/stablehlo.c). The bodies
 * read n, base and outs and the locals LOWER_LOCALS declares (lower/emit.h). */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lower/emit.h"

/* CPU's size below which bmm / baddbmm run its plain loop (contraction x rows x cols) */
#define SMALL_BMM 400

/* Arithmetic on the parts of complex values as CPU's float loop does it: the
 * parts are held in f64 and, for complex64, each result rounded to f32's
 * precision by reduce_precision (a product of f32 values is exact in f64, so
 * this is f32 arithmetic; with a convert to f32 and back instead, XLA narrows
 * the ops to f32 and fuses products into FMAs). A product by an inexact
 * constant (alpha, beta) can still differ from CPU's by an ulp. */
typedef struct {
  em_t* e;
  bool f32;
} parts_t;

static ref_t p_op(const parts_t* p, const char* op, ref_t a, ref_t b) {
  ref_t r = binop(p->e, op, a, b);
  return p->f32 ? emit(p->e, "stablehlo.reduce_precision", 1, &r, r, "exponent_bits = 8 : i32, mantissa_bits = 23 : i32")
                : r;
}

/* (xr, xi) * (yr, yi) into (zr, zi), c10::complex's product */
static void p_mul(const parts_t* p, ref_t xr, ref_t xi, ref_t yr, ref_t yi, ref_t* zr, ref_t* zi) {
  *zr = p_op(p, "stablehlo.subtract", p_op(p, "stablehlo.multiply", xr, yr), p_op(p, "stablehlo.multiply", xi, yi));
  *zi = p_op(p, "stablehlo.add", p_op(p, "stablehlo.multiply", xr, yi), p_op(p, "stablehlo.multiply", xi, yr));
}

/* Complex bmm / baddbmm below SMALL_BMM as CPU's loop computes them: per
 * output, the products added in contraction order to a zero, then for
 * baddbmm alpha * sum, plus self * beta unless beta is 0, alpha and beta
 * complex numbers. (A dot_general sums in another order, which shows where
 * the terms cancel.) */
static bool bmm_in_order(node_t* n, bool add, ref_t* outs) {
  LOWER_LOCALS;
  const int i0 = add ? 1 : 0;
  ref_t a = convert(e, arg(n, i0), odt), b = convert(e, arg(n, i0 + 1), odt);
  if (a.nd != 3 || b.nd != 3) return false;
  const int64_t nb = a.sz[0], m = a.sz[1], k = a.sz[2], nn = b.sz[2];
  if (k * m * nn >= SMALL_BMM) return false;
  const parts_t p = {e, odt == TPU_C64};
  const int64_t osz[3] = {nb, m, nn}, asz[2] = {nb, m}, bsz[2] = {nb, nn};
  const int64_t adims[2] = {0, 1}, bdims[2] = {0, 2};
  ref_t ar = convert(e, re_part(e, a), TPU_F64), ai = convert(e, im_part(e, a), TPU_F64);
  ref_t br = convert(e, re_part(e, b), TPU_F64), bi = convert(e, im_part(e, b), TPU_F64);
  ref_t sr = cst_like(e, TPU_F64, 0, 3, osz), si = sr;
  for (int64_t j = 0; j < k; j++) {
    const int64_t a0[3] = {0, 0, j}, a1[3] = {nb, m, j + 1}, b0[3] = {0, j, 0}, b1[3] = {nb, j + 1, nn};
    ref_t x[2], y[2], pr, pi;
    for (int q = 0; q < 2; q++) {
      x[q] = bcast_dims(e, reshape(e, slice(e, q ? ai : ar, a0, a1), 2, asz), 3, osz, adims);
      y[q] = bcast_dims(e, reshape(e, slice(e, q ? bi : br, b0, b1), 2, bsz), 3, osz, bdims);
    }
    p_mul(&p, x[0], x[1], y[0], y[1], &pr, &pi);
    sr = p_op(&p, "stablehlo.add", sr, pr);
    si = p_op(&p, "stablehlo.add", si, pi);
  }
  if (add) {
    double al[2] = {1, 0}, be[2] = {1, 0};
    if (i0 + 3 < c->nargs) tpu_arg_complex(c, i0 + 3, al);
    if (i0 + 2 < c->nargs) tpu_arg_complex(c, i0 + 2, be);
    for (int q = 0; q < 2 && p.f32; q++) { /* CPU's alpha and beta are complex<float> */
      al[q] = (float)al[q];
      be[q] = (float)be[q];
    }
    p_mul(&p, cst_like(e, TPU_F64, al[0], 3, osz), cst_like(e, TPU_F64, al[1], 3, osz), sr, si, &sr, &si);
    if (be[0] != 0 || be[1] != 0) {
      ref_t s = arg_out(n, 0, odt), tr, ti;
      p_mul(&p, convert(e, re_part(e, s), TPU_F64), convert(e, im_part(e, s), TPU_F64), cst_like(e, TPU_F64, be[0], 3, osz),
            cst_like(e, TPU_F64, be[1], 3, osz), &tr, &ti);
      sr = p_op(&p, "stablehlo.add", tr, sr);
      si = p_op(&p, "stablehlo.add", ti, si);
    }
  }
  const tpu_dtype_t part = tpu_dtype_complex_part(odt);
  outs[0] = make_complex(e, convert(e, sr, part), convert(e, si, part));
  return true;
}

static bool lower_mm(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if ((!strcmp(base, "bmm") || !strcmp(base, "baddbmm")) && tpu_dtype_is_complex(odt) &&
      bmm_in_order(n, base[0] == 'b' && base[1] == 'a', outs))
    return true;
  /* matmuls */
  if (!strcmp(base, "mm") || !strcmp(base, "bmm") || !strcmp(base, "addmm") || !strcmp(base, "baddbmm") ||
      !strcmp(base, "mv") || !strcmp(base, "dot") || !strcmp(base, "vdot") || !strcmp(base, "addmv")) {
    /* vdot of real vectors is dot */
    const bool add = base[0] == 'a' || (base[0] == 'b' && base[1] == 'a');
    const int i0 = add ? 1 : 0;
    /* half inputs accumulate in f32 (dot_general's result type) and round once at the end,
     * bias included, as PyTorch does */
    const tpu_dtype_t ct = acc_type(odt);
    ref_t a = convert(e, arg(n, i0), odt), b = convert(e, arg(n, i0 + 1), odt);
    if (!strcmp(base, "vdot") && tpu_dtype_is_complex(odt)) /* conj(a) . b */
      a = conj_of(e, a);
    const bool batched = strstr(base, "bmm") != NULL;
    ref_t r = dot_general(e, a, b, batched ? 1 : 0, a.nd - 1, batched ? 1 : 0, out_ref(n, ct), c->precision);
    if (add) { /* complex alpha and beta scale as values, real ones as before */
      const bool cx_beta = i0 + 2 < c->nargs && c->args[i0 + 2].kind == TPU_ARG_COMPLEX;
      const bool cx_alpha = i0 + 3 < c->nargs && c->args[i0 + 3].kind == TPU_ARG_COMPLEX;
      double beta = tpu_arg_f64(c, i0 + 2, 1.0), alpha = tpu_arg_f64(c, i0 + 3, 1.0);
      if (cx_alpha) r = binop(e, "stablehlo.multiply", r, arg_as(n, i0 + 3, ct, r.nd, r.sz));
      else if (alpha != 1.0) r = scalar_op(e, "stablehlo.multiply", r, alpha);
      if (cx_beta || beta != 0.0) {
        ref_t s = arg_out(n, 0, ct);
        if (cx_beta) s = binop(e, "stablehlo.multiply", s, arg_as(n, i0 + 2, ct, s.nd, s.sz));
        else if (beta != 1.0) s = scalar_op(e, "stablehlo.multiply", s, beta);
        r = binop(e, "stablehlo.add", s, r);
      }
    }
    outs[0] = convert(e, r, odt);
    return true;
  }
  return false;
}

static bool lower_convolution(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if ((!strcmp(base, "convolution") || !strcmp(base, "_convolution")) && is_tensor(n, 0) && is_tensor(n, 1) &&
      tpu_arg_bool(c, 6, false) && c->args[0].v.t->ndim >= 3 && c->args[0].v.t->ndim <= 5) {
    /* transposed: a convolution of the input dilated by the stride, padded by
     * dilation * (k - 1) - padding (+ output_padding high), with the kernel
     * flipped and its in/out channels swapped within each group */
    const int k = c->args[0].v.t->ndim - 2;
    const tpu_tensor_t* wt = c->args[1].v.t; /* [Cin, Cout / g, k...] */
    const int64_t g = tpu_arg_i64(c, 8, 1), cin = wt->sizes[0], coutg = wt->sizes[1];
    if (g <= 0 || cin % g) return false;
    int64_t stride[3], dil[3], one[3] = {1, 1, 1};
    char pad[200] = "", sp[16] = "", b1[64], b2[64], b3[64];
    size_t pl = 0;
    for (int i = 0; i < k; i++) {
      const tpu_arg_t *st = &c->args[3], *pd = &c->args[4], *dl = &c->args[5], *op = &c->args[7];
      stride[i] = st->kind == TPU_ARG_INTLIST && st->n ? st->v.ilist[st->n == 1 ? 0 : i] : 1;
      dil[i] = dl->kind == TPU_ARG_INTLIST && dl->n ? dl->v.ilist[dl->n == 1 ? 0 : i] : 1;
      int64_t p = pd->kind == TPU_ARG_INTLIST && pd->n ? pd->v.ilist[pd->n == 1 ? 0 : i] : 0;
      int64_t opad = op->kind == TPU_ARG_INTLIST && op->n ? op->v.ilist[op->n == 1 ? 0 : i] : 0;
      int64_t lo = dil[i] * (wt->sizes[2 + i] - 1) - p;
      pl += (size_t)snprintf(pad + pl, sizeof pad - pl, "%s[%" PRId64 ", %" PRId64 "]", i ? ", " : "", lo, lo + opad);
      snprintf(sp + 3 * i, sizeof sp - 3 * (size_t)i, ", %d", i);
    }
    const tpu_dtype_t ct = acc_type(odt);
    ref_t w = convert(e, arg(n, 1), odt);
    /* [Cin, Cout/g, k..] -> [g, Cin/g, Cout/g, k..] -> [g, Cout/g, Cin/g, k..] -> [Cout, Cin/g, k..] */
    int64_t s5[6] = {g, cin / g, coutg}, perm[6] = {0, 2, 1}, s4[5] = {g * coutg, cin / g};
    for (int i = 0; i < k; i++) {
      s5[3 + i] = wt->sizes[2 + i];
      perm[3 + i] = 3 + i;
      s4[2 + i] = wt->sizes[2 + i];
    }
    w = reshape(e, transpose(e, reshape(e, w, 3 + k, s5), perm), 2 + k, s4);
    int64_t sdims[3];
    for (int i = 0; i < k; i++) sdims[i] = 2 + i;
    w = emit(e, "stablehlo.reverse", 1, &w, w, "dimensions = %s", i64arr(b3, sizeof b3, k, sdims));
    ref_t in[2] = {convert(e, arg(n, 0), odt), w};
    const char* prec = odt != TPU_F32 || c->precision == TPU_PRECISION_MEDIUM ? "DEFAULT"
                       : c->precision == TPU_PRECISION_HIGH                   ? "HIGH"
                                                                              : "HIGHEST";
    char b4[64];
    ref_t r = emit(e, "stablehlo.convolution", 2, in, out_ref(n, ct),
                   "batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, f%s]x[o, i%s]->[b, f%s]>, "
                   "feature_group_count = %" PRId64 " : i64, padding = dense<[%s]> : tensor<%dx2xi64>, "
                   "lhs_dilation = %s, rhs_dilation = %s, window_strides = %s, "
                   "precision_config = [#stablehlo<precision %s>, #stablehlo<precision %s>]",
                   sp, sp, sp, g, pad, k, i64arr(b1, sizeof b1, k, stride), i64arr(b2, sizeof b2, k, dil),
                   i64arr(b4, sizeof b4, k, one), prec, prec);
    if (is_tensor(n, 2)) {
      ref_t bias = convert(e, arg(n, 2), ct);
      r = binop(e, "stablehlo.add", r, bcast_dims(e, bias, r.nd, r.sz, (int64_t[]){1}));
    }
    outs[0] = convert(e, r, odt);
    return true;
  }
  return false;
}

static bool lower_convolution_2(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if ((!strcmp(base, "convolution") || !strcmp(base, "_convolution")) && is_tensor(n, 0) && is_tensor(n, 1) &&
      !tpu_arg_bool(c, 6, false) && c->args[0].v.t->ndim >= 3 && c->args[0].v.t->ndim <= 5) {
    /* (input, weight, bias?, stride, padding, dilation, transposed, output_padding, groups),
     * channels-first, not transposed */
    const int k = c->args[0].v.t->ndim - 2;
    int64_t stride[3], dil[3];
    char pad[200] = "", sp[16] = "", b1[64], b2[64];
    size_t pl = 0;
    for (int i = 0; i < k; i++) {
      const tpu_arg_t* st = &c->args[3], *pd = &c->args[4], *dl = &c->args[5];
      stride[i] = st->kind == TPU_ARG_INTLIST && st->n ? st->v.ilist[st->n == 1 ? 0 : i] : 1;
      dil[i] = dl->kind == TPU_ARG_INTLIST && dl->n ? dl->v.ilist[dl->n == 1 ? 0 : i] : 1;
      int64_t p = pd->kind == TPU_ARG_INTLIST && pd->n ? pd->v.ilist[pd->n == 1 ? 0 : i] : 0;
      pl += (size_t)snprintf(pad + pl, sizeof pad - pl, "%s[%" PRId64 ", %" PRId64 "]", i ? ", " : "", p, p);
      snprintf(sp + 3 * i, sizeof sp - 3 * (size_t)i, ", %d", i);
    }
    const tpu_dtype_t ct = acc_type(odt);
    ref_t in[2] = {convert(e, arg(n, 0), odt), convert(e, arg(n, 1), odt)};
    const char* prec = odt != TPU_F32 || c->precision == TPU_PRECISION_MEDIUM ? "DEFAULT"
                       : c->precision == TPU_PRECISION_HIGH                   ? "HIGH"
                                                                              : "HIGHEST";
    ref_t r = emit(e, "stablehlo.convolution", 2, in, out_ref(n, ct),
                   "batch_group_count = 1 : i64, dimension_numbers = #stablehlo.conv<[b, f%s]x[o, i%s]->[b, f%s]>, "
                   "feature_group_count = %" PRId64 " : i64, padding = dense<[%s]> : tensor<%dx2xi64>, "
                   "rhs_dilation = %s, window_strides = %s, "
                   "precision_config = [#stablehlo<precision %s>, #stablehlo<precision %s>]",
                   sp, sp, sp, tpu_arg_i64(c, 8, 1), pad, k, i64arr(b1, sizeof b1, k, dil),
                   i64arr(b2, sizeof b2, k, stride), prec, prec);
    if (is_tensor(n, 2)) { /* bias over the channel dim */
      ref_t bias = convert(e, arg(n, 2), ct);
      r = binop(e, "stablehlo.add", r, bcast_dims(e, bias, r.nd, r.sz, (int64_t[]){1}));
    }
    outs[0] = convert(e, r, odt);
    return true;
  }
  return false;
}

/* float4_e2m1fn_x2 bytes (moved as ui8), `lines` x `pairs` with the pairs along
 * dim `kdim` (1: A, M x K/2; 0: B, K/2 x N), as float32 values with K = 2 *
 * pairs along that dim, element 2i in the low nibble: the e2m1 magnitudes
 * 0, .5, 1, 1.5, 2, 3, 4, 6 of codes 0..7 are c / 2 below 4, c - 2 below 6
 * and 2 (c - 4) above, negative where bit 3 is set. */
static ref_t decode_f4(em_t* e, ref_t x, int kdim) {
  const int64_t r = x.sz[0], c = x.sz[1];
  ref_t lo = binop(e, "stablehlo.and", x, cst_like(e, TPU_U8, 15, 2, x.sz));
  ref_t hi = binop(e, "stablehlo.shift_right_logical", x, cst_like(e, TPU_U8, 4, 2, x.sz));
  ref_t half[2];
  for (int h = 0; h < 2; h++) {
    ref_t code = convert(e, h ? hi : lo, TPU_F32);
    ref_t neg = compare(e, "GE", code, cst_like(e, TPU_F32, 8, 2, x.sz));
    ref_t mag = select3(e, neg, binop(e, "stablehlo.subtract", code, cst_like(e, TPU_F32, 8, 2, x.sz)),
                        code);
    ref_t v = select3(e, compare(e, "LT", mag, cst_like(e, TPU_F32, 4, 2, x.sz)),
                      scalar_op(e, "stablehlo.multiply", mag, 0.5),
                      select3(e, compare(e, "LT", mag, cst_like(e, TPU_F32, 6, 2, x.sz)),
                              scalar_op(e, "stablehlo.subtract", mag, 2.0),
                              scalar_op(e, "stablehlo.multiply",
                                        scalar_op(e, "stablehlo.subtract", mag, 4.0), 2.0)));
    v = select3(e, neg, unop(e, "stablehlo.negate", v), v);
    /* a unit dim after the pairs' dim, for the interleave */
    half[h] = kdim == 1 ? reshape(e, v, 3, (int64_t[]){r, c, 1}) : reshape(e, v, 3, (int64_t[]){r, 1, c});
  }
  const int64_t isz[3] = {r, kdim == 1 ? c : 2, kdim == 1 ? 2 : c};
  ref_t both = emit(e, "stablehlo.concatenate", 2, half, mkref(TPU_F32, 3, isz), "dimension = %d : i64",
                    kdim == 1 ? 2 : 1);
  return kdim == 1 ? reshape(e, both, 2, (int64_t[]){r, 2 * c}) : reshape(e, both, 2, (int64_t[]){2 * r, c});
}

/* Block scales in cuBLAS's swizzled layout (the host kernel's swizzled_index,
 * kernels/matmul.c: 128 x 4 tiles of lines x k blocks, line l = 32 a + b of a
 * tile at b * 16 + a * 4 + kb % 4), as float32 [lines, k] with each block's
 * scale repeated over its blk steps. */
static ref_t block_scales(em_t* e, ref_t codes, int64_t lines, int64_t k, int64_t blk) {
  const int64_t kblocks = (k + blk - 1) / blk, mt = (lines + 127) / 128, kt = (kblocks + 3) / 4;
  ref_t t = reshape(e, codes, 5, (int64_t[]){mt, kt, 32, 4, 4});
  t = transpose(e, t, (int64_t[]){0, 3, 2, 1, 4}); /* (tile, a, b, k tile, kb % 4) */
  t = reshape(e, t, 2, (int64_t[]){mt * 128, kt * 4});
  t = convert(e, slice(e, t, (int64_t[]){0, 0}, (int64_t[]){lines, kblocks}), TPU_F32);
  t = bcast_dims(e, t, 3, (int64_t[]){lines, kblocks, blk}, (int64_t[]){0, 1});
  t = reshape(e, t, 2, (int64_t[]){lines, kblocks * blk});
  return slice(e, t, (int64_t[]){0, 0}, (int64_t[]){lines, k});
}

/* _scaled_mm(self, mat2, scale_a, scale_b, bias, scale_result, out_dtype,
 * use_fast_accum), as the host kernel computes it (targets/host/kernels/
 * scaled_mm.c): the decoded values times their scales in float32, a float32
 * product (HIGHEST: the operands are no longer bfloat16-exact), the bias
 * added in float32, a float8 result divided by scale_result, one rounding to
 * the output dtype. Scales: float32 per tensor or per row of A / column of
 * B, or the block scales of MXFP8 / MXFP4 (float8_e8m0fnu, 32 steps) and
 * NVFP4 (float8_e4m3fn, 16) in cuBLAS's swizzled layout; float4 operands are
 * decoded from their bytes (decode_f4). _scaled_mm_v2's two-level NVFP4
 * passes float32 global scales as args 8 and 9: the sum times both, before
 * the bias. The bridge has checked the configuration. */
static bool lower_scaled_mm(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!is_tensor(n, 0) || !is_tensor(n, 1) || !is_tensor(n, 2) || !is_tensor(n, 3)) return false;
  const tpu_tensor_t *ta = c->args[0].v.t, *tb = c->args[1].v.t;
  const tpu_tensor_t *tsa = c->args[2].v.t, *tsb = c->args[3].v.t;
  if (ta->ndim != 2 || tb->ndim != 2) return false;
  const bool fp4 = ta->dtype == TPU_F4E2M1FNX2;
  const bool blockwise = tsa->dtype == TPU_F8E8M0FNU || tsa->dtype == TPU_F8E4M3FN;
  if (fp4 != (tb->dtype == TPU_F4E2M1FNX2) || (!blockwise && (fp4 || tsa->dtype != TPU_F32 ||
                                                               tsb->dtype != TPU_F32)))
    return false;
  const int64_t m = ta->sizes[0], k = ta->sizes[1] * (fp4 ? 2 : 1), nn = tb->sizes[1];
  ref_t a = fp4 ? decode_f4(e, arg(n, 0), 1) : convert(e, arg(n, 0), TPU_F32);
  ref_t b = fp4 ? decode_f4(e, arg(n, 1), 0) : convert(e, arg(n, 1), TPU_F32);
  if (blockwise) {
    const int64_t blk = tsa->dtype == TPU_F8E8M0FNU ? 32 : 16;
    a = binop(e, "stablehlo.multiply", a, block_scales(e, arg(n, 2), m, k, blk));
    b = binop(e, "stablehlo.multiply", b,
              transpose(e, block_scales(e, arg(n, 3), nn, k, blk), (int64_t[]){1, 0}));
  } else {
    const int64_t na = tpu_tensor_numel(tsa), nb = tpu_tensor_numel(tsb);
    if ((na != 1 && na != m) || (nb != 1 && nb != nn)) return false;
    ref_t sa = reshape(e, arg(n, 2), na == 1 ? 0 : 1, (int64_t[]){m});
    ref_t sb = reshape(e, arg(n, 3), nb == 1 ? 0 : 1, (int64_t[]){nn});
    a = binop(e, "stablehlo.multiply", a, bcast_dims(e, sa, 2, (int64_t[]){m, k}, (int64_t[]){0}));
    b = binop(e, "stablehlo.multiply", b, bcast_dims(e, sb, 2, (int64_t[]){k, nn}, (int64_t[]){1}));
  }
  ref_t r = dot_general(e, a, b, 0, 1, 0, mkref(TPU_F32, 2, (int64_t[]){m, nn}), TPU_PRECISION_HIGHEST);
  if (c->nargs > 9 && is_tensor(n, 8) && is_tensor(n, 9)) { /* _scaled_mm_v2's NVFP4 global scales */
    ref_t g = binop(e, "stablehlo.multiply", reshape(e, arg(n, 8), 0, NULL), reshape(e, arg(n, 9), 0, NULL));
    r = binop(e, "stablehlo.multiply", r, bcast(e, g, 2, (int64_t[]){m, nn}));
  }
  if (is_tensor(n, 4))
    r = binop(e, "stablehlo.add", r,
              bcast_dims(e, reshape(e, convert(e, arg(n, 4), TPU_F32), 1, (int64_t[]){nn}), 2,
                         (int64_t[]){m, nn}, (int64_t[]){1}));
  if (is_tensor(n, 5) && (odt == TPU_F8E4M3FN || odt == TPU_F8E5M2)) {
    ref_t inv = binop(e, "stablehlo.divide", cst(e, TPU_F32, 1.0), reshape(e, arg(n, 5), 0, NULL));
    r = binop(e, "stablehlo.multiply", r, bcast(e, inv, 2, (int64_t[]){m, nn}));
  }
  outs[0] = convert(e, r, odt);
  return true;
}

/* the former chain tried these in turn; the first that lowers wins */
static bool lower_convolution_any(node_t* n, const char* base, ref_t* outs) {
  return lower_convolution(n, base, outs) || lower_convolution_2(n, base, outs);
}

/* sorted by name (strcmp); tests/test_lower.c checks it */
static const tpu_lower_entry_t k_entries[] = {
    {"_convolution", lower_convolution_any},
    {"_scaled_mm", lower_scaled_mm},
    {"addmm", lower_mm},
    {"addmv", lower_mm},
    {"baddbmm", lower_mm},
    {"bmm", lower_mm},
    {"convolution", lower_convolution_any},
    {"dot", lower_mm},
    {"mm", lower_mm},
    {"mv", lower_mm},
    {"vdot", lower_mm},
};

const tpu_lower_table_t tpu_lower_matmul = {k_entries, sizeof k_entries / sizeof k_entries[0]};
