/* The code generator of the host target's fusion: walks a planned group's
 * nodes once, naming each buffer it touches (its register, its role, whether
 * it is internal), collecting the scalars, hashing the structure into the
 * group's signature and, when asked, writing the C source of its kernel:
 * a chunked loop for elementwise and matmul-epilogue groups, a row loop for
 * row groups. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/internal.h"
#include "targets/host/fuse_internal.h"
#include "tpu/cache.h"

/* ---- source generation ---- */
typedef struct {
  char* p;
  size_t len, cap;
  bool oom;
} sbuf_t;

static void sb_printf(sbuf_t* b, const char* fmt, ...) {
  va_list ap;
  for (;;) {
    va_start(ap, fmt);
    int k = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
      b->oom = true;
      return;
    }
    if (b->p && b->len + (size_t)k < b->cap) {
      b->len += (size_t)k;
      return;
    }
    size_t cap = (b->cap ? 2 * b->cap : 1024) + (size_t)k;
    char* q = realloc(b->p, cap);
    if (!q) {
      b->oom = true;
      return;
    }
    b->p = q;
    b->cap = cap;
  }
}

static int buf_index(group_t* g, const tpu_tensor_t* t, int kind) {
  for (int i = 0; i < g->nbufs; i++) /* one entry per address, whatever the use */
    if (g->bufs[i].addr == t->data) return i;
  gbuf_t* b = &g->bufs[g->nbufs];
  memset(b, 0, sizeof *b);
  b->addr = t->data;
  b->t = (tpu_tensor_t*)t;
  b->kind = kind;
  b->var = -1;
  b->in_slot = b->out_slot = -1;
  b->col = -1;
  return g->nbufs++;
}

/* Appends ` (expr with a, b, c, s0, s1 replaced) ` to the body. */
static void emit_expr(sbuf_t* body, const char* expr, const char* names[5]) {
  for (const char* p = expr; *p;) {
    bool ident_start = (p == expr) || !(p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z') ||
                                       (p[-1] >= 'A' && p[-1] <= 'Z') || (p[-1] >= '0' && p[-1] <= '9'));
    int which = -1, len = 0;
    if (ident_start) {
      if (p[0] == 's' && (p[1] == '0' || p[1] == '1')) which = 3 + (p[1] - '0'), len = 2;
      else if (p[0] >= 'a' && p[0] <= 'c') which = p[0] - 'a', len = 1;
      if (which >= 0) {
        char nx = p[len];
        if (nx == '_' || (nx >= 'a' && nx <= 'z') || (nx >= 'A' && nx <= 'Z') || (nx >= '0' && nx <= '9') || nx == '(')
          which = -1;
      }
    }
    if (which >= 0) {
      sb_printf(body, "%s", names[which]);
      p += len;
    } else {
      sb_printf(body, "%c", *p);
      p++;
    }
  }
}

static void sig_mix(uint64_t* h, uint64_t v) {
  *h = (*h ^ v) * 0x100000001b3ull;
  *h ^= *h >> 29;
}

/* Internal buffers of g: written by the group, never loaded, dead
 * placeholders that no node outside the group names. */
static bool only_inside(tpu_graph_t* gr, group_t* g, gbuf_t* b);
static void mark_internal(tpu_graph_t* gr, group_t* g) {
  for (int k = 0; k < g->nbufs; k++) {
    gbuf_t* b = &g->bufs[k];
    if (!b->written || b->loaded) continue;
    b->internal = only_inside(gr, g, b);
  }
}

/* b is a dead, never backed placeholder that only the group's nodes name */
static bool only_inside(tpu_graph_t* gr, group_t* g, gbuf_t* b) {
  {
    int slot = tpu_lazy_slot_of(b->addr);
    if (slot < 0 || b->addr != tpu_lazy_slot_base(slot)) return false;
    tpu_lazy_lock();
    bool dead = tpu_lazy_slot(slot)->state == TPU_LAZY_DEAD && !tpu_lazy_slot(slot)->real;
    tpu_lazy_unlock();
    if (!dead) return false;
    bool outside = false;
    for (int i = 0, m = 0; i < gr->n && !outside; i++) {
      if (m < g->nnodes && g->nodes[m] == i) {
        m++;
        continue;
      }
      const tpu_call_t* c = gr->nodes[i];
      for (int a = 0; a < c->nargs && !outside; a++) {
        const tpu_arg_t* x = &c->args[a];
        if (x->kind == TPU_ARG_TENSOR && tpu_lazy_slot_of(x->v.t->data) == slot) outside = true;
        if (x->kind == TPU_ARG_TENSORLIST)
          for (int q = 0; q < x->n; q++)
            if (tpu_lazy_slot_of(x->v.tlist[q].data) == slot) outside = true;
      }
      for (int o = 0; o < c->nouts; o++)
        if (c->outs[o].dtype != TPU_DTYPE_NONE && tpu_lazy_slot_of(c->outs[o].data) == slot)
          outside = true;
    }
    return !outside;
  }
}

/* Builds group g over its nodes: buffers, scalars, internal
 * buffers and a structural signature; with `emit`, also the source. */
static bool build_group(tpu_graph_t* gr, group_t* g, bool emit) {
  const size_t nodes = (size_t)g->nnodes;
  g->bufs = calloc(4 * nodes, sizeof(gbuf_t));
  g->scalars = calloc(6 * nodes, sizeof(float));
  if (!g->bufs || !g->scalars) return false;
  sbuf_t body = {0};
  int nvar = 0;
  g->mm_buf = -1;
  if (g->kind == G_MM) { /* the product: an input of the chain */
    g->mm = gr->nodes[g->nodes[0]];
    g->mm_buf = buf_index(g, &g->mm->outs[0], IN_FULL);
    sig_mix(&g->sig, 0x6d6d);
  }
  for (int m = g->kind == G_MM ? 1 : 0; m < g->nnodes; m++) {
    tpu_call_t* c = gr->nodes[g->nodes[m]];
    const fop_t* f = fuse_find_op(c);
    char names[5][32];
    const char* np[5];
    for (int k = 0; k < 3; k++) {
      snprintf(names[k], sizeof names[k], "0");
      if (f->t[k] < 0) continue;
      if (fuse_operand_is_number(c, f->t[k])) { /* a Scalar overload's operand */
        snprintf(names[k], sizeof names[k], "s[%d]", g->nscalars);
        g->scalars[g->nscalars++] = (float)tpu_arg_f64(c, f->t[k], 0);
        continue;
      }
      tpu_tensor_t* t = c->args[f->t[k]].v.t;
      if (t->flags & TPU_TENSOR_CPU_SCALAR) {
        snprintf(names[k], sizeof names[k], "s[%d]", g->nscalars);
        g->scalars[g->nscalars++] = (float)tpu_tensor_get_f64(t, 0);
        continue;
      }
      /* a single element broadcast over the group; with one element in all,
       * every buffer is a plain one */
      int kind = fuse_is_scalar_tensor(t) && g->n > 1 ? IN_DEVSCALAR : IN_FULL;
      int bi = buf_index(g, t, kind);
      gbuf_t* b = &g->bufs[bi];
      if (b->var < 0 && !b->loaded) { /* first read: from memory */
        b->loaded = true;
        sig_mix(&g->sig, 0x100 + (uint64_t)bi * 4 + (uint64_t)kind);
      }
      if (b->var >= 0) snprintf(names[k], sizeof names[k], "t%d[i]", b->var);
      else if (b->kind == IN_FULL) snprintf(names[k], sizeof names[k], "p%d[c0 + i]", bi);
      else snprintf(names[k], sizeof names[k], "d%d", bi);
    }
    for (int k = 0; k < 2; k++) {
      double v = f->sdef[k];
      if (f->s[k] >= 0 && !tpu_arg_is_none(c, f->s[k])) v = tpu_arg_f64(c, f->s[k], v);
      snprintf(names[3 + k], sizeof names[3 + k], "s[%d]", g->nscalars);
      g->scalars[g->nscalars++] = (float)v;
    }
    for (int k = 0; k < 5; k++) np[k] = names[k];
    int ov = nvar++;
    sig_mix(&g->sig, (uint64_t)(uintptr_t)f);
    for (int k = 0; k < 3; k++) sig_mix(&g->sig, tpu_cache_hash64(names[k], strlen(names[k]), 1));
    if (emit) { /* one loop per node, as the library runs it: same rounding */
      sb_printf(&body, "    for (int64_t i = 0; i < m; i++) t%d[i] = (float)(", ov);
      emit_expr(&body, f->expr, np);
      sb_printf(&body, ");\n");
    }
    int bi = buf_index(g, &c->outs[0], IN_FULL);
    g->bufs[bi].var = ov;
    g->bufs[bi].written = true;
    g->bufs[bi].t = &c->outs[0];
  }
  mark_internal(gr, g);
  if (g->mm_buf >= 0) {
    gbuf_t* b = &g->bufs[g->mm_buf];
    b->internal = only_inside(gr, g, b);
    b->loaded = true; /* read from the product's block */
    sig_mix(&g->sig, 0x6d6d00 + (uint64_t)b->internal);
  }
  /* in/out slots and stores */
  for (int k = 0; k < g->nbufs; k++) {
    gbuf_t* b = &g->bufs[k];
    if (b->loaded) b->in_slot = k;
    if (b->written && !b->internal) {
      b->out_slot = g->nout++;
      if (emit)
        sb_printf(&body, "    for (int64_t i = 0; i < m; i++) q%d[c0 + i] = t%d[i];\n",
                  b->out_slot, b->var);
    }
    sig_mix(&g->sig, 0x10000 + (uint64_t)k * 64 + (uint64_t)b->kind * 8 + b->loaded * 4 +
                         b->written * 2 + b->internal);
  }
  g->nin = g->nbufs;
  if (!emit) {
    free(body.p);
    return true;
  }
  sbuf_t pro = {0}; /* pointers and device scalars, hoisted out of the loop */
  for (int k = 0; k < g->nbufs; k++) {
    const gbuf_t* b = &g->bufs[k];
    if (b->loaded && b->kind == IN_FULL) sb_printf(&pro, "  const float* p%d = in[%d];\n", k, k);
    if (b->loaded && b->kind == IN_DEVSCALAR) sb_printf(&pro, "  const float d%d = in[%d][0];\n", k, k);
    if (b->out_slot >= 0) sb_printf(&pro, "  float* q%d = out[%d];\n", b->out_slot, b->out_slot);
  }
  for (int v = 0; v < nvar; v++) sb_printf(&pro, "  float t%d[FC] __attribute__((aligned(64)));\n", v);
  sbuf_t src = {0};
  sb_printf(&src,
            "/* TorchTPU fused kernel: nodes");
  for (int m = 0; m < g->nnodes; m++) sb_printf(&src, " %s", gr->nodes[g->nodes[m]]->op->name);
  sb_printf(&src,
            " */\n#include <math.h>\n#include <stdint.h>\n#include \"vecmath.h\"\n"
            "typedef float elem_t;\n#define LIT(v) ((elem_t)(v))\n#define EXP(x) tpu_vm_expf(x)\n"
            "#define LOG(x) tpu_vm_logf(x)\n#define TANH(x) tpu_vm_tanhf(x)\n"
            "#define ERF(x) tpu_vm_erff(x)\n#define sqrt sqrtf\n#define fabs fabsf\n"
            "#include \"ew_exprs.h\"\n#define FC 512 /* elements per chunk: intermediates stay in L1 */\n"
            "void tpu_fused(const float* const* in, float* const* out,\n"
            "               const float* s, int64_t begin, int64_t end) {\n%s"
            "  for (int64_t c0 = begin; c0 < end; c0 += FC) {\n"
            "    const int64_t m = end - c0 < FC ? end - c0 : FC;\n%s  }\n}\n",
            pro.p ? pro.p : "", body.p ? body.p : "");
  free(body.p);
  free(pro.p);
  if (src.oom || body.oom || pro.oom) {
    free(src.p);
    return false;
  }
  g->src = src.p;
  return true;
}

/* ---- row groups (what they are: fuse_plan.c) ---- */
/* Buffer entry of a row group (one per address). */
static int row_buf(group_t* g, const tpu_tensor_t* t, int kind, int64_t per, bool is_bool) {
  int bi = buf_index(g, t, kind);
  gbuf_t* b = &g->bufs[bi];
  if (bi == g->nbufs - 1 && !b->loaded && !b->written) {
    b->per = per;
    b->is_bool = is_bool;
  }
  return bi;
}

/* Name of tensor t read by a node of a row group: its row array when the
 * group computed it, else a row pointer into memory. Marks the load. */
static bool row_operand(group_t* g, const tpu_tensor_t* t, const tpu_tensor_t* o, bool is_bool,
                        char* name, size_t cap) {
  int64_t per = g->rows;
  int kind = IN_FULL;
  if (!is_bool && fuse_is_scalar_tensor(t) && g->rows * g->len > 1) kind = IN_DEVSCALAR;
  else if (!fuse_operand_period(t, o, g->rows, g->len, &per)) return false;
  int bi = row_buf(g, t, kind, per, is_bool);
  gbuf_t* b = &g->bufs[bi];
  if (b->per != per || b->is_bool != is_bool || b->kind != kind || b->rowstat || b->col >= 0)
    return false;
  if (b->var >= 0) {
    if (per != g->rows) return false; /* a broadcast read of a row the group writes */
    snprintf(name, cap, "t%d", b->var);
    return true;
  }
  if (!b->loaded) {
    b->loaded = true;
    sig_mix(&g->sig, 0x200 + (uint64_t)bi * 8 + (uint64_t)kind * 2 + is_bool +
                         (per == g->rows ? 0 : 0x1000));
  }
  snprintf(name, cap, kind == IN_DEVSCALAR ? "d%d" : "P%d", bi);
  return true;
}

/* Output o of a row group's node computed in row array t<var>; false when
 * its buffer cannot take it (a statistic, a column sum, a mask, or read
 * earlier with a period) */
static bool row_output(group_t* g, const tpu_tensor_t* o, int var) {
  gbuf_t* b = &g->bufs[buf_index(g, o, IN_FULL)];
  if (b->rowstat || b->col >= 0 || b->is_bool || (b->loaded && b->per != g->rows)) return false;
  b->var = var;
  b->written = true;
  b->t = (tpu_tensor_t*)o;
  b->per = g->rows;
  return true;
}

/* Output o holding one value per row, computed in u<var> */
static bool stat_output(group_t* g, const tpu_tensor_t* o, int var) {
  gbuf_t* b = &g->bufs[buf_index(g, o, IN_FULL)];
  if (b->loaded || b->col >= 0 || (b->written && !b->rowstat)) return false;
  b->rowstat = true;
  b->written = true;
  b->var = var;
  b->t = (tpu_tensor_t*)o;
  b->per = g->rows;
  return true;
}

/* Input t holding one value per row (layer norm's mean or rstd): the
 * group's u<var> when it computed it, else p<k>[r] */
static bool stat_input(group_t* g, const tpu_tensor_t* t, char* name, size_t cap) {
  const int bi = buf_index(g, t, IN_FULL);
  gbuf_t* b = &g->bufs[bi];
  if (b->col >= 0 || b->is_bool || (!b->rowstat && (b->loaded || b->written))) return false;
  if (b->written) {
    snprintf(name, cap, "u%d", b->var);
    return true;
  }
  if (!b->loaded) {
    b->loaded = b->rowstat = true;
    b->per = g->rows;
    sig_mix(&g->sig, 0x400 + (uint64_t)bi);
  }
  snprintf(name, cap, "p%d[r]", bi);
  return true;
}

/* Output o, a sum over the group's rows: partial `col` of each block
 * (written by the executor); its name in the kernel */
static bool col_output(group_t* g, const tpu_tensor_t* o, char* name, size_t cap) {
  gbuf_t* b = &g->bufs[buf_index(g, o, IN_FULL)];
  if (b->loaded || b->written) return false;
  b->col = g->ncols++;
  b->written = true;
  b->t = (tpu_tensor_t*)o;
  snprintf(name, cap, "C + (size_t)L * %d", b->col);
  return true;
}

/* Reduction node c (kind red) of a row group: its operands' names, its
 * outputs' buffers and, with body, its code. */
static bool reduction_node(group_t* g, const tpu_call_t* c, int red, sbuf_t* body, int* nvar,
                           int* nstat) {
  const tpu_tensor_t* o = &c->outs[0];
  char x[32], a2[32] = "0", a3[32] = "0", a4[32] = "0", a5[32] = "0";
  bool ok;
  /* x: the input (softmax, layer norm) or grad_output (backward) */
  ok = row_operand(g, tpu_arg_tensor(c, 0), o, false, x, sizeof x);
  if (ok && (red == RED_SOFTMAX_BWD || red == RED_LOG_SOFTMAX_BWD)) /* a2: the output */
    ok = row_operand(g, tpu_arg_tensor(c, 1), o, false, a2, sizeof a2);
  if (ok && red == RED_LAYER_NORM) { /* a2, a3: weight, bias */
    if (!tpu_arg_is_none(c, 2)) ok = row_operand(g, tpu_arg_tensor(c, 2), o, false, a2, sizeof a2);
    if (ok && !tpu_arg_is_none(c, 3))
      ok = row_operand(g, tpu_arg_tensor(c, 3), o, false, a3, sizeof a3);
  }
  if (ok && red == RED_LAYER_NORM_BWD) { /* a2: input; a3, a4: mean, rstd; a5: weight */
    ok = row_operand(g, tpu_arg_tensor(c, 1), o, false, a2, sizeof a2) &&
         stat_input(g, tpu_arg_tensor(c, 3), a3, sizeof a3) &&
         stat_input(g, tpu_arg_tensor(c, 4), a4, sizeof a4);
    if (ok && !tpu_arg_is_none(c, 5))
      ok = row_operand(g, tpu_arg_tensor(c, 5), o, false, a5, sizeof a5);
  }
  if (!ok) return false;
  const int ov = (*nvar)++;
  sig_mix(&g->sig, 0x300 + (uint64_t)red);
  const char* names[5] = {x, a2, a3, a4, a5};
  for (int k = 0; k < 5; k++) sig_mix(&g->sig, tpu_cache_hash64(names[k], strlen(names[k]), 2 + k));
  if (red == RED_LAYER_NORM) {
    double eps = tpu_arg_f64(c, 4, 1e-5);
    uint64_t bits;
    memcpy(&bits, &eps, sizeof bits);
    sig_mix(&g->sig, bits);
    const int sm = (*nstat)++, sr = (*nstat)++;
    if (body)
      sb_printf(body, "    tpu_fr_layer_norm(%s, t%d, L, %.17g, %s, %s, &u%d, &u%d);\n", x, ov, eps,
                a2, a3, sm, sr);
    if (!stat_output(g, &c->outs[1], sm) || !stat_output(g, &c->outs[2], sr)) return false;
  } else if (red == RED_LAYER_NORM_BWD) {
    /* the weight and bias sums where wanted, else scratch rows */
    char pw[32] = "D", pb[32] = "D + L";
    for (int k = 1; k < 3; k++)
      if (fuse_output_wanted(c, 7, k) && !col_output(g, &c->outs[k], k == 1 ? pw : pb, sizeof pw))
        return false;
    sig_mix(&g->sig, tpu_cache_hash64(pw, strlen(pw), 8));
    sig_mix(&g->sig, tpu_cache_hash64(pb, strlen(pb), 9));
    if (body)
      sb_printf(body, "    tpu_fr_layer_norm_backward(%s, %s, %s, %s, %s, t%d, tmp, %s, %s, L);\n", x,
                a2, a5, a3, a4, ov, pw, pb);
  } else if (body && (red == RED_SOFTMAX_BWD || red == RED_LOG_SOFTMAX_BWD)) {
    sb_printf(body, "    tpu_fr_softmax_backward(%s, %s, t%d, L, %d);\n", x, a2, ov,
              red == RED_LOG_SOFTMAX_BWD);
  } else if (body) {
    sb_printf(body, "    tpu_fr_softmax(%s, t%d, tmp, L, %d);\n", x, ov, red == RED_LOG_SOFTMAX);
  }
  return row_output(g, o, ov);
}

/* Builds a row group; false when it cannot be formed. */
static bool build_row_group(tpu_graph_t* gr, group_t* g, bool emit) {
  const size_t nodes = (size_t)g->nnodes;
  g->bufs = calloc(8 * nodes, sizeof(gbuf_t));
  g->scalars = calloc(6 * nodes, sizeof(float));
  if (!g->bufs || !g->scalars) return false;
  sig_mix(&g->sig, 0x726f7773); /* "rows" */
  sbuf_t body = {0};
  int nvar = 0, nstat = 0;
  bool ok = true;
  for (int m = 0; m < g->nnodes && ok; m++) {
    tpu_call_t* c = gr->nodes[g->nodes[m]];
    tpu_tensor_t* o = &c->outs[0];
    int64_t R, L;
    int red = fuse_row_reduction(c, &R, &L);
    if (red != RED_NONE) {
      ok = R == g->rows && L == g->len &&
           reduction_node(g, c, red, emit ? &body : NULL, &nvar, &nstat);
      continue;
    }
    int bop;
    const fop_t* f = fuse_find_row_op(c, &bop);
    char names[5][32];
    const char* np[5];
    for (int k = 0; k < 3 && ok; k++) {
      snprintf(names[k], sizeof names[k], "0");
      if (f->t[k] < 0) continue;
      if (k != bop && fuse_operand_is_number(c, f->t[k])) { /* a Scalar overload's operand */
        snprintf(names[k], sizeof names[k], "s[%d]", g->nscalars);
        g->scalars[g->nscalars++] = (float)tpu_arg_f64(c, f->t[k], 0);
        continue;
      }
      tpu_tensor_t* t = c->args[f->t[k]].v.t;
      if ((t->flags & TPU_TENSOR_CPU_SCALAR) && k != bop) {
        snprintf(names[k], sizeof names[k], "s[%d]", g->nscalars);
        g->scalars[g->nscalars++] = (float)tpu_tensor_get_f64(t, 0);
        continue;
      }
      char nm[24];
      ok = row_operand(g, t, o, k == bop, nm, sizeof nm);
      if (ok && nm[0] == 'd') snprintf(names[k], sizeof names[k], "%s", nm);
      else if (ok) snprintf(names[k], sizeof names[k], "%s[i]", nm);
    }
    if (!ok) break;
    for (int k = 0; k < 2; k++) {
      double v = f->sdef[k];
      if (f->s[k] >= 0 && !tpu_arg_is_none(c, f->s[k])) v = tpu_arg_f64(c, f->s[k], v);
      snprintf(names[3 + k], sizeof names[3 + k], "s[%d]", g->nscalars);
      g->scalars[g->nscalars++] = (float)v;
    }
    int ov = nvar++;
    sig_mix(&g->sig, (uint64_t)(uintptr_t)f);
    for (int k = 0; k < 3; k++) sig_mix(&g->sig, tpu_cache_hash64(names[k], strlen(names[k]), 1));
    if (emit) { /* operands read unconditionally (a select vectorizes, a masked load not) */
      static const char* const vn[5] = {"A_", "B_", "C_", "S0_", "S1_"};
      sb_printf(&body, "    for (int64_t i = 0; i < L; i++) {");
      for (int k = 0; k < 5; k++) {
        np[k] = vn[k];
        if (k >= 3 || f->t[k] >= 0) sb_printf(&body, " const float %s = %s;", vn[k], names[k]);
      }
      sb_printf(&body, " t%d[i] = (float)(", ov);
      emit_expr(&body, f->expr, np);
      sb_printf(&body, "); }\n");
    }
    ok = row_output(g, o, ov);
  }
  if (!ok) {
    free(body.p);
    return false;
  }
  mark_internal(gr, g);
  sbuf_t st = {0}; /* stores at the end of each row */
  for (int k = 0; k < g->nbufs; k++) {
    gbuf_t* b = &g->bufs[k];
    if (b->loaded) b->in_slot = k;
    if (b->written && !b->internal) {
      b->out_slot = g->nout++;
      if (b->col >= 0) { /* the executor adds the blocks' partials */
      } else if (emit && b->rowstat) {
        sb_printf(&st, "    q%d[r] = u%d;\n", b->out_slot, b->var);
      } else if (emit)
        sb_printf(&st, "    memcpy(q%d + r * L, t%d, sizeof(float) * (size_t)L);\n", b->out_slot,
                  b->var);
    }
    sig_mix(&g->sig, 0x20000 + (uint64_t)k * 128 + (uint64_t)b->kind * 16 + b->loaded * 8 +
                         b->written * 4 + b->internal * 2 + b->rowstat);
    sig_mix(&g->sig, (uint64_t)(b->col + 1));
  }
  g->nin = g->nbufs;
  if (!emit) {
    free(body.p);
    free(st.p);
    return true;
  }
  sbuf_t pro = {0}, rowp = {0};
  for (int k = 0; k < g->nbufs; k++) {
    const gbuf_t* b = &g->bufs[k];
    const char* ty = b->is_bool ? "unsigned char" : "float";
    if (b->loaded && b->kind == IN_FULL) {
      sb_printf(&pro, "  const %s* p%d = (const %s*)in[%d];\n", ty, k, ty, k);
      if (!b->rowstat) sb_printf(&rowp, "    const %s* P%d = p%d + (r %% per[%d]) * L;\n", ty, k, k, k);
    }
    if (b->loaded && b->kind == IN_DEVSCALAR)
      sb_printf(&pro, "  const float d%d = ((const float*)in[%d])[0];\n", k, k);
    if (b->out_slot >= 0) sb_printf(&pro, "  float* q%d = (float*)out[%d];\n", b->out_slot, b->out_slot);
  }
  /* row arrays: disjoint from each other and from every operand; tmp:
   * three scratch rows; D: two rows of sums nobody wants */
  sb_printf(&pro, "  float* T = (float*)malloc(sizeof(float) * (size_t)L * %d + 64);\n"
                  "  if (!T) return 1;\n  float* restrict tmp = T + (size_t)L * %d;\n"
                  "  float* restrict D = tmp + (size_t)L * 3;\n"
                  "  memset(D, 0, sizeof(float) * (size_t)L * 2);\n", nvar + 5, nvar);
  for (int v = 0; v < nvar; v++)
    sb_printf(&pro, "  float* restrict t%d = T + (size_t)L * %d;\n", v, v);
  sbuf_t src = {0};
  sb_printf(&src, "/* TorchTPU fused row kernel: nodes");
  for (int m = 0; m < g->nnodes; m++) sb_printf(&src, " %s", gr->nodes[g->nodes[m]]->op->name);
  sb_printf(&src,
            " */\n#include <math.h>\n#include <stdint.h>\n#include <stdlib.h>\n#include <string.h>\n"
            "#include \"vecmath.h\"\n#include \"fuse_rows.h\"\n"
            "typedef float elem_t;\n#define LIT(v) ((elem_t)(v))\n#define EXP(x) tpu_vm_expf(x)\n"
            "#define LOG(x) tpu_vm_logf(x)\n#define TANH(x) tpu_vm_tanhf(x)\n"
            "#define ERF(x) tpu_vm_erff(x)\n#define sqrt sqrtf\n#define fabs fabsf\n"
            "#include \"ew_exprs.h\"\n"
            "int tpu_fused(const void* const* in, void* const* out, const float* s,\n"
            "              int64_t r0, int64_t r1, int64_t L, const int64_t* per,\n"
            "              int64_t blk, float* part) {\n%s"
            "  for (int64_t r = r0; r < r1; r++) {\n",
            pro.p ? pro.p : "");
  if (g->ncols) /* this block's column partials, zeroed at its first row */
    sb_printf(&src,
              "    float* restrict C = part + (size_t)(r / blk) * (size_t)L * %d;\n"
              "    if (r == r0 || r %% blk == 0) memset(C, 0, sizeof(float) * (size_t)L * %d);\n",
              g->ncols, g->ncols);
  for (int q = 0; q < nstat; q++) sb_printf(&src, "    float u%d;\n", q);
  sb_printf(&src, "%s%s%s  }\n  free(T);\n  return 0;\n}\n", rowp.p ? rowp.p : "",
            body.p ? body.p : "", st.p ? st.p : "");
  bool oom = src.oom || body.oom || pro.oom || rowp.oom || st.oom;
  free(body.p);
  free(pro.p);
  free(rowp.p);
  free(st.p);
  if (oom) {
    free(src.p);
    return false;
  }
  g->src = src.p;
  return true;
}

bool fuse_build_group(tpu_graph_t* gr, group_t* g, bool emit) {
  return g->kind == G_ROWS ? build_row_group(gr, g, emit) : build_group(gr, g, emit);
}
