/* Expression macros of the elementwise kernels, shared by elementwise.c and
 * the fused kernels the host compiler generates
 * (targets/host/fuse_codegen.c), so that a fused chain computes exactly what
 * its library kernels compute.
 * Expects EXP, ERF, TANH and LIT(v) (a literal in the element type). */
#ifndef TPU_HOST_EW_EXPRS_H_
#define TPU_HOST_EW_EXPRS_H_
#define SIGMOID(x) (1 / (1 + EXP(-(x))))
#define SILU(x) ((x) / (1 + EXP(-(x))))
#define M_SQRT1_2_ 0.70710678118654752440
#define M_2_SQRTPI_ 1.12837916709551257390
#define KBETA_ 0.79788456080286535588 /* sqrt(2/pi) */
#define KKAPPA_ 0.044715
#define GELU(x) ((x) * LIT(0.5) * (1 + ERF((x) * LIT(M_SQRT1_2_))))
#define GELU_TANH_INNER(x) TANH(LIT(KBETA_) * ((x) + LIT(KKAPPA_) * (x) * (x) * (x)))
#define GELU_TANH(x) (LIT(0.5) * (x) * (1 + GELU_TANH_INNER(x)))
#endif
