/* Connectionist temporal classification loss: _ctc_loss (the negative log
 * likelihood of each target under the per-frame label distributions, and the
 * forward variables) and _ctc_loss_backward (the gradient with respect to
 * log_probs).
 *
 * Each sample b aligns its target (length tl) against its first il frames
 * through the extended sequence of 2 * tl + 1 states: blanks at even states,
 * the target labels at odd states. A state may be entered from itself, from
 * the state before it, or by skipping the blank between two different labels.
 * alpha (forward) and beta (backward) run in log space in double; every
 * sample is independent, so samples are spread over the thread pool and the
 * results do not depend on the number of threads.
 *
 * Layouts follow CPU: log_probs (T, N, C); targets (N, S) padded or the
 * 1-D concatenation of all targets; log_alpha (N, T, 2 * max(tl) + 1), with
 * -inf where a sample has no state (CPU leaves those entries unwritten). */
#include <stdlib.h>

#include "kernels.h"

#define OOM(op) TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory", op)


/* log(exp(a) + exp(b) + exp(c)), with -inf when all three are -inf */
static inline double lse3(double a, double b, double c) {
  double m = a;
  if (b > m) m = b;
  if (c > m) m = c;
  if (m == -INFINITY) m = 0;
  return log(exp(a - m) + exp(b - m) + exp(c - m)) + m;
}

static inline double lse2(double a, double b) {
  double m = a > b ? a : b;
  if (m == -INFINITY) m = 0;
  return log(exp(a - m) + exp(b - m)) + m;
}

/* The problem shared by forward and backward, staged on the host. */
typedef struct {
  const char* op;
  int64_t T, N, C, S;     /* frames, batch, classes, max target length */
  int64_t L;              /* states per sample in log_alpha: 2 * S + 1 */
  int64_t blank;
  int64_t *il, *tl, *off; /* per sample: input length, target length, target start */
  int64_t* tg;            /* targets (contiguous int64) */
  double* lp;             /* log_probs (T, N, C) */
} ctc_t;

static void ctc_free(ctc_t* p) {
  free(p->il);
  free(p->tl);
  free(p->off);
  free(p->tg);
  free(p->lp);
}

/* Reads a lengths argument (an int list, or an integral tensor) into n
 * int64 values. */
static tpu_status_t read_lengths(const tpu_call_t* c, int i, const char* what, int64_t n,
                                 int64_t** out) {
  *out = NULL;
  const tpu_arg_t* a = i < c->nargs ? &c->args[i] : NULL;
  int64_t got;
  if (a && a->kind == TPU_ARG_INTLIST) {
    got = a->n;
  } else if (a && a->kind == TPU_ARG_TENSOR) {
    TPU_CHECK_ARG(tpu_dtype_is_integral(a->v.t->dtype, false),
                  "%s must be integral", what);
    got = tpu_tensor_numel(a->v.t);
  } else {
    return TPU_ERR(INVALID_ARGUMENT, "_ctc_loss: expected %s", what);
  }
  TPU_CHECK_ARG(got == n, "%s must be of size batch_size (got %lld values for batch_size %lld)",
                what, (long long)got, (long long)n);
  int64_t* v = malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
  if (!v) return OOM(what);
  if (a->kind == TPU_ARG_INTLIST) {
    if (n) memcpy(v, a->v.ilist, (size_t)n * sizeof(int64_t));
  } else if (n) {
    tpu_tensor_t dst;
    int64_t sz = n;
    tpu_tensor_make_contig(&dst, v, TPU_I64, 1, &sz);
    if (a->v.t->ndim > 1) {
      free(v);
      return TPU_ERR(INVALID_ARGUMENT, "%s must be 0-d or 1-d, got %d dims", what,
                     a->v.t->ndim);
    }
    tpu_tensor_t src = *a->v.t;
    src.ndim = 1;
    src.sizes[0] = n;
    src.strides[0] = a->v.t->ndim ? a->v.t->strides[0] : 1;
    tpu_status_t s = tpu_copy_strided(&dst, &src);
    if (s) {
      free(v);
      return s;
    }
  }
  *out = v;
  return TPU_OK;
}

/* Checks and stages (log_probs, targets, input_lengths, target_lengths,
 * blank) starting at argument a0; the messages are CPU's. */
static tpu_status_t ctc_setup(const tpu_call_t* c, int a0, int blank_arg, ctc_t* p,
                              const char* op) {
  memset(p, 0, sizeof *p);
  p->op = op;
  const tpu_tensor_t* lp = tpu_arg_tensor(c, a0);
  const tpu_tensor_t* tg = tpu_arg_tensor(c, a0 + 1);
  TPU_CHECK_ARG(lp && tg, "%s: expected log_probs and targets tensors", op);
  if (lp->dtype != TPU_F32 && lp->dtype != TPU_F64)
    return TPU_ERR(UNIMPLEMENTED, "\"%s\" not implemented for '%s'", op,
                   tpu_dtype_name(lp->dtype));
  TPU_CHECK_ARG(tg->dtype == TPU_I64 || tg->dtype == TPU_I32,
                "%s: Expected tensor for argument #2 'targets' to have scalar type Long or Int; "
                "but got %s", op, tpu_dtype_name(tg->dtype));
  TPU_CHECK_ARG(lp->ndim == 3, "%s: Expected 3-dimensional tensor, but got %d-dimensional tensor "
                "for argument #1 'log_probs'", op, lp->ndim);
  TPU_CHECK_ARG(tg->ndim == 1 || tg->ndim == 2, "%s: Expected 1 to 2 dimensions, but got "
                "%d-dimensional tensor for argument #2 'targets'", op, tg->ndim);
  p->T = lp->sizes[0];
  p->N = lp->sizes[1];
  p->C = lp->sizes[2];
  p->blank = tpu_arg_i64(c, blank_arg, 0);
  TPU_CHECK_ARG(p->blank >= 0 && p->blank < p->C,
                "%s: blank must be in label range (blank=%lld, num_labels=%lld)", op,
                (long long)p->blank, (long long)p->C);
  tpu_status_t s = read_lengths(c, a0 + 2, "input_lengths", p->N, &p->il);
  if (!s) s = read_lengths(c, a0 + 3, "target_lengths", p->N, &p->tl);
  if (s) {
    ctc_free(p);
    return s;
  }
  p->off = malloc((size_t)(p->N > 0 ? p->N : 1) * sizeof(int64_t));
  if (!p->off) {
    ctc_free(p);
    return OOM(op);
  }
  int64_t pos = 0, maxtl = 0;
  for (int64_t b = 0; b < p->N; b++) {
    if (p->tl[b] < 0) {
      s = TPU_ERR(INVALID_ARGUMENT, "%s: Expected target_lengths to have value at least 0, but "
                  "got value %lld", op, (long long)p->tl[b]);
      break;
    }
    if (p->il[b] < 0 || p->il[b] > p->T) {
      s = TPU_ERR(INVALID_ARGUMENT, "%s: Expected input_lengths to have value at %s %lld, but "
                  "got value %lld", op, p->il[b] < 0 ? "least" : "most",
                  (long long)(p->il[b] < 0 ? 0 : p->T), (long long)p->il[b]);
      break;
    }
    if (p->tl[b] > maxtl) maxtl = p->tl[b];
    if (tg->ndim == 1) {
      p->off[b] = pos;
      pos += p->tl[b];
    } else {
      p->off[b] = b * tg->sizes[1];
    }
  }
  if (!s && tg->ndim == 1 && tg->sizes[0] != pos)
    s = TPU_ERR(INVALID_ARGUMENT, "%s: Expected tensor to have size %lld at dimension 0, but got "
                "size %lld for argument #2 'targets'", op, (long long)pos,
                (long long)tg->sizes[0]);
  if (!s && tg->ndim == 2 && tg->sizes[0] != p->N)
    s = TPU_ERR(INVALID_ARGUMENT, "%s: Expected tensor to have size %lld at dimension 0, but got "
                "size %lld for argument #2 'targets'", op, (long long)p->N,
                (long long)tg->sizes[0]);
  if (!s && tg->ndim == 2 && tg->sizes[1] < maxtl)
    s = TPU_ERR(INVALID_ARGUMENT, "%s: Expected tensor to have size at least %lld at dimension 1, "
                "but got size %lld for argument #2 'targets'", op, (long long)maxtl,
                (long long)tg->sizes[1]);
  if (s) {
    ctc_free(p);
    return s;
  }
  p->S = maxtl;
  p->L = 2 * maxtl + 1;
  p->tg = tpu_stage_f64(tg, true);
  if (!p->tg) {
    ctc_free(p);
    return OOM(op);
  }
  /* CPU reads labels unchecked; here a label outside [0, C) is an error */
  for (int64_t b = 0; b < p->N; b++)
    for (int64_t k = 0; k < p->tl[b]; k++) {
      int64_t y = p->tg[p->off[b] + k];
      if (y < 0 || y >= p->C) {
        s = TPU_ERR(INVALID_ARGUMENT, "%s: target label %lld (sample %lld, position %lld) is "
                    "out of range [0, %lld)", op, (long long)y, (long long)b, (long long)k,
                    (long long)p->C);
        ctc_free(p);
        return s;
      }
    }
  p->lp = tpu_stage_f64(lp, false);
  if (!p->lp) {
    ctc_free(p);
    return OOM(op);
  }
  return TPU_OK;
}

/* label of extended state s of sample b */
static inline int64_t state_label(const ctc_t* p, int64_t b, int64_t s) {
  return (s & 1) ? p->tg[p->off[b] + (s >> 1)] : p->blank;
}

/* log_probs[t, b, k] */
static inline double lpv(const ctc_t* p, int64_t t, int64_t b, int64_t k) {
  return p->lp[(t * p->N + b) * p->C + k];
}

/* ---- forward ---- */

typedef struct {
  const ctc_t* p;
  double* la;  /* (N, T, L), prefilled with -inf */
  double* nll; /* (N) */
} fwd_ctx_t;

static void ctc_forward_range(void* vctx, int64_t b0, int64_t b1) {
  fwd_ctx_t* x = vctx;
  const ctc_t* p = x->p;
  const int64_t L = p->L;
  for (int64_t b = b0; b < b1; b++) {
    const int64_t il = p->il[b], tl = p->tl[b], ns = 2 * tl + 1;
    double* a = x->la + b * p->T * L;
    if (il == 0) {
      x->nll[b] = tl == 0 ? -0.0 : INFINITY;
      continue;
    }
    a[0] = lpv(p, 0, b, p->blank);
    if (tl > 0) a[1] = lpv(p, 0, b, state_label(p, b, 1));
    for (int64_t t = 1; t < il; t++) {
      const double* prev = a + (t - 1) * L;
      double* cur = a + t * L;
      for (int64_t s = 0; s < ns; s++) {
        int64_t k = state_label(p, b, s);
        double a2 = s > 0 ? prev[s - 1] : -INFINITY;
        double a3 = (s > 1 && state_label(p, b, s - 2) != k) ? prev[s - 2] : -INFINITY;
        cur[s] = lse3(prev[s], a2, a3) + lpv(p, t, b, k);
      }
    }
    const double* last = a + (il - 1) * L;
    x->nll[b] = tl == 0 ? -last[0] : -lse2(last[2 * tl], last[2 * tl - 1]);
  }
}

/* _ctc_loss(log_probs, targets, input_lengths, target_lengths, blank,
 * zero_infinity) -> (neg_log_likelihood, log_alpha). zero_infinity only
 * matters to the backward (the composite above zeroes infinite losses). */
tpu_status_t tpu_k_ctc_loss(const tpu_call_t* c) {
  ctc_t p;
  tpu_status_t s = ctc_setup(c, 0, 4, &p, "_ctc_loss");
  if (s) return s;
  const tpu_tensor_t* out_nll = &c->outs[0];
  const tpu_tensor_t* out_la = &c->outs[1];
  int64_t nla = p.N * p.T * p.L;
  if (tpu_tensor_numel(out_nll) != p.N || tpu_tensor_numel(out_la) != nla) {
    ctc_free(&p);
    return TPU_ERR(INVALID_ARGUMENT, "_ctc_loss: outputs have %lld and %lld elements, expected "
                   "%lld and %lld", (long long)tpu_tensor_numel(out_nll),
                   (long long)tpu_tensor_numel(out_la), (long long)p.N, (long long)nla);
  }
  double* la = malloc((size_t)(nla > 0 ? nla : 1) * sizeof(double));
  double* nll = malloc((size_t)(p.N > 0 ? p.N : 1) * sizeof(double));
  if (!la || !nll) {
    free(la);
    free(nll);
    ctc_free(&p);
    return OOM("_ctc_loss");
  }
  for (int64_t i = 0; i < nla; i++) la[i] = -INFINITY;
  fwd_ctx_t x = {&p, la, nll};
  tpu_parallel_for(p.N, 1, ctc_forward_range, &x);
  s = tpu_unstage_f64(out_nll, nll);
  if (!s) s = tpu_unstage_f64(out_la, la);
  free(la);
  free(nll);
  ctc_free(&p);
  return s;
}

/* ---- backward ---- */

typedef struct {
  const ctc_t* p;
  const double *go, *nll, *la; /* grad (N), neg_log_likelihood (N), log_alpha (N, T, L) */
  double* beta;                /* (N, T, L) scratch */
  double* g;                   /* (T, N, C): the gradient */
  bool zero_infinity;
} bwd_ctx_t;

static void ctc_backward_range(void* vctx, int64_t b0, int64_t b1) {
  bwd_ctx_t* x = vctx;
  const ctc_t* p = x->p;
  const int64_t L = p->L, C = p->C, N = p->N;
  for (int64_t b = b0; b < b1; b++) {
    const int64_t il = p->il[b], tl = p->tl[b], ns = 2 * tl + 1;
    const double nll = x->nll[b];
    /* grad rows of sample b: frame t at g + (t * N + b) * C; all zero now */
    if (x->zero_infinity && nll == INFINITY) continue;
    if (il == 0) continue;
    const double* a = x->la + b * p->T * L;
    double* be = x->beta + b * p->T * L;
    /* g holds log sum over states of label k of alpha * beta, -inf when empty */
    for (int64_t t = 0; t < il; t++)
      for (int64_t k = 0; k < C; k++) x->g[(t * N + b) * C + k] = -INFINITY;
    for (int64_t s = 0; s < ns; s++) be[(il - 1) * L + s] = -INFINITY;
    for (int64_t t = il - 1; t >= 0; t--) {
      double* cur = be + t * L;
      double* gt = x->g + (t * N + b) * C;
      for (int64_t s = ns - 1; s >= 0; s--) {
        int64_t k = state_label(p, b, s);
        if (t == il - 1) {
          cur[s] = s >= ns - 2 ? lpv(p, t, b, k) : -INFINITY;
        } else {
          const double* next = cur + L;
          double b2 = s < ns - 1 ? next[s + 1] : -INFINITY;
          double b3 = (s < ns - 2 && state_label(p, b, s + 2) != k) ? next[s + 2] : -INFINITY;
          cur[s] = lse3(next[s], b2, b3) + lpv(p, t, b, k);
        }
        double ab = a[t * L + s] + cur[s];
        gt[k] = gt[k] == -INFINITY ? ab : lse2(gt[k], ab);
      }
    }
    /* d nll / d log_probs[t, k] = exp(lp) - exp(log(sum alpha beta) + nll - lp) */
    const double gr = x->go[b];
    for (int64_t t = 0; t < il; t++) {
      double* gt = x->g + (t * N + b) * C;
      for (int64_t k = 0; k < C; k++) {
        double l = lpv(p, t, b, k);
        gt[k] = (exp(l) - exp(gt[k] + nll - l)) * gr;
      }
    }
  }
}

/* _ctc_loss_backward(grad, log_probs, targets, input_lengths, target_lengths,
 * neg_log_likelihood, log_alpha, blank, zero_infinity) -> grad of log_probs.
 * Frames past a sample's input length get 0; with zero_infinity, so does
 * every frame of a sample whose loss is infinite. */
tpu_status_t tpu_k_ctc_loss_backward(const tpu_call_t* c) {
  const char* op = "_ctc_loss_backward";
  ctc_t p;
  tpu_status_t s = ctc_setup(c, 1, 7, &p, op);
  if (s) return s;
  const tpu_tensor_t* go_t = tpu_arg_tensor(c, 0);
  const tpu_tensor_t* nll_t = tpu_arg_tensor(c, 5);
  const tpu_tensor_t* la_t = tpu_arg_tensor(c, 6);
  const tpu_tensor_t* out = &c->outs[0];
  const int64_t ng = p.T * p.N * p.C;
  if (!go_t || !nll_t || !la_t || tpu_tensor_numel(go_t) != p.N ||
      tpu_tensor_numel(nll_t) != p.N || tpu_tensor_numel(out) != ng || la_t->ndim != 3 ||
      la_t->sizes[0] != p.N || la_t->sizes[1] != p.T || la_t->sizes[2] < 2 * p.S + 1) {
    ctc_free(&p);
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected grad and neg_log_likelihood of %lld elements "
                   "and log_alpha of shape (%lld, %lld, >= %lld)", op, (long long)p.N,
                   (long long)p.N, (long long)p.T, (long long)(2 * p.S + 1));
  }
  /* log_alpha may be wider than this call's targets need (padded targets) */
  p.L = la_t->sizes[2];
  double* go = tpu_stage_f64(go_t, false);
  double* nll = tpu_stage_f64(nll_t, false);
  double* la = tpu_stage_f64(la_t, false);
  double* beta = malloc((size_t)(p.N * p.T * p.L > 0 ? p.N * p.T * p.L : 1) * sizeof(double));
  double* g = calloc((size_t)(ng > 0 ? ng : 1), sizeof(double));
  if (!go || !nll || !la || !beta || !g) {
    s = OOM(op);
  } else {
    bwd_ctx_t x = {&p, go, nll, la, beta, g, tpu_arg_bool(c, 8, false)};
    tpu_parallel_for(p.N, 1, ctc_backward_range, &x);
    s = tpu_unstage_f64(out, g);
  }
  free(go);
  free(nll);
  free(la);
  free(beta);
  free(g);
  ctc_free(&p);
  return s;
}
