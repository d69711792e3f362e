/* The lowering layer's internal interface: the emitter core (lower/stablehlo.c)
 * that the per-family lowering files (lower/elementwise.c, reduce.c, matmul.c,
 * nn.c, shape.c, index.c, linalg.c, special.c, random.c, fft.c) build their
 * StableHLO from.
 *
 * A lowering function receives the call as a node_t, the op's base name ("add"
 * for add_.Tensor, see base_name) and outs, which it fills by output index. It
 * returns true when it lowered the call, false to leave the call to the
 * custom_call fallback (having emitted nothing a result depends on; dead ops it
 * printed stay as harmless text). Only this layer includes this header. */
#ifndef TPU_LOWER_EMIT_H
#define TPU_LOWER_EMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "exec/graph.h"
#include "lower/lower.h"

/* The helpers below have short names; they are global only between this
 * layer's files and hidden from the shared library's exports. */
#pragma GCC visibility push(hidden)

/* a value of the function being printed: an SSA name and its type */
typedef struct {
  int id;  /* >= 0: %id; < 0: %arg(-id-1) */
  int sub; /* >= 0: result `sub` of a multi-result op (%id#sub) */
  tpu_dtype_t dt;
  int nd;
  int64_t sz[TPU_MAX_DIMS];
} ref_t;

/* a value the printer knows, with the memory geometry it was read from or written to */
typedef struct {
  ref_t r;
  const char* data;
  int64_t st[TPU_MAX_DIMS]; /* memory strides (elements) of r's dims */
  uintptr_t lo, hi;         /* bytes it covers */
  bool written;             /* a node of the graph produced it */
  bool visible;             /* its memory outlives the graph */
  bool superseded;          /* a later write changed (part of) its memory */
  bool alias;               /* a derived view of another value */
} val_t;

/* the printer's state for one graph */
typedef struct {
  FILE* f; /* function body */
  int next;
  val_t* v;
  int nv, cv;
  int* params; /* value index of %argK */
  int np, cp;
  char** cc; /* custom call targets, unique */
  int ncc, ccc;
  bool oom;
  const struct tpu_graph_print_opts* o; /* the printer's options, or NULL */
  int node;   /* the node being lowered */
  ref_t* chk; /* the range checks' failure flags (scalar i1), see check_range */
  int nchk, cchk;
  const char** fns; /* user kernels' definitions, printed beside the function (lower/custom.c) */
  int nfns, cfns;
} em_t;

#define NO_REF (-1000000000)

/* Window geometry of a pooling op over a's dims: sizes, strides, window
 * dilations, low/high padding. */
typedef struct {
  int64_t win[TPU_MAX_DIMS], str[TPU_MAX_DIMS], dil[TPU_MAX_DIMS], lo[TPU_MAX_DIMS],
      hi[TPU_MAX_DIMS];
} window_t;

/* prints a region's ops from its block arguments (lower/stablehlo.c, region_reduce) */
typedef void (*window_body_t)(em_t* e, const ref_t* acc, const ref_t* x, ref_t* out);

/* the call being lowered and its first output */
typedef struct {
  em_t* e;
  const tpu_call_t* c;
  const tpu_tensor_t* o; /* first output */
} node_t;

/* The locals every lowering body reads: the emitter, the call, its first output
 * with that output's dtype, and the overload name ("Tensor" of add.Tensor, "" if
 * none). */
#define LOWER_LOCALS                                  \
  em_t* e = n->e;                                     \
  const tpu_call_t* c = n->c;                         \
  const tpu_tensor_t* o = n->o;                       \
  const tpu_dtype_t odt = o->dtype;                   \
  const char* ovl = strchr(c->op->name, '.');         \
  ovl = ovl ? ovl + 1 : "";                           \
  (void)e, (void)c, (void)odt, (void)ovl

typedef bool (*tpu_lower_fn_t)(node_t* n, const char* base, ref_t* outs);

/* One table entry: an op's base name and the function that lowers it. */
typedef struct {
  const char* name;
  tpu_lower_fn_t fn;
} tpu_lower_entry_t;

/* A family's entries, sorted by name (strcmp). */
typedef struct {
  const tpu_lower_entry_t* entries;
  size_t n;
} tpu_lower_table_t;

extern const tpu_lower_table_t tpu_lower_elementwise, tpu_lower_shape, tpu_lower_matmul,
    tpu_lower_reduce, tpu_lower_nn, tpu_lower_index, tpu_lower_linalg, tpu_lower_special,
    tpu_lower_random, tpu_lower_fft;

/* The entry for an op id, or NULL; the tables' names are resolved to ids once. */
const tpu_lower_entry_t* tpu_lower_find_id(tpu_op_id_t id);
/* The entry for a base name ("add"), or NULL: tpu_lower_find_id of its id. */
const tpu_lower_entry_t* tpu_lower_find(const char* base);

/* ---- the emitter core (lower/stablehlo.c) ---- */
void ptype(FILE* f, const ref_t* r);
void pname(FILE* f, const ref_t* r);
void plist(FILE* f, int n, const ref_t* r, bool types);
const char* ints(char* buf, size_t cap, int n, const int64_t* v);
const char* i64arr(char* buf, size_t cap, int n, const int64_t* v);
int64_t numel(const ref_t* r);
ref_t mkref(tpu_dtype_t dt, int nd, const int64_t* sz);
ref_t emit(em_t* e, const char* op, int n, const ref_t* in, ref_t res, const char* fmt, ...);
ref_t cst(em_t* e, tpu_dtype_t dt, double v); /* a complex dt: v + 0i */
/* re + im i as a 0-d constant of complex dtype dt */
ref_t cst_complex(em_t* e, tpu_dtype_t dt, double re, double im);
/* A complex value's real and imaginary parts (of its part type); a real
 * value is its own real part and has a zero imaginary part. */
ref_t re_part(em_t* e, ref_t a);
ref_t im_part(em_t* e, ref_t a);
/* re + im i from two values of float32 (-> complex64) or float64 */
ref_t make_complex(em_t* e, ref_t re, ref_t im);
/* the conjugate (a real value itself); |a| (of the part type for a complex a) */
ref_t conj_of(em_t* e, ref_t a);
ref_t abs_of(em_t* e, ref_t a);
ref_t reshape(em_t* e, ref_t a, int nd, const int64_t* sz);
ref_t transpose(em_t* e, ref_t a, const int64_t* perm);
ref_t bcast_dims(em_t* e, ref_t a, int nd, const int64_t* sz, const int64_t* dims);
ref_t bcast(em_t* e, ref_t a, int nd, const int64_t* sz);
ref_t convert(em_t* e, ref_t a, tpu_dtype_t dt);
ref_t cst_like(em_t* e, tpu_dtype_t dt, double v, int nd, const int64_t* sz);
ref_t slice(em_t* e, ref_t a, const int64_t* start, const int64_t* limit);
ref_t binop(em_t* e, const char* op, ref_t a, ref_t b);
ref_t unop(em_t* e, const char* op, ref_t a);
ref_t compare(em_t* e, const char* dir, ref_t a, ref_t b);
ref_t select3(em_t* e, ref_t p, ref_t a, ref_t b);
ref_t scalar_op(em_t* e, const char* op, ref_t a, double v);
ref_t reduce(em_t* e, ref_t a, int n, const int64_t* dims, const char* body, double init);
ref_t reduce_keep(em_t* e, ref_t a, int n, const int64_t* dims, const char* body, double init);
ref_t block_arg(em_t* e, tpu_dtype_t dt);
void reduce_window_n(em_t* e, int n, const ref_t* a, const ref_t* init, const window_t* w, window_body_t body, ref_t* res);
void reduce_pair(em_t* e, const ref_t* a, const ref_t* init, int nr, const int64_t* dims, window_body_t body, ref_t* res);
ref_t cst_i64_list(em_t* e, int64_t n, const int64_t* v);
ref_t cst_f32_list(em_t* e, int64_t n, const float* v);
ref_t take_along(em_t* e, ref_t x, int dim, ref_t idx);
ref_t dim_coords(em_t* e, ref_t idx, int dim);
ref_t roll_dim(em_t* e, ref_t x, int dim, int64_t shift);
/* the window over each element and everything before it along dim */
void prefix_window(const ref_t* a, int dim, window_t* w);
ref_t scan_dim(em_t* e, ref_t a, int dim, bool sum);
void sort_with_indices(em_t* e, ref_t x, int dim, bool descending, ref_t* res);
/* stablehlo.while over n carried values (vals: the initial values on entry,
 * the loop's results on return; at most 12): `cond` prints the condition's
 * ops from the current values and returns a tensor<i1>, `body` prints one step
 * and fills next[]. Everything the regions read is carried (no implicit
 * capture). */
typedef ref_t (*loop_cond_t)(em_t* e, const ref_t* cur, void* ctx);
typedef void (*loop_body_t)(em_t* e, const ref_t* cur, ref_t* next, void* ctx);
void while_loop(em_t* e, int n, ref_t* vals, loop_cond_t cond, loop_body_t body, void* ctx);
/* whether any element of a boolean tensor is true (a scalar i1) */
ref_t any_of(em_t* e, ref_t b);
/* A device-side check that every value of the index tensor idx lies in
 * [lo, size) (when the printer's options ask for checks: on_check); the node
 * being lowered fails with CPU's message for `dim` (-1: a flat index) and
 * size, as IndexError or RuntimeError. Call it at the top level of a
 * lowering, not inside a region. */
void check_range(em_t* e, ref_t idx, int64_t lo, int64_t size, int dim, bool index_error);
/* The same for probabilities: every value of p in [0, 1] (NaN fails). */
void check_prob(em_t* e, ref_t p);
void pool_window(const tpu_call_t* c, int k, int ik, int is, int ip, int idl, const tpu_tensor_t* out, window_t* w);
/* The sum over dims (kept, as size 1) of |a - mean|^2, a real value for a
 * complex a; *mean the mean over dims (kept), *xc the centred values. */
ref_t centred_sum_squares(em_t* e, ref_t a, int nr, const int64_t* dims, double cnt, ref_t* mean, ref_t* xc);
ref_t dot_general(em_t* e, ref_t a, ref_t b, int nbatch, int ca, int cb, ref_t res, tpu_precision_t p);
ref_t read_tensor(em_t* e, const tpu_tensor_t* t);
void write_tensor(em_t* e, const tpu_tensor_t* t, ref_t w, bool visible);
bool is_tensor(const node_t* n, int i);
bool is_number(const node_t* n, int i);
ref_t arg(node_t* n, int i);
ref_t arg_as(node_t* n, int i, tpu_dtype_t dt, int nd, const int64_t* sz);
/* x times number argument i (dflt when absent); a lifted number is a
 * parameter (tpu_graph_print_opts_t.lift_numbers), else a constant, left out
 * when it is 1 */
ref_t scale_by(node_t* n, int i, ref_t x, double dflt);
/* Reads of an argument's value. Lowering code reads numbers only through
 * these (the tpu_arg_* names below are these functions here), never through
 * tpu_arg_t.v: a floating number read this way is a constant of the program
 * and is reported as baked (tpu_graph_print_opts_t.on_baked). */
double lower_arg_f64(const tpu_call_t* c, int i, double dflt);
int64_t lower_arg_i64(const tpu_call_t* c, int i, int64_t dflt);
bool lower_arg_bool(const tpu_call_t* c, int i, bool dflt);
bool lower_arg_complex(const tpu_call_t* c, int i, double out_c[2]);
#define tpu_arg_f64(c, i, dflt) lower_arg_f64((c), (i), (dflt))
#define tpu_arg_i64(c, i, dflt) lower_arg_i64((c), (i), (dflt))
#define tpu_arg_bool(c, i, dflt) lower_arg_bool((c), (i), (dflt))
#define tpu_arg_complex(c, i, out_c) lower_arg_complex((c), (i), (out_c))
ref_t arg_out(node_t* n, int i, tpu_dtype_t dt);
ref_t out_ref(const node_t* n, tpu_dtype_t dt);
tpu_dtype_t common_type(node_t* n, int a, int b);
int norm_dim(int64_t d, int nd);
int red_dims(const node_t* n, int i, int nd, int64_t* dims);
tpu_dtype_t acc_type(tpu_dtype_t dt);
ref_t gelu(em_t* e, ref_t x, const char* approx);
ref_t gelu_grad(em_t* e, ref_t x, const char* approx);
ref_t one_hot(em_t* e, ref_t target, int64_t n, int axis);
void base_name(const char* op, char* out, size_t cap);
void sum_body(em_t* e, const ref_t* acc, const ref_t* x, ref_t* out);
void argmax_first_body(em_t* e, const ref_t* acc, const ref_t* x, ref_t* out);
void argmin_first_body(em_t* e, const ref_t* acc, const ref_t* x, ref_t* out);
void max_pool_body(em_t* e, const ref_t* acc, const ref_t* x, ref_t* out);
void prod_body(em_t* e, const ref_t* acc, const ref_t* x, ref_t* out);

/* ---- user StableHLO kernels (lower/custom.c) ---- */
/* Lowers node i when its op is a user kernel with StableHLO (a func.call, its
 * results written back); false for any other node. */
bool lower_custom_node(em_t* e, const tpu_graph_t* g, int i);
/* Prints the kernels' definitions the lowered nodes called. */
void print_custom_functions(const em_t* e, FILE* f);

#pragma GCC visibility pop

#endif
