/* The executor of the host target's fusion: runs a plan over its graph in
 * program order, each group at its trigger node and every node outside the
 * groups through its library kernel. Elementwise groups run in chunks of
 * elements, row groups in chunks of rows, matmul epilogues block by block
 * after the library GEMM on each block of rows; the chunks go to the
 * thread pool. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "device/internal.h"
#include "targets/host/fuse_internal.h"
#include "targets/host/kernels/vecmath.h"
#include "targets/host/kernels/fuse_rows.h"

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
  int64_t grain, blk;
  float* part;
  _Atomic int oom;
} rrun_t;

static void row_chunks(void* ctx, int64_t b, int64_t e) {
  rrun_t* r = ctx;
  int64_t lo = b * r->grain, hi = e * r->grain;
  if (hi > r->g->rows) hi = r->g->rows;
  if (((rows_fn_t)(void*)r->g->fn)(r->in, r->out, r->g->scalars, lo, hi, r->g->len, r->per,
                                   r->blk, r->part))
    atomic_store(&r->oom, 1);
}

/* Column sum k of a row group into dst: its blocks' float partials added in
 * double in block order (acc: len doubles), as the library's layer norm
 * backward adds its weight and bias gradients. */
static void add_col_partials(const float* part, int64_t nblk, int ncols, int k, int64_t len,
                             double* acc, float* dst) {
  for (int64_t i = 0; i < len; i++) acc[i] = 0;
  for (int64_t b = 0; b < nblk; b++) {
    const float* p = part + (b * ncols + k) * len;
    for (int64_t i = 0; i < len; i++) acc[i] += (double)p[i];
  }
  for (int64_t i = 0; i < len; i++) dst[i] = (float)acc[i];
}

static tpu_status_t run_row_group(const group_t* g) {
  const void** in = malloc(sizeof(void*) * (size_t)(g->nbufs + 1));
  void** out = malloc(sizeof(void*) * (size_t)(g->nout + 1));
  int64_t* per = malloc(sizeof(int64_t) * (size_t)(g->nbufs + 1));
  rrun_t r = {g, in, (void* const*)out, per, (1 << 14) / g->len, 1, NULL, 0};
  double* acc = NULL; /* adds the column sums' block partials */
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
  if (r.grain < 1) r.grain = 1;
  int64_t nblk = 0;
  if (g->ncols) { /* chunks of whole blocks, each block's partials its own */
    r.blk = tpu_fr_col_block(g->rows, g->len);
    r.grain = (r.grain + r.blk - 1) / r.blk * r.blk;
    nblk = (g->rows + r.blk - 1) / r.blk;
    r.part = malloc(sizeof(float) * (size_t)(nblk * g->ncols * g->len));
    acc = malloc(sizeof(double) * (size_t)g->len);
    if (!r.part || !acc) {
      st = TPU_ERR(RESOURCE_EXHAUSTED, "fused row kernel: out of host memory for %" PRId64
                   " x %d column sums of %" PRId64, nblk, g->ncols, g->len);
      goto done;
    }
  }
  tpu_parallel_for((g->rows + r.grain - 1) / r.grain, 1, row_chunks, &r);
  if (atomic_load(&r.oom))
    st = TPU_ERR(RESOURCE_EXHAUSTED, "fused row kernel: out of host memory for %" PRId64
                 " rows of %" PRId64, g->rows, g->len);
  for (int k = 0; k < g->nbufs && !st; k++) {
    const gbuf_t* b = &g->bufs[k];
    if (b->col >= 0 && b->out_slot >= 0)
      add_col_partials(r.part, nblk, g->ncols, b->col, g->len, acc, b->t->data);
  }
done:
  free(acc);
  free(r.part);
  free(in);
  free(out);
  free(per);
  return st;
}

/* The product in blocks of rows, each followed by the epilogue on it. */
static tpu_status_t run_mm_group(const group_t* g) {
  const tpu_call_t* mm = g->mm;
  const bool add = mm->op->id == TPU_OPID_addmm;
  const int a1 = add ? 1 : 0;
  const int64_t M = g->rows, N = g->len;
  int64_t rb = ((int64_t)1 << 16) / N; /* rows per block: about 256 KiB of product */
  if (rb < 256) rb = 256; /* smaller blocks cost the GEMM more than the epilogue saves */
  rb = (rb + 7) / 8 * 8;
  const int64_t epi_rows = fuse_config()->epi_rows;
  if (epi_rows > 0) rb = epi_rows;
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
