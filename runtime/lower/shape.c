/* Lowerings that move or make values without arithmetic on them: copies,
 * fills and constants, arange, linspace/logspace, eye, tril/triu, flip, roll,
 * padding, cat, channel_shuffle.
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

static bool lower_to_copy(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "_to_copy") || !strcmp(base, "clone") || !strcmp(base, "alias_copy") ||
      !strcmp(base, "lift_fresh_copy")) {
    outs[0] = arg_out(n, 0, odt);
    return true;
  }
  return false;
}

static bool lower_copy(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "copy")) { /* copy_(self, src): self takes src's values */
    outs[0] = arg_out(n, 1, odt);
    return true;
  }
  return false;
}

static bool lower_fill(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "fill") || !strcmp(base, "full") || !strcmp(base, "full_like")) {
    /* fill(self, value), full(size, value), full_like(self, value) */
    outs[0] = arg_out(n, 1, odt);
    return true;
  }
  return false;
}

static bool lower_zero(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "zero") || !strcmp(base, "zeros") || !strcmp(base, "zeros_like") ||
      !strcmp(base, "ones") || !strcmp(base, "ones_like")) {
    outs[0] = cst_like(e, odt, base[0] == 'o' ? 1 : 0, o->ndim, o->sizes);
    return true;
  }
  return false;
}

static bool lower_arange(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "arange") && o->ndim == 1) {
    double start = 0, step = 1;
    if (!strcmp(ovl, "start") || !strcmp(ovl, "start_step") || !strcmp(ovl, "start_out")) start = tpu_arg_f64(c, 0, 0);
    if (!strcmp(ovl, "start_step") || !strcmp(ovl, "start_out")) step = tpu_arg_f64(c, 2, 1);
    tpu_dtype_t ct = tpu_dtype_is_float(odt) ? TPU_F64 : TPU_I64;
    ref_t i = emit(e, "stablehlo.iota", 0, NULL, mkref(ct, 1, o->sizes), "iota_dimension = 0 : i64");
    if (step != 1) i = scalar_op(e, "stablehlo.multiply", i, step);
    if (start != 0) i = scalar_op(e, "stablehlo.add", i, start);
    outs[0] = convert(e, i, odt);
    return true;
  }
  return false;
}

/* linspace(start, end, steps) and logspace(start, end, steps, base), as the
 * CPU kernel computes them: the first half counts up from start, the second
 * down from end; in the output's float type (double for integer outputs) */
static bool lower_linspace(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if ((strcmp(base, "linspace") && strcmp(base, "logspace")) || o->ndim != 1) return false;
  const int64_t steps = o->sizes[0];
  const tpu_dtype_t ct = tpu_dtype_is_float(odt) ? odt : TPU_F64;
  ref_t start = arg_as(n, 0, ct, 1, o->sizes), end = arg_as(n, 1, ct, 1, o->sizes);
  ref_t i = emit(e, "stablehlo.iota", 0, NULL, mkref(ct, 1, o->sizes), "iota_dimension = 0 : i64");
  ref_t v;
  if (steps <= 1) {
    v = start;
  } else {
    ref_t step = scalar_op(e, "stablehlo.divide", binop(e, "stablehlo.subtract", end, start), (double)(steps - 1));
    ref_t up = binop(e, "stablehlo.add", start, binop(e, "stablehlo.multiply", step, i));
    ref_t back = binop(e, "stablehlo.subtract", cst_like(e, ct, (double)(steps - 1), 1, o->sizes), i);
    ref_t down = binop(e, "stablehlo.subtract", end, binop(e, "stablehlo.multiply", step, back));
    ref_t first = compare(e, "LT", i, cst_like(e, ct, (double)(steps / 2), 1, o->sizes));
    v = select3(e, first, up, down);
  }
  if (base[1] == 'o') /* logspace: base ** v */
    v = binop(e, "stablehlo.power", cst_like(e, ct, tpu_arg_f64(c, 3, 10.0), 1, o->sizes), v);
  outs[0] = convert(e, v, odt);
  return true;
}

/* eye(n[, m]): ones on the diagonal */
static bool lower_eye(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (strcmp(base, "eye") || o->ndim != 2) return false;
  ref_t r = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, 2, o->sizes), "iota_dimension = 0 : i64");
  ref_t k = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, 2, o->sizes), "iota_dimension = 1 : i64");
  outs[0] = convert(e, compare(e, "EQ", r, k), odt);
  return true;
}

/* channel_shuffle(self, groups): [N, g, C/g, ...] with the two group dims swapped */
static bool lower_channel_shuffle(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (strcmp(base, "channel_shuffle") || !is_tensor(n, 0) || o->ndim < 2 || o->ndim >= TPU_MAX_DIMS) return false;
  const int64_t g = tpu_arg_i64(c, 1, 1), C = o->sizes[1];
  if (g <= 0 || C % g) return false;
  int64_t sz[TPU_MAX_DIMS], perm[TPU_MAX_DIMS];
  sz[0] = o->sizes[0];
  sz[1] = g;
  sz[2] = C / g;
  for (int d = 2; d < o->ndim; d++) sz[d + 1] = o->sizes[d];
  for (int d = 0; d <= o->ndim; d++) perm[d] = d;
  perm[1] = 2;
  perm[2] = 1;
  ref_t x = transpose(e, reshape(e, arg_out(n, 0, odt), o->ndim + 1, sz), perm);
  outs[0] = reshape(e, x, o->ndim, o->sizes);
  return true;
}

static bool lower_tril(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if ((!strcmp(base, "tril") || !strcmp(base, "triu")) && o->ndim >= 2) {
    ref_t x = arg_out(n, 0, odt);
    int64_t k = tpu_arg_i64(c, 1, 0);
    const int nd = o->ndim;
    ref_t row = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, nd, o->sizes), "iota_dimension = %d : i64", nd - 2);
    ref_t col = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, nd, o->sizes), "iota_dimension = %d : i64", nd - 1);
    ref_t diff = scalar_op(e, "stablehlo.subtract", binop(e, "stablehlo.subtract", col, row), (double)k);
    ref_t keep = compare(e, base[2] == 'i' && base[3] == 'l' ? "LE" : "GE", diff, cst_like(e, TPU_I64, 0, nd, o->sizes));
    outs[0] = select3(e, keep, x, cst_like(e, odt, 0, nd, o->sizes));
    return true;
  }
  return false;
}

static bool lower_flip(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "flip") && is_tensor(n, 0)) {
    const tpu_tensor_t* x = c->args[0].v.t;
    int64_t dims[TPU_MAX_DIMS];
    int nr = red_dims(n, 1, x->ndim, dims);
    char b[600];
    ref_t a = arg(n, 0);
    outs[0] = nr ? emit(e, "stablehlo.reverse", 1, &a, a, "dimensions = %s", i64arr(b, sizeof b, nr, dims)) : a;
    return true;
  }
  return false;
}

static bool lower_roll(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "roll") && is_tensor(n, 0)) { /* (self, shifts, dims) */
    const tpu_arg_t* sh = &c->args[1];
    const tpu_arg_t* dm = c->nargs > 2 ? &c->args[2] : NULL;
    const bool flat = !dm || dm->kind != TPU_ARG_INTLIST || dm->n == 0;
    if (!flat && (sh->kind != TPU_ARG_INTLIST || sh->n != dm->n)) return false; /* checked before emitting */
    ref_t a = arg(n, 0);
    if (flat) { /* over the flattened tensor */
      int64_t flat[1] = {numel(&a)};
      outs[0] = reshape(e, roll_dim(e, reshape(e, a, 1, flat), 0, sh->n ? sh->v.ilist[0] : 0), o->ndim, o->sizes);
      return true;
    }
    for (int k = 0; k < dm->n; k++) a = roll_dim(e, a, norm_dim(dm->v.ilist[k], a.nd), sh->v.ilist[k]);
    outs[0] = a;
    return true;
  }
  return false;
}

static bool lower_constant_pad_nd(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "constant_pad_nd") && is_tensor(n, 0)) { /* (self, pad, value) */
    const tpu_arg_t* pd = &c->args[1];
    if (pd->kind != TPU_ARG_INTLIST || pd->n % 2 || pd->n / 2 > c->args[0].v.t->ndim) return false;
    ref_t a = arg(n, 0);
    int64_t lo[TPU_MAX_DIMS] = {0}, hi[TPU_MAX_DIMS] = {0}, in[TPU_MAX_DIMS] = {0};
    for (int j = 0; j < pd->n / 2; j++) { /* pairs from the last dim backwards */
      lo[a.nd - 1 - j] = pd->v.ilist[2 * j];
      hi[a.nd - 1 - j] = pd->v.ilist[2 * j + 1];
    }
    ref_t pin[2] = {a, cst(e, a.dt, tpu_arg_f64(c, 2, 0))};
    char bl[300], bh[300], bi[300];
    outs[0] = emit(e, "stablehlo.pad", 2, pin, out_ref(n, a.dt),
                   "edge_padding_low = %s, edge_padding_high = %s, interior_padding = %s",
                   i64arr(bl, sizeof bl, a.nd, lo), i64arr(bh, sizeof bh, a.nd, hi), i64arr(bi, sizeof bi, a.nd, in));
    return true;
  }
  return false;
}

static bool lower_reflect_replicate_pad(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if ((!strncmp(base, "reflection_pad", 14) || !strncmp(base, "replication_pad", 15)) && is_tensor(n, 0) &&
      c->args[1].kind == TPU_ARG_INTLIST && strcmp(base + strlen(base) - 8, "backward")) {
    /* (self, padding): each padded dim is a gather of source positions */
    const bool reflect = base[2] == 'f';
    const tpu_arg_t* pd = &c->args[1];
    const tpu_tensor_t* x = c->args[0].v.t;
    if (pd->n % 2 || pd->n / 2 > x->ndim) return false;
    for (int j = 0; j < pd->n / 2; j++) { /* every dim checked before anything is emitted */
      const int64_t len = x->sizes[x->ndim - 1 - j];
      if (len <= 0 || len + pd->v.ilist[2 * j] + pd->v.ilist[2 * j + 1] <= 0) return false;
    }
    ref_t a = arg(n, 0);
    for (int j = 0; j < pd->n / 2; j++) {
      const int d = a.nd - 1 - j;
      const int64_t len = a.sz[d], pl = pd->v.ilist[2 * j], pr = pd->v.ilist[2 * j + 1], out = len + pl + pr;
      int64_t* src = malloc(sizeof(int64_t) * (size_t)out);
      if (!src) {
        e->oom = true;
        return false;
      }
      for (int64_t i = 0; i < out; i++) {
        int64_t p = i - pl;
        if (reflect) p = p < 0 ? -p : p >= len ? 2 * (len - 1) - p : p;
        else p = p < 0 ? 0 : p >= len ? len - 1 : p;
        src[i] = p;
      }
      a = take_along(e, a, d, cst_i64_list(e, out, src));
      free(src);
    }
    outs[0] = a;
    return true;
  }
  return false;
}

static bool lower_cat(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  if (!strcmp(base, "cat") && c->nargs >= 1 && c->args[0].kind == TPU_ARG_TENSORLIST) {
    int dim = norm_dim(tpu_arg_i64(c, 1, 0), o->ndim);
    ref_t in[256];
    int k = 0;
    for (int i = 0; i < c->args[0].n && k < 256; i++) {
      const tpu_tensor_t* t = &c->args[0].v.tlist[i];
      if (t->dtype == TPU_DTYPE_NONE || (t->ndim == 1 && t->sizes[0] == 0)) continue; /* legacy empty */
      in[k++] = convert(e, read_tensor(e, t), odt);
    }
    if (k == 0 || k == 256) return false;
    outs[0] = k == 1 ? in[0] : emit(e, "stablehlo.concatenate", k, in, out_ref(n, odt), "dimension = %d : i64", dim);
    return true;
  }
  return false;
}

/* sorted by name (strcmp); tests/test_lower.c checks it */
static const tpu_lower_entry_t k_entries[] = {
    {"_to_copy", lower_to_copy},
    {"alias_copy", lower_to_copy},
    {"arange", lower_arange},
    {"cat", lower_cat},
    {"channel_shuffle", lower_channel_shuffle},
    {"clone", lower_to_copy},
    {"constant_pad_nd", lower_constant_pad_nd},
    {"copy", lower_copy},
    {"eye", lower_eye},
    {"fill", lower_fill},
    {"flip", lower_flip},
    {"full", lower_fill},
    {"full_like", lower_fill},
    {"lift_fresh_copy", lower_to_copy},
    {"linspace", lower_linspace},
    {"logspace", lower_linspace},
    {"ones", lower_zero},
    {"ones_like", lower_zero},
    {"reflection_pad1d", lower_reflect_replicate_pad},
    {"reflection_pad2d", lower_reflect_replicate_pad},
    {"reflection_pad3d", lower_reflect_replicate_pad},
    {"replication_pad1d", lower_reflect_replicate_pad},
    {"replication_pad2d", lower_reflect_replicate_pad},
    {"replication_pad3d", lower_reflect_replicate_pad},
    {"roll", lower_roll},
    {"tril", lower_tril},
    {"triu", lower_tril},
    {"zero", lower_zero},
    {"zeros", lower_zero},
    {"zeros_like", lower_zero},
};

const tpu_lower_table_t tpu_lower_shape = {k_entries, sizeof k_entries / sizeof k_entries[0]};
