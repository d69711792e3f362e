/* _scaled_mm: float8 (and float4) matrix products with scales, as PyTorch
 * CPU computes them: each operand's decoded values are multiplied by their
 * scale in float32, the product of those accumulates in float32, a bias is
 * added in float32, and the sum is rounded once to the output dtype.
 *
 * Scales: one per tensor (float32), one per row of A and column of B
 * (float32, [M, 1] and [1, N]), or per block of K for the microscaling
 * formats: 32 values with a float8_e8m0fnu scale (MXFP8, MXFP4), 16 with a
 * float8_e4m3fn scale (NVFP4), given in cuBLAS's swizzled layout (see
 * tpu_gemm_scale_t), read there by the GEMM's packers. The bridge validates the configuration with PyTorch's
 * messages; the checks here only guard the kernel.
 *
 * Float8 and float4 operands (float4: two values a byte along K) are decoded
 * inside the GEMM's packing together with their scales (tpu_gemm_scaled), a
 * k block of a panel at a time: no float32 copy of an operand is made. */
#include <stdlib.h>

#include "kernels.h"
#include "matmul.h"

/* _scaled_mm(self, mat2, scale_a, scale_b, bias, scale_result, out_dtype,
 * use_fast_accum) and its out= overload: outs[0] is preallocated M x N. */
tpu_status_t tpu_k_scaled_mm(const tpu_call_t* c) {
  const char* op = "_scaled_mm";
  const tpu_tensor_t *a = tpu_arg_tensor(c, 0), *b = tpu_arg_tensor(c, 1);
  const tpu_tensor_t *sa = tpu_arg_tensor(c, 2), *sb = tpu_arg_tensor(c, 3);
  const tpu_tensor_t *bias = tpu_arg_tensor(c, 4), *sr = tpu_arg_tensor(c, 5);
  const tpu_tensor_t* out = &c->outs[0];
  if (!a || !b || !sa || !sb || a->ndim != 2 || b->ndim != 2 || out->ndim != 2)
    return TPU_ERR(INVALID_ARGUMENT, "%s: expected matrices and scales", op);
  const bool fp4 = a->dtype == TPU_F4E2M1FNX2;
  if (fp4 != (b->dtype == TPU_F4E2M1FNX2))
    return TPU_ERR(INVALID_ARGUMENT, "%s: float4 operands must both be float4", op);
  const int64_t m = a->sizes[0], n = b->sizes[1], k = a->sizes[1] * (fp4 ? 2 : 1);
  if (b->sizes[0] * (fp4 ? 2 : 1) != k || out->sizes[0] != m || out->sizes[1] != n)
    return TPU_ERR(INVALID_ARGUMENT, "%s: shapes %lldx%lld and %lldx%lld, output %lldx%lld", op,
                   (long long)a->sizes[0], (long long)a->sizes[1], (long long)b->sizes[0],
                   (long long)b->sizes[1], (long long)out->sizes[0], (long long)out->sizes[1]);
  if (m == 0 || n == 0) return TPU_OK;

  tpu_gemm_scale_t scale[2] = {{0}};
  tpu_status_t st = TPU_OK;
  const bool blockwise = sa->dtype == TPU_F8E8M0FNU || sa->dtype == TPU_F8E4M3FN;
  if (blockwise) { /* the packers read the swizzled codes */
    const int64_t blk = sa->dtype == TPU_F8E8M0FNU ? 32 : 16, kblocks = (k + blk - 1) / blk;
    scale[0] = (tpu_gemm_scale_t){.blk = blk, .codes = sa->data, .code_dtype = sa->dtype,
                                  .kblocks = kblocks};
    scale[1] = (tpu_gemm_scale_t){.blk = blk, .codes = sb->data, .code_dtype = sb->dtype,
                                  .kblocks = kblocks};
  } else if (sa->dtype == TPU_F32 && sb->dtype == TPU_F32) {
    const bool per_tensor = tpu_tensor_numel(sa) == 1 && tpu_tensor_numel(sb) == 1;
    /* per row: sa [M, 1], sb [1, N] */
    scale[0] = (tpu_gemm_scale_t){.s = sa->data, .sl = per_tensor || m == 1 ? 0 : sa->strides[0],
                                  .blk = 1};
    scale[1] = (tpu_gemm_scale_t){.s = sb->data, .sl = per_tensor || n == 1 ? 0 : sb->strides[1],
                                  .blk = 1};
  } else {
    return TPU_ERR(INVALID_ARGUMENT, "%s: scales of dtype %s are not supported", op,
                   tpu_dtype_name(sa->dtype));
  }

  /* The float32 sum is scaled once more before it is rounded when CPU divides
   * a float8 e4m3fn / e5m2 result by scale_result (after the bias), or when
   * _scaled_mm_v2's two-level NVFP4 gives global scales (args 8 and 9: the
   * sum times their product, then the bias, as cuBLAS's alpha): then the sum
   * goes through a float32 buffer. */
  const tpu_tensor_t* ga = c->nargs > 9 ? tpu_arg_tensor(c, 8) : NULL;
  const tpu_tensor_t* gb = c->nargs > 9 ? tpu_arg_tensor(c, 9) : NULL;
  float mul = 1.0f;
  bool late_bias = false;
  if (sr && (out->dtype == TPU_F8E4M3FN || out->dtype == TPU_F8E5M2))
    mul = 1.0f / *(const float*)sr->data;
  if (ga && gb) {
    if (ga->dtype != TPU_F32 || gb->dtype != TPU_F32)
      return TPU_ERR(INVALID_ARGUMENT, "%s: global scales must be float32", op);
    mul = *(const float*)ga->data * *(const float*)gb->data;
    late_bias = bias != NULL;
  }
  if (mul == 1.0f && !late_bias) return tpu_gemm_scaled(a, b, out, &scale[0], &scale[1], bias);
  float* tmp = malloc(sizeof(float) * (size_t)(m * n + (late_bias ? n : 0)));
  if (!tmp) return TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory", op);
  tpu_tensor_t t, bt;
  const int64_t ts[2] = {m, n}, bs[2] = {1, n};
  tpu_tensor_make_contig(&t, tmp, TPU_F32, 2, ts);
  st = tpu_gemm_scaled(a, b, &t, &scale[0], &scale[1], late_bias ? NULL : bias);
  const float* brow = tmp + m * n;
  if (!st && late_bias) { /* the bias row [1, N] in float32 */
    tpu_tensor_make_contig(&bt, tmp + m * n, TPU_F32, 2, bs);
    st = tpu_copy_strided(&bt, bias);
  }
  for (int64_t i = 0; i < m && !st; i++)
    for (int64_t j = 0; j < n; j++)
      tmp[i * n + j] = tmp[i * n + j] * mul + (late_bias ? brow[j] : 0.0f);
  if (!st) st = tpu_copy_strided(out, &t);
  free(tmp);
  return st;
}
