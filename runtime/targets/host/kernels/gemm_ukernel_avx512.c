/* AVX-512F GEMM micro-kernel: 12 x 32 tiles (24 accumulators of 16
 * floats), built from the same template as the AVX2 one
 * (gemm_ukernel_simd.h). Chosen at run time (matmul.c) on CPUs that have
 * AVX-512F with the ZMM state enabled by the OS. */
#include "gemm_ukernel.h"

#ifdef TPU_GEMM_HAVE_X86
#include <immintrin.h>

#define ATTR __attribute__((target("avx512f")))
#define UK(name) avx512_##name
#define MR 12
#define VF __m512
#define VL 16
#define V_LOAD(p) _mm512_loadu_ps(p)
#define V_STORE(p, v) _mm512_storeu_ps(p, v)
#define V_SET1(x) _mm512_set1_ps(x)
#define V_ZERO() _mm512_setzero_ps()
#define V_ADD(a, b) _mm512_add_ps(a, b)
#define V_SUB(a, b) _mm512_sub_ps(a, b)
#define V_FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VI __m512i
#define V_TOI(v) _mm512_castps_si512(v)
#define V_TOF(i) _mm512_castsi512_ps(i)
#define VI_SET1(x) _mm512_set1_epi32(x)
#define VI_AND(a, b) _mm512_and_si512(a, b)
#define VI_ADD(a, b) _mm512_add_epi32(a, b)
#define VI_SRL16(a) _mm512_srli_epi32(a, 16)
#define VM __mmask16
#define V_CMP(a, b, pred) _mm512_cmp_ps_mask(a, b, pred)
#define V_SELECT(m, a, b) _mm512_mask_blend_ps(m, a, b)
#define VM_AND(m, n) ((__mmask16)((m) & (n)))
#define V_LOAD_N(p, n) _mm512_maskz_loadu_ps((__mmask16)((1u << (n)) - 1), p)
#define V_STORE_N(p, v, n) _mm512_mask_storeu_ps(p, (__mmask16)((1u << (n)) - 1), v)
#define V_LOAD_BF16(p)                                                                   \
  _mm512_castsi512_ps(                                                                   \
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(p))), 16))

#include "gemm_ukernel_simd.h"

const gemm_ukernel_t tpu_gemm_ukernel_avx512 = {"avx512", MR, 2 * VL, avx512_tile, avx512_dot,
                                                avx512_pack_f32, avx512_tile_rows,
                                                avx512_pack_bf16, &tpu_gemm_dot2_avx512bf16,
                                                avx512_tile_cols};
#endif
