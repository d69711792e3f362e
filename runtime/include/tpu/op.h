/* TorchTPU runtime: op calls and the op table.
 *
 * An op call mirrors an ATen schema: `args` are the schema arguments in order
 * (out= tensors included), `outs` are the returned tensors (for in-place and
 * out= overloads they describe the same memory as the mutated argument).
 * The caller allocates every output before the call; kernels never allocate
 * device memory.
 */
#ifndef TPU_OP_H_
#define TPU_OP_H_

#include "tpu/status.h"
#include "tpu/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tpu_arg_kind {
  TPU_ARG_NONE = 0,
  TPU_ARG_TENSOR,
  TPU_ARG_INT,       /* int, SymInt, ScalarType, Layout, MemoryFormat, integral Scalar */
  TPU_ARG_DOUBLE,    /* float, floating Scalar */
  TPU_ARG_BOOL,      /* bool, boolean Scalar */
  TPU_ARG_INTLIST,
  TPU_ARG_DOUBLELIST,
  TPU_ARG_BOOLLIST,
  TPU_ARG_STRING,
  TPU_ARG_TENSORLIST, /* entries with dtype TPU_DTYPE_NONE are None */
  TPU_ARG_COMPLEX,    /* complex Scalar: v.c = {real, imag} */
} tpu_arg_kind_t;

typedef struct tpu_arg {
  tpu_arg_kind_t kind;
  int32_t n; /* list length */
  union {
    tpu_tensor_t* t;
    int64_t i;
    double d;
    double c[2];
    bool b;
    const int64_t* ilist;
    const double* dlist;
    const bool* blist;
    const char* s;
    tpu_tensor_t* tlist;
  } v;
} tpu_arg_t;

struct tpu_op;

/* Float32 matmul precision (PyTorch's set_float32_matmul_precision names).
 * Matmul-class kernels follow it; bfloat16 inputs always take one pass. */
typedef enum tpu_precision {
  TPU_PRECISION_MEDIUM = 0,  /* inputs rounded to bf16, exact products, fp32 sums */
  TPU_PRECISION_HIGH = 1,    /* 3-pass bf16 split: a_hi*b_hi + a_hi*b_lo + a_lo*b_hi */
  TPU_PRECISION_HIGHEST = 2, /* 6-pass bf16 split, or float32 where as accurate */
} tpu_precision_t;

typedef struct tpu_call {
  const struct tpu_op* op;
  int32_t nargs;
  int32_t nouts;
  tpu_arg_t* args;
  tpu_tensor_t* outs;
  int32_t device;
  bool debug_checks; /* Debug mode: extra validation (NaN/bounds) */
  tpu_precision_t precision; /* float32 matmul precision at submission */
  uint64_t rng_seed;   /* for ops flagged TPU_OP_RANDOM */
  uint64_t rng_offset; /* Philox counter offset reserved for this call */
  uint64_t mutated_args; /* bit i: the schema writes argument i in place (Tensor(a!)) */
} tpu_call_t;

typedef tpu_status_t (*tpu_kernel_fn_t)(const tpu_call_t* call);

enum {
  TPU_OP_RANDOM = 1u << 0, /* consumes the device generator: seed + offset */
  TPU_OP_CUSTOM = 1u << 1, /* a kernel registered at run time (tpu_op_register) */
};

/* Op ids: one dense id per op family, the ATen base name shared by an op's
 * overloads ("add" for add.Tensor, add_.Tensor and add.out; see
 * tpu_op_base_name). The families are generated (tools/gen_op_ids.py, run by
 * `make defs`) from the kernel inventories and the lowering tables into
 * tpu/op_ids.def, one TPU_OPID(family) row each, sorted by name; the runtime,
 * the fusion planner, the profiler and the lowering compare ids, not names. */
typedef enum tpu_op_id {
  TPU_OPID_NONE = 0, /* a family outside the generated list */
#define TPU_OPID(name) TPU_OPID_##name,
#include "tpu/op_ids.def"
#undef TPU_OPID
  TPU_OPID_COUNT
} tpu_op_id_t;

/* The family name of an id ("add"), NULL for TPU_OPID_NONE and ids out of range. */
const char* tpu_op_id_name(tpu_op_id_t id);
/* The id of a family name ("add"), TPU_OPID_NONE when it has none; NULL answers NONE. */
tpu_op_id_t tpu_op_id_lookup(const char* base);
/* The family (base name) of an ATen overload name: the name before the '.',
 * without a trailing in-place '_' ("add_.Tensor" -> "add", "__lshift__" ->
 * "__lshift_"), truncated to cap - 1 characters. */
void tpu_op_base_name(const char* overload, char* out, size_t cap);
/* tpu_op_id_lookup of tpu_op_base_name(overload). */
tpu_op_id_t tpu_op_id_of(const char* overload);

typedef struct tpu_op {
  const char* name; /* ATen overload name: "add.Tensor", "add_.Tensor", "sum" */
  tpu_kernel_fn_t fn;
  uint32_t flags;
  tpu_op_id_t id; /* its family; set by the op table (exec/op_table.c), not the inventories */
} tpu_op_t;

/* Finds the kernel for an ATen overload name; NULL when the runtime does not
 * implement it. Thread-safe; the table is immutable after first use. */
const tpu_op_t* tpu_op_lookup(const char* name);
/* Number of implemented overloads and the i-th name (sorted). */
int tpu_op_count(void);
const char* tpu_op_name(int i);

/* Ops registered at run time: user kernels (tpu/kernels.h). What the layers
 * below the targets know of one: the StableHLO function a lowering target
 * calls for it (`stablehlo`: one or more "func.func private" definitions, the
 * one named `symbol` taking the op's tensor arguments in schema order and
 * returning its outputs, then the new values of the arguments it mutates), or
 * NULL; and an opaque pointer for the target that runs it. */
typedef struct tpu_op_custom {
  const char* stablehlo;
  const char* symbol;
  void* target_data;
} tpu_op_custom_t;

/* Interns an op called `name` with kernel fn and flags | TPU_OP_CUSTOM,
 * holding a copy of *custom (whose strings must outlive the process), so that
 * tpu_op_lookup(name) finds it. Ops are never freed. INVALID_ARGUMENT when the
 * op table or an earlier registration already has that name. */
tpu_status_t tpu_op_register(const char* name, tpu_kernel_fn_t fn, uint32_t flags,
                             const tpu_op_custom_t* custom,
                             const tpu_op_t** out_op) TPU_MUST_USE;
/* The registration of an op made by tpu_op_register, NULL for any other. */
const tpu_op_custom_t* tpu_op_custom(const tpu_op_t* op);

/* Argument accessors for kernels. They do not validate kinds beyond what
 * their names say; a kernel is written against a known schema. */
static inline const tpu_tensor_t* tpu_arg_tensor(const tpu_call_t* c, int i) {
  return (i < c->nargs && c->args[i].kind == TPU_ARG_TENSOR) ? c->args[i].v.t : 0;
}
static inline bool tpu_arg_is_none(const tpu_call_t* c, int i) {
  return i >= c->nargs || c->args[i].kind == TPU_ARG_NONE;
}
/* A complex argument gives its real part to tpu_arg_f64 / tpu_arg_i64. */
double tpu_arg_f64(const tpu_call_t* c, int i, double dflt);
/* Argument i as a complex number (re, im): complex scalars, real scalars
 * (im = 0) and 0-d tensors; false (out_ untouched) for other kinds. */
bool tpu_arg_complex(const tpu_call_t* c, int i, double out_c[2]);
int64_t tpu_arg_i64(const tpu_call_t* c, int i, int64_t dflt);
bool tpu_arg_bool(const tpu_call_t* c, int i, bool dflt);
const char* tpu_arg_str(const tpu_call_t* c, int i, const char* dflt);

/* Runs a call on the calling thread (no stream). Used by streams and tests. */
tpu_status_t tpu_call_run(const tpu_call_t* call);

/* Kernel profile. While enabled, every call run by tpu_call_run and every
 * fused group adds its wall time and one call to process-wide counters: one
 * per op of the table, then TPU_PROFILE_FUSED_KINDS buckets for generated
 * kernels ("fused.elementwise", "fused.rows", "fused.matmul_epilogue").
 * Only the outermost run on a thread counts (a matmul inside its epilogue
 * group is part of the group's time). Thread-safe; off by default. */
enum { TPU_PROFILE_FUSED_KINDS = 3 };
void tpu_profile_enable(bool on);
void tpu_profile_reset(void);
/* Entry i (0 <= i < tpu_op_count() + TPU_PROFILE_FUSED_KINDS): its name, its
 * calls and nanoseconds so far. Returns false past the last entry. */
bool tpu_profile_entry(int i, const char** out_name, int64_t* out_calls, int64_t* out_ns);
/* Brackets for other runners (fused groups): begin returns a start stamp,
 * or 0 when the profile is off or the thread is already inside a counted
 * run; end(entry, stamp) records entry i and must follow every begin. */
int64_t tpu_profile_begin(void);
void tpu_profile_end(int entry, int64_t stamp);

/* Float32 matmul precision of the call running on this thread
 * (TPU_PRECISION_HIGHEST outside tpu_call_run). */
tpu_precision_t tpu_kernel_precision(void);

#ifdef __cplusplus
}
#endif
#endif /* TPU_OP_H_ */
