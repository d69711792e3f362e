/* Graph execution, printing, verification and the repeated-sequence
 * detector (see graph.h). */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "exec/graph.h"

/* ---- execution ---- */
typedef struct {
  tpu_graph_t g;
} graph_work_t;

static void graph_free(void* ctx) {
  graph_work_t* w = ctx;
  for (int i = 0; i < w->g.n; i++) free(w->g.nodes[i]);
  free(w->g.nodes);
  tpu_fusion_plan_free(w->g.plan);
  free(w);
}

static tpu_status_t graph_run(void* ctx) {
  graph_work_t* w = ctx;
  const char* failed = NULL;
  tpu_status_t st = tpu_fusion_plan_run(&w->g, &failed);
  if (st) {
    char prefix[160];
    snprintf(prefix, sizeof prefix, "aten::%s (in a DeferAndFuse graph)", failed ? failed : "?");
    return tpu_status_annotate(st, prefix);
  }
  return TPU_OK;
}

static pthread_mutex_t g_dump_mu = PTHREAD_MUTEX_INITIALIZER;
static char* g_dump_dir;
static int g_dump_seq;

tpu_status_t tpu_graph_enqueue(tpu_graph_t* g, tpu_stream_t* s) {
  pthread_mutex_lock(&g_dump_mu);
  if (g_dump_dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/graph_%05d.stablehlo.mlir", g_dump_dir, g_dump_seq++);
    FILE* f = fopen(path, "w");
    if (f) {
      tpu_graph_print(g, f);
      fclose(f);
    }
  }
  pthread_mutex_unlock(&g_dump_mu);
  graph_work_t* w = malloc(sizeof *w);
  if (!w) {
    for (int i = 0; i < g->n; i++) free(g->nodes[i]);
    free(g->nodes);
    tpu_fusion_plan_free(g->plan);
    return TPU_ERR(RESOURCE_EXHAUSTED, "out of host memory queueing a graph");
  }
  w->g = *g;
  g->nodes = NULL;
  g->plan = NULL;
  return tpu_stream_enqueue_raw(s, "graph", graph_run, w, graph_free);
}

tpu_status_t tpu_trace_set_dump_dir(const char* dir) {
  char* copy = NULL;
  if (dir && *dir) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
      return TPU_ERR(INVALID_ARGUMENT, "dump_graphs: cannot create directory '%s'", dir);
    copy = strdup(dir);
  }
  pthread_mutex_lock(&g_dump_mu);
  free(g_dump_dir);
  g_dump_dir = copy;
  pthread_mutex_unlock(&g_dump_mu);
  return TPU_OK;
}

void tpu_graph_init_dump_from_env(void) {
  const char* d = getenv("TORCH_TPU_DUMP_GRAPHS");
  if (d && *d) tpu_status_free(tpu_trace_set_dump_dir(d));
}

/* ---- printer ---- */
/* Values are buffers: a tensor argument names the value last written at its
 * address with its geometry; a write makes a new value. */
typedef struct {
  const void* data;
  tpu_dtype_t dt;
  int ndim;
  int64_t sizes[TPU_MAX_DIMS], strides[TPU_MAX_DIMS];
  int id;
} pval_t;

typedef struct {
  pval_t* v;
  int n, cap, next_id, nargs;
} pvals_t;

static bool same_view(const pval_t* v, const tpu_tensor_t* t) {
  return v->data == t->data && v->dt == t->dtype && v->ndim == t->ndim &&
         !memcmp(v->sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim) &&
         !memcmp(v->strides, t->strides, sizeof(int64_t) * (size_t)t->ndim);
}

static int pval_find(pvals_t* ps, const tpu_tensor_t* t) {
  for (int i = ps->n - 1; i >= 0; i--)
    if (same_view(&ps->v[i], t)) return i;
  return -1;
}

static int pval_new(pvals_t* ps, const tpu_tensor_t* t, bool arg) {
  if (ps->n == ps->cap) {
    int cap = ps->cap ? 2 * ps->cap : 64;
    pval_t* v = realloc(ps->v, sizeof(pval_t) * (size_t)cap);
    if (!v) return -1;
    ps->v = v;
    ps->cap = cap;
  }
  pval_t* v = &ps->v[ps->n++];
  v->data = t->data;
  v->dt = t->dtype;
  v->ndim = t->ndim;
  memcpy(v->sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
  memcpy(v->strides, t->strides, sizeof(int64_t) * (size_t)t->ndim);
  v->id = arg ? -(++ps->nargs) : ps->next_id++;
  return ps->n - 1;
}

static const char* mlir_type(tpu_dtype_t dt) {
  switch (dt) {
    case TPU_F32: return "f32";
    case TPU_F64: return "f64";
    case TPU_F16: return "f16";
    case TPU_BF16: return "bf16";
    case TPU_I64: return "i64";
    case TPU_I32: return "i32";
    case TPU_I16: return "i16";
    case TPU_I8: return "i8";
    case TPU_U8: return "ui8";
    case TPU_BOOL: return "i1";
    default: return "none";
  }
}

static void print_type(FILE* f, const tpu_tensor_t* t) {
  fputs("tensor<", f);
  for (int d = 0; d < t->ndim; d++) fprintf(f, "%" PRId64 "x", t->sizes[d]);
  fprintf(f, "%s>", mlir_type(t->dtype));
}

static void print_value(FILE* f, pvals_t* ps, const tpu_tensor_t* t) {
  if (t->flags & TPU_TENSOR_CPU_SCALAR) {
    fprintf(f, "%%cst_%g", tpu_tensor_get_f64(t, 0));
    return;
  }
  int k = pval_find(ps, t);
  if (k < 0) k = pval_new(ps, t, true);
  if (k < 0) {
    fputs("%?", f);
    return;
  }
  if (ps->v[k].id < 0) fprintf(f, "%%arg%d", -ps->v[k].id - 1);
  else fprintf(f, "%%%d", ps->v[k].id);
}

/* ATen base names with a direct StableHLO elementwise counterpart. */
static const char* stablehlo_name(const char* op) {
  static const struct {
    const char *aten, *hlo;
  } map[] = {{"add", "stablehlo.add"},     {"sub", "stablehlo.subtract"},
             {"mul", "stablehlo.multiply"}, {"div", "stablehlo.divide"},
             {"neg", "stablehlo.negate"},   {"exp", "stablehlo.exponential"},
             {"log", "stablehlo.log"},      {"tanh", "stablehlo.tanh"},
             {"sqrt", "stablehlo.sqrt"},    {"rsqrt", "stablehlo.rsqrt"},
             {"abs", "stablehlo.abs"},      {"maximum", "stablehlo.maximum"},
             {"minimum", "stablehlo.minimum"}, {"mm", "stablehlo.dot_general"},
             {"bmm", "stablehlo.dot_general"}, {"copy", "stablehlo.convert"},
             {"sigmoid", "stablehlo.logistic"}, {"where", "stablehlo.select"},
             {"convolution", "stablehlo.convolution"}};
  size_t len = strcspn(op, ".");
  if (len && op[len - 1] == '_') len--; /* in-place variant */
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
    if (strlen(map[i].aten) == len && !strncmp(map[i].aten, op, len)) return map[i].hlo;
  return NULL;
}

static void print_attrs(FILE* f, const tpu_call_t* c) {
  bool first = true;
  for (int i = 0; i < c->nargs; i++) {
    const tpu_arg_t* a = &c->args[i];
    if (a->kind == TPU_ARG_TENSOR || a->kind == TPU_ARG_TENSORLIST || a->kind == TPU_ARG_NONE)
      continue;
    fprintf(f, "%s", first ? " {" : ", ");
    first = false;
    fprintf(f, "arg%d = ", i);
    switch (a->kind) {
      case TPU_ARG_INT: fprintf(f, "%" PRId64 " : i64", a->v.i); break;
      case TPU_ARG_DOUBLE: fprintf(f, "%.9g : f64", a->v.d); break;
      case TPU_ARG_BOOL: fputs(a->v.b ? "true" : "false", f); break;
      case TPU_ARG_STRING: fprintf(f, "\"%s\"", a->v.s); break;
      case TPU_ARG_INTLIST:
        fputs("array<i64", f);
        for (int k = 0; k < a->n; k++) fprintf(f, "%s %" PRId64, k ? "," : ":", a->v.ilist[k]);
        fputs(">", f);
        break;
      case TPU_ARG_DOUBLELIST:
        fputs("array<f64", f);
        for (int k = 0; k < a->n; k++) fprintf(f, "%s %.9g", k ? "," : ":", a->v.dlist[k]);
        fputs(">", f);
        break;
      case TPU_ARG_BOOLLIST:
        fputs("array<i1", f);
        for (int k = 0; k < a->n; k++) fprintf(f, "%s %s", k ? "," : ":", a->v.blist[k] ? "true" : "false");
        fputs(">", f);
        break;
      default: fputs("?", f); break;
    }
  }
  if (c->precision != TPU_PRECISION_MEDIUM)
    fprintf(f, "%sprecision = \"%s\"", first ? " {" : ", ",
            c->precision == TPU_PRECISION_HIGH ? "HIGH" : "HIGHEST"), first = false;
  if (!first) fputs("}", f);
}

void tpu_graph_print(const tpu_graph_t* g, FILE* f) {
  pvals_t ps = {0};
  fprintf(f, "// TorchTPU DeferAndFuse graph: %d nodes on tpu:%d\n", g->n, g->device);
  fputs("func.func @main() {\n", f);
  for (int i = 0; i < g->n; i++) {
    const tpu_call_t* c = g->nodes[i];
    /* inputs first, so that arguments get names before outputs shadow them */
    char* buf = NULL;
    size_t len = 0;
    FILE* ins = open_memstream(&buf, &len);
    if (!ins) continue;
    int nin = 0;
    for (int a = 0; a < c->nargs; a++) {
      const tpu_arg_t* x = &c->args[a];
      if (x->kind == TPU_ARG_TENSOR) {
        fputs(nin++ ? ", " : "", ins);
        print_value(ins, &ps, x->v.t);
      } else if (x->kind == TPU_ARG_TENSORLIST) {
        for (int k = 0; k < x->n; k++)
          if (x->v.tlist[k].dtype != TPU_DTYPE_NONE) {
            fputs(nin++ ? ", " : "", ins);
            print_value(ins, &ps, &x->v.tlist[k]);
          }
      }
    }
    fclose(ins);
    fputs("  ", f);
    int nout = 0;
    for (int o = 0; o < c->nouts; o++) {
      if (c->outs[o].dtype == TPU_DTYPE_NONE) continue;
      int k = pval_new(&ps, &c->outs[o], false);
      fprintf(f, "%s%%%d", nout++ ? ", " : "", k >= 0 ? ps.v[k].id : -1);
    }
    fputs(nout ? " = " : "", f);
    const char* hlo = stablehlo_name(c->op->name);
    if (hlo) fprintf(f, "%s %s", hlo, buf ? buf : "");
    else fprintf(f, "stablehlo.custom_call @\"aten::%s\"(%s)", c->op->name, buf ? buf : "");
    free(buf);
    print_attrs(f, c);
    fputs(" : (", f);
    int t = 0;
    for (int a = 0; a < c->nargs; a++)
      if (c->args[a].kind == TPU_ARG_TENSOR) {
        fputs(t++ ? ", " : "", f);
        print_type(f, c->args[a].v.t);
      }
    fputs(") -> (", f);
    t = 0;
    for (int o = 0; o < c->nouts; o++)
      if (c->outs[o].dtype != TPU_DTYPE_NONE) {
        fputs(t++ ? ", " : "", f);
        print_type(f, &c->outs[o]);
      }
    fputs(")\n", f);
  }
  fputs("  return\n}\n", f);
  free(ps.v);
}

/* ---- verifier ---- */
tpu_status_t tpu_graph_verify(const tpu_graph_t* g) {
  for (int i = 0; i < g->n; i++) {
    const tpu_call_t* c = g->nodes[i];
    if (!c->op || !c->op->fn || tpu_op_lookup(c->op->name) != c->op)
      return TPU_ERR(INTERNAL, "graph verify: node %d has no registered op", i);
    if (c->nargs < 0 || c->nouts < 0 || (c->nargs && !c->args) || (c->nouts && !c->outs))
      return TPU_ERR(INTERNAL, "graph verify: node %d (%s) has malformed arguments", i, c->op->name);
    for (int a = 0; a < c->nargs; a++) {
      const tpu_arg_t* x = &c->args[a];
      if (x->kind < TPU_ARG_NONE || x->kind > TPU_ARG_TENSORLIST)
        return TPU_ERR(INTERNAL, "graph verify: %s argument %d has kind %d", c->op->name, a, x->kind);
      if (x->kind == TPU_ARG_TENSOR && !tpu_dtype_is_supported(x->v.t->dtype))
        return TPU_ERR(INTERNAL, "graph verify: %s argument %d has dtype %d", c->op->name, a,
                       x->v.t->dtype);
      if (x->kind == TPU_ARG_TENSOR && (x->v.t->ndim < 0 || x->v.t->ndim > TPU_MAX_DIMS))
        return TPU_ERR(INTERNAL, "graph verify: %s argument %d has %d dims", c->op->name, a,
                       x->v.t->ndim);
    }
    for (int o = 0; o < c->nouts; o++) {
      const tpu_tensor_t* t = &c->outs[o];
      if (t->dtype == TPU_DTYPE_NONE) continue;
      if (!tpu_dtype_is_supported(t->dtype) || t->ndim < 0 || t->ndim > TPU_MAX_DIMS)
        return TPU_ERR(INTERNAL, "graph verify: %s output %d is malformed", c->op->name, o);
      for (int d = 0; d < t->ndim; d++)
        if (t->sizes[d] < 0)
          return TPU_ERR(INTERNAL, "graph verify: %s output %d has size %" PRId64, c->op->name, o,
                         t->sizes[d]);
      if (tpu_tensor_numel(t) && !t->data)
        return TPU_ERR(INTERNAL, "graph verify: %s output %d has no buffer", c->op->name, o);
    }
  }
  return TPU_OK;
}

/* ---- repeated sequences ---- */
static uint32_t name_hash(const char* s) {
  uint32_t h = 2166136261u;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
  return h ? h : 1;
}

enum { REPEAT_MIN = 4, REPEAT_MAX = 1024 }; /* block length in ops */

/* A block is a layer, not a run of one op over a list (foreach segments,
 * which the fusion planner wants whole): it needs `k` different ops. */
static bool distinct_at_least(const uint32_t* h, int n, int k) {
  uint32_t seen[8];
  int m = 0;
  for (int i = 0; i < n && m < k; i++) {
    bool dup = false;
    for (int j = 0; j < m && !dup; j++) dup = seen[j] == h[i];
    if (!dup) seen[m++] = h[i];
  }
  return m >= k;
}

bool tpu_repeat_observe(tpu_repeat_t* r, const char* op) {
  if (r->n >= TPU_REPEAT_HIST / 2) return false; /* the upper half keeps the block */
  r->hist[r->n++] = name_hash(op);
  const int n = r->n;
  if (r->period) { /* a known block: cut when one more has been traced */
    if (n == r->period) {
      /* same ops as the remembered block? (hist was reset at the cut) */
      return memcmp(r->hist, r->hist + TPU_REPEAT_HIST / 2, sizeof(uint32_t) * (size_t)n) == 0;
    }
    if (n > r->period && n >= 2 * REPEAT_MIN) r->period = 0; /* the pattern broke: search again */
    else return false;
  }
  /* the last p ops equal the p before them */
  for (int p = REPEAT_MIN; 2 * p <= n && p <= REPEAT_MAX && p <= TPU_REPEAT_HIST / 2; p++) {
    if (r->hist[n - 1] != r->hist[n - 1 - p]) continue;
    if (memcmp(r->hist + n - p, r->hist + n - 2 * p, sizeof(uint32_t) * (size_t)p) == 0 &&
        distinct_at_least(r->hist + n - p, p, 3)) {
      r->period = p;
      memcpy(r->hist + TPU_REPEAT_HIST / 2, r->hist + n - p, sizeof(uint32_t) * (size_t)p);
      return true;
    }
  }
  return false;
}

void tpu_repeat_reset_window(tpu_repeat_t* r) { r->n = 0; }
