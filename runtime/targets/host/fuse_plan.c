/* The fusion planner of the host target: decides which of a graph's calls
 * run inside generated kernels. It knows the fusible ops (their expressions
 * over a, b, c and s0, s1), forms row groups around row reductions, matmul
 * epilogue groups after mm/addmm, foreach blocks and plain elementwise
 * chains, keeps every group whose executable is available now, and answers
 * the plan's queries. Building a group's buffers and source is
 * fuse_codegen.c's part, finding its executable fuse_compile.c's. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/env.h"
#include "targets/host/fuse_internal.h"

/* ---- fusible ops ----
 * Every row of the element-wise inventory (tpu/ew_ops.def) as a fusible op:
 * its float expression stringized from the macro argument the library kernel
 * is compiled from, its operands (a, b, c: schema arguments 0, 1, 2) and its
 * scalars. */
enum {
  FEW_NONE = 0,
#define TPU_EW(NAME, KIND, K, SCALARS, HLO, HLO_OP, FEXPR, IEXPR) FEW_##NAME,
#include "tpu/ew_ops.def"
#undef TPU_EW
  FEW_COUNT
};
#define FOP_SCALARS_(arg0, dflt0, arg1, dflt1) {arg0, arg1}, {dflt0, dflt1}
#define FOP_OPERANDS_(K) {(K) > 0 ? 0 : -1, (K) > 1 ? 1 : -1, (K) > 2 ? 2 : -1}
static const fop_t k_ew[FEW_COUNT] = {
#define TPU_EW(NAME, KIND, K, SCALARS, HLO, HLO_OP, FEXPR, IEXPR) \
  [FEW_##NAME] = {#NAME, #FEXPR, FOP_OPERANDS_(K), FOP_SCALARS_ SCALARS},
#include "tpu/ew_ops.def"
#undef TPU_EW
};

/* The overloads that fuse, by op family: the inventory row their library
 * kernel runs and the overloads themselves (resolved to the op table's ops
 * once). A Scalar overload's number operand (add.Scalar's other) is a scalar
 * of the generated kernel. ROWS_ONLY: only row groups take it (a bool
 * operand, bool_operand). gelu and gelu_backward pick their row by the
 * approximation (fuse_find_op). */
enum { MAX_OVERLOADS = 4 };
typedef struct {
  int row; /* FEW_* */
  int8_t bool_operand; /* row groups: the bool operand (a, b, c), -1 none */
  bool rows_only;
  const char* overloads[MAX_OVERLOADS];
} fuse_family_t;
/* family FAM runs inventory row ROW for the overloads listed */
#define FUSE_AS(FAM, ROW, ...) [TPU_OPID_##FAM] = {FEW_##ROW, -1, false, {__VA_ARGS__}}
/* FAM's functional overload, of the row named after it */
#define FUSE(FAM) FUSE_AS(FAM, FAM, #FAM)
static const fuse_family_t k_families[TPU_OPID_COUNT] = {
    FUSE_AS(add, add, "add.Tensor", "add_.Tensor", "add.Scalar", "add_.Scalar"),
    FUSE_AS(sub, sub, "sub.Tensor", "sub_.Tensor"),
    FUSE_AS(mul, mul, "mul.Tensor", "mul_.Tensor", "mul.Scalar", "mul_.Scalar"),
    FUSE_AS(div, div, "div.Tensor", "div_.Tensor", "div.Scalar", "div_.Scalar"),
    FUSE(neg), FUSE(exp), FUSE(log), FUSE(tanh), FUSE(sigmoid), FUSE(sqrt), FUSE(rsqrt),
    FUSE(reciprocal), FUSE(abs), FUSE(erf), FUSE(silu), FUSE(square),
    FUSE_AS(relu, relu, "relu", "relu_"),
    FUSE(threshold_backward), FUSE(tanh_backward), FUSE(sigmoid_backward), FUSE(silu_backward),
    FUSE_AS(addcmul, addcmul, "addcmul", "addcmul_"),
    FUSE_AS(addcdiv, addcdiv, "addcdiv", "addcdiv_"),
    FUSE_AS(lerp, lerp_s, "lerp_.Scalar"),
    FUSE(gelu), FUSE(gelu_backward), /* the row by approximation: family_op */
    /* row groups only: a bool operand (masked_fill's mask b, where's condition a) */
    [TPU_OPID_masked_fill] = {FEW_masked_fill, 1, true, {"masked_fill.Scalar", "masked_fill_.Scalar"}},
    [TPU_OPID_where] = {FEW_where, 0, true, {"where.self"}},
};

/* k_families' overloads as ops of the table, and the planner's other ops */
static const tpu_op_t* g_family_ops[TPU_OPID_COUNT][MAX_OVERLOADS];
static const tpu_op_t *g_softmax, *g_log_softmax, *g_layer_norm, *g_mm, *g_addmm;
static const tpu_op_t *g_softmax_bwd, *g_log_softmax_bwd, *g_layer_norm_bwd;
static pthread_once_t g_ops_once = PTHREAD_ONCE_INIT;

static void resolve_ops(void) {
  for (int id = 1; id < TPU_OPID_COUNT; id++)
    for (int k = 0; k < MAX_OVERLOADS && k_families[id].overloads[k]; k++)
      g_family_ops[id][k] = tpu_op_lookup(k_families[id].overloads[k]);
  g_softmax = tpu_op_lookup("_softmax");
  g_log_softmax = tpu_op_lookup("_log_softmax");
  g_layer_norm = tpu_op_lookup("native_layer_norm");
  g_softmax_bwd = tpu_op_lookup("_softmax_backward_data");
  g_log_softmax_bwd = tpu_op_lookup("_log_softmax_backward_data");
  g_layer_norm_bwd = tpu_op_lookup("native_layer_norm_backward");
  g_mm = tpu_op_lookup("mm");
  g_addmm = tpu_op_lookup("addmm");
}

/* c's family entry when its overload is one that fuses, else NULL */
static const fuse_family_t* family_of(const tpu_call_t* c) {
  const tpu_op_id_t id = c->op->id;
  if (id <= TPU_OPID_NONE || id >= TPU_OPID_COUNT || !k_families[id].row) return NULL;
  pthread_once(&g_ops_once, resolve_ops);
  for (int k = 0; k < MAX_OVERLOADS; k++)
    if (g_family_ops[id][k] == c->op) return &k_families[id];
  return NULL;
}

/* the fusible op of a call of a family that fuses: gelu's approximation
 * picks the row */
static const fop_t* family_op(const tpu_call_t* c, const fuse_family_t* fam) {
  if (c->op->id == TPU_OPID_gelu)
    return &k_ew[!strcmp(tpu_arg_str(c, 1, "none"), "tanh") ? FEW_gelu_tanh : FEW_gelu];
  if (c->op->id == TPU_OPID_gelu_backward)
    return &k_ew[!strcmp(tpu_arg_str(c, 2, "none"), "tanh") ? FEW_gelu_tanh_backward
                                                             : FEW_gelu_backward];
  return &k_ew[fam->row];
}

const fop_t* fuse_find_op(const tpu_call_t* c) {
  const fuse_family_t* fam = family_of(c);
  return fam && !fam->rows_only ? family_op(c, fam) : NULL;
}

bool fuse_operand_is_number(const tpu_call_t* c, int arg) {
  if (arg < 0 || arg >= c->nargs) return false;
  const tpu_arg_kind_t k = c->args[arg].kind;
  return k == TPU_ARG_INT || k == TPU_ARG_DOUBLE || k == TPU_ARG_BOOL;
}

static fuse_config_t g_cfg = {.enabled = true, .async = true, .rows = true, .epilogues = true};
static pthread_once_t g_cfg_once = PTHREAD_ONCE_INIT;

static void read_config(void) {
  g_cfg.enabled = tpu_env_int("TORCH_TPU_FUSION", 1) != 0;
  g_cfg.async = tpu_env_int("TORCH_TPU_ASYNC_COMPILE", 1) != 0;
  /* the reduction and matmul-epilogue groups can be turned off alone
   * (comparisons, bisecting) */
  g_cfg.rows = tpu_env_int("TORCH_TPU_FUSE_REDUCTIONS", 1) != 0;
  g_cfg.epilogues = tpu_env_int("TORCH_TPU_FUSE_EPILOGUES", 1) != 0;
  g_cfg.epi_rows = tpu_env_int("TORCH_TPU_EPILOGUE_ROWS", 0);
}

const fuse_config_t* fuse_config(void) {
  pthread_once(&g_cfg_once, read_config);
  return &g_cfg;
}

/* Whether node c can join a group over n elements (n < 0: any). */
static bool fusible(const tpu_call_t* c, int64_t* n) {
  if (c->nouts != 1 || c->outs[0].dtype != TPU_F32 || !tpu_tensor_is_contiguous(&c->outs[0]))
    return false;
  const fop_t* f = fuse_find_op(c);
  if (!f) return false;
  const tpu_tensor_t* o = &c->outs[0];
  int64_t on = tpu_tensor_numel(o);
  if (on < 1 || (*n >= 0 && on != *n)) return false;
  for (int k = 0; k < 3; k++) {
    if (f->t[k] < 0 || fuse_operand_is_number(c, f->t[k])) continue;
    const tpu_tensor_t* t = tpu_arg_tensor(c, f->t[k]);
    if (t && (t->flags & TPU_TENSOR_CPU_SCALAR) && t->dtype != TPU_BOOL) continue;
    if (!t || t->dtype != TPU_F32) return false;
    if (fuse_is_scalar_tensor(t)) continue;
    if (t->ndim != o->ndim || memcmp(t->sizes, o->sizes, sizeof(int64_t) * (size_t)o->ndim) ||
        !tpu_tensor_is_contiguous(t))
      return false;
  }
  for (int k = 0; k < 2; k++) /* scalar arguments must be numbers */
    if (f->s[k] >= 0 && f->s[k] < c->nargs) {
      tpu_arg_kind_t kd = c->args[f->s[k]].kind;
      if (kd != TPU_ARG_INT && kd != TPU_ARG_DOUBLE && kd != TPU_ARG_BOOL && kd != TPU_ARG_NONE)
        return false;
    }
  *n = on;
  return true;
}

/* ---- row groups: a row reduction with its elementwise neighbours ----
 * softmax / log_softmax over the last dim of contiguous float32 rows, and
 * native_layer_norm over the last dim, join the elementwise nodes before
 * them (prologue) and after them (epilogue) that run over the same rows.
 * The generated kernel takes one row at a time through every node, the
 * reduction included, so the row's intermediates stay in L1. Operands of
 * the elementwise nodes may be full (the row itself), a single element,
 * or broadcast over leading dims (an attention mask [T, T] against
 * scores [B, H, T, T], a bias [L]): row r reads row r % per of such a
 * buffer. */
/* elementwise ops of row groups: the flat ones plus masks */
const fop_t* fuse_find_row_op(const tpu_call_t* c, int* bool_operand) {
  const fuse_family_t* fam = family_of(c);
  *bool_operand = fam ? fam->bool_operand : -1;
  return fam ? family_op(c, fam) : NULL;
}

static bool flat_f32(const tpu_tensor_t* t) {
  return t && t->dtype == TPU_F32 && t->ndim >= 1 && tpu_tensor_is_contiguous(t);
}

/* t is float32, contiguous, with n elements */
static bool f32_numel(const tpu_tensor_t* t, int64_t n) {
  return t && t->dtype == TPU_F32 && tpu_tensor_is_contiguous(t) && tpu_tensor_numel(t) == n;
}

bool fuse_output_wanted(const tpu_call_t* c, int mask_arg, int k) {
  if (k >= c->nouts || c->outs[k].dtype == TPU_DTYPE_NONE) return false;
  const tpu_arg_t* m = mask_arg < c->nargs ? &c->args[mask_arg] : NULL;
  return !(m && m->kind == TPU_ARG_BOOLLIST && k < m->n && !m->v.blist[k]);
}

/* The reduction kind of c with its rows and row length, RED_NONE if it is
 * not one the row groups take. */
int fuse_row_reduction(const tpu_call_t* c, int64_t* R, int64_t* L) {
  const tpu_op_id_t id = c->op->id;
  if (id != TPU_OPID__softmax && id != TPU_OPID__log_softmax && id != TPU_OPID_native_layer_norm &&
      id != TPU_OPID__softmax_backward_data && id != TPU_OPID__log_softmax_backward_data &&
      id != TPU_OPID_native_layer_norm_backward)
    return RED_NONE;
  pthread_once(&g_ops_once, resolve_ops);
  const bool bwd = c->op == g_softmax_bwd || c->op == g_log_softmax_bwd || c->op == g_layer_norm_bwd;
  const tpu_tensor_t* x = tpu_arg_tensor(c, bwd ? 1 : 0); /* the forward's input or output */
  if (!flat_f32(x) || c->nouts < 1 || !flat_f32(&c->outs[0])) return RED_NONE;
  const int64_t len = x->sizes[x->ndim - 1], numel = tpu_tensor_numel(x);
  if (len < 1 || tpu_tensor_numel(&c->outs[0]) != numel) return RED_NONE;
  int kind = RED_NONE;
  if (c->op == g_softmax || c->op == g_log_softmax) {
    int64_t d = tpu_arg_i64(c, 1, -1);
    if ((d != -1 && d != x->ndim - 1) || tpu_arg_bool(c, 2, false)) return RED_NONE;
    kind = c->op == g_log_softmax ? RED_LOG_SOFTMAX : RED_SOFTMAX;
  } else if (c->op == g_softmax_bwd || c->op == g_log_softmax_bwd) {
    int64_t d = tpu_arg_i64(c, 2, -1);
    if ((d != -1 && d != x->ndim - 1) || !f32_numel(tpu_arg_tensor(c, 0), numel)) return RED_NONE;
    kind = c->op == g_log_softmax_bwd ? RED_LOG_SOFTMAX_BWD : RED_SOFTMAX_BWD;
  } else if (c->op == g_layer_norm || c->op == g_layer_norm_bwd) {
    if (c->nargs < 5 || c->args[1 + bwd].kind != TPU_ARG_INTLIST || c->args[1 + bwd].n != 1 ||
        c->args[1 + bwd].v.ilist[0] != len || c->nouts != 3)
      return RED_NONE;
    const int w_arg = bwd ? 5 : 2;
    for (int a = w_arg; a < w_arg + 2 - bwd; a++) /* weight and bias (forward) */
      if (!tpu_arg_is_none(c, a) && !f32_numel(tpu_arg_tensor(c, a), len)) return RED_NONE;
    if (bwd) { /* grad_out; mean and rstd in; grad_input, and the wanted sums, out */
      if (!f32_numel(tpu_arg_tensor(c, 0), numel) || !f32_numel(tpu_arg_tensor(c, 3), numel / len) ||
          !f32_numel(tpu_arg_tensor(c, 4), numel / len) || !fuse_output_wanted(c, 7, 0))
        return RED_NONE;
      for (int o = 1; o < 3; o++)
        if (fuse_output_wanted(c, 7, o) && !f32_numel(&c->outs[o], len)) return RED_NONE;
      if (fuse_output_wanted(c, 7, 1) && tpu_arg_is_none(c, 5)) return RED_NONE;
      kind = RED_LAYER_NORM_BWD;
    } else {
      for (int o = 1; o < 3; o++) /* mean and rstd: one float per row */
        if (!f32_numel(&c->outs[o], numel / len)) return RED_NONE;
      kind = RED_LAYER_NORM;
    }
  }
  if (kind != RED_NONE) {
    *L = len;
    *R = numel / len;
  }
  return kind;
}

/* Period in rows of operand t of a node whose output is o (R rows of L):
 * R for the same shape, P for t broadcast over o's leading dims only (its
 * sizes, left-padded with ones, are ones then o's trailing sizes); false
 * for anything else. */
bool fuse_operand_period(const tpu_tensor_t* t, const tpu_tensor_t* o, int64_t R, int64_t L,
                         int64_t* per) {
  if (!tpu_tensor_is_contiguous(t) || t->ndim > o->ndim || t->ndim < 1) return false;
  if (t->ndim == o->ndim &&
      !memcmp(t->sizes, o->sizes, sizeof(int64_t) * (size_t)o->ndim)) {
    *per = R;
    return true;
  }
  if (o->sizes[o->ndim - 1] != L || t->sizes[t->ndim - 1] != L) return false;
  const int off = o->ndim - t->ndim;
  bool ones = true; /* still in t's leading ones */
  for (int d = 0; d < t->ndim; d++) {
    if (ones && t->sizes[d] == 1 && o->sizes[off + d] != 1) continue;
    ones = false;
    if (t->sizes[d] != o->sizes[off + d]) return false;
  }
  *per = tpu_tensor_numel(t) / L;
  return *per >= 1 && R % *per == 0;
}

/* Whether c is an elementwise node over R rows of L that a row group can
 * take. */
static bool row_elementwise(const tpu_call_t* c, int64_t R, int64_t L) {
  int bop;
  const fop_t* f = fuse_find_row_op(c, &bop);
  if (!f || c->nouts != 1) return false;
  const tpu_tensor_t* o = &c->outs[0];
  if (!flat_f32(o) || tpu_tensor_numel(o) != R * L) return false;
  for (int k = 0; k < 3; k++) {
    if (f->t[k] < 0 || (k != bop && fuse_operand_is_number(c, f->t[k]))) continue;
    const tpu_tensor_t* t = tpu_arg_tensor(c, f->t[k]);
    if (!t) return false;
    if (k == bop) {
      if (t->dtype != TPU_BOOL || (t->flags & TPU_TENSOR_CPU_SCALAR)) return false;
    } else {
      if ((t->flags & TPU_TENSOR_CPU_SCALAR) && t->dtype != TPU_BOOL) continue;
      if (t->dtype != TPU_F32) return false;
    }
    if (fuse_is_scalar_tensor(t) && k != bop) continue;
    int64_t per;
    if (!fuse_operand_period(t, o, R, L, &per)) return false;
  }
  for (int k = 0; k < 2; k++)
    if (f->s[k] >= 0 && f->s[k] < c->nargs) {
      tpu_arg_kind_t kd = c->args[f->s[k]].kind;
      if (kd != TPU_ARG_INT && kd != TPU_ARG_DOUBLE && kd != TPU_ARG_BOOL && kd != TPU_ARG_NONE)
        return false;
    }
  return true;
}

static void group_free(group_t* g) {
  free(g->nodes);
  free(g->bufs);
  free(g->scalars);
  free(g->src);
}

/* Makes the group over `nodes` (copied) and adds it to the plan when an
 * executable is available now. */
static bool add_group_kind(tpu_graph_t* gr, tpu_fusion_plan_t** pp, const int* nodes,
                           int nnodes, int trigger, int64_t n, int kind, int64_t rows,
                           int64_t len) {
  group_t g = {0};
  for (int pass = 0; pass < 2; pass++) {
    memset(&g, 0, sizeof g);
    g.nodes = malloc(sizeof(int) * (size_t)nnodes);
    if (!g.nodes) return false;
    memcpy(g.nodes, nodes, sizeof(int) * (size_t)nnodes);
    g.nnodes = nnodes;
    g.trigger = trigger;
    g.n = n;
    g.sig = 0xcbf29ce484222325ull;
    g.kind = kind;
    g.rows = rows;
    g.len = len;
    if (!fuse_build_group(gr, &g, pass == 1)) break;
    if (pass == 0) {
      if ((g.fn = fuse_memo_get(g.sig))) break;
      group_free(&g);
      continue;
    }
    g.fn = fuse_executable(g.sig, g.src);
  }
  tpu_fusion_plan_t* p = *pp;
  if (g.fn && !p) p = *pp = calloc(1, sizeof *p);
  group_t* gs = g.fn && p ? realloc(p->groups, sizeof(group_t) * (size_t)(p->ngroups + 1)) : NULL;
  if (!gs) {
    group_free(&g);
    return false;
  }
  free(g.src);
  g.src = NULL;
  p->groups = gs;
  p->groups[p->ngroups++] = g;
  p->fused_nodes += nnodes;
  if (kind == G_ROWS) p->reduction_groups++;
  if (kind == G_MM) p->epilogue_groups++;
  return true;
}

static void add_group(tpu_graph_t* gr, tpu_fusion_plan_t** pp, const int* nodes, int nnodes,
                      int trigger, int64_t n) {
  add_group_kind(gr, pp, nodes, nnodes, trigger, n, G_FLAT, 0, 0);
}

typedef struct {
  uintptr_t lo, hi;
  int col;
} span_t;

static int span_cmp(const void* a, const void* b) {
  const span_t *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* A foreach block at node i: S >= 2 segments of N >= 2 nodes, each segment
 * one op applied to a list (what _foreach_* ops become: one call per list
 * entry), entry k of every segment over the same number of elements, and
 * the columns (entry k of each segment) touching disjoint memory. Each
 * column is an independent chain (one parameter's optimizer update), so it
 * fuses into one kernel run at the block's start. Returns S * N, 0 if no
 * block starts at i. */
static int foreach_block(tpu_graph_t* gr, int i, int* out_n) {
  const char* op = gr->nodes[i]->op->name;
  int N = 1;
  while (i + N < gr->n && gr->nodes[i + N]->op->name == op) N++;
  if (N < 2) return 0;
  int64_t* numel = malloc(sizeof(int64_t) * (size_t)N);
  if (!numel) return 0;
  int S = 0;
  for (;; S++) {
    int base = i + S * N;
    if (base + N > gr->n) break;
    const char* sop = gr->nodes[base]->op->name;
    bool ok = true;
    for (int k = 0; k < N && ok; k++) {
      tpu_call_t* c = gr->nodes[base + k];
      int64_t n = S ? numel[k] : -1;
      ok = c->op->name == sop && fusible(c, &n);
      if (ok && !S) numel[k] = n;
    }
    if (!ok) break;
    if (base + N < gr->n && gr->nodes[base + N]->op->name == sop) { /* segment longer than N */
      S++;
      break;
    }
  }
  free(numel);
  if (S < 2) return 0;
  /* columns must not share memory: sort every touched range, then
   * overlapping neighbours must belong to one column */
  int cap = S * N * 4, m = 0;
  span_t* sp = malloc(sizeof(span_t) * (size_t)cap);
  if (!sp) return 0;
  for (int s2 = 0; s2 < S; s2++)
    for (int k = 0; k < N; k++) {
      tpu_call_t* c = gr->nodes[i + s2 * N + k];
      for (int x = -1; x < c->nargs && m < cap; x++) {
        const tpu_tensor_t* t = x < 0 ? &c->outs[0] : tpu_arg_tensor(c, x);
        if (!t || (t->flags & TPU_TENSOR_CPU_SCALAR)) continue;
        sp[m].lo = (uintptr_t)t->data;
        sp[m].hi = sp[m].lo + (uintptr_t)(tpu_tensor_numel(t) * (int64_t)tpu_dtype_size(t->dtype));
        sp[m].col = k;
        m++;
      }
    }
  qsort(sp, (size_t)m, sizeof(span_t), span_cmp);
  uintptr_t reach = 0;
  int reach_col = -1;
  bool clash = false;
  for (int q = 0; q < m && !clash; q++) {
    if (sp[q].lo < reach && sp[q].col != reach_col) clash = true;
    if (sp[q].hi > reach) {
      reach = sp[q].hi;
      reach_col = sp[q].col;
    }
  }
  free(sp);
  if (clash) return 0;
  *out_n = N;
  return S * N;
}

/* ---- planning row groups ---- */
#define ROW_WINDOW 24 /* nodes looked at before and after a reduction */

typedef struct {
  const tpu_tensor_t* t[64];
  bool w[64];
  int n;
  bool overflow;
} tlist_t;

static void collect_tensor(void* ctx, tpu_tensor_t* t, bool write) {
  tlist_t* l = ctx;
  if (l->n == 64) {
    l->overflow = true;
    return;
  }
  l->t[l->n] = t;
  l->w[l->n++] = write;
}

/* [lo, hi) bytes that t can touch */
static void tensor_span(const tpu_tensor_t* t, uintptr_t* lo, uintptr_t* hi) {
  int64_t a = 0, b = 0;
  for (int d = 0; d < t->ndim; d++) {
    if (t->sizes[d] == 0) {
      *lo = *hi = (uintptr_t)t->data;
      return;
    }
    int64_t ext = (t->sizes[d] - 1) * t->strides[d];
    if (ext < 0) a += ext;
    else b += ext;
  }
  const int64_t es = (int64_t)tpu_dtype_size(t->dtype);
  *lo = (uintptr_t)t->data + (uintptr_t)(a * es);
  *hi = (uintptr_t)t->data + (uintptr_t)((b + 1) * es);
}

/* Whether x, moved before y (which then runs later than in the program),
 * could see or change y's effects: one writes memory the other uses. */
static bool conflicts(tpu_call_t* x, tpu_call_t* y) {
  tlist_t lx = {0}, ly = {0};
  tpu_call_visit_tensors(x, collect_tensor, &lx);
  tpu_call_visit_tensors(y, collect_tensor, &ly);
  if (lx.overflow || ly.overflow) return true;
  for (int a = 0; a < lx.n; a++) {
    if (lx.t[a]->flags & TPU_TENSOR_CPU_SCALAR) continue;
    uintptr_t alo, ahi;
    tensor_span(lx.t[a], &alo, &ahi);
    for (int b = 0; b < ly.n; b++) {
      if (!(lx.w[a] || ly.w[b]) || (ly.t[b]->flags & TPU_TENSOR_CPU_SCALAR)) continue;
      uintptr_t blo, bhi;
      tensor_span(ly.t[b], &blo, &bhi);
      if (alo < bhi && blo < ahi) return true;
    }
  }
  return false;
}

/* whether node p conflicts with one of the nodes idx[0 .. cnt) */
static bool conflicts_any(tpu_graph_t* gr, int p, const int* idx, int cnt) {
  for (int k = 0; k < cnt; k++)
    if (conflicts(gr->nodes[p], gr->nodes[idx[k]])) return true;
  return false;
}

/* Forms row groups: each row reduction with the elementwise nodes over its
 * rows among the ROW_WINDOW nodes before it (others in between must not
 * touch what those write, or write what they read: the group runs at its
 * last node) and after it, where the nodes it passes over do not touch what
 * the members before them write or write what they read (a mask's fill
 * between softmax's backward and its where). */
static void plan_rows(tpu_graph_t* gr, tpu_fusion_plan_t** pp, bool* taken, int* idx) {
  int bound = 0; /* nodes before it belong to earlier row groups' windows */
  bool mem[ROW_WINDOW];
  for (int j = 0; j < gr->n; j++) {
    int64_t R, L;
    if (taken[j] || fuse_row_reduction(gr->nodes[j], &R, &L) == RED_NONE) continue;
    int lo = j - ROW_WINDOW < bound ? bound : j - ROW_WINDOW;
    for (int p = lo; p < j; p++) mem[p - lo] = !taken[p] && row_elementwise(gr->nodes[p], R, L);
    for (int p = lo; p < j; p++) {
      if (mem[p - lo]) continue;
      for (int q = lo; q < p; q++)
        if (mem[q - lo] && conflicts(gr->nodes[p], gr->nodes[q])) {
          for (int q2 = lo; q2 < p; q2++) mem[q2 - lo] = false;
          break;
        }
    }
    int cnt = 0, trig = j; /* the group runs at its last member */
    for (int p = lo; p < j; p++)
      if (mem[p - lo]) idx[cnt++] = p;
    idx[cnt++] = j;
    for (int e = j + 1; e < gr->n && e - j <= ROW_WINDOW && !taken[e]; e++) {
      int64_t r2, l2;
      if (row_elementwise(gr->nodes[e], R, L)) {
        idx[cnt++] = trig = e;
        continue;
      }
      /* another reduction starts its own group; a node that touches the
       * members' data ends the epilogue */
      if (fuse_row_reduction(gr->nodes[e], &r2, &l2) != RED_NONE || conflicts_any(gr, e, idx, cnt))
        break;
    }
    if (cnt < 2) continue;
    if (!add_group_kind(gr, pp, idx, cnt, trig, R * L, G_ROWS, R, L)) continue;
    for (int k = 0; k < cnt; k++) taken[idx[k]] = true;
    bound = trig + 1;
    j = trig;
  }
}

/* ---- matmul epilogues ----
 * mm / addmm with a float32 2-D contiguous product, followed by a chain of
 * elementwise nodes over its elements (bias add, activation, residual): the
 * library GEMM runs on blocks of rows and the chain's generated kernel runs
 * on each block right after it, while the block is in cache. A product
 * that nothing else needs goes to a scratch block and never gets memory. */
static bool mm_node(const tpu_call_t* c, int64_t* M, int64_t* N) {
  if (c->op->id != TPU_OPID_mm && c->op->id != TPU_OPID_addmm) return false;
  pthread_once(&g_ops_once, resolve_ops);
  int a1;
  if (c->op == g_mm) a1 = 0;
  else if (c->op == g_addmm) a1 = 1;
  else return false;
  const tpu_tensor_t* o = &c->outs[0];
  const tpu_tensor_t* x = tpu_arg_tensor(c, a1);
  if (c->nouts != 1 || o->dtype != TPU_F32 || o->ndim != 2 || !tpu_tensor_is_contiguous(o) ||
      !x || x->ndim != 2 || x->dtype != TPU_F32 || o->sizes[0] < 1 || o->sizes[1] < 1)
    return false;
  if (a1 == 1) {
    const tpu_tensor_t* b = tpu_arg_tensor(c, 0);
    if (!b || b->ndim > 2) return false;
  }
  *M = o->sizes[0];
  *N = o->sizes[1];
  return true;
}

/* whether elementwise node e writes memory the product reads */
static bool writes_mm_inputs(tpu_call_t* e, tpu_call_t* mm) {
  tlist_t le = {0}, lm = {0};
  tpu_call_visit_tensors(e, collect_tensor, &le);
  tpu_call_visit_tensors(mm, collect_tensor, &lm);
  if (le.overflow || lm.overflow) return true;
  for (int a = 0; a < le.n; a++) {
    if (!le.w[a]) continue;
    uintptr_t alo, ahi;
    tensor_span(le.t[a], &alo, &ahi);
    for (int b = 0; b < lm.n; b++) {
      if (lm.w[b] || (lm.t[b]->flags & TPU_TENSOR_CPU_SCALAR)) continue;
      uintptr_t blo, bhi;
      tensor_span(lm.t[b], &blo, &bhi);
      if (alo < bhi && blo < ahi) return true;
    }
  }
  return false;
}

/* Tries an epilogue group at node i; returns the node after it, or i. */
static int plan_mm(tpu_graph_t* gr, tpu_fusion_plan_t** pp, const bool* taken, int* idx, int i) {
  int64_t M, N;
  if (!fuse_config()->epilogues || taken[i] || !mm_node(gr->nodes[i], &M, &N)) return i;
  int64_t n = M * N;
  int j = i + 1;
  while (j < gr->n && !taken[j] && fusible(gr->nodes[j], &n) &&
         !writes_mm_inputs(gr->nodes[j], gr->nodes[i]))
    j++;
  if (j - i < 2) return i;
  for (int k = i; k < j; k++) idx[k - i] = k;
  return add_group_kind(gr, pp, idx, j - i, i, M * N, G_MM, M, N) ? j : i;
}

static int group_trigger_cmp(const void* a, const void* b) {
  const group_t *x = a, *y = b;
  return x->trigger < y->trigger ? -1 : x->trigger > y->trigger;
}

tpu_status_t tpu_fusion_plan(tpu_graph_t* gr, tpu_fusion_plan_t** out_plan) {
  const fuse_config_t* cfg = fuse_config();
  *out_plan = NULL;
  if (!cfg->enabled || gr->n < 2) return TPU_OK;
  tpu_fusion_plan_t* p = NULL;
  int* idx = malloc(sizeof(int) * (size_t)gr->n);
  bool* taken = calloc((size_t)gr->n, sizeof(bool));
  if (!idx || !taken) { /* no fusion: every node runs its kernel */
    free(idx);
    free(taken);
    return TPU_OK;
  }
  if (cfg->rows) plan_rows(gr, &p, taken, idx);
  for (int i = 0; i < gr->n;) {
    int N = 0, len = taken[i] ? 0 : foreach_block(gr, i, &N);
    for (int k = i; k < i + len; k++)
      if (taken[k]) len = 0;
    if (len) {
      const int S = len / N;
      for (int k = 0; k < N; k++) {
        for (int s2 = 0; s2 < S; s2++) idx[s2] = i + s2 * N + k;
        add_group(gr, &p, idx, S, i, tpu_tensor_numel(&gr->nodes[i + k]->outs[0]));
      }
      i += len;
      continue;
    }
    int after = plan_mm(gr, &p, taken, idx, i);
    if (after != i) {
      i = after;
      continue;
    }
    int64_t n = -1;
    if (taken[i] || !fusible(gr->nodes[i], &n)) {
      i++;
      continue;
    }
    int j = i + 1;
    while (j < gr->n && !taken[j] && fusible(gr->nodes[j], &n)) j++;
    if (j - i >= 2) {
      for (int k = i; k < j; k++) idx[k - i] = k;
      add_group(gr, &p, idx, j - i, i, n);
    }
    i = j;
  }
  free(idx);
  free(taken);
  if (p) { /* node -> fused marks and run positions for the executor */
    qsort(p->groups, (size_t)p->ngroups, sizeof(group_t), group_trigger_cmp);
    p->fused = calloc((size_t)gr->n, sizeof(bool));
    p->runpos = malloc(sizeof(int) * (size_t)gr->n);
    if (!p->fused || !p->runpos) {
      tpu_fusion_plan_free(p);
      p = NULL;
    } else {
      for (int i = 0; i < gr->n; i++) p->runpos[i] = i;
      for (int g = 0; g < p->ngroups; g++)
        for (int m = 0; m < p->groups[g].nnodes; m++) {
          p->fused[p->groups[g].nodes[m]] = true;
          p->runpos[p->groups[g].nodes[m]] = p->groups[g].trigger;
        }
    }
  }
  *out_plan = p;
  return TPU_OK;
}

bool tpu_fusion_plan_is_internal(const tpu_fusion_plan_t* p, const void* base) {
  if (!p) return false;
  for (int k = 0; k < p->ngroups; k++)
    for (int b = 0; b < p->groups[k].nbufs; b++)
      if (p->groups[k].bufs[b].internal && p->groups[k].bufs[b].addr == base) return true;
  return false;
}

void tpu_fusion_plan_info(const tpu_fusion_plan_t* p, tpu_target_graph_info_t* out) {
  out->fused_nodes = p ? p->fused_nodes : 0;
  out->reduction_groups = p ? p->reduction_groups : 0;
  out->epilogue_groups = p ? p->epilogue_groups : 0;
}

int tpu_fusion_plan_run_position(const tpu_fusion_plan_t* p, int node) {
  return p && p->runpos ? p->runpos[node] : node;
}

void tpu_fusion_plan_free(tpu_fusion_plan_t* p) {
  if (!p) return;
  for (int k = 0; k < p->ngroups; k++) group_free(&p->groups[k]);
  free(p->groups);
  free(p->fused);
  free(p->runpos);
  free(p);
}
