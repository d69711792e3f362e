/* Lowering of user StableHLO kernels (tpu/kernels.h, torch_tpu.kernels): a
 * node whose op carries StableHLO (tpu_op_custom_t) becomes a func.call of the
 * kernel's function, whose definitions the printer appends beside the graph's
 * function (once per kernel). The function takes the node's tensor arguments
 * in schema order (list entries in order) and returns its outputs, then the
 * new values of the arguments it mutates. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "lower/emit.h"

/* Remembers the kernel's definitions for the module (by pointer: an op's
 * text lives as long as the process). */
static void add_function(em_t* e, const char* text) {
  for (int i = 0; i < e->nfns; i++)
    if (e->fns[i] == text) return;
  if (e->nfns == e->cfns) {
    int cap = e->cfns ? 2 * e->cfns : 4;
    const char** v = realloc(e->fns, sizeof(*v) * (size_t)cap);
    if (!v) {
      e->oom = true;
      return;
    }
    e->fns = v;
    e->cfns = cap;
  }
  e->fns[e->nfns++] = text;
}

bool lower_custom_node(em_t* e, const tpu_graph_t* g, int i) {
  const tpu_call_t* c = g->nodes[i];
  const tpu_op_custom_t* cu = tpu_op_custom(c->op);
  if (!cu || !cu->stablehlo || !cu->symbol) return false;
  enum { MAXV = 128 };
  ref_t in[MAXV];
  const tpu_tensor_t* res[MAXV];
  int nin = 0, nres = 0;
  for (int a = 0; a < c->nargs; a++) {
    const tpu_arg_t* x = &c->args[a];
    if (x->kind == TPU_ARG_TENSOR && nin < MAXV) in[nin++] = read_tensor(e, x->v.t);
    else if (x->kind == TPU_ARG_TENSORLIST)
      for (int k = 0; k < x->n && nin < MAXV; k++)
        if (x->v.tlist[k].dtype != TPU_DTYPE_NONE) in[nin++] = read_tensor(e, &x->v.tlist[k]);
  }
  for (int o = 0; o < c->nouts && nres < MAXV; o++)
    if (c->outs[o].dtype != TPU_DTYPE_NONE) res[nres++] = &c->outs[o];
  for (int a = 0; a < c->nargs && a < 64; a++) {
    if (!((c->mutated_args >> a) & 1)) continue;
    const tpu_arg_t* x = &c->args[a];
    if (x->kind == TPU_ARG_TENSOR && nres < MAXV) res[nres++] = x->v.t;
    else if (x->kind == TPU_ARG_TENSORLIST)
      for (int k = 0; k < x->n && nres < MAXV; k++)
        if (x->v.tlist[k].dtype != TPU_DTYPE_NONE) res[nres++] = &x->v.tlist[k];
  }
  add_function(e, cu->stablehlo);
  const int id = e->next;
  if (nres) e->next++;
  FILE* f = e->f;
  fputs("    ", f);
  if (nres == 1) fprintf(f, "%%%d = ", id);
  else if (nres > 1) fprintf(f, "%%%d:%d = ", id, nres);
  fputs("\"func.call\"(", f);
  for (int k = 0; k < nin; k++) {
    if (k) fputs(", ", f);
    pname(f, &in[k]);
  }
  fprintf(f, ") {callee = @%s} : (", cu->symbol);
  for (int k = 0; k < nin; k++) {
    if (k) fputs(", ", f);
    ptype(f, &in[k]);
  }
  fputs(") -> (", f);
  ref_t outs[MAXV];
  for (int k = 0; k < nres; k++) {
    if (k) fputs(", ", f);
    outs[k] = mkref(res[k]->dtype, res[k]->ndim, res[k]->sizes);
    outs[k].id = id;
    outs[k].sub = nres > 1 ? k : -1;
    ptype(f, &outs[k]);
  }
  fputs(")\n", f);
  for (int k = 0; k < nres; k++) {
    const tpu_tensor_t* t = res[k];
    bool vis = true;
    if (t >= c->outs && t < c->outs + c->nouts && g->visible) {
      const int o = (int)(t - c->outs);
      vis = (g->visible[i] >> (o < 31 ? o : 31)) & 1;
    }
    write_tensor(e, t, outs[k], vis);
  }
  return true;
}

void print_custom_functions(const em_t* e, FILE* f) {
  for (int i = 0; i < e->nfns; i++) {
    fputs(e->fns[i], f);
    const size_t n = strlen(e->fns[i]);
    if (n && e->fns[i][n - 1] != '\n') fputc('\n', f);
  }
}
