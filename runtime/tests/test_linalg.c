/* Hand-checked cases for the dense linear algebra kernels (linalg.c). */
#include "test_util.h"

static void test_lu_factor(void) {
  /* A = [[1 2] [3 4]]: row 1 is the pivot; L = [[1 0] [1/3 1]],
   * U = [[3 4] [0 2/3]]. */
  double a[4] = {1, 2, 3, 4}, lu[4];
  int32_t piv[2], info = -1;
  int64_t s2[2] = {2, 2}, s1[1] = {2};
  tpu_tensor_t A = tt_make(a, TPU_F64, 2, s2), LU = tt_make(lu, TPU_F64, 2, s2);
  tpu_tensor_t P = tt_make(piv, TPU_I32, 1, s1), I = tt_make(&info, TPU_I32, 0, NULL);
  tpu_arg_t args[3] = {ta_t(&A), ta_b(true), ta_b(false)};
  tpu_tensor_t outs[3] = {LU, P, I};
  CHECK_OK(tt_run("linalg_lu_factor_ex", args, 3, outs, 3));
  CHECK(piv[0] == 2 && piv[1] == 2 && info == 0);
  CHECK_NEAR(lu[0], 3, 1e-15);
  CHECK_NEAR(lu[1], 4, 1e-15);
  CHECK_NEAR(lu[2], 1.0 / 3, 1e-15);
  CHECK_NEAR(lu[3], 2.0 / 3, 1e-15);

  /* A singular matrix reports the zero pivot's 1-based index. */
  double z[4] = {1, 2, 2, 4};
  tpu_tensor_t Z = tt_make(z, TPU_F64, 2, s2);
  args[0] = ta_t(&Z);
  CHECK_OK(tt_run("linalg_lu_factor_ex", args, 3, outs, 3));
  CHECK(info == 2);
}

static void test_solve_det_inv(void) {
  /* A = [[2 1] [1 3]] (float32, transposed view), b = [3 5]: x = [0.8 1.4],
   * det = 5, inv = [[0.6 -0.2] [-0.2 0.4]]. */
  float a[4] = {2, 1, 1, 3}, b[2] = {3, 5}, x[2], lu[4], det, inv[4];
  int32_t piv[2], info;
  int64_t s2[2] = {2, 2}, s1[1] = {2};
  tpu_tensor_t A = tt_make(a, TPU_F32, 2, s2);
  A.strides[0] = 1, A.strides[1] = 2; /* non-contiguous: A itself is factored */
  tpu_tensor_t B = tt_make(b, TPU_F32, 1, s1), X = tt_make(x, TPU_F32, 1, s1);
  tpu_tensor_t LU = tt_make(lu, TPU_F32, 2, s2), P = tt_make(piv, TPU_I32, 1, s1);
  tpu_tensor_t I = tt_make(&info, TPU_I32, 0, NULL);
  tpu_arg_t args[4] = {ta_t(&A), ta_t(&B), ta_b(true), ta_b(false)};
  tpu_tensor_t outs[4] = {X, LU, P, I};
  CHECK_OK(tt_run("_linalg_solve_ex", args, 4, outs, 4));
  CHECK_NEAR(x[0], 0.8, 1e-6);
  CHECK_NEAR(x[1], 1.4, 1e-6);
  CHECK(info == 0);

  tpu_tensor_t D = tt_make(&det, TPU_F32, 0, NULL);
  tpu_tensor_t douts[3] = {D, LU, P};
  CHECK_OK(tt_run("_linalg_det", args, 1, douts, 3));
  CHECK_NEAR(det, 5, 1e-5);

  tpu_tensor_t V = tt_make(inv, TPU_F32, 2, s2);
  tpu_arg_t iargs[2] = {ta_t(&A), ta_b(false)};
  tpu_tensor_t iouts[2] = {V, I};
  CHECK_OK(tt_run("linalg_inv_ex", iargs, 2, iouts, 2));
  CHECK_NEAR(inv[0], 0.6, 1e-6);
  CHECK_NEAR(inv[1], -0.2, 1e-6);
  CHECK_NEAR(inv[3], 0.4, 1e-6);
}

static void test_cholesky(void) {
  /* [[4 2] [2 5]] = L L^T with L = [[2 0] [1 2]]; [[1 2] [2 1]] fails at 2. */
  double a[4] = {4, 2, 2, 5}, l[4];
  int32_t info;
  int64_t s2[2] = {2, 2};
  tpu_tensor_t A = tt_make(a, TPU_F64, 2, s2), L = tt_make(l, TPU_F64, 2, s2);
  tpu_tensor_t I = tt_make(&info, TPU_I32, 0, NULL);
  tpu_arg_t args[3] = {ta_t(&A), ta_b(false), ta_b(false)};
  tpu_tensor_t outs[2] = {L, I};
  CHECK_OK(tt_run("linalg_cholesky_ex", args, 3, outs, 2));
  CHECK(info == 0);
  CHECK_NEAR(l[0], 2, 1e-15);
  CHECK_NEAR(l[1], 0, 0);
  CHECK_NEAR(l[2], 1, 1e-15);
  CHECK_NEAR(l[3], 2, 1e-15);
  double n[4] = {1, 2, 2, 1};
  tpu_tensor_t N = tt_make(n, TPU_F64, 2, s2);
  args[0] = ta_t(&N);
  CHECK_OK(tt_run("linalg_cholesky_ex", args, 3, outs, 2));
  CHECK(info == 2);
  args[2] = ta_b(true); /* check_errors */
  tpu_status_t st = tt_run("linalg_cholesky_ex", args, 3, outs, 2);
  CHECK(st != NULL);
  tpu_status_free(st);
}

static void test_complex_lu_cholesky(void) {
  /* complex128 (re, im pairs). LU of [[2.9+2.9i 1] [4.2 3-i]] keeps row 0:
   * LAPACK's pivot size |re| + |im| is 5.8 against 4.2 (the moduli, 4.10 and
   * 4.2, would swap). */
  double a[8] = {2.9, 2.9, 1, 0, 4.2, 0, 3, -1}, lu[8];
  int32_t piv[2], info = -1;
  int64_t s2[2] = {2, 2}, s1[1] = {2};
  tpu_tensor_t A = tt_make(a, TPU_C128, 2, s2), LU = tt_make(lu, TPU_C128, 2, s2);
  tpu_tensor_t P = tt_make(piv, TPU_I32, 1, s1), I = tt_make(&info, TPU_I32, 0, NULL);
  tpu_arg_t args[3] = {ta_t(&A), ta_b(true), ta_b(false)};
  tpu_tensor_t outs[3] = {LU, P, I};
  CHECK_OK(tt_run("linalg_lu_factor_ex", args, 3, outs, 3));
  CHECK(piv[0] == 1 && piv[1] == 2 && info == 0);
  /* L(1,0) = 4.2 / (2.9+2.9i) = (0.7241..)(1 - i) */
  CHECK_NEAR(lu[4], 4.2 / 5.8, 1e-15);
  CHECK_NEAR(lu[5], -4.2 / 5.8, 1e-15);

  /* The Hermitian [[4 2i] [-2i 5]] = L L^H with L = [[2 0] [-i 2]]. */
  double h[8] = {4, 0, 0, 2, 0, -2, 5, 0}, l[8];
  tpu_tensor_t H = tt_make(h, TPU_C128, 2, s2), L = tt_make(l, TPU_C128, 2, s2);
  tpu_arg_t cargs[3] = {ta_t(&H), ta_b(false), ta_b(false)};
  tpu_tensor_t couts[2] = {L, I};
  CHECK_OK(tt_run("linalg_cholesky_ex", cargs, 3, couts, 2));
  CHECK(info == 0);
  CHECK_NEAR(l[0], 2, 1e-15);
  CHECK_NEAR(l[2], 0, 0);
  CHECK_NEAR(l[4], 0, 1e-15);
  CHECK_NEAR(l[5], -1, 1e-15);
  CHECK_NEAR(l[6], 2, 1e-15);
  /* [[1 2i] [-2i 1]] fails at 2, leaving the failed pivot 1 - |2i|^2. */
  h[3] = 2, h[5] = -2, h[0] = h[6] = 1;
  CHECK_OK(tt_run("linalg_cholesky_ex", cargs, 3, couts, 2));
  CHECK(info == 2);
  CHECK_NEAR(l[6], -3, 1e-15);
}

static void test_svd_eigh(void) {
  /* [[3 0] [4 5]] has singular values sqrt(45) and sqrt(5); the symmetric
   * [[2 1] [1 2]] has eigenvalues 1 and 3. */
  double a[4] = {3, 0, 4, 5}, u[4], s[2], vh[4];
  int64_t s2[2] = {2, 2}, s1[1] = {2};
  tpu_tensor_t A = tt_make(a, TPU_F64, 2, s2);
  tpu_tensor_t U = tt_make(u, TPU_F64, 2, s2), S = tt_make(s, TPU_F64, 1, s1);
  tpu_tensor_t Vh = tt_make(vh, TPU_F64, 2, s2);
  tpu_arg_t args[4] = {ta_t(&A), ta_b(false), ta_b(true), ta_none()};
  tpu_tensor_t outs[3] = {U, S, Vh};
  CHECK_OK(tt_run("_linalg_svd", args, 4, outs, 3));
  CHECK_NEAR(s[0], sqrt(45.0), 1e-12);
  CHECK_NEAR(s[1], sqrt(5.0), 1e-12);
  for (int i = 0; i < 2; i++) /* U diag(s) Vh reproduces A */
    for (int j = 0; j < 2; j++)
      CHECK_NEAR(u[i * 2] * s[0] * vh[j] + u[i * 2 + 1] * s[1] * vh[2 + j], a[i * 2 + j], 1e-12);

  double e[4] = {2, 1, 1, 2}, w[2], v[4];
  tpu_tensor_t E = tt_make(e, TPU_F64, 2, s2), W = tt_make(w, TPU_F64, 1, s1);
  tpu_tensor_t V = tt_make(v, TPU_F64, 2, s2);
  tpu_arg_t eargs[3] = {ta_t(&E), ta_s("L"), ta_b(true)};
  tpu_tensor_t eouts[2] = {W, V};
  CHECK_OK(tt_run("_linalg_eigh", eargs, 3, eouts, 2));
  CHECK_NEAR(w[0], 1, 1e-12);
  CHECK_NEAR(w[1], 3, 1e-12);
  CHECK_NEAR(fabs(v[0]), sqrt(0.5), 1e-12);
  CHECK_NEAR(v[0] * v[1] + v[2] * v[3], 0, 1e-12);
}

static void test_qr(void) {
  /* [[3 1] [4 2]]: R = [[-5 -2.2] [0 0.4]] with LAPACK's reflector signs. */
  double a[4] = {3, 1, 4, 2}, q[4], r[4];
  int64_t s2[2] = {2, 2};
  tpu_tensor_t A = tt_make(a, TPU_F64, 2, s2);
  tpu_tensor_t Q = tt_make(q, TPU_F64, 2, s2), R = tt_make(r, TPU_F64, 2, s2);
  tpu_arg_t args[2] = {ta_t(&A), ta_s("reduced")};
  tpu_tensor_t outs[2] = {Q, R};
  CHECK_OK(tt_run("linalg_qr", args, 2, outs, 2));
  CHECK_NEAR(r[0], -5, 1e-12);
  CHECK_NEAR(r[1], -2.2, 1e-12);
  CHECK_NEAR(r[2], 0, 0);
  CHECK_NEAR(r[3], 0.4, 1e-12);
  CHECK_NEAR(q[0], -0.6, 1e-12);
  CHECK_NEAR(q[2], -0.8, 1e-12);
}

int main(void) {
  test_lu_factor();
  test_solve_det_inv();
  test_cholesky();
  test_complex_lu_cholesky();
  test_svd_eigh();
  test_qr();
  TEST_MAIN_END();
}
