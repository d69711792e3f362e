/* Fused attention kernels (kernels/attention.c) against a naive double
 * reference, forward and backward, on every micro-kernel ISA this CPU has. */
#include "targets/host/kernels/matmul.h"
#include "test_util.h"

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return (float)((double)(g_rng >> 11) / 4503599627370496.0 - 1.0);
}

typedef struct {
  int64_t B, H, Hk, T, S, E, Ev; /* batch, heads, kv heads, queries, keys, dims */
  bool causal;
} shape_t;

/* q[b, h, i, e] of a contiguous (B, H, T, E) array */
#define IX(a, b, h, i, e, H_, T_, E_) (a)[(((b) * (H_) + (h)) * (T_) + (i)) * (E_) + (e)]

static void reference(const shape_t* s, const float* q, const float* k, const float* v,
                      const float* go, double* o, double* lse, double* dq, double* dk,
                      double* dv) {
  const int64_t g = s->H / s->Hk;
  const double scale = 1.0 / sqrt((double)s->E);
  double* p = malloc(sizeof(double) * (size_t)s->S);
  double* dp = malloc(sizeof(double) * (size_t)s->S);
  memset(dk, 0, sizeof(double) * (size_t)(s->B * s->Hk * s->S * s->E));
  memset(dv, 0, sizeof(double) * (size_t)(s->B * s->Hk * s->S * s->Ev));
  for (int64_t b = 0; b < s->B; b++)
    for (int64_t h = 0; h < s->H; h++)
      for (int64_t i = 0; i < s->T; i++) {
        const int64_t hk = h / g;
        double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j < s->S; j++) {
          double d = 0;
          for (int64_t e = 0; e < s->E; e++)
            d += (double)IX(q, b, h, i, e, s->H, s->T, s->E) *
                 IX(k, b, hk, j, e, s->Hk, s->S, s->E);
          p[j] = s->causal && j > i ? -INFINITY : d * scale;
          if (p[j] > m) m = p[j];
        }
        for (int64_t j = 0; j < s->S; j++) sum += (p[j] = m == -INFINITY ? 0 : exp(p[j] - m));
        lse[(b * s->H + h) * s->T + i] = sum > 0 ? m + log(sum) : -INFINITY;
        double dsum = 0;
        for (int64_t e = 0; e < s->Ev; e++) {
          double acc = 0;
          for (int64_t j = 0; j < s->S; j++)
            acc += (sum > 0 ? p[j] / sum : 0) * IX(v, b, hk, j, e, s->Hk, s->S, s->Ev);
          IX(o, b, h, i, e, s->H, s->T, s->Ev) = acc;
          dsum += acc * IX(go, b, h, i, e, s->H, s->T, s->Ev);
        }
        for (int64_t j = 0; j < s->S; j++) {
          p[j] = sum > 0 ? p[j] / sum : 0;
          double d = 0;
          for (int64_t e = 0; e < s->Ev; e++)
            d += (double)IX(go, b, h, i, e, s->H, s->T, s->Ev) *
                 IX(v, b, hk, j, e, s->Hk, s->S, s->Ev);
          dp[j] = p[j] * (d - dsum); /* dS */
        }
        for (int64_t e = 0; e < s->E; e++) {
          double acc = 0;
          for (int64_t j = 0; j < s->S; j++) acc += dp[j] * IX(k, b, hk, j, e, s->Hk, s->S, s->E);
          IX(dq, b, h, i, e, s->H, s->T, s->E) = acc * scale;
        }
        for (int64_t j = 0; j < s->S; j++) {
          for (int64_t e = 0; e < s->E; e++)
            IX(dk, b, hk, j, e, s->Hk, s->S, s->E) +=
                dp[j] * scale * IX(q, b, h, i, e, s->H, s->T, s->E);
          for (int64_t e = 0; e < s->Ev; e++)
            IX(dv, b, hk, j, e, s->Hk, s->S, s->Ev) += p[j] * IX(go, b, h, i, e, s->H, s->T, s->Ev);
        }
      }
  free(p);
  free(dp);
}

static double max_err(const float* got, const double* want, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; i++) {
    double d = fabs((double)got[i] - want[i]);
    if (!(d <= m)) m = d; /* NaN propagates */
  }
  return m;
}

static void run_case(const shape_t* s) {
  const int64_t nq = s->B * s->H * s->T * s->E, nk = s->B * s->Hk * s->S * s->E,
                nv = s->B * s->Hk * s->S * s->Ev, no = s->B * s->H * s->T * s->Ev,
                nl = s->B * s->H * s->T;
  float *q = malloc(4 * nq), *k = malloc(4 * nk), *v = malloc(4 * nv), *go = malloc(4 * no);
  float *o = malloc(4 * no), *lse = malloc(4 * nl), *dq = malloc(4 * nq), *dk = malloc(4 * nk),
        *dv = malloc(4 * nv);
  double *ro = malloc(8 * no), *rl = malloc(8 * nl), *rdq = malloc(8 * nq), *rdk = malloc(8 * nk),
         *rdv = malloc(8 * nv);
  for (int64_t i = 0; i < nq; i++) q[i] = frand();
  for (int64_t i = 0; i < nk; i++) k[i] = frand();
  for (int64_t i = 0; i < nv; i++) v[i] = frand();
  for (int64_t i = 0; i < no; i++) go[i] = frand();
  reference(s, q, k, v, go, ro, rl, rdq, rdk, rdv);
  const int64_t sq[4] = {s->B, s->H, s->T, s->E}, sk[4] = {s->B, s->Hk, s->S, s->E},
                sv[4] = {s->B, s->Hk, s->S, s->Ev}, so[4] = {s->B, s->H, s->T, s->Ev},
                sl[3] = {s->B, s->H, s->T};
  tpu_tensor_t tq = tt_make(q, TPU_F32, 4, sq), tk = tt_make(k, TPU_F32, 4, sk),
               tv = tt_make(v, TPU_F32, 4, sv), tgo = tt_make(go, TPU_F32, 4, so);
  tpu_tensor_t outs[3] = {tt_make(o, TPU_F32, 4, so), tt_make(lse, TPU_F32, 3, sl)};
  tpu_call_t base = {0};
  base.precision = TPU_PRECISION_HIGHEST;
  base.debug_checks = true;
  tpu_arg_t fa[8] = {ta_t(&tq),  ta_t(&tk),          ta_t(&tv),   ta_none(),
                     ta_d(0.0), ta_b(s->causal), ta_b(false), ta_none()};
  CHECK_OK(tt_run_with("_scaled_dot_product_fused_attention_overrideable", fa, 8, outs, 2, &base));
  double eo = max_err(o, ro, no), el = max_err(lse, rl, nl);
  tpu_tensor_t to = outs[0], tl = outs[1];
  tpu_tensor_t gouts[3] = {tt_make(dq, TPU_F32, 4, sq), tt_make(dk, TPU_F32, 4, sk),
                           tt_make(dv, TPU_F32, 4, sv)};
  const bool gmask[4] = {true, true, true, false};
  tpu_arg_t bl = {0};
  bl.kind = TPU_ARG_BOOLLIST;
  bl.n = 4;
  bl.v.blist = gmask;
  tpu_arg_t ba[17] = {ta_t(&tgo), ta_t(&tq),  ta_t(&tk),      ta_t(&tv),   ta_none(), bl,
                      ta_t(&to),  ta_t(&tl),  ta_none(),      ta_none(),   ta_i(s->T), ta_i(s->S),
                      ta_d(0.0),  ta_b(s->causal), ta_none(), ta_none(),   ta_none()};
  CHECK_OK(tt_run_with("_scaled_dot_product_fused_attention_overrideable_backward", ba, 17, gouts, 3,
                       &base));
  double eq = max_err(dq, rdq, nq), ek = max_err(dk, rdk, nk), ev = max_err(dv, rdv, nv);
  const double tol = 2e-5;
  if (!(eo < tol && el < tol && eq < tol && ek < tol && ev < tol))
    fprintf(stderr,
            "attention %s B%lld H%lld Hk%lld T%lld S%lld E%lld Ev%lld causal %d: errors o %g lse %g "
            "dq %g dk %g dv %g\n",
            tpu_gemm_isa_name(), (long long)s->B, (long long)s->H, (long long)s->Hk,
            (long long)s->T, (long long)s->S, (long long)s->E, (long long)s->Ev, s->causal, eo, el,
            eq, ek, ev);
  CHECK(eo < tol && el < tol && eq < tol && ek < tol && ev < tol);
  free(q), free(k), free(v), free(go), free(o), free(lse), free(dq), free(dk), free(dv);
  free(ro), free(rl), free(rdq), free(rdk), free(rdv);
}

int main(void) {
  CHECK_OK(tpu_runtime_init());
  const shape_t cases[] = {
      {1, 1, 1, 1, 1, 8, 8, false},    {2, 2, 2, 7, 7, 16, 16, true},
      {1, 4, 2, 67, 67, 32, 32, true}, {1, 2, 1, 129, 67, 16, 24, false},
      {2, 3, 3, 100, 200, 64, 64, true},
  };
  const tpu_gemm_isa_t isas[] = {TPU_GEMM_ISA_PORTABLE, TPU_GEMM_ISA_AVX2, TPU_GEMM_ISA_AVX512};
  for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
    if (!tpu_gemm_set_isa(isas[i])) continue; /* skip ISAs this CPU lacks */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) run_case(&cases[c]);
  }
  tpu_gemm_set_isa(TPU_GEMM_ISA_AUTO);
  TEST_MAIN_END();
}
