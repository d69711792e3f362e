/* _scaled_mm: float8 (and float4) matrix products with scales, as PyTorch
 * CPU computes them: each operand's decoded values are multiplied by their
 * scale in float32, the product of those accumulates in float32, a bias is
 * added in float32, and the sum is rounded once to the output dtype.
 *
 * Scales: one per tensor (float32), one per row of A and column of B
 * (float32, [M, 1] and [1, N]), or per block of K for the microscaling
 * formats: 32 values with a float8_e8m0fnu scale (MXFP8, MXFP4), 16 with a
 * float8_e4m3fn scale (NVFP4), given in cuBLAS's swizzled layout (see
 * blocked_index). The bridge validates the configuration with PyTorch's
 * messages; the checks here only guard the kernel.
 *
 * Float8 and float4 operands (float4: two values a byte along K) are decoded
 * inside the GEMM's packing together with their scales (tpu_gemm_scaled), a
 * k block of a panel at a time: no float32 copy of an operand is made. */
#include <stdlib.h>

#include "kernels.h"
#include "matmul.h"
#include "tpu/float8.h"

/* Position of scale (r, kb) of a [rows, kblocks] grid stored as cuBLAS's
 * block-scaled layout: 128 x 4 tiles, row-major over (row tile, k tile),
 * each holding its rows r = 32 * a + b (a < 4, b < 32) at b * 16 + a * 4 +
 * (kb % 4). */
static int64_t blocked_index(int64_t r, int64_t kb, int64_t kblocks) {
  const int64_t ktiles = (kblocks + 3) / 4, i = r % 128;
  return ((r / 128) * ktiles + kb / 4) * 512 + (i % 32) * 16 + (i / 32) * 4 + kb % 4;
}

/* Scales of `rows` lines of a block-scaled operand as a plain float array
 * [rows, kblocks]; NULL when out of memory. */
static float* unswizzle(const tpu_tensor_t* s, int64_t rows, int64_t kblocks) {
  float* out = malloc(sizeof(float) * (size_t)(rows * kblocks > 0 ? rows * kblocks : 1));
  if (!out) return NULL;
  const uint8_t* p = s->data;
  for (int64_t r = 0; r < rows; r++)
    for (int64_t kb = 0; kb < kblocks; kb++) {
      const uint8_t v = p[blocked_index(r, kb, kblocks)];
      out[r * kblocks + kb] = s->dtype == TPU_F8E8M0FNU ? tpu_f8e8m0fnu_to_f32(v)
                                                        : tpu_f8e4m3fn_to_f32(v);
    }
  return out;
}

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
  float* owned[2] = {NULL, NULL}; /* unswizzled scales */
  tpu_status_t st = TPU_OK;
  const bool blockwise = sa->dtype == TPU_F8E8M0FNU || sa->dtype == TPU_F8E4M3FN;
  if (blockwise) {
    const int64_t blk = sa->dtype == TPU_F8E8M0FNU ? 32 : 16, kblocks = (k + blk - 1) / blk;
    owned[0] = unswizzle(sa, m, kblocks);
    owned[1] = unswizzle(sb, n, kblocks);
    if (!owned[0] || !owned[1]) {
      st = TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory for the scales", op);
      goto done;
    }
    scale[0] = (tpu_gemm_scale_t){owned[0], kblocks, 1, blk};
    scale[1] = (tpu_gemm_scale_t){owned[1], kblocks, 1, blk};
  } else if (sa->dtype == TPU_F32 && sb->dtype == TPU_F32) {
    const bool per_tensor = tpu_tensor_numel(sa) == 1 && tpu_tensor_numel(sb) == 1;
    /* per row: sa [M, 1], sb [1, N] */
    scale[0] = (tpu_gemm_scale_t){sa->data, per_tensor || m == 1 ? 0 : sa->strides[0], 0, 1};
    scale[1] = (tpu_gemm_scale_t){sb->data, per_tensor || n == 1 ? 0 : sb->strides[1], 0, 1};
  } else {
    return TPU_ERR(INVALID_ARGUMENT, "%s: scales of dtype %s are not supported", op,
                   tpu_dtype_name(sa->dtype));
  }

  /* CPU divides a float8 e4m3fn / e5m2 result by scale_result before rounding
   * it: then the sum goes through a float32 buffer */
  float inv = 1.0f;
  if (sr && (out->dtype == TPU_F8E4M3FN || out->dtype == TPU_F8E5M2))
    inv = 1.0f / *(const float*)sr->data;
  if (inv == 1.0f) {
    st = tpu_gemm_scaled(a, b, out, &scale[0], &scale[1], bias);
  } else {
    float* tmp = malloc(sizeof(float) * (size_t)(m * n));
    if (!tmp) {
      st = TPU_ERR(RESOURCE_EXHAUSTED, "%s: out of host memory", op);
      goto done;
    }
    tpu_tensor_t t;
    const int64_t ts[2] = {m, n};
    tpu_tensor_make_contig(&t, tmp, TPU_F32, 2, ts);
    st = tpu_gemm_scaled(a, b, &t, &scale[0], &scale[1], bias);
    for (int64_t i = 0; i < m * n && !st; i++) tmp[i] *= inv;
    if (!st) st = tpu_copy_strided(out, &t);
    free(tmp);
  }
done:
  for (int i = 0; i < 2; i++) free(owned[i]);
  return st;
}
