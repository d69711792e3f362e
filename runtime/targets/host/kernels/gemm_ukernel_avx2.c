/* AVX2 + FMA GEMM micro-kernel: 6 x 16 tiles (12 accumulators of 8 floats),
 * built from gemm_ukernel_simd.h. Chosen at run time (matmul.c) on CPUs
 * that have AVX2 and FMA with the YMM state enabled by the OS. */
#include "gemm_ukernel.h"

#ifdef TPU_GEMM_HAVE_X86
#include <immintrin.h>

#define ATTR __attribute__((target("avx2,fma")))
#define UK(name) avx2_##name
#define MR 6
#define VF __m256
#define VL 8
#define V_LOAD(p) _mm256_loadu_ps(p)
#define V_STORE(p, v) _mm256_storeu_ps(p, v)
#define V_SET1(x) _mm256_set1_ps(x)
#define V_ZERO() _mm256_setzero_ps()
#define V_ADD(a, b) _mm256_add_ps(a, b)
#define V_SUB(a, b) _mm256_sub_ps(a, b)
#define V_FMA(a, b, c) _mm256_fmadd_ps(a, b, c)
#define VI __m256i
#define V_TOI(v) _mm256_castps_si256(v)
#define V_TOF(i) _mm256_castsi256_ps(i)
#define VI_SET1(x) _mm256_set1_epi32(x)
#define VI_AND(a, b) _mm256_and_si256(a, b)
#define VI_ADD(a, b) _mm256_add_epi32(a, b)
#define VI_SRL16(a) _mm256_srli_epi32(a, 16)
#define VM __m256
#define V_CMP(a, b, pred) _mm256_cmp_ps(a, b, pred)
#define V_SELECT(m, a, b) _mm256_blendv_ps(a, b, m)
#define VM_AND(m, n) _mm256_and_ps(m, n)
#define V_LOAD_N(p, n) \
  _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n)), \
                                           _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)))
#define V_STORE_N(p, v, n) avx2_store_n(p, v, n)
#define V_LOAD_BF16(p) \
  _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(p))), 16))

#include "gemm_ukernel_simd.h"

const gemm_ukernel_t tpu_gemm_ukernel_avx2 = {"avx2", MR, 2 * VL, avx2_tile, avx2_dot,
                                              avx2_pack_f32, avx2_tile_rows,
                                              avx2_pack_bf16, NULL, avx2_tile_cols};
#endif
