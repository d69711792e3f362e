/* TorchTPU runtime: the narrow float formats (float8 and float4) as values.
 *
 * Conversions between float32 and the bytes of PyTorch's float8 dtypes, with
 * PyTorch's rules (c10/util/Float8_*.h), so that every conversion gives the
 * bits PyTorch CPU gives:
 *
 *   format      bias  largest   NaN            infinity  overflow on conversion
 *   e4m3fn        7   448       s.1111.111     none      saturates to +-448 (inf too)
 *   e5m2         15   57344     s.11111.xx!=0  s.11111.00  IEEE: rounds to inf
 *   e4m3fnuz      8   240       1.0000.000     none      NaN (0x80), also from inf
 *   e5m2fnuz     16   57344     1.00000.00     none      NaN (0x80), also from inf
 *   e8m0fnu     127   2^127     0xff           none      unsigned powers of two
 *
 * Rounding is to nearest, ties to even (e8m0fnu: ties of its exponent-only
 * grid as PyTorch rounds them, see tpu_f32_to_f8e8m0fnu). The fnuz formats
 * have no negative zero. float4_e2m1fn_x2 packs two e2m1 values per byte,
 * element 2i in the low nibble; PyTorch treats it as an opaque container, so
 * only its decoding (for block-scaled matrix products) is here.
 *
 * Everything is static inline and branch-light, for the kernels' loops.
 */
#ifndef TPU_FLOAT8_H_
#define TPU_FLOAT8_H_

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

static inline float tpu_f8_bits_to_f32_(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint32_t tpu_f8_f32_to_bits_(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

/* Decodes sign/exponent/mantissa fields of a format with MB mantissa bits
 * and exponent bias BIAS whose field e == 0 is subnormal; `sub` is the value
 * of one subnormal step (2^(1 - BIAS - MB)). Specials are the caller's. */
static inline float tpu_f8_decode_(uint8_t x, int mb, int bias, float sub) {
  const uint32_t sign = (uint32_t)(x & 0x80u) << 24;
  const uint32_t e = (uint32_t)(x & 0x7fu) >> mb, m = x & ((1u << mb) - 1u);
  if (e == 0) {
    const float v = (float)m * sub; /* exact */
    return sign ? -v : v;
  }
  return tpu_f8_bits_to_f32_(sign | ((e + 127u - (uint32_t)bias) << 23) | (m << (23 - mb)));
}

static inline float tpu_f8e4m3fn_to_f32(uint8_t x) {
  if ((x & 0x7fu) == 0x7fu) return tpu_f8_bits_to_f32_(((uint32_t)(x & 0x80u) << 24) | 0x7ff00000u);
  return tpu_f8_decode_(x, 3, 7, 0x1p-9f);
}

static inline float tpu_f8e5m2_to_f32(uint8_t x) {
  if ((x & 0x7cu) == 0x7cu) /* infinity; NaN keeps its mantissa bits, quieted as PyTorch's */
    return tpu_f8_bits_to_f32_(((uint32_t)(x & 0x80u) << 24) | 0x7f800000u |
                               ((uint32_t)(x & 3u) << 21) | ((x & 3u) ? 0x400000u : 0u));
  return tpu_f8_decode_(x, 2, 15, 0x1p-16f);
}

static inline float tpu_f8e4m3fnuz_to_f32(uint8_t x) {
  if (x == 0x80u) return tpu_f8_bits_to_f32_(0x7f800001u);
  return tpu_f8_decode_(x, 3, 8, 0x1p-10f);
}

static inline float tpu_f8e5m2fnuz_to_f32(uint8_t x) {
  if (x == 0x80u) return tpu_f8_bits_to_f32_(0x7f800001u);
  return tpu_f8_decode_(x, 2, 16, 0x1p-17f);
}

/* 2^(x - 127); x == 0 is 2^-127 (a float32 subnormal), 0xff NaN */
static inline float tpu_f8e8m0fnu_to_f32(uint8_t x) {
  if (x == 0xffu) return tpu_f8_bits_to_f32_(0x7f800001u);
  return tpu_f8_bits_to_f32_(x ? (uint32_t)x << 23 : 0x00400000u);
}

/* One e2m1 value (the low 4 bits of x): 0, 0.5, 1, 1.5, 2, 3, 4, 6 and negatives. */
static inline float tpu_f4e2m1_to_f32(uint8_t x) {
  static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = mag[x & 7u];
  return (x & 8u) ? -v : v;
}

/* Rounds the magnitude bits a (a float32 below the format's overflow point,
 * not NaN) to nearest even on the grid of a format with MB mantissa bits and
 * bias BIAS; returns the format's bits without sign. A carry out of the
 * largest binade gives the next code, which callers map to their overflow. */
static inline uint32_t tpu_f8_round_(uint32_t a, int mb, int bias) {
  const uint32_t min_normal = (uint32_t)(128 - bias) << 23; /* 2^(1 - bias) */
  uint32_t q, rem, half;
  int shift;
  if (a >= min_normal) {
    const uint32_t r = a - ((uint32_t)(127 - bias) << 23); /* rebias the exponent */
    shift = 23 - mb;
    q = r >> shift;
    rem = r & ((1u << shift) - 1u);
  } else {
    const uint32_t e = a >> 23;
    if (e == 0) return 0; /* float32 subnormals are far below half a step */
    const uint32_t mant = (a & 0x7fffffu) | 0x800000u; /* value = mant * 2^(e - 150) */
    shift = (int)(150 + 1 - bias - mb) - (int)e;      /* in units of 2^(1 - bias - mb) */
    if (shift > 25) return 0;                          /* below half a step */
    q = mant >> shift;
    rem = mant & ((1u << shift) - 1u);
  }
  half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return q;
}

static inline uint8_t tpu_f32_to_f8e4m3fn(float f) {
  const uint32_t u = tpu_f8_f32_to_bits_(f), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
  if (a >= 0x43f00000u) return (uint8_t)(sign | 0x7eu); /* 480 and beyond, inf: saturate */
  uint32_t q = tpu_f8_round_(a, 3, 7);
  if (q == 0x7fu) q = 0x7eu; /* [464, 480) rounds to the NaN code: saturate */
  return (uint8_t)(sign | q);
}

static inline uint8_t tpu_f32_to_f8e5m2(float f) {
  const uint32_t u = tpu_f8_f32_to_bits_(f), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint8_t)(sign | 0x7fu);
  if (a >= 0x47800000u) return (uint8_t)(sign | 0x7cu); /* 65536 and beyond: inf */
  return (uint8_t)(sign | tpu_f8_round_(a, 2, 15));      /* [61440, 65536) carries to inf */
}

static inline uint8_t tpu_f32_to_f8e4m3fnuz(float f) {
  const uint32_t u = tpu_f8_f32_to_bits_(f), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a >= 0x43800000u) return 0x80u; /* 256 and beyond, inf, NaN: NaN */
  const uint32_t q = tpu_f8_round_(a, 3, 8); /* a carry past 240 gives 0x80: NaN */
  return q == 0 ? 0 : (uint8_t)(sign | q);
}

static inline uint8_t tpu_f32_to_f8e5m2fnuz(float f) {
  const uint32_t u = tpu_f8_f32_to_bits_(f), sign = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
  if (a >= 0x47800000u) return 0x80u;
  const uint32_t q = tpu_f8_round_(a, 2, 16);
  return q == 0 ? 0 : (uint8_t)(sign | q);
}

/* The float32's exponent field, rounded up when the mantissa's top bit is
 * set and either a lower bit is set or the exponent field is nonzero (the
 * implicit bit counted as the grid's last bit); the sign is ignored; NaN and
 * infinities give 0xff, 0 gives 0 (2^-127). */
static inline uint8_t tpu_f32_to_f8e8m0fnu(float f) {
  const uint32_t u = tpu_f8_f32_to_bits_(f), e = (u >> 23) & 0xffu;
  if (e == 0xffu) return 0xffu;
  const uint32_t up = (u & 0x400000u) && ((u & 0x3fffffu) || e);
  return (uint8_t)(e + up);
}

#ifdef __cplusplus
}
#endif
#endif /* TPU_FLOAT8_H_ */
