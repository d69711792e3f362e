/* Complex values of the host kernels: every complex computation runs in
 * double complex; loads widen complex64/complex128 (and real dtypes, as a
 * zero imaginary part) and stores round once to the destination dtype (a
 * real destination keeps the real part). */
#ifndef TPU_HOST_KERNELS_ZVALUE_H_
#define TPU_HOST_KERNELS_ZVALUE_H_

#include <complex.h>

#include "kernels.h"

typedef double _Complex zc_t;

static inline zc_t tpu_load_z(const char* p, tpu_dtype_t dt) {
  if (dt == TPU_C64) return CMPLX(((const float*)p)[0], ((const float*)p)[1]);
  if (dt == TPU_C128) return CMPLX(((const double*)p)[0], ((const double*)p)[1]);
  return CMPLX(tpu_load_f64(p, dt), 0.0);
}

static inline void tpu_store_z(char* p, tpu_dtype_t dt, zc_t v) {
  if (dt == TPU_C64) {
    ((float*)p)[0] = (float)creal(v);
    ((float*)p)[1] = (float)cimag(v);
  } else if (dt == TPU_C128) {
    ((double*)p)[0] = creal(v);
    ((double*)p)[1] = cimag(v);
  } else {
    tpu_store_f64(p, dt, creal(v));
  }
}

#endif /* TPU_HOST_KERNELS_ZVALUE_H_ */
