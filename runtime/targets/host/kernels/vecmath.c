/* Run-time choice of the instruction set for vectorized loops (see
 * vecmath.h). */
#include "vecmath.h"

#include <stdatomic.h>
#include <string.h>

#include "base/cpu.h"
#include "base/env.h"

static _Atomic int g_auto_isa = -1; /* from TORCH_TPU_ISA and CPUID; -1 before the first call */
static _Atomic int g_override = -1; /* tests */

static int cpu_has_avx2(void) {
#ifdef TPU_HAVE_AVX2_BUILD
  const tpu_cpu_features_t* f = tpu_cpu_features();
  return f->avx2 && f->fma;
#else
  return 0;
#endif
}

static tpu_isa_t resolve(int wanted) {
  if (wanted == TPU_ISA_AVX2 && cpu_has_avx2()) return TPU_ISA_AVX2;
  return TPU_ISA_PORTABLE;
}

tpu_isa_t tpu_host_isa(void) {
  int o = atomic_load_explicit(&g_override, memory_order_relaxed);
  if (o >= 0) return (tpu_isa_t)o;
  int isa = atomic_load_explicit(&g_auto_isa, memory_order_relaxed);
  if (isa < 0) {
    const char* env = tpu_env_str("TORCH_TPU_ISA");
    isa = resolve(env && strcmp(env, "portable") == 0 ? TPU_ISA_PORTABLE : TPU_ISA_AVX2);
    atomic_store(&g_auto_isa, isa);
  }
  return (tpu_isa_t)isa;
}

void tpu_host_isa_override(int isa) { atomic_store(&g_override, isa < 0 ? -1 : (int)resolve(isa)); }

const char* tpu_isa_name(tpu_isa_t isa) { return isa == TPU_ISA_AVX2 ? "avx2" : "portable"; }
