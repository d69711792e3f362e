/* Fusion for the host target: chains of float32 elementwise nodes become one
 * generated C kernel; so do row reductions (softmax, log_softmax, layer norm
 * over the last dim) with their elementwise prologue and epilogue ("row
 * groups", below), and mm/addmm run block by block with the generated kernel
 * of their elementwise epilogue ("matmul epilogues", below). Row groups are
 * planned first, then foreach blocks, epilogues and plain chains over the
 * nodes left. TORCH_TPU_FUSE_REDUCTIONS=0 / TORCH_TPU_FUSE_EPILOGUES=0 turn
 * the two new kinds off.
 *
 * Planning walks the graph's nodes in order and groups consecutive fusible
 * nodes over the same number of elements. A node is fusible when its op has
 * an expression below, every tensor is float32 and either contiguous with the
 * output's shape or a single element, and the output is contiguous. Within a
 * group each buffer is named by its address; a buffer the group writes is
 * kept in a register for later nodes of the group and stored at the end
 * unless it is internal (a dead placeholder nobody outside the group names),
 * in which case it never gets memory.
 *
 * Code generation emits a loop over chunks of 512 elements; inside a chunk
 * each node is its own inner loop computing the node's expression (the same
 * macros as the library kernels, ew_exprs.h and vecmath.h) into an L1-sized
 * array, so a fused chain rounds exactly like the library kernels run one by
 * one (no multiply-add contraction across nodes) while its intermediates
 * never leave the cache. It compiles with the system C compiler into a shared object,
 * and loads it. Scalars (alpha, a learning rate, a CPU scalar operand) are
 * inputs of the kernel, not part of its source, so new values do not
 * recompile. Executables are looked up in the three-tier cache by a hash of
 * their source, flags, ISA and runtime version. A miss compiles in the
 * background while the group runs unfused (TORCH_TPU_ASYNC_COMPILE=0
 * compiles synchronously); without a working compiler every group runs
 * unfused, with a one-time warning.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/env.h"
#include "base/subprocess.h"
#include "device/internal.h"
#include "exec/graph.h"
#include "targets/host/fuse.h"
#include "targets/host/fuse_headers.h"
#include "targets/host/kernels/vecmath.h"
#include "tpu/cache.h"

typedef void (*fused_fn_t)(const float* const* in, float* const* out, const float* s,
                           int64_t begin, int64_t end);

/* ---- fusible ops ---- */
typedef struct {
  const char* name;
  const char* expr; /* over a, b, c (tensor inputs) and s0, s1 (scalars) */
  int8_t t[3];      /* argument index of a, b, c (-1: none) */
  int8_t s[2];      /* argument index of s0, s1 (-1: none) */
  float sdef[2];    /* defaults when the argument is absent */
} fop_t;

#define T1 {0, -1, -1}
#define T2 {0, 1, -1}
#define T3 {0, 1, 2}
#define S0 {-1, -1}
static const fop_t k_ops[] = {
    {"add.Tensor", "a + s0 * b", T2, {2, -1}, {1, 0}},
    {"add_.Tensor", "a + s0 * b", T2, {2, -1}, {1, 0}},
    {"sub.Tensor", "a - s0 * b", T2, {2, -1}, {1, 0}},
    {"sub_.Tensor", "a - s0 * b", T2, {2, -1}, {1, 0}},
    {"mul.Tensor", "a * b", T2, S0, {0, 0}},
    {"mul_.Tensor", "a * b", T2, S0, {0, 0}},
    {"div.Tensor", "a / b", T2, S0, {0, 0}},
    {"div_.Tensor", "a / b", T2, S0, {0, 0}},
    {"add.Scalar", "a + s1 * s0", T1, {1, 2}, {0, 1}},
    {"add_.Scalar", "a + s1 * s0", T1, {1, 2}, {0, 1}},
    {"mul.Scalar", "a * s0", T1, {1, -1}, {0, 0}},
    {"mul_.Scalar", "a * s0", T1, {1, -1}, {0, 0}},
    {"div.Scalar", "a / s0", T1, {1, -1}, {0, 0}},
    {"div_.Scalar", "a / s0", T1, {1, -1}, {0, 0}},
    {"neg", "-a", T1, S0, {0, 0}},
    {"exp", "EXP(a)", T1, S0, {0, 0}},
    {"log", "LOG(a)", T1, S0, {0, 0}},
    {"tanh", "TANH(a)", T1, S0, {0, 0}},
    {"sigmoid", "SIGMOID(a)", T1, S0, {0, 0}},
    {"relu", "a < 0 ? 0 : a", T1, S0, {0, 0}},
    {"relu_", "a < 0 ? 0 : a", T1, S0, {0, 0}},
    {"sqrt", "sqrt(a)", T1, S0, {0, 0}},
    {"rsqrt", "1 / sqrt(a)", T1, S0, {0, 0}},
    {"reciprocal", "1 / a", T1, S0, {0, 0}},
    {"abs", "fabs(a)", T1, S0, {0, 0}},
    {"erf", "ERF(a)", T1, S0, {0, 0}},
    {"silu", "SILU(a)", T1, S0, {0, 0}},
    {"square", "a * a", T1, S0, {0, 0}},
    {"threshold_backward", "b <= s0 ? 0 : a", T2, {2, -1}, {0, 0}},
    {"tanh_backward", "a * (1 - b * b)", T2, S0, {0, 0}},
    {"sigmoid_backward", "a * (1 - b) * b", T2, S0, {0, 0}},
    {"silu_backward", "a * SIGMOID(b) * (1 + b * (1 - SIGMOID(b)))", T2, S0, {0, 0}},
    {"addcmul_", "a + s0 * b * c", T3, {3, -1}, {1, 0}},
    {"addcmul", "a + s0 * b * c", T3, {3, -1}, {1, 0}},
    {"addcdiv_", "a + s0 * (b / c)", T3, {3, -1}, {1, 0}},
    {"addcdiv", "a + s0 * (b / c)", T3, {3, -1}, {1, 0}},
    {"lerp_.Scalar", "(fabs(s0) < 0.5) ? a + s0 * (b - a) : b - (b - a) * (1 - s0)", T2, {2, -1},
     {0, 0}},
};
static const fop_t k_gelu[2] = {{"gelu", "GELU(a)", T1, S0, {0, 0}},
                                {"gelu", "GELU_TANH(a)", T1, S0, {0, 0}}};
static const fop_t k_gelu_bw[2] = {
    {"gelu_backward",
     "a * (LIT(0.5) * (1 + ERF(b * LIT(M_SQRT1_2_))) + b * LIT(M_2_SQRTPI_ * M_SQRT1_2_ * 0.5) * "
     "EXP(LIT(-0.5) * b * b))",
     T2, S0, {0, 0}},
    {"gelu_backward",
     "a * (LIT(0.5) * (1 + GELU_TANH_INNER(b)) + LIT(0.5) * b * (1 - GELU_TANH_INNER(b) * "
     "GELU_TANH_INNER(b)) * LIT(KBETA_) * (1 + 3 * LIT(KKAPPA_) * b * b))",
     T2, S0, {0, 0}}};

static const fop_t* find_op(const tpu_call_t* c) {
  const char* n = c->op->name;
  if (!strcmp(n, "gelu") || !strcmp(n, "gelu_backward")) {
    int ai = !strcmp(n, "gelu") ? 1 : 2;
    const char* ap = tpu_arg_str(c, ai, "none");
    int k = !strcmp(ap, "tanh") ? 1 : 0;
    return !strcmp(n, "gelu") ? &k_gelu[k] : &k_gelu_bw[k];
  }
  for (size_t i = 0; i < sizeof k_ops / sizeof k_ops[0]; i++)
    if (!strcmp(k_ops[i].name, n)) return &k_ops[i];
  return NULL;
}

/* ---- the plan ---- */
enum { IN_FULL, IN_DEVSCALAR, IN_HOSTSCALAR };

typedef struct {
  const void* addr; /* buffer identity (placeholder or real address at plan time) */
  tpu_tensor_t* t;  /* a descriptor naming it (patched in place before running) */
  int kind;
  int var;      /* register holding its current value in the group, -1 if none */
  bool loaded;  /* read from memory in the group */
  bool written; /* written by the group */
  bool internal;
  int in_slot, out_slot;
  /* row groups: rows in the buffer's period (row r reads row r % per);
   * bool: a mask operand; rowstat: one value per row (layer norm's mean
   * and rstd), held in scalar u<var> */
  int64_t per;
  bool is_bool, rowstat;
} gbuf_t;

typedef struct {
  int* nodes;      /* member nodes in program order */
  int nnodes;
  int trigger;     /* the group runs when execution reaches this node */
  int64_t n;       /* elements */
  uint64_t sig;    /* structure: ops, buffer roles, internal buffers */
  gbuf_t* bufs;
  int nbufs;
  float* scalars;
  int nscalars;
  char* src; /* generated source (until compiled) */
  fused_fn_t fn;
  int nin, nout;
  /* G_ROWS: rows x len, each row computed through all nodes at once */
  int kind;
  int64_t rows, len;
  /* G_MM: the mm/addmm node whose output the chain reads; its output
   * buffer's entry, and whether that output needs no memory (then each
   * row block of the product goes to a scratch block) */
  tpu_call_t* mm;
  int mm_buf;
} group_t;

enum { G_FLAT = 0, G_ROWS, G_MM };

/* a generated row kernel: rows [r0, r1) of `len` elements; per[k] is
 * buffer k's period in rows; nonzero when its scratch rows could not be
 * allocated */
typedef int (*rows_fn_t)(const void* const* in, void* const* out, const float* s, int64_t r0,
                         int64_t r1, int64_t len, const int64_t* per);

struct tpu_fusion_plan {
  group_t* groups; /* in trigger order */
  int ngroups;
  int64_t fused_nodes;
  int64_t reduction_groups, epilogue_groups;
  bool* fused; /* per node: it runs inside a group */
  int* runpos; /* per node: where its work runs (its group's trigger) */
};

static int64_t g_epi_rows;
static bool g_enabled_once, g_enabled = true, g_async = true, g_rows = true, g_epilogues = true;
static pthread_once_t g_cfg_once = PTHREAD_ONCE_INIT;

static void read_config(void) {
  g_enabled = tpu_env_int("TORCH_TPU_FUSION", 1) != 0;
  g_async = tpu_env_int("TORCH_TPU_ASYNC_COMPILE", 1) != 0;
  /* the reduction and matmul-epilogue groups can be turned off alone
   * (comparisons, bisecting) */
  g_rows = tpu_env_int("TORCH_TPU_FUSE_REDUCTIONS", 1) != 0;
  g_epilogues = tpu_env_int("TORCH_TPU_FUSE_EPILOGUES", 1) != 0;
  g_epi_rows = tpu_env_int("TORCH_TPU_EPILOGUE_ROWS", 0);
  g_enabled_once = true;
}

static bool is_scalar_tensor(const tpu_tensor_t* t) { return tpu_tensor_numel(t) == 1; }

/* Whether node c can join a group over n elements (n < 0: any). */
static bool fusible(const tpu_call_t* c, int64_t* n) {
  if (c->nouts != 1 || c->outs[0].dtype != TPU_F32 || !tpu_tensor_is_contiguous(&c->outs[0]))
    return false;
  const fop_t* f = find_op(c);
  if (!f) return false;
  const tpu_tensor_t* o = &c->outs[0];
  int64_t on = tpu_tensor_numel(o);
  if (on < 1 || (*n >= 0 && on != *n)) return false;
  for (int k = 0; k < 3; k++) {
    if (f->t[k] < 0) continue;
    const tpu_tensor_t* t = tpu_arg_tensor(c, f->t[k]);
    if (t && (t->flags & TPU_TENSOR_CPU_SCALAR) && t->dtype != TPU_BOOL) continue;
    if (!t || t->dtype != TPU_F32) return false;
    if (is_scalar_tensor(t)) continue;
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
    const fop_t* f = find_op(c);
    char names[5][32];
    const char* np[5];
    for (int k = 0; k < 3; k++) {
      snprintf(names[k], sizeof names[k], "0");
      if (f->t[k] < 0) continue;
      tpu_tensor_t* t = c->args[f->t[k]].v.t;
      if (t->flags & TPU_TENSOR_CPU_SCALAR) {
        snprintf(names[k], sizeof names[k], "s[%d]", g->nscalars);
        g->scalars[g->nscalars++] = (float)tpu_tensor_get_f64(t, 0);
        continue;
      }
      /* a single element broadcast over the group; with one element in all,
       * every buffer is a plain one */
      int kind = is_scalar_tensor(t) && g->n > 1 ? IN_DEVSCALAR : IN_FULL;
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
static const fop_t k_masked_fill = {"masked_fill.Scalar", "b ? s0 : a", T2, {2, -1}, {0, 0}};
static const fop_t k_masked_fill_ = {"masked_fill_.Scalar", "b ? s0 : a", T2, {2, -1}, {0, 0}};
static const fop_t k_where = {"where.self", "a ? b : c", T3, S0, {0, 0}};

enum { RED_NONE = 0, RED_SOFTMAX, RED_LOG_SOFTMAX, RED_LAYER_NORM };

/* elementwise ops of row groups: the flat ones plus masks */
static const fop_t* find_row_op(const tpu_call_t* c, int* bool_operand) {
  const char* n = c->op->name;
  *bool_operand = -1;
  if (!strcmp(n, "masked_fill.Scalar") || !strcmp(n, "masked_fill_.Scalar")) {
    *bool_operand = 1;
    return n[11] == '_' ? &k_masked_fill_ : &k_masked_fill;
  }
  if (!strcmp(n, "where.self")) {
    *bool_operand = 0;
    return &k_where;
  }
  return find_op(c);
}

static bool flat_f32(const tpu_tensor_t* t) {
  return t && t->dtype == TPU_F32 && t->ndim >= 1 && tpu_tensor_is_contiguous(t);
}

/* The row reduction kind of c with its rows and row length, RED_NONE if
 * it is not one the row groups take. */
static int row_reduction(const tpu_call_t* c, int64_t* R, int64_t* L) {
  const char* n = c->op->name;
  const tpu_tensor_t* x = tpu_arg_tensor(c, 0);
  if (!flat_f32(x) || c->nouts < 1 || !flat_f32(&c->outs[0])) return RED_NONE;
  const int64_t len = x->sizes[x->ndim - 1], numel = tpu_tensor_numel(x);
  if (len < 1 || tpu_tensor_numel(&c->outs[0]) != numel) return RED_NONE;
  int kind = RED_NONE;
  if (!strcmp(n, "_softmax") || !strcmp(n, "_log_softmax")) {
    int64_t d = tpu_arg_i64(c, 1, -1);
    if ((d != -1 && d != x->ndim - 1) || tpu_arg_bool(c, 2, false)) return RED_NONE;
    kind = n[1] == 'l' ? RED_LOG_SOFTMAX : RED_SOFTMAX;
  } else if (!strcmp(n, "native_layer_norm")) {
    if (c->nargs < 5 || c->args[1].kind != TPU_ARG_INTLIST || c->args[1].n != 1 ||
        c->args[1].v.ilist[0] != len || c->nouts != 3)
      return RED_NONE;
    for (int a = 2; a < 4; a++) {
      if (tpu_arg_is_none(c, a)) continue;
      const tpu_tensor_t* p = tpu_arg_tensor(c, a);
      if (!flat_f32(p) || tpu_tensor_numel(p) != len) return RED_NONE;
    }
    for (int o = 1; o < 3; o++) /* mean and rstd: one float per row */
      if (c->outs[o].dtype != TPU_F32 || !tpu_tensor_is_contiguous(&c->outs[o]) ||
          tpu_tensor_numel(&c->outs[o]) != numel / len)
        return RED_NONE;
    kind = RED_LAYER_NORM;
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
static bool operand_period(const tpu_tensor_t* t, const tpu_tensor_t* o, int64_t R, int64_t L,
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
  const fop_t* f = find_row_op(c, &bop);
  if (!f || c->nouts != 1) return false;
  const tpu_tensor_t* o = &c->outs[0];
  if (!flat_f32(o) || tpu_tensor_numel(o) != R * L) return false;
  for (int k = 0; k < 3; k++) {
    if (f->t[k] < 0) continue;
    const tpu_tensor_t* t = tpu_arg_tensor(c, f->t[k]);
    if (!t) return false;
    if (k == bop) {
      if (t->dtype != TPU_BOOL || (t->flags & TPU_TENSOR_CPU_SCALAR)) return false;
    } else {
      if ((t->flags & TPU_TENSOR_CPU_SCALAR) && t->dtype != TPU_BOOL) continue;
      if (t->dtype != TPU_F32) return false;
    }
    if (is_scalar_tensor(t) && k != bop) continue;
    int64_t per;
    if (!operand_period(t, o, R, L, &per)) return false;
  }
  for (int k = 0; k < 2; k++)
    if (f->s[k] >= 0 && f->s[k] < c->nargs) {
      tpu_arg_kind_t kd = c->args[f->s[k]].kind;
      if (kd != TPU_ARG_INT && kd != TPU_ARG_DOUBLE && kd != TPU_ARG_BOOL && kd != TPU_ARG_NONE)
        return false;
    }
  return true;
}

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
  if (!is_bool && is_scalar_tensor(t) && g->rows * g->len > 1) kind = IN_DEVSCALAR;
  else if (!operand_period(t, o, g->rows, g->len, &per)) return false;
  int bi = row_buf(g, t, kind, per, is_bool);
  gbuf_t* b = &g->bufs[bi];
  if (b->per != per || b->is_bool != is_bool || b->kind != kind || b->rowstat) return false;
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

/* Builds a row group (see above); false when it cannot be formed. */
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
    int red = row_reduction(c, &R, &L);
    if (red != RED_NONE) {
      char x[32], w[32] = "0", b[32] = "0";
      ok = R == g->rows && L == g->len && row_operand(g, tpu_arg_tensor(c, 0), o, false, x, sizeof x);
      if (ok && red == RED_LAYER_NORM) {
        if (!tpu_arg_is_none(c, 2)) ok = row_operand(g, tpu_arg_tensor(c, 2), o, false, w, sizeof w);
        if (ok && !tpu_arg_is_none(c, 3))
          ok = row_operand(g, tpu_arg_tensor(c, 3), o, false, b, sizeof b);
      }
      if (!ok) break;
      int ov = nvar++;
      sig_mix(&g->sig, 0x300 + (uint64_t)red);
      sig_mix(&g->sig, tpu_cache_hash64(x, strlen(x), 2));
      if (red == RED_LAYER_NORM) {
        double eps = tpu_arg_f64(c, 4, 1e-5);
        uint64_t bits;
        memcpy(&bits, &eps, sizeof bits);
        sig_mix(&g->sig, bits);
        sig_mix(&g->sig, tpu_cache_hash64(w, strlen(w), 3));
        sig_mix(&g->sig, tpu_cache_hash64(b, strlen(b), 4));
        int sm = nstat++, sr = nstat++;
        if (emit)
          sb_printf(&body, "    tpu_fr_layer_norm(%s, t%d, L, %.17g, %s, %s, &u%d, &u%d);\n", x, ov,
                    eps, w, b, sm, sr);
        for (int k = 1; k < 3; k++) {
          int si = buf_index(g, &c->outs[k], IN_FULL);
          gbuf_t* sb = &g->bufs[si];
          if (sb->loaded || (sb->written && !sb->rowstat)) {
            ok = false;
            break;
          }
          sb->rowstat = true;
          sb->written = true;
          sb->var = k == 1 ? sm : sr;
          sb->t = &c->outs[k];
          sb->per = g->rows;
        }
      } else if (emit) {
        sb_printf(&body, "    tpu_fr_softmax(%s, t%d, tmp, L, %d);\n", x, ov,
                  red == RED_LOG_SOFTMAX);
      }
      int bi = buf_index(g, o, IN_FULL);
      if (g->bufs[bi].rowstat || (g->bufs[bi].loaded && g->bufs[bi].per != g->rows)) ok = false;
      g->bufs[bi].var = ov;
      g->bufs[bi].written = true;
      g->bufs[bi].t = o;
      g->bufs[bi].per = g->rows;
      continue;
    }
    int bop;
    const fop_t* f = find_row_op(c, &bop);
    char names[5][32];
    const char* np[5];
    for (int k = 0; k < 3 && ok; k++) {
      snprintf(names[k], sizeof names[k], "0");
      if (f->t[k] < 0) continue;
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
    int bi = buf_index(g, o, IN_FULL);
    gbuf_t* ob = &g->bufs[bi];
    if (ob->rowstat || (ob->loaded && ob->per != g->rows) || ob->is_bool) {
      ok = false;
      break;
    }
    ob->var = ov;
    ob->written = true;
    ob->t = o;
    ob->per = g->rows;
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
      if (emit && b->rowstat) sb_printf(&st, "    q%d[r] = u%d;\n", b->out_slot, b->var);
      else if (emit)
        sb_printf(&st, "    memcpy(q%d + r * L, t%d, sizeof(float) * (size_t)L);\n", b->out_slot,
                  b->var);
    }
    sig_mix(&g->sig, 0x20000 + (uint64_t)k * 128 + (uint64_t)b->kind * 16 + b->loaded * 8 +
                         b->written * 4 + b->internal * 2 + b->rowstat);
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
      sb_printf(&rowp, "    const %s* P%d = p%d + (r %% per[%d]) * L;\n", ty, k, k, k);
    }
    if (b->loaded && b->kind == IN_DEVSCALAR)
      sb_printf(&pro, "  const float d%d = ((const float*)in[%d])[0];\n", k, k);
    if (b->out_slot >= 0) sb_printf(&pro, "  float* q%d = (float*)out[%d];\n", b->out_slot, b->out_slot);
  }
  /* row arrays: disjoint from each other and from every operand */
  sb_printf(&pro, "  float* T = (float*)malloc(sizeof(float) * (size_t)L * %d + 64);\n"
                  "  if (!T) return 1;\n  float* restrict tmp = T + (size_t)L * %d;\n", nvar + 1, nvar);
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
            "              int64_t r0, int64_t r1, int64_t L, const int64_t* per) {\n%s"
            "  for (int64_t r = r0; r < r1; r++) {\n",
            pro.p ? pro.p : "");
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

/* ---- compilation and the cache ---- */
static const char* cc_flags(void) {
  return tpu_host_isa() == TPU_ISA_AVX2
             ? "-O3 -fPIC -shared -std=c11 -mavx2 -mfma -ffp-contract=fast -fno-math-errno "
               "-fno-trapping-math"
             : "-O3 -fPIC -shared -std=c11 -fno-math-errno -fno-trapping-math";
}

/* The compiler command: TORCH_TPU_CC, default "cc". */
static const char* cc_command(void) {
  const char* cc = tpu_env_str("TORCH_TPU_CC");
  return cc && cc[strspn(cc, " \t")] ? cc : "cc";
}

/* Hash of the headers embedded in the library (fuse_headers.h), names and
 * texts: the headers a kernel is compiled with are these, never files on
 * disk, so a key names exactly what was compiled. */
static uint64_t g_headers_hash;
static void hash_headers(void) {
  uint64_t h = 0x6865616465727321ull;
  for (int i = 0; i < tpu_fuse_nheaders; i++) {
    const tpu_fuse_header_t* e = &tpu_fuse_headers[i];
    h = tpu_cache_hash64(e->name, strlen(e->name) + 1, h);
    h = tpu_cache_hash64(&e->len, sizeof e->len, h);
    h = tpu_cache_hash64(e->text, e->len, h);
  }
  g_headers_hash = h;
}

/* The key covers the generated source, the embedded headers, the compiler
 * command and its flags, the ISA and the runtime version. */
static void key_of(const char* src, char out[33]) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, hash_headers);
  char extra[4500];
  snprintf(extra, sizeof extra, "|%.4000s|%s|%s|%s|%016" PRIx64 "|", cc_command(), cc_flags(),
           tpu_isa_name(tpu_host_isa()), TPU_RUNTIME_VERSION, g_headers_hash);
  uint64_t h1 = tpu_cache_hash64(src, strlen(src), 0x7470755f66757365ull);
  h1 = tpu_cache_hash64(extra, strlen(extra), h1);
  uint64_t h2 = tpu_cache_hash64(src, strlen(src), 0x9e3779b97f4a7c15ull);
  h2 = tpu_cache_hash64(extra, strlen(extra), h2);
  snprintf(out, 33, "%016" PRIx64 "%016" PRIx64, h1, h2);
}

static pthread_mutex_t g_warn_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_warning[1024];
static bool g_compiler_broken;

static void note_compiler_failure(const char* why) {
  pthread_mutex_lock(&g_warn_mu);
  if (!g_compiler_broken) {
    g_compiler_broken = true;
    snprintf(g_warning, sizeof g_warning,
             "TorchTPU: fused kernels are unavailable (%s); DeferAndFuse graphs run op by op "
             "through the kernel library",
             why);
  }
  pthread_mutex_unlock(&g_warn_mu);
}

const char* tpu_fusion_pop_warning(void) {
  static __thread char copy[1024];
  pthread_mutex_lock(&g_warn_mu);
  bool have = g_warning[0] != 0;
  if (have) {
    memcpy(copy, g_warning, sizeof copy);
    g_warning[0] = 0;
  }
  pthread_mutex_unlock(&g_warn_mu);
  return have ? copy : NULL;
}

static fused_fn_t load_path(const char* key, const char* path, char* why, size_t cap) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    if (why) snprintf(why, cap, "%s", e ? e : "dlopen failed");
    return NULL;
  }
  fused_fn_t fn = (fused_fn_t)dlsym(h, "tpu_fused");
  if (!fn) {
    if (why) snprintf(why, cap, "%.200s has no symbol tpu_fused", path);
    dlclose(h);
    return NULL;
  }
  tpu_cache_tier1_put(key, (void*)fn);
  return fn;
}

/* A tier-2/3 entry for key, loaded; an entry that verifies but does not load
 * (written by a broken compiler) is deleted so it is compiled again. */
static fused_fn_t load_cached(const char* key) {
  char path[4096];
  int tier = 0;
  if (!tpu_cache_find(key, path, sizeof path, &tier)) return NULL;
  fused_fn_t fn = load_path(key, path, NULL, 0);
  if (!fn) tpu_cache_drop(key);
  return fn;
}

/* TORCH_TPU_COMPILE_TIMEOUT_S: the longest one compile may run (and the
 * longest a process waits for another one's compile of the same key);
 * 0 or less: no limit. */
static int64_t compile_timeout_ms(void) {
  static _Atomic int64_t cached = -2;
  int64_t v = atomic_load(&cached);
  if (v == -2) {
    const double s = tpu_env_double("TORCH_TPU_COMPILE_TIMEOUT_S", 120);
    v = s > 0 ? (int64_t)(s * 1000 + 0.5) : -1;
    atomic_store(&cached, v);
  }
  return v;
}

/* The directory for temporary compile directories: $TMPDIR when it is an
 * absolute path that leaves room for our names, else /tmp. */
static const char* tmp_root(void) {
  const char* t = tpu_env_str("TMPDIR");
  return t && t[0] == '/' && strlen(t) < 3000 ? t : "/tmp";
}

#define CC_DIR_PREFIX "torch_tpu_cc_"

/* Removes what a dead process left under tmp_root(): directories named
 * torch_tpu_cc_<pid>_XXXXXX owned by us whose pid no longer runs. */
static int remove_entry(const char* path, const struct stat* st, int flag, struct FTW* ftw) {
  (void)st;
  (void)ftw;
  if (flag == FTW_DP) rmdir(path);
  else unlink(path);
  return 0;
}

static void clean_stale_dirs(void) {
  const char* root = tmp_root();
  DIR* d = opendir(root);
  if (!d) return;
  struct dirent* ent;
  while ((ent = readdir(d)) != NULL) {
    const char* name = ent->d_name;
    if (strncmp(name, CC_DIR_PREFIX, strlen(CC_DIR_PREFIX)) != 0) continue;
    const char* p = name + strlen(CC_DIR_PREFIX);
    char* end = NULL;
    long pid = strtol(p, &end, 10);
    if (end == p || *end != '_' || pid <= 0 || strlen(end + 1) != 6) continue;
    if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", root, name);
    struct stat st;
    if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()) continue;
    nftw(path, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
  }
  closedir(d);
}

/* Splits TORCH_TPU_CC (default "cc") and the flags at blanks into argv
 * (no shell quoting: a word is a run of non-blank characters). */
static int split_words(char* s, const char** argv, int cap) {
  int n = 0;
  for (char* p = s; *p;) {
    while (*p == ' ' || *p == '\t') *p++ = 0;
    if (!*p) break;
    if (n == cap) return -1;
    argv[n++] = p;
    while (*p && *p != ' ' && *p != '\t') p++;
  }
  return n;
}

/* Writes len bytes of text to a new file at path. */
static bool write_file(const char* path, const char* text, size_t len) {
  FILE* f = fopen(path, "wb");
  if (!f) return false;
  bool ok = fwrite(text, 1, len, f) == len;
  return fclose(f) == 0 && ok;
}

/* The first line of the compiler's output (for the warning). */
static void first_line(const char* path, char* out, size_t cap) {
  out[0] = 0;
  FILE* f = fopen(path, "r");
  if (!f) return;
  if (fgets(out, (int)cap, f)) out[strcspn(out, "\r\n")] = 0;
  fclose(f);
}

/* Compiles src under key (caller checked the tiers); NULL on failure. */
static fused_fn_t compile_now(const char* key, const char* src) {
  static pthread_once_t clean_once = PTHREAD_ONCE_INIT;
  pthread_once(&clean_once, clean_stale_dirs);
  if (g_compiler_broken) return NULL;
  int64_t timeout = compile_timeout_ms();
  /* A holder that died released the lock; one whose compile hangs holds it
   * until its own timeout: wait that long, then compile without it
   * (publishing is atomic, the lock only saves duplicate work). */
  int lock = tpu_cache_lock_wait(key, timeout > 0 ? timeout + 1000 : -1);
  fused_fn_t fn = NULL;
  if ((fn = load_cached(key))) goto done; /* another process made it */
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/" CC_DIR_PREFIX "%ld_XXXXXX", tmp_root(), (long)getpid());
  if (!mkdtemp(dir)) {
    note_compiler_failure("cannot create a temporary directory");
    goto done;
  }
  char cpath[4200], sopath[4200], errpath[4200];
  snprintf(cpath, sizeof cpath, "%s/k.c", dir);
  snprintf(sopath, sizeof sopath, "%s/k.so", dir);
  snprintf(errpath, sizeof errpath, "%s/err.txt", dir);
  /* the guard's clean-up list: the embedded headers, the source, the
   * library, the log, then the directory */
  enum { MAX_HDRS = 8 };
  char hpaths[MAX_HDRS][4200];
  const char* remove[MAX_HDRS + 5];
  int nrm = 0;
  if (tpu_fuse_nheaders > MAX_HDRS) {
    note_compiler_failure("too many embedded headers");
    rmdir(dir);
    goto done;
  }
  for (int i = 0; i < tpu_fuse_nheaders; i++) {
    snprintf(hpaths[i], sizeof hpaths[i], "%s/%s", dir, tpu_fuse_headers[i].name);
    remove[nrm++] = hpaths[i];
  }
  remove[nrm++] = cpath;
  remove[nrm++] = sopath;
  remove[nrm++] = errpath;
  remove[nrm++] = dir;
  remove[nrm] = NULL;
  for (int i = 0; i < tpu_fuse_nheaders; i++) {
    if (!write_file(hpaths[i], tpu_fuse_headers[i].text, tpu_fuse_headers[i].len)) {
      note_compiler_failure("cannot write the embedded headers");
      goto cleanup;
    }
  }
  FILE* f = fopen(cpath, "w");
  if (!f) {
    note_compiler_failure("cannot write the generated source");
    rmdir(dir);
    goto done;
  }
  bool wrote = fputs(src, f) >= 0;
  if (fclose(f) != 0 || !wrote) {
    note_compiler_failure("cannot write the generated source");
    goto cleanup;
  }
  char words[4096];
  snprintf(words, sizeof words, "%s %s", cc_command(), cc_flags());
  const char* argv[96];
  int n = split_words(words, argv, 96 - 7);
  if (n <= 0) {
    note_compiler_failure("TORCH_TPU_CC has too many words");
    goto cleanup;
  }
  argv[n++] = "-I";
  argv[n++] = dir; /* the embedded headers, written there above */
  argv[n++] = "-o";
  argv[n++] = sopath;
  argv[n++] = cpath;
  argv[n] = NULL;
  int64_t t0 = tpu_now_ns();
  tpu_subprocess_result_t res;
  tpu_status_t st = tpu_subprocess_run(argv, errpath, timeout, remove, &res);
  tpu_cache_note_compile(1e-9 * (double)(tpu_now_ns() - t0));
  char why[700], line[200];
  if (st) {
    snprintf(why, sizeof why, "the C compiler cannot be run: %s; set TORCH_TPU_CC",
             tpu_status_message(st));
    tpu_status_free(st);
    note_compiler_failure(why);
  } else if (res.timed_out) {
    snprintf(why, sizeof why,
             "the C compiler '%.100s' timed out after %.1f s and was killed with its process "
             "group; TORCH_TPU_COMPILE_TIMEOUT_S sets the limit",
             argv[0], 1e-3 * (double)timeout);
    note_compiler_failure(why);
  } else if (!res.exited || res.code != 0) {
    first_line(errpath, line, sizeof line);
    snprintf(why, sizeof why, "the C compiler '%.100s' %s %d%s%.200s; set TORCH_TPU_CC", argv[0],
             res.exited ? "failed with exit status" : "was killed by signal", res.code,
             line[0] ? ": " : "", line);
    note_compiler_failure(why);
  } else {
    char pub[4096], err[300] = "";
    st = tpu_cache_publish(key, sopath, pub, sizeof pub);
    if (!st) fn = load_path(key, pub, err, sizeof err);
    else snprintf(err, sizeof err, "%s", tpu_status_message(st));
    tpu_status_free(st);
    if (!fn) {
      tpu_cache_drop(key); /* never leave an unloadable entry for the next process */
      snprintf(why, sizeof why, "the C compiler '%.100s' produced a library that does not load: "
               "%.300s; set TORCH_TPU_CC", argv[0], err);
      note_compiler_failure(why);
    }
  }
cleanup:
  nftw(dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS);
done:
  if (lock >= 0) tpu_cache_unlock(lock);
  return fn;
}

/* Background compiler: one thread, a queue of (key, source). */
typedef struct job {
  struct job* next;
  char key[33];
  char* src;
  int64_t due_ns; /* not started before this (CLOCK_MONOTONIC) */
} job_t;
static pthread_mutex_t g_job_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_job_cv = PTHREAD_COND_INITIALIZER;
static pthread_cond_t g_idle_cv = PTHREAD_COND_INITIALIZER;
static job_t* g_jobs;
static int g_busy;
static bool g_thread_started;
static int g_waiters; /* threads in tpu_fusion_wait_compiles: start jobs at once */

/* A job starts this long after it was queued (TORCH_TPU_COMPILE_DELAY_MS):
 * a process's first steps, which queue every compile, then run at full
 * speed on every core, and the compiles follow at a low priority. */
static int64_t compile_delay_ns(void) {
  static _Atomic int64_t cached = -1;
  int64_t v = atomic_load(&cached);
  if (v < 0) {
    v = tpu_env_int("TORCH_TPU_COMPILE_DELAY_MS", 1000) * 1000000;
    if (v < 0) v = 0;
    atomic_store(&cached, v);
  }
  return v;
}


static void* compiler_main(void* arg) {
  (void)arg;
  /* low priority (inherited by the compiler processes): the steps keep most
   * of their cores. Not the lowest: on a machine whose cores the steps keep
   * busy (2 cores, a training loop) nice 19 starves the compiles for good. */
  if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10) != 0) { /* best effort */
  }
  pthread_mutex_lock(&g_job_mu);
  for (;;) {
    while (!g_jobs) pthread_cond_wait(&g_job_cv, &g_job_mu);
    int64_t wait = g_jobs->due_ns - tpu_now_ns();
    if (wait > 0 && !g_waiters) { /* not due yet: sleep until it is (or a waiter comes) */
      struct timespec until;
      clock_gettime(CLOCK_REALTIME, &until);
      int64_t ns = until.tv_nsec + wait;
      until.tv_sec += ns / 1000000000;
      until.tv_nsec = ns % 1000000000;
      pthread_cond_timedwait(&g_job_cv, &g_job_mu, &until);
      continue;
    }
    job_t* j = g_jobs;
    g_jobs = j->next;
    g_busy++;
    pthread_mutex_unlock(&g_job_mu);
    if (!tpu_cache_tier1_get(j->key)) compile_now(j->key, j->src);
    free(j->src);
    free(j);
    pthread_mutex_lock(&g_job_mu);
    g_busy--;
    if (!g_jobs && !g_busy) pthread_cond_broadcast(&g_idle_cv);
  }
  return NULL;
}

static bool in_flight(const char* key) {
  for (job_t* j = g_jobs; j; j = j->next)
    if (!strcmp(j->key, key)) return true;
  return false;
}

static void compile_later(const char* key, const char* src) {
  pthread_mutex_lock(&g_job_mu);
  if (!in_flight(key)) {
    job_t* j = calloc(1, sizeof *j);
    char* s = strdup(src);
    if (j && s) {
      memcpy(j->key, key, 33);
      j->src = s;
      j->due_ns = tpu_now_ns() + compile_delay_ns();
      job_t** tail = &g_jobs;
      while (*tail) tail = &(*tail)->next;
      *tail = j;
      if (!g_thread_started) {
        pthread_t t;
        if (pthread_create(&t, NULL, compiler_main, NULL) == 0) {
          pthread_detach(t);
          g_thread_started = true;
        }
      }
      pthread_cond_signal(&g_job_cv);
    } else {
      free(j);
      free(s);
    }
  }
  pthread_mutex_unlock(&g_job_mu);
}

void tpu_fusion_wait_compiles(void) {
  pthread_mutex_lock(&g_job_mu);
  g_waiters++;
  pthread_cond_signal(&g_job_cv); /* a delayed job starts now */
  while (g_jobs || g_busy) pthread_cond_wait(&g_idle_cv, &g_job_mu);
  g_waiters--;
  pthread_mutex_unlock(&g_job_mu);
}

/* The executable for src: tier 1, then tiers 2/3, else compile (now or in
 * the background); NULL when it is not available for this run. */
static fused_fn_t executable_for(const char* src, char key[33]) {
  key_of(src, key);
  fused_fn_t fn = (fused_fn_t)tpu_cache_tier1_get(key);
  if (fn) return fn;
  if ((fn = load_cached(key))) return fn;
  tpu_cache_note_miss();
  if (g_compiler_broken) return NULL;
  if (g_async) {
    compile_later(key, src);
    return NULL;
  }
  return compile_now(key, src);
}

/* Signature -> executable memo in front of the cache (no source, no key
 * hashing on a hit). */
#define MEMO_SIZE 4096
static struct {
  uint64_t sig;
  fused_fn_t fn;
  char key[33];
} g_memo[MEMO_SIZE];
static pthread_mutex_t g_memo_mu = PTHREAD_MUTEX_INITIALIZER;

static fused_fn_t memo_get(uint64_t sig) {
  fused_fn_t fn = NULL;
  char key[33] = {0};
  pthread_mutex_lock(&g_memo_mu);
  for (int i = 0; i < 8; i++) {
    size_t k = (sig + (uint64_t)i) & (MEMO_SIZE - 1);
    if (g_memo[k].sig == sig && g_memo[k].fn) {
      fn = g_memo[k].fn;
      memcpy(key, g_memo[k].key, 33);
      break;
    }
  }
  pthread_mutex_unlock(&g_memo_mu);
  if (fn && !tpu_cache_tier1_get(key)) fn = NULL; /* tier 1 was cleared */
  return fn;
}

static void memo_put(uint64_t sig, const char* key, fused_fn_t fn) {
  pthread_mutex_lock(&g_memo_mu);
  size_t slot = sig & (MEMO_SIZE - 1);
  for (int i = 0; i < 8; i++) {
    size_t k = (sig + (uint64_t)i) & (MEMO_SIZE - 1);
    if (!g_memo[k].fn || g_memo[k].sig == sig) {
      slot = k;
      break;
    }
  }
  g_memo[slot].sig = sig;
  g_memo[slot].fn = fn;
  memcpy(g_memo[slot].key, key, 33);
  pthread_mutex_unlock(&g_memo_mu);
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
    if (!(kind == G_ROWS ? build_row_group(gr, &g, pass == 1) : build_group(gr, &g, pass == 1)))
      break;
    if (pass == 0) {
      if ((g.fn = memo_get(g.sig))) break;
      group_free(&g);
      continue;
    }
    char key[33];
    if ((g.fn = executable_for(g.src, key))) memo_put(g.sig, key, g.fn);
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

/* Forms row groups: each row reduction with the elementwise nodes over its
 * rows among the ROW_WINDOW nodes before it (others in between must not
 * touch what those write, or write what they read: the group runs at its
 * last node) and the consecutive ones after it. */
static void plan_rows(tpu_graph_t* gr, tpu_fusion_plan_t** pp, bool* taken, int* idx) {
  int bound = 0; /* nodes before it belong to earlier row groups' windows */
  bool mem[ROW_WINDOW];
  for (int j = 0; j < gr->n; j++) {
    int64_t R, L;
    if (taken[j] || row_reduction(gr->nodes[j], &R, &L) == RED_NONE) continue;
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
    int e = j + 1;
    while (e < gr->n && e - j <= ROW_WINDOW && !taken[e] && row_elementwise(gr->nodes[e], R, L))
      e++;
    int cnt = 0;
    for (int p = lo; p < j; p++)
      if (mem[p - lo]) idx[cnt++] = p;
    idx[cnt++] = j;
    for (int p = j + 1; p < e; p++) idx[cnt++] = p;
    if (cnt < 2) continue;
    if (!add_group_kind(gr, pp, idx, cnt, e - 1, R * L, G_ROWS, R, L)) continue;
    for (int k = 0; k < cnt; k++) taken[idx[k]] = true;
    bound = e;
    j = e - 1;
  }
}

/* ---- matmul epilogues ----
 * mm / addmm with a float32 2-D contiguous product, followed by a chain of
 * elementwise nodes over its elements (bias add, activation, residual): the
 * library GEMM runs on blocks of rows and the chain's generated kernel runs
 * on each block right after it, while the block is in cache. A product
 * that nothing else needs goes to a scratch block and never gets memory. */
static bool mm_node(const tpu_call_t* c, int64_t* M, int64_t* N) {
  const char* n = c->op->name;
  int a1;
  if (!strcmp(n, "mm")) a1 = 0;
  else if (!strcmp(n, "addmm")) a1 = 1;
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
  if (!g_epilogues || taken[i] || !mm_node(gr->nodes[i], &M, &N)) return i;
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
  pthread_once(&g_cfg_once, read_config);
  *out_plan = NULL;
  if (!g_enabled || gr->n < 2) return TPU_OK;
  tpu_fusion_plan_t* p = NULL;
  int* idx = malloc(sizeof(int) * (size_t)gr->n);
  bool* taken = calloc((size_t)gr->n, sizeof(bool));
  if (!idx || !taken) { /* no fusion: every node runs its kernel */
    free(idx);
    free(taken);
    return TPU_OK;
  }
  if (g_rows) plan_rows(gr, &p, taken, idx);
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

typedef struct {
  const group_t* g;
  const float* const* in;
  float* const* out;
  int64_t grain;
} grun_t;

static void group_chunks(void* ctx, int64_t b, int64_t e) {
  grun_t* r = ctx;
  int64_t lo = b * r->grain, hi = e * r->grain;
  if (hi > r->g->n) hi = r->g->n;
  r->g->fn(r->in, r->out, r->g->scalars, lo, hi);
}

typedef struct {
  const group_t* g;
  const void* const* in;
  void* const* out;
  const int64_t* per;
  int64_t grain;
  _Atomic int oom;
} rrun_t;

static void row_chunks(void* ctx, int64_t b, int64_t e) {
  rrun_t* r = ctx;
  int64_t lo = b * r->grain, hi = e * r->grain;
  if (hi > r->g->rows) hi = r->g->rows;
  if (((rows_fn_t)(void*)r->g->fn)(r->in, r->out, r->g->scalars, lo, hi, r->g->len, r->per))
    atomic_store(&r->oom, 1);
}

static tpu_status_t run_row_group(const group_t* g) {
  const void** in = malloc(sizeof(void*) * (size_t)(g->nbufs + 1));
  void** out = malloc(sizeof(void*) * (size_t)(g->nout + 1));
  int64_t* per = malloc(sizeof(int64_t) * (size_t)(g->nbufs + 1));
  tpu_status_t st = TPU_OK;
  if (!in || !out || !per) {
    st = TPU_ERR(RESOURCE_EXHAUSTED, "fused row kernel: out of host memory");
    goto done;
  }
  for (int k = 0; k < g->nbufs; k++) {
    const gbuf_t* b = &g->bufs[k];
    in[k] = b->t->data;
    per[k] = b->per > 0 ? b->per : g->rows;
    if (b->out_slot >= 0) out[b->out_slot] = b->t->data;
  }
  rrun_t r = {g, in, (void* const*)out, per, (1 << 14) / g->len, 0};
  if (r.grain < 1) r.grain = 1;
  tpu_parallel_for((g->rows + r.grain - 1) / r.grain, 1, row_chunks, &r);
  if (atomic_load(&r.oom))
    st = TPU_ERR(RESOURCE_EXHAUSTED, "fused row kernel: out of host memory for %" PRId64
                 " rows of %" PRId64, g->rows, g->len);
done:
  free(in);
  free(out);
  free(per);
  return st;
}

/* The product in blocks of rows, each followed by the epilogue on it. */
static tpu_status_t run_mm_group(const group_t* g) {
  const tpu_call_t* mm = g->mm;
  const bool add = mm->op->name[0] == 'a';
  const int a1 = add ? 1 : 0;
  const int64_t M = g->rows, N = g->len;
  int64_t rb = ((int64_t)1 << 16) / N; /* rows per block: about 256 KiB of product */
  if (rb < 256) rb = 256; /* smaller blocks cost the GEMM more than the epilogue saves */
  rb = (rb + 7) / 8 * 8;
  if (g_epi_rows > 0) rb = g_epi_rows;
  if (rb > M) rb = M;
  const gbuf_t* pb = &g->bufs[g->mm_buf];
  float* scratch = NULL;
  if (pb->internal && !(scratch = malloc(sizeof(float) * (size_t)(rb * N))))
    return TPU_ERR(RESOURCE_EXHAUSTED, "%s epilogue: out of host memory for %" PRId64 " x %" PRId64,
                   mm->op->name, rb, N);
  const float** in = malloc(sizeof(float*) * (size_t)g->nbufs);
  float** out = malloc(sizeof(float*) * (size_t)(g->nout + 1));
  tpu_arg_t* args = malloc(sizeof(tpu_arg_t) * (size_t)mm->nargs);
  tpu_status_t st = TPU_OK;
  if (!in || !out || !args) {
    st = TPU_ERR(RESOURCE_EXHAUSTED, "%s epilogue: out of host memory", mm->op->name);
    goto done;
  }
  memcpy(args, mm->args, sizeof(tpu_arg_t) * (size_t)mm->nargs);
  const tpu_tensor_t* x = tpu_arg_tensor(mm, a1);
  const tpu_tensor_t* bias = add ? tpu_arg_tensor(mm, 0) : NULL;
  const bool slice_bias = bias && bias->ndim == 2 && bias->sizes[0] == M && M > 1;
  for (int64_t r0 = 0; r0 < M && !st; r0 += rb) {
    const int64_t nr = M - r0 < rb ? M - r0 : rb;
    tpu_tensor_t xs = *x, os = mm->outs[0], bs;
    xs.sizes[0] = nr;
    xs.data = (char*)x->data + r0 * x->strides[0] * (int64_t)sizeof(float);
    os.sizes[0] = nr;
    os.data = scratch ? (void*)scratch : (void*)((float*)mm->outs[0].data + r0 * N);
    args[a1].v.t = &xs;
    if (slice_bias) {
      bs = *bias;
      bs.sizes[0] = nr;
      bs.data = (char*)bias->data + r0 * bias->strides[0] * (int64_t)tpu_dtype_size(bias->dtype);
      args[0].v.t = &bs;
    }
    tpu_call_t c = *mm;
    c.args = args;
    c.outs = &os;
    st = tpu_call_run(&c);
    if (st) break;
    for (int k = 0; k < g->nbufs; k++) {
      const gbuf_t* b = &g->bufs[k];
      float* base = b->t->data;
      if (k == g->mm_buf) base = os.data;
      else if (b->kind == IN_FULL) base += r0 * N;
      in[k] = base;
      if (b->out_slot >= 0) out[b->out_slot] = base;
    }
    group_t blk = *g;
    blk.n = nr * N;
    grun_t r = {&blk, in, out, 1 << 14};
    tpu_parallel_for((blk.n + r.grain - 1) / r.grain, 1, group_chunks, &r);
  }
done:
  free(scratch);
  free(in);
  free(out);
  free(args);
  return st;
}

static tpu_status_t run_flat_group(const group_t* g);

/* Runs one group, timed into its kind's profile entry. */
static tpu_status_t run_group(const group_t* g) {
  int64_t stamp = tpu_profile_begin();
  tpu_status_t st;
  int kind;
  if (g->kind == G_ROWS) {
    st = run_row_group(g);
    kind = 1;
  } else if (g->kind == G_MM) {
    st = run_mm_group(g);
    kind = 2;
  } else {
    st = run_flat_group(g);
    kind = 0;
  }
  tpu_profile_end(tpu_op_count() + kind, stamp);
  return st;
}

/* An elementwise group over its whole element range. */
static tpu_status_t run_flat_group(const group_t* g) {
  const float* in_s[64];
  float* out_s[64];
  const float** in = g->nbufs <= 64 ? in_s : malloc(sizeof(float*) * (size_t)g->nbufs);
  float** out = g->nout <= 64 ? out_s : malloc(sizeof(float*) * (size_t)(g->nout ? g->nout : 1));
  if (!in || !out) {
    if (in != in_s) free(in);
    if (out != out_s) free(out);
    return TPU_ERR(RESOURCE_EXHAUSTED, "fused kernel: out of host memory");
  }
  for (int k = 0; k < g->nbufs; k++) {
    const gbuf_t* b = &g->bufs[k];
    in[k] = b->t->data;
    if (b->out_slot >= 0) out[b->out_slot] = b->t->data;
  }
  grun_t r = {g, in, out, 1 << 14};
  int64_t chunks = (g->n + r.grain - 1) / r.grain;
  tpu_parallel_for(chunks, 1, group_chunks, &r);
  if (in != in_s) free(in);
  if (out != out_s) free(out);
  return TPU_OK;
}

tpu_status_t tpu_fusion_plan_run(const tpu_fusion_plan_t* p, const tpu_graph_t* gr,
                                 const char** failed_op) {
  tpu_status_t first = TPU_OK;
  int next = 0; /* next group */
  for (int i = 0; i < gr->n; i++) {
    const char* op = gr->nodes[i]->op->name;
    while (p && next < p->ngroups && p->groups[next].trigger == i) {
      tpu_status_t st = run_group(&p->groups[next++]);
      if (st && !first) {
        first = st;
        *failed_op = op;
      } else {
        tpu_status_free(st);
      }
    }
    if (p && p->fused[i]) continue;
    tpu_status_t st = tpu_call_run(gr->nodes[i]);
    if (st && !first) {
      first = st;
      *failed_op = op;
    } else {
      tpu_status_free(st);
    }
  }
  return first;
}
