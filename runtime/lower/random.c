/* Random-number lowerings: uniform, normal, log_normal, cauchy, exponential,
 * geometric, bernoulli, random_, randperm and native_dropout (and its
 * backward, which reads the mask and draws nothing).
 *
 * They follow the counter contract of base/philox.h exactly as the host's
 * kernels (targets/host/kernels/random.c) do, so a seed gives the same numbers
 * on every target: output element i (row-major) takes the Philox4x32-10 block
 * with key = rng_seed and counter = rng_offset + i, computed in the program
 * on ui32 words (the 32x32->64 products on ui64), and the host's mapping of
 * the block's words to a value, in f64 where the host computes in double.
 *
 * When the printer lifts numbers (tpu_graph_print_opts_t.lift_numbers) the
 * seed and the offset are 0-d i64 parameters over the call's rng_seed and
 * rng_offset, so one program serves every call; otherwise they are
 * constants. The word types ui32/ui64 are this file's own element types
 * (PyTorch's codes for uint32/uint64, which no tensor of the runtime has). */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/philox.h"
#include "lower/emit.h"

#define DT_U32 ((tpu_dtype_t)28)
#define DT_U64 ((tpu_dtype_t)29)

#define TWO_PI 6.283185307179586476925
#define PI 3.141592653589793238463

/* an exact ui64 constant (cst goes through a double) */
static ref_t u64_const(em_t* e, uint64_t v) {
  ref_t r = mkref(DT_U64, 0, NULL);
  r.id = e->next++;
  fprintf(e->f,
          "    %%%d = \"stablehlo.constant\"() {value = dense<%" PRIu64
          "> : tensor<ui64>} : () -> tensor<ui64>\n",
          r.id, v);
  return r;
}

/* *p (the call's seed or offset) as a 0-d ui64 value */
static ref_t rng_word(node_t* n, const uint64_t* p) {
  em_t* e = n->e;
  if (!(e->o && e->o->lift_numbers)) return u64_const(e, *p);
  tpu_tensor_t t;
  memset(&t, 0, sizeof t);
  t.data = (void*)p;
  t.dtype = TPU_I64; /* the same 8 bytes; the runtime has no unsigned 64-bit dtype */
  ref_t x = read_tensor(e, &t);
  return emit(e, "stablehlo.bitcast_convert", 1, &x, mkref(DT_U64, 0, NULL), NULL);
}

static ref_t lo32(em_t* e, ref_t x) {
  return convert(e, scalar_op(e, "stablehlo.and", x, 4294967295.0), DT_U32);
}
static ref_t hi32(em_t* e, ref_t x) {
  return convert(e, scalar_op(e, "stablehlo.shift_right_logical", x, 32), DT_U32);
}

/* The Philox block of every element of a (nd, sz) output: w[0..3] */
static void philox(node_t* n, int nd, const int64_t* sz, ref_t* w) {
  em_t* e = n->e;
  const tpu_call_t* c = n->c;
  ref_t seed = rng_word(n, &c->rng_seed), off = rng_word(n, &c->rng_offset);
  int64_t total = 1;
  for (int d = 0; d < nd; d++) total *= sz[d];
  ref_t idx = emit(e, "stablehlo.iota", 0, NULL, mkref(DT_U64, 1, &total), "iota_dimension = 0 : i64");
  ref_t ctr = binop(e, "stablehlo.add", reshape(e, idx, nd, sz), bcast(e, off, nd, sz));
  ref_t c0 = lo32(e, ctr), c1 = hi32(e, ctr);
  ref_t c2 = cst_like(e, DT_U32, 0, nd, sz), c3 = c2;
  ref_t k0 = lo32(e, seed), k1 = hi32(e, seed);
  ref_t m0 = cst_like(e, DT_U64, 0xD2511F53u, nd, sz), m1 = cst_like(e, DT_U64, 0xCD9E8D57u, nd, sz);
  for (int round = 0; round < 10; round++) {
    if (round > 0) { /* the key schedule, on 0-d words (ui32 adds wrap) */
      k0 = scalar_op(e, "stablehlo.add", k0, 0x9E3779B9u);
      k1 = scalar_op(e, "stablehlo.add", k1, 0xBB67AE85u);
    }
    ref_t p0 = binop(e, "stablehlo.multiply", convert(e, c0, DT_U64), m0);
    ref_t p1 = binop(e, "stablehlo.multiply", convert(e, c2, DT_U64), m1);
    ref_t n0 = binop(e, "stablehlo.xor", binop(e, "stablehlo.xor", hi32(e, p1), c1), bcast(e, k0, nd, sz));
    ref_t n2 = binop(e, "stablehlo.xor", binop(e, "stablehlo.xor", hi32(e, p0), c3), bcast(e, k1, nd, sz));
    c1 = lo32(e, p1);
    c3 = lo32(e, p0);
    c0 = n0;
    c2 = n2;
  }
  w[0] = c0;
  w[1] = c1;
  w[2] = c2;
  w[3] = c3;
}

/* hi:lo as one ui64 */
static ref_t bits64(em_t* e, ref_t hi, ref_t lo) {
  ref_t h = scalar_op(e, "stablehlo.shift_left", convert(e, hi, DT_U64), 32);
  return binop(e, "stablehlo.or", h, convert(e, lo, DT_U64));
}

/* (hi:lo >> 11) as f64, the 53 bits a uniform variate takes */
static ref_t top53(em_t* e, ref_t hi, ref_t lo) {
  ref_t h = scalar_op(e, "stablehlo.shift_left", convert(e, hi, DT_U64), 21);
  ref_t l = scalar_op(e, "stablehlo.shift_right_logical", convert(e, lo, DT_U64), 11);
  return convert(e, binop(e, "stablehlo.or", h, l), TPU_F64);
}

/* [0, 1) */
static ref_t u01(em_t* e, ref_t hi, ref_t lo) {
  return scalar_op(e, "stablehlo.multiply", top53(e, hi, lo), 0x1p-53);
}
/* (0, 1) */
static ref_t u01_open(em_t* e, ref_t hi, ref_t lo) {
  return scalar_op(e, "stablehlo.multiply", scalar_op(e, "stablehlo.add", top53(e, hi, lo), 0.5), 0x1p-53);
}

/* Box-Muller on the four words */
static ref_t std_normal(em_t* e, const ref_t* w) {
  ref_t lg = unop(e, "stablehlo.log", u01_open(e, w[0], w[1]));
  ref_t r = unop(e, "stablehlo.sqrt", scalar_op(e, "stablehlo.multiply", lg, -2.0));
  ref_t a = unop(e, "stablehlo.cosine", scalar_op(e, "stablehlo.multiply", u01(e, w[2], w[3]), TWO_PI));
  return binop(e, "stablehlo.multiply", r, a);
}

/* number or tensor argument i as f64 broadcast to (nd, sz); dflt when absent */
static ref_t param(node_t* n, int i, double dflt, int nd, const int64_t* sz) {
  if (is_tensor(n, i) || is_number(n, i)) return arg_as(n, i, TPU_F64, nd, sz);
  return cst_like(n->e, TPU_F64, dflt, nd, sz);
}

static ref_t mul(em_t* e, ref_t a, ref_t b) { return binop(e, "stablehlo.multiply", a, b); }
static ref_t add(em_t* e, ref_t a, ref_t b) { return binop(e, "stablehlo.add", a, b); }

/* uniform, normal, log_normal, cauchy, exponential, geometric: one float
 * output (geometric: any dtype) from its own blocks. A complex uniform_ /
 * normal_ draws its parts as a real tensor of one more dim of 2, as the host
 * (normal_: each part with std / sqrt(2), as PyTorch), from number arguments. */
static bool lower_dist(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  const bool cx = tpu_dtype_is_complex(odt);
  int64_t psz[TPU_MAX_DIMS];
  if (cx && (o->ndim >= TPU_MAX_DIMS || (strcmp(base, "uniform") && strcmp(base, "normal")) || strcmp(ovl, "") ||
             is_tensor(n, 1) || is_tensor(n, 2)))
    return false;
  memcpy(psz, o->sizes, sizeof(int64_t) * (size_t)o->ndim);
  psz[o->ndim] = 2;
  const int nd = o->ndim + cx;
  const int64_t* sz = cx ? psz : o->sizes;
  const tpu_dtype_t vdt = tpu_dtype_complex_part(odt); /* the values' (parts') dtype */
  const bool geometric = !strcmp(base, "geometric");
  if (!tpu_dtype_is_float(vdt) && !(geometric && tpu_dtype_is_supported(odt) && odt != TPU_BOOL))
    return false;
  ref_t w[4];
  ref_t v;
  if (!strcmp(base, "uniform")) {
    ref_t a = param(n, 1, 0.0, nd, sz), b = param(n, 2, 1.0, nd, sz);
    philox(n, nd, sz, w);
    v = add(e, a, mul(e, u01(e, w[0], w[1]), binop(e, "stablehlo.subtract", b, a)));
    if (vdt != TPU_F64) v = convert(e, convert(e, v, vdt), TPU_F64); /* rounded to the dtype */
    /* rounding reached `to`: keep [from, to) */
    ref_t hit = binop(e, "stablehlo.and", compare(e, "GE", v, b), compare(e, "GT", b, a));
    v = select3(e, hit, a, v);
  } else if (!strcmp(base, "normal")) {
    const int m = !strcmp(ovl, "") || !strcmp(ovl, "out") ? 1 : 0; /* normal_(self, mean, std) */
    ref_t mean = param(n, m, 0.0, nd, sz), sd = param(n, m + 1, 1.0, nd, sz);
    if (cx) sd = scalar_op(e, "stablehlo.divide", sd, sqrt(2.0));
    philox(n, nd, sz, w);
    v = add(e, mean, mul(e, sd, std_normal(e, w)));
  } else if (!strcmp(base, "log_normal")) {
    ref_t mean = param(n, 1, 1.0, nd, sz), sd = param(n, 2, 2.0, nd, sz);
    philox(n, nd, sz, w);
    v = unop(e, "stablehlo.exponential", add(e, mean, mul(e, sd, std_normal(e, w))));
  } else if (!strcmp(base, "cauchy")) {
    ref_t median = param(n, 1, 0.0, nd, sz), sigma = param(n, 2, 1.0, nd, sz);
    philox(n, nd, sz, w);
    ref_t t = scalar_op(e, "stablehlo.subtract", u01_open(e, w[0], w[1]), 0.5);
    t = scalar_op(e, "stablehlo.multiply", t, PI);
    ref_t tan = binop(e, "stablehlo.divide", unop(e, "stablehlo.sine", t), unop(e, "stablehlo.cosine", t));
    v = add(e, median, mul(e, sigma, tan));
  } else if (!strcmp(base, "exponential")) {
    ref_t lambd = param(n, 1, 1.0, nd, sz);
    philox(n, nd, sz, w);
    ref_t lg = unop(e, "stablehlo.log", u01_open(e, w[0], w[1]));
    v = binop(e, "stablehlo.divide", unop(e, "stablehlo.negate", lg), lambd);
  } else { /* geometric: ceil(log(u) / log1p(-p)), log1p(-p) as the host computes it */
    const double p = tpu_arg_f64(c, 1, 0.5);
    if (!(p > 0 && p < 1)) return false;
    philox(n, nd, sz, w);
    ref_t lg = unop(e, "stablehlo.log", u01_open(e, w[0], w[1]));
    v = unop(e, "stablehlo.ceil", scalar_op(e, "stablehlo.divide", lg, log1p(-p)));
  }
  v = convert(e, v, vdt);
  if (cx) { /* (re, im) pairs along the last dim */
    int64_t lo[TPU_MAX_DIMS] = {0}, hi[TPU_MAX_DIMS];
    memcpy(hi, psz, sizeof(int64_t) * (size_t)nd);
    ref_t part[2];
    for (int k = 0; k < 2; k++) {
      lo[nd - 1] = k;
      hi[nd - 1] = k + 1;
      part[k] = reshape(e, slice(e, v, lo, hi), o->ndim, o->sizes);
    }
    v = make_complex(e, part[0], part[1]);
  }
  outs[0] = v;
  return true;
}

/* bernoulli(self) / bernoulli.out: self holds the probabilities;
 * bernoulli.p / bernoulli_.float / .float_out / .Tensor / bernoulli_.Tensor /
 * .Tensor_out: argument 1 does (a number or a tensor broadcast to self) */
static bool lower_bernoulli(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  (void)base;
  if (!tpu_dtype_is_supported(odt)) return false;
  const bool self_probs = !strcmp(ovl, "") || !strcmp(ovl, "out");
  ref_t prob;
  if (self_probs) {
    if (!is_tensor(n, 0)) return false;
    prob = arg_out(n, 0, TPU_F64);
  } else {
    if (!is_tensor(n, 1) && !is_number(n, 1)) return false;
    prob = arg_out(n, 1, TPU_F64);
  }
  /* CPU checks a tensor of probabilities on its values (a number, at the op) */
  if (self_probs || is_tensor(n, 1)) check_prob(e, prob);
  ref_t w[4];
  philox(n, o->ndim, o->sizes, w);
  outs[0] = convert(e, compare(e, "LT", u01(e, w[0], w[1]), prob), odt);
  return true;
}

/* ---- random_ ---- */

/* random / random.out / random_: [0, default]; random.from (to None:
 * [from, default], else [from, to)); random.to: [0, to) */
static bool lower_random(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  (void)base;
  if (!tpu_dtype_is_supported(odt)) return false;
  int64_t from = 0, to_inc = tpu_random_default_to_inc(odt);
  if (!strcmp(ovl, "from") || !strcmp(ovl, "from_out")) {
    from = tpu_arg_i64(c, 1, 0);
    if (!(c->nargs <= 2 || c->args[2].kind == TPU_ARG_NONE)) {
      const int64_t to = tpu_arg_i64(c, 2, 0);
      if (from >= to) return false;
      to_inc = to - 1;
    }
  } else if (!strcmp(ovl, "to") || !strcmp(ovl, "to_out")) {
    const int64_t to = tpu_arg_i64(c, 1, 1);
    if (to <= 0) return false;
    to_inc = to - 1;
  } else if (strcmp(ovl, "") && strcmp(ovl, "out")) {
    return false;
  }
  double lo, hi;
  tpu_random_dtype_bounds(odt, &lo, &hi);
  if ((double)from < lo || (double)from > hi || (double)to_inc < lo || (double)to_inc > hi || from > to_inc)
    return false;
  const uint64_t range = (uint64_t)to_inc - (uint64_t)from + 1; /* 0 stands for 2^64 */
  ref_t w[4];
  philox(n, o->ndim, o->sizes, w);
  ref_t bits = bits64(e, w[0], w[1]);
  const int nd = o->ndim;
  if (range) bits = binop(e, "stablehlo.remainder", bits, bcast(e, u64_const(e, range), nd, o->sizes));
  ref_t v = binop(e, "stablehlo.add", bits, bcast(e, u64_const(e, (uint64_t)from), nd, o->sizes));
  v = emit(e, "stablehlo.bitcast_convert", 1, &v, mkref(TPU_I64, nd, o->sizes), NULL);
  outs[0] = convert(e, v, odt);
  return true;
}

/* native_dropout(input, p, train?) -> (output, mask): train None means
 * training; each element is kept with probability 1 - p and scaled by
 * 1 / (1 - p), both computed as the host does; otherwise output copies input
 * and mask is all true. */
static bool lower_native_dropout(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  (void)base;
  if (c->nouts < 2 || !is_tensor(n, 0) || !tpu_dtype_is_supported(c->outs[1].dtype)) return false;
  const tpu_tensor_t* mt = &c->outs[1];
  const bool train = c->nargs <= 2 || c->args[2].kind == TPU_ARG_NONE || tpu_arg_bool(c, 2, true);
  if (!train) {
    outs[0] = convert(e, arg(n, 0), odt);
    outs[1] = cst_like(e, mt->dtype, 1, mt->ndim, mt->sizes);
    return true;
  }
  const double p = tpu_arg_f64(c, 1, 0.5);
  if (!(p >= 0 && p <= 1)) return false;
  const double keep_p = 1.0 - p, scale = keep_p == 0 ? 0.0 : 1.0 / keep_p;
  ref_t w[4];
  philox(n, o->ndim, o->sizes, w);
  ref_t keep = compare(e, "LT", u01(e, w[0], w[1]), cst_like(e, TPU_F64, keep_p, o->ndim, o->sizes));
  ref_t x = arg_out(n, 0, TPU_F64);
  ref_t y = scalar_op(e, "stablehlo.multiply", mul(e, x, convert(e, keep, TPU_F64)), scale);
  outs[0] = convert(e, y, odt);
  outs[1] = reshape(e, convert(e, keep, mt->dtype), mt->ndim, mt->sizes);
  return true;
}

/* ---- randperm ---- */
static void print_block_args(FILE* f, int n, const ref_t* a) {
  fputs("    ^bb0(", f);
  for (int i = 0; i < n; i++) {
    if (i) fputs(", ", f);
    pname(f, &a[i]);
    fputs(": ", f);
    ptype(f, &a[i]);
  }
  fputs("):\n", f);
}

static void print_return(FILE* f, int n, const ref_t* a) {
  fputs("      \"stablehlo.return\"(", f);
  plist(f, n, a, false);
  fputs(") : (", f);
  plist(f, n, a, true);
  fputs(") -> ()\n", f);
}

/* element i of 1-d x as a 0-d value (i a 0-d i64) */
static ref_t elem_at(em_t* e, ref_t x, ref_t i) {
  ref_t in[2] = {x, i};
  int64_t one = 1;
  ref_t r = emit(e, "stablehlo.dynamic_slice", 2, in, mkref(x.dt, 1, &one), "slice_sizes = array<i64: 1>");
  return reshape(e, r, 0, NULL);
}

/* x with element i replaced by 0-d v */
static ref_t put_at(em_t* e, ref_t x, ref_t v, ref_t i) {
  int64_t one = 1;
  ref_t in[3] = {x, reshape(e, v, 1, &one), i};
  return emit(e, "stablehlo.dynamic_update_slice", 3, in, x, NULL);
}

/* randperm.out(n, out) / randperm.generator_out(n, generator, out): the
 * host's Fisher-Yates, i from n-1 down to 1 swapping position i with
 * k_i = bits(block i) % (i + 1), as a stablehlo.while over (i, perm, k). */
static bool lower_randperm(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  (void)base;
  const int64_t len = tpu_arg_i64(c, 0, 0);
  if (len < 0 || o->ndim != 1 || o->sizes[0] != len || !tpu_dtype_is_supported(odt)) return false;
  ref_t perm = emit(e, "stablehlo.iota", 0, NULL, mkref(TPU_I64, 1, &len), "iota_dimension = 0 : i64");
  if (len <= 1) {
    outs[0] = convert(e, perm, odt);
    return true;
  }
  ref_t w[4];
  philox(n, 1, &len, w);
  ref_t span = emit(e, "stablehlo.iota", 0, NULL, mkref(DT_U64, 1, &len), "iota_dimension = 0 : i64");
  span = scalar_op(e, "stablehlo.add", span, 1); /* i + 1 */
  ref_t k = convert(e, binop(e, "stablehlo.remainder", bits64(e, w[0], w[1]), span), TPU_I64);
  ref_t init[3] = {cst(e, TPU_I64, (double)(len - 1)), perm, k};
  FILE* f = e->f;
  ref_t ca[3], ba[3];
  for (int r = 0; r < 3; r++) {
    ca[r] = block_arg(e, TPU_I64);
    ba[r] = block_arg(e, TPU_I64);
    ca[r].nd = ba[r].nd = init[r].nd;
    memcpy(ca[r].sz, init[r].sz, sizeof ca[r].sz);
    memcpy(ba[r].sz, init[r].sz, sizeof ba[r].sz);
  }
  const int id = e->next++;
  fprintf(f, "    %%%d:3 = \"stablehlo.while\"(", id);
  plist(f, 3, init, false);
  fputs(") ({\n", f);
  print_block_args(f, 3, ca);
  ref_t more = compare(e, "GT", ca[0], cst(e, TPU_I64, 0));
  print_return(f, 1, &more);
  fputs("    }, {\n", f);
  print_block_args(f, 3, ba);
  ref_t i = ba[0], ki = elem_at(e, ba[2], ba[0]);
  ref_t pi = elem_at(e, ba[1], i), pk = elem_at(e, ba[1], ki);
  ref_t swapped = put_at(e, put_at(e, ba[1], pk, i), pi, ki);
  ref_t next[3] = {scalar_op(e, "stablehlo.subtract", i, 1), swapped, ba[2]};
  print_return(f, 3, next);
  fputs("    }) : (", f);
  plist(f, 3, init, true);
  fputs(") -> (", f);
  plist(f, 3, init, true);
  fputs(")\n", f);
  ref_t res = init[1];
  res.id = id;
  res.sub = 1;
  outs[0] = convert(e, res, odt);
  return true;
}

/* native_dropout_backward(grad_output, mask, scale) = grad * mask * scale in
 * the output's compute type (not random: the mask holds the draws) */
static bool lower_native_dropout_backward(node_t* n, const char* base, ref_t* outs) {
  LOWER_LOCALS;
  (void)base;
  if (!tpu_dtype_is_float(odt) || !is_tensor(n, 0) || !is_tensor(n, 1)) return false;
  const tpu_dtype_t ct = odt == TPU_F64 ? TPU_F64 : TPU_F32;
  ref_t y = mul(e, mul(e, arg_out(n, 0, ct), arg_out(n, 1, ct)), arg_out(n, 2, ct));
  outs[0] = convert(e, y, odt);
  return true;
}

/* sorted by name (strcmp); tests/test_lower.c checks it */
static const tpu_lower_entry_t k_entries[] = {
    {"bernoulli", lower_bernoulli},
    {"cauchy", lower_dist},
    {"exponential", lower_dist},
    {"geometric", lower_dist},
    {"log_normal", lower_dist},
    {"native_dropout", lower_native_dropout},
    {"native_dropout_backward", lower_native_dropout_backward},
    {"normal", lower_dist},
    {"random", lower_random},
    {"randperm", lower_randperm},
    {"uniform", lower_dist},
};

const tpu_lower_table_t tpu_lower_random = {k_entries, sizeof k_entries / sizeof k_entries[0]};

bool tpu_lower_is_random(const char* aten_name) {
  if (!aten_name) return false;
  char base[128];
  base_name(aten_name, base, sizeof base);
  for (size_t i = 0; i < sizeof k_entries / sizeof k_entries[0]; i++)
    if (!strcmp(base, k_entries[i].name)) return k_entries[i].fn != lower_native_dropout_backward;
  return false;
}
